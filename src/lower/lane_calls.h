#pragma once
// Calls of a named pure function, which Halide's code generator emits lane by lane, made ONE
// computation of the whole vector again (internal; LLVM only). The LLVM half of the lowering
// passes that express an operation Halide 14 would lower badly as such a call (f16c.h,
// bf16.h).
#include <llvm/IR/IRBuilder.h>

#include <functional>
#include <vector>

namespace llvm {
class Module;
class Value;
}  // namespace llvm

namespace optfuse::lower {

// `convert(b, x)` computes the function of `x`, a vector or a scalar, at b's insertion point.
using UnaryLanes = std::function<llvm::Value*(llvm::IRBuilder<>& b, llvm::Value* x)>;

// Replaces the calls of `name`, a function of one argument, in this order of preference:
//   * the lanes of a vector Halide built of the calls' results (a chain of insertelements into
//     an undefined vector, one call per lane): ONE convert(their arguments gathered into a
//     vector) in place of that vector. LLVM may have split the calls' source vector into
//     halves, or scalarized an extract of a loaded vector into a scalar load, before this runs;
//     the code generator folds the gathering back.
//   * a call whose argument is a constant lane of a vector: that lane of ONE convert(source
//     vector), computed once right after the source's definition;
//   * any other call: convert(argument).
// The function's declaration is removed once unused. A module without the calls is left as it
// is.
void replace_unary_lane_calls(llvm::Module& m, const char* name, const UnaryLanes& convert);

// The same for a function of several arguments: `convert(b, args)` computes it of `args`, all
// vectors of one lane count or all scalars.
using LaneCalls =
    std::function<llvm::Value*(llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& args)>;

// Replaces the calls of `name`: the lanes of a vector Halide built of them (as above) by ONE
// convert(each argument's lanes gathered into a vector), any other call by convert(its
// arguments).
void replace_lane_calls(llvm::Module& m, const char* name, const LaneCalls& convert);

}  // namespace optfuse::lower
