#include "tools/unfused.h"

#include <chrono>
#include <memory>

#include "optfuse/error.h"
#include "optim/rule.h"

namespace optfuse::tools {
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

KernelCall bind_call(const Kernel& k, const std::map<std::string, float*>& tensors,
                     const std::map<std::string, double>& scalars, int64_t n,
                     const std::map<std::string, float*>& out) {
  const KernelSignature& sig = k.signature();
  KernelCall call;
  call.n = n;
  for (const auto& in : sig.inputs) {
    auto it = tensors.find(in.name);
    if (it == tensors.end()) throw Error(k.name() + ": no array given for input '" + in.name + "'");
    call.inputs.push_back(it->second);
  }
  for (const auto& s : sig.scalars) {
    auto it = scalars.find(s.name);
    if (it == scalars.end()) throw Error(k.name() + ": no value given for scalar '" + s.name + "'");
    call.scalars.push_back(it->second);
  }
  for (const auto& o : sig.outputs) {
    auto it = out.find(o.replaces);
    if (it != out.end()) {
      call.outputs.push_back(it->second);
      continue;
    }
    int i = sig.input_index(o.replaces);
    if (i < 0) throw Error(k.name() + ": output replaces unknown input '" + o.replaces + "'");
    call.outputs.push_back(call.inputs[static_cast<size_t>(i)]);
  }
  return call;
}

void Unfused::add(Engine& e, const char* op, const Graph& g,
                  const std::map<std::string, float*>& tensors,
                  const std::map<std::string, double>& scalars, int64_t n,
                  const std::map<std::string, float*>& out) {
  Pass pass;
  pass.kernel = e.kernel(g);
  pass.call = bind_call(*pass.kernel, tensors, scalars, n, out);
  const KernelSignature& sig = pass.kernel->signature();
  traffic_ += static_cast<int64_t>(sig.inputs.size() + sig.outputs.size()) * 4;
  calls_.push_back(std::move(pass));
  ops_.push_back(op);
}

Unfused Unfused::adamw(Engine& e, float* p, float* g, float* m, float* v, float* t, int64_t n,
                       const std::map<std::string, double>& s) {
  Unfused u;
  u.add(e, "mul", unary_scalar("mul", Op::Mul), {{"x", p}}, {{"s", s.at("decay")}}, n);
  u.add(e, "lerp", lerp(), {{"x", m}, {"y", g}}, {{"w", s.at("one_minus_beta1")}}, n);
  u.add(e, "mul", unary_scalar("mul", Op::Mul), {{"x", v}}, {{"s", s.at("beta2")}}, n);
  u.add(e, "addcmul", addcmul_square(), {{"x", v}, {"y", g}}, {{"s", s.at("one_minus_beta2")}}, n);
  u.add(e, "sqrt", square_root(), {{"x", v}}, {}, n, {{"x", t}});
  u.add(e, "div", unary_scalar("div", Op::Div), {{"x", t}},
        {{"s", 1.0 / s.at("inv_bias_correction2_sqrt")}}, n);
  u.add(e, "add", unary_scalar("add", Op::Add), {{"x", t}}, {{"s", s.at("eps")}}, n);
  u.add(e, "addcdiv", addcdiv(), {{"x", p}, {"y", m}, {"z", t}}, {{"s", -s.at("step_size")}}, n);
  return u;
}

Unfused Unfused::sgd_momentum(Engine& e, float* p, float* g, float* b, int64_t n, double lr,
                              double momentum, double dampening) {
  Unfused u;
  u.add(e, "mul", unary_scalar("mul", Op::Mul), {{"x", b}}, {{"s", momentum}}, n);
  u.add(e, "axpy", axpy(), {{"x", b}, {"y", g}}, {{"s", 1.0 - dampening}}, n);
  u.add(e, "axpy", axpy(), {{"x", p}, {"y", b}}, {{"s", -lr}}, n);
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

UnfusedAdamW::UnfusedAdamW(Engine& e, const std::vector<std::vector<float>>& params,
                           const std::vector<std::vector<float>>& grads,
                           const std::vector<bool>& decay, double lr, double beta1, double beta2,
                           double weight_decay) {
  // The scalars as the fused step computes them (the library's AdamW rule, at step 10).
  const std::unique_ptr<optim::UpdateRule> rule = optim::make_rule("adamw");
  Options hyper = rule->defaults();
  hyper["lr"] = lr;
  hyper["betas"] = {beta1, beta2};
  arrays_.reserve(4 * params.size());  // no reallocation: the calls keep the arrays' addresses
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t n = params[i].size();
    arrays_.push_back(params[i]);
    arrays_.emplace_back(n, 0.0f);   // exp_avg
    arrays_.emplace_back(n, 1e-6f);  // exp_avg_sq
    arrays_.emplace_back(n, 0.0f);   // the temporary
    float* a[4];
    for (int k = 0; k < 4; ++k) a[k] = arrays_[arrays_.size() - 4 + static_cast<size_t>(k)].data();
    hyper["weight_decay"] = decay[i] ? weight_decay : 0.0;
    std::map<std::string, double> scalars;
    rule->scalars(hyper, optim::TensorStep{10, false}, &scalars);
    steps_.push_back(Unfused::adamw(e, a[0], const_cast<float*>(grads[i].data()), a[1], a[2], a[3],
                                    static_cast<int64_t>(n), scalars));
    bytes_ += steps_.back().traffic_per_element() * static_cast<int64_t>(n);
  }
  for (const Unfused& u : steps_) u.run();  // first touch of the temporaries' pages
}

double UnfusedAdamW::timed_step() const {
  auto t0 = std::chrono::steady_clock::now();
  for (const Unfused& u : steps_) u.run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace optfuse::tools
