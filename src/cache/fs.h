#pragma once
// The few file operations the cache needs, POSIX underneath, reporting errors as text (the cache
// turns them into warnings; none of these throw).
#include <memory>
#include <string>
#include <vector>

namespace optfuse::cache {

bool make_dirs(const std::string& dir, std::string* error);
// Reads the whole file, or only its first `limit` bytes; a directory, FIFO or device is an error
// with errno EINVAL (never a blocking open).
bool read_file(const std::string& path, std::vector<char>* bytes, std::string* error,
               size_t limit = static_cast<size_t>(-1));
// Writes `bytes` to a unique temporary file next to `path`, fsyncs it, renames it onto `path`
// and fsyncs the directory: readers see the old file or the whole new one, never a part.
bool atomic_write(const std::string& path, const std::vector<char>& bytes, std::string* error);
// Why `dir` cannot be trusted to hold code this process runs ("" if it can): owned by another
// user (root excepted), or writable by everyone. (Group-writable is allowed: with per-user
// groups and umask 002 every directory is.)
std::string untrusted_directory(const std::string& dir);
// Whether `path` names a directory (following symlinks); false when it cannot be stat'ed.
bool is_directory(const std::string& path);
// Sets the file's modification time to now (the LRU clock); errors are ignored.
void touch(const std::string& path);

// An exclusive flock on `path` (created if needed), polled until `timeout_s`; null if it could
// not be taken in time or the file cannot be opened. Released when the handle is destroyed, and
// by the kernel if the process dies.
std::shared_ptr<void> lock_file(const std::string& path, double timeout_s);

}  // namespace optfuse::cache
