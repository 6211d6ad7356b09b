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
// made the same loop twice as slow here. Hence this pass, in two halves: add_prefetch_pass on the
// Halide pipeline, and finish_prefetch_pass on the LLVM module Halide makes of it (the locality
// hints), which src/jit/kernel_object.cpp runs before code generation.
#include <Halide.h>

#include <string>
#include <vector>

namespace llvm {
class Module;
}

namespace optfuse::lower {

// A pure function of no arguments that returns 0, added to the offset of each L2 prefetch so that
// finish_prefetch_pass can tell those from the others (and replace the calls by 0).
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

// The pass's LLVM half: Halide 14 emits llvm.prefetch with locality 0 (prefetchnta). Each
// prefetch computed from a kPrefetchL2Marker call gets locality 2 (prefetcht1: L2 and L3, not
// L1), every other one 3 (prefetcht0: every level); the marker calls become 0.
void finish_prefetch_pass(llvm::Module& m);

}  // namespace optfuse::lower
