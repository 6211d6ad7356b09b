// "state_dtype": "int8" through Optimizer::step (src/optim/block_state.h, docs/int8-state.md):
// which tensors get 8-bit state, each step against a reference, the last partial block, save and
// load, conversions between state dtypes and block sizes, and the refusals.
//
// Oracle: one AdamW step computed here in double from the state the optimizer holds before it
// (codes and scales decoded with the maps as docs/int8-state.md writes them), then encoded
// again per block. Each step is checked from the optimizer's own previous state, so a code that
// rounds the other way at one step does not carry over to the next. Tolerances:
//   * codes within one: the kernel computes in f32 and may land on the other side of a code
//     boundary; such codes must be rarer than 1e-3 (they need the scaled value within ~1e-5 of a
//     boundary, about 2e-5 of the codes);
//   * scales (block maxima of the new moments) within 2^-20 relative: the kernel's moments round
//     a few times in f32 after decoding, each within 2^-24;
//   * params within 1e-6 relative + 1e-9: the f32 update of a decoded state, whose decoded v is
//     computed in f32 from (code, scale) (a few roundings); AdamW's step lr * m / sqrt(v) is
//     1e-3 of a param of size ~1, so 1e-6 relative of the param is 1e-3 of the step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "optim/options.h"
#include "optim/precision.h"
#include "optim/rule.h"
#include "support/engine.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using testing::gen_floats;
using testing::Model;

enum class Map { kLinear, kSqrt };

double decode(uint8_t code, double absmax, Map map) {
  if (map == Map::kLinear) return (code - 127.0) * absmax / 127.0;
  const double t = code * std::sqrt(absmax) / 255.0;
  return t * t;
}

uint8_t encode(double x, double absmax, Map map) {
  if (absmax == 0) return map == Map::kLinear ? 127 : 0;
  if (map == Map::kLinear) return static_cast<uint8_t>(127.0 * x / absmax + 127.5);
  return static_cast<uint8_t>(255.0 * std::sqrt(x / absmax) + 0.5);
}

// One tensor's 8-bit state as the optimizer holds it.
struct Held {
  std::vector<uint8_t> codes;
  std::vector<float> absmax;
};

Held held(const Optimizer& opt, size_t group, size_t index, const std::string& name) {
  const TensorRef c = opt.state_ref(group, index, name);
  const TensorRef s = opt.state_ref(group, index, name + ".absmax");
  if (!c.data || !s.data) return {};  // (before the first step)
  EXPECT_EQ(c.dtype, DType::U8) << name;
  EXPECT_EQ(s.dtype, DType::F32) << name << ".absmax";
  const auto* cp = static_cast<const uint8_t*>(c.data);
  const auto* sp = static_cast<const float*>(s.data);
  return {{cp, cp + c.numel}, {sp, sp + s.numel}};
}

std::vector<double> decoded(const Held& h, int64_t block, Map map) {
  std::vector<double> x(h.codes.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = decode(h.codes[i], h.absmax[i / block], map);
  return x;
}

// Checks `got` against `want` encoded per block of `block` (see the top of this file).
void expect_encoded(const Held& got, const std::vector<double>& want, int64_t block, Map map,
                    const std::string& what) {
  const size_t blocks = (want.size() + block - 1) / block;
  ASSERT_EQ(got.codes.size(), want.size()) << what;
  ASSERT_EQ(got.absmax.size(), blocks) << what;
  size_t off_by_one = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t begin = b * block, end = std::min(want.size(), begin + block);
    double m = 0;
    for (size_t i = begin; i < end; ++i) m = std::max(m, std::fabs(want[i]));
    ASSERT_NEAR(got.absmax[b], m, std::ldexp(m, -20)) << what << " block " << b;
    for (size_t i = begin; i < end; ++i) {
      const int d = int(got.codes[i]) - int(encode(want[i], got.absmax[b], map));
      ASSERT_LE(std::abs(d), 1) << what << " element " << i;
      off_by_one += d != 0;
    }
  }
  EXPECT_LE(off_by_one, want.size() / 1000 + 1) << what;
}

constexpr double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWd = 1e-2;

