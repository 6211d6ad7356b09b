#pragma once
// The schedule database: the best measured Schedule per (kernel structure, target, size), written
// by `optfuse tune` (one JSON file per target, `schedules/<target>.json`) and read by the engine.
//
//   Engine engine;                            // schedules found by resolve_schedule_db()
//   auto k = engine.kernel(graph, n);         // the tuned schedule nearest n elements, else
//   default
//
// Sizes: each entry was measured at `n` elements per tensor (the tuner measures a cache-resident
// size and one far past the last-level cache). A call of n elements uses the entry whose measured
// size is nearest in log scale (2^20 and 2^26 measured: up to 2^23 takes the first). No entry for
// the graph and target: the engine's default schedule.
//
// The file format (deterministic: entries sorted by graph, then n; keys sorted; two-space indent):
//   {"format": "optfuse-schedules-1", "target": "<resolved target>",
//    "entries": [{"graph": "<structural hash>", "name": "adamw", "n": 1048576,
//                 "size_class": "cache" | "memory", "schedule": {"vector_width": 16, ...,
//                 "str": "v16.t1.m16384"}, "gbps": ..., "default_gbps": ..., "ratio": ...,
//                 "threads": 2, "date": "2026-11-30"}, ...]}
// `ratio` is the median of paired default/tuned call times (> 1: the tuned one is faster).
#include <cstdint>
#include <string>
#include <vector>

#include "optfuse/engine.h"

namespace optfuse {

struct TunedSchedule {
  std::string graph;        // structural hash (hex) of the canonical graph
  std::string name;         // the graph's name, for readers only
  int64_t n = 0;            // elements per tensor it was measured at
  std::string size_class;   // "cache" (fits the last-level cache) or "memory", for readers only
  Schedule schedule;        // resolved for the database's target
  double gbps = 0;          // measured with `schedule`
  double default_gbps = 0;  // measured with the default schedule, interleaved
  double ratio = 1;         // median of paired default/tuned times
  int threads = 0;          // worker threads it was measured with
  std::string date;         // UTC, YYYY-MM-DD
};

class ScheduleDb {
 public:
  static constexpr const char* kFormat = "optfuse-schedules-1";

  explicit ScheduleDb(std::string target = "") : target_(std::move(target)) {}

  // Reads a database file; Error naming the file and the field at fault.
  static ScheduleDb load(const std::string& path);
  static ScheduleDb parse(const std::string& text, const std::string& origin);
  // The deterministic text (same entries -> same bytes) and an atomic write of it.
  std::string text() const;
  void save(const std::string& path) const;

  const std::string& target() const { return target_; }
  const std::vector<TunedSchedule>& entries() const { return entries_; }  // sorted (graph, n)

  // Adds `e`, replacing an entry with the same graph and n.
  void put(TunedSchedule e);
  // The entry for `graph` measured nearest `n` elements (log scale; ties: the smaller size), or
  // null if the database has none for that graph.
  const TunedSchedule* find(const std::string& graph, int64_t n) const;

 private:
  std::string target_;
  std::vector<TunedSchedule> entries_;
};

// The database file for `resolved_target` named by `path`: `path` itself if it is a file; if it
// is a directory, its `<target>.json` nearest to `resolved_target` (the exact one, else the one
// with the fewest CPU features not in common, same architecture and OS: schedules tuned on a
// sibling machine class beat defaults tuned for none; "" if there is none); "" if `path` is "".
std::string schedule_db_file(const std::string& path, const std::string& resolved_target);
// How far apart two machine classes are for tuned schedules: the number of features one target
// string has and the other lacks, or -1 when schedules of one do not apply to the other
// (another architecture or OS, or a GPU target against a CPU one).
int schedule_target_distance(const std::string& a, const std::string& b);

// Where tuned schedules live. One rule for the library, every `optfuse` command (`tune` writes
// where the others read) and the Python package; nothing about the source tree is compiled in.
//
// The per-user directory `optfuse tune` writes to: $XDG_DATA_HOME/optfuse/schedules, else
// $HOME/.local/share/optfuse/schedules ("" if neither variable is set).
std::string user_schedule_dir();
// The databases this build came with, found from the file optfuse's code was loaded from (the
// program, liboptfuse.so or the Python extension): `<its dir>/share/optfuse/schedules` (a build
// tree, which copies schedules/ there, and the Python package) or `<its dir>/../share/...` and the
// install tree's datadir relative to its libdir (`cmake --install`); "" if none exists.
std::string shipped_schedule_dir();
// The database file an engine for `resolved_target` reads, from EngineOptions::schedule_db or the
// `--schedules` flag (`flag`):
//   1. `flag` if given: a file, or a directory searched by schedule_db_file(); "none": none;
//   2. else $OPTFUSE_SCHEDULES, the same way;
//   3. else user_schedule_dir() when it holds a database for this machine's class;
//   4. else shipped_schedule_dir().
// "" = no tuned schedules (default schedules everywhere).
std::string resolve_schedule_db(const std::string& flag, const std::string& resolved_target);
// Where `optfuse tune` writes for `resolved_target` (`flag` as above; Error for "none"): a named
// file; `<dir>/<resolved_target>.json` of a named directory; else in user_schedule_dir().
std::string schedule_db_destination(const std::string& flag, const std::string& resolved_target);

}  // namespace optfuse
