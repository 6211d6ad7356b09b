#include "optim/worker_pool.h"

#include <algorithm>

#include "optfuse/parallel.h"

namespace optfuse::optim {

WorkerPool::WorkerPool(int threads) : threads_(threads) {}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {

// A round on the process's OpenMP threads (include/optfuse/parallel.h): part(k) on thread k.
// The runtime may give fewer threads than asked (OMP_THREAD_LIMIT, a nested region): then a
// thread runs several parts, so that every part runs exactly once.
struct OmpRound {
  const std::function<void(int)>* part;
  const OpenMpRuntime* omp;
  int parts;
  std::mutex mutex;
  std::exception_ptr error;
};

void omp_part(void* data) {
  auto* r = static_cast<OmpRound*>(data);
  try {
    const int n = r->omp->num_threads();
    for (int k = r->omp->thread_num(); k < r->parts; k += n) (*r->part)(k);
  } catch (...) {
    std::lock_guard<std::mutex> lock(r->mutex);
    if (!r->error) r->error = std::current_exception();
  }
}

}  // namespace

void WorkerPool::run(const std::function<void(int)>& part) {
  if (const OpenMpRuntime& omp = openmp_runtime(); omp.parallel) {
    OmpRound round{&part, &omp, threads(), {}, nullptr};
    omp.parallel(&omp_part, &round, static_cast<unsigned>(threads()), 0);
    if (round.error) std::rethrow_exception(round.error);
    return;
  }
  if (workers_.empty())
    for (int k = 1; k < threads_; ++k) workers_.emplace_back([this, k] { work(k); });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    part_ = &part;
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr mine;
  try {
    part(0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return pending_ == 0; });
  part_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void WorkerPool::work(int k) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const std::function<void(int)>* part = part_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*part)(k);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    if (--pending_ == 0) done_.notify_one();
  }
}

void make_claims(size_t count, const std::function<int64_t(size_t)>& size, int64_t claim_size,
                 std::vector<size_t>* starts) {
  starts->clear();
  int64_t pending = 0;
  for (size_t i = 0; i < count; ++i) {
    if (pending == 0) starts->push_back(i);
    pending += std::max<int64_t>(size(i), 1);
    if (pending >= claim_size) pending = 0;
  }
  starts->push_back(count);
}

void run_claims(WorkerPool* pool, const std::vector<size_t>& starts,
                const std::function<void(int, size_t)>& run) {
  const size_t claims = starts.size() - 1;
  std::atomic<size_t> next{0};
  auto part = [&](int k) {
    for (size_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < claims;)
      for (size_t i = starts[c]; i < starts[c + 1]; ++i) run(k, i);
  };
  if (!pool || pool->threads() < 2 || claims < 2) return part(0);
  pool->run(part);
}

}  // namespace optfuse::optim
