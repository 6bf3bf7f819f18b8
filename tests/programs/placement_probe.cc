// Prints where a rank's threads may run once its world exists:
//   compute=<CPU list of the calling thread> progress=<CPU list of the
//   thread named mc2-progress> plan=<the placement's own description>
// read from /proc/self/task, i.e. what the kernel enforces, not what mc2
// meant to do.
#include <dirent.h>
#include <pthread.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/placement.h"
#include "mc2/mc2.h"

namespace {

std::string TaskField(const std::string& task, const std::string& file, const std::string& key) {
  std::ifstream in("/proc/self/task/" + task + "/" + file);
  std::string line;
  while (std::getline(in, line)) {
    if (key.empty()) return line;
    if (line.rfind(key, 0) == 0) return line.substr(line.find_first_not_of(" \t", key.size()));
  }
  return "";
}

}  // namespace

int main() {
  mc2::Group g = mc2::Group::FromEnv();
  mc2::Barrier(g).Wait();  // the progress thread has run
  std::string progress = "?";
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      const std::string task = e->d_name;
      if (task[0] == '.') continue;
      if (TaskField(task, "comm", "") == "mc2-progress")
        progress = TaskField(task, "status", "Cpus_allowed_list:");
    }
    closedir(d);
  }
  const std::string compute =
      mc2::core::FormatCpuList(mc2::core::ThreadCpus());
  const mc2::core::Placement* p = mc2::core::CurrentPlacement();
  std::printf("compute=%s progress=%s plan=%s\n", compute.c_str(), progress.c_str(),
              p ? p->Describe().c_str() : "none");
  mc2::Barrier(g).Wait();
  return 0;
}
