// The schedule search (see include/optfuse/tune.h): coordinate descent from the default schedule
// over schedule_space(), every candidate measured paired against the default.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <set>

#include "jit/halide_bridge.h"
#include "optfuse/error.h"
#include "optfuse/tune.h"
#include "tune/measure.h"

namespace optfuse {
namespace {

using Clock = std::chrono::steady_clock;
using tune_detail::PairedResult;
using tune_detail::Workload;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string today_utc() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

std::string size_text(int64_t n) {
  for (int p = 0; p < 63; ++p)
    if (n == int64_t(1) << p) return "2^" + std::to_string(p);
  return std::to_string(n);
}

template <typename F>
void add(ScheduleDimension& d, std::string label, F f) {
  d.labels.push_back(std::move(label));
  d.values.push_back(f);
}

// One (graph, size): the search and its bookkeeping.
class SizeSearch {
 public:
  SizeSearch(Engine& engine, const Graph& g, int64_t n, const TuneOptions& o, double budget,
             TuneReport& report)
      : engine_(engine),
        g_(g),
        n_(n),
        o_(o),
        budget_(budget),
        report_(report),
        base_(engine.kernel(g)),
        work_(base_->signature(), n) {}

  TunedSchedule run(const std::vector<ScheduleDimension>& space) {
    auto t0 = Clock::now();
    // Time per measurement: the budget spread over the space (~12 candidates + confirmation),
    // at least 3 pairs however long a call is.
    const bool past_cache = work_.bytes_per_call() > last_level_cache_bytes();
    size_t candidates = 2;
    for (const auto& d : space)
      if (past_cache || !d.past_cache_only) candidates += d.values.size();
    per_trial_ = std::clamp(budget_ / static_cast<double>(candidates) * 0.5, 0.02, 3.0);
    double last_trial = 0;  // wall time of the last trial, compile included: the next one's guess
    Schedule best = base_->schedule();
    double best_ratio = 1.0;
    std::set<std::string> seen{best.str()};
    for (const ScheduleDimension& dim : space) {
      if (dim.past_cache_only && !past_cache) continue;
      Schedule incumbent = best;
      for (const auto& change : dim.values) {
        if (since(t0) + last_trial > budget_) {
          report_.budget_exhausted = true;
          break;
        }
        Schedule s = incumbent;
        change(s);
        s = jit::resolve_schedule(s, engine_.target_string());
        if (!seen.insert(s.str()).second) continue;
        auto t_trial = Clock::now();
        PairedResult r = trial(s, 3, per_trial_);
        last_trial = since(t_trial);
        bool kept = r.ratio >= 1.0 + o_.min_gain && r.ratio > best_ratio;
        record(s, r, kept);
        if (kept) {
          best = s;
          best_ratio = r.ratio;
        }
      }
    }
    TunedSchedule t;
    t.graph = structural_hash(canonicalize(g_)).hex();
    t.name = g_.name();
    t.n = n_;
    t.size_class = past_cache ? "memory" : "cache";
    t.threads = engine_.num_threads();
    t.date = today_utc();
    t.schedule = base_->schedule();
    // Confirmation: the winner again, twice as long; it must still beat the default by
    // min_gain, the promise `--min-gain` makes for what is written.
    PairedResult c = trial(best, 5, 2 * per_trial_);
    if (best != base_->schedule() && c.ratio >= 1.0 + o_.min_gain) {
      t.schedule = best;
      t.ratio = c.ratio;
    } else {  // the default stays: its ratio to itself is 1 by definition
      t.ratio = 1.0;
      if (best != base_->schedule()) record(best, c, false, "not confirmed");
      c.candidate_seconds = c.base_seconds;
    }
    double bytes = static_cast<double>(work_.bytes_per_call());
    t.gbps = bytes / std::max(c.candidate_seconds, 1e-12) / 1e9;
    t.default_gbps = bytes / std::max(c.base_seconds, 1e-12) / 1e9;
    progress(g_.name() + " n=" + size_text(n_) + ": best " + t.schedule.str() + " (" +
             fmt(t.ratio) + "x default, " + fmt(t.gbps) + " GB/s)");
    return t;
  }

 private:
  PairedResult trial(const Schedule& s, int min_pairs, double seconds) {
    std::shared_ptr<const Kernel> k = engine_.kernel(g_, s);
    return tune_detail::measure_pair_for_tune(*base_, *k, work_, min_pairs, seconds);
  }

  void record(const Schedule& s, const PairedResult& r, bool kept, const char* note = nullptr) {
    TuneTrial t{g_.name(),
                s.str(),
                n_,
                r.ratio,
                work_.bytes_per_call() / std::max(r.candidate_seconds, 1e-12) / 1e9,
                r.pairs,
                kept};
    report_.trials.push_back(t);
    progress(g_.name() + " n=" + size_text(n_) + " " + s.str() + ": " + fmt(r.ratio) +
             "x default (" + fmt(t.gbps) + " GB/s, " + std::to_string(r.pairs) + " pairs)" +
             (kept ? " kept" : "") + (note ? std::string(" ") + note : ""));
  }

  void progress(const std::string& line) const {
    if (o_.progress) o_.progress(line);
  }

  static std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", v);
    return buf;
  }

  Engine& engine_;
  const Graph& g_;
  int64_t n_;
  const TuneOptions& o_;
  double budget_;
  TuneReport& report_;
  std::shared_ptr<const Kernel> base_;
  Workload work_;
  double per_trial_ = 0.1;
};

}  // namespace

