#pragma once
// A small wrapper over LLVM ORC's LLJIT: load object files, look symbols up. LLVM stays inside
// jit.cpp; llvm::Error is converted to optfuse::Error at this boundary.
#include <memory>
#include <string>
#include <vector>

#include "optfuse/error.h"

namespace optfuse::jit {

// An object that does not link (Jit::link): its symbols cannot all be resolved, or the one asked
// for is not in it.
class LinkError : public Error {
 public:
  using Error::Error;
};

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
  // add_object(), then the address of `symbol`, which links the object (ORC links lazily, at the
  // first lookup of one of its symbols). If that fails (a symbol the object needs is nowhere,
  // `symbol` is not in it), the object is removed again, leaving the JIT as it was, and Error
  // names `name` and why (a LinkError). `keep` false: removed after a successful link too (a check
  // only).
  void* link(const std::vector<char>& object, const std::string& name, const std::string& symbol,
             bool keep = true);
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
