/* Session state through the public C API, on the CPU.
 *
 * A small model keeps an accumulator and a cache as state:
 *   acc  [4]      read only (set through the API), added to the output;
 *   cache [8, 4]  rows written in place at positions pos by scatter;
 *   y = sum over rows of the updated cache + acc  ([4]).
 * Checked by hand-worked values: zero at creation, writes persist across
 * runs and across the two specialisations (seq = 1 and seq = 3) of one
 * bundle, read_state sees exactly the rows written, write_state and
 * reset_state take effect, and the refusals: an unknown state, a wrong
 * size, a NULL pointer, a position beyond the capacity (with a message that
 * names the input, the value and the capacity, and no write). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "include/smelt.h"
#include "include/smelt_compile.h"
#include "tests/unit/check.h"

static const char MODEL[] =
    "smelt: 1\n"
    "name: acc\n"
    "dtype: f32\n"
    "dims: {seq: 3}\n"
    "inputs:\n"
    "  x: {shape: [seq, 4]}\n"
    "  pos: {shape: [seq], dtype: i32}\n"
    "state:\n"
    "  acc: {shape: [4]}\n"
    "  cache: {shape: [8, 4]}\n"
    "nodes:\n"
    "  - {out: c2, op: scatter, in: [cache, pos, x], axis: 0}\n"
    "  - {out: s, op: sum, in: [c2], axes: [0]}\n"
    "  - {out: y, op: add, in: [s, acc]}\n"
    "outputs: [y]\n";

static smelt_status run(smelt_session *s, const float *x, const int32_t *pos, int n, float *y) {
  int64_t d2[2] = {n, 4}, d1 = n;
  smelt_status st = smelt_session_bind_input_shaped(s, "x", x, 2, d2, (size_t)n * 16);
  if (!st) st = smelt_session_bind_input_shaped(s, "pos", pos, 1, &d1, (size_t)n * 4);
  if (!st) st = smelt_session_bind_output(s, "y", y, 16);
  if (!st) st = smelt_session_run(s);
  return st;
}

static bool has(smelt_status st, const char *text) {
  bool ok = st && strstr(smelt_status_message(st), text) != NULL;
  if (st && !ok) fprintf(stderr, "message was: %s\n", smelt_status_message(st));
  smelt_status_free(st);
  return ok;
}

int main(void) {
  char dir[] = "/tmp/smelt_state_XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char model[128], bundle[128];
  snprintf(model, sizeof model, "%s/acc.yaml", dir);
  snprintf(bundle, sizeof bundle, "%s/acc.smelt", dir);
  FILE *f = fopen(model, "w");
  fputs(MODEL, f);
  fclose(f);
  smelt_compile_options co = {.targets = "cpu", .dims = "seq=1,3"};
  CHECK_OK(smelt_compile(model, &co, bundle));
  smelt_bundle *b = NULL;
  CHECK_OK(smelt_bundle_open(bundle, &b));
  smelt_session *s = NULL;
  if (b) CHECK_OK(smelt_session_create(b, "cpu", NULL, &s));
  if (!s) return check_done("test_state_api");

  CHECK(smelt_session_num_states(s) == 2);
  smelt_tensor_info ti;
  smelt_session_state_info(s, 1, &ti);
  CHECK(strcmp(ti.name, "cache") == 0 && ti.rank == 2 && ti.dims[0] == 8 && ti.dims[1] == 4 && ti.dtype == SMELT_F32);

  float cache[32], y[4];
  CHECK_OK(smelt_session_read_state(s, "cache", cache, sizeof cache));
  bool zero = true;
  for (int i = 0; i < 32; i++) zero = zero && cache[i] == 0;
  CHECK(zero); /* zero at creation */

  /* prefill: rows 0..2 get 1, 2, 3 in every column */
  float x3[12];
  for (int i = 0; i < 12; i++) x3[i] = (float)(i / 4 + 1);
  int32_t p3[3] = {0, 1, 2};
  CHECK_OK(run(s, x3, p3, 3, y));
  CHECK(y[0] == 6 && y[3] == 6);
  CHECK(smelt_session_specialisation(s) == 1);
  /* decode (the seq = 1 specialisation) sees the same cache: row 3 = 10 */
  float x1[4] = {10, 10, 10, 10};
  int32_t p1[1] = {3};
  CHECK_OK(run(s, x1, p1, 1, y));
  CHECK(smelt_session_specialisation(s) == 0);
  CHECK(y[0] == 16 && y[2] == 16);
  /* rewriting a row replaces it, in place */
  float x1b[4] = {-2, -2, -2, -2};
  p1[0] = 1;
  CHECK_OK(run(s, x1b, p1, 1, y));
  CHECK(y[0] == 12); /* 1 - 2 + 3 + 10 */
  CHECK_OK(smelt_session_read_state(s, "cache", cache, sizeof cache));
  CHECK(cache[0] == 1 && cache[4] == -2 && cache[8] == 3 && cache[12] == 10 && cache[16] == 0 && cache[31] == 0);

  /* write_state: acc is added to the output */
  float acc[4] = {100, 200, 300, 400};
  CHECK_OK(smelt_session_write_state(s, "acc", acc, sizeof acc));
  float zx[4] = {0, 0, 0, 0};
  p1[0] = 7;
  CHECK_OK(run(s, zx, p1, 1, y));
  CHECK(y[0] == 112 && y[3] == 412);

  /* refusals */
  CHECK(has(smelt_session_read_state(s, "nope", cache, sizeof cache), "no state named 'nope' (the states are: acc, cache)"));
  CHECK(has(smelt_session_write_state(s, "cache", cache, 16), "state 'cache' is f32[8,4] (128 bytes); the memory given has 16 bytes"));
  CHECK(has(smelt_session_read_state(s, "cache", NULL, sizeof cache), "NULL data"));
  p1[0] = 8;
  float big[4] = {999, 999, 999, 999};
  CHECK(has(run(s, big, p1, 1, y), "input 'pos'[0] = 8 is outside [0, 8), the capacity of 'cache'"));
  p1[0] = -1;
  CHECK(has(run(s, big, p1, 1, y), "input 'pos'[0] = -1 is outside [0, 8)"));
  CHECK_OK(smelt_session_read_state(s, "cache", cache, sizeof cache));
  bool untouched = true;
  for (int i = 0; i < 32; i++) untouched = untouched && cache[i] != 999;
  CHECK(untouched); /* the refused runs wrote nothing */

  /* reset: everything zero again */
  CHECK_OK(smelt_session_reset_state(s));
  p1[0] = 0;
  CHECK_OK(run(s, zx, p1, 1, y));
  CHECK(y[0] == 0 && y[3] == 0);

  /* a second session has state of its own */
  smelt_session *s2 = NULL;
  CHECK_OK(smelt_session_create(b, "cpu", NULL, &s2));
  if (s2) {
    p1[0] = 2;
    CHECK_OK(run(s2, x1, p1, 1, y));
    CHECK(y[0] == 10);
    CHECK_OK(run(s, zx, p1, 1, y));
    CHECK(y[0] == 0); /* s did not see s2's write */
    smelt_session_destroy(s2);
  }
  smelt_session_destroy(s);
  smelt_bundle_close(b);
  remove(model);
  remove(bundle);
  rmdir(dir);
  return check_done("test_state_api");
}
