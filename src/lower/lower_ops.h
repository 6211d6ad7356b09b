#pragma once
// Per-op lowering to Halide expressions (internal; includes Halide.h — src/lower and src/jit only).
#include <Halide.h>

#include <string>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse::lower {

// Per-element code may use the refined f32 rsqrt estimate (<= 4 ulp; sqrt and divide are always
// the exact IEEE operations, README.md); code that runs once per call (the uniforms Func) uses
// exact ones everywhere: its cost does not matter.
enum class Precision { Exact, Fast };

// Lowers one non-leaf op whose result dtype is `t`, on already-lowered operands. 16-bit float
// operands are computed in f32 and the result rounded once to `t` (exact for + - * / sqrt: f32
// has more than 2p+2 significand bits for both f16 and bf16).
Halide::Expr lower_op(Op op, DType t, const std::vector<Halide::Expr>& args, Precision p);

// min / max that propagate NaN (torch.minimum semantics, and the interpreter's), for any float
// type.
Halide::Expr nan_min_max(bool is_min, const Halide::Expr& a, const Halide::Expr& b);

// A constant of dtype `t` (the graph already rounded `v` to `t`).
Halide::Expr constant(double v, DType t);

// round_sr (graph.h, graph/eval.cpp): f32 `x` to bf16 with the random bits of element `index`
// (Int(32)) under `key` (a uniform f64 integer); 32-bit integer ops only, so it vectorizes.
Halide::Expr round_sr_bf16(const Halide::Expr& x, const Halide::Expr& key,
                           const Halide::Expr& index);

// f32 1/sqrt(x) from the hardware estimate plus ONE Newton step; IEEE results for 0, -0, +inf,
// negatives and NaN; max error measured in README.md. Never the bare estimate (~3e-4 relative).
Halide::Expr fast_rsqrt_f32(const Halide::Expr& x);

// Halide plumbing both pipelines (lower.cpp, staged.cpp) build with.
// A Halide name from a user's: a C identifier in generated code, sanitized and prefixed, `index`
// keeping it unique.
std::string identifier(const char* prefix, size_t index, const std::string& name);
// Element `index` of a call to a Func whose definition has `count` values (Halide refuses [] on
// a Func that does not return a Tuple).
Halide::Expr element(const Halide::FuncRef& ref, int index, size_t count);
// f(vars) = the one value, or the Tuple of several.
void define(Halide::Func& f, const std::vector<Halide::Var>& vars,
            const std::vector<Halide::Expr>& values);

}  // namespace optfuse::lower