Options int8_config(int64_t block = 256, int64_t min_size = 4096) {
  return {{"type", "adamw"},       {"lr", kLr},           {"weight_decay", kWd},
          {"state_dtype", "int8"}, {"block_size", block}, {"min_8bit_size", min_size}};
}

// One AdamW step of tensor (group 0, index) from the optimizer's state before it, checked after.
struct StepCheck {
  std::vector<double> p, m, v;
  int64_t step = 0;
};

StepCheck expect_before(const Optimizer& opt, size_t index, const std::vector<float>& param,
                        const std::vector<float>& grad, int64_t block) {
  StepCheck c;
  c.step = opt.step_count(0, index) + 1;
  const Held m = held(opt, 0, index, "exp_avg"), v = held(opt, 0, index, "exp_avg_sq");
  const size_t n = param.size();
  std::vector<double> m0 =
      m.codes.empty() ? std::vector<double>(n, 0.0) : decoded(m, block, Map::kLinear);
  std::vector<double> v0 =
      v.codes.empty() ? std::vector<double>(n, 0.0) : decoded(v, block, Map::kSqrt);
  const double bc1 = 1 - std::pow(kBeta1, c.step), bc2 = 1 - std::pow(kBeta2, c.step);
  for (size_t i = 0; i < n; ++i) {
    const double g = grad[i];
    const double mi = kBeta1 * m0[i] + (1 - kBeta1) * g;
    const double vi = kBeta2 * v0[i] + (1 - kBeta2) * g * g;
    const double denom = std::sqrt(vi) / std::sqrt(bc2) + kEps;
    c.p.push_back(param[i] * (1 - kLr * kWd) - kLr / bc1 * mi / denom);
    c.m.push_back(mi);
    c.v.push_back(vi);
  }
  return c;
}

void expect_after(const Optimizer& opt, size_t index, const std::vector<float>& param,
                  const StepCheck& c, int64_t block, const std::string& what) {
  expect_encoded(held(opt, 0, index, "exp_avg"), c.m, block, Map::kLinear, what + " exp_avg");
  expect_encoded(held(opt, 0, index, "exp_avg_sq"), c.v, block, Map::kSqrt, what + " exp_avg_sq");
  for (size_t i = 0; i < param.size(); ++i)
    ASSERT_NEAR(param[i], c.p[i], 1e-6 * std::fabs(c.p[i]) + 1e-9) << what << " param " << i;
}

TEST(OptimInt8, EachStepMatchesTheReferenceFromTheHeldState) {
  // 10000 = 39 blocks of 256 and a last block of 16; 8192 = whole blocks; 1000 < min_8bit_size.
  Model model = Model::make({{10000, 8192, 1000}}, 3);
  auto opt = Optimizer::create(testing::shared_engine(), int8_config());
  opt->add_param_group(model.refs(0));
  for (int step = 1; step <= 4; ++step) {
    model.fill_grads(step);
    std::vector<StepCheck> checks;
    for (size_t i = 0; i < 2; ++i)
      checks.push_back(expect_before(*opt, i, model.groups[0][i].p, model.groups[0][i].g, 256));
    opt->step();
    for (size_t i = 0; i < 2; ++i)
      expect_after(*opt, i, model.groups[0][i].p, checks[i], 256,
                   "step " + std::to_string(step) + " tensor " + std::to_string(i));
  }
  // The small tensor keeps f32 state; 8-bit tensors have no f32 copy.
  EXPECT_NE(opt->state(0, 2, "exp_avg"), nullptr);
  EXPECT_EQ(opt->state_ref(0, 2, "exp_avg.absmax").data, nullptr);
  EXPECT_EQ(opt->state(0, 0, "exp_avg"), nullptr);
  EXPECT_EQ(opt->state_ref(0, 0, "exp_avg.absmax").numel, 40);
}

