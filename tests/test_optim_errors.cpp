// User errors of the Optimizer API: each rejected call throws optfuse::Error (never an internal
// error) whose message says what is at fault in torch's words where torch has them, and names the
// group ("param group 1") and tensor ("tensor 0 ('w')") at fault. And a rejected call changes
// nothing: params, grads, options, step counts and every state buffer stay byte-identical, and
// the next step() matches an optimizer that never saw the bad call.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "graph/json.h"
#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using ::testing::AllOf;
using testing::error_of;
using ::testing::HasSubstr;
using testing::Model;
using ::testing::StartsWith;

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

Engine& engine() { return testing::shared_engine(); }

// A small owned tensor for building groups by hand.
struct Buf {
  std::vector<float> p, g;
  explicit Buf(size_t n) : p(n, 0.5f), g(n, 0.25f) {}
  ParamRef ref(const std::string& name = "") {
    return {{p.data(), int64_t(p.size()), {}}, {g.data(), int64_t(g.size()), {}}, name};
  }
};

std::unique_ptr<Optimizer> make(const Options& config) {
  return Optimizer::create(engine(), config);
}

// An optimizer of `type` with one valid group (so the next group is "param group 1").
std::unique_ptr<Optimizer> with_one_group(const std::string& type, Buf* b) {
  auto opt = make({{"type", type}});
  opt->add_param_group({b->ref("first")});
  return opt;
}

// ---- optimizer type and options ------------------------------------------------------------

TEST(OptimizerErrors, UnknownOptimizerTypeListsTheKnownOnes) {
  std::string e = error_of([] { make({{"type", "lbfgs"}}); });
  EXPECT_THAT(
      e, AllOf(HasSubstr("unknown optimizer type 'lbfgs'"), HasSubstr("adam"), HasSubstr("adamw"),
               HasSubstr("sgd"), HasSubstr("rmsprop"), HasSubstr("nadam"), HasSubstr("lion")));
  EXPECT_THAT(error_of([] { make({{"lr", 0.1}}); }), HasSubstr("\"type\""));
  EXPECT_THAT(error_of([] { make({{"type", 3}}); }), HasSubstr("\"type\""));
  EXPECT_THAT(error_of([] { make(Options::array({1, 2})); }), HasSubstr("JSON object"));
}

TEST(OptimizerErrors, TypeNamesAreCaseInsensitiveTorchClassNames) {
  EXPECT_EQ(make({{"type", "AdamW"}})->type(), "adamw");
  EXPECT_EQ(make({{"type", "SGD"}})->type(), "sgd");
  EXPECT_EQ(make({{"type", "Adam"}})->type(), "adam");
  EXPECT_EQ(make({{"type", "Adagrad"}})->type(), "adagrad");
  EXPECT_EQ(make({{"type", "RMSprop"}})->type(), "rmsprop");
  EXPECT_EQ(make({{"type", "Adamax"}})->type(), "adamax");
  EXPECT_EQ(make({{"type", "NAdam"}})->type(), "nadam");
  EXPECT_EQ(make({{"type", "RAdam"}})->type(), "radam");
  EXPECT_EQ(make({{"type", "Lion"}})->type(), "lion");
  EXPECT_EQ(make({{"type", "Adadelta"}})->type(), "adadelta");
  EXPECT_EQ(make({{"type", "ASGD"}})->type(), "asgd");
  EXPECT_EQ(make({{"type", "Rprop"}})->type(), "rprop");
}

