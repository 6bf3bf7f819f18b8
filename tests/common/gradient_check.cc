#include "common/gradient_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace mc2::test {

std::string JudgeGradient(const std::string& name, double analytic, double fd, double terms,
                          size_t idx, double gi, double fd1) {
  const double err = std::fabs(fd - analytic);
  const bool ok_a = err <= 1e-2 * std::fabs(analytic) + 1e-3 * terms;
  const double err1 = std::fabs(fd1 - gi);
  const bool ok_b = err1 <= 1e-2 * std::fabs(gi) + 2e-6;
  char line[256];
  std::snprintf(line, sizeof line,
                "%-22s direction: analytic %+.6e fd %+.6e rel %.1e %s | element %zu: "
                "analytic %+.6e fd %+.6e rel %.1e %s",
                name.c_str(), analytic, fd, err / std::max(1e-30, std::fabs(analytic)),
                ok_a ? "ok" : "BAD", idx, gi, fd1, err1 / std::max(1e-30, std::fabs(gi)),
                ok_b ? "ok" : "BAD");
  EXPECT_TRUE(ok_a) << line;
  EXPECT_TRUE(ok_b) << line;
  EXPECT_GT(std::fabs(analytic), 1e-7) << line;
  return line;
}

}  // namespace mc2::test
