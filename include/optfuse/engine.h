#pragma once
// Engine: turns update graphs into callable fused kernels and keeps them.
//
//   optfuse::Engine engine({.target = "host"});
//   auto k = engine.kernel(graph);            // canonicalize -> hash -> lookup or compile
//   k->run(call);                             // one pass over memory, in place
//
// A kernel is keyed by (structural hash of the canonical graph, schedule, target). Hyperparameter
// values and tensor sizes are call arguments, so one kernel serves every parameter group and every
// shape with the same structure ("compile once, call many").
//
// The partitioner (include/optfuse/partition.h) chooses the kernels. A graph it keeps whole (every
// library optimizer's update, with GC, clipping, mixed precision) is one compiled kernel, returned
// as it is. A graph it cuts (an opaque op; a whole-tensor reduction the update needs in a kernel
// that also reduces per row) is one Kernel too, with the whole graph's signature and key, that
// runs the clusters' kernels in order: a reduction's value passes to the next kernel as a host
// double (its "%N" scalar), a tensor crossing an opaque op through a temporary it allocates, and
// an input a later kernel still reads is copied before an earlier one overwrites it in place.
// Such a Kernel takes host pointers only for now (a device call is an Error saying so).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "optfuse/cache.h"
#include "optfuse/graph.h"
#include "optfuse/kernel.h"
#include "optfuse/object_store.h"
#include "optfuse/schedule.h"

