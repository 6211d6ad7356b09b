// Adafactor (torch.optim.Adafactor): against torch's own trajectories (tests/golden/adafactor,
// make_adafactor_golden.py), against an independent double reference for 100 steps
// (support/reference_adafactor.h), its kernels and their passes over memory, its state's shapes,
// save / load, validation messages and the C API.
//
// Tolerance against the reference, per element: |optfuse - reference| <= kEvaluationOrderSlack *
// bound, the reference's running bound on one float32 evaluation (reference_adafactor.h: u of
// the param's magnitudes and 12u of the update term per step). Against torch: twice that,
// 2 * kEvaluationOrderSlack * bound (two float32 evaluations, each within its slack of the exact
// result). torch's reductions are float32 norms, ours double: their RMS differ by ~1e-7
// relative, inside the update term's 12u. The tests print the share of the bound used.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "optfuse/engine.h"
#include "optfuse/optfuse.h"
#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/optim_util.h"
#include "support/reference_adafactor.h"

namespace optfuse {
namespace {

using testing::AdafactorConfig;
using testing::AdafactorReference;
using testing::error_of;
using testing::gen_floats;
using ::testing::HasSubstr;
using testing::kEvaluationOrderSlack;
using testing::within_bound;

Engine& engine() { return testing::shared_engine(); }

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Options config_of(const AdafactorConfig& c) {
  Options eps = {c.eps1 ? Options(*c.eps1) : Options(nullptr), c.eps2};
  return {{"type", "adafactor"},
          {"lr", c.lr},
          {"beta2_decay", c.beta2_decay},
          {"eps", eps},
          {"d", c.d},
          {"weight_decay", c.weight_decay},
          {"maximize", c.maximize}};
}

// One group of tensors with these shapes, params gen(1 + k, i), its optimizer and references.
struct Trajectory {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<float>> p, g;
  std::unique_ptr<Optimizer> opt;
  std::vector<AdafactorReference> ref;

  Trajectory(const AdafactorConfig& c, std::vector<std::vector<int64_t>> s) : shapes(std::move(s)) {
    opt = Optimizer::create(engine(), config_of(c));
    std::vector<ParamRef> refs;
    for (size_t k = 0; k < shapes.size(); ++k) {
      const size_t n = static_cast<size_t>(numel_of(shapes[k]));
      p.push_back(gen_floats(uint32_t(1 + k), n));
      g.emplace_back(n, 0.0f);
      ref.emplace_back(c, shapes[k], p.back());
    }
    for (size_t k = 0; k < shapes.size(); ++k)
      refs.push_back(
          {{p[k].data(), int64_t(p[k].size()), shapes[k]}, {g[k].data(), int64_t(g[k].size())}});
    opt->add_param_group(refs);
  }

