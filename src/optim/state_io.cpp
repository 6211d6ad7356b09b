// Optimizer state files.
//
// Layout (little-endian):
//   "OPTFUSE-STATE 1\n"                  magic and format version (2 when the header has a
//                                        "step" section: loss scaler, accumulation; a file of an
//                                        optimizer without step options is still version 1, and
//                                        both are read)
//   u64 header_size, header              JSON: type, per group: options, per tensor: numel,
//                                        step, the names of its f32 state buffers ("state"), of
//                                        its bf16 ones ("state_bf16") and f16 ones ("state_f16",
//                                        master_weights false; each when any), of its 8-bit
//                                        codes ("state_u8", with "block_size"; their scales
//                                        "<name>.absmax" are f32 state of one value per block),
//                                        in order, and (when the rule keeps any) its host state
//                                        as exact doubles;
//                                        "step": step options, micro_step, scaler (version 2)
//   data                                 every state buffer, in header order: f32, bf16, f16, u8
//   u64 hi, u64 lo                       XXH3-128 of everything before it
// Written to a temporary file and renamed, so a crash never leaves a half-written file in place.
// Read completely and checked before the optimizer is touched; a file larger than the optimizer's
// params could fill is refused from its size, before anything is allocated.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>

#include "cache/fs.h"
#include "optfuse/error.h"
#include "optfuse/kernel.h"
#include "optim/block_state.h"
#include "optim/device_support.h"
#include "optim/group_plan.h"
#include "optim/optimizer_state.h"
#include "optim/options.h"
#include "optim/precision.h"
#include "optim/state_buffers.h"

