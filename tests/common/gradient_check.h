// The verdict of the models tests' finite-difference gradient checks.
#ifndef MC2_TESTS_COMMON_GRADIENT_CHECK_H_
#define MC2_TESTS_COMMON_GRADIENT_CHECK_H_

#include <cstddef>
#include <string>

namespace mc2::test {

// One parameter tensor `name`: (a) along a random direction, the analytic
// directional derivative <grad, dir> against its central difference `fd`,
// with `terms` = sum |grad_i dir_i| (the scale of f32 rounding in the dot
// product); (b) at element `idx`, the analytic gradient `gi` against its
// central difference `fd1`. Records a gtest failure for each bound
// exceeded, and when the directional derivative is ~0 (a check that cannot
// fail is no check); returns the report line.
std::string JudgeGradient(const std::string& name, double analytic, double fd, double terms,
                          size_t idx, double gi, double fd1);

}  // namespace mc2::test

#endif  // MC2_TESTS_COMMON_GRADIENT_CHECK_H_
