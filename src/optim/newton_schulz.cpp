#include "optim/newton_schulz.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "optfuse/error.h"
#include "optim/precision.h"

namespace optfuse {

std::string newton_schulz_callee(const NewtonSchulz& ns) {
  char text[192];
  std::snprintf(text, sizeof text,
                "newton_schulz:a=%.17g,b=%.17g,c=%.17g,steps=%d,eps=%.17g,products=%s", ns.a, ns.b,
                ns.c, ns.steps, ns.eps, ns.f32_products ? "f32" : "bf16");
  return text;
}

NewtonSchulz parse_newton_schulz(std::string_view callee) {
  const std::string text(callee);
  auto bad = [&](const std::string& why) {
    return Error("opaque op \"" + text + "\": " + why +
                 " (expected newton_schulz:a=A,b=B,c=C,steps=N,eps=E,products=bf16|f32)");
  };
  const std::string_view prefix = "newton_schulz:";
  if (callee.substr(0, prefix.size()) != prefix) throw bad("not a newton_schulz callee");
  std::map<std::string, std::string> items;
  std::string_view rest = callee.substr(prefix.size());
  while (!rest.empty()) {
    const size_t comma = std::min(rest.find(','), rest.size());
    const std::string item(rest.substr(0, comma));
    rest = rest.substr(std::min(comma + 1, rest.size()));
    const size_t eq = item.find('=');
    if (eq == std::string::npos) throw bad("'" + item + "' has no '='");
    if (!items.emplace(item.substr(0, eq), item.substr(eq + 1)).second)
      throw bad("'" + item.substr(0, eq) + "' given twice");
  }
  auto take = [&](const char* key) {
    auto it = items.find(key);
    if (it == items.end()) throw bad(std::string("'") + key + "' is missing");
    std::string value = it->second;
    items.erase(it);
    return value;
  };
  auto number = [&](const char* key) {
    const std::string value = take(key);
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' || !std::isfinite(v))
      throw bad(std::string("'") + key + "' is not a finite number");
    return v;
  };
  NewtonSchulz ns;
  ns.a = number("a");
  ns.b = number("b");
  ns.c = number("c");
  ns.eps = number("eps");
  const double steps = number("steps");
  if (steps != std::floor(steps) || steps < 0 || steps >= 100)
    throw bad("steps must be a whole number below 100");
  ns.steps = static_cast<int>(steps);
  const std::string products = take("products");
  if (products != "bf16" && products != "f32") throw bad("products must be bf16 or f32");
  ns.f32_products = products == "f32";
  if (!items.empty()) throw bad("unknown constant '" + items.begin()->first + "'");
  return ns;
}

}  // namespace optfuse

namespace optfuse::optim {
namespace {

float bf16(float x) { return from_bf16_bits(to_bf16_bits(x)); }

void round_bf16(std::vector<float>& v) {
  for (float& x : v) x = bf16(x);
}

// The CBLAS entry point, declared here so that nothing links a BLAS: its ABI is fixed (enums as
// int, 32-bit sizes in the LP64 builds Debian ships).
using CblasSgemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                            const float* a, int lda, const float* b, int ldb, float beta, float* c,
                            int ldc);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

CblasSgemm load_cblas() {
  static const CblasSgemm sgemm = [] {
    for (const char* lib : {"libopenblas.so.0", "libblas.so.3", "libcblas.so.3"})
      if (void* h = ::dlopen(lib, RTLD_NOW | RTLD_LOCAL))
        if (void* f = ::dlsym(h, "cblas_sgemm")) return reinterpret_cast<CblasSgemm>(f);
    return CblasSgemm(nullptr);
  }();
  if (!sgemm)
    throw Error(
        "Muon's Newton-Schulz step needs a CBLAS library at run time and none loaded "
        "(libopenblas.so.0, libblas.so.3, libcblas.so.3): install one (Debian: apt-get install "
        "libopenblas0), or register your own \"newton_schulz\" opaque op "
        "(include/optfuse/optim.h)");
  return sgemm;
}

}  // namespace

void newton_schulz_bf16(const NewtonSchulz& ns, const Gemm& gemm, const float* g, float* out,
                        int64_t rows, int64_t cols) {
  // X is m x n with m <= n: torch orthogonalizes the transpose of a tall matrix.
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
  auto at = [&](int64_t i, int64_t j) { return tall ? j * cols + i : i * cols + j; };
  std::vector<float> x(static_cast<size_t>(m * n));
  double squares = 0;  // (torch accumulates in f32; the norm is rounded to bf16 either way)
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float v = bf16(g[at(i, j)]);
      x[static_cast<size_t>(i * n + j)] = v;
      squares += double(v) * v;
    }
  const float norm =
      bf16(std::max(bf16(static_cast<float>(std::sqrt(squares))), static_cast<float>(ns.eps)));
  for (float& v : x) v = bf16(v / norm);
  std::vector<float> a(static_cast<size_t>(m * m)), b(a.size()), y(x.size());
  for (int step = 0; step < ns.steps; ++step) {
    gemm(true, m, m, n, 1.0f, x.data(), x.data(), 0.0f, a.data());  // A = X X^T
    round_bf16(a);
    b = a;  // B = b A + c A A
    gemm(false, m, m, m, static_cast<float>(ns.c), a.data(), a.data(), static_cast<float>(ns.b),
         b.data());
    round_bf16(b);
    y = x;  // X = a X + B X
    gemm(false, m, n, m, 1.0f, b.data(), x.data(), static_cast<float>(ns.a), y.data());
    round_bf16(y);
    x.swap(y);
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) out[at(i, j)] = x[static_cast<size_t>(i * n + j)];
}

Gemm cblas_gemm() {
  const CblasSgemm sgemm = load_cblas();
  return [sgemm](bool b_transposed, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 const float* b, float beta, float* y) {
    if (std::max({m, n, k}) > INT32_MAX) throw Error("Newton-Schulz: a matrix too large for CBLAS");
    const int M = static_cast<int>(m), N = static_cast<int>(n), K = static_cast<int>(k);
    sgemm(kRowMajor, kNoTrans, b_transposed ? kTrans : kNoTrans, M, N, K, alpha, a, K, b,
          b_transposed ? K : N, beta, y, N);
  };
}

}  // namespace optfuse::optim

namespace optfuse {

OpaqueFn newton_schulz_cblas() {
  return [](const OpaqueCall& call) {
    const NewtonSchulz ns = parse_newton_schulz(call.callee);
    const int64_t cols = call.cols > 0 ? call.cols : call.n, rows = call.n / cols;
    // (f64 updates are rounded to f32 first: that differs from torch's one rounding to bf16
    // only for a value within an f32 rounding of a bf16 midpoint.)
    const std::vector<float> g = optim::widen_to_f32(call.in, call.dtype, call.n);
    std::vector<float> o(g.size());
    optim::newton_schulz_bf16(ns, optim::cblas_gemm(), g.data(), o.data(), rows, cols);
    switch (call.dtype) {
      case DType::F32:
        std::memcpy(call.out, o.data(), o.size() * sizeof(float));
        break;
      case DType::F64:
        std::copy(o.begin(), o.end(), static_cast<double*>(call.out));
        break;
      case DType::BF16:
      case DType::F16:
        std::transform(o.begin(), o.end(), static_cast<uint16_t*>(call.out),
                       [&](float v) { return optim::to_16bit(v, call.dtype); });
        break;
      default:
        internal_error("newton_schulz: a non-float operand");
    }
  };
}

}  // namespace optfuse
