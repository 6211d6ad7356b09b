#pragma once
// A small wrapper over LLVM ORC's LLJIT: load object files, look symbols up. LLVM stays inside
// jit.cpp; llvm::Error is converted to optfuse::Error at this boundary.
#include <memory>
#include <string>
#include <vector>

namespace optfuse::jit {

class Jit {
 public:
  // A JIT for the host, resolving undefined symbols (libc, libm, pthread) from the process.
  // Throws Error when LLVM cannot build one.
  static std::unique_ptr<Jit> create();
  ~Jit();
  Jit(const Jit&) = delete;
  Jit& operator=(const Jit&) = delete;

  // Links an object file (copied) into the JIT; `name` identifies it in messages. Throws Error,
  // before ORC sees it, for anything but an ELF relocatable object for this process's machine.
  void add_object(const std::vector<char>& object, const std::string& name);
  // Why add_object() would refuse `object` ("" if it would not): see src/jit/elf.h.
  static std::string object_problem(const std::vector<char>& object);
  // The address of `symbol`; throws Error naming it if absent or unresolvable.
  void* lookup(const std::string& symbol);

 private:
  struct Impl;
  explicit Jit(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace optfuse::jit
