#include "tools/spec.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>

#include "optfuse/error.h"

namespace optfuse::tools {
namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(path + ": " + what);
}

// A dtype as torch prints it ("bfloat16", "torch.bfloat16") or as optfuse does ("bf16").
DType read_dtype(const std::string& path, const std::string& where, const nlohmann::json& j,
                 const char* field, DType fallback) {
  if (!j.contains(field)) return fallback;
  const nlohmann::json& v = j[field];
  std::string name = v.is_string() ? v.get<std::string>() : v.dump();
  std::string bare = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
  if (bare == "float32" || bare == "float" || bare == "f32") return DType::F32;
  if (bare == "bfloat16" || bare == "bf16") return DType::BF16;
  if (bare == "float16" || bare == "half" || bare == "f16") return DType::F16;
  bad(path, where + ": " + field + " " + name +
                " is not supported (float32, bfloat16 or float16, as torch names them)");
}

ModelSpec::Param read_param(const std::string& path, const nlohmann::json& j, size_t i) {
  std::string where = "parameters[" + std::to_string(i) + "]";
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string())
    bad(path, where + " must be an object with a string \"name\"");
  ModelSpec::Param p;
  p.name = j["name"].get<std::string>();
  where += " ('" + p.name + "')";
  if (!j.contains("shape") || !j["shape"].is_array())
    bad(path, where + ": \"shape\" must be a list of sizes");
  for (const auto& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      bad(path, where + ": shape entries must be non-negative integers, got " + d.dump());
    p.shape.push_back(d.get<int64_t>());
    p.numel *= p.shape.back();
  }
  p.dtype = read_dtype(path, where, j, "dtype", DType::F32);
  p.grad_dtype = read_dtype(path, where, j, "grad_dtype", p.dtype);
  return p;
}

// `text` parsed as JSON; Error "<path>:<line>:<column>: not valid JSON: <what>" otherwise, the
// position counted from the parser's byte offset (1-based, as editors count).
nlohmann::json parse_json_file(const std::string& path, const std::string& text) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const size_t at = std::min(e.byte > 0 ? e.byte - 1 : 0, text.size());
    const size_t line = 1 + std::count(text.begin(), text.begin() + at, '\n');
    const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
    const size_t column = line_start == std::string::npos || at == 0 ? at + 1 : at - line_start;
    // nlohmann's text after its "[json.exception...] parse error at ...:" prefix, without the
    // bytes it last read (they need not be UTF-8).
    std::string what = e.what();
    if (size_t colon = what.find(": "); colon != std::string::npos) what = what.substr(colon + 2);
    if (size_t last = what.find("; last read"); last != std::string::npos) what.resize(last);
    throw Error(path + ":" + std::to_string(line) + ":" + std::to_string(column) +
                ": not valid JSON: " + what);
  }
}

}  // namespace

ModelSpec load_spec(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open the spec file");
  const std::string text(std::istreambuf_iterator<char>(in), {});
  nlohmann::json j = parse_json_file(path, text);
  if (!j.is_object()) bad(path, "the spec must be a JSON object");
  ModelSpec s;
  s.path = path;
  s.model = j.value("model", std::filesystem::path(path).stem().string());
  if (!j.contains("optimizer") || !j["optimizer"].is_object())
    bad(path, "\"optimizer\" must be an object such as {\"type\": \"adamw\", \"lr\": 1e-3}");
  s.optimizer = j["optimizer"];
  if (!j.contains("parameters") || !j["parameters"].is_array() || j["parameters"].empty())
    bad(path, "\"parameters\" must be a non-empty list of {name, shape, dtype}");
  std::set<std::string> names;
  for (size_t i = 0; i < j["parameters"].size(); ++i) {
    s.params.push_back(read_param(path, j["parameters"][i], i));
    if (!names.insert(s.params.back().name).second)
      bad(path, "parameter '" + s.params.back().name + "' appears twice");
  }
  nlohmann::json groups =
      j.value("param_groups", nlohmann::json::array({nlohmann::json::object({{"match", ""}})}));
  if (!groups.is_array() || groups.empty()) bad(path, "\"param_groups\" must be a non-empty list");
  std::vector<int> owner(s.params.size(), -1);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const nlohmann::json& g = groups[gi];
    std::string where = "param_groups[" + std::to_string(gi) + "]";
    if (!g.is_object()) bad(path, where + " must be an object");
    ModelSpec::Group group;
    group.overrides = g;
    group.overrides.erase("params");
    group.overrides.erase("match");
    std::set<std::string> listed;
    if (g.contains("params")) {
      if (!g["params"].is_array()) bad(path, where + ": \"params\" must be a list of names");
      for (const auto& n : g["params"]) {
        if (!n.is_string() || !names.count(n.get<std::string>()))
          bad(path, where + ": \"params\" names unknown parameter " + n.dump());
        listed.insert(n.get<std::string>());
      }
    }
    std::regex re;
    bool has_match = g.contains("match");
    if (has_match) {
      if (!g["match"].is_string()) bad(path, where + ": \"match\" must be a regular expression");
      try {
        re = std::regex(g["match"].get<std::string>(), std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        bad(path, where + ": \"match\" is not a valid regular expression: " + e.what());
      }
    }
    for (size_t pi = 0; pi < s.params.size(); ++pi)
      if (owner[pi] < 0 && (listed.count(s.params[pi].name) ||
                            (has_match && std::regex_search(s.params[pi].name, re)))) {
        owner[pi] = static_cast<int>(gi);
        group.params.push_back(pi);
      }
    if (group.params.empty())
      bad(path, where +
                    " has no parameters (each group needs \"params\" or a \"match\" that "
                    "selects parameters no earlier group took)");
    s.groups.push_back(std::move(group));
  }
  for (size_t pi = 0; pi < s.params.size(); ++pi)
    if (owner[pi] < 0)
      bad(path, "parameter '" + s.params[pi].name +
                    "' is in no param group (add a group with "
                    "\"match\": \"\" to catch the rest)");
  return s;
}

