#pragma once
// Scalar semantics of ops in double precision, shared by constant folding (canonicalize) and the
// reference interpreter so that the two can never disagree.
#include <cstddef>
#include <cstdint>

#include "optfuse/graph.h"

namespace optfuse::graph_detail {

// Rounds `x` to the nearest value representable in `t` (round-to-nearest-even, overflow to
// infinity, subnormals kept); bool maps to 1.0 or 0.0 (x != 0). Every NaN becomes the one quiet
// NaN, so a constant's bits (and with them hash-consing and hashing) do not depend on a payload.
double round_to_dtype(double x, DType t);

// Evaluates one non-leaf op of result dtype `t` on `args` (op_arity(op) values). Arithmetic is in
// double, unrounded; comparisons give 1.0/0.0; select tests cond != 0; cast rounds to `t`.
double eval_op(Op op, DType t, const double* args);

// The 16 random bits round_sr uses for element `index` under `key` (the kernel computes the same
// with 32-bit integer ops): the murmur3 finalizer of index * 0x9e3779b9 ^ key, top 16 bits. For a
// fixed key the map index -> hash is a bijection on 32 bits, so elements never share a stream.
uint32_t round_sr_bits(uint32_t key, uint32_t index);

// round_sr (graph.h): x rounded to f32 (the operand's dtype), then its bits + the random bits,
// truncated to bf16. NaN stays NaN; values within an ulp of the largest bf16 may round to inf.
double round_sr(double x, uint32_t key, uint32_t index);
// Reduces `count` values `stride` apart with reduction op `op` (reduce_*, row_* or col_*) in
// double, unrounded: the sum, the mean, or the NaN-propagating max / min (-inf / +inf for no
// values).
double reduce(Op op, const double* values, size_t count, size_t stride = 1);

}  // namespace optfuse::graph_detail
