#pragma once
// f32 multiply-adds rounded once, as one FMA instruction, and f32 square roots of whole vectors
// (internal; includes Halide.h).
//
// Why: Halide 14 has no fused multiply-add it promises to keep. A graph that needs
// round(a * b + c) with one rounding (torch's fused 16-bit AdamW forms its second moment so:
// src/optim/adam.cpp, unmastered_graph) writes it as f32(f64(a) * f64(b) + f64(c)): the
// product of two f32 values is exact in f64, and f32 has no multiply-add LLVM would not
// re-associate. On x86 that costs 16 vcvtps2pd / vcvtpd2ps, vextract and vinsert per 32
// elements, and the f64 sum rounds twice (it differs from one rounding where the f64 result is
// an f32 tie the exact sum is not, about once in 2^28 values).
//
// How: lowering recognizes that expression (exact_fma_f32) and emits a call to a named pure
// function (kFmaF32) instead, which Halide's code generator emits lane by lane; finish_fma_pass,
// on the LLVM module (src/jit/kernel_object.cpp runs it before code generation), turns the lanes
// back into ONE llvm.fma of whole vectors (vfmadd...ps), and a scalar call into a scalar
// llvm.fma. The result is the correctly rounded a * b + c: the f64 form's value except in those
// double-rounding cases, where it is the one torch's kernel computes. A sum the graph adds to
// the result must be strict: Halide's float ops allow re-association, and LLVM folds
// fma(a, b, x * y) + z into fma(a, b, fma(x, y, z)) (src/optim/adam.cpp).
#include <Halide.h>

namespace llvm {
class Module;
}

namespace optfuse::lower {

constexpr const char* kFmaF32 = "optfuse_fma_f32";    // float(float a, float b, float c)
constexpr const char* kSqrtF32 = "optfuse_sqrt_f32";  // float(float x), IEEE square root

// Whether `target` gets the calls (both kinds): CPU x86 targets with FMA (their kernels go through
// finish_fma_pass; without an FMA unit llvm.fma would be a libm call, and CUDA kernels are
// compiled inside Halide, where the pass never runs).
bool target_has_exact_fma(const Halide::Target& target);

// `e` (an f64 expression about to be rounded to f32) as fma(a, b, c) when it is
// f64(a) * f64(b) + f64(c) (either operand order) with a, b, c of type f32; else undefined.
Halide::Expr exact_fma_f32(const Halide::Expr& e);

// The f32 square root of `x` (any lanes) as a call finish_fma_pass makes ONE llvm.sqrt of the
// whole vector. Halide 14 emits a vector sqrt as 8-lane AVX calls, so a 32-lane vector became
// four vsqrtps ymm plus two vextractf64x4 and two vinsertf64x4; llvm.sqrt.v32f32 is two
// vsqrtps zmm on AVX-512 (four ymm on AVX2), correctly rounded either way.
Halide::Expr vector_sqrt_f32(const Halide::Expr& x);

// The LLVM half: each lane-by-lane call becomes a lane of ONE llvm.fma (llvm.sqrt) of the
// vectors its operands' lanes came from (an operand that is the same scalar in every lane is
// splatted), or a scalar llvm.fma (llvm.sqrt). A module without the calls is left as it is.
void finish_fma_pass(llvm::Module& m);

}  // namespace optfuse::lower
