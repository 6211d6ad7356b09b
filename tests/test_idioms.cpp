// The idiom front end: each idiom's user spellings normalize to the library's form (and keep
// their values), the library's own graphs are already normal (unchanged, nothing hoisted), and an
// Adam / AdamW written op by op gets the library's kernel key.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "optfuse/idioms.h"
#include "optfuse/optim.h"
#include "optim/rule.h"
#include "support/engine.h"
#include "support/gen.h"

namespace optfuse {
namespace {

using testing::gen;

std::map<std::string, std::vector<double>> random_tensors(const Graph& g, size_t n, uint32_t seed) {
  std::map<std::string, std::vector<double>> t;
  for (const Node& node : g.nodes()) {
    if (node.op != Op::Input) continue;
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) {
      v[i] = gen(seed++, i);
      if (node.name == "exp_avg_sq") v[i] = std::fabs(v[i]);  // a second moment is >= 0
    }
    t[node.name] = v;
  }
  return t;
}

// interpret() of `g` and of its normal form (with host scalars) agree: every rewrite is exact in
// real arithmetic. interpret() evaluates in double but rounds scalars to their dtype (f32), and
// the host scalars are rounded once as well (from double, not from f32 operands): hence the
// tolerance of a few f32 roundings; a wrong rewrite is off by O(1).
void expect_same_values(const Graph& g, const std::map<std::string, double>& all_scalars) {
  NormalizedGraph n = normalize(g);
  std::map<std::string, double> scalars;
  for (const auto& [name, v] : all_scalars)
    if (g.find_scalar(name) >= 0) scalars[name] = v;
  auto tensors = random_tensors(g, 64, 7);
  auto want = interpret(g, tensors, scalars);
  auto got = interpret(n.graph, tensors, n.kernel_scalars(scalars));
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want)
    for (size_t i = 0; i < w.size(); ++i)
      if (!(std::isnan(w[i]) && std::isnan(got.at(name)[i])))
        EXPECT_NEAR(got.at(name)[i], w[i], 1e-6 * (1 + std::fabs(w[i]))) << name << "[" << i << "]";
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Adam as a user would write it: scalars lr, betas, eps, bias corrections; maximize as a select;
// operands in another order and association than src/optim/adam_family.cpp.
const char* kUserAdam = R"(graph "my_adam" {
  %0 = grad.f32 "grad"
  %1 = param.f32 "param"
  %2 = state.f32 "exp_avg_sq"
  %3 = state.f32 "exp_avg"
  %4 = scalar.bool "maximize"
  %5 = scalar.f32 "lr"
  %6 = scalar.f32 "beta1"
  %7 = scalar.f32 "beta2"
  %8 = scalar.f32 "eps"
  %9 = scalar.f32 "weight_decay"
  %10 = scalar.f32 "bias_correction1"
  %11 = scalar.f32 "bias_correction2"
  %12 = neg.f32 %0
  %13 = select.f32 %4, %12, %0      # g = maximize ? -grad : grad
  %14 = mul.f32 %1, %9
  %15 = add.f32 %14, %13            # g = p*wd + g
  %16 = const.f32 1
  %17 = sub.f32 %16, %6
  %18 = sub.f32 %3, %15
  %19 = mul.f32 %18, %17
  %20 = sub.f32 %3, %19             # m' = m - (m - g)*(1 - b1)
  %21 = sub.f32 %16, %7
  %22 = mul.f32 %21, %15
  %23 = mul.f32 %22, %15            # (1 - b2)*g*g
  %24 = mul.f32 %2, %7
  %25 = add.f32 %24, %23            # v' = v*b2 + (1 - b2)*g*g
  %26 = div.f32 %20, %10            # m_hat
  %27 = div.f32 %25, %11            # v_hat
  %28 = sqrt.f32 %27
  %29 = add.f32 %8, %28
  %30 = mul.f32 %5, %26             # lr * m_hat
  %31 = div.f32 %30, %29
  %32 = sub.f32 %1, %31
  out "param" = %32
  out "exp_avg" = %20
  out "exp_avg_sq" = %25
})";

