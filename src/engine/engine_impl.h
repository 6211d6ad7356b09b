#pragma once
// Engine's insides, for the files of src/engine that implement it: engine.cpp (kernels: compile or
// load, then run) and precompile.cpp (what a compile-only engine answers: objects for the store,
// keys, lowered statements).
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/composite.h"
#include "engine/key.h"
#include "engine/runtime_object.h"
#include "jit/halide_bridge.h"
#include "jit/jit.h"
#include "jit/session.h"
#include "lower/signature.h"
#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/object_store.h"
#include "optfuse/partition.h"
#include "optfuse/schedules.h"

namespace optfuse {
namespace engine_detail {

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
inline void check_cluster(const Cluster& c, const std::string& graph) {
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
inline bool one_kernel(const Partition& p) {
  return p.clusters.empty() ||
         (p.clusters.size() == 1 && p.clusters[0].kind == Cluster::Kind::Kernel);
}

}  // namespace engine_detail

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
                                std::vector<engine_detail::CompositeStep>* steps) const {
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
      if (c.kind == Cluster::Kind::Kernel) engine_detail::check_cluster(c, name);
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
    engine_detail::Stopwatch watch;
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
    auto obj = engine_detail::runtime_object(target, &compiled);
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

}  // namespace optfuse
