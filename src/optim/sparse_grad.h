#pragma once
// Row-sparse gradients (torch.optim.SparseAdam; Optimizer::set_sparse_grad): a param is viewed as
// [rows, row_len] (row_len = numel / shape[0]; 1 for a param without a shape), and a gradient
// names the rows it has (`rows`, any order, no repeats) with their values packed row after row.
// A step calls the group's ordinary dense kernel once per run of consecutive rows: the run's
// param, state and master rows are contiguous, and so are its gathered values.
#include <cstdint>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/optim.h"

namespace optfuse::optim {

struct SparseGrad {
  bool set = false;
  std::vector<int64_t> rows;
  TensorRef values;  // rows.size() * row_len f32 elements
  int64_t row_len = 1;
};

int64_t row_length(const TensorRef& param);

// Checks rows (in range, no repeats) and values (f32, the right element count, not null unless
// there are no rows) for `param`; Error naming `who` and the row at fault.
SparseGrad make_sparse_grad(const TensorRef& param, const std::vector<int64_t>& rows,
                            const TensorRef& values, const std::string& who);

// Runs `kernel` over the touched rows only: `base` holds the call's pointers for the whole
// tensor (inputs in signature order; outputs alias their inputs via `output_input`).
void run_sparse(const Kernel& kernel, const std::vector<size_t>& output_input, KernelCall& call,
                const std::vector<void*>& base, const SparseGrad& grad);

// Elements a step touches (for bytes_per_step).
int64_t touched_elements(const SparseGrad& grad);

}  // namespace optfuse::optim
