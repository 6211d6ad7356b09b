// User errors in the options of the Optimizer API: each rejected call throws optfuse::Error
// (never an internal error) whose message says what is at fault in torch's words where torch has
// them, and names the group ("param group 1") at fault. Errors in the groups' tensors, and that a
// rejected call changes nothing: test_optim_tensor_errors.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "graph/json.h"
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
using ::testing::StartsWith;
using testing::with_one_group;

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// ---- optimizer type and options ------------------------------------------------------------

TEST(OptimizerErrors, UnknownOptimizerTypeListsTheKnownOnes) {
  std::string e = error_of([] { make_optimizer({{"type", "lbfgs"}}); });
  EXPECT_THAT(
      e, AllOf(HasSubstr("unknown optimizer type 'lbfgs'"), HasSubstr("adam"), HasSubstr("adamw"),
               HasSubstr("sgd"), HasSubstr("rmsprop"), HasSubstr("nadam"), HasSubstr("lion")));
  EXPECT_THAT(error_of([] { make_optimizer({{"lr", 0.1}}); }), HasSubstr("\"type\""));
  EXPECT_THAT(error_of([] { make_optimizer({{"type", 3}}); }), HasSubstr("\"type\""));
  EXPECT_THAT(error_of([] { make_optimizer(Options::array({1, 2})); }), HasSubstr("JSON object"));
}

TEST(OptimizerErrors, TypeNamesAreCaseInsensitiveTorchClassNames) {
  EXPECT_EQ(make_optimizer({{"type", "AdamW"}})->type(), "adamw");
  EXPECT_EQ(make_optimizer({{"type", "SGD"}})->type(), "sgd");
  EXPECT_EQ(make_optimizer({{"type", "Adam"}})->type(), "adam");
  EXPECT_EQ(make_optimizer({{"type", "Adagrad"}})->type(), "adagrad");
  EXPECT_EQ(make_optimizer({{"type", "RMSprop"}})->type(), "rmsprop");
  EXPECT_EQ(make_optimizer({{"type", "Adamax"}})->type(), "adamax");
  EXPECT_EQ(make_optimizer({{"type", "NAdam"}})->type(), "nadam");
  EXPECT_EQ(make_optimizer({{"type", "RAdam"}})->type(), "radam");
  EXPECT_EQ(make_optimizer({{"type", "Lion"}})->type(), "lion");
  EXPECT_EQ(make_optimizer({{"type", "Adadelta"}})->type(), "adadelta");
  EXPECT_EQ(make_optimizer({{"type", "ASGD"}})->type(), "asgd");
  EXPECT_EQ(make_optimizer({{"type", "Rprop"}})->type(), "rprop");
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
    EXPECT_THAT(error_of([&] { make_optimizer(config); }),
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
  EXPECT_NO_THROW(
      make_optimizer({{"type", "rmsprop"}, {"alpha", 0.0}, {"eps", 0.0}, {"momentum", 0.0}}));
  EXPECT_NO_THROW(make_optimizer({{"type", "adagrad"}, {"lr_decay", 0.0}, {"eps", 0.0}}));
  EXPECT_NO_THROW(
      make_optimizer({{"type", "nadam"}, {"momentum_decay", 0.0}, {"betas", {0.0, 0.0}}}));
  EXPECT_NO_THROW(make_optimizer({{"type", "lion"}, {"betas", {0.0, 0.0}}, {"lr", 0.0}}));
}

TEST(OptimizerErrors, UnknownOptionNamesOptionAndOptimizerAndGroup) {
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "adam"}, {"momentum", 0.9}});
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
                make_optimizer({{"type", "sgd"}, {"lr", "0.1"}});
              }),
              AllOf(HasSubstr("option 'lr'"), HasSubstr("\"0.1\"")));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "adam"}, {"amsgrad", 1}});
              }),
              AllOf(HasSubstr("option 'amsgrad'"), HasSubstr("false"), HasSubstr("1")));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "adam"}, {"betas", 0.9}});
              }),
              HasSubstr("option 'betas'"));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "adam"}, {"betas", Options::array({0.9})}});
              }),
              AllOf(HasSubstr("option 'betas'"), HasSubstr("two numbers")));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "adam"}, {"betas", Options::array({0.9, "x"})}});
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
              make_optimizer({{"type", "sgd"}, {"l\xffr", 0.1}});
            }),
            "optimizer config: option name \"l\\xffr\" is not valid UTF-8: byte 0xff at offset 1 "
            "is never valid in UTF-8");
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "sgd"}, {"lr", "x\xff"}});
              }),
              AllOf(StartsWith("optimizer config: option 'lr'"), HasSubstr("\"x\xef\xbf\xbd\"")));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "sgd"}, {"loss_scale", "dyn\xff"}});
              }),
              HasSubstr("loss_scale must be \"dynamic\" or a number > 0, got \"dyn\xef\xbf\xbd\""));
  EXPECT_THAT(
      error_of([] {
        make_optimizer({{"type", "adam"}, {"state_dtype", "bf\xff"}});
      }),
      HasSubstr(
          "option 'state_dtype' must be \"f32\", \"bf16\" or \"int8\", got \"bf\xef\xbf\xbd\""));
  EXPECT_THAT(error_of([] { make_optimizer(Options::array({"\xff"})); }),
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
                  make_optimizer({{"type", type}, {"lr", -1e-3}});
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
                  make_optimizer({{"type", type}, {"lr", kNaN}});
                }),
                AllOf(HasSubstr("'lr'"), HasSubstr("nan")));
    EXPECT_THAT(error_of([&] {
                  make_optimizer({{"type", type}, {"lr", kInf}});
                }),
                AllOf(HasSubstr("'lr'"), HasSubstr("inf")));
    EXPECT_THAT(error_of([&] {
                  make_optimizer({{"type", type}, {"weight_decay", -kInf}});
                }),
                AllOf(HasSubstr("'weight_decay'"), HasSubstr("-inf")));
    Buf a(3);
    auto opt = with_one_group(type, &a);
    EXPECT_THAT(error_of([&] { opt->set(0, "lr", kNaN); }),
                AllOf(StartsWith("param group 0"), HasSubstr("'lr'"), HasSubstr("nan")));
  }
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "adam"}, {"betas", {0.9, kNaN}}});
              }),
              AllOf(HasSubstr("'betas'"), HasSubstr("nan")));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "adam"}, {"eps", kNaN}});
              }),
              AllOf(HasSubstr("'eps'"), HasSubstr("nan")));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "sgd"}, {"momentum", kInf}});
              }),
              AllOf(HasSubstr("'momentum'"), HasSubstr("inf")));
}

