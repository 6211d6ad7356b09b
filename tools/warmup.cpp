// `optfuse warmup`: compiles every kernel a model spec's optimizer configuration needs (and the
// Halide runtime of each target) into the disk cache, for this machine or any other target.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "optfuse/cache.h"
#include "optfuse/error.h"
#include "optfuse/optfuse.hpp"
#include "tools/commands.h"
#include "tools/schedules_option.h"
#include "tools/spec.h"
#include "tools/validators.h"

namespace optfuse::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct WarmupOptions {
  std::string spec;
  std::string targets = "host";
  std::string cache_dir;
  int jobs = 0;
  bool json = false;
  std::string schedules;  // --schedules (tools/schedules_option.h)
};

// One object to make sure of: a target's runtime, or one kernel and the groups it serves.
struct Item {
  std::string target, kind, name, key;
  Graph graph{""};
  int64_t size_hint = 0;  // a tensor size it serves (picks a tuned schedule); 0 = default
  int64_t groups = 0, tensors = 0, elements = 0;
  std::vector<std::string> objects;  // the cached objects it needs (a cut graph: one per kernel)
  std::string status;  // "hit", "compiled", "not cached" (compiled, the cache refused it), "failed"
  std::string error;   // for "failed": why
  std::string warning;  // the cache's last warning while making it (e.g. it could not store it)
  double seconds = 0;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string t; std::getline(in, t, ',');)
    if (!t.empty()) out.push_back(t);
  return out;
}

std::vector<Item> plan(const ModelSpec& spec, const std::vector<std::string>& targets,
                       const std::string& schedule_db) {
  std::vector<Item> items;
  for (const std::string& target : targets) {
    EngineOptions eo;
    eo.target = target;
    eo.compile_only = true;  // GPU targets need no device to be compiled for
    eo.schedule_db = schedule_db;
    Engine engine(eo);  // resolves the target (Error naming it if invalid); compiles nothing
    Item rt;
    rt.target = engine.target_string();
    rt.kind = "runtime";
    rt.name = "halide-runtime";
    items.push_back(rt);
    std::map<std::string, size_t> by_key;
    for (size_t gi = 0; gi < spec.groups.size(); ++gi) {
      // A group with grad_centralization runs two graphs (tools/spec.h), each served by one
      // kernel per schedule its tensors get: with tuned schedules, per size.
      for (const GroupGraph& gg : group_graphs(spec, gi)) {
        for (const SpecKernel& sk : spec_kernels(spec, gg, engine)) {
          auto [it, fresh] = by_key.emplace(sk.key, items.size());
          if (fresh) {
            Item k;
            k.target = engine.target_string();
            k.kind = "kernel";
            k.name = gg.graph.name();
            k.key = sk.key;
            k.graph = gg.graph;
            k.size_hint = sk.size_hint;
            items.push_back(k);
          }
          Item& k = items[it->second];
          ++k.groups;
          k.tensors += static_cast<int64_t>(sk.params.size());
          for (size_t pi : sk.params) k.elements += spec.params[pi].numel;
        }
      }
    }
  }
  return items;
}

void run_item(Item& item, const std::string& cache_dir, const std::string& schedule_db) {
  auto t0 = Clock::now();
  try {
    EngineOptions eo;
    eo.target = item.target;
    eo.cache_dir = cache_dir;
    eo.compile_only = true;
    eo.schedule_db = schedule_db;
    eo.warn = [&item](const std::string& w) { item.warning = w; };
    Engine engine(eo);
    bool found = item.kind == "runtime" ? engine.precompile_runtime()
                 : item.size_hint       ? engine.precompile(item.graph, item.size_hint)
                                        : engine.precompile(item.graph);
    item.status = found ? "hit" : "compiled";
    if (item.kind == "kernel")
      item.objects = engine.object_keys(item.graph, item.size_hint ? item.size_hint : -1);
  } catch (const Error& e) {
    item.status = "failed";
    item.error = e.what();
  }
  item.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
}

// What the cache holds now decides "cached", not the absence of errors: an object compiled while
// the disk filled up, or the directory became read-only, is "not cached".
void mark_not_cached(std::vector<Item>* items, const std::string& dir) {
  CacheOptions co = engine_cache_options(dir);
  co.warn = [](const std::string&) {};
  std::set<std::string> kernels, runtimes;
  for (const CacheEntry& e : DiskCache(co).list(false))
    (e.kind == "runtime" ? runtimes : kernels).insert(e.kind == "runtime" ? e.target : e.key);
  for (Item& it : *items) {
    if (it.status != "compiled" && it.status != "hit") continue;
    const bool stored =
        it.kind == "runtime"
            ? runtimes.count(it.target) > 0
            : std::all_of(it.objects.begin(), it.objects.end(),
                          [&](const std::string& key) { return kernels.count(key) > 0; });
    if (!stored) it.status = "not cached";
  }
}

