#pragma once
// The machine's practical limit for an optimizer step: a fused kernel that reads 4 arrays and
// writes 3 (p, g, m, v -> p, m, v) with trivial arithmetic, the same traffic as Adam(W).
// Compiled by the same engine, with the same schedule, so a ratio against it isolates the cost
// of the update's arithmetic.
#include "optfuse/graph.h"

namespace optfuse::tools {

// p' = p + g, m' = m + g, v' = v + g  (4 reads, 3 writes per element).
Graph stream_4r3w_graph();

}  // namespace optfuse::tools
