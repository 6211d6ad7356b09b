#pragma once
// bf16 vectors computed in even/odd lane order (internal; Halide IR; includes Halide.h).
//
// Why: widening a bf16 vector moves each 16-bit lane into the high half of a 32-bit lane
// (vpmovzxwd, vpslld), and narrowing shifts it back and packs (vpsrld, vpackusdw, vpermq). In the
// unmastered bf16 AdamW on AVX2 that was a quarter of the loop's instructions, and AMD's Zen 1 runs
// each of those at one 256-bit instruction per 2 cycles (src/lower/bf16.md, "bf16 in even/odd
// lane order"). AVX-512 without AVX512-BF16 widens the same way; there the unmastered step ran
// 7-8% faster in even/odd order (a Sapphire Rapids Xeon compiled for that target; same section).
//
// How: read as 32-bit words, a vector of 2k bf16 values holds element 2j in the low half of word
// j and element 2j+1 in the high half, so `w << 16` is the even elements as f32 and
// `w & 0xffff0000` the odd ones, with no shuffle. An element-wise update may run on its lanes in
// any order, so the pass widens each bf16 vector to its k even elements followed by its k odd
// ones, leaves the arithmetic as it is, and at each store puts the halves back: word j takes
// even lane j's bf16 as its low half and odd lane j's as its high half: a call of
// kF32PairToBf16NanBranch (bf16.h) of the two halves, which finish_bf16_pass rounds in 16-bit
// lanes, 16 values per instruction on AVX2 and 32 on AVX-512 (where rounding each half in its
// 32-bit lanes and packing the halves by vpermt2w took 9% longer at 2^24: bf16.md). Stores whose
// values' NaNs reach another store's value share its NaN test (one_nan_test.h).
//
// Where: each innermost loop whose vector values are all element-wise functions of bf16 vectors
// widened in it, of scalars and of broadcasts, and whose stores of such values store their
// narrowing to bf16 (add_bf16_pass runs it on x86 without AVX512-BF16). A loop with anything else
// (an f32 vector read from memory or a lane index meeting a widened value, a shuffle, a reduction
// across lanes, fewer than 8 lanes, a widened value stored as f32) is left as it is: it still
// computes in memory order.
#include <Halide.h>

namespace optfuse::lower {

// `s` with its qualifying innermost loops in even/odd lane order.
Halide::Internal::Stmt even_odd_lanes(const Halide::Internal::Stmt& s);

// The lowering pass of the function above, for Pipeline::add_custom_lowering_pass.
class EvenOddLanes : public Halide::Internal::IRMutator {
 public:
  Halide::Internal::Stmt mutate(const Halide::Internal::Stmt& s) override {
    return even_odd_lanes(s);
  }
  using Halide::Internal::IRMutator::mutate;
};

}  // namespace optfuse::lower