namespace optfuse {

struct EngineOptions {
  // "host" or any Halide target string, e.g. "x86-64-linux-avx2". "host", also leading as in
  // "host-cuda", means this CPU's features, or $OPTFUSE_HOST_TARGET when set and not empty (an
  // Error if it is no target string): a program or test suite then runs as another x86 machine
  // would, e.g. OPTFUSE_HOST_TARGET=x86-64-linux-avx-avx2-f16c-fma-sse41 on an AVX-512 CPU.
  std::string target = "host";
  int num_threads = 0;  // worker threads for kernels; 0 = hardware concurrency
  Schedule schedule;    // default schedule (CPU or GPU fields by target)
  // Persistent compile cache (include/optfuse/cache.h), shared with other processes and the
  // `optfuse` tool: this directory, or "" for default_cache_dir() ($OPTFUSE_CACHE_DIR, else
  // $XDG_CACHE_HOME/optfuse, else ~/.cache/optfuse). Lookups go memory -> disk -> compile, so a
  // second process starts without compiling. memory_only = true keeps kernels in this engine.
  std::string cache_dir;
  bool memory_only = false;
  // Another store instead (include/optfuse/object_store.h): the engine then uses no directory.
  std::shared_ptr<ObjectStore> object_store;
  uint64_t cache_max_bytes = uint64_t{1} << 30;  // LRU size cap of that directory
  // Receives the library's warnings (an unusable cache directory, a corrupt entry that is then
  // recompiled, ...), on the thread that met the problem; unset: "optfuse: warning: ..." on
  // stderr. Warnings never stop work: what fails is reported by throwing Error.
  std::function<void(const std::string&)> warn;
  // Compile only (precompile(), precompile_runtime(), kernel_key(), lowered_stmt()); kernel()
  // throws. Without it, an engine for a CUDA target checks at creation that a CUDA driver and
  // device are usable and throws Error saying why not; a compile-only engine needs neither.
  bool compile_only = false;
  // CUDA targets: the CUcontext kernels run in, which device pointers must be valid in. Null =
  // the primary context of device `cuda_device` (retained by optfuse; the context the CUDA runtime
  // API, and so PyTorch, JAX and CuPy, use), so their tensors' pointers work as they are.
  void* cuda_context = nullptr;
  int cuda_device = 0;
  // Tuned schedules (include/optfuse/schedules.h): "" = where resolve_schedule_db() finds them
  // ($OPTFUSE_SCHEDULES, the per-user directory `optfuse tune` writes to, the shipped databases);
  // a database file, or a directory searched for this target's class; "none" = default schedules
  // only. Read once at creation; Error if the file is unreadable or invalid. kernel(g, size_hint)
  // and the other size_hint overloads consult it (the Optimizer passes each tensor's size).
  std::string schedule_db;
};

struct EngineCounters {
  int64_t compiles = 0;          // kernels compiled by Halide in this engine
  int64_t lookups = 0;           // kernel() calls
  int64_t hits = 0;              // kernel() calls answered from the in-memory table
  double compile_seconds = 0;    // time spent compiling kernels and the runtime
  int64_t disk_hits = 0;         // objects (kernels or runtime) answered by the object store
  int64_t runtime_compiles = 0;  // Halide runtimes compiled by this engine (0 when cached)
};

// The options a DiskCache at `dir` needs to serve engines (and `optfuse cache verify` to check
// what a load would): this build's toolchain version and the object check (ELF machine and
// target of each object) that keeps another target's code away from the JIT.
CacheOptions engine_cache_options(const std::string& dir);

// One call of an opaque op's implementation (ops.def: `opaque "callee"` names an external
// computation, e.g. an all-reduce or a user callback; register it with Engine::register_opaque).
// It runs on the calling thread between the kernel before it and the kernel after it, on host
// memory. Calls may run at once, and cover part of a tensor: the Optimizer spreads small tensors
// over threads and runs a large one without whole-tensor reductions as slices on several (`in`
// and `out` then point at the slice), so an implementation must be safe to call concurrently. A
// tensor operand is the graph's input or a temporary the kernel before it wrote; a uniform operand
// (a reduction's value, a scalar) comes as one double (n = 1, dtype F64).
struct OpaqueCall {
  std::string_view callee;
  const void* in;  // the operand: n elements of dtype
  void* out;       // where the result goes: n elements of dtype, never overlapping `in`
  DType dtype;
  int64_t n;
  int64_t cols;  // the KernelCall::cols of the call (0 when it gave none)
};
using OpaqueFn = std::function<void(const OpaqueCall&)>;

// How an opaque op's implementation sees a tensor.
enum class OpaqueScope {
  Elements,  // any part of it: calls may cover slices of a tensor and run at once (above)
  // The whole tensor as a [rows, cols] matrix, row-major, cols = OpaqueCall::cols (the tensor's
  // row length, numel / shape[0]): one call per tensor and step, never sliced (e.g. Muon's
  // orthogonalization). A kernel with such an op has KernelSignature::whole and ::per_row.
  Matrix,
};

class Engine {
 public:
  // Throws Error for an invalid target, and for a CUDA target ("host-cuda", ...) without a usable
  // CUDA driver and device unless options.compile_only.
  explicit Engine(EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The compiled kernel for `g` (any form; it is canonicalized here). Thread-safe. Throws Error
  // for a graph with an opaque op this engine has no implementation of (register_opaque).
  std::shared_ptr<const Kernel> kernel(const Graph& g);
  std::shared_ptr<const Kernel> kernel(const Graph& g, const Schedule& schedule);
  // The kernel for calls of about `size_hint` elements: the tuned schedule for this graph and
  // target measured nearest that size (EngineOptions::schedule_db), else options().schedule.
  std::shared_ptr<const Kernel> kernel(const Graph& g, int64_t size_hint);
  // The signature kernel(g) has (whatever its schedule), without compiling: what a caller binds
  // its buffers to while the kernel compiles elsewhere. Thread-safe, and it does not wait for a
  // compile in progress. Throws kernel()'s Error for an opaque op without an implementation.
  KernelSignature signature(const Graph& g) const;
  // The resolved schedule kernel(g, size_hint) uses, and whether it came from the database.
  Schedule schedule_for(const Graph& g, int64_t size_hint, bool* tuned = nullptr) const;

  // Compile-only: makes sure `g`'s object is in the memory table or the object store (compiling
  // and storing it if needed) without loading it, so it works for any target (cross-compiling,
  // e.g. "arm-64-linux" on x86). Returns true if it was found (memory or store), false if compiled.
  bool precompile(const Graph& g);
  bool precompile(const Graph& g, int64_t size_hint);  // the schedule kernel(g, size_hint) uses
  // The same for this target's Halide runtime object.
  bool precompile_runtime();

  // The key `kernel(g)` would use, without compiling.
  std::string kernel_key(const Graph& g) const;
  std::string kernel_key(const Graph& g, const Schedule& schedule) const;
  std::string kernel_key(const Graph& g, int64_t size_hint) const;
  // The keys of the objects kernel(g) (size_hint >= 0: kernel(g, size_hint)) loads from the
  // object store: kernel_key's, or for a graph the partitioner cuts, each kernel cluster's.
  std::vector<std::string> object_keys(const Graph& g, int64_t size_hint = -1) const;
  // How many tuned schedules the engine's database holds for its target (0 without one).
  size_t tuned_schedules() const;

  // Halide's lowered statement for `g` (for `optfuse explain --stmt`).
  std::string lowered_stmt(const Graph& g) const;

  EngineCounters counters() const;
  // The options as resolved: cache_dir is the directory in use ("" when memory_only),
  // schedule_db the database file in use ("" when no tuned schedules apply).
  const EngineOptions& options() const;
  const std::string& target_string() const;  // the resolved Halide target, e.g. "x86-64-linux-avx2"
  int num_threads() const;
  std::vector<std::shared_ptr<const Kernel>> kernels() const;  // every kernel in the table

  void set_object_store(std::shared_ptr<ObjectStore> store);

  // Implements opaque op `callee` for kernels of this engine (OpaqueCall). A kernel takes the
  // implementation when kernel() makes it, so register before; an Error if `callee` already has
  // one (kernels made earlier would keep the old one) or `fn` is empty. Thread-safe. A callee
  // written `name:arguments` (e.g. "newton_schulz:steps=5") with no implementation of its own is
  // served by the one registered for `name`, which reads its arguments from OpaqueCall::callee.
  void register_opaque(const std::string& callee, OpaqueFn fn,
                       OpaqueScope scope = OpaqueScope::Elements);
  // The same, unless `callee` has an implementation already: then nothing changes and it returns
  // false. For a library's default that an application's own, registered first, replaces.
  bool register_default_opaque(const std::string& callee, OpaqueFn fn, OpaqueScope scope);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace optfuse
