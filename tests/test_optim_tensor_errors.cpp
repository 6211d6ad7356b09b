// User errors in the groups and tensors given to the Optimizer API: each rejected call throws
// optfuse::Error (never an internal error) that names the group ("param group 1") and tensor
// ("tensor 0 ('w')") at fault. And a rejected call changes nothing: params, grads, options, step
// counts and every state buffer stay byte-identical, and the next step() matches an optimizer
// that never saw the bad call. (Errors in the options: test_optim_errors.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "support/hand_groups.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using ::testing::AllOf;
using testing::Buf;
using testing::error_of;
using ::testing::HasSubstr;
using testing::make_optimizer;
using testing::Model;
using ::testing::StartsWith;
using testing::with_one_group;

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- groups and tensors --------------------------------------------------------------------

TEST(OptimizerErrors, EmptyGroupNamesTheGroup) {
  auto opt = make_optimizer({{"type", "adamw"}});
  EXPECT_THAT(
      error_of([&] { opt->add_param_group({}); }),
      AllOf(StartsWith("param group 0"), HasSubstr("optimizer got an empty parameter list")));
  Buf a(3);
  opt->add_param_group({a.ref()});
  EXPECT_THAT(error_of([&] { opt->add_param_group({}); }),
              AllOf(StartsWith("param group 1"), HasSubstr("empty parameter list")));
}

TEST(OptimizerErrors, TensorInTwoGroupsNamesBothPlaces) {
  Buf a(8), b(8), c(8);
  auto opt = make_optimizer({{"type", "adamw"}});
  opt->add_param_group({a.ref("a"), b.ref("b")});
  ParamRef again = b.ref("b_again");
  std::vector<float> other_grad(8);
  again.grad.data = other_grad.data();  // a different grad does not make it a different param
  std::string e = error_of([&] { opt->add_param_group({c.ref("c"), again}); });
  EXPECT_THAT(e, AllOf(HasSubstr("some parameters appear in more than one parameter group"),
                       HasSubstr("param group 0, tensor 1 ('b')"),
                       HasSubstr("param group 1, tensor 1 ('b_again')")));
  // Twice in the same (new) group.
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({c.ref("c1"), c.ref("c2")});
              }),
              AllOf(HasSubstr("same param"), HasSubstr("('c1')"), HasSubstr("('c2')")));
  EXPECT_EQ(opt->num_groups(), 1u);
}

TEST(OptimizerErrors, GradAliasingItsOwnOrAnotherParam) {
  Buf a(8), b(8);
  auto opt = make_optimizer({{"type", "sgd"}});
  ParamRef self = b.ref("self");
  self.grad.data = b.p.data();
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({a.ref("a"), self});
              }),
              AllOf(HasSubstr("overlaps"), HasSubstr("param group 0, tensor 1 ('self')")));
  ParamRef partial = b.ref("partial");
  partial.grad.data = a.p.data() + 4;  // overlaps the last half of a's param
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({a.ref("a"), partial});
              }),
              AllOf(HasSubstr("overlaps"), HasSubstr("('partial')"), HasSubstr("('a')")));
  // Grads may share memory with each other (they are only read).
  ParamRef shared = b.ref("shared");
  shared.grad.data = a.g.data();
  EXPECT_NO_THROW(opt->add_param_group({a.ref("a"), shared}));
}

TEST(OptimizerErrors, OverlappingParams) {
  std::vector<float> storage(150, 1.0f), g1(100), g2(100);
  ParamRef x{{storage.data(), 100, {}}, {g1.data(), 100, {}}, "x"};
  ParamRef y{{storage.data() + 50, 100, {}}, {g2.data(), 100, {}}, "y"};
  auto opt = make_optimizer({{"type", "adam"}});
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({x, y});
              }),
              AllOf(HasSubstr("param memory overlaps the param of"), HasSubstr("('x')"),
                    HasSubstr("('y')")));
  // Across groups too, and adjacent (non-overlapping) params are fine.
  ParamRef left{{storage.data(), 50, {}}, {g1.data(), 50, {}}, "left"};
  ParamRef right{{storage.data() + 50, 100, {}}, {g2.data(), 100, {}}, "right"};
  opt->add_param_group({left});
  EXPECT_NO_THROW(opt->add_param_group({right}));
  EXPECT_THAT(error_of([&] { opt->add_param_group({y}); }),
              AllOf(HasSubstr("param group 2, tensor 0 ('y')"), HasSubstr("param group 1")));
}

