// The C API end to end: engine, optimizer from a JSON config with torch names, groups with shapes
// and per-group overrides, steps with lr changes, hyperparameter get/set, save/load, counters. It
// must give bit-identical results to the C++ API it wraps. Errors come back as status codes with
// optfuse_last_error() naming the fault; nothing is thrown across the boundary, and a failed call
// changes nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/optfuse.h"
#include "optfuse/optim.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;
using testing::Model;

// Calls a C API function, checking that it does not throw, and returns its status.
#define C_CALL(expr)                                    \
  [&] {                                                 \
    int rc_ = -1;                                       \
    EXPECT_NO_THROW(rc_ = (expr)) << #expr << " threw"; \
    return rc_;                                         \
  }()

std::string last_error() { return optfuse_last_error() ? optfuse_last_error() : "(null)"; }

// Owns a C engine for one test.
struct CEngine {
  optfuse_engine* e = nullptr;
  // Memory only (cache_dir NULL): the tests count compilations. examples/c_api.c runs the
  // default, optfuse_engine_create with the disk cache.
  CEngine() {
    EXPECT_EQ(optfuse_engine_create_cached("host", 0, nullptr, &e), OPTFUSE_OK) << last_error();
  }
  ~CEngine() { optfuse_engine_destroy(e); }
};

struct COptimizer {
  optfuse_optimizer* o = nullptr;
  COptimizer(optfuse_engine* e, const char* config) {
    EXPECT_EQ(optfuse_optimizer_create(e, config, &o), OPTFUSE_OK) << last_error();
  }
  ~COptimizer() { optfuse_optimizer_destroy(o); }
};

const char* const kConfig =
    R"({"type": "AdamW", "lr": 0.01, "betas": [0.9, 0.99], "weight_decay": 0.05})";
const char* const kGroup1Overrides = R"({"weight_decay": 0.0, "lr": 0.02})";

// Group 0: a [4, 5] matrix and a 3-vector, with shapes; group 1: one 1-D tensor of 33, no shapes.
Model two_groups(uint32_t seed) { return Model::make({{20, 3}, {33}}, seed); }

int add_groups_c(optfuse_optimizer* o, Model& m, const char* group1_overrides = kGroup1Overrides) {
  float* p0[] = {m.groups[0][0].p.data(), m.groups[0][1].p.data()};
  float* g0[] = {m.groups[0][0].g.data(), m.groups[0][1].g.data()};
  int64_t n0[] = {20, 3};
  int64_t shape_a[] = {4, 5}, shape_b[] = {3};
  const int64_t* shapes[] = {shape_a, shape_b};
  int ndims[] = {2, 1};
  int rc = optfuse_optimizer_add_group(o, 2, p0, g0, n0, shapes, ndims, nullptr);
  if (rc != OPTFUSE_OK) return rc;
  float* p1[] = {m.groups[1][0].p.data()};
  float* g1[] = {m.groups[1][0].g.data()};
  int64_t n1[] = {33};
  return optfuse_optimizer_add_group(o, 1, p1, g1, n1, nullptr, nullptr, group1_overrides);
}

// The same optimizer through the C++ API.
std::unique_ptr<Optimizer> cpp_twin(Engine& engine, Model& m) {
  auto opt = Optimizer::create(engine, Options::parse(kConfig));
  auto refs0 = m.refs(0);
  refs0[0].param.shape = refs0[0].grad.shape = {4, 5};
  opt->add_param_group(refs0);
  opt->add_param_group(m.refs(1), Options::parse(kGroup1Overrides));
  return opt;
}

bool same_params(const Model& a, const Model& b) {
  for (size_t g = 0; g < a.groups.size(); ++g)
    for (size_t i = 0; i < a.groups[g].size(); ++i)
      if (!testing::same_bits(a.groups[g][i].p, b.groups[g][i].p)) return false;
  return true;
}

