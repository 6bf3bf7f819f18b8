// Helpers of `mc2 run` (launcher.h) that do not touch the job itself: the
// rendezvous port torch programs expect, where a program name resolves on
// PATH, and the hint printed when a Python rank could not import torch or
// mc2.
#ifndef MC2_TOOLS_LAUNCH_SUPPORT_H_
#define MC2_TOOLS_LAUNCH_SUPPORT_H_

#include <optional>
#include <string>
#include <string_view>

namespace mc2::tools {

// A TCP port of 127.0.0.1 that is free now (the kernel's pick for port 0),
// for MASTER_PORT; -1 with `error` set if no socket could be bound. As with
// torchrun --standalone, another process may take it before rank 0 does.
int FreeLoopbackPort(std::string* error);

// Where execvp finds `program`: itself if it contains a '/', else the first
// executable regular file in PATH; empty if none. Sets `err` to the errno
// execvp would fail with (0 when found).
std::string ResolveProgram(const std::string& program, int* err);

// Watches a rank's stderr for Python's report of a failed import of torch
// or mc2 ("ModuleNotFoundError: No module named 'torch'", "ImportError: ...
// mc2 ..."), line by line, across reads.
class ImportFailureScan {
 public:
  void Feed(std::string_view data);
  // The module named by the first such line seen ("torch" or "mc2").
  const std::optional<std::string>& module() const { return module_; }

 private:
  void ScanLine(std::string_view line);
  std::string pending_;
  std::optional<std::string> module_;
};

// The lines `mc2 run` prints after a job whose rank `rank` failed to import
// `module`: which interpreter ran (`program` as given and as resolved) and
// the command to use instead.
std::string ImportFailureHint(int rank, const std::string& module, const std::string& program,
                              int nranks);

}  // namespace mc2::tools

#endif  // MC2_TOOLS_LAUNCH_SUPPORT_H_