TEST(OptimizerErrors, NullPointersNumelAndShape) {
  auto opt = make_optimizer({{"type", "adamw"}});
  Buf a(6), b(6);
  ParamRef r = b.ref("w");
  r.param.data = nullptr;
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({a.ref(), r});
              }),
              HasSubstr("param group 0, tensor 1 ('w'): param pointer is null"));
  r = b.ref("w");
  r.grad.data = nullptr;
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({a.ref(), r});
              }),
              HasSubstr("param group 0, tensor 1 ('w'): grad pointer is null"));
  r = b.ref("w");
  r.grad.numel = 5;
  EXPECT_THAT(error_of([&] { opt->add_param_group({r}); }),
              AllOf(HasSubstr("tensor 0 ('w')"), HasSubstr("grad has 5 elements but param has 6")));
  r = b.ref("w");
  r.param.numel = 0;
  r.grad.numel = 0;
  EXPECT_THAT(error_of([&] { opt->add_param_group({r}); }),
              AllOf(HasSubstr("tensor 0 ('w')"), HasSubstr("0 elements")));
  r = b.ref("w");
  r.param.shape = {2, 4};
  EXPECT_THAT(error_of([&] { opt->add_param_group({r}); }),
              AllOf(HasSubstr("tensor 0 ('w')"), HasSubstr("[2, 4]"), HasSubstr("8 elements"),
                    HasSubstr("numel is 6")));
  r = b.ref("w");
  r.grad.shape = {-2, -3};
  EXPECT_THAT(error_of([&] { opt->add_param_group({r}); }),
              AllOf(HasSubstr("tensor 0 ('w')"), HasSubstr("negative")));
  r = b.ref("w");
  r.param.shape = {2, 3};
  r.grad.shape = {2, 3};
  EXPECT_NO_THROW(opt->add_param_group({r}));
}

TEST(OptimizerErrors, MissingGroupOrTensor) {
  Buf a(6), b(5);
  auto opt = with_one_group("adamw", &a);
  EXPECT_THAT(error_of([&] { opt->set(1, "lr", 0.1); }),
              HasSubstr("param group 1 does not exist (there are 1)"));
  EXPECT_THAT(error_of([&] { opt->get(4, "lr"); }), HasSubstr("param group 4 does not exist"));
  EXPECT_THAT(error_of([&] { opt->group_options(2); }), HasSubstr("param group 2 does not exist"));
  EXPECT_THAT(error_of([&] {
                opt->set_grad(3, 0, {b.g.data(), 5, {}});
              }),
              HasSubstr("param group 3 does not exist"));
  EXPECT_THAT(error_of([&] {
                opt->set_grad(0, 7, {a.g.data(), 6, {}});
              }),
              AllOf(StartsWith("param group 0"), HasSubstr("tensor 7 does not exist")));
}

// set_grad checks a new gradient against every param through an index sorted by address (it
// runs for every tensor at every step when gradients are reallocated). Oracle: a brute-force
// interval test. Six params of 4 floats with gaps of 2 in one buffer, in two groups; a 4-float
// gradient at every offset must be rejected exactly when it touches a param, naming one it
// touches, and gradients may overlap each other.
TEST(OptimizerErrors, SetGradOverlapMatchesABruteForceCheckAtEveryOffset) {
  std::vector<float> arena(40, 0.5f), grads(24, 0.0f);
  const size_t kParams = 6, kLen = 4, kStride = 6;
  auto ref = [&](size_t i) {
    return ParamRef{{arena.data() + i * kStride, int64_t(kLen), {}},
                    {grads.data() + i * kLen, int64_t(kLen), {}},
                    "p" + std::to_string(i)};
  };
  auto opt = Optimizer::create(testing::shared_engine(), {{"type", "sgd"}});
  opt->add_param_group({ref(0), ref(1), ref(2), ref(3)});
  opt->add_param_group({ref(4), ref(5)});
  for (size_t begin = 0; begin + kLen <= arena.size(); ++begin) {
    std::vector<::testing::Matcher<std::string>> touched;  // "... the param of <one of these>"
    for (size_t i = 0; i < kParams; ++i)
      if (begin < i * kStride + kLen && i * kStride < begin + kLen)
        touched.push_back(::testing::EndsWith("param group " + std::to_string(i < 4 ? 0 : 1) +
                                              ", tensor " + std::to_string(i < 4 ? i : i - 4) +
                                              " ('p" + std::to_string(i) + "')"));
    std::string error;
    try {
      opt->set_grad(0, 1, {arena.data() + begin, int64_t(kLen), {}});
    } catch (const Error& e) {
      error = e.what();
    }
    SCOPED_TRACE("gradient at arena offset " + std::to_string(begin) + ": " + error);
    EXPECT_EQ(!error.empty(), !touched.empty());
    if (error.empty()) continue;
    EXPECT_THAT(
        error,
        AllOf(StartsWith("param group 0, tensor 1 ('p1'): grad memory overlaps the param of"),
              ::testing::AnyOfArray(touched)));
  }
  // Gradients may share memory (they are only read): tensor 2's grad over tensor 1's.
  EXPECT_NO_THROW(opt->set_grad(0, 2, {grads.data() + 4, int64_t(kLen), {}}));
  EXPECT_NO_THROW(opt->set_grad(1, 0, {grads.data() + 5, int64_t(kLen), {}}));
}