std::vector<GroupGraph> group_graphs(const ModelSpec& spec, size_t gi) {
  const ModelSpec::Group& g = spec.groups.at(gi);
  try {
    const ModelSpec::Param& first = spec.params.at(g.params.at(0));
    for (size_t pi : g.params) {
      const ModelSpec::Param& p = spec.params[pi];
      if (p.dtype != first.dtype || p.grad_dtype != first.grad_dtype)
        throw Error("parameter '" + p.name + "' (" + std::string(dtype_name(p.dtype)) + ", grad " +
                    std::string(dtype_name(p.grad_dtype)) + ") differs from '" + first.name +
                    "' (" + std::string(dtype_name(first.dtype)) + ", grad " +
                    std::string(dtype_name(first.grad_dtype)) +
                    "); one group has one param dtype and one grad dtype: put it in another group");
    }
    // Each param's graph, as Optimizer::step binds them: with "grad_centralization", the
    // centralized graph for params with >= 2 dims and the plain one for the others; with
    // "state_dtype": "int8", the 8-bit graph for params of at least min_8bit_size elements; for
    // Adafactor, the factored graph for params with >= 2 dims.
    // Params whose graphs print the same share one entry.
    const bool gc = g.overrides.value("grad_centralization",
                                      spec.optimizer.value("grad_centralization", false));
    std::vector<GroupGraph> out;
    std::map<std::string, size_t> index;
    for (size_t pi : g.params) {
      const ModelSpec::Param& p = spec.params[pi];
      Options overrides = g.overrides;
      if (gc && p.shape.size() < 2) overrides["grad_centralization"] = false;
      // (update_graph's numel 0 means a large tensor; an empty param is as small as one.)
      Graph graph = update_graph(spec.optimizer, overrides, first.dtype, first.grad_dtype,
                                 std::max<int64_t>(p.numel, 1), static_cast<int>(p.shape.size()));
      auto [it, fresh] = index.emplace(print(graph), out.size());
      if (fresh) out.push_back({std::move(graph), {}});
      out[it->second].params.push_back(pi);
    }
    return out;
  } catch (const Error& e) {
    throw Error(spec.path + ": param_groups[" + std::to_string(gi) + "]: " + e.what());
  }
}

std::vector<SpecKernel> spec_kernels(const ModelSpec& spec, const GroupGraph& gg,
                                     const Engine& engine) {
  std::vector<SpecKernel> out;
  std::map<std::string, size_t> index;
  std::map<int64_t, std::string> key_of_size;  // a model repeats few sizes over many tensors
  for (size_t pi : gg.params) {
    const int64_t n = engine.tuned_schedules() ? spec.params[pi].numel : 0;
    std::string& key = key_of_size[n];
    if (key.empty()) key = n ? engine.kernel_key(gg.graph, n) : engine.kernel_key(gg.graph);
    auto [it, fresh] = index.emplace(key, out.size());
    if (fresh) out.push_back({key, n, {}});
    out[it->second].params.push_back(pi);
  }
  return out;
}

}  // namespace optfuse::tools