TEST(CApi, VersionIsSet) {
  ASSERT_NE(optfuse_version(), nullptr);
  EXPECT_THAT(std::string(optfuse_version()),
              ::testing::MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+.*"));
}

TEST(CApi, EndToEndMatchesTheCppApiBitForBit) {
  CEngine ce;
  COptimizer co(ce.e, kConfig);
  ASSERT_NE(co.o, nullptr);
  Model cm = two_groups(3), pm = two_groups(3);
  ASSERT_EQ(C_CALL(add_groups_c(co.o, cm)), OPTFUSE_OK) << last_error();
  Engine engine;
  auto twin = cpp_twin(engine, pm);

  // Options came through with torch names: defaults, config and overrides.
  double v = 0;
  ASSERT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 0, "lr", &v)), OPTFUSE_OK) << last_error();
  EXPECT_EQ(v, 0.01);
  ASSERT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 1, "lr", &v)), OPTFUSE_OK);
  EXPECT_EQ(v, 0.02);
  ASSERT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 0, "weight_decay", &v)), OPTFUSE_OK);
  EXPECT_EQ(v, 0.05);
  ASSERT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 1, "weight_decay", &v)), OPTFUSE_OK);
  EXPECT_EQ(v, 0.0);
  ASSERT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 0, "eps", &v)), OPTFUSE_OK);
  EXPECT_EQ(v, 1e-8);  // torch's default

  for (int t = 1; t <= 4; ++t) {
    cm.fill_grads(t);
    pm.fill_grads(t);
    double lr = 0.01 / t;
    ASSERT_EQ(C_CALL(optfuse_optimizer_set_hyper(co.o, 0, "lr", lr)), OPTFUSE_OK) << last_error();
    twin->set(0, "lr", lr);
    ASSERT_EQ(C_CALL(optfuse_optimizer_step(co.o)), OPTFUSE_OK) << last_error();
    twin->step();
    ASSERT_TRUE(same_params(cm, pm)) << "step " << t;
    ASSERT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 0, "lr", &v)), OPTFUSE_OK);
    EXPECT_EQ(v, lr);
  }
  optfuse_counters c{};
  ASSERT_EQ(C_CALL(optfuse_engine_counters(ce.e, &c)), OPTFUSE_OK);
  EXPECT_EQ(c.compiles, 1) << "both groups are AdamW without AMSGrad: one kernel";
  EXPECT_GE(c.lookups, 1);
  EXPECT_GE(c.compile_seconds, 0.0);

  // A JSON-valued option: AMSGrad on group 1 is a second kernel.
  ASSERT_EQ(C_CALL(optfuse_optimizer_set_option_json(co.o, 1, "amsgrad", "true")), OPTFUSE_OK)
      << last_error();
  ASSERT_EQ(C_CALL(optfuse_optimizer_set_option_json(co.o, 0, "betas", "[0.8, 0.9]")), OPTFUSE_OK)
      << last_error();
  twin->set(1, "amsgrad", true);
  twin->set(0, "betas", {0.8, 0.9});
  cm.fill_grads(5);
  pm.fill_grads(5);
  ASSERT_EQ(C_CALL(optfuse_optimizer_step(co.o)), OPTFUSE_OK) << last_error();
  twin->step();
  EXPECT_TRUE(same_params(cm, pm));
  ASSERT_EQ(C_CALL(optfuse_engine_counters(ce.e, &c)), OPTFUSE_OK);
  EXPECT_EQ(c.compiles, 2);

  // Save; a fresh C optimizer over copies of the params loads it and continues identically.
  std::string path = testing::temp_path("capi_state");
  ASSERT_EQ(C_CALL(optfuse_optimizer_save(co.o, path.c_str())), OPTFUSE_OK) << last_error();
  COptimizer restored(ce.e, R"({"type": "adamw"})");
  Model rm = cm;
  ASSERT_EQ(C_CALL(add_groups_c(restored.o, rm)), OPTFUSE_OK) << last_error();
  ASSERT_EQ(C_CALL(optfuse_optimizer_load(restored.o, path.c_str())), OPTFUSE_OK) << last_error();
  ASSERT_EQ(C_CALL(optfuse_optimizer_get_hyper(restored.o, 0, "lr", &v)), OPTFUSE_OK);
  EXPECT_EQ(v, 0.01 / 4);
  for (int t = 6; t <= 8; ++t) {
    cm.fill_grads(t);
    rm.fill_grads(t);
    ASSERT_EQ(C_CALL(optfuse_optimizer_step(co.o)), OPTFUSE_OK);
    ASSERT_EQ(C_CALL(optfuse_optimizer_step(restored.o)), OPTFUSE_OK) << last_error();
    ASSERT_TRUE(same_params(cm, rm)) << "step " << t;
  }

  // set_grad points a tensor at a new buffer.
  std::vector<float> fresh_grad(33, 0.0f);
  ASSERT_EQ(C_CALL(optfuse_optimizer_set_grad(co.o, 1, 0, fresh_grad.data(), 33)), OPTFUSE_OK)
      << last_error();
  std::remove(path.c_str());
}

