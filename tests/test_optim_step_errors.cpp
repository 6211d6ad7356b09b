// Step options that are not acceptable are rejected with messages naming the option and value
// (torch's wording where torch has a check), and a rejected call changes nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;

Engine& engine() { return testing::shared_engine(); }

std::string create_error(const Options& extra) {
  Options config = {{"type", "adamw"}};
  config.update(extra);
  return testing::error_of([&] { Optimizer::create(engine(), config); });
}

TEST(StepErrors, Clipping) {
  EXPECT_THAT(create_error({{"max_grad_norm", -1.0}}),
              HasSubstr("optimizer config: Invalid max_grad_norm: -1.0 (must be >= 0)"));
  EXPECT_THAT(create_error({{"max_grad_norm", "1"}}),
              HasSubstr("option 'max_grad_norm' must be a number, got \"1\""));
  EXPECT_THAT(create_error({{"max_grad_norm", 1.0}, {"norm_type", 1}}),
              HasSubstr("unsupported norm_type 1 (supported: 2 and \"inf\")"));
  EXPECT_THAT(create_error({{"max_grad_norm", 1.0}, {"norm_type", "fro"}}),
              HasSubstr("unsupported norm_type \"fro\""));
  EXPECT_THAT(create_error({{"norm_type", 2}}),
              HasSubstr("'norm_type' needs \"max_grad_norm\" (gradient clipping)"));
  EXPECT_THAT(create_error({{"max_grad_norm", 1.0}, {"error_if_nonfinite", 1}}),
              HasSubstr("option 'error_if_nonfinite' must be true or false, got 1"));
}

TEST(StepErrors, LossScale) {
  EXPECT_THAT(create_error({{"loss_scale", 0.0}}),
              HasSubstr("Invalid loss_scale: 0.0 (must be > 0)"));
  EXPECT_THAT(create_error({{"loss_scale", "auto"}}),
              HasSubstr("loss_scale must be \"dynamic\" or a number > 0, got \"auto\""));
  EXPECT_THAT(create_error({{"growth_factor", 2.0}}),
              HasSubstr("'growth_factor' needs \"loss_scale\": \"dynamic\""));
  EXPECT_THAT(create_error({{"loss_scale", 8.0}, {"init_scale", 2.0}}),
              HasSubstr("'init_scale' needs \"loss_scale\": \"dynamic\""));
  Options dyn = {{"loss_scale", "dynamic"}};
  auto with = [&](const Options& o) {
    Options c = dyn;
    c.update(o);
    return create_error(c);
  };
  EXPECT_THAT(with({{"growth_factor", 1.0}}),
              HasSubstr("The growth factor must be > 1.0, got 1.0"));
  EXPECT_THAT(with({{"backoff_factor", 1.0}}), HasSubstr("The backoff factor must be < 1.0"));
  EXPECT_THAT(with({{"init_scale", -4.0}}), HasSubstr("Invalid init_scale: -4.0 (must be > 0)"));
  EXPECT_THAT(with({{"growth_interval", 0}}),
              HasSubstr("growth_interval must be an integer > 0, got 0"));
  EXPECT_THAT(with({{"growth_interval", 2.5}}),
              HasSubstr("growth_interval must be an integer > 0, got 2.5"));
}

TEST(StepErrors, Accumulation) {
  EXPECT_THAT(create_error({{"accumulation_steps", 0}}),
              HasSubstr("accumulation_steps must be an integer >= 1, got 0"));
  EXPECT_THAT(create_error({{"accumulation_steps", -2}}),
              HasSubstr("accumulation_steps must be an integer >= 1, got -2"));
  EXPECT_THAT(create_error({{"accumulation_steps", 1.5}}),
              HasSubstr("accumulation_steps must be an integer >= 1, got 1.5"));
  EXPECT_THAT(create_error({{"accumulation", "avg"}}),
              HasSubstr("accumulation must be \"mean\" or \"sum\", got \"avg\""));
  // 2.0 is an integer value
  Options ok = {{"type", "sgd"}, {"accumulation_steps", 2.0}};
  EXPECT_EQ(Optimizer::create(engine(), ok)->step_options()["accumulation_steps"], 2);
}

// Step options are optimizer-wide: a group's overrides or set() cannot hold them.
TEST(StepErrors, NotPerGroup) {
  testing::Model m = testing::Model::make({{4}}, 41);
  auto opt = Optimizer::create(engine(), {{"type", "sgd"}, {"max_grad_norm", 1.0}});
  EXPECT_THAT(testing::error_of([&] {
                opt->add_param_group(m.refs(0), {{"max_grad_norm", 2.0}});
              }),
              HasSubstr("param group 0: 'max_grad_norm' is an optimizer-wide option"));
  EXPECT_EQ(opt->num_groups(), 0u);
  opt->add_param_group(m.refs(0));
  EXPECT_THAT(testing::error_of([&] { opt->set(0, "accumulation_steps", 4); }),
              HasSubstr("param group 0: 'accumulation_steps' is an optimizer-wide option"));
  EXPECT_THAT(testing::error_of([&] {
                update_graph({{"type", "sgd"}}, {{"loss_scale", 2.0}});
              }),
              HasSubstr("'loss_scale' is an optimizer-wide option"));
}

TEST(StepErrors, StepOptionsEcho) {
  auto opt = Optimizer::create(engine(), {{"type", "adam"},
                                          {"max_grad_norm", 1.0},
                                          {"norm_type", "inf"},
                                          {"loss_scale", "dynamic"},
                                          {"growth_interval", 100},
                                          {"accumulation_steps", 4},
                                          {"accumulation", "sum"}});
  Options s = opt->step_options();
  EXPECT_EQ(s["max_grad_norm"], 1.0);
  EXPECT_EQ(s["norm_type"], "inf");
  EXPECT_EQ(s["loss_scale"], "dynamic");
  EXPECT_EQ(s["init_scale"], 65536.0);
  EXPECT_EQ(s["growth_interval"], 100);
  EXPECT_EQ(s["accumulation_steps"], 4);
  EXPECT_EQ(s["accumulation"], "sum");
  EXPECT_EQ(opt->loss_scale(), 65536.0);
  EXPECT_TRUE(Optimizer::create(engine(), {{"type", "adam"}})->step_options().empty());
}

}  // namespace
}  // namespace optfuse
