#pragma once
// One NaN test per loop body for the even/odd bf16 stores (internal; Halide IR; includes
// Halide.h).
//
// Why: each even/odd store on x86 narrows by kF32PairToBf16NanBranch (bf16.h), which tests its
// vectors for NaNs (a compare, a mask extraction and a branch per 16 values) before the 16-bit
// rounding, whose carry would corrupt a NaN's payload. In the unmastered AdamW that is 3 of ~35
// instructions per 8 elements for three stores, yet a NaN in the new moments always reaches the
// new param: p' = p * decay + (-step_size * m') / (sqrt(v') * ... + eps).
//
// How: where the value one store narrows is computed from another's, lane for lane, through
// operations that return a NaN for a NaN operand (+, -, *, /, square roots, float casts), a NaN
// in the latter's lane is one in the former's too. Only the stores no other store's value covers
// so ("sinks") are tested, once, after the last store: every store narrows without its test
// (kF32PairToBf16), and if a sink has a NaN lane, every store is written again, narrowed exactly
// by integer operations on whole vectors (as optim::to_bf16_bits). The stores' values and
// addresses are in scope there and their inputs already read, so the second writes store what
// the first should have. Each stored value is bound to a name first, so that the test and the
// second writes reuse it instead of generating its arithmetic again (src/lower/bf16.md).
//
// Where: innermost loop bodies even_odd.cpp rewrote (their stores are pairs), when at least one
// store's value is covered by another's and every value the second writes need is bound where
// they go; any other body is left as it is.
#include <Halide.h>

namespace optfuse::lower {

// `body` with its pair stores' NaN tests made one, or `body`.
Halide::Internal::Stmt with_one_nan_test(const Halide::Internal::Stmt& body);

}  // namespace optfuse::lower
