#include "cache/fs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

namespace optfuse::cache {
namespace fs = std::filesystem;

namespace {

bool fail(std::string* error, const std::string& what) {
  int saved = errno;
  *error = what + ": " + std::strerror(saved);
  errno = saved;  // callers tell "absent" (ENOENT) from other failures
  return false;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

}  // namespace

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool make_dirs(const std::string& dir, std::string* error) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    *error = "cannot create directory " + dir + ": " + ec.message();
    return false;
  }
  return true;
}

std::string untrusted_directory(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return "";  // (the caller's own error paths report it)
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return dir + " is owned by uid " + std::to_string(st.st_uid) + ", not this user";
  if (st.st_mode & S_IWOTH) return dir + " is writable by every user (mode " + mode + ")";
  return "";
}

bool read_file(const std::string& path, std::vector<char>* bytes, std::string* error,
               size_t limit) {
  // O_NONBLOCK: a FIFO (or a device) put in place of a file must not block the open; such a
  // file is refused below, before any read.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return fail(error, "cannot open " + path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return fail(error, "cannot stat " + path);
  if (!S_ISREG(st.st_mode)) {
    *error = path + " is not a regular file";
    errno = EINVAL;  // (callers tell it from an absent file)
    return false;
  }
  bytes->resize(std::min(static_cast<size_t>(st.st_size), limit));
  size_t done = 0;
  while (done < bytes->size()) {
    ssize_t n = ::read(fd.get(), bytes->data() + done, bytes->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(error, "cannot read " + path);
    if (n == 0) break;  // shrank while reading: the checksum will tell
    done += static_cast<size_t>(n);
  }
  bytes->resize(done);
  return true;
}

bool atomic_write(const std::string& path, const std::vector<char>& bytes, std::string* error) {
  static std::atomic<unsigned> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return fail(error, "cannot create " + tmp);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fail(error, "cannot write " + tmp);
      ::unlink(tmp.c_str());
      return false;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0 || ::close(fd.release()) != 0) {
    fail(error, "cannot flush " + tmp);
    ::unlink(tmp.c_str());
    return false;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    fail(error, "cannot rename " + tmp + " to " + path);
    ::unlink(tmp.c_str());
    return false;
  }
  Fd dir(::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
  return true;
}

void touch(const std::string& path) { ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0); }

std::shared_ptr<void> lock_file(const std::string& path, double timeout_s) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return nullptr;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  auto pause = std::chrono::milliseconds(1);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if ((errno != EWOULDBLOCK && errno != EINTR) || std::chrono::steady_clock::now() >= deadline) {
      ::close(fd);
      return nullptr;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return std::shared_ptr<void>(reinterpret_cast<void*>(static_cast<intptr_t>(fd) + 1), [fd](void*) {
    ::flock(fd, LOCK_UN);
    ::close(fd);
  });
}

}  // namespace optfuse::cache