// Adadelta, ASGD, Rprop and Muon by their torch class names through the C API: the C++ API's
// bits, and a state file that resumes them exactly, ASGD's eta and mu (host state) with it (t0 =
// 2: ax averages from step 5, across the save at step 4). (Muon's orthogonalization runs the same
// CBLAS products on the same values in both.)
TEST(CApi, AdadeltaAsgdRpropMuonMatchTheCppApiAndResume) {
  for (const char* config : {R"({"type": "Adadelta", "lr": 0.5, "weight_decay": 0.01})",
                             R"({"type": "ASGD", "lr": 0.05, "lambd": 0.01, "t0": 2})",
                             R"({"type": "Rprop", "lr": 0.01, "etas": [0.3, 2.0]})",
                             R"({"type": "Muon", "lr": 0.02, "momentum": 0.9})"}) {
    SCOPED_TRACE(config);
    CEngine ce;
    COptimizer co(ce.e, config);
    Model cm = two_groups(7), pm = two_groups(7);
    const char* const lr_only = R"({"lr": 0.02})";  // (Rprop has no weight_decay)
    ASSERT_EQ(C_CALL(add_groups_c(co.o, cm, lr_only)), OPTFUSE_OK) << last_error();
    Engine engine;
    auto twin = Optimizer::create(engine, Options::parse(config));
    auto refs0 = pm.refs(0);
    refs0[0].param.shape = refs0[0].grad.shape = {4, 5};
    twin->add_param_group(refs0);
    twin->add_param_group(pm.refs(1), Options::parse(lr_only));
    const std::string path = testing::temp_path("capi_elementwise");
    COptimizer restored(ce.e, config);
    Model rm;
    for (int t = 1; t <= 8; ++t) {
      cm.fill_grads(t);
      pm.fill_grads(t);
      if (t > 4) rm.fill_grads(t);
      ASSERT_EQ(C_CALL(optfuse_optimizer_step(co.o)), OPTFUSE_OK) << last_error();
      twin->step();
      ASSERT_TRUE(same_params(cm, pm)) << "step " << t;
      if (t > 4) {
        ASSERT_EQ(C_CALL(optfuse_optimizer_step(restored.o)), OPTFUSE_OK) << last_error();
        ASSERT_TRUE(same_params(cm, rm)) << "resumed, step " << t;
      }
      if (t == 4) {
        ASSERT_EQ(C_CALL(optfuse_optimizer_save(co.o, path.c_str())), OPTFUSE_OK) << last_error();
        rm = cm;
        ASSERT_EQ(C_CALL(add_groups_c(restored.o, rm, lr_only)), OPTFUSE_OK) << last_error();
        ASSERT_EQ(C_CALL(optfuse_optimizer_load(restored.o, path.c_str())), OPTFUSE_OK)
            << last_error();
      }
    }
    std::remove(path.c_str());
  }
}