TEST(OptimInt8, LargeTensorsRunAsSlicesOfWholeBlocks) {
  // Large enough to be cut into slices on the worker threads (step_round.cpp): each slice must
  // start at a block, with its scales moved by blocks, not elements.
  Model model = Model::make({{(size_t(1) << 20) + 80}}, 7);
  auto opt = Optimizer::create(testing::shared_engine(), int8_config());
  opt->add_param_group(model.refs(0));
  for (int step = 1; step <= 2; ++step) {
    model.fill_grads(step);
    const StepCheck c = expect_before(*opt, 0, model.groups[0][0].p, model.groups[0][0].g, 256);
    opt->step();
    expect_after(*opt, 0, model.groups[0][0].p, c, 256, "step " + std::to_string(step));
  }
}

TEST(OptimInt8, BlockSizeAndMinimumSizeAreHonoured) {
  // A tensor shorter than one block is its own last block; min_8bit_size 0 quantizes it.
  Model model = Model::make({{100, 5000}}, 5);
  auto opt = Optimizer::create(testing::shared_engine(), int8_config(128, 0));
  opt->add_param_group(model.refs(0));
  model.fill_grads(1);
  std::vector<StepCheck> checks;
  for (size_t i = 0; i < 2; ++i)
    checks.push_back(expect_before(*opt, i, model.groups[0][i].p, model.groups[0][i].g, 128));
  opt->step();
  for (size_t i = 0; i < 2; ++i)
    expect_after(*opt, i, model.groups[0][i].p, checks[i], 128, "tensor " + std::to_string(i));
  EXPECT_EQ(opt->state_ref(0, 0, "exp_avg.absmax").numel, 1);
  EXPECT_EQ(opt->state_ref(0, 1, "exp_avg.absmax").numel, 40);  // ceil(5000 / 128)
  // Bytes: param read and write, grad read, two moments' codes read and written, their scales.
  EXPECT_EQ(opt->bytes_per_step(), (100 + 5000) * (12 + 4) + 2 * 2 * 4 * (1 + 40));
}

// Everything a resumed run continues from: every state buffer, byte for byte, as one string
// (compared, never printed).
std::string state_bytes(const Optimizer& opt, size_t tensors) {
  std::string out;
  for (size_t i = 0; i < tensors; ++i)
    for (const char* name : {"exp_avg", "exp_avg_sq", "exp_avg.absmax", "exp_avg_sq.absmax"}) {
      const TensorRef r = opt.state_ref(0, i, name);
      out += std::string(name) + ":" + std::to_string(r.data ? r.numel : -1) + ":";
      if (r.data) out.append(static_cast<const char*>(r.data), r.numel * dtype_size(r.dtype));
    }
  return out;
}

TEST(OptimInt8, SaveAndLoadResumeBitIdentically) {
  // The bits must agree: both runs call the same kernels on the same bytes (the codes and scales
  // are the state; nothing is re-encoded at load).
  const std::string path =
      (std::filesystem::temp_directory_path() / "optfuse_int8_state.bin").string();
  Model a = Model::make({{10000, 1000}}, 9);
  auto opt_a = Optimizer::create(testing::shared_engine(), int8_config());
  opt_a->add_param_group(a.refs(0));
  for (int step = 1; step <= 3; ++step) {
    a.fill_grads(step);
    opt_a->step();
  }
  opt_a->save_state(path);
  Model b = a;
  auto opt_b = Optimizer::create(testing::shared_engine(), int8_config());
  opt_b->add_param_group(b.refs(0));
  opt_b->load_state(path);
  EXPECT_TRUE(state_bytes(*opt_a, 2) == state_bytes(*opt_b, 2));
  for (int step = 4; step <= 6; ++step) {
    a.fill_grads(step);
    b.fill_grads(step);
    opt_a->step();
    opt_b->step();
  }
  EXPECT_TRUE(state_bytes(*opt_a, 2) == state_bytes(*opt_b, 2));
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(0, std::memcmp(a.groups[0][i].p.data(), b.groups[0][i].p.data(),
                             a.groups[0][i].p.size() * sizeof(float)));
  std::filesystem::remove(path);
}

// exp_avg after one step from `m0`: AdamW's first moment.
std::vector<double> first_moment(const std::vector<double>& m0, const std::vector<float>& grad) {
  std::vector<double> m(m0.size());
  for (size_t i = 0; i < m.size(); ++i) m[i] = kBeta1 * m0[i] + (1 - kBeta1) * grad[i];
  return m;
}

