#include "support/objdump.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace optfuse::testing {

std::string disassemble(const std::vector<char>& object) {
  if (std::system("objdump --version > /dev/null 2>&1") != 0) return "";
  static int serial = 0;
  const std::string path = ::testing::TempDir() + "/disassemble_" + std::to_string(serial++) + ".o";
  std::ofstream(path, std::ios::binary).write(object.data(), std::streamsize(object.size()));
  std::string listing;
  if (FILE* p = ::popen(("objdump -d " + path).c_str(), "r")) {
    char buf[4096];
    for (size_t got; (got = std::fread(buf, 1, sizeof buf, p)) > 0;) listing.append(buf, got);
    if (::pclose(p) != 0) listing.clear();
  }
  std::remove(path.c_str());
  return listing;
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t c = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++c;
  return c;
}

}  // namespace optfuse::testing
