#include "support/optim_util.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <sstream>

#include "support/gen.h"

namespace optfuse::testing {

std::vector<float> gen_floats(uint32_t seed, size_t n, double scale, uint64_t offset) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(gen(seed, offset + i) * scale);
  return x;
}

::testing::AssertionResult within_bound(const std::string& what, const float* got,
                                        const std::vector<double>& ref,
                                        const std::vector<double>& bound, double slack,
                                        double* worst_ratio) {
  struct Bad {
    size_t i;
    double excess;
  };
  std::vector<Bad> bad;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double diff = std::fabs(double(got[i]) - ref[i]);
    double tol = slack * bound[i];
    if (!std::isfinite(got[i]) || !(diff <= tol))
      bad.push_back({i, tol > 0 ? diff / tol : INFINITY});
    if (bound[i] > 0)
      worst = std::max(worst, diff / bound[i]);
    else if (diff > 0)
      worst = INFINITY;
  }
  if (worst_ratio) *worst_ratio = worst;
  if (bad.empty()) return ::testing::AssertionSuccess();
  std::sort(bad.begin(), bad.end(), [](const Bad& a, const Bad& b) { return a.excess > b.excess; });
  std::ostringstream os;
  os.precision(9);
  os << what << ": " << bad.size() << " of " << ref.size()
     << " elements outside slack * bound (slack " << slack << "); worst:";
  for (size_t k = 0; k < std::min<size_t>(bad.size(), 5); ++k) {
    size_t i = bad[k].i;
    os << "\n  [" << i << "] got " << got[i] << ", reference " << ref[i] << ", |diff| "
       << std::fabs(double(got[i]) - ref[i]) << ", bound " << bound[i];
  }
  return ::testing::AssertionFailure() << os.str();
}

Model Model::make(const std::vector<std::vector<size_t>>& sizes, uint32_t seed) {
  Model m;
  m.seed = seed;
  for (size_t gi = 0; gi < sizes.size(); ++gi) {
    m.groups.emplace_back();
    for (size_t ti = 0; ti < sizes[gi].size(); ++ti) {
      Tensor t;
      t.p = gen_floats(seed + 17 * uint32_t(gi) + uint32_t(ti), sizes[gi][ti]);
      t.g.assign(sizes[gi][ti], 0.f);
      t.name = "g" + std::to_string(gi) + ".t" + std::to_string(ti);
      m.groups.back().push_back(std::move(t));
    }
  }
  return m;
}

std::vector<ParamRef> Model::refs(size_t group) {
  std::vector<ParamRef> out;
  for (Tensor& t : groups.at(group)) {
    int64_t n = int64_t(t.p.size());
    out.push_back({{t.p.data(), n, t.shape}, {t.g.data(), n, t.shape}, t.name});
  }
  return out;
}

void Model::fill_grads(int step) {
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (size_t ti = 0; ti < groups[gi].size(); ++ti) {
      Tensor& t = groups[gi][ti];
      uint32_t s = seed * 7919u + 131u * uint32_t(step) + 17u * uint32_t(gi) + uint32_t(ti);
      std::vector<float> g = gen_floats(s, t.g.size(), 0.5);
      std::copy(g.begin(), g.end(), t.g.begin());
    }
}

std::vector<const std::vector<float>*> Model::buffers() const {
  std::vector<const std::vector<float>*> out;
  for (const auto& group : groups)
    for (const Tensor& t : group) {
      out.push_back(&t.p);
      out.push_back(&t.g);
    }
  return out;
}

std::vector<float*> Model::params() {
  std::vector<float*> out;
  for (auto& group : groups)
    for (Tensor& t : group) out.push_back(t.p.data());
  return out;
}

const std::vector<std::string>& all_state_names() {
  static const std::vector<std::string> names = {"momentum_buffer",
                                                 "exp_avg",
                                                 "exp_avg_sq",
                                                 "max_exp_avg_sq",
                                                 "sum",
                                                 "square_avg",
                                                 "grad_avg",
                                                 "exp_inf",
                                                 "acc_delta",
                                                 "ax",
                                                 "prev",
                                                 "step_size"};
  return names;
}

static std::vector<uint32_t> bits_of(const float* x, size_t n) {
  std::vector<uint32_t> b(n);
  if (n) std::memcpy(b.data(), x, n * sizeof(float));
  return b;
}

bool Snapshot::operator==(const Snapshot& o) const {
  if (buffers.size() != o.buffers.size()) return false;
  for (size_t i = 0; i < buffers.size(); ++i)
    if (!same_bits(buffers[i], o.buffers[i])) return false;
  return options == o.options && steps == o.steps && state == o.state;
}

std::string Snapshot::diff(const Snapshot& o) const {
  if (buffers.size() != o.buffers.size()) return "different number of caller buffers";
  for (size_t i = 0; i < buffers.size(); ++i)
    if (!same_bits(buffers[i], o.buffers[i]))
      return "caller buffer " + std::to_string(i) + " changed";
  if (options.size() != o.options.size())
    return "number of groups changed: " + std::to_string(options.size()) + " -> " +
           std::to_string(o.options.size());
  for (size_t g = 0; g < options.size(); ++g)
    if (options[g] != o.options[g])
      return "group " + std::to_string(g) + " options: " + options[g] + " -> " + o.options[g];
  if (steps != o.steps) return "step counts changed";
  for (const auto& [k, v] : state) {
    auto it = o.state.find(k);
    if (it == o.state.end()) return "state " + k + " disappeared";
    if (it->second != v) return "state " + k + " changed";
  }
  for (const auto& [k, v] : o.state)
    if (!state.count(k)) return "state " + k + " appeared";
  return "";
}

Snapshot snapshot(const Optimizer& opt, const std::vector<const std::vector<float>*>& buffers) {
  Snapshot s;
  for (const auto* b : buffers) s.buffers.push_back(*b);
  for (size_t g = 0; g < opt.num_groups(); ++g) {
    s.options.push_back(opt.group_options(g).dump());
    for (size_t i = 0; i < opt.group_size(g); ++i) {
      s.steps.push_back(opt.step_count(g, i));
      for (const auto& name : all_state_names())
        if (const std::vector<float>* st = opt.state(g, i, name))
          s.state[std::to_string(g) + "." + std::to_string(i) + "." + name] =
              bits_of(st->data(), st->size());
    }
  }
  return s;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && same_bits(a.data(), b.data(), a.size());
}

std::string temp_path(const std::string& stem) {
  static std::atomic<int> counter{0};
  return ::testing::TempDir() + "optfuse_" + stem + "_" + std::to_string(::getpid()) + "_" +
         std::to_string(counter++);
}

}  // namespace optfuse::testing
