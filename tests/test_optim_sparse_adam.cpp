// LazyAdam ("sparseadam" / "lazyadam"): row-sparse gradients against the trajectory recorded with
// torch.optim.SparseAdam (tests/golden/make_sparse_golden.py -> golden/sparse/sparseadam.json), and
// the errors torch gives (dense gradients to SparseAdam, sparse gradients to dense optimizers).
//
// Tolerance: optfuse evaluates torch's SparseAdam formulas in the same order in f32 (host scalars
// in double, rounded once, where torch computes step_size in Python double too); FMA contraction
// may remove a rounding. Per element: |p - torch| <= 2e-6 |torch| + 1e-9 and the same for the
// moments, after every step (measured worst below, printed). Rows a step does not touch must be
// bit-identical to before (param and both moments).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "optfuse/optfuse.h"
#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/gen.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using testing::error_of;
using ::testing::HasSubstr;

Engine& engine() { return testing::shared_engine(); }

nlohmann::json golden() {
  std::ifstream in(std::string(OPTFUSE_TEST_DATA_DIR) + "/golden/sparse/sparseadam.json");
  return nlohmann::json::parse(in);
}

double worst_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = 2e-6 * std::fabs(want[i]) + 1e-9;
    w = std::max(w, std::fabs(got[i] - want[i]) / tol);
  }
  return w;  // <= 1: within tolerance
}

TEST(SparseAdam, MatchesTorchSparseAdamAndLeavesUntouchedRowsAlone) {
  nlohmann::json gd = golden();
  const int64_t rows = gd["rows"], cols = gd["cols"];
  const int steps = gd["steps"];
  std::vector<float> p(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(testing::gen(7, i));
  auto opt = Optimizer::create(engine(), {{"type", "LazyAdam"},
                                          {"lr", gd["hyper"]["lr"]},
                                          {"betas", gd["hyper"]["betas"]},
                                          {"eps", gd["hyper"]["eps"]}});
  EXPECT_EQ(opt->type(), "sparseadam");
  opt->add_param_group({{{p.data(), rows * cols, {rows, cols}}, {}, "embedding"}});
  double worst = 0;
  std::vector<float> values;
  for (int t = 1; t <= steps; ++t) {
    std::vector<int64_t> at = gd["rows_at"][t - 1].get<std::vector<int64_t>>();
    values.assign(at.size() * size_t(cols), 0.f);
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<float>(testing::gen(300 + uint32_t(t), i) * 0.125);
    std::vector<float> before = p;
    std::vector<float> m_before = opt->state_values(0, 0, "exp_avg");
    opt->set_sparse_grad(0, 0, at, {values.data(), int64_t(values.size())});
    opt->step();
    EXPECT_EQ(opt->step_count(0, 0), t);
    std::vector<double> want = gd["params"][t - 1].get<std::vector<double>>();
    worst = std::max(worst, worst_rel(p, want));
    for (int64_t r = 0; r < rows; ++r) {
      if (std::find(at.begin(), at.end(), r) != at.end()) continue;
      for (int64_t c = 0; c < cols; ++c) {
        size_t i = size_t(r * cols + c);
        ASSERT_EQ(p[i], before[i]) << "untouched row " << r << " changed at step " << t;
        if (!m_before.empty())
          ASSERT_EQ(opt->state_values(0, 0, "exp_avg")[i], m_before[i]) << "row " << r;
      }
    }
  }
  worst = std::max(
      worst, worst_rel(*opt->state(0, 0, "exp_avg"), gd["exp_avg"].get<std::vector<double>>()));
  worst = std::max(worst, worst_rel(*opt->state(0, 0, "exp_avg_sq"),
                                    gd["exp_avg_sq"].get<std::vector<double>>()));
  EXPECT_LE(worst, 1.0);
  std::printf("sparseadam vs torch %s: worst |diff| / tolerance = %.3f\n",
              gd["torch_version"].get<std::string>().c_str(), worst);
}

TEST(SparseAdam, OneDimensionalParamsHaveRowsOfOneElement) {
  std::vector<float> p = {1, 2, 3, 4, 5, 6}, v = {0.5f, -0.5f};
  auto opt = Optimizer::create(engine(), {{"type", "sparseadam"}, {"lr", 0.1}});
  opt->add_param_group({{{p.data(), 6}, {}}});
  opt->set_sparse_grad(0, 0, {4, 1}, {v.data(), 2});
  opt->step();
  // Adam's first step moves by -lr * sign(g) (up to eps): row 4 (g = 0.5) down, row 1 (g = -0.5)
  // up, nothing else.
  std::vector<float> want = {1, 2 + 0.1f, 3, 4, 5 - 0.1f, 6};
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], want[i], 1e-6) << i;
  EXPECT_EQ(opt->bytes_per_step(), 2 * 28);  // two elements touched: 4 reads + 3 writes of f32
}

