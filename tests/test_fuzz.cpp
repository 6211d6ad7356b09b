// Fuzz: random element-wise graphs (with whole-tensor reductions as prologues) give the same
// values through the fused kernel as through the plain interpreter, within an error bound
// computed alongside (running error analysis, as in support/reference_optim.h). 40 seeded graphs
// of 3-24 ops over 1..4099 elements; outputs are written in place.
//
// Every generated op maps [-1, 1] inputs into [-1, 1] (halved sums, products, a / (|b| + 1),
// scaled sqrt / exp / rsqrt of shifted arguments, min / max / select / abs / neg, and means and
// maxima over the tensor), so values stay of order 1 and the bound is a sum of a few ulp per op
// propagated with each op's local derivatives. The kernel must land within kSlack times that
// bound of the interpreter's double result: LLVM's fast-math may contract a*b+c into an FMA or
// reassociate a product (each at most doubling one op's rounding term), and Halide's exp is a
// polynomial (allowed 8 ulp here).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "optfuse/engine.h"
#include "support/engine.h"
#include "support/run_kernel.h"

namespace optfuse {
namespace {

constexpr double kU = 0x1p-24;  // float32 unit roundoff
constexpr double kSlack = 4.0;
constexpr double kTiny = 0x1p-126;

enum class F {
  HalfAdd,
  HalfSub,
  Mul,
  Min,
  Max,
  Neg,
  Abs,
  Select,
  Div,
  Sqrt,
  Exp,
  Rsqrt,
  Mean,
  MaxAll
};
constexpr int kKinds = 14;

struct Expr {
  F f;
  int a = -1, b = -1, c = -1;  // operand indices into the pool
  bool tensor = true;
};

// A value per element (or one for a uniform) and a bound on |float32 kernel - double value|.
struct Val {
  std::vector<double> v, e;
  bool tensor;
  double at(const std::vector<double>& x, size_t i) const { return x.size() == 1 ? x[0] : x[i]; }
};

class Case {
 public:
  Case(uint32_t seed, size_t n) : rng_(seed), n_(n) {}

  void generate() {
    for (const char* name : {"p", "g", "m"}) add_leaf(true);
    add_leaf(false);  // scalar "s"
    int ops = std::uniform_int_distribution<int>(3, 24)(rng_);
    for (int k = 0; k < ops; ++k) add_op();
  }

  Graph build() const {
    Graph g("fuzz");
    std::vector<Value> vals{g.param("p"), g.grad("g"), g.state("m"), g.scalar("s")};
    for (size_t k = 4; k < exprs_.size(); ++k) vals.push_back(build_one(g, exprs_[k], vals));
    // Outputs: the last value and two random ones, over distinct inputs.
    const char* names[] = {"p", "g", "m"};
    std::vector<int> picks{static_cast<int>(vals.size()) - 1, pick(), pick()};
    for (int i = 0; i < 3; ++i)
      if (i == 0 || exprs_[picks[i]].tensor || coin()) g.output(names[i], vals[picks[i]]);
    for (size_t k = 4; k < exprs_.size(); ++k)
      if (!exprs_[k].tensor && coin()) g.result("r" + std::to_string(k), vals[k]);
    return g;
  }

  // Double values and bounds of every pool entry, from the stored (f32) inputs.
  std::vector<Val> evaluate(const testing::Tensors& in, double s) const {
    std::vector<Val> pool;
    for (const char* name : {"p", "g", "m"})
      pool.push_back({in.at(name), std::vector<double>(n_, 0.0), true});
    pool.push_back({{s}, {0.0}, false});
    for (size_t k = 4; k < exprs_.size(); ++k) pool.push_back(eval_one(exprs_[k], pool));
    return pool;
  }

  size_t n() const { return n_; }