namespace optfuse::optim {

namespace {

constexpr char kMagic[] = "OPTFUSE-STATE 1\n";
constexpr char kMagic2[] = "OPTFUSE-STATE 2\n";  // with a "step" section
constexpr size_t kMagicSize = sizeof(kMagic) - 1;
static_assert(sizeof(kMagic) == sizeof(kMagic2));

void append(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}

// The largest state file `impl` can have, from its params alone: every state name the rule may
// keep (known_state_names, which probes its options) at 8 bytes an element plus 8-bit scales,
// and a header of a few KiB per tensor. A larger file is refused before anything is allocated.
uint64_t max_state_file_bytes(const OptimizerState& impl) {
  uint64_t most = (uint64_t{1} << 20) + kMagicSize + 8 + 16;
  for (const auto& g : impl.groups) {
    const uint64_t names = optim::known_state_names(*impl.rule, g.options).size() + 4;
    most += uint64_t{64} << 10;  // the group's options
    for (const auto& t : g.tensors)
      most += (uint64_t{4} << 10) + names * 12 * static_cast<uint64_t>(t.ref.param.numel);
  }
  return most;
}

std::string read_file(const std::string& path, uint64_t max_bytes) {
  std::vector<char> bytes;
  std::string error;
  switch (cache::read_file(path, &bytes, &error, {max_bytes})) {
    case cache::ReadStatus::kOk:
      return std::string(bytes.begin(), bytes.end());
    case cache::ReadStatus::kInvalid:
      throw IoError("cannot read optimizer state file: " + error +
                    " (the most a state file of this optimizer's params can hold)");
    default:
      throw IoError("cannot read optimizer state file: " + error);
  }
}

// The cache's atomic write: a unique temporary file, fsync, rename, fsync of the directory; so
// concurrent saves to one path leave one whole file, and a crash never leaves half of one.
void write_file_atomically(const std::string& path, const std::string& bytes) {
  std::string error;
  if (!cache::atomic_write(path, std::vector<char>(bytes.begin(), bytes.end()), &error))
    throw IoError("cannot write optimizer state file: " + error);
}

}  // namespace

namespace {

// Loaded state moved to the device: every buffer allocated and copied before the optimizer is
// touched, and the copies complete (cuMemcpyHtoD from pageable memory may return before the data
// is on the device) before any step's kernel could read them.
void load_to_device(void* context, std::vector<std::vector<OptimizerState::Tensor>>* groups) {
  for (auto& tensors : *groups)
    for (auto& t : tensors)
      for (auto& [name, buf] : t.state) {
        auto b = std::make_shared<optim::DeviceBuffer>(context, buf.numel(), buf.dtype(),
                                                       "state '" + name + "'");
        b->upload(buf.data());
        buf = optim::StateBuffer::device(std::move(b));
      }
  optim::synchronize(context);
}

// A buffer's bytes appended to `data`: copied from the device for device state (the caller has
// synchronized the context).
void append_buffer(const optim::StateBuffer& buf, std::string* data) {
  if (!buf.on_device()) {
    append(data, buf.data(), buf.bytes());
    return;
  }
  const size_t at = data->size();
  data->resize(at + buf.bytes());
  buf.device_buffer()->download(data->data() + at);
}

}  // namespace

// Error if some state is caller-owned (Optimizer::bind_state): its owner saves and loads it.
static void refuse_caller_owned(const OptimizerState& impl, const char* what) {
  for (size_t gi = 0; gi < impl.groups.size(); ++gi)
    for (size_t ti = 0; ti < impl.groups[gi].tensors.size(); ++ti)
      if (const auto& t = impl.groups[gi].tensors[ti];
          !t.bound_scalars.empty() ||
          std::any_of(t.state.begin(), t.state.end(),
                      [](const auto& s) { return s.second.caller_owned(); }))
        throw Error(OptimizerState::where(gi, ti, t.ref) +
                    ": its state is caller-owned (bind_state): its " + "owner " + what + " it");
}

void save_state(OptimizerState& impl, const std::string& path) {
  refuse_caller_owned(impl, "saves");
  Options header = {{"type", impl.rule->type()}, {"groups", Options::array()}};
  std::string data;
  // Device state is read as the steps queued so far (on any stream) leave it.
  const bool on_device = std::any_of(impl.groups.begin(), impl.groups.end(), [](const auto& g) {
    return std::any_of(g.tensors.begin(), g.tensors.end(), [](const auto& t) {
      return std::any_of(t.state.begin(), t.state.end(),
                         [](const auto& s) { return s.second.on_device(); });
    });
  });
  if (on_device) optim::synchronize(impl.cuda_context);
  for (const auto& g : impl.groups) {
    Options tensors = Options::array();
    for (const auto& t : g.tensors) {
      // The file's order: f32 buffers by name, then bf16 ones, f16 ones, u8 ones and f64 ones.
      Options names = Options::array(), names16 = Options::array(), names_f16 = Options::array(),
              names_u8 = Options::array(), names_f64 = Options::array();
      for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::U8, DType::F64})
        for (const auto& [name, buf] : t.state) {
          if (buf.dtype() != dtype) continue;
          // Between accumulation cycles the buffer holds nothing the next step reads.
          if (name == optim::kGradAccum && impl.control.micro == 0) continue;
          (dtype == DType::F32    ? names
           : dtype == DType::BF16 ? names16
           : dtype == DType::F16  ? names_f16
           : dtype == DType::F64  ? names_f64
                                  : names_u8)
              .push_back(name);
          append_buffer(buf, &data);
        }
      Options entry = {{"numel", t.ref.param.numel}, {"step", t.step}, {"state", names}};
      if (!names16.empty()) entry["state_bf16"] = names16;
      if (!names_f16.empty()) entry["state_f16"] = names_f16;
      if (!names_f64.empty()) entry["state_f64"] = names_f64;
      if (!names_u8.empty()) {
        entry["state_u8"] = names_u8;
        entry["block_size"] = t.state_block;
      }
      if (!t.host.empty()) entry["host"] = t.host;  // JSON doubles print with 17 digits: exact
      tensors.push_back(std::move(entry));
    }
    header["groups"].push_back({{"options", g.options}, {"tensors", tensors}});
  }
  Options step = optim::save_step_state(impl);
  if (!step.is_null()) header["step"] = step;
  std::string text = header.dump();
  uint64_t size = text.size();
  std::string bytes(step.is_null() ? kMagic : kMagic2, kMagicSize);
  append(&bytes, &size, sizeof size);
  bytes += text;
  bytes += data;
  Hash128 h = xxh3_128(bytes);
  append(&bytes, &h.hi, sizeof h.hi);
  append(&bytes, &h.lo, sizeof h.lo);
  write_file_atomically(path, bytes);
}

