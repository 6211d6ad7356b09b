// The per-step driver (torch_step.h), reading torch tensors through torch_tensors.h.
#include "torch_step.h"

#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "py_json.h"
#include "torch_tensors.h"

namespace optfuse::python {
namespace {

bool same_spec(const std::vector<Optimizer::StateSpec>& a,
               const std::vector<Optimizer::StateSpec>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const auto& x, const auto& y) {
    return x.name == y.name && x.dtype == y.dtype && x.initial == y.initial &&
           x.from_param == y.from_param && x.numel == y.numel && x.shape == y.shape;
  });
}

}  // namespace

struct TorchStep::Impl {
  // A bound param and what the last check found.
  struct Tensor {
    BoundParam bound;
    Ref param, work;
    bool dtensor = false, staged = false;
    // The param's memory and layout when bound (for a staged one, the param's own; else the
    // work tensor's, which the kernels update).
    const void* data = nullptr;
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype = at::kFloat;
    at::Device device{at::kCPU};
    int64_t numel = 0;
    at::ScalarType grad_type = at::kFloat;
    void* grad_ptr = nullptr;  // the gradient memory the C++ optimizer reads
    at::Tensor grad_copy;      // a gradient copied into the param's layout, while it is read
    void* next_grad = nullptr;
  };
  struct Group {
    BoundGroup bound;
    Ref synced;
    std::vector<Ref> keys;  // bound.keys as Python strings
    std::vector<Optimizer::StateSpec> spec;
  };
  // One torch param group as bound: its dict and every param it held, with or without a grad.
  struct TorchGroup {
    Ref dict;
    std::vector<Ref> params;
    std::vector<bool> has_grad;
  };

  Optimizer* opt = nullptr;
  std::vector<Tensor> tensors;
  std::vector<Group> groups;
  std::vector<Ref> idle_steps;
  bool dense_grads = true;
  Ref param_groups, state;
  std::vector<TorchGroup> torch_groups;
  std::vector<std::pair<Ref, Ref>> state_entries;  // optimizer.state in its order

  void snapshot_state();
  bool same_binding(PyObject* pg, PyObject* st) const;
  bool param_unchanged(const Tensor& t) const;
  void* grad_memory(Tensor& t);
  bool sync(size_t group, PyObject* dict, bool* blocking);
};

void TorchStep::Impl::snapshot_state() {
  state_entries.clear();
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(state.get(), &pos, &k, &v)) state_entries.emplace_back(Ref(k), Ref(v));
}

bool TorchStep::Impl::same_binding(PyObject* pg, PyObject* st) const {
  if (pg != param_groups.get() || st != state.get()) return false;
  if (static_cast<size_t>(PyList_GET_SIZE(pg)) != torch_groups.size()) return false;
  static PyObject* const params_key = interned("params");
  for (size_t gi = 0; gi < torch_groups.size(); ++gi) {
    const TorchGroup& tg = torch_groups[gi];
    PyObject* d = PyList_GET_ITEM(pg, gi);
    if (d != tg.dict.get() || !PyDict_Check(d)) return false;
    PyObject* ps = PyDict_GetItem(d, params_key);
    if (!ps || !PyList_Check(ps) || static_cast<size_t>(PyList_GET_SIZE(ps)) != tg.params.size())
      return false;
    for (size_t k = 0; k < tg.params.size(); ++k) {
      PyObject* p = PyList_GET_ITEM(ps, k);
      if (p != tg.params[k].get() || tensor(p).grad().defined() != tg.has_grad[k]) return false;
    }
  }
  // The same state dict for every param (del or assignment of optimizer.state[p], as
  // ZeroRedundancyOptimizer's load does, shows as another entry or order).
  if (!PyDict_Check(st) || static_cast<size_t>(PyDict_GET_SIZE(st)) != state_entries.size())
    return false;
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  size_t i = 0;
  while (PyDict_Next(st, &pos, &k, &v)) {
    if (i >= state_entries.size() || k != state_entries[i].first.get() ||
        v != state_entries[i].second.get())
      return false;
    ++i;
  }
  return i == state_entries.size();
}

bool TorchStep::Impl::param_unchanged(const Tensor& t) const {
  if (t.dtensor) {
    Ref local = local_of(t.param.get());
    if (local.get() != t.work.get()) return false;
  }
  const at::Tensor& p = tensor(t.staged ? t.param.get() : t.work.get());
  return p.data_ptr() == t.data && p.sizes() == at::IntArrayRef(t.sizes) &&
         p.strides() == at::IntArrayRef(t.strides) && p.scalar_type() == t.dtype &&
         p.device() == t.device;
}

