// The schedule database file (format in include/optfuse/schedules.h): parse with every field
// checked, a deterministic text, nearest-size lookup.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "cache/fs.h"
#include "optfuse/error.h"
#include "optfuse/schedules.h"

namespace optfuse {
namespace {

using nlohmann::json;

json schedule_json(const Schedule& s) {
  json j = {{"vector_width", s.vector_width},
            {"tasks_per_thread", s.tasks_per_thread},
            {"min_task", s.min_task},
            {"unroll", s.unroll},
            {"task_elems", s.task_elems},
            {"gpu_block", s.gpu_block},
            {"str", s.str()}};
  // Written only when not the default, as in str(): files from before the field stay canonical.
  if (s.prefetch != Schedule{}.prefetch) j["prefetch"] = s.prefetch;
  if (s.prefetch_l2 != Schedule{}.prefetch_l2) j["prefetch_l2"] = s.prefetch_l2;
  return j;
}

// A field of `j` (an object), checked; `where` names the entry for messages.
template <typename T>
T field(const json& j, const char* name, const std::string& where, T fallback, bool required) {
  auto it = j.find(name);
  if (it == j.end()) {
    if (required) throw Error(where + ": missing field \"" + name + "\"");
    return fallback;
  }
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw Error(where + ": field \"" + name + "\" has the wrong type (" + it->dump() + ")");
  }
}

Schedule schedule_from(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": \"schedule\" must be an object");
  Schedule s;
  s.vector_width = field<int>(j, "vector_width", where, 0, true);
  s.tasks_per_thread = field<int>(j, "tasks_per_thread", where, 1, false);
  s.min_task = field<int64_t>(j, "min_task", where, s.min_task, false);
  s.unroll = field<int>(j, "unroll", where, 1, false);
  s.task_elems = field<int64_t>(j, "task_elems", where, 0, false);
  s.gpu_block = field<int>(j, "gpu_block", where, 0, false);
  s.prefetch = field<int>(j, "prefetch", where, s.prefetch, false);
  s.prefetch_l2 = field<int>(j, "prefetch_l2", where, s.prefetch_l2, false);
  if (s.vector_width < 0 || s.tasks_per_thread < 1 || s.min_task < 1 || s.unroll < 1 ||
      s.unroll > 64 || s.task_elems < 0 || s.gpu_block < 0 || s.prefetch < 0 ||
      s.prefetch > (1 << 16) || s.prefetch_l2 < 0 || s.prefetch_l2 > (1 << 20))
    throw Error(where + ": schedule " + j.dump() + " has a value out of range");
  return s;
}

bool entry_less(const TunedSchedule& a, const TunedSchedule& b) {
  return a.graph != b.graph ? a.graph < b.graph : a.n < b.n;
}

}  // namespace

