#pragma once
// The identity an ELF header gives an object (class, byte order, type, machine), and a check of
// it, header-only and free of LLVM and Halide: the JIT (jit.cpp) and the cache
// entries' object check (object_check.cpp) check an object before ORC parses it, because ORC links
// an object built for another machine without complaint and calling into it then crashes the
// process.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace optfuse::jit {

struct ElfIdentity {
  unsigned char elf_class = 0;  // 1: ELFCLASS32, 2: ELFCLASS64
  unsigned char data = 0;       // 1: ELFDATA2LSB (little-endian), 2: ELFDATA2MSB
  uint16_t machine = 0;         // e_machine (EM_X86_64, EM_AARCH64, ...)
};

namespace elf_detail {

constexpr unsigned char kClass32 = 1, kClass64 = 2, kLittle = 1, kBig = 2;
constexpr uint16_t kRelocatable = 1;  // ET_REL
constexpr uint32_t kNoBits = 8;       // SHT_NOBITS: takes no bytes in the file

// e_machine values (glibc's <elf.h>; spelled out so that no system header is needed) and the
// Halide architectures ("arch-bits") whose objects have them: those this Halide and LLVM compile
// (each checked against readelf). Objects for any other are not checked by the cache.
struct Arch {
  const char* name;
  ElfIdentity id;
};
constexpr Arch kArchs[] = {
    {"x86-64", {kClass64, kLittle, 62}},     // EM_X86_64
    {"x86-32", {kClass32, kLittle, 3}},      // EM_386
    {"arm-64", {kClass64, kLittle, 183}},    // EM_AARCH64
    {"arm-32", {kClass32, kLittle, 40}},     // EM_ARM
    {"riscv-64", {kClass64, kLittle, 243}},  // EM_RISCV
};

// An unsigned field of `size` bytes at `at` in byte order `data` (the caller checked the bounds).
inline uint64_t field(const char* at, size_t size, unsigned char data) {
  uint64_t v = 0;
  for (size_t i = 0; i < size; ++i) {
    auto byte = static_cast<unsigned char>(at[data == kLittle ? size - 1 - i : i]);
    v = (v << 8) | byte;
  }
  return v;
}

}  // namespace elf_detail

// The identity of the objects Halide emits for resolved target `target` ("x86-64-linux-avx2",
// "arm-64-linux", "x86-64-linux-cuda": a CUDA target's object is the host code, with the device
// code inside it). False for an architecture not listed above and for an OS whose objects are not
// ELF (windows: COFF, osx and ios: Mach-O, wasmrt: WebAssembly).
inline bool elf_identity_for_target(std::string_view target, ElfIdentity* id) {
  size_t arch_end = target.find('-');
  if (arch_end == std::string_view::npos) return false;
  size_t bits_end = target.find('-', arch_end + 1);
  if (bits_end == std::string_view::npos) return false;
  std::string_view arch = target.substr(0, bits_end);
  std::string_view os = target.substr(bits_end + 1, target.find('-', bits_end + 1) - bits_end - 1);
  if (os == "windows" || os == "osx" || os == "ios" || os == "wasmrt") return false;
  for (const elf_detail::Arch& a : elf_detail::kArchs)
    if (arch == a.name) {
      *id = a.id;
      return true;
    }
  return false;
}

// The identity of the objects this process can run: what the JIT accepts.
inline ElfIdentity host_elf_identity() {
  using namespace elf_detail;
#if defined(__x86_64__)
  return {kClass64, kLittle, 62};
#elif defined(__aarch64__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return {kClass64, kLittle, 183};
#elif defined(__i386__)
  return {kClass32, kLittle, 3};
#elif defined(__arm__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  return {kClass32, kLittle, 40};
#elif defined(__riscv) && __riscv_xlen == 64
  return {kClass64, kLittle, 243};
#else
#error "optfuse: add this architecture's ELF identity to src/jit/elf.h"
#endif
}

