/* NCCL through dlopen (runtime/nccl.h) on the GPUs this machine has.
 *
 * With every GPU as one rank (1 on a machine of one): communicators made,
 * an all_reduce and an all_gather captured into a CUDA graph on each rank's
 * thread and stream before any other use (as a session's first run does)
 * and the graph replayed twice on new inputs, then the same calls issued
 * eagerly, each against host-computed sums and concatenations.  cuMemcpy2DAsync (rt_cuda_copy_2d_async,
 * all_gather's reordering) against a host copy.  Two ranks on one GPU are
 * refused by name.
 *
 * Without a GPU it exits 77 (skipped); without NCCL too, saying so.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda_driver.h"
#include "runtime/nccl.h"
#include "tests/unit/check.h"

#define MAXR 8
#define COUNT 4099 /* not a multiple of anything NCCL likes */

typedef struct {
  RtNccl *g;
  RtCudaDevice *d;
  int rank, n;
  RtCudaPtr in, sum, cat;
  smelt_status st;
  bool graph;
} Rank;

typedef struct {
  Rank *r;
  bool reduce;
} Op;

static smelt_status enqueue_op(void *ctx, void *stream) {
  const Op *o = ctx;
  Rank *r = o->r;
  if (o->reduce)
    return rt_nccl_all_reduce(r->g, r->rank, (void *)(uintptr_t)r->in, (void *)(uintptr_t)r->sum, COUNT, DT_F32, stream);
  return rt_nccl_all_gather(r->g, r->rank, (void *)(uintptr_t)r->in, (void *)(uintptr_t)r->cat, COUNT * sizeof(float),
                            stream);
}

/* Rank r's input for round k: r + 1 + k + i / COUNT. */
static void fill(float *h, int rank, int k) {
  for (int i = 0; i < COUNT; i++) h[i] = (float)(rank + 1 + k) + (float)i / COUNT;
}

static void *rank_main(void *arg) {
  Rank *r = arg;
  float h[COUNT];
  Op ops[2] = {{r, true}, {r, false}};
  RtCudaLaunch l[2];
  memset(l, 0, sizeof l);
  for (int i = 0; i < 2; i++) l[i] = (RtCudaLaunch){.name = i ? "all_gather" : "all_reduce", .enqueue = enqueue_op,
                                                     .ctx = &ops[i]};
  if (!r->graph) {
    fill(h, r->rank, 0);
    r->st = rt_cuda_upload(r->d, r->in, h, sizeof h);
    if (!r->st) r->st = rt_cuda_launch(r->d, l, 2);
    if (!r->st) r->st = rt_cuda_sync(r->d);
    return NULL;
  }
  RtCudaGraph *gr = NULL;
  r->st = rt_cuda_graph_capture(r->d, l, 2, &gr);
  for (int k = 1; k <= 2 && !r->st; k++) {
    fill(h, r->rank, k);
    r->st = rt_cuda_upload(r->d, r->in, h, sizeof h);
    if (!r->st) r->st = rt_cuda_graph_launch(r->d, gr);
    if (!r->st) r->st = rt_cuda_sync(r->d);
  }
  rt_cuda_graph_destroy(gr);
  return NULL;
}

/* Every rank's sum and concatenation after round k. */
static void expect(Rank *ranks, int n, int k) {
  static float sum[COUNT], cat[MAXR * COUNT], want[COUNT];
  for (int r = 0; r < n; r++) {
    CHECK_OK(rt_cuda_download(ranks[r].d, sum, ranks[r].sum, sizeof sum));
    CHECK_OK(rt_cuda_download(ranks[r].d, cat, ranks[r].cat, sizeof(float) * COUNT * (size_t)n));
    int bad = 0;
    for (int i = 0; i < COUNT; i++) {
      double s = 0;
      for (int q = 0; q < n; q++) s += (float)(q + 1 + k) + (float)i / COUNT;
      bad += sum[i] != (float)s && (sum[i] - s > 1e-4 * s || s - sum[i] > 1e-4 * s);
    }
    for (int q = 0; q < n; q++) {
      fill(want, q, k);
      bad += memcmp(cat + (size_t)q * COUNT, want, sizeof want) != 0;
    }
    if (bad) fprintf(stderr, "round %d, rank %d: %d wrong\n", k, r, bad);
    CHECK(bad == 0);
  }
}

