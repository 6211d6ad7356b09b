// Custom optimizers: a JSON Lion and a JSON Adam written op by op get the built-in kernel (same
// key, bit-identical numbers); Adan (Xie et al. 2022) registered from C++ against an independent
// double reference; a graph with a per-row reduction on 1-, 2- and 3-D tensors; definition
// errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/gen.h"

namespace optfuse {
namespace {

using testing::gen;

struct Tensors {
  std::vector<float> p, g;
};

Tensors make_tensors(size_t n, uint32_t seed) {
  Tensors t{std::vector<float>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) t.p[i] = static_cast<float>(gen(seed, i));
  return t;
}

void fill_grad(Tensors& t, int step) {
  for (size_t i = 0; i < t.g.size(); ++i) t.g[i] = static_cast<float>(gen(1000 + step, i));
}

ParamRef ref(Tensors& t) {
  auto n = static_cast<int64_t>(t.p.size());
  return {{t.p.data(), n, {}}, {t.g.data(), n, {}}, "w"};
}

// Runs `a` and `b` on identical data for `steps` steps; expects bit-identical params and state.
void expect_bit_identical(Optimizer& a, Optimizer& b, const std::vector<std::string>& states,
                          Tensors& ta, Tensors& tb, int steps) {
  for (int s = 0; s < steps; ++s) {
    fill_grad(ta, s);
    fill_grad(tb, s);
    a.step();
    b.step();
  }
  ASSERT_EQ(std::memcmp(ta.p.data(), tb.p.data(), ta.p.size() * sizeof(float)), 0);
  for (const std::string& name : states) {
    const std::vector<float>* sa = a.state(0, 0, name);
    const std::vector<float>* sb = b.state(0, 0, name);
    ASSERT_TRUE(sa && sb) << name;
    EXPECT_EQ(std::memcmp(sa->data(), sb->data(), sa->size() * sizeof(float)), 0) << name;
  }
}

// The Lion rule in the JSON rule form, shared with the Python tests (tests/python/).
Options lion_json() {
  std::ifstream in(std::string(OPTFUSE_TEST_DATA_DIR) + "/graphs/lion_rule.json");
  return Options::parse(in);
}

TEST(CustomOptimizer, JsonLionIsTheBuiltInKernelBitForBit) {
  Engine& e = testing::shared_engine();
  Tensors ta = make_tensors(3000, 1), tb = make_tensors(3000, 1);
  auto lion = Optimizer::create(e, {{"type", "lion"}, {"lr", 3e-3}});
  auto mine = Optimizer::create(e, {{"type", "custom"}, {"rule", lion_json()}, {"lr", 3e-3}});
  EXPECT_EQ(mine->type(), "my_lion");
  lion->add_param_group({ref(ta)}, {{"weight_decay", 0.1}});
  mine->add_param_group({ref(tb)}, {{"weight_decay", 0.1}});
  expect_bit_identical(*lion, *mine, {"exp_avg"}, ta, tb, 4);
  EXPECT_EQ(lion->kernel_uses().at(0).key, mine->kernel_uses().at(0).key);
}

TEST(CustomOptimizer, StateFilesRoundTrip) {
  Engine& e = testing::shared_engine();
  Options config = {{"type", "custom"}, {"rule", lion_json()}};
  Tensors ta = make_tensors(777, 4), tb = make_tensors(777, 4);
  auto a = Optimizer::create(e, config);
  a->add_param_group({ref(ta)});
  for (int s = 0; s < 2; ++s) {
    fill_grad(ta, s);
    a->step();
  }
  const std::string path = ::testing::TempDir() + "custom_lion.optfuse";
  a->save_state(path);
  tb.p = ta.p;
  auto b = Optimizer::create(e, config);
  b->add_param_group({ref(tb)});
  b->load_state(path);
  EXPECT_EQ(b->step_count(0, 0), 2);
  expect_bit_identical(*a, *b, {"exp_avg"}, ta, tb, 2);
  Tensors tc = make_tensors(777, 4);
  auto lion = Optimizer::create(e, {{"type", "lion"}});
  lion->add_param_group({ref(tc)});
  EXPECT_THROW(lion->load_state(path), Error) << "a my_lion state file is not a lion one";
}

// tests/test_idioms.cpp's kUserAdam as JSON (tests/graphs/user_adam.json; `optfuse explain` reads
// it too): scalars lr, beta1, beta2, eps, weight_decay, maximize (a bool hyperparameter) and the
// built-in bias corrections.
Options user_adam_json() {
  std::ifstream in(std::string(OPTFUSE_TEST_DATA_DIR) + "/graphs/user_adam.json");
  if (!in) throw Error("cannot read tests/graphs/user_adam.json");
  return Options::parse(in);
}

TEST(CustomOptimizer, OpByOpAdamIsTheLibraryAdamBitForBit) {
  Engine& e = testing::shared_engine();
  Options rule = {{"name", "my_adam"},
                  {"defaults",
                   {{"lr", 1e-3},
                    {"betas", {0.9, 0.999}},
                    {"eps", 1e-8},
                    {"weight_decay", 0.0},
                    {"maximize", false}}},
                  {"graph", user_adam_json()}};
  for (bool maximize : {false, true}) {
    Tensors ta = make_tensors(5000, 2), tb = make_tensors(5000, 2);
    auto adam = Optimizer::create(e, {{"type", "adam"}, {"lr", 1e-2}});
    auto mine = Optimizer::create(e, {{"type", "custom"}, {"rule", rule}, {"lr", 1e-2}});
    Options group = {{"weight_decay", 0.01}, {"maximize", maximize}, {"betas", {0.8, 0.99}}};
    adam->add_param_group({ref(ta)}, group);
    mine->add_param_group({ref(tb)}, group);
    int64_t compiles_before = e.counters().compiles;
    expect_bit_identical(*adam, *mine, {"exp_avg", "exp_avg_sq"}, ta, tb, 5);
    EXPECT_EQ(adam->kernel_uses().at(0).key, mine->kernel_uses().at(0).key);
    EXPECT_LE(e.counters().compiles - compiles_before, 1) << "one kernel serves both";
  }
}

// Adan (Xie et al. 2022, sail-sg/Adan's single-tensor algorithm, no_prox = false): betas
// (0.98, 0.92, 0.99) weigh the OLD value; the gradient difference is 0 at the first step.
Graph adan_graph(const Options&) {
  Graph gr("adan");
  Value p = gr.param("param"), g = gr.grad("grad");
  Value m = gr.state("exp_avg"), d = gr.state("exp_avg_diff"), n = gr.state("exp_avg_sq");
  Value pre = gr.state("pre_grad");
  Value b1 = gr.scalar("beta1"), b2 = gr.scalar("beta2"), b3 = gr.scalar("beta3");
  Value lr = gr.scalar("lr"), eps = gr.scalar("eps"), wd = gr.scalar("weight_decay");
  Value not_first = select(gr.scalar("step") > gr.constant(1), gr.constant(1), gr.constant(0));
  Value diff = (g - pre) * not_first;
  Value update = g + b2 * diff;
  Value m1 = m * b1 + g * (1.0 - b1);
  Value d1 = d * b2 + diff * (1.0 - b2);
  Value n1 = n * b3 + update * update * (1.0 - b3);
  Value denom = sqrt(n1) / sqrt(gr.scalar("bias_correction3")) + eps;
  Value u = (m1 / gr.scalar("bias_correction1") + b2 * d1 / gr.scalar("bias_correction2")) / denom;
  gr.output("param", (p - lr * u) / (1.0 + lr * wd));
  gr.output("exp_avg", m1);
  gr.output("exp_avg_diff", d1);
  gr.output("exp_avg_sq", n1);
  gr.output("pre_grad", g);
  return gr;
}

TEST(CustomOptimizer, AdanFromCppMatchesADoubleReference) {
  static bool registered = [] {
    register_optimizer(
        {"adan",
         {{"lr", 1e-3}, {"betas", {0.98, 0.92, 0.99}}, {"eps", 1e-8}, {"weight_decay", 0.0}},
         adan_graph,
         nullptr});
    return true;
  }();
  ASSERT_TRUE(registered);
  Engine& e = testing::shared_engine();
  const size_t n = 4099;
  Tensors t = make_tensors(n, 3);
  auto adan = Optimizer::create(e, {{"type", "adan"}, {"lr", 1e-2}, {"weight_decay", 0.02}});
  adan->add_param_group({ref(t)});

  const double lr = 1e-2, wd = 0.02, b1 = 0.98, b2 = 0.92, b3 = 0.99, eps = 1e-8;
  std::vector<double> p(t.p.begin(), t.p.end()), m(n, 0), d(n, 0), v(n, 0), pre(n, 0);
  for (int s = 1; s <= 6; ++s) {
    fill_grad(t, s);
    adan->step();
    double bc1 = 1 - std::pow(b1, s), bc2 = 1 - std::pow(b2, s), bc3 = 1 - std::pow(b3, s);
    for (size_t i = 0; i < n; ++i) {
      double g = t.g[i];
      double diff = s == 1 ? 0.0 : g - pre[i];
      double upd = g + b2 * diff;
      m[i] = b1 * m[i] + (1 - b1) * g;
      d[i] = b2 * d[i] + (1 - b2) * diff;
      v[i] = b3 * v[i] + (1 - b3) * upd * upd;
      double denom = std::sqrt(v[i]) / std::sqrt(bc3) + eps;
      double u = (m[i] / bc1 + b2 * d[i] / bc2) / denom;
      p[i] = (p[i] - lr * u) / (1 + lr * wd);
      pre[i] = g;
    }
  }
  // float32 kernel vs double reference over 6 steps: |u| <= ~1/sqrt(1-b3)-ish, so absolute.
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(t.p[i], p[i], 2e-5 * (1 + std::fabs(p[i]))) << "param[" << i << "]";
  const std::vector<float>* diff = adan->state(0, 0, "exp_avg_diff");
  ASSERT_TRUE(diff);
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR((*diff)[i], d[i], 1e-6) << "exp_avg_diff[" << i << "]";
  EXPECT_EQ(adan->kernel_uses().size(), 1u);
}

// A custom graph with a per-row reduction: each tensor's rows are everything but its first dim
// (numel / shape[0]); a 1-D tensor is one row. p' = p - lr * (g - row_mean(g)).
TEST(CustomOptimizer, RowReductionsSeeEachTensorsRows) {
  const Options rule = Options::parse(R"({
    "name": "row_centered", "defaults": {"lr": 0.5},
    "graph": {"inputs": [{"name": "param", "role": "param"}, {"name": "grad", "role": "grad"}],
              "scalars": ["lr"],
              "nodes": [{"id": "m", "op": "row_mean", "args": ["grad"]},
                        {"id": "c", "op": "sub", "args": ["grad", "m"]},
                        {"id": "u", "op": "mul", "args": ["lr", "c"]},
                        {"id": "p1", "op": "sub", "args": ["param", "u"]}],
              "outputs": {"param": "p1"}}})");
  Engine& e = testing::shared_engine();
  auto opt = Optimizer::create(e, {{"type", "custom"}, {"rule", rule}});
  const std::vector<std::vector<int64_t>> shapes = {{6, 5, 7}, {9, 4}, {33}};
  std::vector<Tensors> ts;
  for (size_t k = 0; k < shapes.size(); ++k) {
    int64_t n = 1;
    for (int64_t d : shapes[k]) n *= d;
    ts.push_back(make_tensors(static_cast<size_t>(n), 10 + static_cast<uint32_t>(k)));
  }
  std::vector<ParamRef> refs;
  for (size_t k = 0; k < shapes.size(); ++k) {
    ParamRef r = ref(ts[k]);
    r.param.shape = r.grad.shape = shapes[k];
    refs.push_back(r);
  }
  opt->add_param_group(refs);
  std::vector<std::vector<float>> before;
  for (Tensors& t : ts) {
    fill_grad(t, 0);
    before.push_back(t.p);
  }
  opt->step();
  for (size_t k = 0; k < shapes.size(); ++k) {
    const size_t n = ts[k].p.size();
    const size_t cols = shapes[k].size() < 2 ? n : n / static_cast<size_t>(shapes[k][0]);
    for (size_t r = 0; r < n / cols; ++r) {
      double mean = 0;
      for (size_t c = 0; c < cols; ++c) mean += ts[k].g[r * cols + c];
      mean /= static_cast<double>(cols);
      // float32: the mean (accumulated in double, rounded once), a subtract, a multiply and a
      // subtract, each within half an ulp of values of magnitude <= ~4.
      for (size_t c = 0; c < cols; ++c) {
        const size_t i = r * cols + c;
        const double want = before[k][i] - 0.5 * (ts[k].g[i] - mean);
        ASSERT_NEAR(ts[k].p[i], want, 4e-6) << "tensor " << k << ", element " << i;
      }
    }
  }
}

void expect_error(const Options& config, const std::string& fragment) {
  try {
    Optimizer::create(testing::shared_engine(), config);
    FAIL() << "expected an Error containing: " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(CustomOptimizer, RegistrationRejectsTakenNamesAndBadGraphs) {
  CustomOptimizer def{"adam", {{"lr", 1e-3}}, adan_graph, nullptr};
  EXPECT_THROW(register_optimizer(def), Error);  // a built-in's name
  def.type = "custom";
  EXPECT_THROW(register_optimizer(def), Error);  // reserved
  def.type = "adan_without_betas";  // adan_graph reads beta1..3, which {"lr"} does not define
  try {
    register_optimizer(def);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("graph scalar 'beta1'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Optimizer::create(testing::shared_engine(), {{"type", "adan_without_betas"}}),
               Error);
}

TEST(CustomOptimizer, DefinitionErrorsNameTheCulprit) {
  Options lion = lion_json();
  Options bad_scalar = lion;
  bad_scalar["graph"]["scalars"].push_back("gamma");
  expect_error({{"type", "custom"}, {"rule", bad_scalar}}, "graph scalar 'gamma'");
  Options grad_out = lion;
  grad_out["graph"]["outputs"]["grad"] = "m3";
  expect_error({{"type", "custom"}, {"rule", grad_out}}, "would overwrite the gradient");
  Options bad_node = lion;
  bad_node["graph"]["nodes"][3]["args"][1] = "nope";
  expect_error({{"type", "custom"}, {"rule", bad_node}}, "graph JSON /nodes/3/args/1");
  Options bad_beta = lion;
  bad_beta["defaults"]["betas"] = {0.9, 1.5};
  expect_error({{"type", "custom"}, {"rule", bad_beta}}, "Invalid beta parameter at index 1");
  expect_error({{"type", "custom"}}, "needs \"rule\"");
  expect_error({{"type", "adam"}, {"rule", lion}}, "only for type \"custom\"");
}

}  // namespace
}  // namespace optfuse