TEST(OptimInt8, StateConvertsBetweenDtypesAndBlockSizes) {
  Model model = Model::make({{10000}}, 11);
  const std::vector<float>& grad = model.groups[0][0].g;
  auto opt = Optimizer::create(testing::shared_engine(), {{"type", "adamw"}});
  opt->add_param_group(model.refs(0));
  for (int step = 1; step <= 2; ++step) {
    model.fill_grads(step);
    opt->step();
  }
  // f32 -> int8 (at the next step): the held values encoded, then stepped and encoded again.
  // Each quantization loses at most half a code, 1/254 of its block's absmax.
  const std::vector<float>& m32 = *opt->state(0, 0, "exp_avg");
  std::vector<double> want = first_moment({m32.begin(), m32.end()}, (model.fill_grads(3), grad));
  opt->set(0, "state_dtype", "int8");
  opt->step();
  Held m = held(*opt, 0, 0, "exp_avg");
  ASSERT_EQ(m.absmax.size(), 40u);
  std::vector<double> got = decoded(m, 256, Map::kLinear);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 2 * m.absmax[i / 256] / 254 + 1e-9) << i;
  // state_values() decodes (in f32: within two roundings of the block's absmax).
  const std::vector<float> values = opt->state_values(0, 0, "exp_avg");
  ASSERT_EQ(values.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(values[i], got[i], std::ldexp(m.absmax[i / 256], -22)) << i;
  // int8 at another block size: decoded at 256, encoded at 64.
  want = first_moment(got, (model.fill_grads(4), grad));
  opt->set(0, "block_size", 64);
  opt->step();
  m = held(*opt, 0, 0, "exp_avg");
  ASSERT_EQ(m.absmax.size(), 157u);  // ceil(10000 / 64)
  got = decoded(m, 64, Map::kLinear);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 2 * m.absmax[i / 64] / 254 + 1e-9) << i;
  // int8 -> f32: the codes decoded (in f32 on the host: two roundings, each within 2^-24 of
  // the block's absmax), then one f32 step; the scales dropped.
  want = first_moment(got, (model.fill_grads(5), grad));
  opt->set(0, "state_dtype", "f32");
  opt->step();
  const std::vector<float>* back = opt->state(0, 0, "exp_avg");
  ASSERT_NE(back, nullptr);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR((*back)[i], want[i], 1e-6 * (m.absmax[i / 64] + std::fabs(want[i])) + 1e-12) << i;
  EXPECT_EQ(opt->state_ref(0, 0, "exp_avg.absmax").data, nullptr);
}

// Every rule whose update does not reduce, with each of its states in 8 bits: one step of the
// optimizer against the interpreter (double) on the same 8-bit graph, from the state the
// optimizer holds. Tolerances as at the top of this file, except for params: the rules' f32
// steps against double, within 4 ulps of the param plus 1e-6 of lr; Lion's sign(c) may flip
// where c rounds across 0, so up to 1e-3 of the params may differ by more.
struct RuleCase {
  const char* type;
  Options options;
};

class EveryRule : public ::testing::TestWithParam<RuleCase> {};

