// Model-level layouts through Optimizer::step() (AdamW, fp32), each against the 4-read-3-write
// ceiling over the same bytes, in one process: GPT-2 small and ResNet-50 (their tensors and param
// groups from examples/specs/), 1000 tensors of 1K elements, and one flat tensor with GPT-2
// small's element count. The flat sizes are bench_update's and bench_matrix's.
//
// Each layout's tensors are slices of four flat arrays (param, grad, exp_avg, exp_avg_sq), every
// tensor starting on a 64-byte boundary. The step's state is bound to those slices
// (Optimizer::bind_state, as the Python package binds torch's state), so both ceilings move
// exactly the step's bytes:
//   per-tensor ceiling  tools/bandwidth.h's graph as a custom optimizer over the same tensor list
//                       and the same state slices: the same per-tensor calls, threads and
//                       scheduling as the step, only the arithmetic differs;
//   flat ceiling        the same graph as ONE kernel call over the four whole arrays (the
//                       layout's elements plus its < 16 elements of padding per tensor).
// Every iteration times one step and one pass of each ceiling, the order rotated, and only the
// step counts as the iteration's time. Counters: `step_ms` (median), `GBps` (bytes_per_step() /
// median step), `ceiling_GBps` and `flat_ceiling_GBps` (28 B/element / median pass), `share` and
// `flat_share` (median over iterations of the step's GB/s over that iteration's ceiling GB/s),
// `tensors`, `groups`, `elements`. So share says what the arithmetic costs, flat_share what the
// arithmetic and the per-tensor layout cost together. Model/ceiling/f32/resnet50 is a control:
// the step replaced by the per-tensor ceiling (share 1 if the pairing is fair). See
// bench/README.md.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bench/support.h"
#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "tools/bandwidth.h"
#include "tools/spec.h"

namespace optfuse::bench {
namespace {

constexpr int64_t kAdamBytes = 28;  // per element: 4 reads + 3 writes of fp32
constexpr int64_t kAlign = 16;      // floats: each tensor starts on a 64-byte boundary
constexpr int kWarmup = 3;          // untimed passes of each: compile, page faults, waking workers

struct Layout {
  struct Group {
    Options overrides;  // add_param_group's
    std::vector<tools::ModelSpec::Param> tensors;
  };
  std::string name;
  std::string optimizer;  // for the benchmark's name
  Options config;         // Optimizer::create's
  std::vector<Group> groups;

