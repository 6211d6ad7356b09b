#pragma once
// f16 <-> f32 conversions as single F16C instructions on x86 (internal; includes Halide.h).
//
// Why: Halide 14 has no native float16 on x86, so it converts with integer bit operations (its
// float16 emulation): about a dozen vector instructions per conversion each way, which made f16
// params the slowest dtype (0.50 of the f32 ceiling for AdamW at 2^20 vs 0.87 for bf16).
// Targets with F16C convert in one vcvtph2ps / vcvtps2ph, both IEEE round-to-nearest-even, the
// rounding Halide's emulation implements, so the results are the same.
//
// How: this lowering pass replaces each f16 -> f32 and f32 -> f16 cast with a call to a named
// conversion (kF16ToF32 / kF32ToF16, on the bits as uint16), which Halide's code generator
// emits lane by lane; finish_f16c_pass, on the LLVM module (src/jit/kernel_object.cpp runs it
// before code generation), then turns those calls back into one LLVM vector fpext / fptrunc of
// the whole vector, which LLVM selects as F16C instructions.
#include <Halide.h>

namespace llvm {
class Module;
}

namespace optfuse::lower {

constexpr const char* kF16ToF32 = "optfuse_f16_bits_to_f32";  // float(uint16_t bits)
constexpr const char* kF32ToF16 = "optfuse_f32_to_f16_bits";  // uint16_t(float)

// Adds the pass to `p` for x86 targets with F16C; no pass for any other target.
void add_f16c_pass(Halide::Pipeline& p, const Halide::Target& target);

// The pass's LLVM half: each lane-by-lane conversion call becomes a lane of ONE whole-vector
// conversion of the vector its lane came from (LLVM folds the lanes back into that vector), or a
// scalar conversion: fpext half -> float and fptrunc float -> half (vcvtph2ps / vcvtps2ph with
// F16C, round to nearest even). A module without the calls is left as it is.
void finish_f16c_pass(llvm::Module& m);

}  // namespace optfuse::lower
