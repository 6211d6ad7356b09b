// Where tuned schedules are read and written (include/optfuse/schedules.h): one rule for every
// reader and for `optfuse tune`, and no source path compiled in: the shipped databases are found
// from the file this code was loaded from.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cache/fs.h"
#include "optfuse/error.h"
#include "optfuse/schedules.h"

#ifndef OPTFUSE_LIBDIR_TO_DATADIR
#define OPTFUSE_LIBDIR_TO_DATADIR "../share"
#endif

namespace optfuse {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string parent(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// The directory of the ELF file holding this function: liboptfuse.so, the Python extension, or
// the program that links the static library (dladdr names the main program by argv[0], which may
// be relative or bare, so /proc/self/exe is asked instead).
std::string image_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&image_dir), &info) && info.dli_fname) {
    std::string file = info.dli_fname;
    void* self = ::dlopen(nullptr, RTLD_LAZY | RTLD_NOLOAD);
    void* mine = ::dlopen(file.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    const bool main_program = !mine || mine == self;
    if (self) ::dlclose(self);
    if (mine) ::dlclose(mine);
    if (!main_program && file.find('/') != std::string::npos) return parent(file);
  }
  std::vector<char> buf(4096);
  ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? parent(std::string(buf.data(), static_cast<size_t>(n))) : "";
}

}  // namespace

std::string user_schedule_dir() {
  if (std::string d = env("XDG_DATA_HOME"); !d.empty()) return d + "/optfuse/schedules";
  if (std::string d = env("HOME"); !d.empty()) return d + "/.local/share/optfuse/schedules";
  return "";
}

std::string shipped_schedule_dir() {
  const std::string dir = image_dir();
  if (dir.empty()) return "";
  for (const std::string& data :
       {dir + "/share", dir + "/../share", dir + "/" OPTFUSE_LIBDIR_TO_DATADIR}) {
    if (cache::is_directory(data + "/optfuse/schedules")) return data + "/optfuse/schedules";
  }
  return "";
}

std::string resolve_schedule_db(const std::string& flag, const std::string& resolved_target) {
  const std::string named = flag.empty() ? env("OPTFUSE_SCHEDULES") : flag;
  if (named == "none") return "";
  if (!named.empty()) return schedule_db_file(named, resolved_target);
  if (std::string user = user_schedule_dir(); !user.empty() && cache::is_directory(user)) {
    if (std::string file = schedule_db_file(user, resolved_target); !file.empty()) return file;
  }
  return schedule_db_file(shipped_schedule_dir(), resolved_target);
}

std::string schedule_db_destination(const std::string& flag, const std::string& resolved_target) {
  const std::string named = flag.empty() ? env("OPTFUSE_SCHEDULES") : flag;
  if (named == "none")
    throw Error("tune: schedules location is \"none\" (" +
                std::string(flag.empty() ? "$OPTFUSE_SCHEDULES" : "--schedules") +
                "): nowhere to write; give --schedules FILE or DIR, or --no-write");
  if (!named.empty())
    return cache::is_directory(named)
               ? named + (named.back() == '/' ? "" : "/") + resolved_target + ".json"
               : named;
  const std::string user = user_schedule_dir();
  if (user.empty())
    throw Error(
        "tune: no per-user data directory (neither $XDG_DATA_HOME nor $HOME is set); "
        "give --schedules FILE or DIR");
  return user + "/" + resolved_target + ".json";
}

}  // namespace optfuse