 private:
  void add_leaf(bool tensor) { exprs_.push_back({F::Neg, -1, -1, -1, tensor}); }
  bool coin() const { return std::uniform_int_distribution<int>(0, 1)(rng_) == 1; }
  // Operands lean to recent values, so graphs get deep as well as wide.
  int pick() const {
    int size = static_cast<int>(exprs_.size());
    int back = std::min(size - 1, std::geometric_distribution<int>(0.4)(rng_));
    return size - 1 - back;
  }
  int pick_tensor() const {
    for (int tries = 0; tries < 8; ++tries) {
      int i = pick();
      if (exprs_[i].tensor) return i;
    }
    return 1;  // the grad
  }

  void add_op() {
    Expr x;
    x.f = static_cast<F>(std::uniform_int_distribution<int>(0, kKinds - 1)(rng_));
    if (x.f == F::Mean || x.f == F::MaxAll) {
      x.a = pick_tensor();
      x.tensor = false;
    } else {
      x.a = pick();
      x.b = pick();
      x.c = pick();
      x.tensor = exprs_[x.a].tensor || (uses_b(x.f) && exprs_[x.b].tensor) ||
                 (x.f == F::Select && exprs_[x.c].tensor);
    }
    exprs_.push_back(x);
  }

  static bool uses_b(F f) {
    return f == F::HalfAdd || f == F::HalfSub || f == F::Mul || f == F::Min || f == F::Max ||
           f == F::Select || f == F::Div;
  }

  static Value build_one(Graph& g, const Expr& x, const std::vector<Value>& v) {
    Value a = v[x.a], b = x.b >= 0 ? v[x.b] : Value(), c = x.c >= 0 ? v[x.c] : Value();
    switch (x.f) {
      case F::HalfAdd:
        return (a + b) * 0.5;
      case F::HalfSub:
        return (a - b) * 0.5;
      case F::Mul:
        return a * b;
      case F::Min:
        return min(a, b);
      case F::Max:
        return max(a, b);
      case F::Neg:
        return -a;
      case F::Abs:
        return abs(a);
      case F::Select:
        return select(a < b, a, c);
      case F::Div:
        return a / (abs(b) + 1.0);
      case F::Sqrt:
        return sqrt(abs(a) + 0.25) * 0.5;
      case F::Exp:
        return exp(a) * 0.25;
      case F::Rsqrt:
        return rsqrt(abs(a) + 1.0);
      case F::Mean:
        return reduce_mean(a);
      case F::MaxAll:
        return reduce_max(a);
    }
    return a;
  }

