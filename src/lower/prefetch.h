#pragma once
// Software prefetch for the streaming loop of CPU kernels (internal; includes Halide.h).
//
// Why: on the 2-core x86 machines here a fused AdamW streamed from DRAM ran at 0.85-0.90 of the
// 4-read-3-write ceiling even with its divides and square roots replaced by multiplies, while
// the same loop with one prefetcht0 per cache line per input, ~2 KiB ahead, reached the ceiling
// (src/lower/README.md, "Software prefetch"). Each core keeps only so many misses in flight and
// the hardware prefetcher restarts at every 4 KiB page; a loop with more arithmetic per line
// issues its demand loads later, so fewer lines are in flight. Prefetches retire at once and
// keep the memory system busy whatever the arithmetic costs. A second prefetch per line, into L2
// only and farther ahead (prefetcht1, 16 KiB by default), keeps more lines in flight than the L1
// miss slots allow: AdamW streamed from DRAM went from 0.92-0.95 to 0.97-0.99 of the ceiling
// (src/lower/README.md, "A second prefetch into L2").
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

// A pure function of no arguments that returns 0, added to the offset of each L2 prefetch so that
// jit/kernel_object.cpp can tell those from the others (and replace the calls by 0).
inline constexpr const char* kPrefetchL2Marker = "optfuse_prefetch_l2_marker";

// Adds to `p` a lowering pass that, inside every loop whose name contains one of `loops` (the
// schedule names them: the parallel tasks' vector loop, the row loop of per-row graphs), puts
// before each store one prefetch per cache line of each dense vector the store reads from an
// input buffer, and of the vector it writes when its buffer is one of `write_only_buffers`
// (outputs no input load reads first): `distance_bytes` ahead, and again into L2 only
// `l2_distance_bytes` ahead (a second, farther stream that the near one then finds in L2).
// Prefetches never fault, so ones past the end of a buffer are harmless. A distance <= 0 adds
// none of its kind; no loops or neither kind: no pass.
void add_prefetch_pass(Halide::Pipeline& p, const std::vector<std::string>& loops,
                       const std::vector<std::string>& write_only_buffers, int distance_bytes,
                       int l2_distance_bytes);

}  // namespace optfuse::lower
