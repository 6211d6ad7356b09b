#pragma once
// Autotuning: measure schedules for update graphs on this machine and keep the best per (kernel
// structure, target, size) in a ScheduleDb (include/optfuse/schedules.h). `optfuse tune` is the
// command line over this.
//
// The search, per graph and size: start from the default schedule and vary one dimension at a
// time (vector width, unroll, task split, prefetch distances; see schedule_space), keeping a value
// only if it beats the best so far by `min_gain`; then re-measure the winner against the default
// with twice the pairs and keep it only if it still wins by `min_gain`: no schedule is reported
// (or written) whose confirmed gain is below it. Every measurement is PAIRED: default and
// candidate are called alternately on the same buffers (order swapped every pair) and the figure is
// the median of the per-pair time ratios, so load changes on a busy machine cancel out.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/schedules.h"

namespace optfuse {

// One dimension of the schedule space: a name and the schedules it tries, each as a change of
// the incumbent (the best schedule so far).
struct ScheduleDimension {
  std::string name;  // "vector_width", "unroll", "tasks", "prefetch", "prefetch_l2"
                     // ("gpu_block", "elements_per_thread")
  std::vector<std::function<void(Schedule&)>> values;
  std::vector<std::string> labels;  // one per value, for listings
  // Searched only at sizes whose call moves more bytes than the last-level cache holds (the
  // prefetch distances). In a training step the optimizer's tensors come from memory whatever
  // their size: the forward and backward passes evict them between steps. A tensor stepped
  // alone in a loop stays cache-resident instead, where prefetches cost a few percent, and that
  // measurement turned them off for every tensor near 2^20 elements: the demo's 98 M parameters
  // then ran at 0.91-0.92 of the machine's limit, against 1.00 with the default schedule.
  bool past_cache_only = false;
};

// The space searched for `resolved_target` (Engine::target_string()). CPU: vector width (the
// natural f32 width times 1, 2 (default), 4), unroll (1, 2, 4 vectors), task split (1, 2, 4
// tasks per thread, or fixed tasks of 64K, 256K, 1M elements), software prefetch distance (none,
// 1, 2 (default), 4 KiB) and L2 prefetch distance (none, 8, 16 (default), 64 KiB), these two only
// at sizes past the last-level cache (ScheduleDimension::past_cache_only). CUDA: threads
// per block (64 to 1024) and elements per thread (1, 2, 4, 8); listed, but only searchable with a
// CUDA device.
std::vector<ScheduleDimension> schedule_space(const std::string& resolved_target);

struct TuneOptions {
  std::string target = "host";
  int threads = 0;             // 0 = hardware concurrency
  double budget_seconds = 60;  // for everything, compiles included
  std::vector<int64_t> sizes = {int64_t(1) << 20, int64_t(1) << 26};  // elements per tensor
  double min_gain = 0.02;  // a candidate must be this much faster (paired median) to be kept,
                           // when found and again when confirmed
  std::string cache_dir;   // compile cache for candidate kernels ("" = memory only)
  std::function<void(const std::string&)> progress;  // one line per measurement (may be empty)
};

// What was measured for one schedule of one graph at one size.
struct TuneTrial {
  std::string graph_name, schedule;
  int64_t n = 0;
  double ratio = 0;  // median of paired default/candidate times (> 1: candidate faster)
  double gbps = 0;   // candidate's median
  int pairs = 0;
  bool kept = false;
};

struct TuneReport {
  std::string target;  // resolved
  int threads = 0;
  std::vector<TunedSchedule> best;  // one per (graph, size), the default schedule if nothing won
  std::vector<TuneTrial> trials;
  double seconds = 0;
  bool budget_exhausted = false;  // some (graph, size) stopped early
};

// Tunes every graph (duplicates by structure are tuned once) at every size within the budget.
// Graphs with an opaque op (Muon's) are skipped, and `progress` says so: their kernels keep the
// default schedules. Throws Error for GPU targets (no device search yet) and for graphs that
// cannot be compiled.
TuneReport tune(const std::vector<Graph>& graphs, const TuneOptions& options);

// Bytes the last-level cache holds (sysconf / sysfs; 32 MiB if unknown): what "cache" means in
// TunedSchedule::size_class.
int64_t last_level_cache_bytes();

}  // namespace optfuse
