// step() spreads tensors small enough to be one kernel task each over all threads (one lane per
// thread, each with its own scalar memo and call). Whatever the split, the result must be the one
// a single-threaded engine gives, bit for bit: every tensor's update is independent, and so are
// its step count and host state (NAdam's mu_product).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "optfuse/optim.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using testing::Model;

// Many small tensors (ragged sizes, a few vector lengths and tails) and two large ones that take
// the ordinary parallel-kernel path, in two groups with different options.
std::vector<std::vector<size_t>> layout() {
  std::vector<std::vector<size_t>> sizes(2);
  for (size_t i = 0; i < 120; ++i) sizes[i % 2].push_back(1 + (i * 37) % 700);
  sizes[0].push_back(100003);
  sizes[1].push_back(40000);
  return sizes;
}

testing::Snapshot run(int threads, const Options& config, int steps) {
  EngineOptions eo;
  eo.num_threads = threads;
  Engine engine(eo);
  Model m = Model::make(layout(), 3);
  auto opt = Optimizer::create(engine, config);
  opt->add_param_group(m.refs(0), {{"lr", 1e-3}});
  opt->add_param_group(m.refs(1), {{"lr", 2e-3}});
  for (int s = 1; s <= steps; ++s) {
    m.fill_grads(s);
    opt->set(0, "lr", 1e-3 / s);
    opt->step();
  }
  return testing::snapshot(*opt, m.buffers());
}

class ParallelSmallTensors : public ::testing::TestWithParam<Options> {};

TEST_P(ParallelSmallTensors, AgreeBitForBitWithOneThread) {
  testing::Snapshot serial = run(1, GetParam(), 6);
  testing::Snapshot parallel = run(2, GetParam(), 6);
  EXPECT_TRUE(serial == parallel) << serial.diff(parallel);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ParallelSmallTensors,
                         ::testing::Values(Options{{"type", "adamw"}, {"amsgrad", true}},
                                           Options{{"type", "nadam"}},
                                           Options{{"type", "sgd"}, {"momentum", 0.9}}));

// A step looks each tensor's state buffers up once per kernel binding (Tensor::epoch), not by
// name at every call. Structure changes between steps create state (amsgrad's max_exp_avg_sq)
// and replace it (state_dtype f32 -> bf16 converts every buffer): the next step must read the new
// buffers. The twin rebuilds its optimizer from a state file before every step, so it has no
// bound buffers to go stale; both must agree bit for bit, and with each other's state.
TEST(ParallelSmallTensors, StateBoundOncePerBindingFollowsStructureChanges) {
  Engine engine;
  const Options config = {{"type", "adamw"}};
  auto change = [](Optimizer& opt, int s) {
    if (s == 3) opt.set(0, "amsgrad", true);        // new state for group 0
    if (s == 5) opt.set(1, "state_dtype", "bf16");  // group 1's state converted
  };
  Model bound = Model::make(layout(), 5), fresh = bound;
  auto opt = Optimizer::create(engine, config);
  opt->add_param_group(bound.refs(0));
  opt->add_param_group(bound.refs(1));
  const std::string path = testing::temp_path("state_bound");
  std::unique_ptr<Optimizer> twin;
  for (int s = 1; s <= 7; ++s) {
    bound.fill_grads(s);
    change(*opt, s);
    opt->step();

    fresh.fill_grads(s);
    auto next = Optimizer::create(engine, config);
    next->add_param_group(fresh.refs(0));
    next->add_param_group(fresh.refs(1));
    if (twin) {
      twin->save_state(path);
      next->load_state(path);
    }
    twin = std::move(next);
    change(*twin, s);
    twin->step();
  }
  testing::Snapshot a = testing::snapshot(*opt, bound.buffers());
  testing::Snapshot b = testing::snapshot(*twin, fresh.buffers());
  EXPECT_TRUE(a == b) << a.diff(b);
  EXPECT_NE(opt->state(0, 0, "max_exp_avg_sq"), nullptr);
  EXPECT_NE(opt->state_bf16(1, 0, "exp_avg"), nullptr);
}

}  // namespace
}  // namespace optfuse
