// Optimizer state files: a run saved after k steps and loaded into a fresh optimizer over copies of
// the params continues bit-identically (memcmp of params, state, step counts and options) to an
// uninterrupted run; corrupt or mismatched files are rejected with an IoError that names the file
// and the fault, and change nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "optfuse/graph.h"
#include "optfuse/optim.h"
#include "support/engine.h"
#include "support/optim_util.h"

namespace optfuse {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Model;
using testing::Snapshot;

Engine& engine() { return testing::shared_engine(); }

struct IoCase {
  std::string name;
  Options config;
  Options overrides[2];
};

void PrintTo(const IoCase& c, std::ostream* os) { *os << c.name; }

// Per-group overrides include structural ones (momentum off, AMSGrad on), which a fresh optimizer
// built from the bare config does not have: load_state must restore them from the file.
std::vector<IoCase> io_cases() {
  return {
      {"sgd_nesterov",
       {{"type", "sgd"},
        {"lr", 0.05},
        {"momentum", 0.9},
        {"nesterov", true},
        {"weight_decay", 1e-3}},
       {Options::object(), {{"lr", 0.02}}}},
      {"sgd_momentum_off_in_one_group",
       {{"type", "sgd"}, {"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.1}},
       {Options::object(), {{"momentum", 0.0}}}},
      {"adam_amsgrad_in_one_group",
       {{"type", "adam"}, {"lr", 0.01}, {"maximize", true}},
       {Options::object(), {{"amsgrad", true}, {"weight_decay", 0.01}}}},
      {"adamw",
       {{"type", "adamw"}, {"lr", 0.01}, {"weight_decay", 0.1}},
       {{{"betas", {0.8, 0.95}}}, Options::object()}},
      // NAdam's running mu_product is host state: a resume that lost it would restart it at 1.
      {"nadam_decoupled_in_one_group",
       {{"type", "nadam"}, {"lr", 0.01}, {"weight_decay", 0.01}},
       {Options::object(), {{"decoupled_weight_decay", true}, {"momentum_decay", 0.01}}}},
      {"rmsprop_centered_momentum_in_one_group",
       {{"type", "rmsprop"}, {"lr", 0.01}},
       {Options::object(), {{"centered", true}, {"momentum", 0.9}}}},
      {"adagrad_initial_accumulator",
       {{"type", "adagrad"}, {"lr", 0.05}, {"lr_decay", 0.01}},
       {{{"initial_accumulator_value", 0.1}}, Options::object()}},
      {"radam_decoupled_in_one_group",
       {{"type", "radam"}, {"lr", 0.01}, {"betas", {0.8, 0.9}}},
       {Options::object(), {{"decoupled_weight_decay", true}, {"weight_decay", 0.1}}}},
  };
}

const std::vector<std::vector<size_t>> kSizes = {{5, 40, 1}, {17, 3, 2}};

struct Trainer {
  Model model;
  std::unique_ptr<Optimizer> opt;

  Trainer(const IoCase& c, Model m, bool overrides) : model(std::move(m)) {
    opt = Optimizer::create(engine(), c.config);
    for (size_t g = 0; g < model.groups.size(); ++g)
      opt->add_param_group(model.refs(g), overrides ? c.overrides[g] : Options::object());
  }
  void step(int t) {
    model.fill_grads(t);
    if (t == 2) opt->set(1, "lr", 0.0125 * 3);  // options changed mid-run must be saved too
    opt->step();
  }
  Snapshot snap() const { return testing::snapshot(*opt, model.buffers()); }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Runs `f`, expects an optfuse::IoError and returns its message.
template <typename F>
std::string io_error_of(F&& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected optfuse::IoError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no optfuse::IoError thrown";
  return "";
}

class StateRoundTrip : public ::testing::TestWithParam<IoCase> {};

TEST_P(StateRoundTrip, SavedAndLoadedRunContinuesBitIdentically) {
  const IoCase& c = GetParam();
  constexpr int kMore = 4;
  for (int k : {0, 1, 3}) {
    SCOPED_TRACE("saved after " + std::to_string(k) + " steps");
    Trainer uninterrupted(c, Model::make(kSizes, 21), true);
    Trainer original(c, Model::make(kSizes, 21), true);
    for (int t = 1; t <= k; ++t) {
      uninterrupted.step(t);
      original.step(t);
    }
    std::string path = testing::temp_path("state_" + c.name);
    Snapshot before_save = original.snap();
    original.opt->save_state(path);
    EXPECT_TRUE(before_save == original.snap()) << "save_state changed the optimizer";
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp")) << "temporary file left behind";

    // Fresh optimizer, bare config (no group overrides), over copies of the params at step k.
    Trainer restored(c, original.model, false);
    restored.opt->load_state(path);
    ASSERT_TRUE(restored.snap() == original.snap()) << restored.snap().diff(original.snap());

    for (int t = k + 1; t <= k + kMore; ++t) {
      uninterrupted.step(t);
      original.step(t);
      restored.step(t);
      Snapshot u = uninterrupted.snap();
      ASSERT_TRUE(restored.snap() == u) << "step " << t << ": " << u.diff(restored.snap());
      ASSERT_TRUE(original.snap() == u) << "step " << t << ": " << u.diff(original.snap());
    }
    std::remove(path.c_str());
  }
}

// Loading into an optimizer that has already moved on rewinds it: options, step counts, state.
TEST_P(StateRoundTrip, LoadingIntoAStartedOptimizerRewindsIt) {
  const IoCase& c = GetParam();
  Trainer reference(c, Model::make(kSizes, 23), true);
  for (int t = 1; t <= 2; ++t) reference.step(t);
  std::string path = testing::temp_path("rewind_" + c.name);
  reference.opt->save_state(path);

  Trainer other(c, reference.model, false);  // params as at step 2, but its own history
  for (int t = 1; t <= 5; ++t) other.step(t + 10);
  for (size_t g = 0; g < kSizes.size(); ++g)  // back to the step-2 params, in the same buffers
    for (size_t i = 0; i < kSizes[g].size(); ++i)
      std::copy(reference.model.groups[g][i].p.begin(), reference.model.groups[g][i].p.end(),
                other.model.groups[g][i].p.begin());
  other.opt->load_state(path);
  for (int t = 3; t <= 5; ++t) {
    reference.step(t);
    other.step(t);
    ASSERT_TRUE(other.snap() == reference.snap())
        << "step " << t << ": " << reference.snap().diff(other.snap());
  }
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Configs, StateRoundTrip, ::testing::ValuesIn(io_cases()),
                         [](const ::testing::TestParamInfo<IoCase>& info) {
                           return info.param.name;
                         });

// ---- rejected files ------------------------------------------------------------------------

// A started Adam run (AMSGrad in group 1), its twin, and a good state file of it.
class CorruptState : public ::testing::Test {
 protected:
  void SetUp() override {
    IoCase c = io_cases()[2];
    victim_ = std::make_unique<Trainer>(c, Model::make(kSizes, 31), true);
    twin_ = std::make_unique<Trainer>(c, Model::make(kSizes, 31), true);
    for (int t = 1; t <= 3; ++t) {
      victim_->step(t);
      twin_->step(t);
    }
    good_ = testing::temp_path("good");
    victim_->opt->save_state(good_);
    bytes_ = read_bytes(good_);
    ASSERT_GT(bytes_.size(), 64u);
    // Move on so that a wrongly accepted load would be visible.
    victim_->step(4);
    twin_->step(4);
  }
  void TearDown() override {
    std::remove(good_.c_str());
    for (const auto& p : written_) std::remove(p.c_str());
  }
  std::string write(const std::string& bytes) {
    std::string p = testing::temp_path("bad");
    write_bytes(p, bytes);
    written_.push_back(p);
    return p;
  }
  // Expects load_state(path) to throw an IoError naming the file, and to change nothing.
  std::string rejected(const std::string& path) {
    Snapshot before = victim_->snap();
    std::string e = io_error_of([&] { victim_->opt->load_state(path); });
    EXPECT_THAT(e, HasSubstr(path));
    Snapshot after = victim_->snap();
    EXPECT_TRUE(before == after) << "rejected load changed: " << before.diff(after);
    return e;
  }
  // After all rejections, the victim still steps exactly like its twin.
  void expect_unharmed() {
    for (int t = 5; t <= 6; ++t) {
      victim_->step(t);
      twin_->step(t);
      Snapshot v = victim_->snap(), w = twin_->snap();
      // The models have different buffers but equal values; options, steps, state must match.
      ASSERT_TRUE(v == w) << "step " << t << ": " << w.diff(v);
    }
  }

  std::unique_ptr<Trainer> victim_, twin_;
  std::string good_, bytes_;
  std::vector<std::string> written_;
};

TEST_F(CorruptState, TruncatedFiles) {
  for (size_t len : {size_t(0), size_t(8), size_t(16), bytes_.size() / 2, bytes_.size() - 1}) {
    SCOPED_TRACE("length " + std::to_string(len));
    std::string e = rejected(write(bytes_.substr(0, len)));
    EXPECT_THAT(e, ::testing::AnyOf(HasSubstr("checksum"), HasSubstr("not an optfuse state file")));
  }
  expect_unharmed();
}

TEST_F(CorruptState, EveryFlippedByteIsDetected) {
  std::string path = write(bytes_);
  for (size_t i = 0; i < bytes_.size(); ++i) {
    std::string bad = bytes_;
    bad[i] = char(bad[i] ^ (1 << (i % 8)));
    write_bytes(path, bad);
    Snapshot before = victim_->snap();
    std::string e = io_error_of([&] { victim_->opt->load_state(path); });
    ASSERT_THAT(e, ::testing::AnyOf(HasSubstr("checksum mismatch"), HasSubstr("bad magic")))
        << "byte " << i << " of " << bytes_.size();
    ASSERT_TRUE(before == victim_->snap()) << "byte " << i;
  }
  expect_unharmed();
}

TEST_F(CorruptState, TrailingBytesAndEmptyAndMissingFiles) {
  EXPECT_THAT(rejected(write(bytes_ + "x")), HasSubstr("checksum"));
  EXPECT_THAT(rejected(write("")), HasSubstr("not an optfuse state file"));
  std::string missing = testing::temp_path("missing");
  EXPECT_THAT(rejected(missing), HasSubstr("cannot open"));
  expect_unharmed();
}

TEST_F(CorruptState, ADirectoryOrAFifoIsAnIoErrorNeverAHang) {
  std::string dir = testing::temp_path("a-directory");
  std::filesystem::create_directories(dir);
  EXPECT_THAT(rejected(dir), HasSubstr("not a regular file"));
  std::filesystem::remove_all(dir);
  std::string fifo = testing::temp_path("a-fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(rejected(fifo), HasSubstr("not a regular file"));
  std::remove(fifo.c_str());
  expect_unharmed();
}

// Before: the reader allocated the file's size first: 1 TiB ended the process with an uncaught
// std::bad_alloc (through the C API: "out of memory"). The size is checked against what this
// optimizer's params can fill before anything is allocated.
TEST_F(CorruptState, ATerabyteFileIsRefusedFromItsSize) {
  std::string path = write("");
  std::filesystem::resize_file(path, uint64_t{1} << 40);
  EXPECT_THAT(rejected(path), HasSubstr(path + " is 1099511627776 bytes, more than the "));
  // A file a little too large for these params is refused the same way.
  std::filesystem::resize_file(path, uint64_t{64} << 20);
  EXPECT_THAT(rejected(path), HasSubstr(" bytes allowed (the most a state file of this "));
  expect_unharmed();
}

TEST_F(CorruptState, WrongOptimizerType) {
  Model m = Model::make(kSizes, 31);
  auto sgd = Optimizer::create(engine(), {{"type", "sgd"}, {"momentum", 0.9}});
  sgd->add_param_group(m.refs(0));
  sgd->add_param_group(m.refs(1));
  m.fill_grads(1);
  sgd->step();
  std::string path = testing::temp_path("sgd_state");
  written_.push_back(path);
  sgd->save_state(path);
  EXPECT_THAT(rejected(path), AllOf(HasSubstr("'sgd'"), HasSubstr("'adam'")));
  expect_unharmed();
}

TEST_F(CorruptState, WrongGroupCountTensorCountOrNumel) {
  auto state_of = [&](const std::vector<std::vector<size_t>>& sizes) {
    Model m = Model::make(sizes, 31);
    auto o = Optimizer::create(engine(), io_cases()[2].config);
    for (size_t g = 0; g < sizes.size(); ++g)
      o->add_param_group(m.refs(g), io_cases()[2].overrides[g]);
    m.fill_grads(1);
    o->step();
    std::string path = testing::temp_path("sizes");
    written_.push_back(path);
    o->save_state(path);
    return path;
  };
  EXPECT_THAT(rejected(state_of({{5, 40, 1}})),
              AllOf(HasSubstr("1 param groups"), HasSubstr("this optimizer has 2")));
  EXPECT_THAT(rejected(state_of({{5, 40, 1}, {17, 3}})),
              AllOf(HasSubstr("param group 1 has 2 tensors in the file but 3 here")));
  EXPECT_THAT(rejected(state_of({{5, 40, 1}, {17, 4, 2}})),
              AllOf(HasSubstr("param group 1, tensor 1 ('g1.t1')"), HasSubstr("4 elements"),
                    HasSubstr("3 here")));
  expect_unharmed();
}

// Re-seals a state file after editing its JSON header (layout documented in
// src/optim/state_io.cpp: magic, u64 header size, header, f32 data, XXH3-128 of all before it), so
// that the checksum passes and the header's CONTENT is what load_state has to check.
std::string resealed(const std::string& bytes, const std::function<void(Options&)>& edit) {
  const size_t magic = 16;  // "OPTFUSE-STATE 1\n"
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data() + magic, 8);
  Options header = Options::parse(bytes.substr(magic + 8, header_size));
  edit(header);
  std::string text = header.dump();
  size_t data_begin = magic + 8 + header_size;
  std::string data = bytes.substr(data_begin, bytes.size() - 16 - data_begin);
  uint64_t n = text.size();
  std::string out = bytes.substr(0, magic);
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += text;
  out += data;
  Hash128 h = xxh3_128(out);
  out.append(reinterpret_cast<const char*>(&h.hi), 8);
  out.append(reinterpret_cast<const char*>(&h.lo), 8);
  return out;
}

TEST_F(CorruptState, SealedFilesWithInconsistentHeadersAreRejected) {
  // The unedited re-seal loads: what follows fails for its content, not for the sealing.
  {
    Trainer fresh(io_cases()[2], victim_->model, false);
    EXPECT_NO_THROW(fresh.opt->load_state(write(resealed(bytes_, [](Options&) {}))));
  }
  // Only what no save_state can write. (AMSGrad on with no max_exp_avg_sq yet, or off with one
  // kept, are legitimate: set(g, "amsgrad", ...) between steps produces both.)
  struct Edit {
    std::string what;
    std::function<void(Options&)> edit;
  };
  const std::vector<Edit> edits = {
      {"step is not a number", [](Options& h) { h["groups"][0]["tensors"][0]["step"] = "three"; }},
      {"negative step", [](Options& h) { h["groups"][0]["tensors"][1]["step"] = -4; }},
      {"type is not a string", [](Options& h) { h["type"] = 5; }},
      {"state name unknown to the optimizer",
       [](Options& h) { h["groups"][0]["tensors"][0]["state"][0] = "bogus"; }},
      {"state of another optimizer",
       [](Options& h) { h["groups"][1]["tensors"][0]["state"][2] = "momentum_buffer"; }},
      {"unknown option", [](Options& h) { h["groups"][0]["options"]["foo"] = 1; }},
      {"option of the wrong kind", [](Options& h) { h["groups"][0]["options"]["lr"] = "0.1"; }},
      {"invalid option value", [](Options& h) { h["groups"][1]["options"]["lr"] = -1.0; }},
      {"missing option", [](Options& h) { h["groups"][0]["options"].erase("eps"); }},
  };
  for (const Edit& e : edits) {
    SCOPED_TRACE(e.what);
    std::string path = write(resealed(bytes_, e.edit));
    // Each edit gets its own optimizer holding the good state, so one wrongly accepted file does
    // not hide the next.
    Trainer fresh(io_cases()[2], victim_->model, false);
    fresh.opt->load_state(good_);
    Snapshot before = fresh.snap();
    std::string message = testing::error_of([&] { fresh.opt->load_state(path); });
    EXPECT_THAT(message, HasSubstr(path));
    Snapshot after = fresh.snap();
    EXPECT_TRUE(before == after) << e.what << ": rejected load changed " << before.diff(after);
  }
}

// Files that set() between steps can legitimately produce must load: AMSGrad switched on but no
// max_exp_avg_sq yet, and switched off with max_exp_avg_sq kept (likewise SGD momentum).
TEST(StateFiles, StructureSwitchedBetweenStepsRoundTrips) {
  for (const char* type : {"adam", "sgd"}) {
    SCOPED_TRACE(type);
    const bool adam = std::string(type) == "adam";
    const char* option = adam ? "amsgrad" : "momentum";
    Options on = adam ? Options(true) : Options(0.9), off = adam ? Options(false) : Options(0.0);
    Trainer original({type, {{"type", type}, {"lr", 0.01}}, {Options::object(), Options::object()}},
                     Model::make(kSizes, 51), true);
    for (int t = 1; t <= 2; ++t) original.step(t);
    for (const Options& value : {on, off}) {
      original.opt->set(0, option, value);
      std::string path = testing::temp_path("switched");
      original.opt->save_state(path);
      Trainer restored({type, {{"type", type}}, {}}, original.model, false);
      ASSERT_NO_THROW(restored.opt->load_state(path)) << option << " = " << value.dump();
      std::remove(path.c_str());
      for (int t = 3; t <= 4; ++t) {
        Trainer* both[] = {&original, &restored};
        for (Trainer* r : both) r->step(t);
        ASSERT_TRUE(restored.snap() == original.snap()) << original.snap().diff(restored.snap());
      }
    }
  }
}

// Saves to one path from two threads at once: each writes its own temporary file and renames
// it into place, so the file left is one whole save (it loads), never a mix of two.
TEST(StateFiles, ConcurrentSavesLeaveOneWholeFile) {
  Trainer a(io_cases()[2], Model::make(kSizes, 61), true);
  Trainer b(io_cases()[2], Model::make(kSizes, 62), true);
  a.step(1);
  b.step(1);
  b.step(2);
  std::string path = testing::temp_path("concurrent");
  std::thread t1([&] {
    for (int i = 0; i < 20; ++i) a.opt->save_state(path);
  });
  std::thread t2([&] {
    for (int i = 0; i < 20; ++i) b.opt->save_state(path);
  });
  t1.join();
  t2.join();
  Trainer c(io_cases()[2], Model::make(kSizes, 63), true);
  EXPECT_NO_THROW(c.opt->load_state(path));
  std::remove(path.c_str());
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
    EXPECT_EQ(e.path().string().find(path + ".tmp"), std::string::npos) << e.path();
}

TEST(StateFiles, SaveToAnUnwritablePathFailsCleanly) {
  Model m = Model::make(kSizes, 41);
  auto opt = Optimizer::create(engine(), {{"type", "adamw"}});
  opt->add_param_group(m.refs(0));
  m.fill_grads(1);
  opt->step();
  std::string dir = testing::temp_path("no_such_dir");
  std::string e = io_error_of([&] { opt->save_state(dir + "/state.bin"); });
  EXPECT_THAT(e, HasSubstr(dir));
  EXPECT_FALSE(std::filesystem::exists(dir));

  // Saving over an existing file replaces it.
  std::string path = testing::temp_path("replace");
  write_bytes(path, "old contents");
  opt->save_state(path);
  EXPECT_NE(read_bytes(path), "old contents");
  EXPECT_NO_THROW(opt->load_state(path));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace optfuse
