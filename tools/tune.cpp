// `optfuse tune`: measures schedules for optimizer kernels on this machine and keeps the best per
// (kernel structure, target, size) in the schedule database (include/optfuse/schedules.h).
#include "optfuse/tune.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>

#include "optfuse/error.h"
#include "optfuse/optfuse.hpp"
#include "tools/commands.h"
#include "tools/spec.h"
#include "tools/validators.h"

namespace optfuse::tools {
namespace {

struct TuneCmdOptions {
  std::vector<std::string> specs, optimizers;
  bool all = false, json = false, list = false, no_write = false;
  std::string target = "host", db;
  double budget = 60;
  std::vector<int64_t> sizes = {int64_t(1) << 20, int64_t(1) << 26};
  double min_gain = 0.02;
  int threads = 0;
};

// The update graphs to tune: every optimizer's defaults (--all), named optimizers (a name or a
// JSON config), and every param group of each spec.
std::vector<Graph> graphs_to_tune(const TuneCmdOptions& o) {
  std::vector<Graph> graphs;
  if (o.all)
    for (const std::string& type : optimizer_types())
      graphs.push_back(update_graph({{"type", type}}));
  for (const std::string& name : o.optimizers) {
    Options config =
        !name.empty() && name[0] == '{' ? Options::parse(name) : Options{{"type", name}};
    graphs.push_back(update_graph(config));
  }
  for (const std::string& path : o.specs) {
    ModelSpec spec = load_spec(path);
    for (size_t gi = 0; gi < spec.groups.size(); ++gi)
      for (const GroupGraph& gg : group_graphs(spec, gi)) graphs.push_back(gg.graph);
  }
  if (graphs.empty())
    throw UsageError("tune: nothing to tune: give --optimizer NAME, --spec FILE or --all");
  return graphs;
}

void list_space(const TuneCmdOptions& o) {
  std::string target = Engine([&] {
                         EngineOptions eo;
                         eo.target = o.target;
                         eo.compile_only = true;
                         return eo;
                       }())
                           .target_string();
  std::printf("schedule space for %s (default first in each dimension's effect: see engine.h):\n",
              target.c_str());
  for (const auto& d : schedule_space(target)) {
    std::printf("  %-20s", d.name.c_str());
    for (const auto& l : d.labels) std::printf(" %s", l.c_str());
    std::printf("%s\n", d.past_cache_only ? "   (only past the last-level cache)" : "");
  }
}

int run_tune(const TuneCmdOptions& o) {
  if (o.list) {
    list_space(o);
    return 0;
  }
  std::vector<Graph> graphs = graphs_to_tune(o);
  TuneOptions to;
  to.target = o.target;
  to.threads = o.threads;
  to.budget_seconds = o.budget;
  to.sizes = o.sizes;
  to.min_gain = o.min_gain;
  to.progress = [](const std::string& line) {
    std::fprintf(stderr, "tune: %s\n", line.c_str());
    std::fflush(stderr);
  };
  std::fprintf(stderr, "tune: %zu graph(s), sizes", graphs.size());
  for (int64_t n : o.sizes) std::fprintf(stderr, " %lld", static_cast<long long>(n));
  std::fprintf(stderr, ", budget %.0f s, last-level cache %lld MiB\n", o.budget,
               static_cast<long long>(last_level_cache_bytes() >> 20));
  TuneReport report = tune(graphs, to);

  std::string db_path = o.no_write ? "" : schedule_db_destination(o.db, report.target);
  if (!o.no_write) {
    // Merge into the existing database of this target, so other graphs and sizes are kept; a new
    // one starts from the database the engine reads now when that is for exactly this target
    // (the shipped one, say), so tuning one kernel never drops the others' schedules.
    std::string base = db_path;
    if (!std::filesystem::exists(db_path)) base = resolve_schedule_db(o.db, report.target);
    ScheduleDb db(report.target);
    if (!base.empty() && std::filesystem::exists(base)) {
      ScheduleDb existing = ScheduleDb::load(base);
      if (existing.target() == report.target) {
        db = std::move(existing);
      } else if (base == db_path) {
        throw Error("tune: " + db_path + " holds schedules for target " + existing.target() +
                    ", not " + report.target + " (give another --schedules)");
      }
    }
    for (const TunedSchedule& t : report.best) db.put(t);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(db_path).parent_path(), ec);
    db.save(db_path);
  }
  if (o.json) {
    ScheduleDb results(report.target);  // this run's results only, in the database's form
    for (const TunedSchedule& t : report.best) results.put(t);
    nlohmann::json j = nlohmann::json::parse(results.text());
    j["db"] = o.no_write ? "" : db_path;
    j["threads"] = report.threads;
    j["seconds"] = report.seconds;
    j["budget_exhausted"] = report.budget_exhausted;
    j["trials"] = nlohmann::json::array();
    for (const TuneTrial& t : report.trials)
      j["trials"].push_back({{"name", t.graph_name},
                             {"n", t.n},
                             {"schedule", t.schedule},
                             {"ratio", t.ratio},
                             {"gbps", t.gbps},
                             {"pairs", t.pairs},
                             {"kept", t.kept}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%-10s %-9s %-7s %-28s %8s %8s %7s\n", "kernel", "n", "class", "schedule", "GB/s",
              "default", "ratio");
  for (const TunedSchedule& t : report.best)
    std::printf("%-10s %-9lld %-7s %-28s %8.1f %8.1f %7.3f\n", t.name.c_str(),
                static_cast<long long>(t.n), t.size_class.c_str(), t.schedule.str().c_str(), t.gbps,
                t.default_gbps, t.ratio);
  std::printf("%zu measurements in %.1f s%s; %s\n", report.trials.size(), report.seconds,
              report.budget_exhausted ? " (budget exhausted: some searches stopped early)" : "",
              o.no_write ? "database not written (--no-write)" : ("written to " + db_path).c_str());
  return 0;
}

}  // namespace

void add_tune_command(CLI::App& app) {
  auto o = std::make_shared<TuneCmdOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tune",
      "Measure schedules for optimizer kernels on this machine and keep the best per "
      "(kernel structure, target, size) in <schedules dir>/<target>.json");
  cmd->add_option("--spec", o->specs,
                  "model spec (JSON, examples/specs/README.md): tune every "
                  "param group's kernel (repeatable)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--optimizer", o->optimizers,
                  "an optimizer name (adamw, sgd, ...) or a JSON config such as "
                  "'{\"type\":\"sgd\",\"momentum\":0.9}' (repeatable)")
      ->check(optimizer_config());
  cmd->add_flag("--all", o->all,
                "every library optimizer with its default options (not Muon: its Newton-Schulz "
                "step runs between kernels)");
  cmd->add_option("--target", o->target, "Halide target (CPU targets only are searched)")
      ->check(target_list())
      ->capture_default_str();
  cmd->add_option("--budget", o->budget, "seconds for the whole search, compiles included")
      ->check(number_in(0.0, 1e6))
      ->capture_default_str();
  cmd->add_option("--sizes", o->sizes,
                  "elements per tensor to tune at (default: 2^20, cache-"
                  "resident, and 2^26, far past the last-level cache)")
      ->check(whole_number_in(1, int64_t(1) << 34));
  cmd->add_option("--min-gain", o->min_gain,
                  "how much faster (paired median) a schedule must "
                  "be to replace the default")
      ->check(number_in(0.0, 10.0))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "worker threads (0 = all cores)")
      ->check(whole_number_in(0, 1024))
      ->capture_default_str();
  cmd->add_option("--schedules,--db", o->db,
                  "database file or directory to merge the results into (default: "
                  "$OPTFUSE_SCHEDULES, else the per-user directory "
                  "~/.local/share/optfuse/schedules, where every command reads first)");
  cmd->add_flag("--no-write", o->no_write, "measure and report only");
  cmd->add_flag("--list", o->list, "print the schedule space for --target and exit");
  cmd->add_flag("--json", o->json, "print the results as JSON (progress goes to stderr)");
  cmd->callback([o] {
    int rc = run_tune(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace optfuse::tools
