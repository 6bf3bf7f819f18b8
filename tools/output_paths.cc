#include "output_paths.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "mc2/error.h"

namespace mc2::tools {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void Refuse(std::string_view flag, const std::string& path, std::string_view why) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{} {}: {}", flag, path, why));
}

// The path with symbolic links and "." / ".." resolved as far as it exists,
// so that "~/", "/home/u/." and a link to the home directory compare equal.
fs::path Canonical(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? p : c;
}

bool IsRankTraceFile(const std::string& name) {
  constexpr std::string_view kSuffix = ".trace.json";
  return name.rfind("rank-", 0) == 0 && name.size() > 5 + kSuffix.size() &&
         name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

}  // namespace

void CheckWritableFile(const std::string& path, std::string_view flag) {
  if (path == "-") return;
  if (path.empty()) Refuse(flag, "''", "the file name is empty");
  struct stat st;
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) Refuse(flag, path, std::strerror(EISDIR));
    // Opening for append neither truncates nor changes the file; without
    // blocking, so that a FIFO whose reader comes later is no hang (ENXIO).
    const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && !(errno == ENXIO && S_ISFIFO(st.st_mode)))
      Refuse(flag, path, fmt::format("cannot write it: {}", std::strerror(errno)));
    if (fd >= 0) close(fd);
    return;
  }
  if (errno != ENOENT) Refuse(flag, path, std::strerror(errno));
  // Create it exclusively, so that only a file this call made is removed.
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) Refuse(flag, path, fmt::format("cannot create it: {}", std::strerror(errno)));
  close(fd);
  unlink(path.c_str());
}

namespace {
// The original standard output, once ReserveStdoutForJson moved it.
std::FILE* g_json_stdout = nullptr;
}  // namespace

void ReserveStdoutForJson(const std::string& json_path) {
  if (json_path != "-" || g_json_stdout != nullptr) return;
  std::fflush(stdout);
  const int fd = dup(STDOUT_FILENO);
  if (fd < 0) return;  // then the JSON follows the table on standard output
  g_json_stdout = fdopen(fd, "w");
  if (g_json_stdout == nullptr) {
    close(fd);
    return;
  }
  dup2(STDERR_FILENO, STDOUT_FILENO);
}

std::string WriteOutputFile(const std::string& path, std::string_view text) {
  const bool out = path == "-";
  std::FILE* f = out ? (g_json_stdout ? g_json_stdout : stdout) : std::fopen(path.c_str(), "w");
  int err = f != nullptr ? 0 : errno;
  if (f != nullptr) {
    if (std::fwrite(text.data(), 1, text.size(), f) != text.size()) err = errno != 0 ? errno : EIO;
    const int closed = out ? std::fflush(f) : std::fclose(f);
    if (closed != 0 && err == 0) err = errno != 0 ? errno : EIO;
  }
  return err == 0 ? std::string() : std::strerror(err);
}

void PrepareOutputDir(const std::string& dir, std::string_view flag) {
  if (dir.empty()) Refuse(flag, "''", "the directory name is empty");
  const fs::path canon = Canonical(dir);
  if (canon == canon.root_path())
    Refuse(flag, dir, "refusing to write into the root directory; give a new directory");
  if (const char* home = std::getenv("HOME");
      home != nullptr && *home != '\0' && canon == Canonical(home))
    Refuse(flag, dir, "refusing to write into the home directory; give a new directory");
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (ec && status.type() != fs::file_type::not_found) Refuse(flag, dir, ec.message());
  if (status.type() == fs::file_type::not_found) {
    fs::create_directories(dir, ec);
    if (ec) Refuse(flag, dir, fmt::format("cannot create the directory: {}", ec.message()));
  } else if (status.type() != fs::file_type::directory) {
    Refuse(flag, dir, "exists and is not a directory");
  } else if (!fs::exists(fs::path(dir) / kOutputMarker, ec)) {
    fs::directory_iterator it(dir, ec);
    if (ec) Refuse(flag, dir, fmt::format("cannot read the directory: {}", ec.message()));
    if (it != fs::directory_iterator())
      Refuse(flag, dir,
             fmt::format("the directory is not empty and was not created by mc2 (it has no {} "
                         "file); refusing to write into it: give a new or empty directory",
                         kOutputMarker));
  }
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    Refuse(flag, dir, fmt::format("cannot write into the directory: {}", std::strerror(errno)));
  const std::string marker = (fs::path(dir) / kOutputMarker).string();
  const int fd = open(marker.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) Refuse(flag, dir, fmt::format("cannot create {}: {}", marker, std::strerror(errno)));
  close(fd);
}

void RemoveOwnOutputs(const std::string& dir, const std::vector<std::string>& names) {
  std::error_code ec;
  for (const std::string& name : names) {
    const bool trace_dir = !name.empty() && name.back() == '/';
    const fs::path p = fs::path(dir) / (trace_dir ? name.substr(0, name.size() - 1) : name);
    if (!trace_dir) {
      if (fs::is_regular_file(fs::symlink_status(p, ec))) fs::remove(p, ec);
      continue;
    }
    if (!fs::is_directory(fs::symlink_status(p, ec))) continue;
    for (const auto& e : fs::directory_iterator(p, ec))
      if (e.is_regular_file(ec) && IsRankTraceFile(e.path().filename().string()))
        fs::remove(e.path(), ec);
    fs::remove(p, ec);  // only succeeds when nothing else is left in it
  }
}

}  // namespace mc2::tools
