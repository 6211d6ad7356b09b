#include "engine/object_linker.h"

#include <map>

#include "engine/runtime_object.h"
#include "jit/halide_bridge.h"
#include "jit/jit.h"
#include "jit/session.h"
#include "optfuse/error.h"

namespace optfuse::engine_detail {
namespace {

class JitLinker : public ObjectLinker {
 public:
  std::string link_problem(const std::string& kind, const std::string& target,
                           const std::string& key, const std::vector<char>& object) override {
    // Only this machine's objects can be linked here; the others had every check that does not
    // need a JIT (jit/object_check.h).
    if (!jit::Jit::object_problem(object).empty()) return "";
    try {
      if (kind == "runtime") {
        runtimes_[target] = jit::link_runtime(object, jit::target_uses_cuda(target));
      } else {
        const std::string fn = "optfuse_" + key;  // (as the engine names it)
        runtime_jit(target).link(object, fn + ".o", fn + "_argv", /*keep=*/false);
      }
    } catch (const Error& e) {
      return std::string("it does not link: ") + e.what();
    }
    return "";
  }

 private:
  // A JIT with `target`'s runtime: the cache's, when it linked, else one compiled for it.
  jit::Jit& runtime_jit(const std::string& target) {
    std::unique_ptr<jit::Jit>& jit = runtimes_[target];
    if (!jit) {
      bool compiled = false;
      jit = jit::link_runtime(*runtime_object(target, &compiled), jit::target_uses_cuda(target));
    }
    return *jit;
  }

  std::map<std::string, std::unique_ptr<jit::Jit>> runtimes_;
};

}  // namespace

std::unique_ptr<ObjectLinker> make_object_linker() { return std::make_unique<JitLinker>(); }

}  // namespace optfuse::engine_detail