TEST_P(EveryRule, StepMatchesTheInterpreterOnTheHeldState) {
  const RuleCase& c = GetParam();
  const int64_t n = 64 * 256;
  Options config = c.options;
  config["type"] = c.type;
  config["state_dtype"] = "int8";
  config["min_8bit_size"] = 0;
  Model model = Model::make({{size_t(n)}}, 17);
  auto opt = Optimizer::create(testing::shared_engine(), config);
  opt->add_param_group(model.refs(0));
  auto rule = optim::make_rule(c.type);
  const Options h = optim::merge(optim::with_precision_defaults(rule->defaults()), c.options,
                                 c.type, "param group");
  optim::HostState host = rule->initial_host_state(h);
  std::map<std::string, double> scalars;
  for (int step = 1; step <= 3; ++step) {
    model.fill_grads(step);
    scalars.clear();
    rule->scalars(h, optim::TensorStep{step, step == 1, &host}, &scalars);
    if (step < 3) {
      opt->step();
      continue;
    }
    const Graph g = update_graph(config, {}, DType::F32, DType::F32, n);
    std::map<std::string, std::vector<double>> tensors;
    const std::vector<float>& p = model.groups[0][0].p;
    tensors["param"] = {p.begin(), p.end()};
    tensors["grad"] = {model.groups[0][0].g.begin(), model.groups[0][0].g.end()};
    std::vector<std::string> coded;
    for (const Node& node : g.nodes()) {
      if (node.op != Op::Input || (node.role != Role::State && node.role != Role::RowState))
        continue;
      const TensorRef r = opt->state_ref(0, 0, node.name);
      ASSERT_NE(r.data, nullptr) << c.type << ": " << node.name;
      ASSERT_EQ(r.dtype, node.dtype) << c.type << ": " << node.name;
      std::vector<double>& t = tensors[node.name];
      for (int64_t i = 0; i < r.numel; ++i)
        t.push_back(r.dtype == DType::U8 ? static_cast<const uint8_t*>(r.data)[i]
                                         : static_cast<const float*>(r.data)[i]);
      if (r.dtype == DType::U8) coded.push_back(node.name);
    }
    ASSERT_FALSE(coded.empty()) << c.type;
    std::map<std::string, double> used;
    for (const Node& node : g.nodes())
      if (node.op == Op::Scalar) used[node.name] = scalars.at(node.name);
    const auto want = interpret(g, tensors, used, 256);
    opt->step();
    for (const std::string& name : coded) {
      const Held got = held(*opt, 0, 0, name);
      const std::vector<double>& codes = want.at(name);
      const std::vector<double>& scales = want.at(name + ".absmax");
      size_t off_by_one = 0;
      for (size_t b = 0; b < scales.size(); ++b)
        ASSERT_NEAR(got.absmax[b], scales[b], std::ldexp(std::fabs(scales[b]), -20))
            << c.type << " " << name << " block " << b;
      for (int64_t i = 0; i < n; ++i) {
        const int d = int(got.codes[i]) - int(codes[i]);
        ASSERT_LE(std::abs(d), 1) << c.type << " " << name << " element " << i;
        off_by_one += d != 0;
      }
      EXPECT_LE(off_by_one, size_t(n) / 1000 + 1) << c.type << " " << name;
    }
    const double lr = h.at("lr").get<double>();
    size_t far = 0;
    for (int64_t i = 0; i < n; ++i)
      far += std::fabs(p[i] - want.at("param")[i]) >
             4 * std::ldexp(std::fabs(want.at("param")[i]), -24) + 1e-6 * lr;
    EXPECT_LE(far, size_t(n) / 1000) << c.type;
  }
}

INSTANTIATE_TEST_SUITE_P(
    OptimInt8, EveryRule,
    ::testing::Values(RuleCase{"sgd", {{"lr", 1e-2}, {"momentum", 0.9}}},
                      RuleCase{"sgd", {{"lr", 1e-2}, {"momentum", 0.9}, {"nesterov", true}}},
                      RuleCase{"adam", {{"lr", 1e-2}, {"amsgrad", true}}},
                      RuleCase{"adagrad", {{"lr", 1e-2}, {"initial_accumulator_value", 0.1}}},
                      RuleCase{"rmsprop", {{"lr", 1e-3}, {"momentum", 0.9}, {"centered", true}}},
                      RuleCase{"adamax", {{"lr", 1e-2}}}, RuleCase{"nadam", {{"lr", 1e-2}}},
                      RuleCase{"radam", {{"lr", 1e-2}}}, RuleCase{"lion", {{"lr", 1e-3}}},
                      RuleCase{"adadelta", {{"lr", 1.0}}},
                      RuleCase{"asgd", {{"lr", 1e-2}, {"t0", 1.0}}},
                      RuleCase{"rprop", {{"lr", 1e-2}}}),
    [](const ::testing::TestParamInfo<RuleCase>& info) {
      return std::string(info.param.type) + "_" + std::to_string(info.index);
    });

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string error_of(const std::function<void()>& f);

