// `optfuse explain`: what the front end does with a graph, and why. For a graph file (`--graph`:
// the textual form graph.h documents, or JSON, docs/graph-json.md) or every param group of a model
// spec (`--spec`): the idioms matched and the host scalars, the canonical graph, the fusion
// clusters in execution order with the reason for every fuse / cut / recompute decision, each
// kernel's key for the target (for a spec, the keys `optfuse warmup` compiles: the same schedules
// by the same rule, --schedules), how Engine::kernel runs it (one kernel, or the clusters in
// order behind one Kernel: engine.h), and with --stmt Halide's lowered statement of each kernel.
// --json prints all of it as one JSON document.
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "optfuse/error.h"
#include "optfuse/optfuse.hpp"
#include "tools/commands.h"
#include "tools/schedules_option.h"
#include "tools/spec.h"
#include "tools/validators.h"

namespace optfuse::tools {
namespace {

using nlohmann::json;

struct ExplainOptions {
  std::string graph, spec, target = "host", schedules;
  bool stmt = false, json = false;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A graph file in the JSON form (docs/graph-json.md) when it ends in .json, else the textual form.
Graph load_graph(const std::string& path) {
  const bool is_json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  try {
    std::string text = read_text(path);
    return is_json ? parse_json(text) : parse(text);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

// The graph as the engine will compile it: idioms rewritten and scalar math moved to host
// scalars (normalize, idioms.h; library graphs are already normal), then partitioned.
json analyse(const Graph& source, const Engine& engine, bool stmt) {
  NormalizedGraph n = normalize(source);
  Partition p = partition(n.graph);
  json host = json::object();
  for (const auto& [name, expr] : n.host_scalars) host[name] = expr.str();
  json clusters = json::array();
  for (const Cluster& c : p.clusters) {
    json jc = {{"kind", c.kind == Cluster::Kind::Kernel ? "kernel" : "opaque"},
               {"name", c.graph.name()},
               {"summary", c.summary}};
    if (c.kind == Cluster::Kind::Kernel) {
      jc["key"] = engine.kernel_key(c.graph);
      if (stmt) jc["stmt"] = engine.lowered_stmt(c.graph);
    }
    clusters.push_back(jc);
  }
  json decisions = json::array();
  for (const FusionDecision& d : p.decisions)
    decisions.push_back({{"verdict", std::string(verdict_name(d.verdict))},
                         {"producer", d.producer},
                         {"consumer", d.consumer},
                         {"reason", d.reason}});
  return {{"name", source.name()},
          {"key", engine.kernel_key(n.graph)},
          {"kernels", p.kernels()},
          {"opaque_calls", p.clusters.size() - static_cast<size_t>(p.kernels())},
          {"idioms", n.idioms},
          {"host_scalars", host},
          {"canonical", print(n.graph)},
          {"clusters", clusters},
          {"decisions", decisions},
          {"text", describe(n) + "\n" + explain(p)}};
}

void print_analysis(const json& a, const Engine& engine, std::ostream& out) {
  out << a["text"].get<std::string>();
  out << "\nkernels (target " << engine.target_string() << "):\n";
  int k = 0;
  for (const json& c : a["clusters"]) {
    if (c["kind"] != "kernel") continue;
    out << "  kernel " << k++ << " \"" << c["name"].get<std::string>() << "\": key "
        << c["key"].get<std::string>() << "\n";
    if (c.contains("stmt"))
      out << "\n--- lowered statement of \"" << c["name"].get<std::string>() << "\" ---\n"
          << c["stmt"].get<std::string>() << "\n";
  }
  // What Engine::kernel returns for this graph (engine.h): the same clusters.
  const int kernels = a["kernels"].get<int>(), opaque = a["opaque_calls"].get<int>();
  if (kernels == 1 && opaque == 0) {
    out << "compiled as 1 kernel (key " << a["key"].get<std::string>() << ")\n";
    return;
  }
  out << "compiled as " << kernels << " kernels";
  if (opaque) out << " and " << opaque << " opaque call(s) (Engine::register_opaque)";
  out << ", run in the order above as one Kernel (key " << a["key"].get<std::string>() << ")\n";
}

json explain_spec(const ModelSpec& spec, const Engine& engine, const ExplainOptions& o) {
  json groups = json::array(), graphs = json::object();
  std::map<std::string, std::string> seen;  // kernel key of a group's graph -> first group
  for (size_t gi = 0; gi < spec.groups.size(); ++gi) {
    for (const GroupGraph& gg : group_graphs(spec, gi)) {
      json kernels = json::array();
      for (const SpecKernel& sk : spec_kernels(spec, gg, engine)) {
        int64_t elements = 0;
        for (size_t pi : sk.params) elements += spec.params[pi].numel;
        const Schedule s =
            sk.size_hint ? engine.schedule_for(gg.graph, sk.size_hint) : engine.options().schedule;
        kernels.push_back({{"key", sk.key},
                           {"tensors", sk.params.size()},
                           {"elements", elements},
                           {"schedule", s.str()}});
      }
      const std::string key = engine.kernel_key(gg.graph);
      // (A group may run two graphs: gradient-centralized or 8-bit state for some tensors.)
      const std::string where =
          "param_groups[" + std::to_string(gi) + "] graph \"" + gg.graph.name() + "\"";
      auto [it, fresh] = seen.emplace(key, where);
      if (fresh) graphs[where] = analyse(gg.graph, engine, o.stmt);
      const ModelSpec::Param& first = spec.params[gg.params.at(0)];
      groups.push_back({{"group", gi},
                        {"graph", gg.graph.name()},
                        {"param_dtype", std::string(dtype_name(first.dtype))},
                        {"grad_dtype", std::string(dtype_name(first.grad_dtype))},
                        {"params", gg.params.size()},
                        {"group_params", spec.groups[gi].params.size()},
                        {"analysis", it->second},
                        {"kernels", kernels}});
    }
  }
  return {
      {"spec", spec.path}, {"model", spec.model}, {"param_groups", groups}, {"analyses", graphs}};
}

void print_spec(const json& j, const Engine& engine) {
  for (const json& g : j["param_groups"]) {
    const std::string group = "param_groups[" + std::to_string(g["group"].get<size_t>()) + "]";
    const std::string where = group + " graph \"" + g["graph"].get<std::string>() + "\"";
    std::cout << "=== " << group << " (" << g["params"] << " of " << g["group_params"]
              << " params): graph \"" << g["graph"].get<std::string>() << "\" ("
              << g["param_dtype"].get<std::string>() << " params, "
              << g["grad_dtype"].get<std::string>() << " grads)\n";
    if (g["analysis"] != where) {
      std::cout << "same graph as " << g["analysis"].get<std::string>() << "\n";
    } else {
      print_analysis(j["analyses"][where], engine, std::cout);
    }
    std::cout << "compiled for this group (what `optfuse warmup` makes):\n";
    for (const json& k : g["kernels"])
      std::cout << "  key " << k["key"].get<std::string>() << "  schedule "
                << k["schedule"].get<std::string>() << "  " << k["tensors"] << " tensors, "
                << k["elements"] << " elements\n";
    std::cout << "\n";
  }
}

void run(const ExplainOptions& o) {
  if (o.graph.empty() == o.spec.empty())
    throw UsageError("explain: give exactly one of --graph and --spec");
  EngineOptions eo;
  eo.target = o.target;
  eo.compile_only = true;  // keys and statements need no runtime and no device
  eo.memory_only = true;   // and no cache
  eo.schedule_db = o.schedules;
  Engine engine(eo);
  json report = {{"target", engine.target_string()},
                 {"schedules", engine.options().schedule_db},
                 {"tuned_schedules", engine.tuned_schedules()}};
  if (!o.graph.empty()) {
    json a = analyse(load_graph(o.graph), engine, o.stmt);
    if (o.json) {
      report["graph"] = o.graph;
      report["analysis"] = a;
      std::cout << report.dump(2) << "\n";
    } else {
      print_analysis(a, engine, std::cout);
    }
    return;
  }
  json spec = explain_spec(load_spec(o.spec), engine, o);
  if (o.json) {
    report.update(spec);
    std::cout << report.dump(2) << "\n";
    return;
  }
  std::cout << "target " << engine.target_string() << ", schedules "
            << (engine.tuned_schedules() ? engine.options().schedule_db
                                         : std::string("defaults (no tuned schedules apply)"))
            << "\n\n";
  print_spec(spec, engine);
}

}  // namespace

void add_explain_command(CLI::App& app) {
  auto o = std::make_shared<ExplainOptions>();
  CLI::App* cmd = app.add_subcommand(
      "explain",
      "Show the idioms matched, the canonical graph, its fusion clusters with the reason for "
      "every decision, kernel keys, and (--stmt) Halide's lowered statements");
  auto* graph = cmd->add_option("--graph", o->graph,
                                "a graph: textual form (graph.h), or JSON (docs/graph-json.md) "
                                "when FILE ends in .json")
                    ->check(CLI::ExistingFile);
  auto* spec = cmd->add_option("--spec", o->spec, "a model spec (examples/specs/README.md)")
                   ->check(CLI::ExistingFile);
  graph->excludes(spec);
  cmd->add_option("--target", o->target, "Halide target for keys and statements")
      ->check(target_list())
      ->capture_default_str();
  cmd->add_flag("--stmt", o->stmt, "also print each kernel's lowered Halide statement");
  cmd->add_flag("--json", o->json, "print everything as one JSON document");
  add_schedules_option(cmd, &o->schedules);
  cmd->callback([o] { run(*o); });
}

}  // namespace optfuse::tools
