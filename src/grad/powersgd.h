// The arithmetic of PowerSGD-style low-rank compression (Vogels, Karimireddy
// and Jaggi, 2019), apart from any communication: which matrices it pays
// for, the seeded start of Q, the Gram-Schmidt orthogonalisation and the
// three products (P = M Q, Q = M^T P, M ~ P Q^T). Matrices are row-major
// f32: M is rows x cols, P rows x r, Q cols x r. The products run on
// OpenBLAS's cblas_sgemm.
#ifndef MC2_GRAD_POWERSGD_H_
#define MC2_GRAD_POWERSGD_H_

#include <cstddef>
#include <cstdint>

namespace mc2::grad {

// The rank used for a rows x cols matrix asked to be approximated at rank
// `rank`: min(rank, rows, cols).
size_t LowRankOf(size_t rows, size_t cols, size_t rank);
// Whether a rank-r approximation of a rows x cols matrix moves fewer values
// than the matrix: r (rows + cols) < rows cols (false for a vector or an
// empty matrix, as PyTorch's PowerSGD hook leaves those uncompressed).
bool LowRankPays(size_t rows, size_t cols, size_t r);

// q (cols x r) = the seeded start of a tensor's Q: uniform values in
// [-1, 1) from a 64-bit Mersenne twister seeded with `seed` and `key` (the
// tensor's id), then orthogonalised. Bitwise the same on every rank and
// every platform (the generator's output is fixed by the standard and the
// values are built from its bits).
void InitQ(uint64_t seed, uint64_t key, size_t cols, size_t r, float* q);

// Orthonormalises the r columns of a (rows x r, row-major) in place by
// modified Gram-Schmidt, in column order, dot products and norms
// accumulated in double. A column that is zero after the projections
// (linearly dependent or all zero) stays zero. Deterministic: the same input
// gives the same bits.
void Orthogonalize(float* a, size_t rows, size_t r);

// p (rows x r) = m q.
void MulMQ(const float* m, const float* q, float* p, size_t rows, size_t cols, size_t r);
// q (cols x r) = m^T p.
void MulMtP(const float* m, const float* p, float* q, size_t rows, size_t cols, size_t r);
// m (rows x cols) = alpha p q^T + beta m (beta 0: m is only written).
void MulPQt(const float* p, const float* q, float* m, size_t rows, size_t cols, size_t r,
            float alpha, float beta);

}  // namespace mc2::grad

#endif  // MC2_GRAD_POWERSGD_H_