// AdamW with the bias corrections written as 1 - beta^step, decay as p - lr*wd*p, and the
// denominator as sqrt(v)/sqrt(bc2) + eps.
const char* kUserAdamW = R"(graph "my_adamw" {
  %0 = param.f32 "param"
  %1 = grad.f32 "grad"
  %2 = state.f32 "exp_avg"
  %3 = state.f32 "exp_avg_sq"
  %4 = scalar.f32 "lr"
  %5 = scalar.f32 "beta1"
  %6 = scalar.f32 "beta2"
  %7 = scalar.f32 "eps"
  %8 = scalar.f32 "weight_decay"
  %9 = scalar.f32 "step"
  %10 = scalar.bool "maximize"
  %11 = neg.f32 %1
  %12 = select.f32 %10, %11, %1
  %13 = const.f32 1
  %14 = mul.f32 %4, %8
  %15 = mul.f32 %14, %0
  %16 = sub.f32 %0, %15             # p - lr*wd*p
  %17 = sub.f32 %12, %2
  %18 = sub.f32 %13, %5
  %19 = mul.f32 %17, %18
  %20 = add.f32 %2, %19             # m' = m + (g - m)*(1 - b1)
  %21 = mul.f32 %12, %12
  %22 = sub.f32 %13, %6
  %23 = mul.f32 %21, %22
  %24 = mul.f32 %6, %3
  %25 = add.f32 %23, %24            # v' = g*g*(1 - b2) + b2*v
  %26 = pow.f32 %5, %9
  %27 = sub.f32 %13, %26            # bc1
  %28 = pow.f32 %6, %9
  %29 = sub.f32 %13, %28            # bc2
  %30 = sqrt.f32 %25
  %31 = sqrt.f32 %29
  %32 = div.f32 %30, %31
  %33 = add.f32 %32, %7             # sqrt(v)/sqrt(bc2) + eps
  %34 = div.f32 %4, %27             # lr / bc1
  %35 = mul.f32 %34, %20
  %36 = div.f32 %35, %33
  %37 = sub.f32 %16, %36
  out "param" = %37
  out "exp_avg" = %20
  out "exp_avg_sq" = %25
})";

TEST(Idioms, UserAdamGetsTheLibraryKernelKey) {
  Engine& e = testing::shared_engine();
  NormalizedGraph n = normalize(parse(kUserAdam));
  n.graph.set_name("adam");
  Graph lib = update_graph({{"type", "adam"}});
  EXPECT_EQ(print(n.graph), print(canonicalize(lib))) << print(n.graph);
  EXPECT_EQ(e.kernel_key(n.graph), e.kernel_key(lib));
  for (const char* idiom : {"maximize", "lerp", "ema", "bias_correction", "adam_denominator",
                            "uniform_factor", "l2_weight_decay"})
    EXPECT_TRUE(has(n.idioms, idiom)) << idiom;
}

TEST(Idioms, UserAdamWGetsTheLibraryKernelKey) {
  Engine& e = testing::shared_engine();
  NormalizedGraph n = normalize(parse(kUserAdamW));
  n.graph.set_name("adamw");
  Graph lib = update_graph({{"type", "adamw"}});
  EXPECT_EQ(print(n.graph), print(canonicalize(lib))) << print(n.graph);
  EXPECT_EQ(e.kernel_key(n.graph), e.kernel_key(lib));
  EXPECT_TRUE(has(n.idioms, "decoupled_weight_decay"));
  EXPECT_FALSE(has(n.idioms, "l2_weight_decay"));
}

// The host computes exactly the scalars the library's AdamW passes (double, same formulas), so
// with the same kernel the numbers are bit-identical.
TEST(Idioms, HostScalarsEqualTheLibrarysBitForBit) {
  NormalizedGraph n = normalize(parse(kUserAdamW));
  Options h = optimizer_defaults("adamw");
  h["lr"] = 3e-4;
  h["weight_decay"] = 0.05;
  h["betas"] = {0.85, 0.995};
  std::map<std::string, double> lib;
  optim::make_rule("adamw")->scalars(h, optim::TensorStep{7, false, nullptr}, &lib);
  std::map<std::string, double> got = n.kernel_scalars({{"lr", 3e-4},
                                                        {"beta1", 0.85},
                                                        {"beta2", 0.995},
                                                        {"eps", 1e-8},
                                                        {"weight_decay", 0.05},
                                                        {"step", 7},
                                                        {"maximize", 0}});
  // AdamW's graph reads no "weight_decay"; "bias_correction2_sqrt", "neg_step_size" and the
  // three "inv_bias_correction2_sqrt_hi" / "_lo" / "_exact" are for its graph without master
  // weights (src/optim/adam.cpp).
  ASSERT_EQ(got.size(), lib.size() - 6);
  for (const auto& [name, value] : got) EXPECT_EQ(value, lib.at(name)) << name;
}

