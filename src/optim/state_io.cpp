// Optimizer state files.
//
// Layout (little-endian):
//   "OPTFUSE-STATE 1\n"                  magic and format version
//   u64 header_size, header              JSON: type, per group: options, per tensor: numel,
//                                        step, the names of its state buffers, in order, and
//                                        (when the rule keeps any) its host state as exact doubles
//   f32 data                             every state buffer, in header order
//   u64 hi, u64 lo                       XXH3-128 of everything before it
// Written to a temporary file and renamed, so a crash never leaves a half-written file in place.
// Read completely and checked before the optimizer is touched.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "optfuse/error.h"
#include "optim/optimizer_impl.h"
#include "optim/options.h"

namespace optfuse {

namespace {

constexpr char kMagic[] = "OPTFUSE-STATE 1\n";
constexpr size_t kMagicSize = sizeof(kMagic) - 1;

void append(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open optimizer state file '" + path + "'");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw IoError("cannot write optimizer state file '" + tmp + "'");
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw IoError("failed writing optimizer state file '" + tmp + "' (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw IoError("cannot rename '" + tmp + "' to '" + path + "'");
  }
}

}  // namespace

void Optimizer::save_state(const std::string& path) const {
  Options header = {{"type", impl_->rule->type()}, {"groups", Options::array()}};
  std::string data;
  for (const auto& g : impl_->groups) {
    Options tensors = Options::array();
    for (const auto& t : g.tensors) {
      Options names = Options::array();
      for (const auto& [name, buf] : t.state) {
        names.push_back(name);
        append(&data, buf.data(), buf.size() * sizeof(float));
      }
      Options entry = {{"numel", t.ref.param.numel}, {"step", t.step}, {"state", names}};
      if (!t.host.empty()) entry["host"] = t.host;  // JSON doubles print with 17 digits: exact
      tensors.push_back(std::move(entry));
    }
    header["groups"].push_back({{"options", g.options}, {"tensors", tensors}});
  }
  std::string text = header.dump();
  uint64_t size = text.size();
  std::string bytes(kMagic, kMagicSize);
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
  std::vector<std::vector<Optimizer::Impl::Tensor>> tensors;
};

// Walks the header and the data that follows it; throws Error (any kind) on anything off.
Loaded parse_state(const Optimizer::Impl& impl, const Options& header, const std::string& bytes,
                   size_t pos, size_t data_end) {
  using Impl = Optimizer::Impl;
  const std::string type = header.at("type").get<std::string>();
  if (type != impl.rule->type())
    throw Error("holds state for '" + type + "', this optimizer is '" + impl.rule->type() + "'");
  const Options& groups = header.at("groups");
  if (!groups.is_array() || groups.size() != impl.groups.size())
    throw Error("has " + std::to_string(groups.size()) + " param groups, this optimizer has " +
                std::to_string(impl.groups.size()));
  const std::vector<std::string> known = impl.rule->all_state_names();
  const optim::HostState known_host = impl.rule->initial_host_state();
  Loaded out;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Impl::Group& g = impl.groups[gi];
    const Options& fg = groups[gi];
    const std::string where = Impl::where(gi);
    const Options& file_options = fg.at("options");
    Options options = optim::merge(impl.rule->defaults(), file_options, type, where);
    if (file_options.size() != options.size()) throw Error(where + ": options are incomplete");
    impl.rule->validate(options, where);
    const Options& ft_list = fg.at("tensors");
    if (!ft_list.is_array() || ft_list.size() != g.tensors.size())
      throw Error(where + " has " + std::to_string(ft_list.size()) + " tensors in the file but " +
                  std::to_string(g.tensors.size()) + " here");
    out.options.push_back(std::move(options));
    out.tensors.emplace_back();
    for (size_t ti = 0; ti < g.tensors.size(); ++ti) {
      const Options& ft = ft_list[ti];
      const ParamRef& ref = g.tensors[ti].ref;
      Impl::Tensor t{ref, ft.at("step").get<int64_t>(), {}, {}, nullptr};
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
      for (const auto& entry : ft.at("state")) {
        std::string name = entry.get<std::string>();
        if (std::find(known.begin(), known.end(), name) == known.end())
          throw Error(Impl::where(gi, ti, ref) + ": '" + name + "' is not " + type + " state");
        size_t n = static_cast<size_t>(numel) * sizeof(float);
        if (n > data_end - pos) throw Error("truncated state data");
        std::vector<float> buf(static_cast<size_t>(numel));
        std::memcpy(buf.data(), bytes.data() + pos, n);
        pos += n;
        if (!t.state.emplace(name, std::move(buf)).second)
          throw Error(Impl::where(gi, ti, ref) + ": state '" + name + "' appears twice");
      }
      out.tensors.back().push_back(std::move(t));
    }
  }
  if (pos != data_end) throw Error("has trailing data");
  return out;
}

}  // namespace

void Optimizer::load_state(const std::string& path) {
  const std::string bytes = read_file(path);
  auto bad = [&](const std::string& why) {
    return IoError("optimizer state file '" + path + "': " + why);
  };
  if (bytes.size() < kMagicSize + 8 + 16 || bytes.compare(0, kMagicSize, kMagic) != 0)
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
    loaded = parse_state(*impl_, header, bytes, pos + header_size, data_end);
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("malformed header: ") + e.what());
  } catch (const Error& e) {
    throw bad(e.what());
  }
  for (size_t gi = 0; gi < impl_->groups.size(); ++gi) {
    impl_->groups[gi].options = std::move(loaded.options[gi]);
    impl_->groups[gi].tensors = std::move(loaded.tensors[gi]);
  }
}

}  // namespace optfuse