std::vector<ScheduleDimension> schedule_space(const std::string& resolved_target) {
  std::vector<ScheduleDimension> space;
  if (jit::target_uses_cuda(resolved_target)) {
    ScheduleDimension block{"gpu_block", {}, {}}, ept{"elements_per_thread", {}, {}};
    for (int b : {64, 128, 256, 512, 1024})
      add(block, "b" + std::to_string(b), [b](Schedule& s) { s.gpu_block = b; });
    for (int v : {1, 2, 4, 8})
      add(ept, "v" + std::to_string(v), [v](Schedule& s) { s.vector_width = v; });
    return {block, ept};
  }
  const int natural = jit::resolve_schedule(Schedule(), resolved_target).vector_width / 2;
  ScheduleDimension vw{"vector_width", {}, {}}, unroll{"unroll", {}, {}}, tasks{"tasks", {}, {}};
  for (int f : {1, 2, 4})
    add(vw, "v" + std::to_string(natural * f),
        [w = natural * f](Schedule& s) { s.vector_width = w; });
  for (int u : {1, 2, 4}) add(unroll, "u" + std::to_string(u), [u](Schedule& s) { s.unroll = u; });
  for (int t : {1, 2, 4})
    add(tasks, "t" + std::to_string(t), [t](Schedule& s) {
      s.tasks_per_thread = t;
      s.task_elems = 0;
    });
  for (int64_t c : {int64_t(1) << 16, int64_t(1) << 18, int64_t(1) << 20})
    add(tasks, "c" + std::to_string(c), [c](Schedule& s) {
      s.tasks_per_thread = 1;
      s.task_elems = c;
    });
  ScheduleDimension prefetch{"prefetch", {}, {}, true};
  for (int p : {0, 1024, 2048, 4096})
    add(prefetch, "p" + std::to_string(p), [p](Schedule& s) { s.prefetch = p; });
  ScheduleDimension prefetch_l2{"prefetch_l2", {}, {}, true};
  for (int p : {0, 8192, 16384, 65536})
    add(prefetch_l2, "l" + std::to_string(p), [p](Schedule& s) { s.prefetch_l2 = p; });
  space = {vw, unroll, tasks, prefetch, prefetch_l2};
  return space;
}

int64_t last_level_cache_bytes() {
  // sysconf (CPUID) first. On AMD EPYC it is the package's L3, more than the one a core's sysfs
  // entry names; but on a Zen 1 VM whose sysfs said 8 MiB, 12 MB calls still ran at 100+ GB/s in
  // the tuner's loop (cache-resident), and searching prefetches there turned them off, which
  // costs real steps, whose tensors come from memory (ScheduleDimension::past_cache_only).
#ifdef _SC_LEVEL3_CACHE_SIZE
  long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) return l3;
#endif
  // sysfs: the highest cache index of cpu0, e.g. "260096K".
  for (int i = 4; i >= 0; --i) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/size");
    std::string text;
    if (in >> text && !text.empty()) {
      int64_t v = std::atoll(text.c_str());
      char unit = text.back();
      if (unit == 'K') v <<= 10;
      if (unit == 'M') v <<= 20;
      if (v > 0) return v;
    }
  }
  return int64_t(32) << 20;
}

TuneReport tune(const std::vector<Graph>& graphs, const TuneOptions& o) {
  auto t0 = Clock::now();
  EngineOptions eo;
  eo.target = o.target;
  eo.num_threads = o.threads;
  eo.cache_dir = o.cache_dir;
  Engine engine(eo);
  TuneReport report;
  report.target = engine.target_string();
  report.threads = engine.num_threads();
  if (jit::target_uses_cuda(report.target))
    throw Error("tune: target " + report.target +
                ": searching GPU schedules needs buffers on a "
                "CUDA device, which the tuner does not allocate yet (`optfuse tune --list` shows "
                "the GPU space: gpu_block x elements per thread)");
  // One search per structure: graphs that canonicalize to the same hash share a kernel. A graph
  // with an opaque op (Muon's Newton-Schulz step between its kernels) is not searched: its call
  // needs the op's implementation and a matrix, and the tuner runs flat buffers through one
  // engine; its kernels keep the default schedules.
  std::vector<const Graph*> unique;
  std::set<std::string> hashes;
  for (const Graph& g : graphs) {
    const Graph c = canonicalize(g);
    const auto& nodes = c.nodes();
    if (std::any_of(nodes.begin(), nodes.end(),
                    [](const Node& n) { return op_has(n.op, kOpaque); })) {
      if (o.progress) o.progress(g.name() + ": skipped: an opaque op runs between its kernels");
      continue;
    }
    if (hashes.insert(structural_hash(c).hex()).second) unique.push_back(&g);
  }
  std::vector<ScheduleDimension> space = schedule_space(report.target);
  const double items = static_cast<double>(unique.size() * o.sizes.size());
  for (int64_t n : o.sizes) {
    if (n < 1) throw Error("tune: size " + std::to_string(n) + " must be >= 1");
    for (const Graph* g : unique) {
      // What is left, shared evenly by the searches still to run.
      double left = o.budget_seconds - since(t0);
      double done = static_cast<double>(report.best.size());
      double budget = std::max(0.0, left / std::max(1.0, items - done));
      report.best.push_back(SizeSearch(engine, *g, n, o, budget, report).run(space));
    }
  }
  report.seconds = since(t0);
  return report;
}

}  // namespace optfuse
