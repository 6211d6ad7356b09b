// Gradient centralization (per-group "grad_centralization" on SGD, Adam, AdamW): against the
// independent reference in support/reference_gc.h, one kernel per tensor (the row mean is the
// kernel's prologue), 1-D tensors untouched, and the errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/optim_util.h"
#include "support/reference_gc.h"

namespace optfuse {
namespace {

using testing::GcConfig;
using testing::GcReference;
using testing::gen_floats;
using ::testing::HasSubstr;

struct Param {
  std::vector<int64_t> shape;
  std::vector<float> p, g;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// A matrix, a 3-D tensor (rows = shape[0], a row is the other two dims), a 1-D bias (left alone)
// and a matrix with one column (every centered gradient is 0).
std::vector<Param> model() {
  std::vector<Param> ps{{{33, 17}, {}, {}}, {{8, 3, 5}, {}, {}}, {{40}, {}, {}}, {{6, 1}, {}, {}}};
  uint32_t seed = 1;
  for (Param& p : ps) {
    p.p = gen_floats(seed++, static_cast<size_t>(p.numel()));
    p.g.assign(p.p.size(), 0.0f);
  }
  return ps;
}

std::vector<ParamRef> refs(std::vector<Param>& ps) {
  std::vector<ParamRef> r;
  for (Param& p : ps)
    r.push_back({{p.p.data(), p.numel(), p.shape}, {p.g.data(), p.numel(), p.shape}, ""});
  return r;
}

struct Case {
  std::string name;
  Options options;  // optfuse's config
  GcConfig reference;
};

class GradCentralization : public ::testing::TestWithParam<Case> {};

// 5 steps with fresh gradients each step. Tolerance: 1e-5 relative + 1e-6 absolute per element
// of params and states. The kernel computes in float32 (row means accumulated in double, rounded
// once), the reference in double; five steps of a few float32 roundings each stay within ~10
// ulp of values of order 1, and centered gradients of order 1 keep Adam's m / sqrt(v) away from
// the 0/0 corner where float32 and double could disagree by more.
TEST_P(GradCentralization, MatchesReference) {
  const Case& c = GetParam();
  Engine& engine = testing::shared_engine();
  std::vector<Param> ps = model();
  std::vector<GcReference> ref;
  for (const Param& p : ps) ref.emplace_back(c.reference, p.shape, p.p);
  auto opt = Optimizer::create(engine, c.options);
  opt->add_param_group(refs(ps), {{"grad_centralization", true}});
  for (int step = 1; step <= 5; ++step) {
    for (size_t i = 0; i < ps.size(); ++i) {
      ps[i].g = gen_floats(100 + 10 * step + static_cast<uint32_t>(i), ps[i].g.size());
      opt->set_grad(0, i, {ps[i].g.data(), ps[i].numel(), ps[i].shape});
      ref[i].step(ps[i].g);
    }
    opt->step();
  }
  auto close = [](double got, double want) {
    return std::fabs(got - want) <= 1e-6 + 1e-5 * std::fabs(want);
  };
  for (size_t i = 0; i < ps.size(); ++i) {
    for (size_t k = 0; k < ps[i].p.size(); ++k)
      ASSERT_TRUE(close(ps[i].p[k], ref[i].param()[k]))
          << "tensor " << i << " param[" << k << "]: " << ps[i].p[k] << " vs " << ref[i].param()[k];
    for (const char* name : {"momentum_buffer", "exp_avg", "exp_avg_sq"}) {
      const std::vector<float>* got = opt->state(0, i, name);
      if (!got) continue;
      for (size_t k = 0; k < got->size(); ++k)
        ASSERT_TRUE(close((*got)[k], ref[i].state(name)[k]))
            << "tensor " << i << " " << name << "[" << k << "]";
    }
  }
  // Two kernels serve the group: the centralized one for the 3 tensors with >= 2 dims (one
  // kernel call each: the row mean is its prologue) and the plain one for the bias.
  auto uses = opt->kernel_uses();
  ASSERT_EQ(uses.size(), 2u);
  int64_t gc_tensors = 0, plain_tensors = 0;
  for (const auto& u : uses)
    (u.name.find("_gc") != std::string::npos ? gc_tensors : plain_tensors) += u.tensors;
  EXPECT_EQ(gc_tensors, 3);
  EXPECT_EQ(plain_tensors, 1);
}

GcConfig ref(std::string type, double lr, double wd, double momentum = 0, bool nesterov = false,
             bool maximize = false) {
  GcConfig c;
  c.type = std::move(type);
  c.lr = lr;
  c.weight_decay = wd;
  c.momentum = momentum;
  c.nesterov = nesterov;
  c.maximize = maximize;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Optim, GradCentralization,
    ::testing::Values(
        Case{"sgd", {{"type", "sgd"}, {"lr", 0.1}, {"weight_decay", 0.01}}, ref("sgd", 0.1, 0.01)},
        Case{"sgd_nesterov",
             {{"type", "sgd"},
              {"lr", 0.1},
              {"momentum", 0.9},
              {"nesterov", true},
              {"maximize", true}},
             ref("sgd", 0.1, 0, 0.9, true, true)},
        Case{"adam",
             {{"type", "adam"}, {"lr", 1e-2}, {"weight_decay", 0.1}},
             ref("adam", 1e-2, 0.1)},
        Case{"adamw",
             {{"type", "adamw"}, {"lr", 1e-2}, {"weight_decay", 0.1}},
             ref("adamw", 1e-2, 0.1)}),
    [](const auto& info) { return info.param.name; });

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no optfuse::Error thrown";
  return "";
}

TEST(GradCentralizationErrors, NeedsShapes) {
  Engine& engine = testing::shared_engine();
  std::vector<float> p(12, 1.0f), g(12, 0.5f);
  auto opt = Optimizer::create(engine, {{"type", "adamw"}});
  std::vector<ParamRef> no_shape{{{p.data(), 12, {}}, {g.data(), 12, {}}, "w"}};
  EXPECT_THAT(error_of([&] {
                opt->add_param_group(no_shape, {{"grad_centralization", true}});
              }),
              HasSubstr("param group 0, tensor 0 ('w'): grad_centralization needs the param's "
                        "shape (TensorRef::shape)"));
  EXPECT_EQ(opt->num_groups(), 0u);
  opt->add_param_group(no_shape);
  EXPECT_THAT(error_of([&] { opt->set(0, "grad_centralization", true); }),
              HasSubstr("grad_centralization needs the param's shape"));
  EXPECT_EQ(opt->get(0, "grad_centralization"), false);  // a rejected call changes nothing
  EXPECT_THAT(error_of([&] {
                Optimizer::create(engine, {{"type", "adagrad"}, {"grad_centralization", true}});
              }),
              HasSubstr("unknown option 'grad_centralization' for adagrad"));
}

// Turning GC on between steps rebinds the kernels; a group of 1-D tensors needs no GC kernel.
TEST(GradCentralization, OneDimensionalGroupsUseThePlainKernel) {
  Engine& engine = testing::shared_engine();
  std::vector<float> p = gen_floats(5, 64), g = gen_floats(6, 64);
  std::vector<float> p2 = p;
  auto a = Optimizer::create(engine, {{"type", "sgd"}, {"lr", 0.1}});
  auto b = Optimizer::create(engine, {{"type", "sgd"}, {"lr", 0.1}});
  a->add_param_group({{{p.data(), 64, {64}}, {g.data(), 64, {64}}, ""}},
                     {{"grad_centralization", true}});
  b->add_param_group({{{p2.data(), 64, {64}}, {g.data(), 64, {64}}, ""}});
  a->step();
  b->step();
  EXPECT_EQ(p, p2);
  ASSERT_EQ(a->kernel_uses().size(), 1u);
  EXPECT_EQ(a->kernel_uses()[0].key, b->kernel_uses()[0].key);
}

}  // namespace
}  // namespace optfuse
