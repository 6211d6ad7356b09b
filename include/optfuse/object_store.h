#pragma once
// ObjectStore: the seam where a persistent cache of compiled objects plugs into an engine
// (DiskCache, cache.h, is the one optfuse ships), and what the engine tells it about an object.
#include <memory>
#include <string>
#include <vector>

#include "optfuse/kernel.h"

namespace optfuse {

// What the engine knows about an object besides its key; a store that records it must check it
// on get (DiskCache does), so an entry for another kernel is a miss, never a wrong kernel.
struct ObjectInfo {
  std::string kind;       // "kernel" or "runtime"
  std::string name;       // the graph's name (for listings only)
  std::string target;     // resolved Halide target
  std::string signature;  // signature_text() of a kernel; "halide-runtime" for a runtime
};

// The seam where a persistent cache plugs in: given a key, return a stored object file or
// nothing; after a compile, store it. An engine uses a DiskCache (cache.h) unless it is given
// another (EngineOptions::object_store, Engine::set_object_store) or is memory-only. A
// returned object this process cannot load (not an ELF relocatable object for its machine) is
// never handed to the JIT, and one the JIT cannot link (a symbol it lacks or cannot resolve) is
// discard()ed: either way the engine treats it as a miss, compiles and put()s the object again.
class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  virtual bool get(const std::string& key, std::vector<char>* object) = 0;
  virtual void put(const std::string& key, const std::vector<char>& object) = 0;
  // The engine calls these; by default they ignore `info`.
  virtual bool get(const std::string& key, const ObjectInfo& info, std::vector<char>* object) {
    return get(key, object);
  }
  virtual void put(const std::string& key, const ObjectInfo& info,
                   const std::vector<char>& object) {
    put(key, object);
  }
  // Held (until the returned handle is released) while `key` is compiled, so that other
  // processes sharing the store wait for it instead of compiling it again. Default: no lock.
  virtual std::shared_ptr<void> lock(const std::string& key) { return nullptr; }
  // The object get() returned for `key` could not be used (it did not link: `why`); the engine
  // compiles and put()s it again. A store should drop it. Default: nothing (put() replaces it).
  virtual void discard(const std::string& key, const std::string& why) {}
};

// A stable text of a signature (names, roles, dtypes in canonical order), checked by stores.
std::string signature_text(const KernelSignature& s);

}  // namespace optfuse