TEST(CApi, EightBitStateMatchesTheCppApiAndResumes) {
  // "state_dtype": "int8" is an option like any other: it goes in the JSON config. The C and C++
  // optimizers run the same kernels on the same bytes, so their params agree bit for bit; so
  // does a run resumed from a saved file (the codes and scales are the state).
  const char* config = R"({"type": "adamw", "lr": 0.01, "state_dtype": "int8", "block_size": 16,)"
                       R"( "min_8bit_size": 8})";
  CEngine ce;
  COptimizer co(ce.e, config);
  Model cm = Model::make({{100, 3}}, 4), pm = cm;
  float* p[] = {cm.groups[0][0].p.data(), cm.groups[0][1].p.data()};
  float* g[] = {cm.groups[0][0].g.data(), cm.groups[0][1].g.data()};
  int64_t n[] = {100, 3};
  ASSERT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 2, p, g, n, nullptr, nullptr, nullptr)),
            OPTFUSE_OK)
      << last_error();
  Engine engine;
  auto twin = Optimizer::create(engine, Options::parse(config));
  twin->add_param_group(pm.refs(0));
  for (int t = 1; t <= 3; ++t) {
    cm.fill_grads(t);
    pm.fill_grads(t);
    ASSERT_EQ(C_CALL(optfuse_optimizer_step(co.o)), OPTFUSE_OK) << last_error();
    twin->step();
    ASSERT_TRUE(same_params(cm, pm)) << "step " << t;
  }
  EXPECT_EQ(twin->state_ref(0, 0, "exp_avg").dtype, DType::U8);  // 100 >= min_8bit_size
  EXPECT_EQ(twin->state_ref(0, 1, "exp_avg").dtype, DType::F32);
  std::string path = testing::temp_path("capi_int8_state");
  ASSERT_EQ(C_CALL(optfuse_optimizer_save(co.o, path.c_str())), OPTFUSE_OK) << last_error();
  COptimizer restored(ce.e, config);
  Model rm = cm;
  float* rp[] = {rm.groups[0][0].p.data(), rm.groups[0][1].p.data()};
  float* rg[] = {rm.groups[0][0].g.data(), rm.groups[0][1].g.data()};
  ASSERT_EQ(
      C_CALL(optfuse_optimizer_add_group(restored.o, 2, rp, rg, n, nullptr, nullptr, nullptr)),
      OPTFUSE_OK);
  ASSERT_EQ(C_CALL(optfuse_optimizer_load(restored.o, path.c_str())), OPTFUSE_OK) << last_error();
  for (int t = 4; t <= 5; ++t) {
    cm.fill_grads(t);
    rm.fill_grads(t);
    ASSERT_EQ(C_CALL(optfuse_optimizer_step(co.o)), OPTFUSE_OK);
    ASSERT_EQ(C_CALL(optfuse_optimizer_step(restored.o)), OPTFUSE_OK) << last_error();
    ASSERT_TRUE(same_params(cm, rm)) << "step " << t;
  }
  std::remove(path.c_str());
}

