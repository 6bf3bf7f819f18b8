// Output files and directories of the `mc2` commands.
//
// Policy: a command checks every output it will write before it starts any
// work, so that an unwritable path fails at once (with the operating
// system's reason) instead of after a long run; and no command deletes or
// overwrites anything it did not create. A file the user names explicitly
// (--json FILE, --output FILE) is written as asked. A directory (a demo's --output DIR)
// must be new, empty, or one that mc2 created before, which it marks with
// kOutputMarker; in a reused directory a command removes only the files it
// writes itself.
//
// Every function throws mc2::Error(kInvalidArgument) whose message names the
// option as the user typed it (`flag`), the path and the reason.
#ifndef MC2_TOOLS_OUTPUT_PATHS_H_
#define MC2_TOOLS_OUTPUT_PATHS_H_

#include <string>
#include <string_view>
#include <vector>

namespace mc2::tools {

// The file that marks a directory as created by mc2.
inline constexpr const char* kOutputMarker = ".mc2-output";

// Checks that the file `path` can be written: an existing file must be a
// writable non-directory (it is not modified); a missing one must be
// creatable (it is created and removed again). "-" (stdout) always passes.
void CheckWritableFile(const std::string& path, std::string_view flag);

// Writes `text` to the file `path` (replacing what it held), or to
// standard output when `path` is "-" (the one ReserveStdoutForJson kept). Returns "" on success,
// else the operating system's reason.
std::string WriteOutputFile(const std::string& path, std::string_view text);

// With `--json -` standard output carries the JSON alone: when `json_path`
// is "-", points standard output at standard error for everything else a
// command prints (its table, and the output of ranks it launches), keeping
// the original standard output for WriteOutputFile("-"). Call it before the
// command prints anything; other paths change nothing.
void ReserveStdoutForJson(const std::string& json_path);

// Makes `dir` ready to receive a command's output: creates it (and its
// parents) when missing, and accepts an existing directory only when it is
// empty or carries kOutputMarker. Refuses a file, a non-empty directory
// without the marker, the home directory and the root directory. On success
// the directory exists, is writable and carries the marker.
void PrepareOutputDir(const std::string& dir, std::string_view flag);

// Removes from `dir` the entries a command writes itself, given as paths
// relative to `dir`; a name ending in "/" is a directory of trace files,
// from which only rank-<r>.trace.json files are removed (the directory
// itself too, once empty). Anything else in `dir` is left alone.
void RemoveOwnOutputs(const std::string& dir, const std::vector<std::string>& names);

}  // namespace mc2::tools

#endif  // MC2_TOOLS_OUTPUT_PATHS_H_
