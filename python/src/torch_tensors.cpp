#include "torch_tensors.h"

#include <cstdint>
#include <string>
#include <utility>

#include "py_json.h"
#include "torch_step.h"

namespace optfuse::python {
namespace {

// One past the furthest element `t`'s shape and strides reach from its first one (0: empty).
int64_t extent(const at::Tensor& t) {
  int64_t e = 1;
  for (size_t d = 0; d < t.sizes().size(); ++d) {
    if (t.sizes()[d] == 0) return 0;
    e += (t.sizes()[d] - 1) * t.strides()[d];
  }
  return e;
}

// Whether tensors of these sizes with strides `a` and `b` put each element at the same offset
// (a dim of size 1 has no stride that matters).
bool same_order(at::IntArrayRef sizes, at::IntArrayRef a, at::IntArrayRef b) {
  for (size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] > 1 && a[d] != b[d]) return false;
  return true;
}

}  // namespace

PyObject* interned(const char* s) {
  PyObject* o = PyUnicode_InternFromString(s);
  if (!o) throw TypeError(std::string("cannot make the string '") + s + "'");
  return o;
}

Ref local_of(PyObject* o) {
  static PyObject* const name = interned("_local_tensor");
  PyObject* local = PyObject_GetAttr(o, name);
  if (!local) PyErr_Clear();
  if (local && !THPVariable_Check(local)) {
    Py_DECREF(local);
    return {};
  }
  return Ref::steal(local);
}

std::string shape_text(at::IntArrayRef s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + (s.size() == 1 ? ",)" : ")");
}

std::string dtype_text(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "torch.float32";
    case at::kDouble:
      return "torch.float64";
    case at::kBFloat16:
      return "torch.bfloat16";
    case at::kHalf:
      return "torch.float16";
    default:
      return std::string("torch.") + c10::toString(t);
  }
}

at::ScalarType scalar_type(DType t) {
  switch (t) {
    case DType::F32:
      return at::kFloat;
    case DType::F64:
      return at::kDouble;
    case DType::BF16:
      return at::kBFloat16;
    case DType::F16:
      return at::kHalf;
    case DType::U8:
      return at::kByte;
    case DType::Bool:
      return at::kBool;
  }
  return at::kFloat;
}

KernelGrad kernel_grad(PyObject* param, const at::Tensor& work, bool dtensor, at::ScalarType want,
                       const std::string& who) {
  const at::Tensor& grad = tensor(param).grad();
  if (!grad.defined()) throw ValueError(who + ": has no gradient");
  Ref local;
  const at::Tensor* g = &grad;
  if (dtensor) {
    Ref wrapped = Ref::steal(THPVariable_Wrap(grad));
    local = wrapped ? local_of(wrapped.get()) : Ref();
    if (!local) {
      PyErr_Clear();
      throw ValueError(who + ": the param is a DTensor but its gradient is not");
    }
    g = &tensor(local.get());
  }
  if (g->layout() != at::kStrided)
    throw ValueError(who + ": the gradient is sparse; only SparseAdam takes sparse gradients");
  if (g->device() != work.device())
    throw ValueError(who + ": the gradient is on " + g->device().str() + ", the param on " +
                     work.device().str());
  const at::ScalarType got = g->scalar_type();
  const bool usable =
      got == at::kFloat || got == at::kDouble || got == at::kBFloat16 || got == at::kHalf;
  if (want == at::ScalarType::Undefined ? !usable : got != want)
    throw ValueError(who + ": the gradient is " + dtype_text(got) + ", the param " +
                     dtype_text(work.scalar_type()) +
                     (want == at::ScalarType::Undefined
                          ? " (gradients are float32, float64, bfloat16 or float16)"
                          : ", and the gradient was " + dtype_text(want) + " when bound"));
  if (g->sizes() != work.sizes())
    throw ValueError(who + ": the gradient has shape " + shape_text(g->sizes()) + ", the param " +
                     shape_text(work.sizes()));
  if (!g->has_storage() || (g->numel() > 0 && g->storage().data() == nullptr))
    throw ValueError(who + ": the gradient has no storage");
  const int64_t reach = g->storage_offset() + extent(*g);
  const int64_t held = static_cast<int64_t>(g->storage().nbytes() / g->itemsize());
  if (reach > held)
    throw ValueError(who + ": the gradient's storage holds " + std::to_string(held) +
                     " elements, but its shape " + shape_text(g->sizes()) + ", strides " +
                     shape_text(g->strides()) + " and offset " +
                     std::to_string(g->storage_offset()) + " reach element " +
                     std::to_string(reach));
  KernelGrad out;
  out.dtype = got;
  if (g->is_non_overlapping_and_dense() && same_order(work.sizes(), g->strides(), work.strides())) {
    out.data = g->data_ptr();
    return out;
  }
  // Another dim order (p.grad = g.t().contiguous().t()), or one with gaps or overlaps.
  out.copy = at::empty_like(work, g->options());
  out.copy.copy_(*g);
  out.data = out.copy.data_ptr();
  return out;
}

DType dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return DType::F64;
    case at::kBFloat16:
      return DType::BF16;
    case at::kHalf:
      return DType::F16;
    default:
      return DType::F32;
  }
}

BoundGrad bind_grad(PyObject* param, PyObject* work, bool dtensor, const std::string& who) {
  KernelGrad g = kernel_grad(param, tensor(work), dtensor, at::ScalarType::Undefined, who);
  BoundGrad out;
  out.data = g.data;
  out.dtype = dtype_of(g.dtype);
  out.copy = g.copy.defined() ? THPVariable_Wrap(std::move(g.copy)) : nullptr;
  return out;
}

}  // namespace optfuse::python