TEST(Idioms, UserSpellingsKeepTheirValues) {
  std::map<std::string, double> s = {{"lr", 1e-2},
                                     {"beta1", 0.9},
                                     {"beta2", 0.999},
                                     {"eps", 1e-8},
                                     {"weight_decay", 0.1},
                                     {"bias_correction1", 1 - std::pow(0.9, 3)},
                                     {"bias_correction2", 1 - std::pow(0.999, 3)},
                                     {"step", 3},
                                     {"maximize", 1}};
  expect_same_values(parse(kUserAdam), s);
  expect_same_values(parse(kUserAdamW), s);
  s["maximize"] = 0;
  expect_same_values(parse(kUserAdam), s);
}

// Every structure of every library optimizer is already in normal form: normalize() changes
// nothing and hoists nothing (so their keys, and the golden ones, stay).
TEST(Idioms, LibraryGraphsAreAlreadyNormal) {
  std::vector<Options> configs;
  for (const std::string& type : optimizer_types()) configs.push_back({{"type", type}});
  configs.push_back({{"type", "sgd"}, {"momentum", 0.9}});
  configs.push_back({{"type", "sgd"}, {"momentum", 0.9}, {"nesterov", true}});
  configs.push_back({{"type", "adam"}, {"amsgrad", true}});
  configs.push_back({{"type", "adamw"}, {"amsgrad", true}});
  configs.push_back({{"type", "rmsprop"}, {"centered", true}, {"momentum", 0.9}});
  configs.push_back({{"type", "rmsprop"}, {"momentum", 0.9}});
  for (const Options& c : configs) {
    // (ndim 2: a factored rule's matrix graph, Adafactor's; the others' is the same graph.)
    for (int ndim : {1, 2}) {
      Graph lib = update_graph(c, {}, DType::F32, DType::F32, 0, ndim);
      NormalizedGraph n = normalize(lib);
      EXPECT_EQ(print(n.graph), print(canonicalize(lib))) << c.dump();
      EXPECT_TRUE(n.host_scalars.empty()) << c.dump();
    }
  }
  Graph nesterov = update_graph({{"type", "sgd"}, {"momentum", 0.9}, {"nesterov", true}});
  EXPECT_TRUE(has(matched_idioms(nesterov), "nesterov"));
  EXPECT_FALSE(has(matched_idioms(update_graph({{"type", "sgd"}, {"momentum", 0.9}})), "nesterov"));
  EXPECT_TRUE(has(matched_idioms(update_graph({{"type", "adam"}})), "lerp"));
  EXPECT_TRUE(has(matched_idioms(update_graph({{"type", "adam"}})), "ema"));
}

// Each family: spellings of one update; all normalize to one graph with the library's scalars.
using Spelling = std::function<Value(Graph&)>;

void expect_one_normal_form(const std::vector<Spelling>& spellings, const std::string& idiom) {
  std::string first;
  for (size_t i = 0; i < spellings.size(); ++i) {
    Graph g("t");
    g.output("param", spellings[i](g));
    NormalizedGraph n = normalize(g);
    if (i == 0) first = print(n.graph);
    EXPECT_EQ(print(n.graph), first) << idiom << " spelling " << i;
    if (i > 0) EXPECT_TRUE(has(n.idioms, idiom)) << idiom << " spelling " << i;
    expect_same_values(g, {{"lr", 1e-2},
                           {"weight_decay", 0.1},
                           {"bias_correction1", 0.271},
                           {"bias_correction2", 0.003},
                           {"eps", 1e-8},
                           {"w", 0.1},
                           {"beta1", 0.9},
                           {"step", 3},
                           {"step_size", 0.5},
                           {"decay", 0.999},
                           {"inv_bias_correction2_sqrt", 18.0}});
  }
}