void* TorchStep::Impl::grad_memory(Tensor& t) {
  KernelGrad g =
      kernel_grad(t.param.get(), tensor(t.work.get()), t.dtensor, t.grad_type, t.bound.name);
  t.grad_copy = std::move(g.copy);
  return g.data;
}

// Passes each option of C++ group `group` that changed in its torch group's dict to C++; whether
// any did. `*blocking`: one that decides which tensors have 8-bit state, or its blocks, did
// (_state8.BLOCKING_KEYS).
bool TorchStep::Impl::sync(size_t group, PyObject* dict, bool* blocking) {
  Group& g = groups[group];
  bool changed = false;
  PyObject* synced = g.synced.get();
  for (size_t k = 0; k < g.keys.size(); ++k) {
    PyObject* key = g.keys[k].get();
    PyObject* v = PyDict_GetItem(dict, key);
    if (!v) continue;
    PyObject* last = PyDict_GetItem(synced, key);
    if (v == last) continue;
    if (last && PyFloat_CheckExact(v) && PyFloat_CheckExact(last) &&
        PyFloat_AS_DOUBLE(v) == PyFloat_AS_DOUBLE(last))
      continue;
    const std::string& name = g.bound.keys[k];
    const std::string where =
        "param group " + std::to_string(g.bound.torch_group) + " option '" + name + "'";
    // A tensor (torch allows lr=torch.tensor(...)) is read each step: it may change in place.
    const bool is_tensor = THPVariable_Check(v);
    const bool mutable_value = is_tensor || PyList_Check(v) || PyDict_Check(v);
    Options value = is_tensor ? Options(tensor(v).item<double>()) : to_json(v, where);
    if (last && value == to_json(last, where)) {
      if (!mutable_value) PyDict_SetItem(synced, key, v);  // compared by identity next time
      continue;
    }
    opt->set(group, name, value);
    // What C++ now holds: an immutable value as it is, others as a plain copy.
    Ref held = mutable_value ? Ref::steal(from_json(value)) : Ref(v);
    PyDict_SetItem(synced, key, held.get());
    changed = true;
    if (name == "state_dtype" || name == "block_size" || name == "min_8bit_size") *blocking = true;
  }
  return changed;
}

TorchStep::TorchStep(Optimizer* opt, std::vector<BoundParam> params, std::vector<BoundGroup> groups,
                     std::vector<PyObject*> idle_steps, bool dense_grads, PyObject* param_groups,
                     PyObject* state)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = opt;
  m.dense_grads = dense_grads;
  m.param_groups = Ref(param_groups);
  m.state = Ref(state);
  if (!PyList_Check(param_groups) || !PyDict_Check(state))
    throw TypeError("TorchStep: param_groups must be a list and state a dict");
  static PyObject* const params_key = interned("params");
  for (Py_ssize_t gi = 0; gi < PyList_GET_SIZE(param_groups); ++gi) {
    Impl::TorchGroup tg;
    tg.dict = Ref(PyList_GET_ITEM(param_groups, gi));
    PyObject* ps =
        PyDict_Check(tg.dict.get()) ? PyDict_GetItem(tg.dict.get(), params_key) : nullptr;
    if (!ps || !PyList_Check(ps)) throw TypeError("TorchStep: a param group without a params list");
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(ps); ++k) {
      PyObject* p = PyList_GET_ITEM(ps, k);
      if (!THPVariable_Check(p)) throw TypeError("TorchStep: a param that is not a tensor");
      tg.params.emplace_back(p);
      tg.has_grad.push_back(tensor(p).grad().defined());
    }
    m.torch_groups.push_back(std::move(tg));
  }
  m.snapshot_state();
  for (BoundParam& b : params) {
    Impl::Tensor t;
    t.param = Ref(b.param);
    t.work = Ref(b.work);
    t.dtensor = b.mode == ParamMode::DTensor;
    t.staged = b.mode == ParamMode::Staged;
    const at::Tensor& p = tensor(t.staged ? b.param : b.work);
    t.data = p.data_ptr();
    t.sizes = p.sizes().vec();
    t.strides = p.strides().vec();
    t.dtype = p.scalar_type();
    t.device = p.device();
    t.numel = p.numel();
    t.grad_type = scalar_type(b.grad_dtype);
    t.grad_ptr = b.grad_ptr;
    t.bound = std::move(b);
    m.tensors.push_back(std::move(t));
  }
  for (BoundGroup& b : groups) {
    Impl::Group g;
    g.synced = Ref(b.synced);
    for (const std::string& k : b.keys) g.keys.push_back(Ref::steal(interned(k.c_str())));
    g.spec = opt->state_spec(m.groups.size());
    g.bound = std::move(b);
    m.groups.push_back(std::move(g));
  }
  for (PyObject* s : idle_steps) m.idle_steps.emplace_back(s);
}