ScheduleDb ScheduleDb::parse(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error("schedule database " + origin + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error("schedule database " + origin + ": not a JSON object");
  std::string top = "schedule database " + origin;
  std::string format = field<std::string>(j, "format", top, "", true);
  if (format != kFormat)
    throw Error(top + ": format \"" + format + "\" is not \"" + kFormat + "\"");
  ScheduleDb db(field<std::string>(j, "target", top, "", true));
  json entries = field<json>(j, "entries", top, json::array(), true);
  if (!entries.is_array()) throw Error(top + ": \"entries\" must be an array");
  for (size_t i = 0; i < entries.size(); ++i) {
    const json& e = entries[i];
    std::string where = top + ": entries[" + std::to_string(i) + "]";
    if (!e.is_object()) throw Error(where + ": not an object");
    TunedSchedule t;
    t.graph = field<std::string>(e, "graph", where, "", true);
    t.name = field<std::string>(e, "name", where, "", false);
    t.n = field<int64_t>(e, "n", where, 0, true);
    if (t.n < 1) throw Error(where + ": n must be >= 1, got " + std::to_string(t.n));
    t.size_class = field<std::string>(e, "size_class", where, "", false);
    t.schedule = schedule_from(field<json>(e, "schedule", where, json(), true), where);
    t.gbps = field<double>(e, "gbps", where, 0, false);
    t.default_gbps = field<double>(e, "default_gbps", where, 0, false);
    t.ratio = field<double>(e, "ratio", where, 1, false);
    t.threads = field<int>(e, "threads", where, 0, false);
    t.date = field<std::string>(e, "date", where, "", false);
    db.put(std::move(t));
  }
  return db;
}

ScheduleDb ScheduleDb::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("schedule database " + path + ": cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

std::string ScheduleDb::text() const {
  json entries = json::array();
  for (const TunedSchedule& e : entries_) {
    // Measurements rounded so a reader sees figures, not float noise.
    auto round3 = [](double v) { return std::round(v * 1000.0) / 1000.0; };
    entries.push_back({{"graph", e.graph},
                       {"name", e.name},
                       {"n", e.n},
                       {"size_class", e.size_class},
                       {"schedule", schedule_json(e.schedule)},
                       {"gbps", round3(e.gbps)},
                       {"default_gbps", round3(e.default_gbps)},
                       {"ratio", round3(e.ratio)},
                       {"threads", e.threads},
                       {"date", e.date}});
  }
  json j = {{"format", kFormat}, {"target", target_}, {"entries", entries}};
  return j.dump(2) + "\n";  // nlohmann's default object is a std::map: keys come out sorted
}

void ScheduleDb::save(const std::string& path) const {
  std::string t = text(), error;
  auto slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0 && !cache::make_dirs(path.substr(0, slash), &error))
    throw Error("schedule database " + path + ": " + error);
  if (!cache::atomic_write(path, std::vector<char>(t.begin(), t.end()), &error))
    throw Error("schedule database " + path + ": " + error);
}

void ScheduleDb::put(TunedSchedule e) {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), e, entry_less);
  if (it != entries_.end() && it->graph == e.graph && it->n == e.n)
    *it = std::move(e);
  else
    entries_.insert(it, std::move(e));
}

const TunedSchedule* ScheduleDb::find(const std::string& graph, int64_t n) const {
  const TunedSchedule* best = nullptr;
  double want = std::log2(static_cast<double>(std::max<int64_t>(n, 1)));
  double best_distance = 0;
  for (const TunedSchedule& e : entries_) {  // sorted by n within a graph: ties keep the smaller
    if (e.graph != graph) continue;
    double d = std::fabs(std::log2(static_cast<double>(e.n)) - want);
    if (!best || d < best_distance) {
      best = &e;
      best_distance = d;
    }
  }
  return best;
}

int schedule_target_distance(const std::string& a, const std::string& b) {
  auto split = [](const std::string& t) {
    std::vector<std::string> parts;
    std::stringstream in(t);
    for (std::string p; std::getline(in, p, '-');) parts.push_back(p);
    return parts;
  };
  std::vector<std::string> x = split(a), y = split(b);
  if (x.size() < 3 || y.size() < 3 || !std::equal(x.begin(), x.begin() + 3, y.begin())) return -1;
  std::sort(x.begin() + 3, x.end());
  std::sort(y.begin() + 3, y.end());
  std::vector<std::string> diff;
  std::set_symmetric_difference(x.begin() + 3, x.end(), y.begin() + 3, y.end(),
                                std::back_inserter(diff));
  for (const auto& f : diff)  // a GPU target's schedules say nothing about a CPU's, and back
    if (f == "cuda" || f.rfind("cuda_capability", 0) == 0 || f == "opencl" || f == "metal")
      return -1;
  return static_cast<int>(diff.size());
}

std::string schedule_db_file(const std::string& path, const std::string& resolved_target) {
  if (path.empty()) return "";
  if (!cache::is_directory(path)) return path;
  const std::string dir = path + (path.back() == '/' ? "" : "/");
  std::string best;
  int best_distance = -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".json" || !entry.is_regular_file(ec)) continue;
    const std::string name = entry.path().stem().string();
    const int d = schedule_target_distance(name, resolved_target);
    // Nearest class first; among equals the name order, so the choice never depends on the
    // order the directory lists its files in.
    if (d >= 0 && (best_distance < 0 || d < best_distance ||
                   (d == best_distance && entry.path().string() < best))) {
      best = entry.path().string();
      best_distance = d;
    }
  }
  return best;
}

}  // namespace optfuse