TEST(Idioms, SpellingsOfOneIdiomShareOneNormalForm) {
  // Leaves are declared once; later uses look them up.
  auto p = [](Graph& g) {
    NodeId id = g.find_input("param");
    return id >= 0 ? g.value(id) : g.param("param");
  };
  auto s = [](Graph& g, const char* name) {
    NodeId id = g.find_scalar(name);
    return id >= 0 ? g.value(id) : g.scalar(name);
  };
  expect_one_normal_form(
      {[&](Graph& g) { return p(g) - s(g, "step_size") * g.grad("grad"); },
       [&](Graph& g) { return p(g) - s(g, "lr") * (g.grad("grad") / s(g, "bias_correction1")); },
       [&](Graph& g) {
         return p(g) - g.grad("grad") * (1.0 / s(g, "bias_correction1")) * s(g, "lr");
       },
       [&](Graph& g) {
         Value bc1 = 1.0 - pow(s(g, "beta1"), s(g, "step"));
         return p(g) - s(g, "lr") * (g.grad("grad") / bc1);
       }},
      "bias_correction");
  expect_one_normal_form(
      {[&](Graph& g) {
         return p(g) / (sqrt(g.grad("grad")) * s(g, "inv_bias_correction2_sqrt") + s(g, "eps"));
       },
       [&](Graph& g) {
         return p(g) / (sqrt(g.grad("grad") / s(g, "bias_correction2")) + s(g, "eps"));
       },
       [&](Graph& g) {
         return p(g) / (s(g, "eps") + sqrt(g.grad("grad")) / sqrt(s(g, "bias_correction2")));
       },
       [&](Graph& g) {
         return p(g) / (sqrt(g.grad("grad") * (1.0 / s(g, "bias_correction2"))) + s(g, "eps"));
       }},
      "adam_denominator");
  expect_one_normal_form(
      {[&](Graph& g) { return p(g) * s(g, "decay") - g.grad("grad"); },
       [&](Graph& g) { return p(g) - s(g, "lr") * s(g, "weight_decay") * p(g) - g.grad("grad"); },
       [&](Graph& g) { return p(g) - s(g, "lr") * (s(g, "weight_decay") * p(g)) - g.grad("grad"); },
       [&](Graph& g) { return p(g) * (1.0 - s(g, "weight_decay") * s(g, "lr")) - g.grad("grad"); }},
      "decoupled_weight_decay");
  expect_one_normal_form({[&](Graph& g) { return p(g) + s(g, "w") * (g.grad("grad") - p(g)); },
                          [&](Graph& g) { return p(g) - s(g, "w") * (p(g) - g.grad("grad")); },
                          [&](Graph& g) { return (g.grad("grad") - p(g)) * s(g, "w") + p(g); }},
                         "lerp");
}

TEST(Idioms, UnknownUniformsAreHoistedUnderTheirFormula) {
  Graph g = parse(R"(graph "t" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "a"
    %3 = scalar.f32 "b"
    %4 = mul.f32 %2, %3
    %5 = exp.f32 %4
    %6 = mul.f32 %5, %1
    %7 = sub.f32 %0, %6
    out "p" = %7
  })");
  NormalizedGraph n = normalize(g);
  ASSERT_EQ(n.host_scalars.size(), 1u);
  EXPECT_EQ(n.host_scalars.begin()->first, "exp(a*b)");
  EXPECT_EQ(n.graph.find_scalar("a"), -1);
  EXPECT_DOUBLE_EQ(n.kernel_scalars({{"a", 0.5}, {"b", 2}}).at("exp(a*b)"), std::exp(1.0));
  expect_same_values(g, {{"a", 0.5}, {"b", 2}});
}

TEST(Idioms, NegativesAreLeftAlone) {
  // Dividing by a uniform that is not a bias correction (could be negative or zero): kept.
  // p - u*q with q another tensor: not decoupled weight decay. select(c, -x, y): not maximize.
  Graph g = parse(R"(graph "t" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = state.f32 "q"
    %3 = scalar.f32 "u"
    %4 = scalar.bool "c"
    %5 = div.f32 %1, %3
    %6 = mul.f32 %3, %2
    %7 = sub.f32 %0, %6
    %8 = neg.f32 %1
    %9 = select.f32 %4, %8, %2
    %10 = add.f32 %7, %5
    out "p" = %10
    out "q" = %9
  })");
  NormalizedGraph n = normalize(g);
  EXPECT_EQ(print(n.graph), print(canonicalize(g)));
  EXPECT_TRUE(n.idioms.empty()) << n.idioms.front();
}

TEST(Idioms, DescribeListsIdiomsAndHostFormulas) {
  std::string text = describe(normalize(parse(kUserAdamW)));
  EXPECT_NE(text.find("decoupled_weight_decay"), std::string::npos) << text;
  EXPECT_NE(text.find("  step_size = lr/(1-pow(beta1,step))\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  decay = 1-(lr*weight_decay)\n"), std::string::npos) << text;
}

// The exact rules run inside canonicalize(): spellings with negations share one structural hash.
TEST(Canonical, NegationsFoldIntoTheirOp) {
  Graph a = parse(R"(graph "t" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = neg.f32 %1
    %3 = add.f32 %0, %2
    %4 = neg.f32 %0
    %5 = mul.f32 %4, %2
    %6 = sub.f32 %3, %5
    out "p" = %6
  })");
  Graph b = parse(R"(graph "t" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = sub.f32 %0, %1
    %3 = mul.f32 %0, %1
    %4 = sub.f32 %2, %3
    out "p" = %4
  })");
  EXPECT_EQ(print(canonicalize(a)), print(canonicalize(b)));
  EXPECT_EQ(print(canonicalize(canonicalize(a))), print(canonicalize(a)));
}

