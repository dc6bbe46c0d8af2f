/* The in-process collectives and rank threads (runtime/comm.h) on
 * hand-worked values: all_reduce sums in rank order (f32, in place or not,
 * and f16/bf16 through a wider sum), all_gather concatenates block by
 * block, a failing rank stops the others instead of hanging them, and the
 * crew runs many steps in a row.  The end-to-end check that sharded models
 * equal unsharded ones is tests/e2e/test_tp.py. */
#include <stdint.h>

#include "runtime/comm.h"
#include "tests/unit/check.h"

enum { RANKS = 3, COUNT = 37 };

typedef struct {
  RtComm *comm;
  float in[RANKS][COUNT], out[RANKS][COUNT];
  uint16_t h[RANKS][COUNT];
  unsigned char gin[RANKS][2][5], gout[RANKS][2 * RANKS][5];
  bool inplace;
  int fail_rank; /* -1: none */
} Ctx;

static smelt_status reduce_step(void *p, int r) {
  Ctx *c = p;
  if (r == c->fail_rank) {
    rt_comm_fail(c->comm, r);
    return st_error(ST_INVALID_INPUT, "rank %d failed on purpose", r);
  }
  float *out = c->inplace ? c->in[r] : c->out[r];
  RETURN_IF_ERROR(rt_comm_all_reduce(c->comm, r, c->in[r], out, COUNT, DT_F32));
  RETURN_IF_ERROR(rt_comm_all_reduce(c->comm, r, c->h[r], c->h[r], COUNT, DT_F16));
  return rt_comm_all_gather(c->comm, r, c->gin[r], c->gout[r], 2, 5);
}

static void fill(Ctx *c) {
  for (int r = 0; r < RANKS; r++)
    for (int i = 0; i < COUNT; i++) {
      c->in[r][i] = (float)(100 * r + i) + 0.25f;
      c->out[r][i] = -1;
      dt_store(DT_F16, c->h[r], (size_t)i, 0.5 * (r + 1) + i); /* exact in f16 */
    }
  for (int r = 0; r < RANKS; r++)
    for (int o = 0; o < 2; o++)
      for (int b = 0; b < 5; b++) c->gin[r][o][b] = (unsigned char)(100 * o + 10 * r + b);
  memset(c->gout, 0xee, sizeof c->gout);
}

static void test_values(RtCrew *crew, Ctx *c, bool inplace) {
  fill(c);
  c->inplace = inplace;
  c->fail_rank = -1;
  rt_comm_begin(c->comm);
  CHECK_OK(rt_crew_run(crew, c->comm, reduce_step, c));
  for (int r = 0; r < RANKS; r++) {
    const float *y = inplace ? c->in[r] : c->out[r];
    for (int i = 0; i < COUNT; i++) {
      /* (0 + i + .25) + (100 + i + .25) + (200 + i + .25) */
      CHECK(y[i] == (float)(300 + 3 * i) + 0.75f);
      /* .5 + 1 + 1.5 + 3i */
      CHECK(dt_load(DT_F16, c->h[r], (size_t)i) == 3.0 + 3.0 * i);
    }
    for (int o = 0; o < 2; o++)
      for (int q = 0; q < RANKS; q++)
        for (int b = 0; b < 5; b++) CHECK(c->gout[r][o * RANKS + q][b] == 100 * o + 10 * q + b);
  }
}

static void test_failure(RtCrew *crew, Ctx *c) {
  fill(c);
  c->fail_rank = 1;
  rt_comm_begin(c->comm);
  smelt_status st = rt_crew_run(crew, c->comm, reduce_step, c);
  CHECK(st != NULL);
  if (st) {
    CHECK(strstr(st_message(st), "rank 1 failed on purpose") != NULL);
    st_free(st);
  }
  CHECK(rt_comm_failed_rank(c->comm) == 1);
  /* the next step starts clean */
  test_values(crew, c, false);
}

int main(void) {
  RtCrew *crew = NULL;
  Ctx *c = calloc(1, sizeof *c);
  CHECK(c != NULL);
  if (!c) return check_done("test_comm");
  CHECK_OK(rt_comm_create(RANKS, &c->comm));
  CHECK_OK(rt_crew_create(RANKS, &crew));
  if (c->comm && crew) {
    test_values(crew, c, false);
    test_values(crew, c, true);
    test_failure(crew, c);
    for (int i = 0; i < 200; i++) test_values(crew, c, i % 2);
  }
  smelt_status bad = rt_comm_create(0, &(RtComm *){NULL});
  CHECK(bad != NULL);
  st_free(bad);
  smelt_status notfloat = NULL;
  int32_t x[RANKS] = {0};
  RtComm *one = NULL;
  CHECK_OK(rt_comm_create(1, &one));
  if (one) {
    notfloat = rt_comm_all_reduce(one, 0, x, x, 1, DT_I32);
    CHECK(notfloat != NULL);
    st_free(notfloat);
    float f = 2.5f, g = 0;
    CHECK_OK(rt_comm_all_reduce(one, 0, &f, &g, 1, DT_F32));
    CHECK(g == 2.5f);
  }
  rt_comm_destroy(one);
  rt_crew_destroy(crew);
  rt_comm_destroy(c->comm);
  free(c);
  return check_done("test_comm");
}
