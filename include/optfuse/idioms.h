#pragma once
// The idiom front end: brings an update graph written any natural way into the normal form the
// library's own optimizers are built in, so that the same update is the same kernel.
//
//   NormalizedGraph n = optfuse::normalize(user_graph);
//   engine.kernel_key(n.graph) == engine.kernel_key(optfuse::update_graph({{"type", "adam"}}));
//   auto k = engine.kernel(n.graph);
//   call.scalars = ... n.kernel_scalars({{"lr", 1e-3}, {"beta1", 0.9}, ...}) in signature order
//
// Two stages:
//  1. Idiom rules (named; src/graph/idiom_rules.cpp lists them with their exactness): EMA and
//     lerp spellings, bias correction, decoupled and L2 weight decay, Nesterov look-ahead, Adam's
//     denominator, gradient centralization (g - row_mean(g)), the maximize sign, and the
//     gathering of uniform factors so that scalar math is separable from per-element math.
//     Rules fire only on graphs NOT already in normal form: the library's graphs come out
//     unchanged (tests/test_idioms.cpp checks every one).
//  2. Host scalars: every maximal float subexpression of scalars and constants only (not of a
//     reduction: that needs the data) that the kernel reads (1 - beta1, lr / bias_correction1,
//     1 / sqrt(bias_correction2), 1 - lr * weight_decay, ...) becomes one kernel scalar whose
//     value the host computes in double from the graph's own scalars and rounds once (measured:
//     1 - beta2 in fp32 alone costs ~1e-5 relative error). Known formulas get the library's
//     names (one_minus_beta1, step_size, inv_bias_correction2_sqrt, decay, grad_sign); others
//     are named by their formula text. Scalars only host formulas read leave the signature.
// Hoisting changes the kernel's signature, so it is not part of canonicalize() (Engine::kernel
// keeps "the kernel takes g's scalars"); canonicalize() runs only the exact rules that keep it.
//
// Numbers: a rewrite that is not bit-exact says so where it is defined, with the bound; every
// rewrite is exact in real arithmetic (interpret() agrees before and after up to the f32 rounding
// of the scalars).
#include <map>
#include <string>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse {

// A formula over a graph's scalars and constants, evaluated on the host in double.
struct HostExpr {
  Op op = Op::Const;
  DType dtype = DType::F32;
  double value = 0;  // Const
  std::string name;  // Scalar: the source graph's scalar
  std::vector<HostExpr> args;

  // Evaluates in double from `scalars` (by name; bool scalars as 0 / 1); Error naming a missing
  // scalar. Casts round to their dtype; nothing else is rounded.
  double eval(const std::map<std::string, double>& scalars) const;
  // Infix text with operands of commutative ops sorted, e.g. "lr/(1-pow(beta1,step))".
  std::string str() const;
};

struct NormalizedGraph {
  Graph graph;  // canonical (canonicalize()); its scalars are the kernel's
  // Kernel scalars computed on the host, by name; the graph's other scalars are the source
  // graph's scalars passed through unchanged.
  std::map<std::string, HostExpr> host_scalars;
  std::vector<std::string> idioms;  // names of the idiom rules that matched, in first-match order

  // The kernel's scalar values (every scalar of `graph`, by name) from the source graph's.
  std::map<std::string, double> kernel_scalars(const std::map<std::string, double>& source) const;
};

// A readable account for `optfuse explain`: the idioms matched, then one line per host scalar
// ("step_size = lr/bias_correction1").
std::string describe(const NormalizedGraph& n);

// Idiom rules to a fixed point, then host scalars, then canonicalize(). Error if the rules do not
// converge (a bug in a rule).
NormalizedGraph normalize(const Graph& g);

// The idiom names normalize() reports for `g` (for `optfuse explain`).
std::vector<std::string> matched_idioms(const Graph& g);

// The names of every idiom rule, and whether each is enabled (a disabled rule is written but
// waits for ops that are not in ops.def yet; see src/graph/idiom_rules.cpp).
struct IdiomInfo {
  std::string name;
  std::string summary;  // what it recognizes and what it rewrites to, with exactness
  bool enabled = true;
};
std::vector<IdiomInfo> idiom_rules();

}  // namespace optfuse
