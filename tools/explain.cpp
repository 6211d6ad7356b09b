// `optfuse explain`: what the front end does with a graph, and why. For a graph file (`--graph`:
// the textual form graph.h documents, or JSON, docs/graph-json.md) or every param group of a model
// spec (`--spec`): the idioms matched and the host scalars, the canonical graph, the fusion clusters in execution order with the reason for every fuse / cut /
// recompute decision, each kernel's key for the target, and with --stmt Halide's lowered
// statement of each kernel.
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "optfuse/error.h"
#include "optfuse/optfuse.hpp"
#include "tools/commands.h"
#include "tools/spec.h"

namespace optfuse::tools {
namespace {

struct ExplainOptions {
  std::string graph, spec, target = "host";
  bool stmt = false;
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
  const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  try {
    std::string text = read_text(path);
    return json ? parse_json(text) : parse(text);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

// The graph as the engine will compile it: idioms rewritten and scalar math moved to host
// scalars (normalize, idioms.h; library graphs are already normal), then partitioned.
void explain_graph(const Graph& source, const Engine& engine, bool stmt, std::ostream& out) {
  NormalizedGraph n = normalize(source);
  out << describe(n) << "\n";
  const Graph& g = n.graph;
  Partition p = partition(g);
  out << explain(p);
  out << "\nkernels (target " << engine.target_string() << "):\n";
  int k = 0;
  for (const Cluster& c : p.clusters) {
    if (c.kind != Cluster::Kind::Kernel) continue;
    out << "  kernel " << k++ << " \"" << c.graph.name() << "\": key " << engine.kernel_key(c.graph)
        << "\n";
    if (stmt) out << "\n--- lowered statement of \"" << c.graph.name() << "\" ---\n"
                  << engine.lowered_stmt(c.graph) << "\n";
  }
}

void run(const ExplainOptions& o) {
  if (o.graph.empty() == o.spec.empty()) throw Error("explain: give exactly one of --graph and --spec");
  EngineOptions eo;
  eo.target = o.target;
  eo.compile_only = true;  // keys and statements need no runtime and no device
  Engine engine(eo);
  if (!o.graph.empty()) return explain_graph(load_graph(o.graph), engine, o.stmt, std::cout);
  ModelSpec spec = load_spec(o.spec);
  std::map<std::string, std::string> seen;  // kernel key of a group's graph -> first group
  for (size_t gi = 0; gi < spec.groups.size(); ++gi) {
    for (const GroupGraph& gg : group_graphs(spec, gi)) {
      const Graph& g = gg.graph;
      std::string key = engine.kernel_key(g);
      std::cout << "=== param_groups[" << gi << "] (" << gg.params.size() << " of "
                << spec.groups[gi].params.size() << " params): graph \"" << g.name() << "\"\n";
      auto [it, fresh] = seen.emplace(key, "param_groups[" + std::to_string(gi) + "]");
      if (!fresh) {
        std::cout << "same kernel as " << it->second << " (key " << key << ")\n\n";
        continue;
      }
      explain_graph(g, engine, o.stmt, std::cout);
      std::cout << "\n";
    }
  }
}

}  // namespace

void add_explain_command(CLI::App& app) {
  auto o = std::make_shared<ExplainOptions>();
  CLI::App* cmd = app.add_subcommand(
      "explain", "Show the idioms matched, the canonical graph, its fusion clusters with the reason for every "
                 "decision, kernel keys, and (--stmt) Halide's lowered statements");
  auto* graph = cmd->add_option("--graph", o->graph, "a graph: textual form (graph.h), or JSON (docs/graph-json.md) when FILE ends in .json")
                    ->check(CLI::ExistingFile);
  auto* spec = cmd->add_option("--spec", o->spec, "a model spec (examples/specs/README.md)")
                   ->check(CLI::ExistingFile);
  graph->excludes(spec);
  cmd->add_option("--target", o->target, "Halide target for keys and statements")
      ->capture_default_str();
  cmd->add_flag("--stmt", o->stmt, "also print each kernel's lowered Halide statement");
  cmd->callback([o] { run(*o); });
}

}  // namespace optfuse::tools
