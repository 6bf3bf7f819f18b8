// A fixture for tests that launch `mc2` and give it files to write: a
// fresh directory per test, removed with everything in it afterwards.
#ifndef MC2_TESTS_COMMON_TEMP_DIR_H_
#define MC2_TESTS_COMMON_TEMP_DIR_H_

#include <filesystem>

#include "common/process_util.h"

namespace mc2::testing {

// LeakCheckedTest with dir_: a new directory /tmp/mc2-<test suite>-XXXXXX,
// made before the test and removed (whatever it holds) after it.
class TempDirTest : public LeakCheckedTest {
 protected:
  void SetUp() override;
  void TearDown() override;

  std::filesystem::path dir_;
};

}  // namespace mc2::testing

#endif  // MC2_TESTS_COMMON_TEMP_DIR_H_
