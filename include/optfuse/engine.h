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
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse {

// How a kernel is laid out over the machine. Part of every kernel key.
struct Schedule {
  int vector_width = 0;      // lanes per vector op; 0 = twice the target's natural f32 width
  int tasks_per_thread = 1;  // parallel tasks per worker thread (few large tasks win, see DESIGN)
  int64_t min_task = 16384;  // elements below which a call runs as a single task
  // Vectors per iteration of the inner loop (1 = not unrolled): more independent loads in
  // flight per task. Each task's vector count is rounded up to a multiple of it.
  int unroll = 1;
  // Elements per parallel task; 0 = split each call into num_threads * tasks_per_thread equal
  // tasks. > 0: tasks of this fixed size (rounded up to whole vectors, at least min_task), as
  // many as the call needs, so small calls make few tasks and huge ones many.
  int64_t task_elems = 0;
  // CPU targets: software prefetch distance in bytes (0 = none). The parallel tasks' loop
  // prefetches every cache line of every input this far ahead of the vector it loads, so the
  // memory system stays busy while the arithmetic of an update runs (src/lower/prefetch.h).
  int prefetch = 2048;
  // CPU targets: a second prefetch per line into L2 only, this many bytes ahead (0 = none).
  // Farther than `prefetch`, it keeps more lines on their way from memory than the core's
  // L1 miss slots allow, so the near prefetch then finds them in L2.
  int prefetch_l2 = 16384;
  // GPU targets only (ignored, and reset to 0, for CPU targets): threads per block; 0 = 256. On
  // a GPU target vector_width is the consecutive elements each thread handles (0 = 4: one 128-bit
  // access per f32 tensor) and tasks_per_thread / min_task are unused (reset to their defaults).
  int gpu_block = 0;
  // Stable text used in keys: "v16.t1.m16384" for CPU schedules (unchanged by gpu_block), with
  // ".u4" / ".c65536" / ".p1024" / ".l16384" appended only when unroll / task_elems / prefetch /
  // prefetch_l2 differ from their defaults (so keys of
  // default schedules never change), and "gpu.v4.b256" for resolved GPU schedules.
  std::string str() const;

  bool operator==(const Schedule& o) const { return str() == o.str(); }
  bool operator!=(const Schedule& o) const { return !(*this == o); }
};

// Everything a caller needs to know to call a compiled kernel.
struct KernelSignature {
  struct TensorArg {
    std::string name;
    Role role;
    DType dtype;
  };
  struct ScalarArg {
    std::string name;
    DType dtype;
  };
  struct OutputArg {
    std::string replaces;  // the tensor input it overwrites
    DType dtype;
  };
  struct ResultArg {
    std::string name;
    DType dtype;  // the value's dtype in the graph; returned converted to double
  };
  std::vector<TensorArg> inputs;   // canonical order
  std::vector<ScalarArg> scalars;  // canonical order
  std::vector<OutputArg> outputs;  // canonical order
  std::vector<ResultArg> results;  // sorted by name
  // The graph has per-row reductions (row_sum, row_mean, ...): calls give KernelCall::cols.
  bool per_row = false;
  // The graph has whole-tensor reductions (reduce_sum, ...): one call reduces at most 2^30
  // elements (Halide's int32 extents; longer calls of other kernels run in slices).
  bool reduces = false;

  int input_index(const std::string& name) const;   // -1 if absent
  int scalar_index(const std::string& name) const;  // -1 if absent
  int result_index(const std::string& name) const;  // -1 if absent
};

// One call: data pointers by signature position, scalar values (converted to each scalar's dtype
// exactly once, from double), and the element count shared by all tensors.
struct KernelCall {
  std::vector<void*> inputs;    // signature.inputs order
  std::vector<double> scalars;  // signature.scalars order
  std::vector<void*> outputs;   // signature.outputs order; normally the same pointer as its input
  int64_t n = 0;
  // Kernels with signature.per_row: the row length (n must be a multiple of it); the tensors are
  // viewed as [n / cols, cols], row-major. Ignored by other kernels.
  int64_t cols = 0;
  // Kernels with signature.results: where run() writes them, signature.results.size() doubles
  // in signature.results order. For n == 0 the reductions give their empty values (sum 0,
  // mean NaN, max -inf, min +inf).
  double* results = nullptr;
  // The pointers are CUDA device pointers (CUdeviceptr values). Required by kernels of CUDA
  // targets (host pointers are rejected: no hidden copies), rejected by CPU kernels. Each must be
  // 16-byte aligned (cuMemAlloc gives 256) and valid in the engine's CUDA context
  // (EngineOptions::cuda_context: by default device 0's primary context, the one PyTorch's
  // allocations live in). The launch is asynchronous on `cuda_stream`: synchronize that stream
  // before reading results. Untested on a GPU so far (no device in CI).
  bool device = false;
  // CUDA kernels only: the CUstream to launch on (e.g. torch.cuda.current_stream().cuda_stream);
  // null = the context's default stream.
  void* cuda_stream = nullptr;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const KernelSignature& signature() const = 0;
  virtual const std::string& key() const = 0;    // hex key (graph hash + schedule + target)
  virtual const std::string& name() const = 0;   // the graph's name, for messages
  virtual const Schedule& schedule() const = 0;  // the resolved schedule it was compiled with
  // Runs the kernel. Checks pointer count, n >= 0, and KernelCall::device against the target (and
  // the alignment of device pointers); data validity is the caller's contract.
  virtual void run(const KernelCall& call) const = 0;
};

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

// What the engine knows about an object besides its key; a store that records it must check it
// on get (DiskCache does), so an entry for another kernel is a miss, never a wrong kernel.
struct ObjectInfo {
  std::string kind;       // "kernel" or "runtime"
  std::string name;       // the graph's name (for listings only)
  std::string target;     // resolved Halide target
  std::string signature;  // signature_text() of a kernel; "halide-runtime" for a runtime
};

// The seam where a persistent cache plugs in: given a key, return a stored object file or
// nothing; after a compile, store it. The default engine has no object store (memory only). A
// returned object this process cannot load (not an ELF relocatable object for its machine) is
// never handed to the JIT: the engine treats it as a miss, compiles and put()s the object again.
class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  virtual bool get(const std::string& key, std::vector<char>* object) = 0;
  virtual void put(const std::string& key, const std::vector<char>& object) = 0;
  // The engine calls these; by default they ignore `info`.
  virtual bool get(const std::string& key, const ObjectInfo& info, std::vector<char>* object) {
    return get(key, object);
  }
  virtual void put(const std::string& key, const ObjectInfo& info,
                   const std::vector<char>& object) {
    put(key, object);
  }
  // Held (until the returned handle is released) while `key` is compiled, so that other
  // processes sharing the store wait for it instead of compiling it again. Default: no lock.
  virtual std::shared_ptr<void> lock(const std::string& key) { return nullptr; }
};

// A stable text of a signature (names, roles, dtypes in canonical order), checked by stores.
std::string signature_text(const KernelSignature& s);

class Engine {
 public:
  // Throws Error for an invalid target, and for a CUDA target ("host-cuda", ...) without a usable
  // CUDA driver and device unless options.compile_only.
  explicit Engine(EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The compiled kernel for `g` (any form; it is canonicalized here). Thread-safe.
  std::shared_ptr<const Kernel> kernel(const Graph& g);
  std::shared_ptr<const Kernel> kernel(const Graph& g, const Schedule& schedule);
  // The kernel for calls of about `size_hint` elements: the tuned schedule for this graph and
  // target measured nearest that size (EngineOptions::schedule_db), else options().schedule.
  std::shared_ptr<const Kernel> kernel(const Graph& g, int64_t size_hint);
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

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace optfuse
