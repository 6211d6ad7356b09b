#include "jit/halide_bridge.h"

#include <Halide.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/LLVMContext.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>

#include "jit/kernel_object.h"
#include "lower/lower.h"
#include "optfuse/error.h"

namespace optfuse::jit {
namespace {

namespace fs = std::filesystem;

// A fresh private directory for Halide's output files, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "optfuse-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw Error("cannot create a temporary directory in " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Halide::Target halide_target(const std::string& resolved) { return Halide::Target(resolved); }

// What the runtime is compiled for: the user context carries each call's error buffer to the
// error handler.
Halide::Target runtime_target(const std::string& resolved) {
  return halide_target(resolved).with_feature(Halide::Target::UserContext);
}

// What kernels are compiled for: the runtime is linked separately. CPU kernels carry no Halide
// assertions and no bounds-query mode: every buffer a kernel sees is built by
// src/engine/kernel_impl.cpp from the kernel's own signature and a call it has checked (counts,
// sizes, alignment), never by a user, so the assertions re-checked what is true by construction;
// with the bounds queries they were a fifth of a cold compile (bench/README.md, "Smaller
// kernels"). CUDA kernels keep them: there they also carry the device calls' error codes out.
Halide::Target kernel_target(const std::string& resolved) {
  Halide::Target t = runtime_target(resolved).with_feature(Halide::Target::NoRuntime);
  if (!t.has_gpu_feature())
    t = t.with_feature(Halide::Target::NoAsserts).with_feature(Halide::Target::NoBoundsQuery);
  return t;
}

// Runs `f`, turning Halide's exceptions into optfuse::Error (internal ones into internal errors).
template <typename F>
auto halide_call(const std::string& what, F&& f) {
  try {
    return f();
  } catch (const Halide::InternalError& e) {
    internal_error(what + ": Halide: " + e.what());
  } catch (const Halide::Error& e) {
    throw Error(what + ": Halide: " + e.what());
  }
}

// This CPU's Halide target. Halide 14 says avx512_sapphirerapids for any CPU with AVX512-VNNI and
// AVX512-BF16, and LLVM then compiles for -mcpu=sapphirerapids, which also uses AVX512-FP16 and
// AVX-VNNI: on AMD Zen 4 (neither) f16 kernels died of SIGILL on vcvtph2psx. Without both, the
// feature is dropped (avx512_cannonlake stays: Zen 4 has all of it).
Halide::Target host_target() {
  Halide::Target t = Halide::get_host_target();
#if defined(__x86_64__) || defined(__i386__)
  if (t.has_feature(Halide::Target::AVX512_SapphireRapids)) {
    unsigned a, b, c, d;
    bool fp16 = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 23));
    bool avx_vnni = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
    if (!fp16 || !avx_vnni) t = t.without_feature(Halide::Target::AVX512_SapphireRapids);
  }
#endif
  return t;
}

// lower.h's CpuExtras for resolved target `target`: see cpu_extras_key.
lower::CpuExtras cpu_extras(const std::string& target) {
  lower::CpuExtras e;
#if defined(__x86_64__) || defined(__i386__)
  static const bool bf16 = [] {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
  }();
  static const std::string own = host_target().to_string();
  e.avx512_bf16 = bf16 && target == own;
#else
  (void)target;
#endif
  return e;
}

}  // namespace

std::string cpu_extras_key(const std::string& target) {
  return cpu_extras(target).avx512_bf16 ? "+avx512bf16" : "";
}

std::string resolve_target(const std::string& target) {
  // A leading "host" (alone or as in "host-cuda") is $OPTFUSE_HOST_TARGET when set, else this
  // CPU's target; features after it are added by Halide's parser.
  std::string t = target;
  if (t == "host" || t.rfind("host-", 0) == 0) {
    const char* forced = std::getenv("OPTFUSE_HOST_TARGET");
    std::string base = forced && *forced ? forced : host_target().to_string();
    if (base == "host" || base.rfind("host-", 0) == 0 ||
        !Halide::Target::validate_target_string(base))
      throw Error("OPTFUSE_HOST_TARGET=\"" + base +
                  "\": expected a Halide target string such as "
                  "\"x86-64-linux-avx-avx2-f16c-fma-sse41\"");
    t = base + t.substr(4);
  }
  if (!Halide::Target::validate_target_string(t))
    throw Error("unknown target \"" + target +
                "\": expected \"host\" or a Halide target string "
                "such as \"x86-64-linux-avx2\"");
  return Halide::Target(t).to_string();
}