// torch's defaults, argument for argument (Lion: lion-pytorch's).
TEST(OptimizerErrors, NewOptimizersHaveTorchDefaults) {
  EXPECT_EQ(optimizer_defaults("adagrad"), Options({{"lr", 1e-2},
                                                    {"lr_decay", 0.0},
                                                    {"weight_decay", 0.0},
                                                    {"initial_accumulator_value", 0.0},
                                                    {"eps", 1e-10},
                                                    {"maximize", false}}));
  EXPECT_EQ(optimizer_defaults("rmsprop"), Options({{"lr", 1e-2},
                                                    {"alpha", 0.99},
                                                    {"eps", 1e-8},
                                                    {"weight_decay", 0.0},
                                                    {"momentum", 0.0},
                                                    {"centered", false},
                                                    {"maximize", false}}));
  EXPECT_EQ(optimizer_defaults("adamax"), Options({{"lr", 2e-3},
                                                   {"betas", {0.9, 0.999}},
                                                   {"eps", 1e-8},
                                                   {"weight_decay", 0.0},
                                                   {"maximize", false}}));
  EXPECT_EQ(optimizer_defaults("nadam"), Options({{"lr", 2e-3},
                                                  {"betas", {0.9, 0.999}},
                                                  {"eps", 1e-8},
                                                  {"weight_decay", 0.0},
                                                  {"momentum_decay", 4e-3},
                                                  {"decoupled_weight_decay", false},
                                                  {"maximize", false}}));
  EXPECT_EQ(optimizer_defaults("radam"), Options({{"lr", 1e-3},
                                                  {"betas", {0.9, 0.999}},
                                                  {"eps", 1e-8},
                                                  {"weight_decay", 0.0},
                                                  {"decoupled_weight_decay", false},
                                                  {"maximize", false}}));
  EXPECT_EQ(optimizer_defaults("lion"),
            Options({{"lr", 1e-4}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.0}}));
  EXPECT_EQ(
      optimizer_defaults("adadelta"),
      Options(
          {{"lr", 1.0}, {"rho", 0.9}, {"eps", 1e-6}, {"weight_decay", 0.0}, {"maximize", false}}));
  EXPECT_EQ(optimizer_defaults("asgd"), Options({{"lr", 1e-2},
                                                 {"lambd", 1e-4},
                                                 {"alpha", 0.75},
                                                 {"t0", 1e6},
                                                 {"weight_decay", 0.0},
                                                 {"maximize", false}}));
  EXPECT_EQ(
      optimizer_defaults("rprop"),
      Options(
          {{"lr", 1e-2}, {"etas", {0.5, 1.2}}, {"step_sizes", {1e-6, 50.0}}, {"maximize", false}}));
}

