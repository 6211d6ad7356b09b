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
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse {

// How a kernel is laid out over the machine. Part of every kernel key.
struct Schedule {
  int vector_width = 0;      // lanes per vector op; 0 = twice the target's natural f32 width
  int tasks_per_thread = 1;  // parallel tasks per worker thread (few large tasks win, see DESIGN)
  int64_t min_task = 16384;  // elements below which a call runs as a single task
  std::string str() const;   // e.g. "v16.t1.m16384": stable text, used in keys
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
  std::vector<TensorArg> inputs;    // canonical order
  std::vector<ScalarArg> scalars;   // canonical order
  std::vector<OutputArg> outputs;   // canonical order

  int input_index(const std::string& name) const;   // -1 if absent
  int scalar_index(const std::string& name) const;  // -1 if absent
};

// One call: data pointers by signature position, scalar values (converted to each scalar's dtype
// exactly once, from double), and the element count shared by all tensors.
struct KernelCall {
  std::vector<void*> inputs;    // signature.inputs order
  std::vector<double> scalars;  // signature.scalars order
  std::vector<void*> outputs;   // signature.outputs order; normally the same pointer as its input
  int64_t n = 0;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual const KernelSignature& signature() const = 0;
  virtual const std::string& key() const = 0;   // hex key (graph hash + schedule + target)
  virtual const std::string& name() const = 0;  // the graph's name, for messages
  // Runs the kernel. Checks pointer count and n >= 0; data validity is the caller's contract.
  virtual void run(const KernelCall& call) const = 0;
};

struct EngineOptions {
  std::string target = "host";  // "host" or any Halide target string, e.g. "x86-64-linux-avx2"
  int num_threads = 0;          // worker threads for kernels; 0 = hardware concurrency
  Schedule schedule;            // default CPU schedule
};

struct EngineCounters {
  int64_t compiles = 0;        // kernels compiled by Halide in this engine
  int64_t lookups = 0;         // kernel() calls
  int64_t hits = 0;            // kernel() calls answered from the in-memory table
  double compile_seconds = 0;  // time spent compiling kernels and the runtime
};

// The seam where a persistent cache plugs in: given a key, return a stored object file or
// nothing; after a compile, store it. The default engine has no object store (memory only).
class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  virtual bool get(const std::string& key, std::vector<char>* object) = 0;
  virtual void put(const std::string& key, const std::vector<char>& object) = 0;
};

class Engine {
 public:
  explicit Engine(EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The compiled kernel for `g` (any form; it is canonicalized here). Thread-safe.
  std::shared_ptr<const Kernel> kernel(const Graph& g);
  std::shared_ptr<const Kernel> kernel(const Graph& g, const Schedule& schedule);

  // The key `kernel(g)` would use, without compiling.
  std::string kernel_key(const Graph& g) const;
  std::string kernel_key(const Graph& g, const Schedule& schedule) const;

  // Halide's lowered statement for `g` (for `optfuse explain --stmt`).
  std::string lowered_stmt(const Graph& g) const;

  EngineCounters counters() const;
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
