// Engine: canonicalize -> key -> in-memory table, else partition; each kernel cluster from the
// object store, else compiled; then loaded into this engine's JIT session. A graph of one cluster
// is its kernel; one of several is a CompositeKernel over theirs (engine/composite.h).
#include "optfuse/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "engine/composite.h"
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

using engine_detail::CompositeKernel;
using engine_detail::CompositeStep;
using engine_detail::KernelImpl;
using engine_detail::runtime_object;

class Stopwatch {
 public:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// A kernel cluster lowering can compile. The partitioner cuts a whole-tensor reduction from the
// per-row reductions of its consumers, not from those of its own operand; such a cluster would
// reach lowering and be refused there under the cluster's name.
void check_cluster(const Cluster& c, const std::string& graph) {
  const Node* whole = nullptr;
  const Node* row = nullptr;
  for (const Node& n : c.graph.nodes()) {
    if (op_has(n.op, kReduce) && !whole) whole = &n;
    if (op_has(n.op, kRowReduce) && !row) row = &n;
  }
  if (whole && row && !uses_cols(c.graph))  // (staged kernels compute both: lower/staged.h)
    throw Error("graph \"" + graph + "\": a whole-tensor reduction (" +
                std::string(op_name(whole->op)) + ") of a value that needs a per-row reduction (" +
                std::string(op_name(row->op)) +
                "): one kernel cannot compute both, and the partitioner does not cut between them "
                "yet (`optfuse explain` shows the cluster)");
}

// Whether `p` is compiled as one kernel of the whole graph: one kernel cluster, or none (a graph
// without outputs or results, which lowering refuses with its own message).
bool one_kernel(const Partition& p) {
  return p.clusters.empty() ||
         (p.clusters.size() == 1 && p.clusters[0].kind == Cluster::Kind::Kernel);
}

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

struct Engine::Impl {
  EngineOptions options;
  std::string target;  // resolved Halide target string
  int num_threads;

  mutable std::mutex mutex;  // guards everything below but `opaque`; held while compiling
  std::unordered_map<std::string, std::shared_ptr<const Kernel>> table;
  EngineCounters counters;
  std::shared_ptr<ObjectStore> store;
  std::shared_ptr<jit::Session> session;  // created by the first kernel()

  std::unordered_map<std::string, bool> precompiled;  // keys stored by precompile()
  ScheduleDb db;  // tuned schedules for this target (empty when none apply)
  struct Opaque {
    OpaqueFn fn;
    OpaqueScope scope;
  };
  // register_opaque(): callee -> implementation. A mutex of its own, so that signature() answers
  // while another thread compiles; entries are never removed, so pointers to them stay valid.
  mutable std::mutex opaque_mutex;
  std::map<std::string, Opaque> opaque;

  // The implementation serving `callee`: its own, else that of the name before its ':'.
  const Opaque* opaque_for(const std::string& callee) const {
    std::lock_guard<std::mutex> lock(opaque_mutex);
    auto it = opaque.find(callee);
    if (it == opaque.end()) it = opaque.find(callee.substr(0, callee.find(':')));
    return it == opaque.end() ? nullptr : &it->second;
  }

  // The signature of a graph the partitioner cut into `p`, and each opaque cluster's step (its
  // callee and implementation; `steps` may be null). Error naming the graph if an opaque op has
  // no implementation: it fails before anything compiles.
  KernelSignature cut_signature(const Graph& canonical, const Partition& p, const std::string& name,
                                std::vector<CompositeStep>* steps) const {
    KernelSignature sig = lower::signature(canonical);
    for (size_t i = 0; i < p.clusters.size(); ++i) {
      if (p.clusters[i].kind != Cluster::Kind::Opaque) continue;
      const std::string& callee = p.canonical.node(p.clusters[i].nodes.at(0)).name;
      const Opaque* impl = opaque_for(callee);
      if (!impl)
        throw Error("graph \"" + name + "\": opaque op \"" + callee +
                    "\" has no implementation in this engine: register one with "
                    "Engine::register_opaque(\"" +
                    callee + "\", fn) before Engine::kernel() (the graph runs as " +
                    std::to_string(p.clusters.size()) +
                    " clusters, the opaque op between kernels)");
      if (steps) {
        (*steps)[i].callee = callee;
        (*steps)[i].opaque = impl->fn;
      }
      if (impl->scope == OpaqueScope::Matrix) sig.whole = sig.per_row = true;  // calls give cols
    }
    return sig;
  }

  // The schedule for calls of about `n` elements of `canonical` (resolved), tuned if the
  // database has an entry for it.
  Schedule schedule_for(const Graph& canonical, int64_t n, bool* tuned) const {
    const TunedSchedule* e =
        db.entries().empty() ? nullptr : db.find(structural_hash(canonical).hex(), n);
    if (tuned) *tuned = e != nullptr;
    return jit::resolve_schedule(e ? e->schedule : options.schedule, target);
  }