// torch's ValueError texts for each new optimizer, in torch's order of checks.
TEST(OptimizerErrors, NewOptimizersValidateAsTorchDoes) {
  struct Bad {
    const char* type;
    Options options;
    const char* message;
  };
  const std::vector<Bad> bad = {
      {"adagrad", {{"lr", -0.1}}, "Invalid learning rate: -0.1"},
      {"adagrad", {{"lr_decay", -0.5}}, "Invalid lr_decay value: -0.5"},
      {"adagrad", {{"weight_decay", -1.0}}, "Invalid weight_decay value: -1.0"},
      {"adagrad",
       {{"initial_accumulator_value", -0.1}},
       "Invalid initial_accumulator_value value: -0.1"},
      {"adagrad", {{"eps", -1e-10}}, "Invalid epsilon value: -1e-10"},
      {"rmsprop", {{"lr", -0.01}}, "Invalid learning rate: -0.01"},
      {"rmsprop", {{"eps", -1e-08}}, "Invalid epsilon value: -1e-08"},
      {"rmsprop", {{"momentum", -0.9}}, "Invalid momentum value: -0.9"},
      {"rmsprop", {{"weight_decay", -0.01}}, "Invalid weight_decay value: -0.01"},
      {"rmsprop", {{"alpha", -0.99}}, "Invalid alpha value: -0.99"},
      {"rmsprop", {{"lr", -1.0}, {"alpha", -1.0}}, "Invalid learning rate: -1.0"},
      {"adamax", {{"lr", -0.002}}, "Invalid learning rate: -0.002"},
      {"adamax", {{"eps", -1.0}}, "Invalid epsilon value: -1.0"},
      {"adamax", {{"betas", {1.0, 0.999}}}, "Invalid beta parameter at index 0: 1.0"},
      {"adamax", {{"betas", {0.9, -0.1}}}, "Invalid beta parameter at index 1: -0.1"},
      {"adamax", {{"weight_decay", -0.5}}, "Invalid weight_decay value: -0.5"},
      {"nadam", {{"lr", -0.002}}, "Invalid learning rate: -0.002"},
      {"nadam", {{"eps", -1e-08}}, "Invalid epsilon value: -1e-08"},
      {"nadam", {{"betas", {-0.5, 0.999}}}, "Invalid beta parameter at index 0: -0.5"},
      {"nadam", {{"betas", {0.9, 1.0}}}, "Invalid beta parameter at index 1: 1.0"},
      {"nadam", {{"weight_decay", -0.01}}, "Invalid weight_decay value: -0.01"},
      {"nadam", {{"momentum_decay", -0.004}}, "Invalid momentum_decay value: -0.004"},
      {"radam", {{"lr", -0.001}}, "Invalid learning rate: -0.001"},
      {"radam", {{"eps", -1e-08}}, "Invalid epsilon value: -1e-08"},
      {"radam", {{"betas", {1.5, 0.999}}}, "Invalid beta parameter at index 0: 1.5"},
      {"radam", {{"betas", {0.9, 1.0}}}, "Invalid beta parameter at index 1: 1.0"},
      {"radam", {{"weight_decay", -0.1}}, "Invalid weight_decay value: -0.1"},
      {"lion", {{"lr", -0.0001}}, "Invalid learning rate: -0.0001"},
      {"lion", {{"betas", {1.0, 0.99}}}, "Invalid beta parameter at index 0: 1.0"},
      {"lion", {{"betas", {0.9, 1.0}}}, "Invalid beta parameter at index 1: 1.0"},
      {"lion", {{"weight_decay", -0.1}}, "Invalid weight_decay value: -0.1"},
      {"adadelta", {{"lr", -1.0}}, "Invalid learning rate: -1.0"},
      {"adadelta", {{"rho", 1.5}}, "Invalid rho value: 1.5"},
      {"adadelta", {{"rho", -0.1}}, "Invalid rho value: -0.1"},
      {"adadelta", {{"eps", -1e-06}}, "Invalid epsilon value: -1e-06"},
      {"adadelta", {{"weight_decay", -0.1}}, "Invalid weight_decay value: -0.1"},
      {"asgd", {{"lr", -0.01}}, "Invalid learning rate: -0.01"},
      {"asgd", {{"lambd", -0.0001}}, "Invalid lambd value: -0.0001"},
      {"asgd", {{"alpha", -0.75}}, "Invalid alpha value: -0.75"},
      {"asgd", {{"weight_decay", -0.1}}, "Invalid weight_decay value: -0.1"},
      {"asgd", {{"lr", -1.0}, {"alpha", -1.0}}, "Invalid learning rate: -1.0"},
      {"rprop", {{"lr", -0.01}}, "Invalid learning rate: -0.01"},
      {"rprop", {{"etas", {0.0, 1.2}}}, "Invalid eta values: 0.0, 1.2"},
      {"rprop", {{"etas", {0.5, 1.0}}}, "Invalid eta values: 0.5, 1.0"},
      {"rprop", {{"etas", {1.5, 2.0}}}, "Invalid eta values: 1.5, 2.0"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(std::string(b.type) + " " + b.options.dump());
    Options config = b.options;
    config["type"] = b.type;
    EXPECT_THAT(error_of([&] { make(config); }),
                AllOf(StartsWith("optimizer config"), HasSubstr(b.message)));
    // The same check guards a group and set().
    Buf a(3), c(3);
    auto opt = with_one_group(b.type, &a);
    EXPECT_THAT(error_of([&] { opt->add_param_group({c.ref()}, b.options); }),
                AllOf(StartsWith("param group 1"), HasSubstr(b.message)));
    for (auto it = b.options.begin(); it != b.options.end(); ++it)
      if (b.options.size() == 1)
        EXPECT_THAT(error_of([&] { opt->set(0, it.key(), it.value()); }),
                    AllOf(StartsWith("param group 0"), HasSubstr(b.message)));
  }
  // Boundaries torch accepts: zeros everywhere (RMSprop alpha = 0, Adagrad lr_decay = 0, ...).
  EXPECT_NO_THROW(make({{"type", "rmsprop"}, {"alpha", 0.0}, {"eps", 0.0}, {"momentum", 0.0}}));
  EXPECT_NO_THROW(make({{"type", "adagrad"}, {"lr_decay", 0.0}, {"eps", 0.0}}));
  EXPECT_NO_THROW(make({{"type", "nadam"}, {"momentum_decay", 0.0}, {"betas", {0.0, 0.0}}}));
  EXPECT_NO_THROW(make({{"type", "lion"}, {"betas", {0.0, 0.0}}, {"lr", 0.0}}));
}

TEST(OptimizerErrors, UnknownOptionNamesOptionAndOptimizerAndGroup) {
  EXPECT_THAT(error_of([] {
                make({{"type", "adam"}, {"momentum", 0.9}});
              }),
              AllOf(HasSubstr("unknown option 'momentum'"), HasSubstr("adam")));
  Buf a(4), b(4);
  auto opt = with_one_group("adamw", &a);
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({b.ref()}, {{"nesterov", true}});
              }),
              AllOf(StartsWith("param group 1"), HasSubstr("unknown option 'nesterov'"),
                    HasSubstr("adamw")));
  EXPECT_THAT(error_of([&] { opt->set(0, "momentum", 0.9); }),
              AllOf(StartsWith("param group 0"), HasSubstr("unknown option 'momentum'")));
  EXPECT_THAT(error_of([&] { opt->get(0, "momentum"); }),
              AllOf(StartsWith("param group 0"), HasSubstr("unknown option 'momentum'")));
}