// "arm-64 (ELF machine 183)"; an unlisted machine by its number and class alone.
inline std::string elf_identity_name(const ElfIdentity& id) {
  std::string number = "ELF machine " + std::to_string(id.machine);
  for (const elf_detail::Arch& a : elf_detail::kArchs)
    if (a.id.machine == id.machine && a.id.elf_class == id.elf_class)
      return a.name + (" (" + number + ")");
  return number + (id.elf_class == elf_detail::kClass32 ? ", 32-bit" : ", 64-bit");
}

// What is wrong with `data` as a relocatable ELF object of identity `want` ("" if nothing): its
// ELF header (magic, class, byte order, version, type ET_REL, machine, header sizes) and that its
// section header table and every section's bytes lie inside the file. The sections' contents are
// left to ORC.
inline std::string elf_object_problem(const char* data, size_t size, const ElfIdentity& want) {
  using namespace elf_detail;
  constexpr char kElfMagic[4] = {0x7f, 'E', 'L', 'F'};
  if (size < 16) return "not an ELF object (" + std::to_string(size) + " bytes)";
  if (std::memcmp(data, kElfMagic, 4) != 0) return "not an ELF object (bad magic)";
  auto cls = static_cast<unsigned char>(data[4]), order = static_cast<unsigned char>(data[5]),
       version = static_cast<unsigned char>(data[6]);
  if ((cls != kClass32 && cls != kClass64) || (order != kLittle && order != kBig) || version != 1)
    return "corrupt ELF identification (class " + std::to_string(cls) + ", byte order " +
           std::to_string(order) + ", version " + std::to_string(version) + ")";
  const bool is64 = cls == kClass64;
  const size_t header = is64 ? 64 : 52, entry = is64 ? 64 : 40;  // Elf*_Ehdr, Elf*_Shdr
  if (size < header)
    return "truncated ELF header (" + std::to_string(size) + " of " + std::to_string(header) +
           " bytes)";
  auto at = [&](size_t off32, size_t off64, size_t n32, size_t n64) {
    return field(data + (is64 ? off64 : off32), is64 ? n64 : n32, order);
  };
  ElfIdentity got{cls, order, static_cast<uint16_t>(at(18, 18, 2, 2))};
  if (got.elf_class != want.elf_class || got.data != want.data || got.machine != want.machine)
    return "an object for " + elf_identity_name(got) + (order == kBig ? ", big-endian" : "") +
           ", expected " + elf_identity_name(want) + (want.data == kBig ? ", big-endian" : "");
  uint64_t type = at(16, 16, 2, 2);
  if (type != kRelocatable)
    return "an ELF object of type " + std::to_string(type) + ", expected a relocatable one (1)";
  uint64_t shoff = at(32, 40, 4, 8), ehsize = at(40, 52, 2, 2), shentsize = at(46, 58, 2, 2),
           shnum = at(48, 60, 2, 2), shstrndx = at(50, 62, 2, 2);
  if (ehsize != header || shentsize != entry)
    return "corrupt ELF header (header size " + std::to_string(ehsize) + ", section entry size " +
           std::to_string(shentsize) + ")";
  // Objects with 0xff00 or more sections (extended numbering) are not optfuse's.
  if (shnum == 0 || shstrndx >= shnum)
    return "corrupt ELF header (" + std::to_string(shnum) + " sections, names in section " +
           std::to_string(shstrndx) + ")";
  if (shoff > size || shnum * entry > size - shoff)
    return "truncated ELF object: its section table ends past byte " + std::to_string(size);
  for (uint64_t i = 0; i < shnum; ++i) {
    const char* s = data + shoff + i * entry;
    auto sfield = [&](size_t off32, size_t off64, size_t n32, size_t n64) {
      return field(s + (is64 ? off64 : off32), is64 ? n64 : n32, order);
    };
    uint64_t type_i = sfield(4, 4, 4, 4), offset = sfield(16, 24, 4, 8),
             bytes = sfield(20, 32, 4, 8);
    if (i == 0 || type_i == kNoBits) continue;  // (section 0 is the null section)
    if (offset > size || bytes > size - offset)
      return "truncated ELF object: section " + std::to_string(i) + " ends past byte " +
             std::to_string(size);
  }
  return "";
}

}  // namespace optfuse::jit
