#pragma once
// Muon's orthogonalization as torch.optim.Muon computes it (_zeropower_via_newtonschulz): the
// update G (rows x cols) as bf16, transposed when it has more rows than columns, divided by
// max(|G|_F, eps), then `steps` times A = X X^T, B = b A + c A A, X = a X + B X, every result
// rounded to bf16 as torch's bf16 tensors round it; transposed back. It runs between Muon's two
// fused kernels as the opaque op "newton_schulz:<constants>" (include/optfuse/optim.h), so the
// matrix products go to a real BLAS.
#include <cstdint>
#include <functional>

#include "optfuse/engine.h"
#include "optfuse/optim.h"

namespace optfuse::optim {

// y = alpha * a b' + beta * y on row-major f32 matrices: a is m x k; b' is b (k x n), or b^T
// when `b_transposed` (b then n x k).
using Gemm = std::function<void(bool b_transposed, int64_t m, int64_t n, int64_t k, float alpha,
                                const float* a, const float* b, float beta, float* y)>;

// `out` = the orthogonalized `g`, both rows x cols f32 (out holds bf16 values).
void newton_schulz_bf16(const NewtonSchulz& ns, const Gemm& gemm, const float* g, float* out,
                        int64_t rows, int64_t cols);

// cblas_sgemm of the first CBLAS library that loads (libopenblas.so.0, libblas.so.3,
// libcblas.so.3); an Error naming them when none does.
Gemm cblas_gemm();

}  // namespace optfuse::optim