TorchStep::~TorchStep() = default;

void TorchStep::restated(size_t group, PyObject* state) {
  Impl& m = *impl_;
  if (group >= m.groups.size()) throw ValueError("TorchStep: no group " + std::to_string(group));
  m.groups[group].spec = m.opt->state_spec(group);
  if (state == m.state.get()) m.snapshot_state();
}

Outcome TorchStep::step(PyObject* param_groups, PyObject* state, void* cuda_stream) {
  Impl& m = *impl_;
  Outcome out;
  if (!m.same_binding(param_groups, state)) {
    out.kind = Outcome::Kind::Rebind;
    return out;
  }
  // 1. Params: any moved since they were bound (p.data = ...) bind again; a resized one no
  // longer fits its state.
  for (const Impl::Tensor& t : m.tensors) {
    if (m.param_unchanged(t)) continue;
    const int64_t n = tensor(t.staged ? t.param.get() : t.work.get()).numel();
    if (!t.dtensor && n != t.numel)
      throw ValueError(t.bound.name + ": was resized since its state was made (" +
                       std::to_string(t.numel) + " elements then, " + std::to_string(n) +
                       " now); nothing was updated");
    out.kind = Outcome::Kind::Rebind;
    return out;
  }
  // 2. Gradients, every one checked before any is rebound.
  if (m.dense_grads)
    for (Impl::Tensor& t : m.tensors) t.next_grad = m.grad_memory(t);
  // 3. Hyperparameters; a group whose state buffers changed goes back to Python.
  for (size_t k = 0; k < m.groups.size(); ++k) {
    Impl::Group& g = m.groups[k];
    static PyObject* const block_key = interned("block_size");
    PyObject* held = PyDict_GetItem(g.synced.get(), block_key);
    Options old_block = held ? to_json(held, "block_size") : Options(nullptr);
    bool blocking = false;
    if (!m.sync(k, PyList_GET_ITEM(param_groups, g.bound.torch_group), &blocking)) continue;
    if (blocking || !same_spec(m.opt->state_spec(k), g.spec)) {
      out.kind = Outcome::Kind::Restate;
      out.group = k;
      out.old_block = old_block;
      return out;
    }
  }
  if (m.dense_grads)
    for (Impl::Tensor& t : m.tensors) {
      if (t.next_grad == t.grad_ptr) continue;
      TensorRef ref;
      ref.data = t.next_grad;
      ref.numel = t.numel;
      ref.dtype = t.bound.grad_dtype;
      ref.memory = t.device.is_cuda() ? Memory::Cuda : Memory::Host;
      m.opt->set_grad(t.bound.group, t.bound.index, ref);
      t.grad_ptr = t.next_grad;
    }
  // 4. The step.
  for (const Impl::Tensor& t : m.tensors)
    if (t.staged) tensor(t.work.get()).copy_(tensor(t.param.get()));
  StepArgs args;
  args.cuda_stream = cuda_stream;
  PyThreadState* thread = PyEval_SaveThread();
  try {
    out.result = m.opt->step(args);
  } catch (...) {
    PyEval_RestoreThread(thread);
    throw;
  }
  PyEval_RestoreThread(thread);
  if (out.result.applied()) {
    for (const Impl::Tensor& t : m.tensors) {
      const at::Tensor& p = tensor(t.param.get());
      if (t.staged) const_cast<at::Tensor&>(p).copy_(tensor(t.work.get()));
      // The kernels wrote the params in place: autograd must see them as changed, as after
      // torch's own in-place updates (a graph saved before the step then refuses backward).
      torch::autograd::impl::bump_version(p);
    }
    for (const Ref& s : m.idle_steps) const_cast<at::Tensor&>(tensor(s.get())).add_(1);
  }
  return out;
}

}  // namespace optfuse::python