TEST(OptimizerErrors, WrongOptionKindShowsExpectedAndGot) {
  EXPECT_THAT(error_of([] {
                make({{"type", "sgd"}, {"lr", "0.1"}});
              }),
              AllOf(HasSubstr("option 'lr'"), HasSubstr("\"0.1\"")));
  EXPECT_THAT(error_of([] {
                make({{"type", "adam"}, {"amsgrad", 1}});
              }),
              AllOf(HasSubstr("option 'amsgrad'"), HasSubstr("false"), HasSubstr("1")));
  EXPECT_THAT(error_of([] {
                make({{"type", "adam"}, {"betas", 0.9}});
              }),
              HasSubstr("option 'betas'"));
  EXPECT_THAT(error_of([] {
                make({{"type", "adam"}, {"betas", Options::array({0.9})}});
              }),
              AllOf(HasSubstr("option 'betas'"), HasSubstr("two numbers")));
  EXPECT_THAT(error_of([] {
                make({{"type", "adam"}, {"betas", Options::array({0.9, "x"})}});
              }),
              AllOf(HasSubstr("option 'betas'"), HasSubstr("two numbers")));
  Buf a(4), b(4);
  auto opt = with_one_group("sgd", &a);
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({b.ref()}, {{"nesterov", "yes"}});
              }),
              AllOf(StartsWith("param group 1"), HasSubstr("option 'nesterov'")));
  EXPECT_THAT(error_of([&] { opt->set(0, "lr", "fast"); }),
              AllOf(StartsWith("param group 0"), HasSubstr("option 'lr'")));
  EXPECT_THAT(error_of([&] { opt->add_param_group({b.ref()}, Options::array({1})); }),
              AllOf(StartsWith("param group 1"), HasSubstr("JSON object")));
}

