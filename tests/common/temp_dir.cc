#include "common/temp_dir.h"

#include <stdlib.h>

#include <string>
#include <system_error>

namespace mc2::testing {

void TempDirTest::SetUp() {
  LeakCheckedTest::SetUp();
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string dir = std::string("/tmp/mc2-") + info->test_suite_name() + "-XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr) << dir;
  dir_ = dir;
}

void TempDirTest::TearDown() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
  LeakCheckedTest::TearDown();
}

}  // namespace mc2::testing
