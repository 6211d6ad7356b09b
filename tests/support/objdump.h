#pragma once
// The disassembly of an object file, for tests that check which instructions a kernel compiles to.
#include <cstddef>
#include <string>
#include <vector>

namespace optfuse::testing {

// `objdump -d` of `object`; "" when objdump is not installed (callers skip then).
std::string disassemble(const std::vector<char>& object);

// How many times `what` occurs in `text`.
size_t occurrences(const std::string& text, const std::string& what);

}  // namespace optfuse::testing
