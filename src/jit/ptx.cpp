#include "jit/ptx.h"

#include <string_view>

namespace optfuse::jit {

std::vector<std::string> extract_ptx(const std::vector<char>& object) {
  std::vector<std::string> modules;
  std::string_view data(object.data(), object.size());
  constexpr std::string_view kVersion = ".version ";
  size_t from = 0;
  while (true) {
    size_t at = data.find(kVersion, from);
    if (at == std::string_view::npos) break;
    // The string holding this directive: back to the previous NUL, on to the next one.
    size_t nul_before = data.rfind('\0', at);
    size_t begin = nul_before == std::string_view::npos ? 0 : nul_before + 1;
    size_t end = data.find('\0', at);
    if (end == std::string_view::npos) end = data.size();
    std::string_view text = data.substr(begin, end - begin);
    if (text.find(".target sm_") != std::string_view::npos) modules.emplace_back(text);
    from = end;
  }
  return modules;
}

}  // namespace optfuse::jit
