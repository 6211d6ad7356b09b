#include "optim/grad_stats.h"

#include <algorithm>
#include <cmath>

namespace optfuse::optim {
namespace {

constexpr int64_t kChunk = int64_t{1} << 16;
constexpr int kLanes = 8;

struct Chunk {
  const StatsInput* t;
  int64_t begin, end;
};

// Independent lanes: no reassociation is needed to vectorize, so the result is exactly this
// order's, whatever the compiler does. maxabs ignores nan (std::max keeps the first operand when
// a comparison is false); nan is seen through sumsq.
template <bool kAcc, bool kMax>
GradStats chunk_stats(const float* g, const float* a, int64_t n) {
  double s[kLanes] = {};
  float m[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      float x = kAcc ? a[i + l] + g[i + l] : g[i + l];
      double d = x;
      s[l] += d * d;
      if (kMax) m[l] = std::max(m[l], std::fabs(x));
    }
  for (int l = 0; i < n; ++i, ++l) {
    float x = kAcc ? a[i] + g[i] : g[i];
    double d = x;
    s[l] += d * d;
    if (kMax) m[l] = std::max(m[l], std::fabs(x));
  }
  GradStats r;
  for (int l = 0; l < kLanes; ++l) {
    r.sumsq += s[l];
    r.maxabs = std::max(r.maxabs, static_cast<double>(m[l]));
  }
  return r;
}

GradStats run_chunk(const Chunk& c, bool want_max) {
  const float* g = c.t->grad + c.begin;
  const float* a = c.t->acc ? c.t->acc + c.begin : nullptr;
  int64_t n = c.end - c.begin;
  if (a) return want_max ? chunk_stats<true, true>(g, a, n) : chunk_stats<true, false>(g, a, n);
  return want_max ? chunk_stats<false, true>(g, a, n) : chunk_stats<false, false>(g, a, n);
}

}  // namespace

bool GradStats::finite() const { return std::isfinite(sumsq); }

double GradStats::total_norm(bool norm_inf) const {
  if (!norm_inf || !finite()) return std::sqrt(sumsq);  // sqrt(nan) = nan, sqrt(inf) = inf
  return maxabs;
}

GradStats grad_stats(const std::vector<StatsInput>& tensors, bool want_maxabs, WorkerPool* pool) {
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (const StatsInput& t : tensors)
    for (int64_t b = 0; b < t.n; b += kChunk) {
      chunks.push_back({&t, b, std::min(t.n, b + kChunk)});
      total += chunks.back().end - b;
    }
  std::vector<GradStats> partial(chunks.size());
  const int threads = pool ? pool->threads() : 1;
  if (threads < 2 || total < 2 * kChunk) {
    for (size_t i = 0; i < chunks.size(); ++i) partial[i] = run_chunk(chunks[i], want_maxabs);
  } else {
    // Contiguous runs of chunks with about the same number of elements per thread.
    std::vector<size_t> first(static_cast<size_t>(threads) + 1, chunks.size());
    first[0] = 0;
    int64_t seen = 0;
    int next = 1;
    for (size_t i = 0; i < chunks.size() && next < threads; ++i) {
      seen += chunks[i].end - chunks[i].begin;
      while (next < threads && seen >= total * next / threads) first[static_cast<size_t>(next++)] = i + 1;
    }
    pool->run([&](int k) {
      for (size_t i = first[static_cast<size_t>(k)]; i < first[static_cast<size_t>(k) + 1]; ++i)
        partial[i] = run_chunk(chunks[i], want_maxabs);
    });
  }
  GradStats r;
  for (const GradStats& p : partial) {
    r.sumsq += p.sumsq;
    r.maxabs = std::max(r.maxabs, p.maxabs);
  }
  return r;
}

}  // namespace optfuse::optim
