// Where the cache lives by default, and sizes as users write them.
#include <cctype>
#include <cstdlib>

#include "optfuse/cache.h"
#include "optfuse/error.h"

namespace optfuse {

std::string default_cache_dir() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  if (std::string d = env("OPTFUSE_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = env("XDG_CACHE_HOME"); !d.empty()) return d + "/optfuse";
  if (std::string d = env("HOME"); !d.empty()) return d + "/.cache/optfuse";
  return ".optfuse-cache";
}

uint64_t parse_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit = text.substr(i);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.pop_back();
  uint64_t scale = 0;
  if (unit.empty())
    scale = 1;
  else if (unit == "k" || unit == "K")
    scale = uint64_t{1} << 10;
  else if (unit == "m" || unit == "M")
    scale = uint64_t{1} << 20;
  else if (unit == "g" || unit == "G")
    scale = uint64_t{1} << 30;
  else if (unit == "t" || unit == "T")
    scale = uint64_t{1} << 40;
  if (i == 0 || i > 15 || scale == 0)
    throw Error("size '" + text +
                "' must be a number with an optional unit k, M, G or T (e.g. 512M)");
  return std::stoull(text.substr(0, i)) * scale;
}

}  // namespace optfuse
