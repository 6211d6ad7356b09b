// The per-step driver (torch_step.h), reading torch tensors through torch_tensors.h.
#include "torch_step.h"

#include <ATen/core/DimVector.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/TensorImpl.h>
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

// `a` == `b`, element by element (IntArrayRef's == calls memcmp, which costs more than the
// one to four dims a param has).
bool same_dims(at::IntArrayRef a, at::IntArrayRef b) {
  if (a.size() != b.size()) return false;
  for (size_t d = 0; d < b.size(); ++d)
    if (a[d] != b[d]) return false;
  return true;
}

// Asks for the cache lines of the `bytes` at `p` (an object from malloc may straddle a line).
void prefetch(const void* p, size_t bytes) {
  const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
  for (uintptr_t a = first; a < reinterpret_cast<uintptr_t>(p) + bytes; a += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(a));
}

// The AutogradMeta behind a tensor's autograd_meta() (torch's only kind), or null.
torch::autograd::AutogradMeta* meta_of(const c10::TensorImpl* t) {
  return static_cast<torch::autograd::AutogradMeta*>(t->autograd_meta());
}

c10::TensorImpl* grad_impl(const c10::TensorImpl* param) {
  const torch::autograd::AutogradMeta* meta = meta_of(param);
  return meta ? meta->grad_.unsafeGetTensorImpl() : nullptr;
}

}  // namespace

struct TorchStep::Impl {
  // A bound param and what the last check found.
  struct Tensor {
    BoundParam bound;
    Ref param, work;
    // torch's tensors behind them, held so that a step reads no Python object: the param (its
    // gradient, its autograd version) and the tensor whose layout is checked (the param if
    // staged, else the work tensor the kernels update).
    at::Tensor self, checked;
    c10::TensorImpl* impl = nullptr;  // self's
    bool dtensor = false, staged = false;
    // The param's memory and layout when bound (for a staged one, the param's own; else the
    // work tensor's, which the kernels update).
    const void* data = nullptr;
    at::DimVector sizes, strides;  // inline: no miss of their own
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
  // The torch params whose having a gradient same_binding checks (the others' the per-tensor
  // check reads anyway), with what they had when bound.
  std::vector<std::pair<PyObject*, bool>> grad_watch;
  std::vector<const c10::TensorImpl*> impls;  // tensors[i].impl, packed for prefetch_ahead
  std::vector<Group> groups;
  std::vector<Ref> idle_steps;
  bool dense_grads = true;
  Ref param_groups, state;
  std::vector<TorchGroup> torch_groups;
  std::vector<std::pair<Ref, Ref>> state_entries;  // optimizer.state in its order

  void snapshot_state();
  bool same_binding(PyObject* pg, PyObject* st) const;
  void prefetch_ahead(size_t i) const;
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
    for (size_t k = 0; k < tg.params.size(); ++k)
      if (PyList_GET_ITEM(ps, k) != tg.params[k].get()) return false;
  }
  for (const auto& [p, had] : grad_watch)
    if (tensor(p).grad().defined() != had) return false;
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
  const at::Tensor& p = t.checked;
  return p.data_ptr() == t.data && same_dims(p.sizes(), t.sizes) &&
         same_dims(p.strides(), t.strides) && p.scalar_type() == t.dtype && p.device() == t.device;
}

// Torch's metadata for a param sits behind a chain of pointers (the param's TensorImpl, its
// AutogradMeta, the gradient's TensorImpl, the gradient's StorageImpl), and the kernels' pass
// over memory evicts all of it between steps: unaided, each tensor's check waits for those
// misses one after another. Checking tensor i, this asks for each link of the chain a few
// tensors ahead, each from the one fetched a stage before (it reads pointers only out of live
// torch objects; a prefetch itself never faults).
void TorchStep::Impl::prefetch_ahead(size_t i) const {
  const size_t n = impls.size();
  if (i + 16 < n) prefetch(impls[i + 16], sizeof(c10::TensorImpl));
  if (i + 11 < n) {
    const c10::TensorImpl* p = impls[i + 11];
    if (const torch::autograd::AutogradMeta* meta = meta_of(p))
      prefetch(&meta->grad_, sizeof(meta->grad_));
    prefetch(p->unsafe_storage().unsafeGetStorageImpl(), sizeof(c10::StorageImpl));
  }
  if (i + 6 < n) prefetch(grad_impl(impls[i + 6]), sizeof(c10::TensorImpl));
  if (i + 2 < n)
    if (const c10::TensorImpl* g = grad_impl(impls[i + 2]))
      prefetch(g->unsafe_storage().unsafeGetStorageImpl(), sizeof(c10::StorageImpl));
}

