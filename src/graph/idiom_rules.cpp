// The idiom rules. Each rule either RECOGNIZES a normal form (returns the node itself: reported,
// nothing changes) or REWRITES a user spelling into the normal form the library's graphs are
// built in. A rule that is not bit-exact states the difference and why the normal form is the
// one to compute; all are exact in real arithmetic.
//
// "Uniform" below means the same for every element (scalars, constants and math on them); such
// subexpressions become host scalars afterwards (normalize.cpp), computed in double.
#include "graph/idiom_rules.h"

#include <string>

namespace optfuse::idioms_detail {
namespace {

using rewrite::any;
using rewrite::constant;
using rewrite::input;
using rewrite::Match;
using rewrite::Pattern;
using rewrite::tensor;
using rewrite::uniform;

using Result = std::optional<NodeId>;

Pattern P(Op op, std::vector<Pattern> args, std::string bind = "") {
  return Pattern(op, std::move(args), std::move(bind));
}

Result recognized(const Match& m) { return m.root; }

// 1 - b^t (t >= 1, 0 <= b < 1: in (0, 1]) or a scalar the caller names bias_correction*, or the
// square root of either. Only such divisors are rewritten: they are known to be positive.
bool is_bias_correction(const Graph& g, NodeId id) {
  const Node& n = g.node(id);
  if (n.is_tensor) return false;
  if (n.op == Op::Sqrt) return is_bias_correction(g, n.args[0]);
  if (n.op == Op::Scalar) return n.name.rfind("bias_correction", 0) == 0;
  if (n.op != Op::Sub) return false;
  const Node& one = g.node(n.args[0]);
  return one.op == Op::Const && one.value == 1 && g.node(n.args[1]).op == Op::Pow;
}

Pattern bias_correction(std::string bind) {
  return Pattern::node(std::move(bind), is_bias_correction);
}

// `c` is 1 - b, spelled out or as the library's scalar "one_minus_<b>".
bool is_one_minus(const Graph& g, NodeId c, NodeId b) {
  const Node& n = g.node(c);
  if (n.op == Op::Sub) {
    const Node& one = g.node(n.args[0]);
    return one.op == Op::Const && one.value == 1 && n.args[1] == b;
  }
  return n.op == Op::Scalar && g.node(b).op == Op::Scalar &&
         n.name == "one_minus_" + g.node(b).name;
}

void add_ema_and_lerp(rewrite::RuleSet& rules) {
  // EMA b*x + (1-b)*y, torch's mul_/add_ (and addcmul_) form; also with "one_minus_b" hoisted.
  // Not rewritten into lerp: the two round differently and torch uses each in different places
  // (Adam: lerp for exp_avg, mul/addcmul for exp_avg_sq), so both are normal forms.
  rules.add(
      {"ema",
       P(Op::Add, {P(Op::Mul, {uniform("b"), tensor()}), P(Op::Mul, {uniform("c"), tensor()})}),
       [](Graph& g, const Match& m) -> Result {
         if (is_one_minus(g, m["c"], m["b"]) || is_one_minus(g, m["b"], m["c"]))
           return recognized(m);
         return std::nullopt;
       }});
  // lerp(x, y, w) = x + w*(y - x), torch's lerp for w < 0.5: the normal form.
  rules.add(
      {"lerp",
       P(Op::Add, {tensor("x"), P(Op::Mul, {uniform("w"), P(Op::Sub, {any("y"), any("x")})})}),
       [](Graph&, const Match& m) -> Result { return recognized(m); }});
  // x - w*(x - y) -> x + w*(y - x). Exact except the sign of a zero result (x = y = -0 gives -0
  // before and +0 after): -(a - b) is b - a, w*(-d) is -(w*d) and x - (-e) is x + e in IEEE.
  rules.add(
      {"lerp",
       P(Op::Sub, {tensor("x"), P(Op::Mul, {uniform("w"), P(Op::Sub, {any("x"), any("y")})})}),
       [](Graph& g, const Match& m) -> Result {
         Value x = g.value(m["x"]), y = g.value(m["y"]), w = g.value(m["w"]);
         return (x + w * (y - x)).id();
       }});
}

void add_scalar_separation(rewrite::RuleSet& rules) {
  // Gathers uniform factors so that scalar math is one host scalar and per-element math is
  // separate (the library's form: step_size * (m / denom), one_minus_beta2 * (g * g)).
  // Reassociation: each side rounds twice, so results may differ by an ulp; the uniform product
  // is computed on the host in double and rounded once, which is the more accurate of the two.
  // A square (s*g)*(s*g) is left whole: its factor is computed once and shared.
  rules.add({"uniform_factor",
             P(Op::Mul, {P(Op::Mul, {uniform("u"), tensor("x")}, "ux"), tensor("y")}),
             [](Graph& g, const Match& m) -> Result {
               if (m["ux"] == m["y"]) return std::nullopt;
               Value u = g.value(m["u"]), x = g.value(m["x"]), y = g.value(m["y"]);
               return (u * (x * y)).id();
             }});
  rules.add({"uniform_factor", P(Op::Mul, {uniform("u"), P(Op::Mul, {uniform("v"), tensor("x")})}),
             [](Graph& g, const Match& m) -> Result {
               Value u = g.value(m["u"]), v = g.value(m["v"]), x = g.value(m["x"]);
               return ((u * v) * x).id();
             }});
  rules.add({"uniform_factor", P(Op::Div, {P(Op::Mul, {uniform("u"), tensor("x")}), tensor("y")}),
             [](Graph& g, const Match& m) -> Result {
               Value u = g.value(m["u"]), x = g.value(m["x"]), y = g.value(m["y"]);
               return (u * (x / y)).id();
             }});
}

void add_bias_correction(rewrite::RuleSet& rules) {
  // x / bc -> x * (1/bc), the reciprocal a host scalar (torch's fused Adam and the library fold
  // bias corrections into host scalars: step_size = lr / bc1, 1 / sqrt(bc2)). One multiply by a
  // once-rounded reciprocal instead of a correctly rounded divide: within 1.5 ulp, not 0.5.
  rules.add({"bias_correction", P(Op::Div, {tensor("x"), bias_correction("bc")}),
             [](Graph& g, const Match& m) -> Result {
               Value x = g.value(m["x"]), bc = g.value(m["bc"]);
               return (x * (1.0 / bc)).id();
             }});
  rules.add({"bias_correction",
             P(Op::Mul, {tensor(), P(Op::Div, {constant(1), bias_correction("")})}),
             [](Graph&, const Match& m) -> Result { return recognized(m); }});
}

void add_adam_denominator(rewrite::RuleSet& rules) {
  // sqrt(v * (1/bc2)) -> sqrt(v) * (1/sqrt(bc2)): torch's denom = sqrt(v) / sqrt(bc2) + eps with
  // the reciprocal on the host, as the library computes it. bc2 > 0, so this holds in real
  // arithmetic for every v (NaN for v < 0 either way); the roundings differ by about an ulp.
  rules.add(
      {"adam_denominator",
       P(Op::Sqrt, {P(Op::Mul, {tensor("v"), P(Op::Div, {constant(1), bias_correction("bc")})})}),
       [](Graph& g, const Match& m) -> Result {
         Value v = g.value(m["v"]), bc = g.value(m["bc"]);
         return (sqrt(v) * (1.0 / sqrt(bc))).id();
       }});
  rules.add({"adam_denominator",
             P(Op::Add, {P(Op::Mul, {P(Op::Sqrt, {tensor()}), uniform()}), uniform()}),
             [](Graph&, const Match& m) -> Result { return recognized(m); }});
}

void add_weight_decay(rewrite::RuleSet& rules) {
  // Decoupled (AdamW, Lion): p - u*p -> p * (1 - u), torch's p.mul_(1 - lr * weight_decay).
  // One multiply by a host-rounded factor instead of a multiply and a subtract: ~1 ulp apart.
  rules.add({"decoupled_weight_decay",
             P(Op::Sub, {tensor("x"), P(Op::Mul, {uniform("u"), any("x")})}),
             [](Graph& g, const Match& m) -> Result {
               Value x = g.value(m["x"]), u = g.value(m["u"]);
               return (x * (1.0 - u)).id();
             }});
  rules.add({"decoupled_weight_decay", P(Op::Mul, {input(Role::Param), uniform("d")}),
             [](Graph& g, const Match& m) -> Result {
               const Node& d = g.node(m["d"]);
               bool spelled = d.op == Op::Sub && g.node(d.args[0]).op == Op::Const &&
                              g.node(d.args[0]).value == 1;
               if (spelled || (d.op == Op::Scalar && d.name == "decay")) return recognized(m);
               return std::nullopt;
             }});
  // L2 (Adam, SGD, ...): g + weight_decay * p, recognized in any operand order.
  rules.add({"l2_weight_decay", P(Op::Add, {tensor(), P(Op::Mul, {uniform(), input(Role::Param)})}),
             [](Graph&, const Match& m) -> Result { return recognized(m); }});
}

void add_sign_and_nesterov(rewrite::RuleSet& rules) {
  // maximize ? -g : g -> g * (maximize ? -1 : 1): the library's grad_sign. Bit-exact (x * -1 is
  // -x) up to the sign of a NaN.
  rules.add({"maximize", P(Op::Select, {uniform("c"), P(Op::Neg, {tensor("x")}), any("x")}),
             [](Graph& g, const Match& m) -> Result {
               Value x = g.value(m["x"]), c = g.value(m["c"]);
               DType t = x.node().dtype;
               return (select(c, g.constant(-1, t), g.constant(1, t)) * x).id();
             }});
  rules.add({"maximize", P(Op::Select, {uniform("c"), tensor("x"), P(Op::Neg, {any("x")})}),
             [](Graph& g, const Match& m) -> Result {
               Value x = g.value(m["x"]), c = g.value(m["c"]);
               DType t = x.node().dtype;
               return (select(c, g.constant(1, t), g.constant(-1, t)) * x).id();
             }});
  // Gradient centralization (Yong et al. 2020, MindSpore's grad_centralization): the gradient
  // minus its mean over all dims but the first, i.e. per row of the [dim0, rest] view.
  rules.add({"gradient_centralization", P(Op::Sub, {tensor("g"), P(Op::RowMean, {any("g")})}),
             [](Graph&, const Match& m) -> Result { return recognized(m); }});
  // Nesterov look-ahead: d + mu * b' where b' = a*b + c*d is the momentum buffer just updated
  // from the same d (the repeated binding "d").
  rules.add(
      {"nesterov",
       P(Op::Add, {tensor("d"),
                   P(Op::Mul, {uniform(), P(Op::Add, {P(Op::Mul, {uniform(), input(Role::State)}),
                                                      P(Op::Mul, {uniform(), any("d")})})})}),
       [](Graph&, const Match& m) -> Result { return recognized(m); }});
}

}  // namespace

// Negations folded into the op: IEEE defines x - y as x + (-y), and a sign flip commutes with
// rounding, so each pair below is the same result bit for bit, signed zeros included.
const rewrite::RuleSet& exact_rule_set() {
  static const rewrite::RuleSet rules = [] {
    rewrite::RuleSet r;
    r.add({"neg_operand", P(Op::Add, {any("x"), P(Op::Neg, {any("y")})}),
           [](Graph& g, const Match& m) -> Result {
             return (g.value(m["x"]) - g.value(m["y"])).id();
           }});
    r.add({"neg_operand", P(Op::Sub, {any("x"), P(Op::Neg, {any("y")})}),
           [](Graph& g, const Match& m) -> Result {
             return (g.value(m["x"]) + g.value(m["y"])).id();
           }});
    r.add({"neg_operand", P(Op::Mul, {P(Op::Neg, {any("x")}), P(Op::Neg, {any("y")})}),
           [](Graph& g, const Match& m) -> Result {
             return (g.value(m["x"]) * g.value(m["y"])).id();
           }});
    r.add({"neg_operand", P(Op::Div, {P(Op::Neg, {any("x")}), P(Op::Neg, {any("y")})}),
           [](Graph& g, const Match& m) -> Result {
             return (g.value(m["x"]) / g.value(m["y"])).id();
           }});
    return r;
  }();
  return rules;
}

std::vector<IdiomInfo> idiom_infos() {
  return {
      {"maximize", "maximize ? -g : g -> g * grad_sign (bit-exact)", true},
      {"lerp", "x - w*(x - y) -> x + w*(y - x) (torch's lerp; exact but for a zero's sign)", true},
      {"ema", "b*x + (1-b)*y recognized (torch's mul_/add_ EMA; kept: it rounds unlike lerp)",
       true},
      {"uniform_factor",
       "(u*x)*y -> u*(x*y), u*(v*x) -> (u*v)*x, (u*x)/y -> u*(x/y) (reassociation, ~1 ulp)", true},
      {"bias_correction", "x / bc -> x * (1/bc), bc = 1 - b^t or bias_correction* (~1 ulp)", true},
      {"adam_denominator",
       "sqrt(v * (1/bc2)) -> sqrt(v) * (1/sqrt(bc2)); sqrt(v)*c + eps recognized (~1 ulp)", true},
      {"decoupled_weight_decay", "p - u*p -> p * (1 - u) (torch's p.mul_(1 - lr*wd); ~1 ulp)",
       true},
      {"l2_weight_decay", "g + wd*p recognized", true},
      {"nesterov", "d + mu*(a*b + c*d) recognized (SGD's Nesterov look-ahead)", true},
      {"gradient_centralization",
       "g - row_mean(g) recognized (MindSpore's grad_centralization: the mean over all dims but "
       "the first)",
       true},
  };
}

const rewrite::RuleSet& idiom_rule_set() {
  static const rewrite::RuleSet rules = [] {
    rewrite::RuleSet r;
    add_sign_and_nesterov(r);
    add_ema_and_lerp(r);
    add_scalar_separation(r);
    add_bias_correction(r);
    add_adam_denominator(r);
    add_weight_decay(r);
    return r;
  }();
  return rules;
}

}  // namespace optfuse::idioms_detail
