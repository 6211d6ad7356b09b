// `optfuse demo`: optimizer steps (AdamW, f32 by default; --optimizer, --dtype, --state-dtype) on a
// transformer-shaped model, reporting what a user wants to know:
// compile time and kernels, step time, effective bandwidth and its share of this machine's limit
// (a 4-read-3-write kernel measured in the same run), and for f32 AdamW the speed-up over torch's
// unfused algorithm (tools/unfused.h) timed between the same steps.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "optfuse/cache.h"
#include "optfuse/optfuse.hpp"
#include "tools/bandwidth.h"
#include "tools/commands.h"
#include "tools/schedules_option.h"
#include "tools/unfused.h"
#include "tools/validators.h"

namespace optfuse::tools {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct DemoOptions {
  int layers = 12;
  int d_model = 768;
  int vocab = 16384;
  int steps = 10;
  int threads = 0;
  std::string target = "host";
  std::string cache_dir;  // "" = default_cache_dir()
  bool no_cache = false;
  bool json = false;
  std::string schedules;            // --schedules (tools/schedules_option.h)
  std::string optimizer = "adamw";  // any optimizer_types() name
  std::string dtype = "f32";        // params and grads: f32, bf16 or f16
  std::string state_dtype = "f32";  // optimizer state: f32 or bf16
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool decay;  // matrices get weight decay; biases and norms do not
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

// GPT-2-like layout: embeddings, then per layer LN, attention (qkv, out), LN, MLP (fc, proj).
std::vector<TensorSpec> transformer_layout(const DemoOptions& o) {
  const int64_t d = o.d_model;
  std::vector<TensorSpec> t = {{"wte", {o.vocab, d}, true}, {"wpe", {1024, d}, true}};
  for (int l = 0; l < o.layers; ++l) {
    std::string p = "h." + std::to_string(l) + ".";
    t.push_back({p + "ln_1.weight", {d}, false});
    t.push_back({p + "ln_1.bias", {d}, false});
    t.push_back({p + "attn.c_attn.weight", {d, 3 * d}, true});
    t.push_back({p + "attn.c_attn.bias", {3 * d}, false});
    t.push_back({p + "attn.c_proj.weight", {d, d}, true});
    t.push_back({p + "attn.c_proj.bias", {d}, false});
    t.push_back({p + "ln_2.weight", {d}, false});
    t.push_back({p + "ln_2.bias", {d}, false});
    t.push_back({p + "mlp.c_fc.weight", {d, 4 * d}, true});
    t.push_back({p + "mlp.c_fc.bias", {4 * d}, false});
    t.push_back({p + "mlp.c_proj.weight", {4 * d, d}, true});
    t.push_back({p + "mlp.c_proj.bias", {d}, false});
  }
  t.push_back({"ln_f.weight", {d}, false});
  t.push_back({"ln_f.bias", {d}, false});
  return t;
}

// Cheap deterministic fill (an LCG), so set-up stays a small part of the run.
void fill(std::vector<float>& v, uint32_t seed, float scale) {
  uint32_t x = seed * 2654435761u + 1;
  for (auto& e : v) {
    x = x * 1664525u + 1013904223u;
    e = scale * (static_cast<float>(x >> 8) * (1.0f / 8388608.0f) - 1.0f);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void log(const DemoOptions& o, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void log(const DemoOptions& o, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::vfprintf(o.json ? stderr : stdout, fmt, args);
  va_end(args);
  std::fflush(o.json ? stderr : stdout);
}

// This machine's limit, measured like the optimizer runs: the 4-read-3-write kernel called once
// per tensor with the model's sizes, reading the model's gradients and updating arrays of its own
// (so the model is untouched). Timed passes alternate with optimizer steps (see run_demo), so both
// see the same machine state and their ratio is stable on a noisy machine.
class LimitProbe {
 public:
  LimitProbe(Engine& engine, const std::vector<std::vector<float>>& grads)
      : kernel_(engine.kernel(stream_4r3w_graph())) {
    const KernelSignature& sig = kernel_->signature();
    for (const auto& g : grads) {
      KernelCall call;
      call.n = static_cast<int64_t>(g.size());
      for (const auto& in : sig.inputs) {
        if (in.role == Role::Grad) {
          call.inputs.push_back(const_cast<float*>(g.data()));  // read only
        } else {
          own_.emplace_back(g.size(), 0.5f);
          call.inputs.push_back(own_.back().data());
        }
      }
      for (const auto& out : sig.outputs)
        call.outputs.push_back(call.inputs[static_cast<size_t>(sig.input_index(out.replaces))]);
      calls_.push_back(std::move(call));
    }
    pass();  // first touch of its pages
  }

  double timed_pass() const {
    auto t0 = Clock::now();
    pass();
    return seconds_since(t0);
  }

 private:
  void pass() const {
    for (const auto& call : calls_) kernel_->run(call);
  }

  std::shared_ptr<const Kernel> kernel_;
  std::vector<std::vector<float>> own_;
  std::vector<KernelCall> calls_;
};

// The optimizer config: the chosen type with the demo's lr, and GPT-style betas where it has any.
Options demo_config(const DemoOptions& o) {
  Options defaults = optimizer_defaults(o.optimizer);
  Options config = {{"type", o.optimizer}, {"lr", 3e-4}, {"state_dtype", o.state_dtype}};
  if (defaults.contains("betas")) config["betas"] = {0.9, 0.95};
  return config;
}

// `v` rounded to nearest even in 16-bit dtype `t`, as raw words (the demo's values are finite).
std::vector<uint16_t> to_16bit(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::BF16) {
      uint32_t b;
      std::memcpy(&b, &v[i], 4);
      out[i] = static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    } else {
      _Float16 h = static_cast<_Float16>(v[i]);  // GCC on x86-64: IEEE binary16, RNE
      std::memcpy(&out[i], &h, 2);
    }
  }
  return out;
}

int run_demo(const DemoOptions& o) {
  auto t_start = Clock::now();
  std::vector<TensorSpec> layout = transformer_layout(o);
  int64_t total = 0;
  for (const auto& t : layout) total += t.numel();

  // Start-up: engine creation until every kernel of the first step is ready to call (with a warm
  // cache: no Halide compilation, objects read from disk and loaded into ORC).
  if (o.optimizer == "sparseadam")
    throw UsageError(
        "--optimizer sparseadam: the demo's gradients are dense (sparseadam takes "
        "row-sparse gradients, see Optimizer::set_sparse_grad)");
  DType dtype = DType::F32;
  if (!parse_dtype(o.dtype, &dtype))
    throw UsageError("--dtype: unknown dtype '" + o.dtype + "' (f32, bf16 or f16)");
  const Options config = demo_config(o);
  const bool has_wd = optimizer_defaults(o.optimizer).contains("weight_decay");
  const Options overrides[2] = {has_wd ? Options{{"weight_decay", 0.1}} : Options::object(),
                                has_wd ? Options{{"weight_decay", 0.0}} : Options::object()};
  auto t_engine = Clock::now();
  EngineOptions eo;
  eo.target = o.target;
  eo.num_threads = o.threads;
  eo.cache_dir = o.cache_dir;  // "" = default_cache_dir()
  eo.memory_only = o.no_cache;
  eo.schedule_db = o.schedules;
  Engine engine(eo);
  // The kernels the first step will use: per group, one per distinct tensor size when tuned
  // schedules are loaded (the optimizer picks them per size), else one.
  for (int group = 0; group < 2; ++group) {  // 0: with weight decay, 1: without
    Graph graph = update_graph(config, overrides[group], dtype, dtype);
    std::set<int64_t> sizes;
    for (const auto& t : layout)
      if (t.decay == (group == 0)) sizes.insert(engine.tuned_schedules() ? t.numel() : 0);
    for (int64_t n : sizes) n ? engine.kernel(graph, n) : engine.kernel(graph);
  }
  double startup = seconds_since(t_engine);
  EngineCounters at_start = engine.counters();
  const bool classic = o.optimizer == "adamw" && dtype == DType::F32 && o.state_dtype == "f32";
  if (classic)
    log(o,
        "optfuse demo: AdamW on a transformer-shaped model, %.1f M fp32 parameters in %zu "
        "tensors\n",
        total / 1e6, layout.size());
  else
    log(o,
        "optfuse demo: %s on a transformer-shaped model, %.1f M %s parameters (grads %s, "
        "state %s) in %zu tensors\n",
        o.optimizer.c_str(), total / 1e6, o.dtype.c_str(), o.dtype.c_str(), o.state_dtype.c_str(),
        layout.size());
  log(o, "target %s, %d threads, cache %s\n", engine.target_string().c_str(), engine.num_threads(),
      o.no_cache ? "off (memory only)" : engine.options().cache_dir.c_str());
  log(o, "schedules: %s\n",
      engine.tuned_schedules() ? (std::to_string(engine.tuned_schedules()) + " tuned from " +
                                  engine.options().schedule_db)
                                     .c_str()
                               : "defaults (no tuned schedules for this target)");
  log(o,
      "start-up (engine creation to kernels ready) %.1f ms: %lld kernels compiled, %lld runtime "
      "compiles, %lld objects from the disk cache\n",
      startup * 1e3, static_cast<long long>(at_start.compiles),
      static_cast<long long>(at_start.runtime_compiles),
      static_cast<long long>(at_start.disk_hits));

  log(o, "allocating and filling params and grads ...\n");
  std::vector<std::vector<float>> params, grads;
  for (size_t i = 0; i < layout.size(); ++i) {
    params.emplace_back(static_cast<size_t>(layout[i].numel()));
    grads.emplace_back(static_cast<size_t>(layout[i].numel()));
    fill(params.back(), static_cast<uint32_t>(2 * i + 1), 0.02f);
    fill(grads.back(), static_cast<uint32_t>(2 * i + 2), 0.001f);
  }
  // 16-bit runs keep the f32 grads for the limit probe only and free the f32 params.
  std::vector<std::vector<uint16_t>> params16, grads16;
  if (dtype != DType::F32)
    for (size_t i = 0; i < layout.size(); ++i) {
      params16.push_back(to_16bit(params[i], dtype));
      grads16.push_back(to_16bit(grads[i], dtype));
      std::vector<float>().swap(params[i]);
    }
  std::vector<ParamRef> decay, no_decay;
  for (size_t i = 0; i < layout.size(); ++i) {
    void* p = dtype == DType::F32 ? static_cast<void*>(params[i].data()) : params16[i].data();
    void* g = dtype == DType::F32 ? static_cast<void*>(grads[i].data()) : grads16[i].data();
    ParamRef r{{p, layout[i].numel(), layout[i].shape, dtype},
               {g, layout[i].numel(), layout[i].shape, dtype},
               layout[i].name};
    (layout[i].decay ? decay : no_decay).push_back(r);
  }
  auto opt = Optimizer::create(engine, config);
  opt->add_param_group(decay, overrides[0]);
  opt->add_param_group(no_decay, overrides[1]);

  // First step: compiles (or finds) the kernel, creates the state.
  auto t0 = Clock::now();
  opt->step();
  double first_step = seconds_since(t0);
  EngineCounters after_first = engine.counters();
  const double first_compile = after_first.compile_seconds - at_start.compile_seconds;
  log(o, "first step %.1f ms (%.1f ms of it compiling; it also creates the state)\n",
      first_step * 1e3, first_compile * 1e3);
  for (const auto& u : opt->kernel_uses())
    log(o, "  kernel %-10s %.12s...  serves %lld groups, %lld tensors, %.1f M elements\n",
        u.name.c_str(), u.key.c_str(), static_cast<long long>(u.groups),
        static_cast<long long>(u.tensors), u.elements / 1e6);

  log(o, "preparing this machine's limit (4-read-3-write kernel over the same tensor sizes) ...\n");
  LimitProbe probe(engine, grads);

  // What a PyTorch user runs today without fused=True: AdamW as one pass per op (AdamW f32 only).
  std::unique_ptr<UnfusedAdamW> eager;
  if (classic) {
    log(o, "preparing the unfused baseline (torch's AdamW algorithm, one pass per op) ...\n");
    std::vector<bool> decays;
    for (const auto& t : layout) decays.push_back(t.decay);
    eager = std::make_unique<UnfusedAdamW>(
        engine, params, grads, decays, config["lr"].get<double>(), config["betas"][0].get<double>(),
        config["betas"][1].get<double>(),
        overrides[0]["weight_decay"].get<double>());  // the demo's AdamW hyperparameters
  }

  std::vector<double> times, limit_times, shares, eager_times;
  int beat_limit = 0;
  for (int s = 0; s < o.steps; ++s) {
    // A learning-rate schedule: values change, the kernel does not.
    double lr = 3e-4 * (1.0 - 0.5 * s / std::max(1, o.steps));
    opt->set(0, "lr", lr);
    opt->set(1, "lr", lr);
    auto ts = Clock::now();
    opt->step();
    times.push_back(seconds_since(ts));
    limit_times.push_back(probe.timed_pass());
    // A step faster than the limit pass (noise, or a pass that ran while the machine was busy)
    // counts as at the limit: a share never reads as more than the machine can do.
    const double pass = limit_times.back();
    beat_limit += times.back() < pass;
    limit_times.back() = std::min(pass, times.back());
    shares.push_back(limit_times.back() / times.back());
    if (eager) eager_times.push_back(eager->timed_step());
    log(o, "step %d/%d: %.1f ms (limit pass %.1f ms", s + 1, o.steps, times.back() * 1e3,
        pass * 1e3);
    if (eager) log(o, ", unfused %.1f ms", eager_times.back() * 1e3);
    log(o, ")\n");
  }
  double step_s = median(times);
  double bytes = static_cast<double>(opt->bytes_per_step());
  double gbps = bytes / step_s / 1e9;
  double ceil_gbps = bytes / median(limit_times) / 1e9;
  double share = median(shares);  // of step / limit-pass pairs: robust to drift between pairs

  nlohmann::json report = {
      {"optimizer", o.optimizer},
      {"dtype", o.dtype},
      {"state_dtype", o.state_dtype},
      {"parameters", total},
      {"tensors", layout.size()},
      {"groups", opt->num_groups()},
      {"target", engine.target_string()},
      {"threads", engine.num_threads()},
      {"steps", o.steps},
      {"first_step_ms", first_step * 1e3},
      {"first_step_compile_ms", first_compile * 1e3},
      {"first_step_state_ms", std::max(0.0, first_step - first_compile - step_s) * 1e3},
      {"step_ms_median", step_s * 1e3},
      {"step_ms_min", *std::min_element(times.begin(), times.end()) * 1e3},
      {"bytes_per_step", bytes},
      {"bytes_per_element", bytes / static_cast<double>(total)},
      {"gbps", gbps},
      {"ceiling_gbps", ceil_gbps},
      {"share_of_ceiling", share},
      {"steps_faster_than_ceiling_pass", beat_limit},
      {"startup_ms", startup * 1e3},
      {"cache_dir", engine.options().cache_dir},
      {"tuned_schedules", engine.tuned_schedules()},
      // The optimizer's kernels (the bandwidth probe's are not counted).
      {"kernels_compiled", after_first.compiles},
      {"runtime_compiles", after_first.runtime_compiles},
      {"disk_hits", after_first.disk_hits},
      {"compile_seconds", after_first.compile_seconds},
      {"kernel_lookups", after_first.lookups},
      {"kernel_hits", after_first.hits},
      {"wall_seconds", seconds_since(t_start)},
  };
  if (eager) {
    report["unfused_step_ms_median"] = median(eager_times) * 1e3;
    report["unfused_bytes_per_element"] =
        static_cast<double>(eager->bytes_per_step()) / static_cast<double>(total);
    report["speedup_over_unfused"] = median(eager_times) / step_s;
  }
  report["kernels"] = nlohmann::json::array();
  for (const auto& u : opt->kernel_uses())
    report["kernels"].push_back({{"name", u.name},
                                 {"key", u.key},
                                 {"groups", u.groups},
                                 {"tensors", u.tensors},
                                 {"elements", u.elements}});
  if (o.json) {
    std::cout << report.dump(2) << "\n";
    return 0;
  }
  std::printf("\n== summary ==\n");
  std::printf("step time        %.1f ms (median of %d; min %.1f ms)\n", step_s * 1e3, o.steps,
              report["step_ms_min"].get<double>());
  if (classic)
    std::printf("traffic          %.2f GB per step (%.0f B/element: 4 reads + 3 writes of fp32)\n",
                bytes / 1e9, bytes / static_cast<double>(total));
  else
    std::printf("traffic          %.2f GB per step (%.0f B/element, each tensor in its dtype)\n",
                bytes / 1e9, bytes / static_cast<double>(total));
  std::printf("bandwidth        %.1f GB/s\n", gbps);
  std::printf(
      "machine limit    %.1f GB/s: this machine's memory bandwidth for this traffic, a "
      "4-read-3-write pass over the same tensors run between the steps\n",
      ceil_gbps);
  std::printf("share of limit   %.2f (median of %d step / limit-pass pairs", share, o.steps);
  if (beat_limit) std::printf("; in %d the step beat the pass and counts as 1.00", beat_limit);
  std::printf(")\n");
  if (eager)
    std::printf(
        "vs unfused       %.2fx faster than torch's AdamW algorithm without fused=True, one pass "
        "per op: %.1f ms a step (median, timed between the same steps)\n"
        "                 %s, %.0f B/element; the same engine and threads, no dispatch cost; "
        "torch.optim.AdamW(fused=True) is one pass too: bench/python/bench_torch.py times it\n",
        median(eager_times) / step_s, median(eager_times) * 1e3, eager->label().c_str(),
        static_cast<double>(eager->bytes_per_step()) / static_cast<double>(total));
  std::printf(
      "kernels          %lld compiled in %.2f s; %lld lookups, %lld hits (in-process "
      "table), %lld objects from the disk cache\n",
      static_cast<long long>(after_first.compiles), after_first.compile_seconds,
      static_cast<long long>(after_first.lookups), static_cast<long long>(after_first.hits),
      static_cast<long long>(after_first.disk_hits));
  for (const auto& u : opt->kernel_uses())
    std::printf("                 %s serves %lld groups, %lld tensors (%.1f M elements)\n",
                u.name.c_str(), static_cast<long long>(u.groups), static_cast<long long>(u.tensors),
                u.elements / 1e6);
  std::printf("start-up         %.1f ms (engine creation to kernels ready)\n", startup * 1e3);
  // The first step's extra time over a steady one is the state's creation: allocating it and the
  // first write to every page (page faults), beside any kernel compiled in it.
  const double touch = std::max(0.0, first_step - first_compile - step_s);
  std::printf(
      "first step       %.1f ms = compile %.1f ms + state creation and first touch %.1f ms "
      "+ one step %.1f ms (the median)\n",
      first_step * 1e3, first_compile * 1e3, touch * 1e3, step_s * 1e3);
  return 0;
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand("demo",
                                     "Run optimizer steps (AdamW by default) on a built-in "
                                     "~100M-parameter transformer layout and report speed");
  cmd->add_option("--steps", o->steps, "timed steps after the first")
      ->check(whole_number_in(1, 100000))
      ->capture_default_str();
  cmd->add_option("--layers", o->layers, "transformer layers")
      ->check(whole_number_in(0, 1000))
      ->capture_default_str();
  cmd->add_option("--d-model", o->d_model, "model width")
      ->check(whole_number_in(1, 65536))
      ->capture_default_str();
  cmd->add_option("--vocab", o->vocab, "vocabulary size")
      ->check(whole_number_in(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "worker threads (0 = all cores)")
      ->check(whole_number_in(0, 1024))
      ->capture_default_str();
  cmd->add_option("--target", o->target, "Halide target string")
      ->check(target_list())
      ->capture_default_str();
  cmd->add_option("--cache-dir", o->cache_dir,
                  "kernel cache directory (default: $OPTFUSE_CACHE_DIR, $XDG_CACHE_HOME/optfuse, "
                  "~/.cache/optfuse)");
  cmd->add_flag("--no-cache", o->no_cache, "keep compiled kernels in memory only");
  cmd->add_option("--optimizer", o->optimizer, "optimizer type (torch.optim names, or lion)")
      ->check(CLI::IsMember(optimizer_types()))
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype,
                  "param and grad dtype (16-bit params get f32 master "
                  "weights inside the optimizer)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  cmd->add_option("--state-dtype", o->state_dtype, "optimizer state dtype")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_flag("--json", o->json,
                "print a machine-readable JSON report (progress goes to stderr)");
  add_schedules_option(cmd, &o->schedules);
  cmd->callback([o] {
    int rc = run_demo(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace optfuse::tools