  // Step t with grads gen(100 + 10 k + t, i) * scale and learning rate lr.
  void step(int t, double scale, double lr) {
    for (size_t k = 0; k < shapes.size(); ++k) {  // (in place: the optimizer holds g[k].data())
      const std::vector<float> grad = gen_floats(uint32_t(100 + 10 * k + t), g[k].size(), scale);
      std::copy(grad.begin(), grad.end(), g[k].begin());
    }
    opt->set(0, "lr", lr);
    opt->step();
    for (size_t k = 0; k < shapes.size(); ++k) ref[k].step(g[k], lr);
  }
};

const std::vector<std::vector<int64_t>> kShapes = {{257}, {13, 37}, {3, 9, 17}, {40, 1}, {1, 50}};

// Steps 6-8 and 30-31 scale the gradient up 64x: the update's RMS then exceeds d, clipping.
double grad_scale(int t) { return (t >= 6 && t <= 8) || t == 30 || t == 31 ? 8.0 : 0.125; }

// ---- Against the double reference -----------------------------------------------------------

struct RefCase {
  const char* name;
  AdafactorConfig config;
};

class AgainstReference : public ::testing::TestWithParam<RefCase> {};

// 100 steps on a vector, a matrix, a batch of matrices and matrices of one column and one row,
// with a decaying lr: the lr branch of rho_t (lr < 1/sqrt(t)) and the other one, clipping on
// the steps the gradient jumps and not on the others.
TEST_P(AgainstReference, HundredStepsWithinTheFloat32Bound) {
  const AdafactorConfig c = GetParam().config;
  Trajectory run(c, kShapes);
  bool rho_lr = false, rho_sqrt = false, clipped = false, unclipped = false;
  for (int t = 1; t <= 100; ++t) {
    const double lr = c.lr * (1.0 - 0.009 * (t - 1));
    run.step(t, grad_scale(t), lr);
    (lr < 1.0 / std::sqrt(double(t)) ? rho_lr : rho_sqrt) = true;
    for (const AdafactorReference& r : run.ref) (r.clipped() ? clipped : unclipped) = true;
    if (t % 25 != 0 && t != 1) continue;
    for (size_t k = 0; k < kShapes.size(); ++k) {
      double worst = 0;
      EXPECT_TRUE(within_bound(GetParam().name + std::string(" tensor ") + std::to_string(k) +
                                   " step " + std::to_string(t),
                               run.p[k].data(), run.ref[k].param(), run.ref[k].bound(),
                               kEvaluationOrderSlack, &worst));
      if (t == 100) std::printf("  tensor %zu: %.2f of the bound used\n", k, worst);
    }
  }
  EXPECT_TRUE(clipped && unclipped);
  EXPECT_TRUE(rho_lr && (rho_sqrt || c.lr < 0.1));
  // The state: f32 lerps of means, each within a few ulp of the double one (a lerp contracts
  // its inputs' errors): 1e-6 relative.
  for (size_t k = 0; k < kShapes.size(); ++k) {
    const AdafactorReference& r = run.ref[k];
    for (const char* name : {"row_var", "col_var", "variance"}) {
      const std::vector<double>& want = std::string(name) == "row_var"   ? r.row_var()
                                        : std::string(name) == "col_var" ? r.col_var()
                                                                         : r.variance();
      if (want.empty()) {
        EXPECT_EQ(run.opt->state(0, k, name), nullptr) << name;
        continue;
      }
      const std::vector<float> got = run.opt->state_values(0, k, name);
      ASSERT_EQ(got.size(), want.size()) << name;
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-6 * std::fabs(want[i]) + 1e-30) << name << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Adafactor, AgainstReference,
    ::testing::Values(
        RefCase{"defaults", AdafactorConfig{}},
        RefCase{"lr_wd_maximize", AdafactorConfig{0.5, -0.5, 1e-10, 1e-3, 1.0, 0.05, true}},
        RefCase{"unclipped_d", AdafactorConfig{0.3, -0.7, std::nullopt, 1e-2, 1.5, 0.1, false}}),
    [](const auto& info) { return std::string(info.param.name); });

// ---- Against torch ---------------------------------------------------------------------------

std::filesystem::path golden_dir() {
  return std::filesystem::path(OPTFUSE_TEST_DATA_DIR) / "golden" / "adafactor";
}

std::vector<float> floats(const Options& j) {
  std::vector<float> out;
  for (const auto& x : j) out.push_back(static_cast<float>(x.get<double>()));  // %.9g: exact
  return out;
}

class AgainstTorch : public ::testing::TestWithParam<const char*> {};

// torch 2.15's own 30 steps (make_adafactor_golden.py): the params after the recorded steps and
// the final state, for a vector, a matrix and a batch of matrices in one group.
TEST_P(AgainstTorch, GoldenTrajectory) {
  std::ifstream in(golden_dir() / (std::string(GetParam()) + ".json"));
  ASSERT_TRUE(in) << "golden file missing";
  const Options j = Options::parse(in);
  const Options& h = j.at("hyper");
  AdafactorConfig c;
  c.lr = h.at("lr");
  c.beta2_decay = h.at("beta2_decay");
  if (!h.at("eps")[0].is_null()) c.eps1 = h.at("eps")[0].get<double>();
  c.eps2 = h.at("eps")[1];
  c.d = h.at("d");
  c.weight_decay = h.at("weight_decay");
  c.maximize = h.at("maximize");
  const std::vector<std::string> names = {"vector", "matrix", "batched"};
  std::vector<std::vector<int64_t>> shapes;
  for (const std::string& n : names)
    shapes.push_back(j.at("tensors").at(n).at("shape").get<std::vector<int64_t>>());
  Trajectory run(c, shapes);
  const std::vector<int> recorded = j.at("recorded").get<std::vector<int>>();
  const std::vector<double> lrs = j.at("lr_schedule").get<std::vector<double>>();
  size_t at = 0;
  for (int t = 1; t <= j.at("steps").get<int>(); ++t) {
    run.step(t, t == 6 || t == 7 ? 8.0 : 0.125, lrs.at(size_t(t - 1)));
    if (at >= recorded.size() || recorded[at] != t) continue;
    for (size_t k = 0; k < names.size(); ++k) {
      const std::vector<float> torch_p = floats(j["tensors"][names[k]]["params"][at]);
      // torch against the reference, then optfuse against torch.
      EXPECT_TRUE(within_bound(names[k] + " torch vs reference, step " + std::to_string(t),
                               torch_p.data(), run.ref[k].param(), run.ref[k].bound(),
                               kEvaluationOrderSlack));
      std::vector<double> torch_d(torch_p.begin(), torch_p.end());
      double worst = 0;
      EXPECT_TRUE(within_bound(names[k] + " optfuse vs torch, step " + std::to_string(t),
                               run.p[k].data(), torch_d, run.ref[k].bound(),
                               2 * kEvaluationOrderSlack, &worst));
      if (t == recorded.back())
        std::printf("  %s: %.2f of the bound used\n", names[k].c_str(), worst);
    }
    ++at;
  }
  // Final state, torch's names and values (flattened from [..., R, 1] / [..., 1, C]): 2e-6
  // relative (each a few f32 roundings; torch squares an f32 norm, optfuse divides a double sum).
  for (size_t k = 0; k < names.size(); ++k)
    for (const auto& [name, values] : j["tensors"][names[k]]["state"].items()) {
      const std::vector<float> want = floats(values);
      const std::vector<float> got = run.opt->state_values(0, k, name);
      ASSERT_EQ(got.size(), want.size()) << names[k] << " " << name;
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 2e-6 * std::fabs(want[i]) + 1e-30)
            << names[k] << " " << name << "[" << i << "]";
    }
}

INSTANTIATE_TEST_SUITE_P(Adafactor, AgainstTorch,
                         ::testing::Values("adafactor", "adafactor_lr_wd_maximize",
                                           "adafactor_unclipped"));

// ---- Kernels, passes, state ------------------------------------------------------------------

// A step runs one kernel call per tensor: the vector kernel for the tensor of one dim and the
// factored one for the others; the factored kernel reads the grad in three passes (row and
// column means of g^2 in one, the update's RMS, the update) and the param in two (its RMS, the
// update): 24 bytes per f32 element.
TEST(AdafactorKernels, OneKernelPerTensorAndThreeGradPasses) {
  Trajectory run(AdafactorConfig{}, {{64}, {32, 48}, {2, 16, 24}});
  run.step(1, 0.125, 1e-2);
  const std::vector<Optimizer::KernelUse> uses = run.opt->kernel_uses();
  ASSERT_EQ(uses.size(), 2u);
  for (const auto& u : uses) EXPECT_EQ(u.tensors, u.name == "adafactor" ? 1 : 2) << u.name;
  const Graph factored = update_graph({{"type", "adafactor"}}, {}, DType::F32, DType::F32, 0, 2);
  EXPECT_TRUE(uses_cols(factored));
  const std::string stmt = engine().lowered_stmt(factored);
  // The Funcs whose loops load `buffer` (in1_grad, in0_param: the kernel's ImageParams), by the
  // loop variables in the loads' indices; one whose loop over rows is another's (compute_with:
  // its row loop named after that one's rows, "<stage>_k") reads in the same pass.
  auto passes = [&](const std::string& buffer) {
    std::set<std::string> funcs;
    const std::regex load(buffer + "\\[[^\\]]*\\]"), func("([A-Za-z0-9_$]+)\\.s[0-9]+\\.");
    for (std::sregex_iterator it(stmt.begin(), stmt.end(), load), end; it != end; ++it) {
      const std::string index = it->str();
      for (std::sregex_iterator f(index.begin(), index.end(), func); f != end; ++f)
        funcs.insert((*f)[1]);
    }
    int fused = 0;
    for (const std::string& f : funcs)
      for (const std::string& other : funcs) {
        const std::string stage = other.substr(0, other.find('_'));
        if (other != f && stmt.find("for (" + f + ".s1." + stage + "_k$") != std::string::npos)
          ++fused;
      }
    return int(funcs.size()) - fused;
  };
  EXPECT_EQ(passes("in1_grad"), 3) << stmt;
  EXPECT_EQ(passes("in0_param"), 2);
}

TEST(AdafactorState, TorchNamesShapesAndCounts) {
  Trajectory run(AdafactorConfig{}, {{10}, {4, 6}, {2, 3, 5}});
  auto spec = [&](size_t k) {
    std::map<std::string, std::pair<int64_t, std::vector<int64_t>>> out;
    for (const auto& s : run.opt->state_spec(0, k)) out[s.name] = {s.numel, s.shape};
    return out;
  };
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(spec(0), (std::map<std::string, std::pair<int64_t, Shape>>{{"variance", {10, {10}}}}));
  EXPECT_EQ(spec(1), (std::map<std::string, std::pair<int64_t, Shape>>{{"row_var", {4, {4, 1}}},
                                                                       {"col_var", {6, {1, 6}}}}));
  EXPECT_EQ(spec(2), (std::map<std::string, std::pair<int64_t, Shape>>{
                         {"row_var", {6, {2, 3, 1}}}, {"col_var", {10, {2, 1, 5}}}}));
  run.step(1, 0.125, 1e-2);
  EXPECT_EQ(run.opt->state_values(0, 2, "row_var").size(), 6u);
  EXPECT_EQ(run.opt->state_ref(0, 1, "col_var").numel, 6);
  EXPECT_EQ(run.opt->step_count(0, 2), 1);
}

// Saved after 5 steps and loaded into a new optimizer, the next 5 steps are bit-identical.
TEST(AdafactorState, SaveLoadResumesBitIdentically) {
  const AdafactorConfig c{0.3, -0.8, std::nullopt, 1e-3, 1.0, 0.01, false};
  Trajectory a(c, kShapes), b(c, kShapes);
  for (int t = 1; t <= 5; ++t) a.step(t, grad_scale(t), 0.3);
  const std::string path = testing::temp_path("adafactor_state");
  a.opt->save_state(path);
  for (size_t k = 0; k < kShapes.size(); ++k)  // (in place: b's optimizer holds b.p[k].data())
    std::copy(a.p[k].begin(), a.p[k].end(), b.p[k].begin());
  b.opt->load_state(path);
  for (int t = 6; t <= 10; ++t) {
    a.step(t, grad_scale(t), 0.3);
    b.step(t, grad_scale(t), 0.3);
  }
  for (size_t k = 0; k < kShapes.size(); ++k) EXPECT_TRUE(testing::same_bits(a.p[k], b.p[k])) << k;
  EXPECT_EQ(b.opt->step_count(0, 2), 10);
  std::filesystem::remove(path);
}

TEST(AdafactorOptions, TorchDefaultsAndValueErrorTexts) {
  EXPECT_EQ(optimizer_defaults("adafactor"), Options({{"lr", 1e-2},
                                                      {"beta2_decay", -0.8},
                                                      {"eps", {nullptr, 1e-3}},
                                                      {"d", 1.0},
                                                      {"weight_decay", 0.0},
                                                      {"maximize", false}}));
  auto message = [](const Options& overrides) {
    Options config = {{"type", "adafactor"}};
    config.update(overrides);
    return error_of([&] { Optimizer::create(engine(), config); });
  };
  EXPECT_THAT(message({{"lr", -1.0}}), HasSubstr("Learning rate should be >= 0 but is: -1.0"));
  EXPECT_THAT(message({{"beta2_decay", 0.5}}), HasSubstr("beta2_decay should be <= 0 but is: 0.5"));
  EXPECT_THAT(message({{"eps", {-1e-3, 1e-3}}}),
              HasSubstr("epsilon1 should be >= 0 but is: -0.001"));
  EXPECT_THAT(message({{"eps", {nullptr, -1.0}}}),
              HasSubstr("epsilon2 should be >= 0 but is: -1.0"));
  EXPECT_THAT(message({{"d", 0.5}}), HasSubstr("Clipping threshold d should be >= 1 but is: 0.5"));
  EXPECT_THAT(message({{"weight_decay", -0.1}}),
              HasSubstr("weight_decay should be >= 0 but is: -0.1"));
  EXPECT_THAT(message({{"eps", {1e-3}}}), HasSubstr("option 'eps' must be a list of two numbers"));
}

// The C API: a config with eps's null, a matrix by its shape and a vector, stepped.
TEST(AdafactorCApi, CreateAddGroupStep) {
  optfuse_engine* e = nullptr;
  ASSERT_EQ(optfuse_engine_create_cached("host", 0, nullptr, &e), OPTFUSE_OK);
  optfuse_optimizer* o = nullptr;
  ASSERT_EQ(optfuse_optimizer_create(e, R"({"type":"Adafactor","lr":0.01,"eps":[null,0.001]})", &o),
            OPTFUSE_OK)
      << optfuse_last_error();
  std::vector<float> w = gen_floats(1, 24), wg = gen_floats(2, 24, 0.1), b = gen_floats(3, 6),
                     bg = gen_floats(4, 6, 0.1);
  const std::vector<float> w0 = w;
  float* params[] = {w.data(), b.data()};
  float* grads[] = {wg.data(), bg.data()};
  const int64_t numels[] = {24, 6};
  const int64_t w_shape[] = {4, 6}, b_shape[] = {6};
  const int64_t* shapes[] = {w_shape, b_shape};
  const int ndims[] = {2, 1};
  ASSERT_EQ(optfuse_optimizer_add_group(o, 2, params, grads, numels, shapes, ndims, nullptr),
            OPTFUSE_OK)
      << optfuse_last_error();
  ASSERT_EQ(optfuse_optimizer_step(o), OPTFUSE_OK) << optfuse_last_error();
  AdafactorReference ref(AdafactorConfig{}, {4, 6}, w0);
  ref.step(wg, 0.01);
  EXPECT_TRUE(
      within_bound("C API matrix", w.data(), ref.param(), ref.bound(), kEvaluationOrderSlack));
  optfuse_optimizer_destroy(o);
  optfuse_engine_destroy(e);
}

}  // namespace
}  // namespace optfuse
