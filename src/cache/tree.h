#pragma once
// The tree under a cache directory (cache/README.md, "Layout") and what the store and its
// maintenance (disk_cache.cpp, maintenance.cpp) share about it.
#include <string>

namespace optfuse::cache {

inline std::string shard_of(const std::string& root, const std::string& key) {
  return root + "/" + key.substr(0, 2);
}
inline std::string entry_of(const std::string& root, const std::string& key) {
  return shard_of(root, key) + "/" + key + ".entry";
}
inline std::string locks_of(const std::string& root) { return root + "/locks"; }

// Whether `name` (a file name in a shard) is an entry's: "<key>.entry".
inline bool is_entry_name(const std::string& name) {
  return name.size() > 6 && name.compare(name.size() - 6, 6, ".entry") == 0;
}

// Seconds since the epoch, now and of a file's modification time (0 if it cannot be stat'ed,
// symlinks not followed).
double now_seconds();
double mtime_seconds(const std::string& path);

// "kernel cache <dir> is not used: <why> (...); compiled kernels are kept in memory only; fix:
// <fix>": the one warning of a cache that is not used.
std::string not_used_message(const std::string& dir, const std::string& why,
                             const std::string& fix);

}  // namespace optfuse::cache