void* TorchStep::Impl::grad_memory(Tensor& t) {
  // The common case in full, cheaply: a direct param's gradient in the param's own layout, as
  // bound, with storage that reaches its last element. Anything else takes kernel_grad's
  // general check (and its messages).
  if (!t.dtensor && !t.staged) {
    const at::Tensor& g = t.impl->grad();
    if (g.defined() && g.layout() == at::kStrided && g.scalar_type() == t.grad_type &&
        g.device() == t.device && same_dims(g.sizes(), t.sizes) &&
        same_dims(g.strides(), t.strides) && g.has_storage()) {
      const c10::StorageImpl* s = g.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
      if (s && s->data() != nullptr &&
          (g.storage_offset() + t.numel) * static_cast<int64_t>(g.itemsize()) <=
              static_cast<int64_t>(s->nbytes())) {
        t.grad_copy = at::Tensor();
        return g.data_ptr();
      }
    }
  }
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
    t.self = tensor(b.param);
    t.impl = t.self.unsafeGetTensorImpl();
    t.checked = tensor(t.staged ? b.param : b.work);
    const at::Tensor& p = t.checked;
    t.data = p.data_ptr();
    t.sizes = at::DimVector(p.sizes());
    t.strides = at::DimVector(p.strides());
    t.dtype = p.scalar_type();
    t.device = p.device();
    t.numel = p.numel();
    t.grad_type = scalar_type(b.grad_dtype);
    t.grad_ptr = b.grad_ptr;
    t.bound = std::move(b);
    m.impls.push_back(t.impl);
    m.tensors.push_back(std::move(t));
  }
  // A bound param's gradient is read by every step's check; the others' only for whether they
  // gained one (or, for SparseAdam, whose gradients Python binds, every param's).
  std::vector<PyObject*> checked;
  if (dense_grads)
    for (const Impl::Tensor& t : m.tensors) checked.push_back(t.param.get());
  std::sort(checked.begin(), checked.end());
  for (const Impl::TorchGroup& tg : m.torch_groups)
    for (size_t k = 0; k < tg.params.size(); ++k)
      if (!std::binary_search(checked.begin(), checked.end(), tg.params[k].get()))
        m.grad_watch.emplace_back(tg.params[k].get(), tg.has_grad[k]);
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
  // The copies of staged params and the idle step counters are no part of autograd's graph.
  at::NoGradGuard no_grad;
  Outcome out;
  if (!m.same_binding(param_groups, state)) {
    out.kind = Outcome::Kind::Rebind;
    return out;
  }
  // 1-2. Each param, then its gradient, in one pass over the tensors: a param that moved since
  // it was bound (p.data = ...) or lost its gradient binds again; a resized one no longer fits
  // its state. Every gradient is checked before any is rebound.
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    m.prefetch_ahead(i);
    Impl::Tensor& t = m.tensors[i];
    if (!m.param_unchanged(t)) {
      const int64_t n = t.checked.numel();
      if (!t.dtensor && n != t.numel)
        throw ValueError(t.bound.name + ": was resized since its state was made (" +
                         std::to_string(t.numel) + " elements then, " + std::to_string(n) +
                         " now); nothing was updated");
      out.kind = Outcome::Kind::Rebind;
      return out;
    }
    if (!m.dense_grads) continue;
    if (!t.impl->grad().defined()) {
      out.kind = Outcome::Kind::Rebind;
      return out;
    }
    t.next_grad = m.grad_memory(t);
  }
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
    const size_t n = m.tensors.size();
    for (size_t i = 0; i < n; ++i) {
      // The kernels' pass evicted the params' TensorImpls: ask for them a few tensors ahead.
      if (i + 6 < n) {
        const c10::VariableVersion& v = m.impls[i + 6]->version_counter();
        prefetch(&v, sizeof(v));
      }
      Impl::Tensor& t = m.tensors[i];
      if (t.staged) t.self.copy_(tensor(t.work.get()));
      // The kernels wrote the params in place: autograd must see them as changed, as after
      // torch's own in-place updates (a graph saved before the step then refuses backward).
      torch::autograd::impl::bump_version(t.self);
    }
    for (const Ref& s : m.idle_steps) const_cast<at::Tensor&>(tensor(s.get())).add_(1);
  }
  return out;
}

}  // namespace optfuse::python
