#include "py_json.h"

namespace optfuse::python {
namespace {

// A Python error raised by the API itself (out of memory, a failing __str__) as a C++ exception.
[[noreturn]] void rethrow_python_error(const std::string& where) {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  std::string text = where + ": ";
  if (PyObject* s = value ? PyObject_Str(value) : nullptr) {
    if (const char* c = PyUnicode_AsUTF8(s)) text += c;
    Py_DECREF(s);
  }
  PyErr_Clear();
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(trace);
  throw TypeError(text);
}

std::string utf8(PyObject* s, const std::string& where) {
  Py_ssize_t n = 0;
  const char* c = PyUnicode_AsUTF8AndSize(s, &n);
  if (!c) rethrow_python_error(where);
  return std::string(c, static_cast<size_t>(n));
}

}  // namespace

Options to_json(PyObject* h, const std::string& where) {
  if (h == Py_None) return nullptr;
  if (PyBool_Check(h)) return h == Py_True;
  if (PyLong_Check(h)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(h, &overflow);
    if (overflow) throw TypeError(where + ": integer out of range for optfuse");
    return static_cast<int64_t>(v);
  }
  if (PyFloat_Check(h)) return PyFloat_AS_DOUBLE(h);
  if (PyUnicode_Check(h)) return utf8(h, where);
  if (PyList_Check(h) || PyTuple_Check(h)) {
    Options a = Options::array();
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(h);
    PyObject** items = PySequence_Fast_ITEMS(h);
    for (Py_ssize_t i = 0; i < n; ++i) a.push_back(to_json(items[i], where));
    return a;
  }
  if (PyDict_Check(h)) {
    Options o = Options::object();
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(h, &pos, &k, &v)) {
      PyObject* ks = PyObject_Str(k);
      if (!ks) rethrow_python_error(where);
      std::string key = utf8(ks, where);
      Py_DECREF(ks);
      o[key] = to_json(v, where + "['" + key + "']");
    }
    return o;
  }
  throw TypeError(where + ": cannot pass a " + std::string(Py_TYPE(h)->tp_name) + " to optfuse");
}

PyObject* from_json(const Options& j) {
  switch (j.type()) {
    case Options::value_t::boolean:
      return PyBool_FromLong(j.get<bool>());
    case Options::value_t::number_integer:
    case Options::value_t::number_unsigned:
      return PyLong_FromLongLong(j.get<int64_t>());
    case Options::value_t::number_float:
      return PyFloat_FromDouble(j.get<double>());
    case Options::value_t::string: {
      const std::string& s = j.get_ref<const std::string&>();
      return PyUnicode_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
    }
    case Options::value_t::array: {
      PyObject* l = PyList_New(static_cast<Py_ssize_t>(j.size()));
      Py_ssize_t i = 0;
      for (const auto& e : j) PyList_SET_ITEM(l, i++, from_json(e));
      return l;
    }
    case Options::value_t::object: {
      PyObject* d = PyDict_New();
      for (const auto& [k, v] : j.items()) {
        PyObject* value = from_json(v);
        PyDict_SetItemString(d, k.c_str(), value);
        Py_DECREF(value);
      }
      return d;
    }
    default:
      Py_RETURN_NONE;
  }
}

}  // namespace optfuse::python