  Val eval_one(const Expr& x, const std::vector<Val>& pool) const {
    const Val& A = pool[x.a];
    Val out{{}, {}, x.tensor};
    if (x.f == F::Mean || x.f == F::MaxAll) {
      double v = x.f == F::Mean ? 0 : -HUGE_VAL, e = 0;
      for (size_t i = 0; i < n_; ++i) {
        if (x.f == F::Mean) {
          v += A.v[i] / double(n_);
          e += A.e[i] / double(n_);
        } else {
          v = std::max(v, A.v[i]);
          e = std::max(e, A.e[i]);
        }
      }
      v = double(float(v));  // accumulated in double, rounded once to f32
      out.v = {v};
      out.e = {e + kU * std::fabs(v) + kTiny};
      return out;
    }
    const Val& B = pool[x.b >= 0 ? x.b : x.a];
    const Val& C = pool[x.c >= 0 ? x.c : x.a];
    size_t len = x.tensor ? n_ : 1;
    for (size_t i = 0; i < len; ++i) {
      double a = A.at(A.v, i), ea = A.at(A.e, i), b = B.at(B.v, i), eb = B.at(B.e, i);
      double c = C.at(C.v, i), ec = C.at(C.e, i);
      double r = 0, e = 0;
      switch (x.f) {
        case F::HalfAdd:
          r = (a + b) * 0.5;
          e = 0.5 * (ea + eb) + kU * std::fabs(r);
          break;
        case F::HalfSub:
          r = (a - b) * 0.5;
          e = 0.5 * (ea + eb) + kU * std::fabs(r);
          break;
        case F::Mul:
          r = a * b;
          e = std::fabs(b) * ea + std::fabs(a) * eb + ea * eb + kU * std::fabs(r);
          break;
        case F::Min:
          r = std::min(a, b);
          e = std::max(ea, eb);
          break;
        case F::Max:
          r = std::max(a, b);
          e = std::max(ea, eb);
          break;
        case F::Neg:
          r = -a;
          e = ea;
          break;
        case F::Abs:
          r = std::fabs(a);
          e = ea;
          break;
        case F::Select:
          r = a < b ? a : c;
          e = std::max(ea, ec) + (std::fabs(a - b) <= ea + eb ? std::fabs(a - c) : 0.0);
          break;
        case F::Div: {
          double d = std::fabs(b) + 1, ed = eb + kU * d;
          r = a / d;
          e = (ea + std::fabs(r) * ed) / std::max(d - ed, 0.5) + kU * std::fabs(r);
          break;
        }
        case F::Sqrt: {
          double s = std::fabs(a) + 0.25, es = ea + kU * s;
          r = std::sqrt(s) * 0.5;
          e = 0.5 * (es / (2 * std::sqrt(std::max(s - es, 0.2)))) + 2 * kU * r;
          break;
        }
        case F::Exp:
          r = std::exp(a) * 0.25;
          e = std::exp(a + ea) * 0.25 * ea + 10 * kU * r;
          break;
        case F::Rsqrt: {
          double s = std::fabs(a) + 1, es = ea + kU * s;
          r = 1 / std::sqrt(s);
          e = 0.5 * es + 6 * kU * r;  // |d rsqrt / ds| <= 1/2 for s >= 1; 4 ulp fast rsqrt
          break;
        }
        case F::Mean:
        case F::MaxAll:
          break;
      }
      out.v.push_back(r);
      out.e.push_back(e + kTiny);
    }
    return out;
  }

  mutable std::mt19937 rng_;
  size_t n_;
  std::vector<Expr> exprs_;
};

TEST(Fuzz, FusedKernelsMatchTheInterpreter) {
  Engine& engine = testing::shared_engine();
  const size_t sizes[] = {1, 7, 100, 1000, 4099};
  int checked = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    size_t n = sizes[seed % 5];
    Case c(seed, n);
    c.generate();
    Graph g = c.build();
    std::mt19937 data_rng(seed * 7919);
    std::uniform_real_distribution<double> unit(-1, 1);
    testing::Tensors in;
    for (const char* name : {"p", "g", "m"})
      for (size_t i = 0; i < n; ++i) in[name].push_back(float(unit(data_rng)));
    double s = float(unit(data_rng));
    testing::Scalars results;
    auto got =
        testing::run_kernel(*engine.kernel(g), in, {{"s", s}}, testing::RunOptions{}, &results);
    auto want = interpret(g, in, {{"s", s}});
    auto want_results = interpret_results(g, in, {{"s", s}});
    std::vector<Val> pool = c.evaluate(in, s);
    // One tolerance per graph: kSlack times the largest bound of any value in it (outputs and
    // results are among those values; canonicalization renumbers them, so no per-value map).
    double worst_bound = 0;
    for (const Val& v : pool)
      for (double e : v.e) worst_bound = std::max(worst_bound, e);
    const double tol = kSlack * worst_bound;
    for (const auto& [name, w] : want) {
      ASSERT_EQ(got[name].size(), w.size());
      for (size_t i = 0; i < w.size(); ++i)
        ASSERT_LE(std::fabs(got[name][i] - w[i]), tol)
            << "seed " << seed << " output " << name << "[" << i << "]\n"
            << print(g);
    }
    for (const auto& [name, w] : want_results)
      ASSERT_LE(std::fabs(results[name] - w), tol) << "seed " << seed << " result " << name << "\n"
                                                   << print(g);
    ++checked;
  }
  EXPECT_EQ(checked, 40);
}

}  // namespace
}  // namespace optfuse