TEST(OptimInt8, CallerOwnedStateFollowsTheTensorsSpec) {
  // A framework that keeps the state (the Python package) binds the codes and the scales the
  // tensor's spec lists; after block_size changes, a step with the old buffers is refused.
  Model model = Model::make({{1000}}, 19);
  auto opt = Optimizer::create(testing::shared_engine(), int8_config(256, 0));
  opt->add_param_group(model.refs(0));
  std::map<std::string, std::vector<uint8_t>> codes;
  std::map<std::string, std::vector<float>> scales;
  for (const Optimizer::StateSpec& s : opt->state_spec(0, 0)) {
    if (s.dtype == DType::U8) {
      EXPECT_EQ(s.numel, 1000) << s.name;
      codes[s.name].assign(1000, static_cast<uint8_t>(s.initial));
      opt->bind_state(0, 0, s.name, {codes[s.name].data(), 1000, {}, DType::U8}, true);
    } else {
      EXPECT_EQ(s.numel, 4) << s.name;  // ceil(1000 / 256)
      EXPECT_EQ(s.initial, 0.0) << s.name;
      scales[s.name].assign(4, 0.0f);
      opt->bind_state(0, 0, s.name, {scales[s.name].data(), 4}, true);
    }
  }
  ASSERT_EQ(codes.size(), 2u);
  EXPECT_EQ(codes.at("exp_avg")[0], 127);  // zero in the signed linear map
  EXPECT_EQ(codes.at("exp_avg_sq")[0], 0);
  model.fill_grads(1);
  opt->step();
  EXPECT_GT(scales.at("exp_avg.absmax")[0], 0.0f);  // the kernel wrote the caller's buffers
  opt->set(0, "block_size", 128);
  const std::vector<float> before = model.groups[0][0].p;
  try {
    opt->step();
    FAIL() << "a step ran on scales of another block size";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bind new buffers"), std::string::npos) << e.what();
  }
  EXPECT_EQ(opt->step_count(0, 0), 1);
  EXPECT_EQ(model.groups[0][0].p, before);

  // Codes bound without their scales: refused before anything is made or installed.
  auto half = Optimizer::create(testing::shared_engine(), int8_config(256, 0));
  half->add_param_group(model.refs(0));
  half->bind_state(0, 0, "exp_avg", {codes.at("exp_avg").data(), 1000, {}, DType::U8}, true);
  const std::string why = error_of([&] { half->step(); });
  EXPECT_NE(why.find("bound as codes and scales together"), std::string::npos) << why;
  EXPECT_EQ(half->step_count(0, 0), 0);
  EXPECT_EQ(half->state_ref(0, 0, "exp_avg_sq").data, nullptr);
}

TEST(OptimInt8, RefusesWhatItCannotRun) {
  Model model = Model::make({{8192}}, 13);
  auto opt = Optimizer::create(testing::shared_engine(), {{"type", "adamw"}});
  opt->add_param_group(model.refs(0));
  EXPECT_NE(error_of([&] { opt->set(0, "block_size", 100); }).find("multiple of 16"),
            std::string::npos);
  EXPECT_NE(error_of([&] { opt->set(0, "block_size", 8192); }).find("[16, 4096]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { opt->set(0, "min_8bit_size", -1); }).find("non-negative integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { opt->set(0, "state_dtype", "int4"); }).find("\"int8\""),
            std::string::npos);
  auto lamb =
      Optimizer::create(testing::shared_engine(), {{"type", "lamb"}, {"state_dtype", "int8"}});
  lamb->add_param_group(model.refs(0));
  model.fill_grads(1);
  const std::string why = error_of([&] { lamb->step(); });
  EXPECT_NE(why.find("param group 0: state_dtype \"int8\" is not supported here"),
            std::string::npos)
      << why;
  auto gc = Optimizer::create(
      testing::shared_engine(),
      {{"type", "adamw"}, {"state_dtype", "int8"}, {"grad_centralization", true}});
  model.groups[0][0].shape = {64, 128};
  gc->add_param_group(model.refs(0));
  EXPECT_NE(error_of([&] { gc->step(); }).find("grad_centralization"), std::string::npos);
  // A refused step changed nothing.
  EXPECT_EQ(gc->step_count(0, 0), 0);
}

}  // namespace
}  // namespace optfuse
