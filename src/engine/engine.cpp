// Engine: canonicalize -> key -> in-memory table, else partition; each kernel cluster from the
// object store, else compiled; then loaded into this engine's JIT session. A graph of one cluster
// is its kernel; one of several is a CompositeKernel over theirs (engine/composite.h).
#include "optfuse/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "engine/engine_impl.h"
#include "engine/kernel_impl.h"
#include "engine/key.h"
#include "engine/object_linker.h"
#include "engine/runtime_object.h"
#include "jit/cuda_driver.h"
#include "jit/halide_bridge.h"
#include "jit/jit.h"
#include "jit/object_check.h"
#include "jit/session.h"
#include "lower/signature.h"
#include "optfuse/cache.h"
#include "optfuse/error.h"
#include "optfuse/partition.h"
#include "optfuse/schedules.h"

namespace optfuse {
namespace {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

using engine_detail::CompositeKernel;
using engine_detail::CompositeStep;
using engine_detail::KernelImpl;
using engine_detail::one_kernel;

CacheOptions engine_cache_options(const std::string& dir) {
  CacheOptions co;
  co.dir = dir;
  co.toolchain = jit::toolchain_version();
  co.check_object = jit::object_problem;
  co.linker = engine_detail::make_object_linker;
  return co;
}

Engine::Engine(EngineOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->target = jit::resolve_target(options.target);
  impl_->num_threads = resolve_threads(options.num_threads);
  // Here, not at the first kernel() or step: a CUDA engine without a device fails early, clearly.
  if (!options.compile_only && jit::target_uses_cuda(impl_->target)) {
    jit::require_cuda_device(impl_->target);
    if (!options.cuda_context)
      options.cuda_context = jit::cuda_primary_context(options.cuda_device);
  }
  impl_->options = std::move(options);
  std::string& schedules = impl_->options.schedule_db;
  schedules = resolve_schedule_db(schedules, impl_->target);
  if (!schedules.empty()) {
    ScheduleDb db = ScheduleDb::load(schedules);
    // A database for another architecture, OS or device has nothing for this engine, so it is
    // ignored rather than misapplied; one for a sibling CPU class (schedule_db_file) applies.
    if (schedule_target_distance(db.target(), impl_->target) >= 0) {
      impl_->db = std::move(db);
    } else {
      schedules.clear();
    }
  }
  if (impl_->options.object_store) {
    impl_->options.cache_dir.clear();
    impl_->store = impl_->options.object_store;
  } else if (impl_->options.memory_only) {
    impl_->options.cache_dir.clear();
  } else {
    if (impl_->options.cache_dir.empty()) impl_->options.cache_dir = default_cache_dir();
    CacheOptions co = engine_cache_options(impl_->options.cache_dir);
    co.max_bytes = impl_->options.cache_max_bytes;
    co.warn = impl_->options.warn;
    impl_->store = std::make_shared<DiskCache>(std::move(co));
  }
}

Engine::~Engine() = default;

std::shared_ptr<const Kernel> Engine::kernel(const Graph& g) {
  return kernel(g, impl_->options.schedule);
}

std::shared_ptr<const Kernel> Engine::kernel(const Graph& g, const Schedule& schedule) {
  Graph canonical = canonicalize(g);
  return impl_->kernel(canonical, g.name(), jit::resolve_schedule(schedule, impl_->target), -1);
}

std::shared_ptr<const Kernel> Engine::kernel(const Graph& g, int64_t size_hint) {
  Graph canonical = canonicalize(g);
  return impl_->kernel(canonical, g.name(), impl_->schedule_for(canonical, size_hint, nullptr),
                       size_hint);
}

KernelSignature Engine::signature(const Graph& g) const {
  Graph canonical = canonicalize(g);
  Partition p = partition(canonical);
  if (one_kernel(p)) return lower::signature(canonical);
  return impl_->cut_signature(canonical, p, g.name(), nullptr);
}

std::shared_ptr<const Kernel> Engine::Impl::kernel(const Graph& canonical, const std::string& name,
                                                   const Schedule& resolved, int64_t size_hint) {
  if (options.compile_only)
    throw Error("engine for target " + target +
                " is compile-only (EngineOptions::compile_only): it cannot load kernel \"" + name +
                "\"; use precompile()");
  std::string key = key_of(canonical, resolved);

  std::lock_guard<std::mutex> lock(mutex);
  ++counters.lookups;
  if (auto it = table.find(key); it != table.end()) {
    ++counters.hits;
    return it->second;
  }
  Partition p = partition(canonical);
  if (one_kernel(p)) return compiled_locked(canonical, name, resolved, key);
  std::vector<CompositeStep> steps(p.clusters.size());
  KernelSignature sig = cut_signature(canonical, p, name, &steps);
  std::vector<Part> cluster = parts(p, name, resolved, size_hint);
  for (size_t i = 0; i < p.clusters.size(); ++i) {
    if (p.clusters[i].kind != Cluster::Kind::Kernel) continue;
    const Part& c = cluster[i];
    steps[i].kernel = compiled_locked(c.canonical, p.clusters[i].graph.name(), c.resolved,
                                      key_of(c.canonical, c.resolved));
  }
  auto composite =
      std::make_shared<CompositeKernel>(p, std::move(sig), key, name, resolved, std::move(steps));
  table.emplace(key, composite);
  return composite;
}

std::shared_ptr<const Kernel> Engine::Impl::compiled_locked(const Graph& canonical,
                                                            const std::string& name,
                                                            const Schedule& resolved,
                                                            const std::string& key) {
  if (auto it = table.find(key); it != table.end()) return it->second;
  std::string fn_name = "optfuse_" + key;
  KernelSignature sig = lower::signature(canonical);
  ObjectInfo info{"kernel", name, target, signature_text(sig)};
  jit::ArgvFn fn = loaded(
      key, info,
      [&] {
        if (!session) runtime_soon_locked();
        std::vector<char> compiled =
            jit::compile_kernel_object(canonical, resolved, target, fn_name);
        ++counters.compiles;
        return compiled;
      },
      // After the kernel compiled: a graph or target that cannot be lowered fails before the
      // ~0.8 s runtime compile.
      [&](const std::vector<char>& obj) { return session_locked().load_kernel(obj, fn_name); });
  auto kernel =
      std::make_shared<KernelImpl>(std::move(sig), key, name, resolved, session, fn,
                                   session->cuda_device_interface(), options.cuda_context);
  table.emplace(key, kernel);
  return kernel;
}

Schedule Engine::schedule_for(const Graph& g, int64_t size_hint, bool* tuned) const {
  return impl_->schedule_for(canonicalize(g), size_hint, tuned);
}

size_t Engine::tuned_schedules() const { return impl_->db.entries().size(); }

EngineCounters Engine::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->counters;
}

const EngineOptions& Engine::options() const { return impl_->options; }
const std::string& Engine::target_string() const { return impl_->target; }
int Engine::num_threads() const { return impl_->num_threads; }

std::vector<std::shared_ptr<const Kernel>> Engine::kernels() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<std::shared_ptr<const Kernel>> all;
  for (const auto& entry : impl_->table) all.push_back(entry.second);
  std::sort(all.begin(), all.end(),
            [](const auto& a, const auto& b) { return a->key() < b->key(); });
  return all;
}

void Engine::set_object_store(std::shared_ptr<ObjectStore> store) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->store = std::move(store);
}

void Engine::register_opaque(const std::string& callee, OpaqueFn fn, OpaqueScope scope) {
  if (!register_default_opaque(callee, std::move(fn), scope))
    throw Error("register_opaque(\"" + callee + "\"): opaque op \"" + callee +
                "\" already has an implementation in this engine");
}

bool Engine::register_default_opaque(const std::string& callee, OpaqueFn fn, OpaqueScope scope) {
  if (!fn) throw Error("register_opaque(\"" + callee + "\"): the implementation is empty");
  std::lock_guard<std::mutex> lock(impl_->opaque_mutex);
  return impl_->opaque.emplace(callee, Impl::Opaque{std::move(fn), scope}).second;
}

}  // namespace optfuse