TEST(CApi, NullPointersAreInvalidWithAMessage) {
  EXPECT_EQ(C_CALL(optfuse_engine_create("host", 0, nullptr)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("out"));
  CEngine ce;
  optfuse_optimizer* o = reinterpret_cast<optfuse_optimizer*>(0x1);
  EXPECT_EQ(C_CALL(optfuse_optimizer_create(nullptr, kConfig, &o)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("engine"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_create(ce.e, nullptr, &o)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("config"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_create(ce.e, kConfig, nullptr)), OPTFUSE_ERR_INVALID);
  EXPECT_EQ(C_CALL(optfuse_engine_counters(nullptr, nullptr)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("engine"));
  optfuse_counters c;
  EXPECT_EQ(C_CALL(optfuse_engine_counters(ce.e, nullptr)), OPTFUSE_ERR_INVALID);
  EXPECT_EQ(C_CALL(optfuse_engine_counters(nullptr, &c)), OPTFUSE_ERR_INVALID);
  EXPECT_EQ(C_CALL(optfuse_optimizer_step(nullptr)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("opt"));

  COptimizer co(ce.e, kConfig);
  Model m = two_groups(1);
  float* params[] = {m.groups[0][0].p.data()};
  float* grads[] = {m.groups[0][0].g.data()};
  int64_t numels[] = {20};
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 1, nullptr, grads, numels, nullptr, nullptr,
                                               nullptr)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("params"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 1, params, nullptr, numels, nullptr, nullptr,
                                               nullptr)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("grads"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 1, params, grads, nullptr, nullptr, nullptr,
                                               nullptr)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("numels"));
  float* null_param[] = {nullptr};
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 1, null_param, grads, numels, nullptr, nullptr,
                                               nullptr)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("param group 0, tensor 0: param pointer is null"));
  double v;
  EXPECT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 0, nullptr, &v)), OPTFUSE_ERR_INVALID);
  EXPECT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 0, "lr", nullptr)), OPTFUSE_ERR_INVALID);
  EXPECT_EQ(C_CALL(optfuse_optimizer_set_hyper(co.o, 0, nullptr, 0.1)), OPTFUSE_ERR_INVALID);
  EXPECT_EQ(C_CALL(optfuse_optimizer_set_option_json(co.o, 0, "betas", nullptr)),
            OPTFUSE_ERR_INVALID);
  EXPECT_EQ(C_CALL(optfuse_optimizer_save(co.o, nullptr)), OPTFUSE_ERR_INVALID);
  EXPECT_EQ(C_CALL(optfuse_optimizer_load(co.o, nullptr)), OPTFUSE_ERR_INVALID);
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(nullptr, 1, params, grads, numels, nullptr, nullptr,
                                               nullptr)),
            OPTFUSE_ERR_INVALID);
  optfuse_engine_destroy(nullptr);  // like free(NULL)
  optfuse_optimizer_destroy(nullptr);
}