// Issue 16: names are UTF-8 text without NUL (src/graph/names.h), checked where they enter; and a
// string value that is not UTF-8 (only C++ can build one: JSON text is UTF-8) is shown in messages
// with U+FFFD ("\xef\xbf\xbd") where Options::dump() threw nlohmann's type_error.
TEST(OptimizerErrors, NamesAndValuesThatAreNotUtf8AreErrors) {
  EXPECT_EQ(error_of([] {
              update_graph({{"type", "adam\xff"}});
            }),
            "optimizer config: type \"adam\\xff\" is not valid UTF-8: byte 0xff at offset 4 is "
            "never valid in UTF-8");
  EXPECT_EQ(error_of([] { optimizer_defaults("sgd\xc3"); }),
            "optimizer type \"sgd\\xc3\" is not valid UTF-8: byte 0xc3 at offset 3 starts a "
            "character that is cut short");
  EXPECT_EQ(error_of([] {
              make({{"type", "sgd"}, {"l\xffr", 0.1}});
            }),
            "optimizer config: option name \"l\\xffr\" is not valid UTF-8: byte 0xff at offset 1 "
            "is never valid in UTF-8");
  EXPECT_THAT(error_of([] {
                make({{"type", "sgd"}, {"lr", "x\xff"}});
              }),
              AllOf(StartsWith("optimizer config: option 'lr'"), HasSubstr("\"x\xef\xbf\xbd\"")));
  EXPECT_THAT(error_of([] {
                make({{"type", "sgd"}, {"loss_scale", "dyn\xff"}});
              }),
              HasSubstr("loss_scale must be \"dynamic\" or a number > 0, got \"dyn\xef\xbf\xbd\""));
  EXPECT_THAT(
      error_of([] {
        make({{"type", "adam"}, {"state_dtype", "bf\xff"}});
      }),
      HasSubstr(
          "option 'state_dtype' must be \"f32\", \"bf16\" or \"int8\", got \"bf\xef\xbf\xbd\""));
  EXPECT_THAT(error_of([] { make(Options::array({"\xff"})); }),
              HasSubstr("must be a JSON object, got [\"\xef\xbf\xbd\"]"));
  Buf a(4), b(4);
  auto opt = with_one_group("sgd", &a);
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({b.ref()}, {{"\x80", 1}});
              }),
              StartsWith("param group 1: option name \"\\x80\" is not valid UTF-8"));

  // Custom optimizers: the rule's name, its option names and its graph's names (state names).
  const Options graph = Options::parse(R"({
    "inputs": [{"name": "p", "role": "param"}, {"name": "g", "role": "grad"}],
    "scalars": ["lr"],
    "nodes": [{"id": "s", "op": "mul", "args": ["lr", "g"]},
              {"id": "p1", "op": "sub", "args": ["p", "s"]}],
    "outputs": {"p": "p1"}})");
  auto custom = [&](const std::string& name, const Options& defaults, const Options& g) {
    return Options{{"type", "custom"},
                   {"rule", {{"name", name}, {"defaults", defaults}, {"graph", g}}}};
  };
  const Options lr = {{"lr", 0.1}};
  EXPECT_NO_THROW(update_graph(custom("my_sgd", lr, graph)));
  EXPECT_EQ(error_of([&] { update_graph(custom("my\xff", lr, graph)); }),
            "custom optimizer name \"my\\xff\" is not valid UTF-8: byte 0xff at offset 2 is never "
            "valid in UTF-8");
  EXPECT_EQ(error_of([&] {
              update_graph(custom("my_sgd", {{"lr", 0.1}, {"\xfe", 1.0}}, graph));
            }),
            "custom optimizer 'my_sgd': option name \"\\xfe\" is not valid UTF-8: byte 0xfe at "
            "offset 0 is never valid in UTF-8");
  Options with_state = graph;
  with_state["inputs"].push_back({{"name", "m\xed\xbf\xbf"}, {"role", "state"}});
  EXPECT_EQ(error_of([&] { update_graph(custom("my_sgd", lr, with_state)); }),
            "custom optimizer 'my_sgd': graph JSON /inputs/2: state name \"m\\xed\\xbf\\xbf\" is "
            "not valid UTF-8: byte 0xed at offset 1 starts a UTF-16 surrogate");
  CustomOptimizer def{"my\xc0", lr, [&](const Options&) { return graph_json::from_json(graph); }};
  EXPECT_EQ(error_of([&] { register_optimizer(def); }),
            "custom optimizer name \"my\\xc0\" is not valid UTF-8: byte 0xc0 at offset 2 starts an "
            "overlong encoding");
}

// A deep JSON value would overflow the stack where nlohmann copies or dumps it (recursively).
TEST(OptimizerErrors, DeeplyNestedOptionsAreRejected) {
  Options deep = Options::array();
  for (int i = 0; i < 100; ++i) deep = Options::array({deep});
  EXPECT_EQ(error_of([&] {
              update_graph({{"type", "adam"}, {"betas", deep}});
            }),
            "optimizer config: JSON nested deeper than 64 levels");
  Buf a(4), b(4);
  auto opt = with_one_group("adam", &a);
  EXPECT_EQ(error_of([&] {
              opt->add_param_group({b.ref()}, {{"betas", deep}});
            }),
            "param group 1: JSON nested deeper than 64 levels");
}