TEST(OptimizerErrors, AdamEpsilonBetasAndWeightDecay) {
  for (const char* type : {"adam", "adamw"}) {
    SCOPED_TRACE(type);
    EXPECT_THAT(error_of([&] {
                  make_optimizer({{"type", type}, {"eps", -1e-8}});
                }),
                HasSubstr("Invalid epsilon value: -1e-08"));
    EXPECT_THAT(error_of([&] {
                  make_optimizer({{"type", type}, {"betas", {-0.1, 0.999}}});
                }),
                HasSubstr("Invalid beta parameter at index 0: -0.1"));
    EXPECT_THAT(error_of([&] {
                  make_optimizer({{"type", type}, {"betas", {0.9, 1.5}}});
                }),
                HasSubstr("Invalid beta parameter at index 1: 1.5"));
    EXPECT_THAT(error_of([&] {
                  make_optimizer({{"type", type}, {"betas", {0.9, -0.25}}});
                }),
                HasSubstr("Invalid beta parameter at index 1: -0.25"));
    EXPECT_THAT(error_of([&] {
                  make_optimizer({{"type", type}, {"weight_decay", -0.01}});
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
    EXPECT_NO_THROW(make_optimizer({{"type", type}, {"betas", {0.0, 0.0}}, {"eps", 0.0}}));
  }
}

// Python prints floats with repr(): 1.0, not 1. torch's message for betas=(1.0, 0.999) reads
// "Invalid beta parameter at index 0: 1.0"; beta = 1 is the boundary most likely to be hit.
TEST(OptimizerErrors, NumbersInMessagesArePrintedAsPythonPrintsThem) {
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "adam"}, {"betas", {1.0, 0.999}}});
              }),
              HasSubstr("Invalid beta parameter at index 0: 1.0"));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "adamw"}, {"betas", {0.9, 1.0}}});
              }),
              HasSubstr("Invalid beta parameter at index 1: 1.0"));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "sgd"}, {"lr", -2.0}});
              }),
              HasSubstr("Invalid learning rate: -2.0"));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "sgd"}, {"momentum", -100000.0}});
              }),
              HasSubstr("Invalid momentum value: -100000.0"));
}

TEST(OptimizerErrors, SgdMomentumWeightDecayAndNesterov) {
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "sgd"}, {"momentum", -0.9}});
              }),
              HasSubstr("Invalid momentum value: -0.9"));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "sgd"}, {"weight_decay", -0.01}});
              }),
              HasSubstr("Invalid weight_decay value: -0.01"));
  EXPECT_THAT(error_of([] {
                make_optimizer({{"type", "sgd"}, {"nesterov", true}});
              }),
              HasSubstr("Nesterov momentum requires a momentum and zero dampening"));
  EXPECT_THAT(error_of([] {
                make_optimizer(
                    {{"type", "sgd"}, {"nesterov", true}, {"momentum", 0.9}, {"dampening", 0.1}});
              }),
              HasSubstr("Nesterov momentum requires a momentum and zero dampening"));
  EXPECT_NO_THROW(make_optimizer({{"type", "sgd"}, {"nesterov", true}, {"momentum", 0.9}}));
  Buf a(3), b(3);
  auto opt = make_optimizer({{"type", "sgd"}, {"momentum", 0.9}, {"nesterov", true}});
  opt->add_param_group({a.ref()});
  EXPECT_THAT(error_of([&] {
                opt->add_param_group({b.ref()}, {{"momentum", 0.0}});
              }),
              AllOf(StartsWith("param group 1"), HasSubstr("Nesterov")));
  EXPECT_THAT(error_of([&] { opt->set(0, "dampening", 0.5); }),
              AllOf(StartsWith("param group 0"), HasSubstr("Nesterov")));
}

}  // namespace
}  // namespace optfuse