TEST(SparseAdam, DenseAndSparseGradientMismatchesAreRejectedLikeTorch) {
  std::vector<float> p(20, 1.f), g(20, 0.f), v(10, 0.f);
  auto sparse = Optimizer::create(engine(), {{"type", "sparseadam"}});
  EXPECT_THAT(error_of([&] {
                sparse->add_param_group({{{p.data(), 20}, {g.data(), 20}, "w"}});
              }),
              HasSubstr("param group 0, tensor 0 ('w'): sparseadam does not support dense "
                        "gradients, please consider Adam instead"));
  EXPECT_EQ(sparse->num_groups(), 0u);
  sparse->add_param_group({{{p.data(), 20, {4, 5}}, {}, "w"}});
  EXPECT_THAT(error_of([&] { sparse->step(); }),
              HasSubstr("param group 0, tensor 0 ('w'): no sparse gradient was given"));
  EXPECT_THAT(error_of([&] {
                sparse->set_grad(0, 0, {g.data(), 20});
              }),
              HasSubstr("sparseadam does not support dense gradients"));
  EXPECT_THAT(
      error_of([&] {
        sparse->set_sparse_grad(0, 0, {1, 4}, {v.data(), 5});
      }),
      HasSubstr("sparse gradient has 2 rows of 5 elements, so 10 values, but values has 5"));
  EXPECT_THAT(error_of([&] {
                sparse->set_sparse_grad(0, 0, {1, 4}, {v.data(), 10});
              }),
              HasSubstr("sparse gradient row 4 is out of range [0, 4)"));
  EXPECT_THAT(error_of([&] {
                sparse->set_sparse_grad(0, 0, {2, 0, 2}, {v.data(), 15});
              }),
              HasSubstr("sparse gradient row 2 appears more than once"));
  EXPECT_THAT(error_of([&] {
                sparse->set_sparse_grad(0, 0, {0, 1}, {p.data() + 5, 10});
              }),
              HasSubstr("grad memory overlaps the param of param group 0, tensor 0 ('w')"));
  EXPECT_EQ(sparse->step_count(0, 0), 0);

  auto dense = Optimizer::create(engine(), {{"type", "adamw"}});
  dense->add_param_group({{{p.data(), 20}, {g.data(), 20}, "w"}});
  EXPECT_THAT(error_of([&] {
                dense->set_sparse_grad(0, 0, {0}, {v.data(), 1});
              }),
              HasSubstr("param group 0, tensor 0 ('w'): adamw does not support sparse gradients"));
}

TEST(SparseAdam, ThroughTheCApi) {
  optfuse_engine* e = nullptr;
  ASSERT_EQ(optfuse_engine_create("host", 0, &e), OPTFUSE_OK);
  optfuse_optimizer* o = nullptr;
  ASSERT_EQ(optfuse_optimizer_create(e, "{\"type\":\"lazyadam\",\"lr\":0.1}", &o), OPTFUSE_OK);
  std::vector<float> p = {1, 2, 3, 4}, v = {0.5f};
  float* ps[] = {p.data()};
  float* gs[] = {nullptr};
  int64_t numels[] = {4};
  ASSERT_EQ(optfuse_optimizer_add_group(o, 1, ps, gs, numels, nullptr, nullptr, nullptr),
            OPTFUSE_OK);
  EXPECT_EQ(optfuse_optimizer_step(o), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(optfuse_last_error(), HasSubstr("no sparse gradient was given"));
  int64_t rows[] = {2};
  ASSERT_EQ(optfuse_optimizer_set_sparse_grad(o, 0, 0, rows, 1, v.data(), 1), OPTFUSE_OK);
  ASSERT_EQ(optfuse_optimizer_step(o), OPTFUSE_OK);
  EXPECT_EQ(p[0], 1.f);
  EXPECT_NEAR(p[2], 2.9f, 1e-6);
  optfuse_optimizer_destroy(o);
  optfuse_engine_destroy(e);
}

TEST(SparseAdam, Bf16ParamsUpdateTheirMasterRowsOnly) {
  const int64_t rows = 8, cols = 3;
  std::vector<float> p32(rows * cols);
  std::vector<uint16_t> p16(rows * cols);
  for (size_t i = 0; i < p32.size(); ++i) {
    p32[i] = static_cast<float>(1 + i);  // exact in bf16 (small integers)
    uint32_t u;
    std::memcpy(&u, &p32[i], 4);
    p16[i] = static_cast<uint16_t>(u >> 16);
  }
  std::vector<float> v(2 * cols, 0.25f);
  auto a = Optimizer::create(engine(), {{"type", "sparseadam"}, {"lr", 0.5}});
  auto b = Optimizer::create(engine(), {{"type", "sparseadam"}, {"lr", 0.5}});
  a->add_param_group({{{p32.data(), rows * cols, {rows, cols}}, {}}});
  b->add_param_group({{{p16.data(), rows * cols, {rows, cols}, DType::BF16}, {}}});
  a->set_sparse_grad(0, 0, {6, 2}, {v.data(), 2 * cols});
  b->set_sparse_grad(0, 0, {6, 2}, {v.data(), 2 * cols});
  a->step();
  b->step();
  const std::vector<float>& master = *b->state(0, 0, "master");
  for (size_t i = 0; i < p32.size(); ++i)  // two f32 evaluations (kMaxUlps in test_mixed_precision)
    EXPECT_NEAR(master[i], p32[i], 1e-6 * std::fabs(p32[i])) << i;
  EXPECT_EQ(p32[0], 1.f);
  EXPECT_NE(p32[2 * cols], float(1 + 2 * cols));
}

}  // namespace
}  // namespace optfuse
