#pragma once
// bf16 <-> f32 conversions as plain integer operations (internal; includes
// Halide.h).
//
// Why: Halide 14 emulates them (on every x86 target but avx512_sapphirerapids) as
// strict_float(x) followed by integer rounding. strict_float makes Halide emit a second copy of
// the whole f32 expression of x without fast-math flags, next to the copy stored as the f32
// master, so products get extra uses and LLVM's FMA formation ("fuse the multiply with fewer
// uses") contracts differently than in the f32 kernel: AdamW's master update became
// fma(-step_size, m/denom, decay * p) instead of the f32 kernel's fma(decay, p, -(step_size *
// (m/denom))), up to 15 ulp apart after 5 steps, and the bf16 param was rounded from that second
// copy, not from the stored master. avx512_sapphirerapids used vcvtne2ps2bf16 instead, which
// flushes subnormals to zero.
//
// How: this lowering pass replaces each cast with the same arithmetic on the bits,
// reinterpret(x) + 0x7fff + lsb, >> 16 (round to nearest even), NaN kept a quiet NaN as
// optim::to_bf16_bits does, and a shift left by 16 to widen. No float op is added or copied, so
// a bf16 kernel's f32 ops, their flags and uses are those of the f32 kernel, on every target.
// On x86 with AVX-512BW the same rounding is left in the high halves of the 32-bit lanes and
// packed by one vpermt2w per 32 lanes (README.md, "Whole-vector FMA and square root"; loops of
// bf16 values only round pairs in 16-bit lanes instead, even_odd.h). On other
// x86 CPUs (AVX2) a vector's NaN lanes cost 4 of its 9 instructions per 8 lanes, so each vector
// is tested for NaNs once (one vcmpunordps per two 8-lane halves) and only a vector with one
// takes the NaN lanes' selects (bf16.md, "bf16 narrowing on AVX2"): a call of
// kF32ToBf16NanBranch, made into the test and both paths by finish_bf16_pass as below.
//
// On CPUs with AVX512-BF16 (lower.h, CpuExtras) a vector of a multiple of 32 lanes narrows by
// one vcvtne2ps2bf16 per 32 lanes instead: the same rounding (nearest even, NaNs quiet with the
// high half of their payload) for every input but subnormals, which the instruction reads as
// zero. So each vector first checks for a subnormal lane and, if it has one (rarely: a moment
// decayed for hundreds of steps), narrows with the integer operations. The pass emits a call of
// kF32ToBf16 there, which Halide emits lane by lane; finish_bf16_pass, on the LLVM module
// (src/jit/kernel_object.cpp runs it before code generation), makes each vector's lanes that
// check and the two paths, and adds AVX512-BF16 to the module's code generation features.
#include <Halide.h>

namespace llvm {
class Module;
}

namespace optfuse::lower {

constexpr const char* kF32ToBf16 = "optfuse_f32_to_bf16_bits";  // uint16_t(float), as above
constexpr const char* kF32ToBf16NanBranch = "optfuse_f32_to_bf16_bits_nan_branch";  // the same
// uint32_t(float even, float odd): both narrowed as above, even's bf16 in the low half and odd's
// in the high half (even_odd.h). Vectors of both are rounded in 16-bit lanes: the high halves
// of a vector's even and odd lanes interleaved (the word the store takes), their low halves
// likewise, and one carry per 16-bit lane, nearest even (finish_bf16_pass).
constexpr const char* kF32PairToBf16NanBranch = "optfuse_f32_pair_to_bf16_nan_branch";
// The same without the NaN test: a NaN lane's word is unspecified (one_nan_test.h writes it
// again).
constexpr const char* kF32PairToBf16 = "optfuse_f32_pair_to_bf16";
// bool(float a, float b): whether a or b is a NaN, one compare "unordered" per pair of vectors
// (one_nan_test.h tests the even and odd halves of a value so, as the tests above do).
constexpr const char* kUnordered = "optfuse_f32_unordered";

// The bf16 bits (u16 lanes) of f32 lanes by the integer operations above: nearest even, a NaN's
// quiet NaN (as optim::to_bf16_bits). What the pass emits where no instruction narrows.
Halide::Expr bf16_bits_of(const Halide::Expr& f32);

// Adds the pass to `p` for every target: on CUDA it is also what lets bf16 stores compile (LLVM
// 14's NVPTX backend cannot select an f32 -> bf16 fp_round). `avx512_bf16`: x86 CPU targets
// with AVX-512BW narrow with vcvtne2ps2bf16.
void add_bf16_pass(Halide::Pipeline& p, const Halide::Target& target, bool avx512_bf16);

// The pass's LLVM half (the calls above; a module without them is left as it is).
void finish_bf16_pass(llvm::Module& m);

}  // namespace optfuse::lower
