#include "optim/sparse_grad.h"

#include <algorithm>

#include "optfuse/error.h"

namespace optfuse::optim {

int64_t row_length(const TensorRef& param) {
  if (param.shape.empty() || param.shape[0] == 0) return 1;
  return param.numel / param.shape[0];
}

SparseGrad make_sparse_grad(const TensorRef& param, const std::vector<int64_t>& rows,
                            const TensorRef& values, const std::string& who) {
  SparseGrad s{true, rows, values, row_length(param)};
  const int64_t num_rows = param.numel / s.row_len;
  if (values.dtype != DType::F32)
    throw Error(who + ": sparse gradient values must be f32, got " +
                std::string(dtype_name(values.dtype)));
  const int64_t want = static_cast<int64_t>(rows.size()) * s.row_len;
  if (values.numel != want)
    throw Error(who + ": sparse gradient has " + std::to_string(rows.size()) + " rows of " +
                std::to_string(s.row_len) + " elements, so " + std::to_string(want) +
                " values, but values has " + std::to_string(values.numel));
  if (want > 0 && values.data == nullptr)
    throw Error(who + ": sparse gradient values pointer is null");
  for (int64_t r : rows)
    if (r < 0 || r >= num_rows)
      throw Error(who + ": sparse gradient row " + std::to_string(r) + " is out of range [0, " +
                  std::to_string(num_rows) + ")");
  std::vector<int64_t> sorted = rows;
  std::sort(sorted.begin(), sorted.end());
  auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end())
    throw Error(who + ": sparse gradient row " + std::to_string(*dup) +
                " appears more than once (coalesce the gradient first: sum its values)");
  return s;
}

void run_sparse(const Kernel& kernel, const std::vector<size_t>& output_input, KernelCall& call,
                const std::vector<void*>& base, const SparseGrad& grad) {
  const KernelSignature& sig = kernel.signature();
  const size_t nnz = grad.rows.size();
  for (size_t j = 0; j < nnz;) {
    size_t end = j + 1;  // [j, end): rows[j], rows[j] + 1, ... in the given order
    while (end < nnz && grad.rows[end] == grad.rows[end - 1] + 1) ++end;
    const int64_t row0 = grad.rows[j] * grad.row_len, val0 = static_cast<int64_t>(j) * grad.row_len;
    for (size_t i = 0; i < sig.inputs.size(); ++i) {
      bool is_grad = sig.inputs[i].role == Role::Grad;
      auto* at = static_cast<char*>(is_grad ? grad.values.data : base[i]);
      int64_t offset =
          (is_grad ? val0 : row0) * static_cast<int64_t>(dtype_size(sig.inputs[i].dtype));
      call.inputs[i] = at + offset;
    }
    for (size_t o = 0; o < output_input.size(); ++o) call.outputs[o] = call.inputs[output_input[o]];
    call.n = static_cast<int64_t>(end - j) * grad.row_len;
    kernel.run(call);
    j = end;
  }
}

int64_t touched_elements(const SparseGrad& grad) {
  return static_cast<int64_t>(grad.rows.size()) * grad.row_len;
}

}  // namespace optfuse::optim
