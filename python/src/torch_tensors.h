#pragma once
// torch tensors behind Python objects, for torch_step.cpp: what a bound gradient must be and
// the memory the kernels read for it, and the small tools both need. Internal to the Python
// extension; like torch_step.cpp, every unit including this is built against torch's headers
// (C++20).
#include <ATen/core/Tensor.h>
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>
#include <utility>

#include "optfuse/dtype.h"

namespace optfuse::python {

// A strong reference to a Python object (taken and released with the GIL held).
class Ref {
 public:
  Ref() = default;
  explicit Ref(PyObject* o) : o_(o) { Py_XINCREF(o_); }
  static Ref steal(PyObject* o) {
    Ref r;
    r.o_ = o;
    return r;
  }
  Ref(const Ref& r) : o_(r.o_) { Py_XINCREF(o_); }
  Ref(Ref&& r) noexcept : o_(r.o_) { r.o_ = nullptr; }
  Ref& operator=(Ref r) noexcept {
    std::swap(o_, r.o_);
    return *this;
  }
  ~Ref() { Py_XDECREF(o_); }
  PyObject* get() const { return o_; }
  explicit operator bool() const { return o_ != nullptr; }

 private:
  PyObject* o_ = nullptr;
};

// An interned Python string (made once per call site: keep it in a static).
PyObject* interned(const char* s);

inline const at::Tensor& tensor(PyObject* o) { return THPVariable_Unpack(o); }

// A DTensor's local shard (a new reference), or null (error cleared) if `o` has none.
Ref local_of(PyObject* o);

std::string shape_text(at::IntArrayRef s);  // "(3, 4)", "(5,)" as Python prints a shape
std::string dtype_text(at::ScalarType t);   // "torch.float32"
at::ScalarType scalar_type(DType t);
DType dtype_of(at::ScalarType t);  // f32, f64, bf16 or f16 (f32 for anything else)

// The memory the kernels read for `param`'s gradient (its local shard for a DTensor), after
// checking it against `work`, what the kernels update: a ValueError naming `who` unless it has
// `work`'s device and shape, the dtype `want` (at::ScalarType::Undefined: any dtype a kernel
// takes) and storage large enough for its shape and strides. A gradient whose layout differs
// from the param's is copied into the param's (`copy`): the kernels pair elements by memory
// position.
struct KernelGrad {
  void* data = nullptr;
  at::Tensor copy;
  at::ScalarType dtype = at::kFloat;
};
KernelGrad kernel_grad(PyObject* param, const at::Tensor& work, bool dtensor, at::ScalarType want,
                       const std::string& who);

}  // namespace optfuse::python
