// `optfuse cache ls | stats | verify | prune | clear`: inspect and maintain the disk cache.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "optfuse/cache.h"
#include "optfuse/engine.h"
#include "tools/commands.h"
#include "tools/validators.h"

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

// The cache at the resolved directory, opened as it is: these commands create nothing, so a
// mistyped --cache-dir is an error, not an empty cache made there. Its warnings (a directory of
// its tree not trusted) go to stderr.
DiskCache open_cache(const CacheCmdOptions& o) {
  const std::string dir = resolved_dir(o);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir + "/v1", ec))
    throw Error(
        "no cache at " + dir + " (" +
        (std::filesystem::exists(dir, ec) ? "it has no v1/ directory" : "no such directory") +
        "; a cache is made by the first program that compiles a kernel into it, or by "
        "optfuse warmup)");
  CacheOptions co = engine_cache_options(dir);  // verify checks what a load would
  co.max_bytes = parse_size(o.max_size);
  co.create = false;
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

int run_ls(const CacheCmdOptions& o) {
  print_entries(open_cache(o).list(false), o.json);
  return 0;
}

int run_stats(const CacheCmdOptions& o) {
  DiskCache cache = open_cache(o);
  CacheStats s = cache.stats();
  if (o.json) {
    std::cout << nlohmann::json{{"dir", s.dir},
                                {"entries", s.entries},
                                {"bytes", s.bytes},
                                {"max_bytes", s.max_bytes},
                                {"kernels", s.kernels},
                                {"runtimes", s.runtimes},
                                {"used", cache.unusable().empty()}}
                     .dump(2)
              << "\n";
  } else {
    std::printf(
        "cache     %s%s\nentries   %llu (%llu kernels, %llu runtimes)\nsize      %.2f MiB of "
        "%.0f MiB\n",
        s.dir.c_str(), cache.unusable().empty() ? "" : " (NOT USED: see the warning above)",
        static_cast<unsigned long long>(s.entries), static_cast<unsigned long long>(s.kernels),
        static_cast<unsigned long long>(s.runtimes), s.bytes / 1048576.0, s.max_bytes / 1048576.0);
  }
  return 0;
}

// Exit status 1 if any entry is invalid (unreadable, corrupt, not linking, not trusted) or the
// cache as a whole is not used.
int run_verify(const CacheCmdOptions& o) {
  DiskCache cache = open_cache(o);
  std::vector<CacheEntry> all = cache.list(true), bad;
  for (const auto& e : all)
    if (!e.problem.empty()) bad.push_back(e);
  const std::string unusable = cache.unusable();
  if (o.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& e : bad) list.push_back(to_json(e));
    nlohmann::json j = {{"dir", resolved_dir(o)},
                        {"entries", all.size()},
                        {"invalid", bad.size()},
                        {"problems", list}};
    if (!unusable.empty()) j["not_used"] = unusable;
    std::cout << j.dump(2) << "\n";
  } else {
    if (!unusable.empty())
      std::printf("NOT USED %s: %s\n", resolved_dir(o).c_str(), unusable.c_str());
    for (const auto& e : bad) std::printf("INVALID %s: %s\n", e.path.c_str(), e.problem.c_str());
    std::printf("%zu entries checked, %zu invalid\n", all.size(), bad.size());
  }
  return bad.empty() && unusable.empty() ? 0 : 1;
}

int run_prune(const CacheCmdOptions& o) {
  DiskCache cache = open_cache(o);
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

int run_clear(const CacheCmdOptions& o) {
  DiskCache cache = open_cache(o);
  size_t n = cache.list(false).size();
  size_t locks_held = cache.clear();
  if (o.json) {
    std::cout << nlohmann::json{{"removed", n}, {"locks_held", locks_held}}.dump(2) << "\n";
  } else {
    std::printf("%zu entries removed from %s\n", n, resolved_dir(o).c_str());
    if (locks_held) std::printf("%zu lock files kept: running processes hold them\n", locks_held);
  }
  return 0;
}

}  // namespace

void add_cache_command(CLI::App& app) {
  CLI::App* cache = app.add_subcommand("cache", "Inspect and maintain the disk kernel cache");
  cache->require_subcommand(1);
  const std::vector<std::pair<std::string, std::string>> commands = {
      {"ls", "List entries, least recently used first"},
      {"stats", "Number of entries and size"},
      {"verify",
       "Read, check and link every entry (exit status 1 if any is invalid or the cache is not "
       "used)"},
      {"prune",
       "Remove invalid entries and stale temporary files, then evict least recently "
       "used entries until the cache fits --max-size"},
      {"clear",
       "Remove every entry, temporary file and lock file (a lock a running process "
       "holds is kept)"}};
  for (const auto& [name, help] : commands) {
    auto o = std::make_shared<CacheCmdOptions>();
    CLI::App* cmd = cache->add_subcommand(name, help);
    cmd->add_option("--cache-dir", o->dir,
                    "cache directory (default: $OPTFUSE_CACHE_DIR, $XDG_CACHE_HOME/optfuse, "
                    "~/.cache/optfuse)");
    if (name == "prune")
      cmd->add_option("--max-size", o->max_size, "size cap, e.g. 512M or 1G")
          ->check(size_text())
          ->capture_default_str();
    cmd->add_flag("--json", o->json, "machine-readable output");
    const std::map<std::string, int (*)(const CacheCmdOptions&)> runs = {{"ls", run_ls},
                                                                         {"stats", run_stats},
                                                                         {"verify", run_verify},
                                                                         {"prune", run_prune},
                                                                         {"clear", run_clear}};
    cmd->callback([o, run = runs.at(name)] {
      int rc = run(*o);
      if (rc != 0) throw CLI::RuntimeError(rc);
    });
  }
}

}  // namespace optfuse::tools
