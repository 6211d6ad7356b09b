#pragma once
// Scalar semantics of ops in double precision, shared by constant folding (canonicalize) and the
// reference interpreter so that the two can never disagree.
#include <cstddef>

#include "optfuse/graph.h"

namespace optfuse::graph_detail {

// Rounds `x` to the nearest value representable in `t` (round-to-nearest-even, overflow to
// infinity, subnormals kept); bool maps to 1.0 or 0.0 (x != 0). Every NaN becomes the one quiet
// NaN, so a constant's bits (and with them hash-consing and hashing) do not depend on a payload.
double round_to_dtype(double x, DType t);

// Evaluates one non-leaf op of result dtype `t` on `args` (op_arity(op) values). Arithmetic is in
// double, unrounded; comparisons give 1.0/0.0; select tests cond != 0; cast rounds to `t`.
double eval_op(Op op, DType t, const double* args);

// Reduces `count` values with reduction op `op` (reduce_* or row_*) in double, unrounded: the
// sum, the mean, or the NaN-propagating max / min (-inf / +inf for no values).
double reduce(Op op, const double* values, size_t count);

}  // namespace optfuse::graph_detail
