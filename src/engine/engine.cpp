// Engine: canonicalize -> key -> in-memory table, else object store, else compile; then load the
// object into this engine's JIT session.
#include "optfuse/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "engine/kernel_impl.h"
#include "engine/key.h"
#include "jit/halide_bridge.h"
#include "jit/session.h"
#include "lower/signature.h"
#include "optfuse/error.h"

namespace optfuse {
namespace {

using engine_detail::KernelImpl;

class Stopwatch {
 public:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The Halide runtime object for `target`, produced (compiled, or read from a store) at most once
// per target per process (~0.8 s) and shared by every engine; each engine loads its own copy into
// its own JIT (~5 ms). The lock is held while producing, so concurrent engines wait, not repeat.
template <typename Produce>
std::shared_ptr<const std::vector<char>> runtime_object(const std::string& target,
                                                        Produce&& produce) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const std::vector<char>>> objects;
  std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<const std::vector<char>>& slot = objects[target];
  if (!slot) slot = std::make_shared<const std::vector<char>>(produce());
  return slot;
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

  mutable std::mutex mutex;  // guards everything below; held while compiling
  std::unordered_map<std::string, std::shared_ptr<const Kernel>> table;
  EngineCounters counters;
  std::shared_ptr<ObjectStore> store;
  std::shared_ptr<jit::Session> session;  // created by the first kernel()

  // `key`'s object from the store, else compiled by `compile` and stored. Counts compiles.
  template <typename Compile>
  std::vector<char> object(const std::string& key, Compile&& compile) {
    std::vector<char> obj;
    if (store && store->get(key, &obj)) return obj;
    Stopwatch watch;
    obj = compile();
    counters.compile_seconds += watch.seconds();
    if (store) store->put(key, obj);
    return obj;
  }

  jit::Session& session_locked() {
    if (session) return *session;
    auto runtime = runtime_object(target, [&] {
      return object(engine_detail::runtime_key(target),
                    [&] { return jit::compile_runtime_object(target); });
    });
    session = jit::Session::create(*runtime, num_threads);
    return *session;
  }

  std::string key_of(const Graph& canonical, const Schedule& resolved) const {
    return engine_detail::kernel_key(structural_hash(canonical), resolved, target);
  }
};

Engine::Engine(EngineOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->target = jit::resolve_target(options.target);
  impl_->num_threads = resolve_threads(options.num_threads);
  impl_->options = std::move(options);
}

Engine::~Engine() = default;

std::shared_ptr<const Kernel> Engine::kernel(const Graph& g) {
  return kernel(g, impl_->options.schedule);
}

std::shared_ptr<const Kernel> Engine::kernel(const Graph& g, const Schedule& schedule) {
  Graph canonical = canonicalize(g);
  Schedule resolved = jit::resolve_schedule(schedule, impl_->target);
  std::string key = impl_->key_of(canonical, resolved);

  std::lock_guard<std::mutex> lock(impl_->mutex);
  ++impl_->counters.lookups;
  if (auto it = impl_->table.find(key); it != impl_->table.end()) {
    ++impl_->counters.hits;
    return it->second;
  }
  std::string fn_name = "optfuse_" + key;
  std::vector<char> obj = impl_->object(key, [&] {
    std::vector<char> compiled =
        jit::compile_kernel_object(canonical, resolved, impl_->target, fn_name);
    ++impl_->counters.compiles;
    return compiled;
  });
  // After the kernel compiled: a graph or target that cannot be lowered fails before the ~0.8 s
  // runtime compile.
  jit::ArgvFn fn = impl_->session_locked().load_kernel(obj, fn_name);
  auto kernel = std::make_shared<KernelImpl>(lower::signature(canonical), key, g.name(), resolved,
                                             impl_->session, fn);
  impl_->table.emplace(key, kernel);
  return kernel;
}

std::string Engine::kernel_key(const Graph& g) const {
  return kernel_key(g, impl_->options.schedule);
}

std::string Engine::kernel_key(const Graph& g, const Schedule& schedule) const {
  return impl_->key_of(canonicalize(g), jit::resolve_schedule(schedule, impl_->target));
}

std::string Engine::lowered_stmt(const Graph& g) const {
  return jit::lowered_stmt(canonicalize(g),
                           jit::resolve_schedule(impl_->options.schedule, impl_->target),
                           impl_->target);
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

}  // namespace optfuse
