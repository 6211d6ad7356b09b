// `optfuse explain`: what the front end does with a graph, and why. For a textual graph file
// (`--graph`, the form graph.h documents) or every param group of a model spec (`--spec`): the
// canonical graph, the fusion clusters in execution order with the reason for every fuse / cut /
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

Graph load_graph(const std::string& path) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0)
    throw Error(path + ": JSON graphs are not read by this build yet; give the textual form "
                "(graph \"name\" { ... }, see include/optfuse/graph.h)");
  try {
    return parse(read_text(path));
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

void explain_graph(const Graph& g, const Engine& engine, bool stmt, std::ostream& out) {
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
      "explain", "Show the canonical graph, its fusion clusters with the reason for every "
                 "decision, kernel keys, and (--stmt) Halide's lowered statements");
  auto* graph = cmd->add_option("--graph", o->graph, "a graph in the textual form (graph.h)")
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
