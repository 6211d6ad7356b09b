#include "bench/unfused.h"

#include "bench/support.h"

namespace optfuse::bench {
namespace {

// Single-op graphs. `x` is the array written (in place unless redirected), `y`, `z` are read.
Graph unary_scalar(const char* name, Op op) {  // x' = x <op> s
  Graph g(name);
  Value x = g.param("x");
  g.output("x", g.make(op, {x, g.scalar("s")}));
  return g;
}

Graph lerp() {  // x' = x + w * (y - x)
  Graph g("lerp");
  Value x = g.param("x"), y = g.grad("y");
  g.output("x", x + g.scalar("w") * (y - x));
  return g;
}

Graph axpy() {  // x' = x + s * y
  Graph g("axpy");
  Value x = g.param("x"), y = g.grad("y");
  g.output("x", x + g.scalar("s") * y);
  return g;
}

Graph addcmul_square() {  // x' = x + s * y * y  (addcmul_(y, y, value=s): y is read once)
  Graph g("addcmul");
  Value x = g.param("x"), y = g.grad("y");
  g.output("x", x + g.scalar("s") * (y * y));
  return g;
}

Graph square_root() {  // out = sqrt(x), written to another array
  Graph g("sqrt");
  g.output("x", sqrt(g.param("x")));
  return g;
}

Graph addcdiv() {  // x' = x + s * (y / z)
  Graph g("addcdiv");
  Value x = g.param("x"), y = g.grad("y"), z = g.state("z");
  g.output("x", x + g.scalar("s") * (y / z));
  return g;
}

}  // namespace

void Unfused::add(const char* op, const Graph& g, const std::map<std::string, float*>& tensors,
                  const std::map<std::string, double>& scalars, int64_t n,
                  const std::map<std::string, float*>& out) {
  Pass pass;
  pass.kernel = engine().kernel(g);
  pass.call = make_call(*pass.kernel, tensors, scalars, n, out);
  const KernelSignature& sig = pass.kernel->signature();
  traffic_ += static_cast<int64_t>(sig.inputs.size() + sig.outputs.size()) * 4;
  calls_.push_back(std::move(pass));
  ops_.push_back(op);
}

Unfused Unfused::adamw(float* p, float* g, float* m, float* v, float* t, int64_t n,
                       const std::map<std::string, double>& s) {
  Unfused u;
  u.add("mul", unary_scalar("mul", Op::Mul), {{"x", p}}, {{"s", s.at("decay")}}, n);
  u.add("lerp", lerp(), {{"x", m}, {"y", g}}, {{"w", s.at("one_minus_beta1")}}, n);
  u.add("mul", unary_scalar("mul", Op::Mul), {{"x", v}}, {{"s", s.at("beta2")}}, n);
  u.add("addcmul", addcmul_square(), {{"x", v}, {"y", g}}, {{"s", s.at("one_minus_beta2")}}, n);
  u.add("sqrt", square_root(), {{"x", v}}, {}, n, {{"x", t}});
  u.add("div", unary_scalar("div", Op::Div), {{"x", t}},
        {{"s", 1.0 / s.at("inv_bias_correction2_sqrt")}}, n);
  u.add("add", unary_scalar("add", Op::Add), {{"x", t}}, {{"s", s.at("eps")}}, n);
  u.add("addcdiv", addcdiv(), {{"x", p}, {"y", m}, {"z", t}}, {{"s", -s.at("step_size")}}, n);
  return u;
}

Unfused Unfused::sgd_momentum(float* p, float* g, float* b, int64_t n, double lr, double momentum,
                              double dampening) {
  Unfused u;
  u.add("mul", unary_scalar("mul", Op::Mul), {{"x", b}}, {{"s", momentum}}, n);
  u.add("axpy", axpy(), {{"x", b}, {"y", g}}, {{"s", 1.0 - dampening}}, n);
  u.add("axpy", axpy(), {{"x", p}, {"y", b}}, {{"s", -lr}}, n);
  return u;
}

void Unfused::run() const {
  for (const Pass& pass : calls_) pass.kernel->run(pass.call);
}

std::string Unfused::label() const {
  std::string s = "unfused " + std::to_string(calls_.size()) + " kernels:";
  for (const auto& op : ops_) s += " " + op;
  return s;
}

}  // namespace optfuse::bench