  int64_t tensors() const {
    int64_t n = 0;
    for (const auto& g : groups) n += static_cast<int64_t>(g.tensors.size());
    return n;
  }
  int64_t elements() const {
    int64_t n = 0;
    for (const auto& g : groups)
      for (const auto& t : g.tensors) n += t.numel;
    return n;
  }
};

std::string spec_path(const std::string& file) {
  const char* dir = std::getenv("OPTFUSE_BENCH_SPECS");
  return std::string(dir != nullptr && *dir != '\0' ? dir : OPTFUSE_BENCH_SPECS_DIR) + "/" + file;
}

// The options in `from` that AdamW takes: a spec for SGD (resnet50.json) keeps its lr and
// weight decay per group and drops momentum. Values are kernel arguments, so they do not change
// what is timed.
Options adamw_options(const Options& from) {
  static const Options known = optimizer_defaults("adamw");
  Options o = Options::object();
  for (const auto& [key, value] : from.items())
    if (known.contains(key)) o[key] = value;
  return o;
}

Layout from_spec(const std::string& file) {
  const tools::ModelSpec spec = tools::load_spec(spec_path(file));
  Layout l;
  l.name = spec.model;
  l.optimizer = "adamw";
  l.config = adamw_options(spec.optimizer);
  l.config["type"] = "adamw";
  for (const auto& g : spec.groups) {
    Layout::Group group{adamw_options(g.overrides), {}};
    for (size_t pi : g.params) group.tensors.push_back(spec.params[pi]);
    l.groups.push_back(std::move(group));
  }
  return l;
}

// `count` tensors of `each` elements in one group.
Layout uniform(const std::string& name, int64_t count, int64_t each, const Options& config) {
  Layout l{name, "adamw", config, {{Options::object(), {}}}};
  for (int64_t i = 0; i < count; ++i)
    l.groups[0].tensors.push_back({"t" + std::to_string(i), {each}, DType::F32, DType::F32, each});
  return l;
}

// GPT-2 small, one flat tensor of its element count, ResNet-50, 1000 x 1K: the two GPT-2-sized
// layouts next to each other, so their runs are close in time. The synthetic ones take GPT-2's
// optimizer options. After ResNet-50, a control: the same layout with the ceiling optimizer as
// the "step", so its share reads 1 unless the pairing favours one position.
const std::deque<Layout>& layouts() {
  static const std::deque<Layout> all = [] {
    std::deque<Layout> l;
    l.push_back(from_spec("gpt2-small.json"));
    const Layout& gpt2 = l.front();
    l.push_back(
        uniform("flat-" + std::to_string(gpt2.elements()), 1, gpt2.elements(), gpt2.config));
    l.push_back(from_spec("resnet50.json"));
    Layout control = l.back();
    control.optimizer = "ceiling";
    control.config = {{"type", ceiling_optimizer_type()}};
    for (auto& g : control.groups) g.overrides = Options::object();
    l.push_back(std::move(control));
    l.push_back(uniform("1000x1K", 1000, 1024, gpt2.config));
    return l;
  }();
  return all;
}

struct Fixture {
  const Layout* layout = nullptr;
  int64_t padded = 0;  // elements per flat array
  FloatBuffer p, g, m, v;
  std::unique_ptr<Optimizer> step, ceiling;
  std::shared_ptr<const Kernel> flat;
  KernelCall flat_call;
};

// Binds every tensor's state of `opt` to the slices of `m` and `v`; Error if the step would keep
// any other state of its own (its bytes would be missing from the ceilings).
void bind_state(Optimizer& opt, const Layout& l, const std::vector<std::vector<int64_t>>& offsets,
                float* m, float* v) {
  for (size_t gi = 0; gi < l.groups.size(); ++gi) {
    std::set<std::string> names;
    for (const auto& s : opt.state_spec(gi)) names.insert(s.name);
    if (names != std::set<std::string>{"exp_avg", "exp_avg_sq"})
      throw Error(opt.type() + ": state other than exp_avg and exp_avg_sq in group " +
                  std::to_string(gi));
    for (size_t ti = 0; ti < l.groups[gi].tensors.size(); ++ti) {
      const int64_t at = offsets[gi][ti], n = l.groups[gi].tensors[ti].numel;
      opt.bind_state(gi, ti, "exp_avg", {m + at, n, {}}, /*fresh=*/true);
      opt.bind_state(gi, ti, "exp_avg_sq", {v + at, n, {}}, /*fresh=*/true);
    }
  }
}

std::unique_ptr<Fixture> make_fixture(const Layout& l) {
  auto f = std::make_unique<Fixture>();
  f->layout = &l;
  std::vector<std::vector<int64_t>> offsets;
  for (const auto& g : l.groups) {
    offsets.emplace_back();
    for (const auto& t : g.tensors) {
      offsets.back().push_back(f->padded);
      f->padded += (t.numel + kAlign - 1) / kAlign * kAlign;
    }
  }
  f->p = allocate_floats(f->padded);
  f->g = allocate_floats(f->padded);
  f->m = allocate_floats(f->padded);
  f->v = allocate_floats(f->padded);
  fill_array(f->p.get(), f->padded, 0);
  fill_array(f->g.get(), f->padded, 1);
  // AdamW's initial state. The ceilings add the gradient to it and the step decays it again, so
  // it stays bounded and positive; the params drift by about the gradient per pass. Everything
  // stays finite and free of denormals over any run length.
  std::memset(f->m.get(), 0, static_cast<size_t>(f->padded) * sizeof(float));
  std::memset(f->v.get(), 0, static_cast<size_t>(f->padded) * sizeof(float));

  f->step = Optimizer::create(engine(), l.config);
  f->ceiling = Optimizer::create(engine(), {{"type", ceiling_optimizer_type()}});
  for (size_t gi = 0; gi < l.groups.size(); ++gi) {
    std::vector<ParamRef> refs;
    for (size_t ti = 0; ti < l.groups[gi].tensors.size(); ++ti) {
      const auto& t = l.groups[gi].tensors[ti];
      const int64_t at = offsets[gi][ti];
      refs.push_back(
          {{f->p.get() + at, t.numel, t.shape}, {f->g.get() + at, t.numel, t.shape}, t.name});
    }
    f->step->add_param_group(refs, l.groups[gi].overrides);
    f->ceiling->add_param_group(refs);
  }
  bind_state(*f->step, l, offsets, f->m.get(), f->v.get());
  bind_state(*f->ceiling, l, offsets, f->m.get(), f->v.get());
  const int64_t bytes = kAdamBytes * l.elements();
  if (f->step->bytes_per_step() != bytes || f->ceiling->bytes_per_step() != bytes)
    throw Error("bytes_per_step " + std::to_string(f->step->bytes_per_step()) + " (step), " +
                std::to_string(f->ceiling->bytes_per_step()) + " (ceiling) != 28 x elements");

  f->flat = engine().kernel(tools::stream_4r3w_graph(), f->padded);
  f->flat_call = make_call(*f->flat,
                           {{"param", f->p.get()},
                            {"grad", f->g.get()},
                            {"exp_avg", f->m.get()},
                            {"exp_avg_sq", f->v.get()}},
                           {}, f->padded);
  for (int i = 0; i < kWarmup; ++i) {  // the first step compiles
    f->step->step();
    f->ceiling->step();
    f->flat->run(f->flat_call);
  }
  return f;
}

// One layout's arrays at a time (GPT-2 small: 4 x 0.5 GB), kept between the runs of its
// benchmark (Google Benchmark calls it again to size the run, and once per repetition).
Fixture& fixture_for(const Layout& l) {
  static std::unique_ptr<Fixture> current;
  if (current && current->layout == &l) return *current;
  current.reset();
  current = make_fixture(l);
  return *current;
}

// The kernels an optimizer's step calls: `<name> <first 16 hex digits of the key>`, or a count.
std::string kernels(const Optimizer& opt) {
  const auto uses = opt.kernel_uses();
  if (uses.size() == 1) return uses[0].name + " " + uses[0].key.substr(0, 16);
  return std::to_string(uses.size()) + " kernels";
}

std::string describe(const Layout& l, const Fixture& f) {
  std::string s = l.name + ": " + std::to_string(l.tensors()) +
                  (l.tensors() == 1 ? " tensor in " : " tensors in ") +
                  std::to_string(l.groups.size()) + (l.groups.size() == 1 ? " group" : " groups");
  s += "; step " + kernels(*f.step) + ", ceiling " + kernels(*f.ceiling);
  s += ", flat " + f.flat->name() + " " + f.flat->key().substr(0, 16);
  s += engine().tuned_schedules() > 0 ? ", tuned schedules" : ", default schedule";
  return s;
}

void BM_Model(benchmark::State& state, const Layout& l) {
  try {
    Fixture& f = fixture_for(l);
    const double bytes = static_cast<double>(f.step->bytes_per_step());
    const double flat_bytes = static_cast<double>(kAdamBytes * f.padded);
    const std::function<void()> passes[3] = {[&f] { f.step->step(); }, [&f] { f.ceiling->step(); },
                                             [&f] { f.flat->run(f.flat_call); }};
    std::vector<double> times[3], share, flat_share;
    size_t first = 0;
    for (auto _ : state) {
      double t[3];
      for (size_t j = 0; j < 3; ++j) {
        const size_t which = (first + j) % 3;
        const auto t0 = Clock::now();
        passes[which]();
        t[which] = seconds_since(t0);
      }
      first = (first + 1) % 3;
      state.SetIterationTime(t[0]);
      for (size_t k = 0; k < 3; ++k) times[k].push_back(t[k]);
      share.push_back(t[1] / t[0]);  // the same bytes
      flat_share.push_back((bytes / t[0]) / (flat_bytes / t[2]));
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * f.step->bytes_per_step());
    state.counters["step_ms"] = median(times[0]) * 1e3;
    state.counters["GBps"] = bytes / median(times[0]) / 1e9;
    state.counters["ceiling_GBps"] = bytes / median(times[1]) / 1e9;
    state.counters["flat_ceiling_GBps"] = flat_bytes / median(times[2]) / 1e9;
    state.counters["share"] = median(share);
    state.counters["flat_share"] = median(flat_share);
    state.counters["tensors"] = static_cast<double>(l.tensors());
    state.counters["groups"] = static_cast<double>(l.groups.size());
    state.counters["elements"] = static_cast<double>(l.elements());
    state.SetLabel(describe(l, f));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void register_all() {
  for (const Layout& l : layouts())
    benchmark::RegisterBenchmark(("Model/" + l.optimizer + "/f32/" + l.name).c_str(),
                                 [&l](benchmark::State& s) { BM_Model(s, l); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
}

}  // namespace
}  // namespace optfuse::bench

int main(int argc, char** argv) {
  try {
    optfuse::bench::register_all();
  } catch (const std::exception& e) {  // a spec missing or invalid ($OPTFUSE_BENCH_SPECS)
    std::fprintf(stderr, "bench_models: %s\n", e.what());
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