// torch's own messages, e.g. ValueError("Invalid learning rate: -0.001"), with the group in front.
TEST(OptimizerErrors, InvalidLearningRateInConfigGroupAndSet) {
  for (const char* type : {"sgd", "adam", "adamw"}) {
    SCOPED_TRACE(type);
    EXPECT_THAT(error_of([&] {
                  make({{"type", type}, {"lr", -1e-3}});
                }),
                AllOf(StartsWith("optimizer config"), HasSubstr("Invalid learning rate: -0.001")));
    Buf a(3), b(3);
    auto opt = with_one_group(type, &a);
    EXPECT_THAT(error_of([&] {
                  opt->add_param_group({b.ref()}, {{"lr", -0.5}});
                }),
                AllOf(StartsWith("param group 1"), HasSubstr("Invalid learning rate: -0.5")));
    EXPECT_THAT(error_of([&] { opt->set(0, "lr", -2e-5); }),
                AllOf(StartsWith("param group 0"), HasSubstr("Invalid learning rate: -2e-05")));
  }
}

TEST(OptimizerErrors, NonFiniteHyperparametersAreRejected) {
  for (const char* type : {"sgd", "adam", "adamw"}) {
    SCOPED_TRACE(type);
    EXPECT_THAT(error_of([&] {
                  make({{"type", type}, {"lr", kNaN}});
                }),
                AllOf(HasSubstr("'lr'"), HasSubstr("nan")));
    EXPECT_THAT(error_of([&] {
                  make({{"type", type}, {"lr", kInf}});
                }),
                AllOf(HasSubstr("'lr'"), HasSubstr("inf")));
    EXPECT_THAT(error_of([&] {
                  make({{"type", type}, {"weight_decay", -kInf}});
                }),
                AllOf(HasSubstr("'weight_decay'"), HasSubstr("-inf")));
    Buf a(3);
    auto opt = with_one_group(type, &a);
    EXPECT_THAT(error_of([&] { opt->set(0, "lr", kNaN); }),
                AllOf(StartsWith("param group 0"), HasSubstr("'lr'"), HasSubstr("nan")));
  }
  EXPECT_THAT(error_of([] {
                make({{"type", "adam"}, {"betas", {0.9, kNaN}}});
              }),
              AllOf(HasSubstr("'betas'"), HasSubstr("nan")));
  EXPECT_THAT(error_of([] {
                make({{"type", "adam"}, {"eps", kNaN}});
              }),
              AllOf(HasSubstr("'eps'"), HasSubstr("nan")));
  EXPECT_THAT(error_of([] {
                make({{"type", "sgd"}, {"momentum", kInf}});
              }),
              AllOf(HasSubstr("'momentum'"), HasSubstr("inf")));
}

TEST(OptimizerErrors, AdamEpsilonBetasAndWeightDecay) {
  for (const char* type : {"adam", "adamw"}) {
    SCOPED_TRACE(type);
    EXPECT_THAT(error_of([&] {
                  make({{"type", type}, {"eps", -1e-8}});
                }),
                HasSubstr("Invalid epsilon value: -1e-08"));
    EXPECT_THAT(error_of([&] {
                  make({{"type", type}, {"betas", {-0.1, 0.999}}});
                }),
                HasSubstr("Invalid beta parameter at index 0: -0.1"));
    EXPECT_THAT(error_of([&] {
                  make({{"type", type}, {"betas", {0.9, 1.5}}});
                }),
                HasSubstr("Invalid beta parameter at index 1: 1.5"));
    EXPECT_THAT(error_of([&] {
                  make({{"type", type}, {"betas", {0.9, -0.25}}});
                }),
                HasSubstr("Invalid beta parameter at index 1: -0.25"));
    EXPECT_THAT(error_of([&] {
                  make({{"type", type}, {"weight_decay", -0.01}});
                }),
                HasSubstr("Invalid weight_decay value: -0.01"));
    Buf a(3), b(3);
    auto opt = with_one_group(type, &a);
    EXPECT_THAT(error_of([&] {
                  opt->add_param_group({b.ref()}, {{"betas", {0.5, 2.5}}});
                }),
                AllOf(StartsWith("param group 1"), HasSubstr("Invalid beta parameter at index 1")));
    EXPECT_THAT(error_of([&] { opt->set(0, "eps", -0.5); }),
                AllOf(StartsWith("param group 0"), HasSubstr("Invalid epsilon value: -0.5")));
    // Boundaries: beta = 0 and eps = 0 are valid in torch.
    EXPECT_NO_THROW(make({{"type", type}, {"betas", {0.0, 0.0}}, {"eps", 0.0}}));
  }
}