static void run_ranks(Rank *ranks, int n, bool graph) {
  pthread_t th[MAXR];
  for (int r = 0; r < n; r++) {
    ranks[r].graph = graph;
    ranks[r].st = NULL;
    CHECK(pthread_create(&th[r], NULL, rank_main, &ranks[r]) == 0);
  }
  for (int r = 0; r < n; r++) {
    pthread_join(th[r], NULL);
    CHECK_OK(ranks[r].st);
  }
  expect(ranks, n, graph ? 2 : 0);
}

static void test_copy_2d(RtCudaDevice *d) {
  enum { ROWS = 5, W = 12, SP = 16, DP = 40 };
  unsigned char src[ROWS * SP], dst[ROWS * DP], want[ROWS * DP];
  for (int i = 0; i < ROWS * SP; i++) src[i] = (unsigned char)(i * 7 + 1);
  memset(want, 0xee, sizeof want);
  for (int y = 0; y < ROWS; y++) memcpy(want + y * DP + 3, src + y * SP, W);
  RtCudaPtr ds, dd;
  CHECK_OK(rt_cuda_alloc(d, sizeof src, &ds));
  CHECK_OK(rt_cuda_alloc(d, sizeof dst, &dd));
  CHECK_OK(rt_cuda_upload(d, ds, src, sizeof src));
  CHECK_OK(rt_cuda_memset(d, dd, 0xee, sizeof dst));
  CHECK_OK(rt_cuda_copy_2d_async(d, dd + 3, DP, ds, SP, W, ROWS));
  CHECK_OK(rt_cuda_sync(d));
  CHECK_OK(rt_cuda_download(d, dst, dd, sizeof dst));
  CHECK(memcmp(dst, want, sizeof want) == 0);
  rt_cuda_free(d, ds);
  rt_cuda_free(d, dd);
}

int main(void) {
  int count = 0;
  smelt_status st = rt_cuda_device_count(&count);
  if (st || count < 1) {
    printf("SKIP: no CUDA device%s%s\n", st ? ": " : "", st ? st_message(st) : "");
    st_free(st);
    return CHECK_SKIPPED;
  }
  int n = count < MAXR ? count : MAXR, ord[MAXR];
  for (int r = 0; r < n; r++) ord[r] = r;
  /* two ranks on one GPU: NCCL refuses them, so smelt says so first */
  int same[2] = {0, 0};
  RtNccl *g = NULL;
  st = rt_nccl_create(2, same, &g);
  CHECK(st && strstr(st_message(st), "both on cuda:0"));
  st_free(st);
  Rank ranks[MAXR];
  memset(ranks, 0, sizeof ranks);
  for (int r = 0; r < n; r++) {
    ranks[r].rank = r, ranks[r].n = n;
    CHECK_OK(rt_cuda_device_create(r, &ranks[r].d));
    if (!ranks[r].d) return check_done("test_cuda_nccl");
    CHECK_OK(rt_cuda_alloc(ranks[r].d, sizeof(float) * COUNT, &ranks[r].in));
    CHECK_OK(rt_cuda_alloc(ranks[r].d, sizeof(float) * COUNT, &ranks[r].sum));
    CHECK_OK(rt_cuda_alloc(ranks[r].d, sizeof(float) * COUNT * (size_t)n, &ranks[r].cat));
  }
  test_copy_2d(ranks[0].d);
  st = rt_nccl_create(n, ord, &g);
  if (st && st_code(st) == ST_UNSUPPORTED) {
    printf("SKIP: %s\n", st_message(st));
    st_free(st);
    return CHECK_SKIPPED;
  }
  CHECK_OK(st);
  if (g) {
    printf("%s, %d rank(s)\n", rt_nccl_describe(g), n);
    for (int r = 0; r < n; r++) ranks[r].g = g;
    /* captured first, as a session does (its first run captures) */
    run_ranks(ranks, n, true);
    run_ranks(ranks, n, false);
    rt_nccl_destroy(g);
  }
  for (int r = 0; r < n; r++) {
    rt_cuda_free(ranks[r].d, ranks[r].in);
    rt_cuda_free(ranks[r].d, ranks[r].sum);
    rt_cuda_free(ranks[r].d, ranks[r].cat);
    rt_cuda_device_destroy(ranks[r].d);
  }
  return check_done("test_cuda_nccl");
}
