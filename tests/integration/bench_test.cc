// Tests of `mc2 bench` (tools/bench_*.cc): a checked sweep through the
// launcher, its JSON rows, and usage errors.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace mc2 {
namespace {

using ::testing::HasSubstr;

const std::string kMc2 = MC2_BINARY_DIR "/tools/mc2";

struct Result {
  int status = -1;  // exit status, or 128 + signal
  std::string out;  // stdout (stderr goes to the test log)
};

Result RunMc2(const std::string& args) {
  Result r;
  const std::string cmd = kMc2 + " " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

std::vector<std::string> DataRows(const std::string& text) {
  std::vector<std::string> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') rows.push_back(line);
  return rows;
}

// 8 B .. 64 KiB by 4: 8, 32, 128, 512, 2K, 8K, 32K.
constexpr int kRows = 7;
const char* kSweep = "-n 2 -b 8 -e 64K -f 4 -i 3 -w 1";

TEST(BenchTest, CheckedAllReduceSweep) {
  Result r = RunMc2(std::string("bench all_reduce ") + kSweep);
  ASSERT_EQ(r.status, 0) << r.out;
  auto rows = DataRows(r.out);
  ASSERT_EQ(rows.size(), static_cast<size_t>(kRows)) << r.out;
  EXPECT_THAT(r.out, HasSubstr("# mc2 bench all_reduce: 2 ranks, buffers symmetric, dtype f32"));
  EXPECT_THAT(r.out, HasSubstr("# link: none (raw shared memory)"));
  EXPECT_THAT(r.out, HasSubstr("# Out of bounds values : 0 OK"));
  EXPECT_THAT(r.out, HasSubstr("# Avg bus bandwidth"));
  // First row: 8 bytes, 2 f32 elements, sum, no root, 0 wrong both ways.
  std::istringstream first(rows[0]);
  std::string size, count, type, redop, root;
  first >> size >> count >> type >> redop >> root;
  EXPECT_EQ(size, "8");
  EXPECT_EQ(count, "2");
  EXPECT_EQ(type, "f32");
  EXPECT_EQ(redop, "sum");
  EXPECT_EQ(root, "-1");
  std::vector<std::string> cols;
  for (std::string c; first >> c;) cols.push_back(c);
  ASSERT_GE(cols.size(), 8u) << rows[0];
  EXPECT_EQ(cols[3], "0") << rows[0];  // out-of-place #wrong
  EXPECT_EQ(cols[7], "0") << rows[0];  // in-place #wrong
}

TEST(BenchTest, JsonRowsParse) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("mc2-bench-" + std::to_string(getpid()) + ".json"))
          .string();
  Result r = RunMc2(std::string("bench all_gather ") + kSweep + " --buffers private --json " + path);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("buffers private"));
  std::ifstream in(path);
  ASSERT_TRUE(in.good());
  nlohmann::json j = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  EXPECT_EQ(j["collective"], "all_gather");
  EXPECT_EQ(j["ranks"], 2);
  EXPECT_EQ(j["buffers"], "private");
  EXPECT_EQ(j["ok"], true);
  ASSERT_EQ(j["rows"].size(), static_cast<size_t>(kRows));
  EXPECT_EQ(j["rows"][0]["size"], 8);
  for (auto& row : j["rows"]) {
    for (const char* mode : {"out_of_place", "in_place"}) {
      auto& m = row[mode];
      ASSERT_TRUE(m.is_object()) << row.dump();
      EXPECT_EQ(m["wrong"], 0);
      EXPECT_GT(m["time_avg_us"].get<double>(), 0.0);
      EXPECT_GT(m["time_median_us"].get<double>(), 0.0);
      EXPECT_LE(m["time_min_us"].get<double>(), m["time_median_us"].get<double>());
      EXPECT_GE(m["busbw_gbs"].get<double>(), 0.0);
      EXPECT_FALSE(m["algo"].get<std::string>().empty());
    }
  }
}

TEST(BenchTest, OtherCollectivesCheckOut) {
  for (const char* args :
       {"reduce_scatter --op max", "all_to_all -d i32", "broadcast --root 1 -d bf16",
        "reduce --op prod -d f16", "send_recv -d u8", "all_reduce -d i8 --op bxor"}) {
    Result r = RunMc2(std::string("bench ") + args + " -n 2 -b 8 -e 4K -f 8 -i 2 -w 1");
    EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr("# Out of bounds values : 0 OK")) << args;
  }
}

TEST(BenchTest, UsageErrorsExit2) {
  EXPECT_EQ(RunMc2("bench all_reduz -n 2 2>/dev/null").status, 2);
  EXPECT_EQ(RunMc2("bench all_reduce -n 2 -b 8X 2>/dev/null").status, 2);
  EXPECT_EQ(RunMc2("bench all_reduce -n 2 -b 1M -e 1K 2>/dev/null").status, 2);
  EXPECT_EQ(RunMc2("bench all_reduce -n 2 -d f32 --op band 2>/dev/null").status, 2);
  EXPECT_EQ(RunMc2("bench all_reduce -n 2 -d f99 2>/dev/null").status, 2);
  EXPECT_EQ(RunMc2("bench all_reduce -n 2 --buffers shared 2>/dev/null").status, 2);
  EXPECT_EQ(RunMc2("bench broadcast -n 2 --root 2 2>/dev/null").status, 2);
  EXPECT_EQ(RunMc2("bench 2>/dev/null").status, 2);
}

}  // namespace
}  // namespace mc2