namespace {

// The parts of a state file, checked against the optimizer but not yet installed.
struct Loaded {
  std::vector<Options> options;
  std::vector<std::vector<OptimizerState::Tensor>> tensors;
  optim::StepControl control;
};

// The row and column state slots of tensor `t` when it runs its rule's factored graph
// (UpdateRule::factored_graph) under `options`; none otherwise.
std::vector<optim::StateSlot> factored_slots(const optim::UpdateRule& rule, const Options& options,
                                             const OptimizerState::Tensor& t) {
  std::vector<optim::StateSlot> slots;
  if (!t.matrix()) return slots;
  if (std::optional<Graph> g = rule.factored_graph(options))
    for (const optim::StateSlot& s : optim::graph_state(*g))
      if (s.rows || s.cols) slots.push_back(s);
  return slots;
}

// Walks the header and the data that follows it; throws Error (any kind) on anything off.
Loaded parse_state(const OptimizerState& impl, const Options& header, const std::string& bytes,
                   size_t pos, size_t data_end) {
  using Impl = OptimizerState;
  const std::string type = header.at("type").get<std::string>();
  if (type != impl.rule->type())
    throw Error("holds state for '" + type + "', this optimizer is '" + impl.rule->type() + "'");
  const Options& groups = header.at("groups");
  if (!groups.is_array() || groups.size() != impl.groups.size())
    throw Error("has " + std::to_string(groups.size()) + " param groups, this optimizer has " +
                std::to_string(impl.groups.size()));
  const optim::HostState known_host = impl.rule->initial_host_state(impl.rule->defaults());
  Loaded out;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Impl::Group& g = impl.groups[gi];
    const Options& fg = groups[gi];
    const std::string where = Impl::where(gi);
    const Options& file_options = fg.at("options");
    // Files written before mixed precision lack its options: they get the defaults.
    Options options = optim::merge(optim::with_precision_defaults(impl.rule->defaults()),
                                   file_options, type, where);
    const Options rule_defaults = impl.rule->defaults();
    for (auto it = rule_defaults.begin(); it != rule_defaults.end(); ++it)
      if (!file_options.contains(it.key())) throw Error(where + ": options are incomplete");
    impl.rule->validate(options, where);
    optim::validate_precision(options, where);
    // (grad_accum is checked against the step options below)
    const std::vector<std::string> known = optim::known_state_names(*impl.rule, options);
    std::vector<ParamRef> refs;
    for (const auto& t : g.tensors) refs.push_back(t.ref);
    optim::tensors_precision(options, refs, gi);  // e.g. stochastic rounding of f32 params
    const Options& ft_list = fg.at("tensors");
    if (!ft_list.is_array() || ft_list.size() != g.tensors.size())
      throw Error(where + " has " + std::to_string(ft_list.size()) + " tensors in the file but " +
                  std::to_string(g.tensors.size()) + " here");
    out.options.push_back(std::move(options));
    out.tensors.emplace_back();
    for (size_t ti = 0; ti < g.tensors.size(); ++ti) {
      const Options& ft = ft_list[ti];
      const ParamRef& ref = g.tensors[ti].ref;
      Impl::Tensor t;
      t.ref = ref;
      t.step = ft.at("step").get<int64_t>();
      t.stream = g.tensors[ti].stream;
      t.sparse = g.tensors[ti].sparse;  // the caller's current gradient, not state
      if (t.step < 0) throw Error(Impl::where(gi, ti, ref) + ": negative step count");
      if (ft.contains("host"))
        for (auto it = ft.at("host").begin(); it != ft.at("host").end(); ++it) {
          if (!known_host.count(it.key()))
            throw Error(Impl::where(gi, ti, ref) + ": '" + it.key() + "' is not " + type +
                        " host state");
          if (!it.value().is_number() || !std::isfinite(it.value().get<double>()))
            throw Error(Impl::where(gi, ti, ref) + ": host state '" + it.key() +
                        "' is not a finite number");
          t.host[it.key()] = it.value().get<double>();
        }
      int64_t numel = ft.at("numel").get<int64_t>();
      if (numel != ref.param.numel)
        throw Error(Impl::where(gi, ti, ref) + " has " + std::to_string(numel) +
                    " elements in the file but " + std::to_string(ref.param.numel) + " here");
      // The values of a buffer: the param's, or for a factored tensor's row and column state
      // one per row and column of its matrices.
      const std::vector<optim::StateSlot> factored =
          factored_slots(*impl.rule, out.options.back(), t);
      auto count_of = [&](const std::string& name) {
        for (const optim::StateSlot& s : factored)
          if (s.name == name) return t.state_numel(s, 0);
        return numel;
      };
      auto check_name = [&](const std::string& name) {
        if (name == optim::kMasterState) {
          if (ref.param.dtype == DType::F32)
            throw Error(Impl::where(gi, ti, ref) + ": the file has master weights (for a 16-bit " +
                        "param) but the param here is f32");
          return;
        }
        if (std::find(known.begin(), known.end(), optim::block_state_of(name)) == known.end())
          throw Error(Impl::where(gi, ti, ref) + ": '" + name + "' is not " + type + " state");
        if (t.state.count(name))
          throw Error(Impl::where(gi, ti, ref) + ": state '" + name + "' appears twice");
      };
      // 8-bit state: its codes' block size, and one scale per block.
      const bool has_codes = ft.contains("state_u8");
      if (has_codes) {
        t.state_block = ft.at("block_size").get<int64_t>();
        if (t.state_block < 1 || t.state_block > kMaxRowStateCols)
          throw Error(Impl::where(gi, ti, ref) + ": block_size " + std::to_string(t.state_block) +
                      " is out of range");
      }
      auto read = [&](auto* buf, int64_t count) {
        size_t n = static_cast<size_t>(count) * sizeof((*buf)[0]);
        if (n > data_end - pos) throw Error("truncated state data");
        buf->resize(static_cast<size_t>(count));
        std::memcpy(buf->data(), bytes.data() + pos, n);
        pos += n;
      };
      for (const auto& entry : ft.at("state")) {
        std::string name = entry.get<std::string>();
        check_name(name);
        const bool scales = optim::block_state_of(name) != name;
        if (scales && !has_codes)
          throw Error(Impl::where(gi, ti, ref) + ": '" + name + "' without 8-bit state");
        std::vector<float> values;
        read(&values, scales ? optim::block_count(numel, t.state_block) : count_of(name));
        t.state.emplace(name, optim::StateBuffer::host(std::move(values)));
      }
      for (DType dtype : {DType::BF16, DType::F16}) {
        const char* key = dtype == DType::BF16 ? "state_bf16" : "state_f16";
        if (!ft.contains(key)) continue;
        for (const auto& entry : ft.at(key)) {
          std::string name = entry.get<std::string>();
          if (name == optim::kMasterState)
            throw Error(Impl::where(gi, ti, ref) + ": master weights must be f32");
          if (optim::block_state_of(name) != name)
            throw Error(Impl::where(gi, ti, ref) + ": 8-bit state's scales '" + name +
                        "' must be f32");
          check_name(name);
          std::vector<uint16_t> bits;
          read(&bits, count_of(name));
          t.state.emplace(name, optim::StateBuffer::host(dtype, std::move(bits)));
        }
      }
      if (has_codes)
        for (const auto& entry : ft.at("state_u8")) {
          std::string name = entry.get<std::string>();
          if (name == optim::kMasterState || optim::block_state_of(name) != name)
            throw Error(Impl::where(gi, ti, ref) + ": '" + name + "' cannot be 8-bit state");
          check_name(name);
          if (!t.state.count(optim::block_scale_name(name)))
            throw Error(Impl::where(gi, ti, ref) + ": 8-bit state '" + name + "' has no scales ('" +
                        optim::block_scale_name(name) + "')");
          std::vector<uint8_t> codes;
          read(&codes, numel);
          t.state.emplace(name, optim::StateBuffer::host(std::move(codes)));
        }
      if (ft.contains("state_f64"))  // f64 params' state
        for (const auto& entry : ft.at("state_f64")) {
          std::string name = entry.get<std::string>();
          if (name == optim::kMasterState || optim::block_state_of(name) != name)
            throw Error(Impl::where(gi, ti, ref) + ": '" + name + "' cannot be f64 state");
          check_name(name);
          std::vector<double> values;
          read(&values, count_of(name));
          t.state.emplace(name, optim::StateBuffer::host(std::move(values)));
        }
      for (const auto& [name, buf] : t.state)  // every scale has its codes
        if (const std::string codes = optim::block_state_of(name);
            codes != name && (!t.state.count(codes) || t.state.at(codes).dtype() != DType::U8))
          throw Error(Impl::where(gi, ti, ref) + ": scales '" + name + "' without 8-bit state '" +
                      codes + "'");
      out.tensors.back().push_back(std::move(t));
    }
  }
  if (pos != data_end) throw Error("has trailing data");
  std::vector<std::vector<bool>> has_accum;
  for (const auto& ts : out.tensors) {
    has_accum.emplace_back();
    for (const auto& t : ts) has_accum.back().push_back(t.state.count(optim::kGradAccum) > 0);
  }
  out.control = optim::load_step_state(impl, header.value("step", Options()), has_accum);
  return out;
}

}  // namespace

