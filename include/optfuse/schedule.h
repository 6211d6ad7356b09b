#pragma once
// Schedule: how a kernel is laid out over the machine (vector width, task split, prefetch, GPU
// block). Part of every kernel key; tuned per machine class by `optfuse tune` (schedules.h).
#include <cstdint>
#include <string>

namespace optfuse {

// How a kernel is laid out over the machine. Part of every kernel key.
struct Schedule {
  int vector_width = 0;      // lanes per vector op; 0 = twice the target's natural f32 width
  int tasks_per_thread = 1;  // parallel tasks per worker thread (few large tasks
                             // win: a task costs ~0.1 us, waking a thread ~30 us)
  int64_t min_task = 16384;  // elements below which a call runs as a single task
  // Vectors per iteration of the inner loop (1 = not unrolled): more independent loads in
  // flight per task. Each task's vector count is rounded up to a multiple of it.
  int unroll = 1;
  // Elements per parallel task; 0 = split each call into num_threads * tasks_per_thread equal
  // tasks. > 0: tasks of this fixed size (rounded up to whole vectors, at least min_task), as
  // many as the call needs, so small calls make few tasks and huge ones many.
  int64_t task_elems = 0;
  // CPU targets: software prefetch distance in bytes (0 = none). The parallel tasks' loop
  // prefetches every cache line of every input this far ahead of the vector it loads, so the
  // memory system stays busy while the arithmetic of an update runs (src/lower/prefetch.h).
  int prefetch = 2048;
  // CPU targets: a second prefetch per line into L2 only, this many bytes ahead (0 = none).
  // Farther than `prefetch`, it keeps more lines on their way from memory than the core's
  // L1 miss slots allow, so the near prefetch then finds them in L2.
  int prefetch_l2 = 16384;
  // GPU targets only (ignored, and reset to 0, for CPU targets): threads per block; 0 = 256. On
  // a GPU target vector_width is the consecutive elements each thread handles (0 = 4: one 128-bit
  // access per f32 tensor) and tasks_per_thread / min_task are unused (reset to their defaults).
  int gpu_block = 0;
  // Stable text used in keys: "v16.t1.m16384" for CPU schedules (unchanged by gpu_block), with
  // ".u4" / ".c65536" / ".p1024" / ".l16384" appended only when unroll / task_elems / prefetch /
  // prefetch_l2 differ from their defaults (so keys of
  // default schedules never change), and "gpu.v4.b256" for resolved GPU schedules.
  std::string str() const;

  bool operator==(const Schedule& o) const { return str() == o.str(); }
  bool operator!=(const Schedule& o) const { return !(*this == o); }
};

}  // namespace optfuse
