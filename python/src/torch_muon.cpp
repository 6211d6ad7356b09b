// torch.optim.Muon's _zeropower_via_newtonschulz in ATen, on torch's BLAS and threads: op for op
// (torch's own bits), or with f32 products rounded to bf16 (NewtonSchulz::f32_products).
#include "torch_muon.h"

#include <ATen/ATen.h>

#include "optfuse/optim.h"

namespace optfuse::python {
namespace {

at::ScalarType scalar_type(DType t) {
  switch (t) {
    case DType::F64:
      return at::kDouble;
    case DType::BF16:
      return at::kBFloat16;
    case DType::F16:
      return at::kHalf;
    default:
      return at::kFloat;
  }
}

// torch's own ops on bf16 matrices: torch's bits.
at::Tensor bf16_products(at::Tensor x, const NewtonSchulz& ns) {
  x.div_(at::clamp(x.norm(), ns.eps));
  for (int i = 0; i < ns.steps; ++i) {
    const at::Tensor gram = at::mm(x, x.t());
    const at::Tensor update = at::addmm(gram, gram, gram, /*beta=*/ns.b, /*alpha=*/ns.c);
    x = at::addmm(x, update, x, /*beta=*/ns.a);
  }
  return x;
}

// The same iteration with f32 products of the same bf16 values, each rounded to bf16 once as
// torch's bf16 results are: the sums in another order. (torch's bf16 products run at a small
// fraction of its f32 ones on CPUs without AVX512-BF16 or AMX.)
at::Tensor f32_products(const at::Tensor& x_bf16, const NewtonSchulz& ns) {
  auto bf16 = [](const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kFloat); };
  at::Tensor x = x_bf16.to(at::kFloat);
  const at::Tensor norm = bf16(at::clamp(bf16(x.norm()), ns.eps));
  x = bf16(x / norm);
  for (int i = 0; i < ns.steps; ++i) {
    const at::Tensor gram = bf16(at::mm(x, x.t()));
    const at::Tensor update = bf16(at::addmm(gram, gram, gram, /*beta=*/ns.b, /*alpha=*/ns.c));
    x = bf16(at::addmm(x, update, x, /*beta=*/ns.a));
  }
  return x;
}

void newton_schulz(const OpaqueCall& call) {
  const NewtonSchulz ns = parse_newton_schulz(call.callee);
  const int64_t cols = call.cols > 0 ? call.cols : call.n, rows = call.n / cols;
  const auto options = at::TensorOptions().dtype(scalar_type(call.dtype));
  at::Tensor x = at::from_blob(const_cast<void*>(call.in), {rows, cols}, options)
                     .to(at::kBFloat16, /*non_blocking=*/false, /*copy=*/true);
  const bool tall = rows > cols;
  if (tall) x = x.t();
  x = ns.f32_products ? f32_products(x, ns) : bf16_products(x, ns);
  if (tall) x = x.t();
  at::from_blob(call.out, {rows, cols}, options).copy_(x);
}

}  // namespace

void register_torch_newton_schulz(Engine& engine) {
  engine.register_opaque("newton_schulz", newton_schulz, OpaqueScope::Matrix);
}

}  // namespace optfuse::python