TEST(OptimizerErrors, SetGradMismatchNullAndOverlap) {
  Buf a(6), b(5), c(6);
  auto opt = with_one_group("adamw", &a);  // tensor 0 is named 'first'
  opt->add_param_group({c.ref("second")});
  EXPECT_THAT(error_of([&] {
                opt->set_grad(0, 0, {b.g.data(), 5, {}});
              }),
              AllOf(HasSubstr("param group 0, tensor 0 ('first')"),
                    HasSubstr("grad has 5 elements but param has 6")));
  EXPECT_THAT(error_of([&] {
                opt->set_grad(0, 0, {nullptr, 6, {}});
              }),
              AllOf(HasSubstr("param group 0, tensor 0 ('first')"), HasSubstr("null")));
  EXPECT_THAT(error_of([&] {
                opt->set_grad(0, 0, {c.p.data(), 6, {}});
              }),
              AllOf(HasSubstr("('first')"), HasSubstr("('second')"), HasSubstr("overlaps")));
  EXPECT_THAT(error_of([&] {
                opt->set_grad(1, 0, {c.p.data() + 1, 5, {}});
              }),
              HasSubstr("param group 1, tensor 0 ('second')"));
  EXPECT_THAT(error_of([&] { opt->set_grad(0, 0, {b.g.data(), 6, {2, 2}}); }), HasSubstr("[2, 2]"));
  std::vector<float> fine(6, 1.f);
  EXPECT_NO_THROW(opt->set_grad(0, 0, {fine.data(), 6, {}}));
}

// ---- a rejected call changes nothing -------------------------------------------------------

struct BadCall {
  std::string what;
  std::function<void(Optimizer&, Model&)> call;
};

class RejectedCallsChangeNothing : public ::testing::TestWithParam<std::string> {
 protected:
  Options config() const {
    const std::string& type = GetParam();
    if (type == "sgd")
      return {{"type", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}};
    if (type == "adam")
      return {{"type", "adam"}, {"lr", 0.01}, {"amsgrad", true}, {"weight_decay", 0.01}};
    return {{"type", "adamw"}, {"lr", 0.01}, {"weight_decay", 0.1}};
  }
};