TEST(CApi, BadTargetBadJsonUnknownTypeAndInvalidValues) {
  optfuse_engine* e = reinterpret_cast<optfuse_engine*>(0x1);
  EXPECT_EQ(C_CALL(optfuse_engine_create("not-a-target", 0, &e)), OPTFUSE_ERR_INVALID);
  EXPECT_EQ(e, nullptr);
  EXPECT_THAT(last_error(), HasSubstr("not-a-target"));

  CEngine ce;
  optfuse_optimizer* o = reinterpret_cast<optfuse_optimizer*>(0x1);
  EXPECT_EQ(C_CALL(optfuse_optimizer_create(ce.e, R"({"type": "adamw", "lr": )", &o)),
            OPTFUSE_ERR_INVALID);
  EXPECT_EQ(o, nullptr);
  EXPECT_THAT(last_error(), HasSubstr("not valid JSON"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_create(ce.e, R"({"type": "lbfgs"})", &o)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("unknown optimizer type 'lbfgs'"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_create(ce.e, R"({"type": "sgd", "lr": -0.1})", &o)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("Invalid learning rate: -0.1"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_create(ce.e, R"({"type": "adam", "momentum": 0.9})", &o)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("unknown option 'momentum'"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_create(ce.e, R"([1, 2])", &o)), OPTFUSE_ERR_INVALID);

  COptimizer co(ce.e, kConfig);
  Model m = two_groups(2);
  ASSERT_EQ(C_CALL(add_groups_c(co.o, m)), OPTFUSE_OK) << last_error();
  EXPECT_EQ(C_CALL(optfuse_optimizer_set_hyper(co.o, 0, "lr", -1.0)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("param group 0: Invalid learning rate"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_set_hyper(co.o, 5, "lr", 0.1)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("param group 5 does not exist"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_set_hyper(co.o, 0, "amsgrad", 1.0)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("amsgrad"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_set_option_json(co.o, 0, "betas", "[0.9, ")),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("not valid JSON"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_set_option_json(co.o, 1, "betas", "[1.5, 0.9]")),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("param group 1: Invalid beta parameter at index 0"));
  double v;
  EXPECT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 0, "betas", &v)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("betas"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 0, "momentum", &v)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("unknown option 'momentum'"));
  std::vector<float> short_grad(10);
  EXPECT_EQ(C_CALL(optfuse_optimizer_set_grad(co.o, 0, 0, short_grad.data(), 10)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("grad has 10 elements but param has 20"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_set_grad(co.o, 0, 0, nullptr, 20)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("null"));

  std::string missing = testing::temp_path("capi_missing");
  EXPECT_EQ(C_CALL(optfuse_optimizer_load(co.o, missing.c_str())), OPTFUSE_ERR_IO);
  EXPECT_THAT(last_error(), HasSubstr(missing));
  std::string unwritable = testing::temp_path("capi_no_dir") + "/state.bin";
  EXPECT_EQ(C_CALL(optfuse_optimizer_save(co.o, unwritable.c_str())), OPTFUSE_ERR_IO);
}

TEST(CApi, AddGroupShapeAndOverrideErrors) {
  CEngine ce;
  COptimizer co(ce.e, kConfig);
  Model m = two_groups(4);
  float* p[] = {m.groups[0][0].p.data()};
  float* g[] = {m.groups[0][0].g.data()};
  int64_t n[] = {20};
  int64_t bad_shape[] = {3, 7};
  const int64_t* shapes[] = {bad_shape};
  int ndims[] = {2};
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 1, p, g, n, shapes, nullptr, nullptr)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("both"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 1, p, g, n, shapes, ndims, nullptr)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("[3, 7] has 21 elements but numel is 20"));
  int negative[] = {-1};
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 1, p, g, n, shapes, negative, nullptr)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("ndims"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 1, p, g, n, nullptr, nullptr, "{\"lr\": ")),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("overrides"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 1, p, g, n, nullptr, nullptr,
                                               R"({"weight_decay": -1})")),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("param group 0: Invalid weight_decay value: -1"));
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 0, nullptr, nullptr, nullptr, nullptr, nullptr,
                                               nullptr)),
            OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("empty parameter list"));
  // None of that added a group: the first valid one is group 0.
  EXPECT_EQ(C_CALL(optfuse_optimizer_add_group(co.o, 1, p, g, n, nullptr, nullptr, "")), OPTFUSE_OK)
      << last_error();
  double v;
  EXPECT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 0, "weight_decay", &v)), OPTFUSE_OK);
  EXPECT_EQ(C_CALL(optfuse_optimizer_get_hyper(co.o, 1, "weight_decay", &v)), OPTFUSE_ERR_INVALID);
}

// A failed call changes nothing: after a run of rejected calls the optimizer steps exactly like
// one that never saw them.
TEST(CApi, FailedCallsChangeNothing) {
  CEngine ce;
  COptimizer victim(ce.e, kConfig), control(ce.e, kConfig);
  Model vm = two_groups(6), cm = two_groups(6);
  ASSERT_EQ(add_groups_c(victim.o, vm), OPTFUSE_OK);
  ASSERT_EQ(add_groups_c(control.o, cm), OPTFUSE_OK);
  vm.fill_grads(1);
  cm.fill_grads(1);
  ASSERT_EQ(optfuse_optimizer_step(victim.o), OPTFUSE_OK);
  ASSERT_EQ(optfuse_optimizer_step(control.o), OPTFUSE_OK);

  float* p[] = {vm.groups[1][0].p.data()};  // already in group 1
  float* g[] = {vm.groups[1][0].g.data()};
  int64_t n[] = {33};
  EXPECT_NE(optfuse_optimizer_add_group(victim.o, 1, p, g, n, nullptr, nullptr, nullptr),
            OPTFUSE_OK);
  EXPECT_NE(optfuse_optimizer_set_hyper(victim.o, 0, "lr", -3.0), OPTFUSE_OK);
  EXPECT_NE(optfuse_optimizer_set_option_json(victim.o, 1, "amsgrad", "1"), OPTFUSE_OK);
  EXPECT_NE(optfuse_optimizer_set_grad(victim.o, 0, 1, vm.groups[0][0].p.data(), 3), OPTFUSE_OK);
  std::string missing = testing::temp_path("capi_none");
  EXPECT_NE(optfuse_optimizer_load(victim.o, missing.c_str()), OPTFUSE_OK);

  for (int t = 2; t <= 3; ++t) {
    vm.fill_grads(t);
    cm.fill_grads(t);
    ASSERT_EQ(optfuse_optimizer_step(victim.o), OPTFUSE_OK);
    ASSERT_EQ(optfuse_optimizer_step(control.o), OPTFUSE_OK);
    ASSERT_TRUE(same_params(vm, cm)) << "step " << t;
  }
}

