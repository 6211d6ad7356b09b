#include "support/run_kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "jit/halide_bridge.h"

namespace optfuse::testing {
namespace {

// One tensor in its dtype's bytes.
std::vector<unsigned char> encode(const std::vector<double>& values, DType t) {
  size_t size = dtype_size(t);
  std::vector<unsigned char> bytes(values.size() * size);
  for (size_t i = 0; i < values.size(); ++i) jit::encode_scalar(values[i], t, &bytes[i * size]);
  return bytes;
}

double decode_f16(uint16_t h) {
  int exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  double sign = (h & 0x8000) ? -1 : 1;
  if (exp == 31) return frac ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(frac, -24);
  return sign * std::ldexp(1024 + frac, exp - 25);
}

double decode_one(const unsigned char* p, DType t) {
  switch (t) {
    case DType::F64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DType::F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::BF16: {
      uint32_t bits = uint32_t(p[0] | (p[1] << 8)) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::F16:
      return decode_f16(uint16_t(p[0] | (p[1] << 8)));
    case DType::Bool:
      return p[0] ? 1.0 : 0.0;
  }
  return NAN;
}

std::vector<double> decode(const std::vector<unsigned char>& bytes, DType t) {
  size_t size = dtype_size(t);
  std::vector<double> values(bytes.size() / size);
  for (size_t i = 0; i < values.size(); ++i) values[i] = decode_one(&bytes[i * size], t);
  return values;
}

bool close(double got, double want, double rel_tol, double abs_tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= abs_tol + rel_tol * std::fabs(want);
}

}  // namespace

Tensors run_kernel(const Kernel& k, const Tensors& tensors, const Scalars& scalars,
                   Aliasing aliasing) {
  return run_kernel(k, tensors, scalars, RunOptions{aliasing}, nullptr);
}

Tensors run_kernel(const Kernel& k, const Tensors& tensors, const Scalars& scalars,
                   const RunOptions& options, Scalars* results) {
  const Aliasing aliasing = options.aliasing;
  const KernelSignature& sig = k.signature();
  KernelCall call;
  std::vector<std::vector<unsigned char>> inputs, fresh;
  // The element count: a per-element input's (row and column state hold fewer values).
  int64_t n = tensors.empty() ? 0 : static_cast<int64_t>(tensors.begin()->second.size());
  for (const auto& in : sig.inputs)
    if (in.role != Role::RowState && in.role != Role::ColState) {
      n = static_cast<int64_t>(tensors.at(in.name).size());
      break;
    }
  for (const auto& in : sig.inputs) inputs.push_back(encode(tensors.at(in.name), in.dtype));
  for (auto& bytes : inputs) call.inputs.push_back(bytes.data());
  for (const auto& s : sig.scalars) call.scalars.push_back(scalars.at(s.name));
  fresh.reserve(sig.outputs.size());
  std::vector<std::vector<unsigned char>*> out_bytes;
  for (const auto& o : sig.outputs) {
    int i = sig.input_index(o.replaces);
    if (aliasing == Aliasing::InPlace && i >= 0) {
      out_bytes.push_back(&inputs[i]);
    } else {
      const size_t count = i >= 0 ? tensors.at(o.replaces).size() : static_cast<size_t>(n);
      fresh.emplace_back(count * dtype_size(o.dtype), 0xAB);
      out_bytes.push_back(&fresh.back());
    }
    call.outputs.push_back(out_bytes.back()->data());
  }
  call.n = n;
  call.cols = options.cols;
  call.batch_rows = options.batch_rows;
  std::vector<double> result_values(sig.results.size(), NAN);
  call.results = result_values.data();
  k.run(call);
  if (results) {
    results->clear();
    for (size_t i = 0; i < sig.results.size(); ++i)
      (*results)[sig.results[i].name] = result_values[i];
  }
  Tensors result;
  for (size_t i = 0; i < sig.outputs.size(); ++i)
    result[sig.outputs[i].replaces] = decode(*out_bytes[i], sig.outputs[i].dtype);
  return result;
}

void expect_close(const Tensors& got, const Tensors& want, double rel_tol, double abs_tol) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << "missing output " << name;
    const std::vector<double>& g = it->second;
    ASSERT_EQ(g.size(), w.size()) << name;
    int reported = 0;
    for (size_t i = 0; i < w.size() && reported < 5; ++i) {
      if (!close(g[i], w[i], rel_tol, abs_tol)) {
        ADD_FAILURE() << "output " << name << "[" << i << "]: got " << g[i] << ", want " << w[i];
        ++reported;
      }
    }
  }
}

}  // namespace optfuse::testing