void load_state(OptimizerState& impl, const std::string& path) {
  refuse_caller_owned(impl, "loads");
  const std::string bytes = read_file(path, max_state_file_bytes(impl));
  auto bad = [&](const std::string& why) {
    return IoError("optimizer state file '" + path + "': " + why);
  };
  if (bytes.size() < kMagicSize + 8 + 16 ||
      (bytes.compare(0, kMagicSize, kMagic) != 0 && bytes.compare(0, kMagicSize, kMagic2) != 0))
    throw bad("not an optfuse state file (bad magic)");
  Hash128 stored;
  std::memcpy(&stored.hi, bytes.data() + bytes.size() - 16, 8);
  std::memcpy(&stored.lo, bytes.data() + bytes.size() - 8, 8);
  const size_t data_end = bytes.size() - 16;
  if (xxh3_128(std::string_view(bytes.data(), data_end)) != stored)
    throw bad("checksum mismatch (file is corrupt or truncated)");
  uint64_t header_size;
  std::memcpy(&header_size, bytes.data() + kMagicSize, 8);
  size_t pos = kMagicSize + 8;
  if (header_size > data_end - pos) throw bad("header size out of range");
  Options header = Options::parse(bytes.substr(pos, header_size), nullptr, false);
  if (header.is_discarded() || !header.is_object()) throw bad("header is not valid JSON");

  // Build everything aside; install only when the whole file has been checked.
  Loaded loaded;
  try {
    loaded = parse_state(impl, header, bytes, pos + header_size, data_end);
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("malformed header: ") + e.what());
  } catch (const Error& e) {
    throw bad(e.what());
  }
  for (size_t gi = 0; gi < loaded.options.size(); ++gi)  // e.g. a file's "state_dtype": "bf16"
    try {
      optim::check_device_group(impl.memory, *impl.rule, loaded.options[gi],
                                OptimizerState::where(gi));
    } catch (const Error& e) {
      throw bad(e.what());
    }
  if (impl.memory == Memory::Cuda) {
    if (!impl.cuda_context)
      throw Error("optimizer state file '" + path + "': cannot be loaded onto device tensors by " +
                  "an optimizer of a compile-only engine (it has no CUDA context)");
    optim::synchronize(impl.cuda_context);  // no queued step still uses the buffers replaced
    load_to_device(impl.cuda_context, &loaded.tensors);
  }
  for (size_t gi = 0; gi < impl.groups.size(); ++gi) {
    impl.groups[gi].options = std::move(loaded.options[gi]);
    impl.groups[gi].tensors = std::move(loaded.tensors[gi]);
  }
  impl.control = std::move(loaded.control);
}

}  // namespace optfuse::optim
