#pragma once
// Python values as the JSON options the C++ API takes, and back, on the CPython API alone, so
// that the binding (module.cpp) and the per-step driver (torch_step.cpp, built against torch's
// headers without nanobind) share them. Call with the GIL held.
#include <Python.h>

#include <stdexcept>
#include <string>

#include "optfuse/optim.h"

namespace optfuse::python {

// Errors about a user's Python values, raised in Python as ValueError and TypeError (module.cpp
// registers the translation).
struct ValueError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct TypeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// None, bool, int, float, str, list / tuple and dict (keys as str()) as JSON; TypeError naming
// `where` for anything else.
Options to_json(PyObject* value, const std::string& where);

// JSON as a new reference to its Python value.
PyObject* from_json(const Options& j);

}  // namespace optfuse::python