bool target_uses_cuda(const std::string& target) {
  return halide_target(target).has_feature(Halide::Target::CUDA);
}

Schedule resolve_schedule(const Schedule& s, const std::string& target) {
  return lower::resolve_schedule(s, halide_target(target));
}

std::vector<char> compile_kernel_object(const Graph& canonical, const Schedule& s,
                                        const std::string& target, const std::string& fn_name) {
  return halide_call("compiling " + fn_name, [&] {
    Halide::Target t = kernel_target(target);
    lower::Lowered l = lower::lower(canonical, s, t, cpu_extras(target));
    return compile_module_to_object(l.pipeline.compile_to_module(l.args, fn_name, t));
  });
}

std::string kernel_object_target(const std::string& target) {
  static std::mutex mutex;
  static std::map<std::string, std::string> known;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = known.find(target); it != known.end()) return it->second;
  if (!Halide::Target::validate_target_string(target)) return "";
  // The metadata records the code generator's target, which adds the features the requested
  // ones imply (x86: avx2 -> avx -> sse41); asking a code generator is the only way that stays
  // exact. Creating one generates no code.
  std::string text;
  try {
    llvm::LLVMContext context;
    text = Halide::Internal::CodeGen_LLVM::new_for_target(kernel_target(target), context)
               ->get_target()
               .to_string();
  } catch (const Halide::Error&) {
    // No code generator for it (an architecture this LLVM was built without, Hexagon without
    // HVX): nothing is compiled for it either. Remembered too.
  }
  return known[target] = text;
}

std::vector<char> compile_runtime_object(const std::string& target) {
  return halide_call("compiling the Halide runtime", [&] {
    TempDir dir;
    std::string path = dir.file("runtime.o");
    Halide::compile_standalone_runtime(path, runtime_target(target));
    return read_file(path);
  });
}

std::string lowered_stmt(const Graph& canonical, const Schedule& s, const std::string& target) {
  return halide_call("lowering", [&] {
    Halide::Target t = kernel_target(target);
    lower::Lowered l = lower::lower(canonical, s, t, cpu_extras(target));
    TempDir dir;
    std::string path = dir.file("kernel.stmt");
    l.pipeline.compile_to_lowered_stmt(path, l.args, Halide::StmtOutputFormat::Text, t);
    std::vector<char> text = read_file(path);
    return std::string(text.begin(), text.end());
  });
}

std::string toolchain_version() {
  // Halide.h defines no version macro; the package is Halide 14 (CMake: find_package(Halide 14)).
  return "halide-14 (llvm " + std::to_string(Halide::Internal::get_llvm_version()) + ") llvm-" +
         LLVM_VERSION_STRING;
}

void encode_scalar(double value, DType t, void* out) {
  switch (t) {
    case DType::F64:
      std::memcpy(out, &value, 8);
      return;
    case DType::F32: {
      float f = static_cast<float>(value);
      std::memcpy(out, &f, 4);
      return;
    }
    case DType::F16: {
      uint16_t bits = Halide::float16_t(value).to_bits();  // rounds from double directly
      std::memcpy(out, &bits, 2);
      return;
    }
    case DType::BF16: {
      uint16_t bits = Halide::bfloat16_t(value).to_bits();
      std::memcpy(out, &bits, 2);
      return;
    }
    case DType::Bool: {
      bool b = value != 0;
      std::memcpy(out, &b, 1);
      return;
    }
    case DType::U8: {
      uint8_t b = static_cast<uint8_t>(std::clamp(value, 0.0, 255.0));
      std::memcpy(out, &b, 1);
      return;
    }
  }
  internal_error("encode_scalar: bad dtype");
}

}  // namespace optfuse::jit
