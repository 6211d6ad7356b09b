#pragma once
// Helpers shared by the optimizer tests: deterministic inputs, comparison against the reference
// within its float32 error bound, and byte-exact snapshots of everything an optimizer owns.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "optfuse/error.h"
#include "optfuse/optim.h"

namespace optfuse::testing {

// The reference bound (reference_optim.h) is rigorous for an evaluation in the reference's own
// order. optfuse and torch evaluate algebraically identical formulas, but may reorder a few ops
// (optfuse multiplies by a host 1/sqrt(bias_correction2) where torch divides by its sqrt; torch's
// addcdiv computes (value * m) / denom; FMA contraction removes roundings). Each such local rewrite
// changes the per-op terms of the bound by at most a factor ~1.5; we allow 2 for one evaluation.
constexpr double kEvaluationOrderSlack = 2.0;

// x[i] = gen(seed, offset + i) * scale, as float32 (exact: gen is float32-exact, scale a power of 2
// or small).
std::vector<float> gen_floats(uint32_t seed, size_t n, double scale = 1.0, uint64_t offset = 0);

// Checks |got[i] - ref[i]| <= slack * bound[i] for every i (and that got is finite); on failure
// names `what`, the worst elements, their values and bounds. `worst_ratio` (optional) receives
// max |got - ref| / bound, for reporting how tight the bound is.
::testing::AssertionResult within_bound(const std::string& what, const float* got,
                                        const std::vector<double>& ref,
                                        const std::vector<double>& bound, double slack,
                                        double* worst_ratio = nullptr);

// Caller-owned buffers for an optimizer: groups of (param, grad) float32 tensors with
// deterministic contents. Copying a Model copies the buffers (new addresses), which makes twins.
struct Model {
  struct Tensor {
    std::vector<float> p, g;
    std::vector<int64_t> shape;  // empty: 1-D
    std::string name;
  };
  std::vector<std::vector<Tensor>> groups;
  uint32_t seed = 0;

  // params[i] = gen(seed + 17 * group + tensor, i); grads are zero until fill_grads.
  static Model make(const std::vector<std::vector<size_t>>& sizes, uint32_t seed);
  std::vector<ParamRef> refs(size_t group);
  void fill_grads(int step);  // in place: gen(seed * 7919 + 131 * step + 17 * group + tensor, i)
  std::vector<const std::vector<float>*> buffers() const;  // every p and g, in order
  std::vector<float*> params();
};

// The state names torch uses across every optimizer optfuse has (and Lion's exp_avg).
const std::vector<std::string>& all_state_names();

// Everything an optimizer owns or points at, byte for byte: the caller's param and grad buffers
// (passed in), every group's options, and every tensor's step count and state buffers.
struct Snapshot {
  std::vector<std::vector<float>> buffers;
  std::vector<std::string> options;  // group_options(g).dump()
  std::vector<int64_t> steps;
  std::map<std::string, std::vector<uint32_t>> state;  // "g.i.name" -> bits
  bool operator==(const Snapshot& o) const;
  std::string diff(const Snapshot& o) const;  // first difference, for messages
};
Snapshot snapshot(const Optimizer& opt, const std::vector<const std::vector<float>*>& buffers);

// Bitwise equality of float buffers (NaN payloads and -0.0 included).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b);
bool same_bits(const float* a, const float* b, size_t n);

// A unique path under the test temp dir (not created).
std::string temp_path(const std::string& stem);

// Runs `f`, expects an optfuse::Error that is not an internal error, and returns its message
// (empty, with a test failure, if nothing or something else was thrown).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_EQ(what.rfind("internal error", 0), std::string::npos) << what;
    return what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected optfuse::Error, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no optfuse::Error thrown";
  return "";
}

}  // namespace optfuse::testing
