#pragma once
// A compiled kernel as its callers see it: the signature (tensors, scalars, outputs, results in
// canonical order), one call's arguments, and run(). Engine::kernel() returns these (engine.h).
#include <string>
#include <vector>

#include "optfuse/graph.h"
#include "optfuse/schedule.h"

namespace optfuse {

// The longest row (KernelCall::cols) a kernel with row state takes: a block of block-quantized
// state lives on the stack while it is updated (src/lower/row_plan.h, RowPlan::fresh).
constexpr int64_t kMaxRowStateCols = 4096;

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
    bool row_state = false;  // it replaces row state: one value per row
    bool col_state = false;  // it replaces column state: one value per column of each batch
  };
  struct ResultArg {
    std::string name;
    DType dtype;  // the value's dtype in the graph; returned converted to double
  };
  std::vector<TensorArg> inputs;   // canonical order
  std::vector<ScalarArg> scalars;  // canonical order
  // Those replacing per-element inputs sorted by that input's name, then those replacing row
  // state (Role::RowState), then those replacing column state (Role::ColState), each sorted the
  // same way.
  std::vector<OutputArg> outputs;
  std::vector<ResultArg> results;  // sorted by name
  // The graph has per-row reductions (row_sum, row_mean, ...) or row state, or is per_col: calls
  // give KernelCall::cols.
  bool per_row = false;
  // The graph has column reductions (col_sum, col_mean, ...) or column state: calls give
  // KernelCall::cols and KernelCall::batch_rows, and run as one call (a column reduces over the
  // rows of its batch): at most 2^30 elements.
  bool per_col = false;
  // The graph has whole-tensor reductions (reduce_sum, ...): one call reduces at most 2^30
  // elements (Halide's int32 extents; longer calls of other kernels run in slices).
  bool reduces = false;
  // A step needs each tensor whole, as one call: an opaque op of OpaqueScope::Matrix (engine.h)
  // sees the tensor as a matrix. Such calls are never cut into slices.
  bool whole = false;

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
  // viewed as [n / cols, cols], row-major, and row state (Role::RowState) inputs and outputs
  // hold n / cols values. Ignored by other kernels.
  int64_t cols = 0;
  // Kernels with signature.per_col: the rows of one batch (a matrix; 0: one batch of all
  // n / cols rows; else it must divide them): the view is cut into n / (cols * batch_rows)
  // batches, and column state (Role::ColState) inputs and outputs hold cols values per batch,
  // batch after batch. Ignored by other kernels.
  int64_t batch_rows = 0;
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
  // Run as one task on the calling thread, never entering the engine's thread pool, with the
  // software prefetches of a parallel task: for callers that spread many calls (or slices of one
  // tensor) over threads themselves, as Optimizer::step does. Ignored by CUDA kernels. A kernel
  // with whole-tensor reductions (signature.reduces) then reduces in one task, so its results
  // are those of this slice (the step's statistics pass combines its slices' results itself).
  bool serial = false;
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

}  // namespace optfuse
