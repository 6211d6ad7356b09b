// `optfuse cache ls | stats | verify | prune | clear`: inspect and maintain the disk cache.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "optfuse/cache.h"
#include "optfuse/engine.h"
#include "tools/commands.h"

namespace optfuse::tools {
namespace {

struct CacheCmdOptions {
  std::string dir;
  std::string max_size = "1G";
  bool json = false;
};

std::string resolved_dir(const CacheCmdOptions& o) {
  return o.dir.empty() ? default_cache_dir() : o.dir;
}

DiskCache open_cache(const CacheCmdOptions& o, bool quiet) {
  CacheOptions co = engine_cache_options(resolved_dir(o));  // verify checks what a load would
  co.max_bytes = parse_size(o.max_size);
  if (quiet) co.warn = [](const std::string&) {};
  return DiskCache(co);
}

std::string when(double unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

nlohmann::json to_json(const CacheEntry& e) {
  nlohmann::json j = {{"key", e.key},
                      {"path", e.path},
                      {"kind", e.kind},
                      {"name", e.name},
                      {"target", e.target},
                      {"file_bytes", e.file_bytes},
                      {"object_bytes", e.object_bytes},
                      {"created", e.created},
                      {"last_used", e.last_used}};
  if (!e.problem.empty()) j["problem"] = e.problem;
  return j;
}

void print_entries(const std::vector<CacheEntry>& entries, bool json) {
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& e : entries) list.push_back(to_json(e));
    std::cout << list.dump(2) << "\n";
    return;
  }
  // Widths from the content, and the target (up to ~100 characters) last, so that no value
  // pushes the columns after it out of line.
  size_t kind_w = 4, name_w = 4, size_w = 5;
  for (const auto& e : entries) {
    kind_w = std::max(kind_w, e.kind.size());
    name_w = std::max(name_w, e.name.size());
    size_w = std::max(size_w, std::to_string(e.file_bytes).size() + 2);
  }
  const int kw = static_cast<int>(kind_w), nw = static_cast<int>(name_w),
            sw = static_cast<int>(size_w);
  if (!entries.empty())
    std::printf("%-32s  %-*s  %-*s  %*s  %-19s  %s\n", "key", kw, "kind", nw, "name", sw, "bytes",
                "last used", "target");
  for (const auto& e : entries) {
    std::printf("%-32s  %-*s  %-*s  %*llu  %-19s  %s", e.key.c_str(), kw, e.kind.c_str(), nw,
                e.name.c_str(), sw, static_cast<unsigned long long>(e.file_bytes),
                when(e.last_used).c_str(), e.target.c_str());
    if (!e.problem.empty()) std::printf("  INVALID: %s", e.problem.c_str());
    std::printf("\n");
  }
}

int run(const std::string& what, const CacheCmdOptions& o) {
  if (what == "ls") {
    print_entries(open_cache(o, true).list(false), o.json);
    return 0;
  }
  if (what == "stats") {
    CacheStats s = open_cache(o, true).stats();
    if (o.json) {
      std::cout << nlohmann::json{{"dir", s.dir},         {"entries", s.entries},
                                  {"bytes", s.bytes},     {"max_bytes", s.max_bytes},
                                  {"kernels", s.kernels}, {"runtimes", s.runtimes}}
                       .dump(2)
                << "\n";
    } else {
      std::printf(
          "cache     %s\nentries   %llu (%llu kernels, %llu runtimes)\nsize      %.2f MiB of %.0f "
          "MiB\n",
          s.dir.c_str(), static_cast<unsigned long long>(s.entries),
          static_cast<unsigned long long>(s.kernels), static_cast<unsigned long long>(s.runtimes),
          s.bytes / 1048576.0, s.max_bytes / 1048576.0);
    }
    return 0;
  }
  if (what == "verify") {
    std::vector<CacheEntry> all = open_cache(o, true).list(true), bad;
    for (const auto& e : all)
      if (!e.problem.empty()) bad.push_back(e);
    if (o.json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& e : bad) list.push_back(to_json(e));
      std::cout << nlohmann::json{{"dir", resolved_dir(o)},
                                  {"entries", all.size()},
                                  {"invalid", bad.size()},
                                  {"problems", list}}
                       .dump(2)
                << "\n";
    } else {
      for (const auto& e : bad) std::printf("INVALID %s: %s\n", e.path.c_str(), e.problem.c_str());
      std::printf("%zu entries checked, %zu invalid\n", all.size(), bad.size());
    }
    return bad.empty() ? 0 : 1;
  }
  if (what == "prune") {
    DiskCache cache = open_cache(o, true);
    std::vector<CacheEntry> removed = cache.prune(parse_size(o.max_size));
    if (o.json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& e : removed) list.push_back(to_json(e));
      std::cout << nlohmann::json{{"removed", removed.size()}, {"entries", list}}.dump(2) << "\n";
    } else {
      for (const auto& e : removed)
        std::printf("removed %s%s%s\n", e.path.c_str(), e.problem.empty() ? "" : ": ",
                    e.problem.c_str());
      std::printf("%zu removed\n", removed.size());
    }
    return 0;
  }
  DiskCache cache = open_cache(o, true);  // clear
  size_t n = cache.list(false).size();
  cache.clear();
  if (o.json)
    std::cout << nlohmann::json{{"removed", n}}.dump(2) << "\n";
  else
    std::printf("%zu entries removed from %s\n", n, resolved_dir(o).c_str());
  return 0;
}

}  // namespace

void add_cache_command(CLI::App& app) {
  CLI::App* cache = app.add_subcommand("cache", "Inspect and maintain the disk kernel cache");
  cache->require_subcommand(1);
  const std::vector<std::pair<std::string, std::string>> commands = {
      {"ls", "List entries, least recently used first"},
      {"stats", "Number of entries and size"},
      {"verify", "Read and check every entry (exit status 1 if any is invalid)"},
      {"prune",
       "Remove invalid entries and stale temporary files, then evict least recently "
       "used entries until the cache fits --max-size"},
      {"clear", "Remove every entry"}};
  for (const auto& [name, help] : commands) {
    auto o = std::make_shared<CacheCmdOptions>();
    CLI::App* cmd = cache->add_subcommand(name, help);
    cmd->add_option("--cache-dir", o->dir,
                    "cache directory (default: $OPTFUSE_CACHE_DIR, $XDG_CACHE_HOME/optfuse, "
                    "~/.cache/optfuse)");
    if (name == "prune")
      cmd->add_option("--max-size", o->max_size, "size cap, e.g. 512M or 1G")
          ->capture_default_str();
    cmd->add_flag("--json", o->json, "machine-readable output");
    std::string what = name;
    cmd->callback([o, what] {
      int rc = run(what, *o);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
}

}  // namespace optfuse::tools
