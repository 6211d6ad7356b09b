#pragma once
// Software prefetch for the streaming loop of CPU kernels (internal; includes Halide.h).
//
// Why: on the 2-core x86 machines here a fused AdamW streamed from DRAM ran at 0.85-0.90 of the
// 4-read-3-write ceiling even with its divides and square roots replaced by multiplies, while
// the same loop with one prefetcht0 per cache line per input, ~2 KiB ahead, reached the ceiling
// (src/lower/README.md, "Software prefetch"). Each core keeps only so many misses in flight and
// the hardware prefetcher restarts at every 4 KiB page; a loop with more arithmetic per line
// issues its demand loads later, so fewer lines are in flight. Prefetches retire at once and
// keep the memory system busy whatever the arithmetic costs.
//
// Halide's own Func::prefetch does not serve: Halide 14 computes the prefetched box from the
// guarded tail bounds (a run-time trip count per vector), steps its per-line loop in elements
// where it means bytes (so it misses lines for 4-byte types), and emits prefetchnta, which
// made the same loop twice as slow here. Hence this pass, plus kernel_object.cpp's rewrite of
// the locality hint to "all cache levels".
#include <Halide.h>

#include <string>
#include <vector>

namespace optfuse::lower {

// Adds to `p` a lowering pass that, inside every loop whose name contains one of `loops` (the
// schedule names them: the parallel tasks' vector loop, the row loop of per-row graphs), puts before each store that reads a dense vector of an
// input buffer one prefetch per cache line of that vector, `distance_bytes` ahead. Prefetches
// never fault, so ones past the end of a buffer are harmless. distance_bytes <= 0 or no loops:
// no pass.
void add_prefetch_pass(Halide::Pipeline& p, const std::vector<std::string>& loops,
                       int distance_bytes);

}  // namespace optfuse::lower