  // `size_hint` >= 0: each cluster of a cut graph gets its own schedule for that size (the
  // database keys schedules by the cluster's graph); else every cluster gets `resolved`.
  std::shared_ptr<const Kernel> kernel(const Graph& canonical, const std::string& name,
                                       const Schedule& resolved, int64_t size_hint);
  bool precompile(const Graph& canonical, const std::string& name, const Schedule& resolved,
                  int64_t size_hint);

  // The clusters' own canonical graphs and schedules (kernel clusters; opaque ones stay empty).
  struct Part {
    Graph canonical;
    Schedule resolved;
  };
  std::vector<Part> parts(const Partition& p, const std::string& name, const Schedule& resolved,
                          int64_t size_hint) const {
    std::vector<Part> out;
    for (const Cluster& c : p.clusters)
      if (c.kind == Cluster::Kind::Kernel) check_cluster(c, name);
    for (const Cluster& c : p.clusters) {
      if (c.kind != Cluster::Kind::Kernel) {
        out.emplace_back();
        continue;
      }
      Graph cg = canonicalize(c.graph);
      Schedule s = size_hint >= 0 ? schedule_for(cg, size_hint, nullptr) : resolved;
      out.push_back({std::move(cg), s});
    }
    return out;
  }

  // One kernel cluster (the whole graph, or one cluster of it): the table, else the store, else
  // compiled. Called with `mutex` held.
  std::shared_ptr<const Kernel> compiled_locked(const Graph& canonical, const std::string& name,
                                                const Schedule& resolved, const std::string& key);
  bool precompiled_locked(const Graph& canonical, const std::string& name, const Schedule& resolved,
                          const std::string& key);

  // `key`'s object from the store, else compiled by `compile` and stored. While compiling, the
  // store's lock for `key` is held and the store is asked again once it is taken, so processes
  // sharing a store compile each object once. `*found` says whether the store had it. `loading`:
  // the object is for this process's JIT, so a stored one the JIT would refuse (another machine's;
  // a store need not check what it returns) is a miss, and the compiled one replaces it.
  template <typename Compile>
  std::vector<char> object(const std::string& key, const ObjectInfo& info, Compile&& compile,
                           bool* found, bool loading) {
    std::vector<char> obj;
    *found = true;
    auto usable = [&] { return !loading || jit::Jit::object_problem(obj).empty(); };
    if (store && store->get(key, info, &obj) && usable()) {
      ++counters.disk_hits;
      return obj;
    }
    std::shared_ptr<void> held = store ? store->lock(key) : nullptr;
    if (held && store->get(key, info, &obj) && usable()) {
      ++counters.disk_hits;
      return obj;
    }
    *found = false;
    return compiled_and_stored(key, info, compile);
  }

  template <typename Compile>
  std::vector<char> compiled_and_stored(const std::string& key, const ObjectInfo& info,
                                        Compile&& compile) {
    Stopwatch watch;
    std::vector<char> obj = compile();
    counters.compile_seconds += watch.seconds();
    if (store) store->put(key, info, obj);
    return obj;
  }

  // `key`'s object (object(), loading) given to `load`, whose result is returned. A stored object
  // that passed every check yet does not link (a forgery with consistent checksums, a symbol
  // nowhere) is no hit: the store discards it, and it is compiled, stored and loaded instead.
  template <typename Compile, typename Load>
  auto loaded(const std::string& key, const ObjectInfo& info, Compile&& compile, Load&& load) {
    bool found = false;
    std::vector<char> obj = object(key, info, compile, &found, /*loading=*/true);
    if (!found) return load(obj);
    try {
      return load(obj);
    } catch (const jit::LinkError& e) {
      store->discard(key, std::string("it does not link: ") + e.what());
      --counters.disk_hits;
    }
    return load(compiled_and_stored(key, info, compile));
  }

  ObjectInfo runtime_info() const {
    return {"runtime", "halide-runtime", target, "halide-runtime"};
  }

  // Compiles `target`'s runtime (once per process) for the store.
  std::vector<char> compile_runtime() {
    bool compiled = false;
    auto obj = runtime_object(target, &compiled);
    if (compiled) ++counters.runtime_compiles;
    return *obj;
  }

  std::vector<char> runtime_locked(bool* found, bool loading) {
    return object(
        engine_detail::runtime_key(target), runtime_info(), [&] { return compile_runtime(); },
        found, loading);
  }

  // Before the first kernel compiles: unless the store holds the runtime, its compile starts on
  // another thread, beside the kernel's (a cold start's two long compiles, at once).
  void runtime_soon_locked() {
    engine_detail::compile_runtime_soon(target, [&] {
      std::vector<char> obj;
      return store && store->get(engine_detail::runtime_key(target), runtime_info(), &obj) &&
             jit::Jit::object_problem(obj).empty();
    });
  }