TEST(Idioms, EmaIsRecognizedButNotTurnedIntoLerpAndUnknownSqrtSplitsAreNot) {
  // b*m + (1-b)*g rounds unlike m + (1-b)*(g-m): recognized, kept (only 1-b is hoisted).
  // sqrt(v * (1/u)) with u not a bias correction (it may be negative): kept whole.
  Graph g = parse(R"(graph "t" {
    %0 = state.f32 "m"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "b"
    %3 = scalar.f32 "u"
    %4 = const.f32 1
    %5 = mul.f32 %2, %0
    %6 = sub.f32 %4, %2
    %7 = mul.f32 %6, %1
    %8 = add.f32 %5, %7
    %9 = div.f32 %4, %3
    %10 = mul.f32 %8, %9
    %11 = sqrt.f32 %10
    out "m" = %11
  })");
  NormalizedGraph n = normalize(g);
  EXPECT_TRUE(has(n.idioms, "ema"));
  EXPECT_FALSE(has(n.idioms, "lerp"));
  EXPECT_FALSE(has(n.idioms, "adam_denominator"));
  Graph want = parse(R"(graph "t" {
    %0 = state.f32 "m"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "b"
    %3 = scalar.f32 "one_minus_b"
    %4 = scalar.f32 "1/u"
    %5 = mul.f32 %2, %0
    %6 = mul.f32 %3, %1
    %7 = add.f32 %5, %6
    %8 = mul.f32 %7, %4
    %9 = sqrt.f32 %8
    out "m" = %9
  })");
  EXPECT_EQ(print(n.graph), print(canonicalize(want)));
  EXPECT_EQ(n.host_scalars.at("1/u").str(), "1/u");
}

// Gradient centralization and global-norm clipping: the mean and the norm are reductions of the
// data, uniform but not host math. Nothing that reads them is hoisted; scalar math beside them is.
TEST(Idioms, ReductionsStayInTheKernelGradientCentralizationIsRecognized) {
  Graph g = parse(R"(graph "gc_clip" {
    %0 = param.f32 "param"
    %1 = grad.f32 "grad"
    %2 = scalar.f32 "lr"
    %3 = scalar.f32 "max_norm"
    %4 = scalar.f32 "beta1"
    %5 = row_mean.f32 %1
    %6 = sub.f32 %1, %5               # g - mean over all dims but the first
    %7 = mul.f32 %6, %6
    %8 = reduce_sum.f32 %7
    %9 = sqrt.f32 %8
    %10 = div.f32 %3, %9
    %11 = const.f32 1
    %12 = min.f32 %10, %11            # clip scale
    %13 = sub.f32 %11, %4
    %14 = mul.f32 %13, %12            # (1 - beta1) * scale: host part and kernel part
    %15 = mul.f32 %14, %6
    %16 = mul.f32 %2, %15
    %17 = sub.f32 %0, %16
    out "param" = %17
    result "norm" = %9
  })");
  NormalizedGraph n = normalize(g);
  EXPECT_TRUE(has(n.idioms, "gradient_centralization"));
  ASSERT_EQ(n.host_scalars.size(), 1u) << describe(n);
  EXPECT_EQ(n.host_scalars.count("one_minus_beta1"), 1u) << describe(n);
  EXPECT_GE(n.graph.find_scalar("max_norm"), 0);
  ASSERT_EQ(n.graph.results().size(), 1u);
  EXPECT_EQ(n.graph.results()[0].name, "norm");

  std::map<std::string, double> s = {{"lr", 0.1}, {"max_norm", 0.5}, {"beta1", 0.9}};
  auto tensors = random_tensors(g, 48, 11);
  auto want = interpret(g, tensors, s, 8);
  auto got = interpret(n.graph, tensors, n.kernel_scalars(s), 8);
  for (size_t i = 0; i < 48; ++i) EXPECT_NEAR(got.at("param")[i], want.at("param")[i], 1e-6) << i;
  EXPECT_NEAR(interpret_results(n.graph, tensors, n.kernel_scalars(s), 8).at("norm"),
              interpret_results(g, tensors, s, 8).at("norm"), 1e-12);
}

TEST(Idioms, RuleListNamesEveryIdiom) {
  std::vector<std::string> names;
  for (const IdiomInfo& i : idiom_rules()) names.push_back(i.name);
  for (const char* want :
       {"lerp", "ema", "bias_correction", "decoupled_weight_decay", "l2_weight_decay", "nesterov",
        "adam_denominator", "gradient_centralization"})
    EXPECT_TRUE(has(names, want)) << want;
}

}  // namespace
}  // namespace optfuse
