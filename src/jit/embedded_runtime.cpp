#include "jit/embedded_runtime.h"

#include <Halide.h>

#ifdef OPTFUSE_EMBEDDED_RUNTIME
// runtime_gen/embedded_runtime.S: the object's bytes.
extern "C" {
extern const char optfuse_embedded_runtime_begin[] __attribute__((visibility("hidden")));
extern const char optfuse_embedded_runtime_end[] __attribute__((visibility("hidden")));
}
#endif

namespace optfuse::jit {
namespace {

// Whether kernels of `target` may link against the embedded runtime: features that change only
// the kernels' code (instruction sets, asserts, the user context) and nothing else.
bool served(const std::string& target) {
  using T = Halide::Target;
  if (!T::validate_target_string(target)) return false;
  const T t(target);
  if (t.os != T::Linux || t.arch != T::X86 || t.bits != 64) return false;
  T kept(t.os, t.arch, t.bits);
  for (T::Feature f :
       {T::SSE41, T::AVX, T::AVX2, T::FMA, T::FMA4, T::F16C, T::AVX512, T::AVX512_KNL,
        T::AVX512_Skylake, T::AVX512_Cannonlake, T::AVX512_SapphireRapids, T::NoRuntime,
        T::UserContext, T::NoAsserts, T::NoBoundsQuery})
    if (t.has_feature(f)) kept = kept.with_feature(f);
  return kept == t;
}

}  // namespace

std::shared_ptr<const std::vector<char>> embedded_runtime(const std::string& target) {
#ifdef OPTFUSE_EMBEDDED_RUNTIME
  if (!served(target)) return nullptr;
  static const auto object = std::make_shared<const std::vector<char>>(
      optfuse_embedded_runtime_begin, optfuse_embedded_runtime_end);
  return object;
#else
  (void)served;
  return nullptr;
#endif
}

}  // namespace optfuse::jit