  jit::Session& session_locked() {
    if (session) return *session;
    session = loaded(
        engine_detail::runtime_key(target), runtime_info(), [&] { return compile_runtime(); },
        [&](const std::vector<char>& runtime) {
          return jit::Session::create(runtime, num_threads, jit::target_uses_cuda(target));
        });
    return *session;
  }

  std::string key_of(const Graph& canonical, const Schedule& resolved) const {
    return engine_detail::kernel_key(structural_hash(canonical), resolved, target);
  }
};

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

bool Engine::precompile(const Graph& g) {
  Graph canonical = canonicalize(g);
  return impl_->precompile(canonical, g.name(),
                           jit::resolve_schedule(impl_->options.schedule, impl_->target), -1);
}

bool Engine::precompile(const Graph& g, int64_t size_hint) {
  Graph canonical = canonicalize(g);
  return impl_->precompile(canonical, g.name(), impl_->schedule_for(canonical, size_hint, nullptr),
                           size_hint);
}

// A cut graph's kernels are its clusters' (opaque ops need no implementation to compile).
bool Engine::Impl::precompile(const Graph& canonical, const std::string& name,
                              const Schedule& resolved, int64_t size_hint) {
  std::string key = key_of(canonical, resolved);
  std::lock_guard<std::mutex> lock(mutex);
  ++counters.lookups;
  if (table.count(key) || precompiled.count(key)) {
    ++counters.hits;
    return true;
  }
  Partition p = partition(canonical);
  if (one_kernel(p)) return precompiled_locked(canonical, name, resolved, key);
  bool found = true;
  std::vector<Part> cluster = parts(p, name, resolved, size_hint);
  for (size_t i = 0; i < p.clusters.size(); ++i) {
    if (p.clusters[i].kind != Cluster::Kind::Kernel) continue;
    const Part& c = cluster[i];
    found = precompiled_locked(c.canonical, p.clusters[i].graph.name(), c.resolved,
                               key_of(c.canonical, c.resolved)) &&
            found;
  }
  precompiled.emplace(key, true);
  return found;
}

bool Engine::Impl::precompiled_locked(const Graph& canonical, const std::string& name,
                                      const Schedule& resolved, const std::string& key) {
  if (table.count(key) || precompiled.count(key)) return true;
  ObjectInfo info{"kernel", name, target, signature_text(lower::signature(canonical))};
  bool found = false;
  object(
      key, info,
      [&] {
        std::vector<char> compiled =
            jit::compile_kernel_object(canonical, resolved, target, "optfuse_" + key);
        ++counters.compiles;
        return compiled;
      },
      &found, /*loading=*/false);
  precompiled.emplace(key, true);
  return found;
}

bool Engine::precompile_runtime() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  bool found = false;
  impl_->runtime_locked(&found, /*loading=*/false);
  return found;
}

std::string Engine::kernel_key(const Graph& g) const {
  return kernel_key(g, impl_->options.schedule);
}

std::string Engine::kernel_key(const Graph& g, const Schedule& schedule) const {
  return impl_->key_of(canonicalize(g), jit::resolve_schedule(schedule, impl_->target));
}

std::string Engine::kernel_key(const Graph& g, int64_t size_hint) const {
  Graph canonical = canonicalize(g);
  return impl_->key_of(canonical, impl_->schedule_for(canonical, size_hint, nullptr));
}

std::vector<std::string> Engine::object_keys(const Graph& g, int64_t size_hint) const {
  Graph canonical = canonicalize(g);
  const Schedule resolved = size_hint >= 0
                                ? impl_->schedule_for(canonical, size_hint, nullptr)
                                : jit::resolve_schedule(impl_->options.schedule, impl_->target);
  Partition p = partition(canonical);
  if (one_kernel(p)) return {impl_->key_of(canonical, resolved)};
  const std::vector<Impl::Part> parts = impl_->parts(p, g.name(), resolved, size_hint);
  std::vector<std::string> keys;
  for (size_t i = 0; i < p.clusters.size(); ++i)
    if (p.clusters[i].kind == Cluster::Kind::Kernel)
      keys.push_back(impl_->key_of(parts[i].canonical, parts[i].resolved));
  return keys;
}

Schedule Engine::schedule_for(const Graph& g, int64_t size_hint, bool* tuned) const {
  return impl_->schedule_for(canonicalize(g), size_hint, tuned);
}

size_t Engine::tuned_schedules() const { return impl_->db.entries().size(); }

std::string Engine::lowered_stmt(const Graph& g) const {
  const Schedule resolved = jit::resolve_schedule(impl_->options.schedule, impl_->target);
  Partition p = partition(g);
  if (one_kernel(p)) return jit::lowered_stmt(canonicalize(g), resolved, impl_->target);
  std::string all;
  for (const Cluster& c : p.clusters)
    if (c.kind == Cluster::Kind::Kernel)
      all += "// kernel \"" + c.graph.name() + "\"\n" +
             jit::lowered_stmt(canonicalize(c.graph), resolved, impl_->target) + "\n";
  return all;
}

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