// A second engine over the same cache directory reads the kernel instead of compiling it.
TEST(CApi, CachedEngineReadsKernelsFromDisk) {
  std::string dir = testing::temp_path("capi_cache");
  auto run_once = [&](optfuse_counters* c) {
    optfuse_engine* e = nullptr;
    ASSERT_EQ(C_CALL(optfuse_engine_create_cached("host", 0, dir.c_str(), &e)), OPTFUSE_OK)
        << last_error();
    {
      COptimizer o(e, kConfig);
      Model m = two_groups(5);
      ASSERT_EQ(add_groups_c(o.o, m), OPTFUSE_OK) << last_error();
      ASSERT_EQ(C_CALL(optfuse_optimizer_step(o.o)), OPTFUSE_OK) << last_error();
    }
    ASSERT_EQ(C_CALL(optfuse_engine_counters(e, c)), OPTFUSE_OK);
    optfuse_engine_destroy(e);
  };
  optfuse_counters cold{}, warm{};
  run_once(&cold);
  run_once(&warm);
  EXPECT_EQ(cold.compiles, 1);
  EXPECT_EQ(cold.disk_hits, 0);
  EXPECT_EQ(warm.compiles, 0);
  EXPECT_GE(warm.disk_hits, 1);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);

  optfuse_engine* e = nullptr;
  EXPECT_EQ(C_CALL(optfuse_engine_create_cached("host", -1, nullptr, &e)), OPTFUSE_ERR_INVALID);
  EXPECT_THAT(last_error(), HasSubstr("num_threads must be >= 0"));
  EXPECT_EQ(e, nullptr);
}

TEST(CApi, LastErrorIsPerThread) {
  CEngine ce;
  optfuse_optimizer* o = nullptr;
  ASSERT_EQ(optfuse_optimizer_create(ce.e, R"({"type": "lbfgs"})", &o), OPTFUSE_ERR_INVALID);
  std::string mine = last_error();
  ASSERT_THAT(mine, HasSubstr("lbfgs"));
  std::string theirs;
  std::thread([&] {
    optfuse_optimizer* other = nullptr;
    EXPECT_EQ(optfuse_optimizer_create(ce.e, R"({"type": "sgd", "lr": -5.0})", &other),
              OPTFUSE_ERR_INVALID);
    theirs = last_error();
  }).join();
  EXPECT_THAT(theirs, HasSubstr("Invalid learning rate"));
  EXPECT_EQ(last_error(), mine) << "another thread's error overwrote this thread's message";
}

// A state file far larger than the optimizer's params can fill is an I/O error naming its size,
// found before anything is read (before: "out of memory", after trying to allocate it all).
TEST(CApi, LoadingATerabyteStateFileIsAnIoError) {
  CEngine ce;
  COptimizer co(ce.e, kConfig);
  Model m = two_groups(3);
  ASSERT_EQ(add_groups_c(co.o, m), OPTFUSE_OK) << last_error();
  std::string path = (std::filesystem::temp_directory_path() /
                      ("optfuse-capi-terabyte-" + std::to_string(::getpid())))
                         .string();
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  std::filesystem::resize_file(path, uint64_t{1} << 40);
  EXPECT_EQ(C_CALL(optfuse_optimizer_load(co.o, path.c_str())), OPTFUSE_ERR_IO);
  EXPECT_THAT(last_error(), HasSubstr("1099511627776 bytes"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace optfuse
