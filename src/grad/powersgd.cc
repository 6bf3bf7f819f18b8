#include "grad/powersgd.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

namespace mc2::grad {

size_t LowRankOf(size_t rows, size_t cols, size_t rank) {
  return std::min({rank, rows, cols});
}

bool LowRankPays(size_t rows, size_t cols, size_t r) {
  if (rows < 2 || cols < 2 || r == 0) return false;
  // r (rows + cols) < rows cols, without overflow for any size_t inputs.
  const double lhs = static_cast<double>(r) * (static_cast<double>(rows) + cols);
  return lhs < static_cast<double>(rows) * static_cast<double>(cols);
}

void InitQ(uint64_t seed, uint64_t key, size_t cols, size_t r, float* q) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
  std::mt19937_64 gen(seq);
  for (size_t i = 0; i < cols * r; ++i) {
    // 24 random bits: exact in f32, uniform on [-1, 1).
    const uint64_t bits = gen() >> 40;
    q[i] = static_cast<float>(static_cast<double>(bits) / double{1 << 23} - 1.0);
  }
  Orthogonalize(q, cols, r);
}

void Orthogonalize(float* a, size_t rows, size_t r) {
  for (size_t j = 0; j < r; ++j) {
    for (size_t k = 0; k < j; ++k) {
      double dot = 0;
      for (size_t i = 0; i < rows; ++i) dot += double{a[i * r + j]} * a[i * r + k];
      for (size_t i = 0; i < rows; ++i)
        a[i * r + j] = static_cast<float>(a[i * r + j] - dot * a[i * r + k]);
    }
    double sq = 0;
    for (size_t i = 0; i < rows; ++i) sq += double{a[i * r + j]} * a[i * r + j];
    const double norm = std::sqrt(sq);
    // A zero column stays zero; a NaN (from the gradient) stays NaN and
    // reaches the result, as it would uncompressed.
    if (norm > 0) {
      for (size_t i = 0; i < rows; ++i) a[i * r + j] = static_cast<float>(a[i * r + j] / norm);
    }
  }
}

namespace {
blasint B(size_t n) { return static_cast<blasint>(n); }
}  // namespace

void MulMQ(const float* m, const float* q, float* p, size_t rows, size_t cols, size_t r) {
  if (rows == 0 || r == 0) return;
  if (cols == 0) {
    std::fill(p, p + rows * r, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B(rows), B(r), B(cols), 1.0f, m, B(cols),
              q, B(r), 0.0f, p, B(r));
}

void MulMtP(const float* m, const float* p, float* q, size_t rows, size_t cols, size_t r) {
  if (cols == 0 || r == 0) return;
  if (rows == 0) {
    std::fill(q, q + cols * r, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, B(cols), B(r), B(rows), 1.0f, m, B(cols),
              p, B(r), 0.0f, q, B(r));
}

void MulPQt(const float* p, const float* q, float* m, size_t rows, size_t cols, size_t r,
            float alpha, float beta) {
  if (rows == 0 || cols == 0) return;
  if (r == 0) {
    for (size_t i = 0; i < rows * cols; ++i) m[i] = beta == 0.0f ? 0.0f : beta * m[i];
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B(rows), B(cols), B(r), alpha, p, B(r), q,
              B(r), beta, m, B(cols));
}

}  // namespace mc2::grad