int run_warmup(const WarmupOptions& o) {
  auto t0 = Clock::now();
  FILE* progress = o.json ? stderr : stdout;
  ModelSpec spec = load_spec(o.spec);
  std::string dir = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  const std::string& schedule_db = o.schedules;
  {
    // Compiling into a cache that keeps nothing would report work that is lost at exit.
    std::string why;
    CacheOptions co = engine_cache_options(dir);
    co.warn = [&why](const std::string& w) { why = w; };
    if (DiskCache(co).degraded()) throw Error("warmup: nothing can be cached: " + why);
  }
  std::vector<Item> items = plan(spec, split(o.targets), schedule_db);
  int64_t tensors = 0;
  for (const auto& p : spec.params) tensors += p.numel;
  std::fprintf(progress,
               "optfuse warmup: %s (%s), %zu parameters (%.1f M elements) in %zu groups; "
               "%zu objects to check in %s\n",
               spec.model.c_str(), spec.optimizer.value("type", "").c_str(), spec.params.size(),
               tensors / 1e6, spec.groups.size(), items.size(), dir.c_str());
  std::fflush(progress);

  int jobs =
      o.jobs > 0 ? o.jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  jobs = std::min<int>(jobs, static_cast<int>(items.size()));
  std::atomic<size_t> next{0};
  std::mutex print;
  size_t done = 0;
  auto worker = [&] {
    for (size_t i; (i = next++) < items.size();) {
      run_item(items[i], dir, schedule_db);
      std::lock_guard<std::mutex> lock(print);
      const Item& it = items[i];
      std::fprintf(progress, "[%zu/%zu] %-18s %-7s %-14s %s in %.2f s", ++done, items.size(),
                   it.target.c_str(), it.kind.c_str(), it.name.c_str(), it.status.c_str(),
                   it.seconds);
      if (it.kind == "kernel")
        std::fprintf(progress, " (serves %lld groups, %lld tensors, %.1f M elements)",
                     static_cast<long long>(it.groups), static_cast<long long>(it.tensors),
                     it.elements / 1e6);
      if (!it.error.empty()) std::fprintf(progress, "\n    error: %s", it.error.c_str());
      if (!it.warning.empty()) std::fprintf(progress, "\n    warning: %s", it.warning.c_str());
      std::fprintf(progress, "\n");
      std::fflush(progress);
    }
  };
  std::vector<std::thread> pool;
  for (int j = 1; j < jobs; ++j) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();

  mark_not_cached(&items, dir);
  int64_t kernels = 0, hits = 0, misses = 0, failed = 0, not_cached = 0, rt_hits = 0, rt_misses = 0;
  nlohmann::json list = nlohmann::json::array();
  for (const Item& it : items) {
    bool kernel = it.kind == "kernel";
    kernels += kernel;
    if (it.status == "hit") (kernel ? hits : rt_hits)++;
    if (it.status == "compiled") (kernel ? misses : rt_misses)++;
    failed += it.status == "failed";
    not_cached += it.status == "not cached";
    nlohmann::json j = {{"target", it.target},
                        {"kind", it.kind},
                        {"name", it.name},
                        {"status", it.status},
                        {"seconds", it.seconds}};
    if (!it.warning.empty()) j["warning"] = it.warning;
    if (kernel) {
      j["key"] = it.key;
      j["groups"] = it.groups;
      j["tensors"] = it.tensors;
      j["elements"] = it.elements;
    }
    if (!it.error.empty()) j["error"] = it.error;
    list.push_back(j);
  }
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (o.json) {
    nlohmann::json report = {{"spec", o.spec},
                             {"model", spec.model},
                             {"cache_dir", dir},
                             {"kernels", kernels},
                             {"hits", hits},
                             {"misses", misses},
                             {"failed", failed},
                             {"not_cached", not_cached},
                             {"runtime_hits", rt_hits},
                             {"runtime_misses", rt_misses},
                             {"seconds", seconds},
                             {"items", list}};
    std::cout << report.dump(2) << "\n";
  } else {
    std::printf(
        "kernels %lld, hits %lld, misses %lld (compiled), failed %lld; runtimes: %lld hits, "
        "%lld compiled; %.2f s\n",
        static_cast<long long>(kernels), static_cast<long long>(hits),
        static_cast<long long>(misses), static_cast<long long>(failed),
        static_cast<long long>(rt_hits), static_cast<long long>(rt_misses), seconds);
    if (not_cached)
      std::printf(
          "%lld objects are NOT in the cache (see the warnings above): the next process "
          "compiles them again\n",
          static_cast<long long>(not_cached));
  }
  return failed || not_cached ? 1 : 0;
}

}  // namespace

void add_warmup_command(CLI::App& app) {
  auto o = std::make_shared<WarmupOptions>();
  CLI::App* cmd =
      app.add_subcommand("warmup",
                         "Compile every kernel a model spec's optimizer needs into the disk cache "
                         "(spec format: examples/specs/README.md)");
  cmd->add_option("--spec", o->spec, "model spec (JSON)")->required()->check(CLI::ExistingFile);
  cmd->add_option(
         "--target", o->targets,
         "Halide target(s), comma-separated, e.g. host,x86-64-linux-avx2,arm-64-linux,host-cuda "
         "(no GPU needed to compile for CUDA)")
      ->check(target_list())
      ->capture_default_str();
  cmd->add_option("--cache-dir", o->cache_dir,
                  "cache directory (default: $OPTFUSE_CACHE_DIR, $XDG_CACHE_HOME/optfuse, "
                  "~/.cache/optfuse)");
  cmd->add_option("--jobs", o->jobs, "objects compiled at once (0 = one per core)")
      ->check(whole_number_in(0, 256))
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "print a JSON report (progress goes to stderr)");
  add_schedules_option(cmd, &o->schedules);
  cmd->callback([o] {
    int rc = run_warmup(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace optfuse::tools
