#pragma once
// A small persistent thread pool for step(): many small tensors are each one single-task kernel
// call, so running those calls on all cores (instead of one after another on the caller) is what
// makes a model's hundreds of biases and norms cheap. Large tensors do not use it: their kernels
// are parallel inside.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace optfuse::optim {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);  // threads >= 1, the caller included
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return threads_; }

  // Runs part(k) for k in [0, threads()) — part 0 on the caller — and returns when all are done.
  // The first exception thrown by any part is rethrown here.
  void run(const std::function<void(int)>& part);

 private:
  void work(int k);

  int threads_;
  std::vector<std::thread> workers_;  // started at the first round not on an OpenMP runtime
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* part_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// Work cut into items (slices of tensors), run as one round: consecutive items are grouped into
// claims of at least `claim_size` elements (item i has size(i)), so that a thread takes one
// atomic increment per claim rather than per tiny item. starts receives each claim's first item,
// then `count`.
void make_claims(size_t count, const std::function<int64_t(size_t)>& size, int64_t claim_size,
                 std::vector<size_t>* starts);
// Runs every item of the claims in `starts`: each part of `pool` takes the next unclaimed claim
// until none are left, and calls run(part, item) for its items in order. On the caller alone
// (part 0) when `pool` is null or there is only one claim.
void run_claims(WorkerPool* pool, const std::vector<size_t>& starts,
                const std::function<void(int, size_t)>& run);

}  // namespace optfuse::optim