// Python prints floats with repr(): 1.0, not 1. torch's message for betas=(1.0, 0.999) reads
// "Invalid beta parameter at index 0: 1.0"; beta = 1 is the boundary most likely to be hit.
TEST(OptimizerErrors, NumbersInMessagesArePrintedAsPythonPrintsThem) {
  EXPECT_THAT(error_of([] {
                make({{"type", "adam"}, {"betas", {1.0, 0.999}}});
              }),
              HasSubstr("Invalid beta parameter at index 0: 1.0"));
  EXPECT_THAT(error_of([] {
                make({{"type", "adamw"}, {"betas", {0.9, 1.0}}});
              }),
              HasSubstr("Invalid beta parameter at index 1: 1.0"));
  EXPECT_THAT(error_of([] {
                make({{"type", "sgd"}, {"lr", -2.0}});
              }),
              HasSubstr("Invalid learning rate: -2.0"));
  EXPECT_THAT(error_of([] {
                make({{"type", "sgd"}, {"momentum", -100000.0}});
              }),
              HasSubstr("Invalid momentum value: -100000.0"));
}

TEST(OptimizerErrors, SgdMomentumWeightDecayAndNesterov) {
  EXPECT_THAT(error_of([] {
                make({{"type", "sgd"}, {"momentum", -0.9}});
              }),
              HasSubstr("Invalid momentum value: -0.9"));
  EXPECT_THAT(error_of([] {
                make({{"type", "sgd"}, {"weight_decay", -0.01}});
              }),
              HasSubstr("Invalid weight_decay value: -0.01"));
  EXPECT_THAT(error_of([] {
                make({{"type", "sgd"}, {"nesterov", true}});
              }),
              HasSubstr("Nesterov momentum requires a momentum and zero dampening"));
  EXPECT_THAT(error_of([] {
                make({{"type", "sgd"}, {"nesterov", true}, {"momentum", 0.9}, {"dampening", 0.1}});
              }),
              HasSubstr("Nesterov momentum requires a momentum and zero dampening"));
  EXPECT_NO_THROW(make({{"type", "sgd"}, {"nesterov", true}, {"momentum", 0.9}}));
  Buf a(3), b(3);
  auto opt = make({{"type", "sgd"}, {"momentum", 0.9}, {"nesterov", true}});
  opt->add_param_group({a.ref()});
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({b.ref()}, {{"momentum", 0.0}});
              }),
              AllOf(StartsWith("param group 1"), HasSubstr("Nesterov")));
  EXPECT_THAT(error_of([&] { opt->set(0, "dampening", 0.5); }),
              AllOf(StartsWith("param group 0"), HasSubstr("Nesterov")));
}

// ---- groups and tensors --------------------------------------------------------------------

TEST(OptimizerErrors, EmptyGroupNamesTheGroup) {
  auto opt = make({{"type", "adamw"}});
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
  auto opt = make({{"type", "adamw"}});
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
  auto opt = make({{"type", "sgd"}});
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
  auto opt = make({{"type", "adam"}});
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
  auto opt = make({{"type", "adamw"}});
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
  auto opt = Optimizer::create(engine(), {{"type", "sgd"}});
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
  auto victim = Optimizer::create(engine(), config());
  auto control = Optimizer::create(engine(), config());
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
    auto other = Optimizer::create(engine(), {{"type", GetParam() == "sgd" ? "adam" : "sgd"}});
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
