/* A complete C program using optfuse: AdamW on two tensors, a learning-rate change, an error.
 * Built as plain C (proving optfuse.h is valid C) and run by CTest as `example_c_api`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "optfuse/optfuse.h"

#define CHECK(call)                                                    \
  do {                                                                 \
    if ((call) != OPTFUSE_OK) {                                        \
      fprintf(stderr, "%s failed: %s\n", #call, optfuse_last_error()); \
      return 1;                                                        \
    }                                                                  \
  } while (0)

int main(void) {
  enum { N0 = 1000, N1 = 7 };
  static float w[N0], gw[N0], b[N1], gb[N1];
  for (int i = 0; i < N0; ++i) {
    w[i] = 0.01f * (float)(i % 13);
    gw[i] = 0.1f;
  }
  for (int i = 0; i < N1; ++i) {
    b[i] = 0.0f;
    gb[i] = -0.2f;
  }

  optfuse_engine* engine;
  optfuse_optimizer* opt;
  CHECK(optfuse_engine_create("host", 0, &engine));
  CHECK(optfuse_optimizer_create(engine, "{\"type\":\"adamw\",\"lr\":1e-2}", &opt));

  float* params[] = {w, b};
  float* grads[] = {gw, gb};
  int64_t numels[] = {N0, N1};
  int64_t shape0[] = {10, 100}, shape1[] = {N1};
  const int64_t* shapes[] = {shape0, shape1};
  int ndims[] = {2, 1};
  CHECK(optfuse_optimizer_add_group(opt, 2, params, grads, numels, shapes, ndims,
                                    "{\"weight_decay\":0.0}"));
  for (int step = 0; step < 3; ++step) {
    CHECK(optfuse_optimizer_set_hyper(opt, 0, "lr", 1e-2 / (step + 1)));
    CHECK(optfuse_optimizer_step(opt));
  }
  /* Adam moves each element by about lr per step against the gradient's sign. */
  printf("b[0] after 3 steps: %.6f (expected about %.6f)\n", b[0], 1e-2 * (1 + 0.5 + 1.0 / 3));
  if (fabsf(b[0] - 0.018333f) > 1e-4f) return 1;

  /* An invalid value is rejected with a message and changes nothing. */
  if (optfuse_optimizer_set_hyper(opt, 0, "lr", -1.0) != OPTFUSE_ERR_INVALID) return 1;
  printf("rejected as expected: %s\n", optfuse_last_error());

  optfuse_counters c;
  CHECK(optfuse_engine_counters(engine, &c));
  /* One kernel serves both tensors: compiled here, or loaded from the disk cache by a rerun. */
  printf("kernels compiled: %lld, from the disk cache: %lld, lookups: %lld\n",
         (long long)c.compiles, (long long)c.disk_hits, (long long)c.lookups);
  optfuse_optimizer_destroy(opt);
  optfuse_engine_destroy(engine);
  return c.compiles == 1 || (c.compiles == 0 && c.disk_hits >= 1) ? 0 : 1;
}