TEST_P(RejectedCallsChangeNothing, ThenStepsLikeAnOptimizerThatNeverSawThem) {
  Model model = Model::make({{5, 40, 1}, {17, 3}}, 11);
  Model twin = model;                       // same values, different buffers
  Model extra = Model::make({{9, 9}}, 99);  // for rejected new groups
  auto victim = Optimizer::create(testing::shared_engine(), config());
  auto control = Optimizer::create(testing::shared_engine(), config());
  for (size_t g = 0; g < 2; ++g) {
    victim->add_param_group(model.refs(g), {{"lr", 0.01 * double(g + 1)}});
    control->add_param_group(twin.refs(g), {{"lr", 0.01 * double(g + 1)}});
  }
  for (int step = 1; step <= 3; ++step) {
    model.fill_grads(step);
    twin.fill_grads(step);
    victim->step();
    control->step();
  }
  // A state file from another optimizer type, for a rejected load.
  std::string wrong_type = testing::temp_path("wrong_type");
  {
    Model m = Model::make({{5, 40, 1}, {17, 3}}, 11);
    auto other = Optimizer::create(testing::shared_engine(),
                                   {{"type", GetParam() == "sgd" ? "adam" : "sgd"}});
    other->add_param_group(m.refs(0));
    other->add_param_group(m.refs(1));
    other->step();
    other->save_state(wrong_type);
  }
  std::string good = testing::temp_path("good");
  victim->save_state(good);
  std::string truncated = testing::temp_path("truncated"), flipped = testing::temp_path("flipped");
  {
    std::ifstream in(good, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    bytes[bytes.size() / 3] ^= 0x10;
    std::ofstream(flipped, std::ios::binary) << bytes;
  }

  float* victim_param = model.groups[0][1].p.data();
  const std::vector<BadCall> calls = {
      {"empty group", [](Optimizer& o, Model&) { o.add_param_group({}); }},
      {"group with invalid lr",
       [&](Optimizer& o, Model&) {
         o.add_param_group(extra.refs(0), {{"lr", -1.0}});
       }},
      {"group with unknown option",
       [&](Optimizer& o, Model&) {
         o.add_param_group(extra.refs(0), {{"bogus", 1}});
       }},
      {"group whose second tensor has a null param",
       [&](Optimizer& o, Model&) {
         auto refs = extra.refs(0);
         refs[1].param.data = nullptr;
         o.add_param_group(refs);
       }},
      {"group repeating an existing param",
       [&](Optimizer& o, Model& m) {
         auto refs = extra.refs(0);
         refs.push_back(m.refs(1)[0]);
         o.add_param_group(refs);
       }},
      {"group whose grad overlaps an existing param",
       [&](Optimizer& o, Model&) {
         auto refs = extra.refs(0);
         refs[0].grad.data = victim_param + 2;
         o.add_param_group(refs);
       }},
      {"set negative lr", [](Optimizer& o, Model&) { o.set(0, "lr", -1.0); }},
      {"set NaN lr", [](Optimizer& o, Model&) { o.set(1, "lr", kNaN); }},
      {"set negative weight_decay", [](Optimizer& o, Model&) { o.set(1, "weight_decay", -0.1); }},
      {"set on a missing group", [](Optimizer& o, Model&) { o.set(2, "lr", 0.1); }},
      {"set unknown option", [](Optimizer& o, Model&) { o.set(0, "bogus", 0.1); }},
      {"set wrong kind", [](Optimizer& o, Model&) { o.set(0, "lr", "fast"); }},
      {"set invalid structural option",
       [&](Optimizer& o, Model&) {
         if (GetParam() == "sgd")
           o.set(0, "dampening", 0.5);  // Nesterov needs zero dampening
         else
           o.set(0, "betas", Options::array({1.0, 0.9}));
       }},
      {"set_grad with wrong numel",
       [](Optimizer& o, Model& m) {
         o.set_grad(0, 0, {m.groups[1][0].g.data(), 4, {}});
       }},
      {"set_grad null",
       [](Optimizer& o, Model&) {
         o.set_grad(0, 1, {nullptr, 40, {}});
       }},
      {"set_grad onto a param",
       [](Optimizer& o, Model& m) {
         o.set_grad(1, 1, {m.groups[0][0].p.data(), 3, {}});
       }},
      {"set_grad missing tensor",
       [](Optimizer& o, Model& m) {
         o.set_grad(1, 5, {m.groups[1][0].g.data(), 17, {}});
       }},
      {"load truncated file", [&](Optimizer& o, Model&) { o.load_state(truncated); }},
      {"load flipped file", [&](Optimizer& o, Model&) { o.load_state(flipped); }},
      {"load file of another optimizer", [&](Optimizer& o, Model&) { o.load_state(wrong_type); }},
      {"load missing file",
       [&](Optimizer& o, Model&) { o.load_state(testing::temp_path("does_not_exist")); }},
  };

  auto all_buffers = [&] {
    auto b = model.buffers();
    for (auto* x : extra.buffers()) b.push_back(x);
    return b;
  };
  for (const BadCall& bad : calls) {
    SCOPED_TRACE(bad.what);
    testing::Snapshot before = testing::snapshot(*victim, all_buffers());
    error_of([&] { bad.call(*victim, model); });
    testing::Snapshot after = testing::snapshot(*victim, all_buffers());
    EXPECT_TRUE(before == after) << bad.what << " changed: " << before.diff(after);
  }
  EXPECT_EQ(victim->num_groups(), 2u);

  std::vector<float> extra_before[2] = {extra.groups[0][0].p, extra.groups[0][1].p};
  for (int step = 4; step <= 5; ++step) {
    model.fill_grads(step);
    twin.fill_grads(step);
    victim->step();
    control->step();
    testing::Snapshot v = testing::snapshot(*victim, model.buffers());
    testing::Snapshot c = testing::snapshot(*control, twin.buffers());
    ASSERT_TRUE(v == c) << "step " << step << ": " << c.diff(v);
  }
  EXPECT_TRUE(testing::same_bits(extra.groups[0][0].p, extra_before[0]) &&
              testing::same_bits(extra.groups[0][1].p, extra_before[1]))
      << "a rejected group's tensors were stepped";
  for (const auto& path : {wrong_type, good, truncated, flipped}) std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Types, RejectedCallsChangeNothing,
                         ::testing::Values("sgd", "adam", "adamw"));

}  // namespace
}  // namespace optfuse
