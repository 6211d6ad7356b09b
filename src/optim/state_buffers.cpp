#include "optim/state_buffers.h"

#include <algorithm>

#include "optfuse/error.h"
#include "optim/block_state.h"
#include "optim/device_support.h"
#include "optim/grad_prologue.h"

namespace optfuse {

int64_t optim::OptimizerState::Tensor::state_numel(const optim::StateSlot& s, int64_t block) const {
  const int64_t n = ref.param.numel;
  if (s.rows && block > 0) return optim::block_count(n, block);
  const int64_t across = s.rows ? matrix_cols() : s.cols ? matrix_rows() : 1;
  return across > 0 ? n / across : 0;
}

std::vector<int64_t> optim::OptimizerState::Tensor::state_shape(const optim::StateSlot& s,
                                                                int64_t block) const {
  if (s.rows && block > 0) return {state_numel(s, block)};
  std::vector<int64_t> shape = ref.param.shape;
  if (shape.empty()) shape = {ref.param.numel};
  if ((s.rows || s.cols) && matrix()) shape[shape.size() - (s.rows ? 1 : 2)] = 1;
  return shape;
}

}  // namespace optfuse

namespace optfuse::optim {

using Impl = optim::OptimizerState;

namespace {

// `v` = `count` copies of `value`, in memory that asks for huge pages before its first write
// where huge_pages_for_new_state() says so (optfuse/optim.h).
template <typename T>
void filled(std::vector<T>* v, size_t count, T value) {
  v->clear();
  v->reserve(count);  // (allocated, not written)
  if (huge_pages_for_new_state(count * sizeof(T))) advise_huge_pages(v->data(), count * sizeof(T));
  v->assign(count, value);
}

// The precision of `count` tensors, the i-th's dtypes given by ref(i). Runs at every step, so a
// tensor whose dtypes equal tensor 0's costs two compares (tensor 0's checks cover it); only a
// tensor at fault gets its name built.
template <typename RefAt>
Precision precision_of(const Options& h, size_t count, const RefAt& ref, size_t group) {
  const ParamRef& first = ref(0);
  for (size_t i = 0; i < count; ++i) {
    const ParamRef& r = ref(i);
    if (i > 0 && r.param.dtype == first.param.dtype && r.grad.dtype == first.grad.dtype) continue;
    const std::string who = Impl::where(group, i, r);
    check_tensor_dtype(r.param.dtype, "param", who);
    check_tensor_dtype(r.grad.dtype, "grad", who);
    auto differs = [&](const char* what, DType got, DType want) {
      if (got != want)
        throw Error(who + ": " + what + " dtype " + std::string(dtype_name(got)) +
                    " differs from the group's " + std::string(dtype_name(want)) + " (tensor 0)" +
                    "; one group has one param dtype and one grad dtype: put it in another group");
    };
    differs("param", r.param.dtype, first.param.dtype);
    differs("grad", r.grad.dtype, first.grad.dtype);
  }
  return group_precision(h, first.param.dtype, first.grad.dtype, Impl::where(group));
}

}  // namespace

Precision tensors_precision(const Options& h, const std::vector<ParamRef>& refs, size_t group) {
  return precision_of(
      h, refs.size(), [&](size_t i) -> const ParamRef& { return refs.at(i); }, group);
}

Precision group_precision(const Impl::Group& g, size_t group) {
  return group_precision(g.options, g, group);
}

Precision group_precision(const Options& h, const Impl::Group& g, size_t group) {
  return precision_of(
      h, g.tensors.size(), [&](size_t i) -> const ParamRef& { return g.tensors.at(i).ref; }, group);
}

namespace {

// Whether `s` is bound by the caller (Optimizer::bind_state) in the dtype the step needs; Error
// if bound in another.
bool bound_as(const Impl::Tensor& t, const StateSlot& s, const std::string& who) {
  auto b = t.state.find(s.name);
  if (b == t.state.end() || !b->second.caller_owned()) return false;
  if (b->second.dtype() != s.dtype)
    throw Error(who + ": the caller's state '" + s.name + "' is " +
                std::string(dtype_name(b->second.dtype())) + " but the step needs " +
                std::string(dtype_name(s.dtype)) + " (state_dtype changed?): bind a new buffer");
  return true;
}

}  // namespace

namespace {

// `values` as 8-bit state `name` of block `block`: the codes and the scales.
void add_blocked(Impl::Tensor& t, const std::string& name, const std::vector<float>& values,
                 int64_t block, std::vector<PendingState>* out) {
  const auto n = static_cast<int64_t>(values.size());
  PendingState codes{&t, name, DType::U8, {}, {}, {}, nullptr, {}};
  PendingState scales{&t, block_scale_name(name), DType::F32, {}, {}, {}, nullptr, {}};
  codes.u8.resize(values.size());
  scales.f32.resize(static_cast<size_t>(block_count(n, block)));
  encode_blocks(values.data(), n, block, block_map(name), codes.u8.data(), scales.f32.data());
  codes.block = block;
  out->push_back(std::move(codes));
  out->push_back(std::move(scales));
}

}  // namespace

std::vector<float> state_values_f32(const Impl::Tensor& t, const std::string& name,
                                    const StateBuffer& held) {
  if (held.dtype() != DType::U8) return held.to_f32();
  auto scale = t.state.find(block_scale_name(name));
  if (scale == t.state.end() || t.state_block <= 0)
    internal_error("8-bit state '" + name + "' has no scales");
  const std::vector<float> absmax = scale->second.to_f32();
  std::vector<float> x(static_cast<size_t>(held.numel()));
  decode_blocks(static_cast<const uint8_t*>(held.data()), absmax.data(), held.numel(),
                t.state_block, block_map(name), x.data());
  return x;
}

void plan_state(const UpdateRule& rule, const Impl::Group& g, Impl::Tensor& t,
                const std::string& who, std::vector<PendingState>* out) {
  const size_t n = static_cast<size_t>(t.ref.param.numel);
  const KernelPlan& kp = g.plan_of(t);
  const int64_t block = g.block_of(t);
  for (const StateSlot& s : kp.state) {
    if (s.name == kGradAccum) continue;  // made by the accumulation micro-steps (step_control.cpp)
    if (s.rows && block > 0) {  // made with its codes; a caller's must have one scale per block
      auto b = t.state.find(s.name);
      const int64_t want = block_count(t.ref.param.numel, block);
      if (b != t.state.end() && b->second.caller_owned() && b->second.numel() != want)
        throw Error(who + ": the caller's state '" + s.name + "' has " +
                    std::to_string(b->second.numel()) + " scales but blocks of " +
                    std::to_string(block) + " need " + std::to_string(want) +
                    " (block_size changed?): bind new buffers");
      continue;
    }
    if (s.dtype == DType::U8) {  // codes and scales: both the caller's, or both the optimizer's
      auto scale = t.state.find(block_scale_name(s.name));
      auto codes = t.state.find(s.name);
      const bool codes_bound = codes != t.state.end() && codes->second.caller_owned();
      const bool scales_bound = scale != t.state.end() && scale->second.caller_owned();
      if (codes_bound != scales_bound)
        throw Error(who + ": the caller bound '" + (codes_bound ? s.name : scale->first) +
                    "' but not '" + (codes_bound ? block_scale_name(s.name) : s.name) +
                    "': 8-bit state is bound as codes and scales together");
    }
    if (bound_as(t, s, who)) {
      if (s.dtype == DType::U8 && t.state_block != block)
        throw Error(who + ": the caller's 8-bit state '" + s.name + "' has blocks of " +
                    std::to_string(t.state_block) + ", the step needs " + std::to_string(block) +
                    " (block_size changed?): bind new buffers");
      continue;
    }
    auto held = t.state.find(s.name);
    const bool held_here = held != t.state.end();
    if (held_here && held->second.dtype() == s.dtype &&
        (s.dtype != DType::U8 || t.state_block == block))
      continue;
    if (s.dtype == DType::U8) {  // new, or held in another dtype or block size
      std::vector<float> values =
          held_here ? state_values_f32(t, s.name, held->second)
                    : std::vector<float>(
                          n, static_cast<float>(rule.initial_state_value(g.options, s.name)));
      add_blocked(t, s.name, values, block, out);
      continue;
    }
    PendingState p{&t, s.name, s.dtype, {}, {}, {}, nullptr, {}};
    const size_t count = static_cast<size_t>(t.state_numel(s, block));  // (row or column state)
    if (held_here && held->second.numel() != static_cast<int64_t>(count))
      throw Error(who + ": state '" + s.name + "' has " + std::to_string(held->second.numel()) +
                  " values but the step needs " + std::to_string(count));
    if (s.dtype == DType::F64) {  // f64 params' state: new (state_dtype is f32 for them)
      p.f64.assign(count, rule.initial_state_value(g.options, s.name));
      if (held_here) {
        std::vector<float> held_values = state_values_f32(t, s.name, held->second);
        p.f64.assign(held_values.begin(), held_values.end());
      }
    } else if (s.name == kMasterState) {
      p.f32 = widen_to_f32(t.ref.param.data, t.ref.param.dtype, t.ref.param.numel);
    } else if (held_here) {  // held in another dtype (state_dtype changed)
      std::vector<float> wide = state_values_f32(t, s.name, held->second);
      if (s.dtype == DType::F32) {
        p.f32 = std::move(wide);
      } else {
        p.bf16.resize(wide.size());
        for (size_t i = 0; i < wide.size(); ++i) p.bf16[i] = to_16bit(wide[i], s.dtype);
      }
    } else {
      auto fill = static_cast<float>(rule.initial_state_value(g.options, s.name));
      if (s.dtype == DType::F32)
        filled(&p.f32, count, fill);
      else
        filled(&p.bf16, count, to_16bit(fill, s.dtype));
    }
    out->push_back(std::move(p));
  }
  // 8-bit state the step does not read (e.g. amsgrad's, turned off) follows the block size too,
  // so that every 8-bit buffer of a tensor has the one block size Tensor::state_block records.
  if (t.state_block == 0 || t.state_block == block) return;
  for (const auto& [name, buf] : t.state) {
    if (buf.dtype() != DType::U8 || buf.caller_owned() || kp.has_state(name)) continue;
    std::vector<float> values = state_values_f32(t, name, buf);
    if (block > 0) {
      add_blocked(t, name, values, block, out);
    } else {
      PendingState p{&t, name, DType::F32, std::move(values), {}, {}, nullptr, {}};
      out->push_back(std::move(p));
    }
  }
}

namespace {

// The master copy of a 16-bit device param, made by a kernel on the step's stream (ordered before
// the update that reads it): no copy through the host.
void copy_master_on_device(const Impl& impl, const Impl::Tensor& t, DeviceBuffer& master) {
  auto k = impl.engine->kernel(master_copy_graph(t.ref.param.dtype));
  KernelCall call;
  for (const auto& in : k->signature().inputs)
    call.inputs.push_back(in.role == Role::Param ? t.ref.param.data : master.data());
  call.outputs.assign(1, master.data());
  call.n = t.ref.param.numel;
  call.device = true;
  call.cuda_stream = impl.cuda_stream;
  k->run(call);
}

}  // namespace

void plan_device_state(const Impl& impl, const Impl::Group& g, Impl::Tensor& t,
                       const std::string& who, std::vector<PendingState>* out) {
  for (const StateSlot& s : g.plan_of(t).state) {
    if (s.name == kGradAccum) continue;  // (accumulation is refused on the device)
    if (bound_as(t, s, who)) continue;
    if (auto it = t.state.find(s.name); it != t.state.end()) {
      // (bf16 state is refused on the device, so state_dtype cannot have changed.)
      if (it->second.dtype() != s.dtype)
        internal_error(who + ": device state '" + s.name + "' changed dtype");
      continue;
    }
    PendingState p{&t, s.name, s.dtype, {}, {}, {}, nullptr, {}, 0};
    p.device = std::make_shared<DeviceBuffer>(impl.cuda_context, t.ref.param.numel, s.dtype,
                                              who + ": state '" + s.name + "'");
    if (s.name == kMasterState)
      copy_master_on_device(impl, t, *p.device);
    else
      p.device->fill(impl.rule->initial_state_value(g.options, s.name), impl.cuda_stream);
    out->push_back(std::move(p));
  }
}

void install(PendingState& p) {
  Impl::Tensor& t = *p.tensor;
  auto held = t.state.find(p.name);
  const bool was_8bit = held != t.state.end() && held->second.dtype() == DType::U8;
  StateBuffer b = p.device                ? StateBuffer::device(std::move(p.device))
                  : p.dtype == DType::F32 ? StateBuffer::host(std::move(p.f32))
                  : p.dtype == DType::F64 ? StateBuffer::host(std::move(p.f64))
                  : p.dtype == DType::U8  ? StateBuffer::host(std::move(p.u8))
                                          : StateBuffer::host(p.dtype, std::move(p.bf16));
  t.state.insert_or_assign(p.name, std::move(b));
  if (p.dtype == DType::U8) t.state_block = p.block;
  if (!was_8bit || p.dtype == DType::U8) return;
  // 8-bit state converted to f32 or 16 bits: its scales go, and with the last 8-bit buffer so
  // does the block size.
  t.state.erase(block_scale_name(p.name));
  if (std::none_of(t.state.begin(), t.state.end(),
                   [](const auto& s) { return s.second.dtype() == DType::U8; }))
    t.state_block = 0;
}

void* state_pointer(Impl::Tensor& t, const std::string& name, DType dtype) {
  const StateBuffer& b = t.state.at(name);
  if (b.dtype() != dtype) internal_error("state '" + name + "' has another dtype");
  return b.data();
}

int64_t bytes_per_step(int64_t numel, const Precision& p, int64_t states, int64_t block) {
  int64_t param = p.has_master() ? 4 + 4 + int64_t(dtype_size(p.param))  // master r+w, param w
                                 : 2 * int64_t(dtype_size(p.param));     // param r+w
  if (block > 0)  // codes read and written, and one f32 scale per block read and written
    return numel * (param + int64_t(dtype_size(p.grad)) + 2 * states) +
           2 * states * 4 * block_count(numel, block);
  int64_t per_element =
      param + int64_t(dtype_size(p.grad)) + 2 * states * int64_t(dtype_size(p.state));
  return numel * per_element;
}

}  // namespace optfuse::optim
