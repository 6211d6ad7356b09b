// What a compile-only engine answers (EngineOptions::compile_only): objects made for the store
// without loading them (`optfuse warmup`, other targets), the keys kernel() would use, Halide's
// lowered statement. Nothing here needs the engine's JIT session.
#include "engine/engine_impl.h"

namespace optfuse {

using engine_detail::one_kernel;

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

}  // namespace optfuse
