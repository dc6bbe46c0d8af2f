/* A tensor-parallel session through the public C API (smelt_compile with
 * tp = 2, then the unchanged session calls), against the same model on one
 * rank: examples/tiny_lm.yaml (2 kv heads: at 2 ranks its KV caches are
 * stored split by kv heads, one per rank).
 *   - a prefill of 3 tokens gives the one-rank logits and next token;
 *   - state_info gives the whole cache shape, [1, 2, 128, 16], and
 *     read_state the whole cache, equal to one rank's (the ranks' parts
 *     joined along the heads);
 *   - write_state of one rank's cache into a fresh 2-rank session, then a
 *     decode step there, gives one rank's decode step;
 *   - reset_state zeroes every rank's part; a wrong size is refused with
 *     the whole shape in the message.
 * Skipped (exit 77) without the example's weights file. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/smelt.h"
#include "include/smelt_compile.h"
#include "compiler/driver.h"
#include "tests/unit/check.h"

#define VOCAB 256
#define CACHE (1 * 2 * 128 * 16)

static smelt_bundle *compile(int tp) {
  /* one ranged specialisation: the prefill's 3 tokens and the decode's 1 */
  smelt_compile_options o = {.targets = "cpu", .dims = "seq=1..3", .tp = tp, .no_cache = 1};
  void *buf = NULL;
  size_t len = 0;
  smelt_bundle *b = NULL;
  CHECK_OK(sc_compile_model_to_memory("examples/tiny_lm.yaml", &o, &buf, &len));
  if (buf) CHECK_OK(smelt_bundle_open_memory(buf, len, &b));
  free(buf);
  return b;
}

static void step(smelt_session *s, const int32_t *ids, const int32_t *pos, int n, float *logits, int32_t *next) {
  int64_t d = n;
  CHECK_OK(smelt_session_bind_input_shaped(s, "ids", ids, 1, &d, (size_t)n * 4));
  CHECK_OK(smelt_session_bind_input_shaped(s, "pos", pos, 1, &d, (size_t)n * 4));
  CHECK_OK(smelt_session_bind_output(s, "logits", logits, VOCAB * 4));
  CHECK_OK(smelt_session_bind_output(s, "next", next, 4));
  CHECK_OK(smelt_session_run(s));
}

static double rel(const float *a, const float *b, int n) {
  double d = 0, r = 0;
  for (int i = 0; i < n; i++) d += (a[i] - b[i]) * (double)(a[i] - b[i]), r += (double)b[i] * b[i];
  return sqrt(d / (r > 0 ? r : 1));
}

int main(void) {
  if (access("examples/tiny_llama.safetensors", R_OK) != 0) {
    printf("SKIP: examples/tiny_llama.safetensors is missing (python3 examples/gen_weights.py writes it)\n");
    return CHECK_SKIPPED;
  }
  smelt_bundle *b1 = compile(0), *b2 = compile(2);
  if (!b1 || !b2) return check_done("test_tp_session");
  smelt_session *s1 = NULL, *s2 = NULL, *s3 = NULL;
  CHECK_OK(smelt_session_create(b1, "cpu", NULL, &s1));
  CHECK_OK(smelt_session_create(b2, "cpu", NULL, &s2));
  CHECK_OK(smelt_session_create(b2, "cpu", NULL, &s3));
  if (!s1 || !s2 || !s3) return check_done("test_tp_session");

  static float l1[VOCAB], l2[VOCAB], c1[CACHE], c2[CACHE];
  int32_t n1 = -1, n2 = -2, ids[3] = {1, 2, 3}, pos[3] = {0, 1, 2};
  step(s1, ids, pos, 3, l1, &n1);
  step(s2, ids, pos, 3, l2, &n2);
  CHECK(rel(l2, l1, VOCAB) < 1e-5);
  CHECK(n1 == n2);

  smelt_tensor_info ti;
  CHECK(smelt_session_num_states(s2) == 4);
  smelt_session_state_info(s2, 0, &ti);
  CHECK(ti.rank == 4 && ti.dims[0] == 1 && ti.dims[1] == 2 && ti.dims[2] == 128 && ti.dims[3] == 16);
  CHECK_OK(smelt_session_read_state(s1, "layer.0/k_cache", c1, sizeof c1));
  CHECK_OK(smelt_session_read_state(s2, "layer.0/k_cache", c2, sizeof c2));
  CHECK(rel(c2, c1, CACHE) < 1e-5);
  double norm = 0;
  for (int i = 0; i < CACHE; i++) norm += fabs(c1[i]);
  CHECK(norm > 0); /* the prefill wrote rows of both heads */

  /* one rank's caches into a fresh two-rank session, then a decode step */
  const char *names[4] = {"layer.0/k_cache", "layer.0/v_cache", "layer.1/k_cache", "layer.1/v_cache"};
  for (int i = 0; i < 4; i++) {
    CHECK_OK(smelt_session_read_state(s1, names[i], c1, sizeof c1));
    CHECK_OK(smelt_session_write_state(s3, names[i], c1, sizeof c1));
  }
  int32_t id = n1, p = 3;
  step(s1, &id, &p, 1, l1, &n1);
  step(s3, &id, &p, 1, l2, &n2);
  CHECK(rel(l2, l1, VOCAB) < 1e-5);
  CHECK(n1 == n2);

  /* reset zeroes every rank's part */
  CHECK_OK(smelt_session_reset_state(s3));
  CHECK_OK(smelt_session_read_state(s3, "layer.1/v_cache", c2, sizeof c2));
  bool zero = true;
  for (int i = 0; i < CACHE; i++) zero = zero && c2[i] == 0;
  CHECK(zero);
  smelt_status bad = smelt_session_read_state(s3, "layer.1/v_cache", c2, sizeof c2 / 2);
  CHECK(bad && strstr(smelt_status_message(bad), "f32[1,2,128,16]") != NULL);
  smelt_status_free(bad);

  /* device lists, checked before any GPU is touched (this machine may
   * have none): malformed, or not one device a rank */
  static const struct {
    const char *device, *want;
  } bad_devices[] = {
      {"cuda:0,", "a trailing comma"},                      {"cuda:0,cpu", "expected a list of CUDA devices"},
      {"cuda,cuda:1", "expected a list of CUDA devices"},  {"cuda:0,,cuda:1", "expected a list of CUDA devices"},
      {"cuda:0,cuda:x", "expected a list of CUDA devices"}, {"cuda:0,cuda:1,cuda:2", "3 devices"},
      {"cuda:0", "runs on 2 GPUs: name them"},
  };
  for (size_t i = 0; i < sizeof bad_devices / sizeof *bad_devices; i++) {
    smelt_session *x = NULL;
    smelt_status st = smelt_session_create(b2, bad_devices[i].device, NULL, &x);
    CHECK(st && !x && strstr(smelt_status_message(st), bad_devices[i].want) != NULL);
    if (st && !strstr(smelt_status_message(st), bad_devices[i].want))
      fprintf(stderr, "%s: %s\n", bad_devices[i].device, smelt_status_message(st));
    smelt_status_free(st);
  }
  /* one rank, a list of two */
  smelt_session *x = NULL;
  smelt_status st = smelt_session_create(b1, "cuda:0,cuda:1", NULL, &x);
  CHECK(st && !x && strstr(smelt_status_message(st), "2 devices") != NULL);
  smelt_status_free(st);

  smelt_session_destroy(s1);
  smelt_session_destroy(s2);
  smelt_session_destroy(s3);
  smelt_bundle_close(b1);
  smelt_bundle_close(b2);
  return check_done("test_tp_session");
}
