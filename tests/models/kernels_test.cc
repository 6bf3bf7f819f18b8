// The transformer's local kernels (src/models/kernels.h): AdamW, whose
// AVX-512 build (taken on CPUs that have it) must give bitwise the values
// of the plain scalar update, written out here as the reference, for sizes
// around the vector width (tails), several steps, with and without weight
// decay.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "models/kernels.h"

namespace mc2::models {
namespace {

// One scalar AdamW step, element by element: the textbook update in the
// order kernels.cc documents, each operation rounded on its own.
void ReferenceAdamW(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
                    std::vector<float>& v, int step, float lr, float beta1, float beta2, float eps,
                    float wd) {
  const float c1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float c2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  for (size_t i = 0; i < w.size(); ++i) {
    volatile float mi = beta1 * m[i];
    mi = mi + (1.0f - beta1) * g[i];
    volatile float gg = (1.0f - beta2) * g[i];
    gg = gg * g[i];
    volatile float vi = beta2 * v[i];
    vi = vi + gg;
    m[i] = mi;
    v[i] = vi;
    volatile float denom = std::sqrt(vi / c2) + eps;
    volatile float decay = wd * w[i];
    volatile float upd = (mi / c1) / denom + decay;
    w[i] = w[i] - lr * upd;
  }
}

// Bitwise equality (an empty vector's data() may be null, which memcmp
// must not see).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(Kernels, AdamWBitwiseEqualsTheScalarUpdate) {
  int compared = 0;
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{1003}}) {
    for (float wd : {0.0f, 0.1f}) {
      std::vector<float> w(n), g(n), m(n, 0.0f), v(n, 0.0f);
      for (size_t i = 0; i < n; ++i) {
        w[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
        g[i] = 1e-3f * std::cos(1.3f * static_cast<float>(i));
      }
      std::vector<float> rw = w, rm = m, rv = v;
      for (int step = 1; step <= 3; ++step) {
        for (size_t i = 0; i < n; ++i) g[i] = g[i] * 0.5f + 1e-4f * static_cast<float>(step);
        AdamW(w.data(), g.data(), m.data(), v.data(), n, step, 3e-4f, 0.9f, 0.95f, 1e-8f, wd);
        ReferenceAdamW(rw, g, rm, rv, step, 3e-4f, 0.9f, 0.95f, 1e-8f, wd);
        EXPECT_TRUE(SameBits(w, rw)) << n << " " << step;
        EXPECT_TRUE(SameBits(m, rm)) << n << " " << step;
        EXPECT_TRUE(SameBits(v, rv)) << n << " " << step;
        ++compared;
      }
      // The weights moved (a no-op update would match a no-op reference).
      for (size_t i = 0; i < n; ++i) {
        EXPECT_NE(w[i], std::sin(0.37f * static_cast<float>(i) + 0.1f)) << i;
        if (w[i] == std::sin(0.37f * static_cast<float>(i) + 0.1f)) break;
      }
    }
  }
  EXPECT_EQ(compared, 36);
}

}  // namespace
}  // namespace mc2::models
