#include "jit/object_check.h"

#include <cctype>
#include <string_view>

#include "jit/elf.h"
#include "jit/halide_bridge.h"

namespace optfuse::jit {
namespace {

// Whether `text` occurs in `bytes` as a whole C string: followed by a NUL and not preceded by a
// character a target string can hold (so that it is not the tail of a longer target).
bool contains_c_string(std::string_view bytes, const std::string& text) {
  auto target_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  };
  std::string needle = text + '\0';
  for (size_t at = bytes.find(needle); at != std::string_view::npos;
       at = bytes.find(needle, at + 1))
    if (at == 0 || !target_char(bytes[at - 1])) return true;
  return false;
}

}  // namespace

std::string object_problem(const std::string& kind, const std::string& target, const char* object,
                           size_t size) {
  // An object for another machine would be linked by ORC and crash the process when called.
  // (Targets whose objects are not ELF, e.g. WebAssembly, are not checked here; the JIT refuses
  // any object that is not ELF for this machine.)
  ElfIdentity want;
  if (elf_identity_for_target(target, &want))
    if (std::string why = elf_object_problem(object, size, want); !why.empty())
      return "the object is not one for target " + target + ": " + why;
  // Same machine, other features (an AVX-512 kernel labelled AVX2 would die of SIGILL on an AVX2
  // CPU): Halide writes the kernel's target into its metadata. The runtime carries no such text.
  // (None is known for a target Halide has no code generator for: nothing here compiles for it,
  // and the JIT refuses whatever is not for this machine.)
  if (kind == "kernel") {
    std::string text = kernel_object_target(target);
    if (!text.empty() && !contains_c_string(std::string_view(object, size), text))
      return "the object was not compiled for target " + target + " (it does not carry \"" + text +
             "\")";
  }
  return "";
}

}  // namespace optfuse::jit
