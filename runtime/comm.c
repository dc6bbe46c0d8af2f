/* In-process collectives and the threads that run the ranks (comm.h). */
#include "runtime/comm.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define RT_MAX_RANKS 64

struct RtComm {
  int n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int count;           /* ranks arrived at the current barrier */
  unsigned gen;        /* barriers passed */
  int failed;          /* the first rank that failed in this step, -1 none */
  const void *in[RT_MAX_RANKS];
  void *out[RT_MAX_RANKS];
};

smelt_status rt_comm_create(int nranks, RtComm **out_comm) {
  *out_comm = NULL;
  if (nranks < 1 || nranks > RT_MAX_RANKS)
    return st_error(ST_INVALID_INPUT, "%d ranks (1 to %d)", nranks, RT_MAX_RANKS);
  RtComm *c = calloc(1, sizeof *c);
  if (!c) return st_error(ST_NO_MEMORY, "out of memory creating the ranks' communicator");
  c->n = nranks;
  c->failed = -1;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  *out_comm = c;
  return NULL;
}

void rt_comm_destroy(RtComm *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c);
}

void rt_comm_begin(RtComm *c) {
  pthread_mutex_lock(&c->mu);
  c->failed = -1;
  c->count = 0;
  pthread_mutex_unlock(&c->mu);
}

void rt_comm_fail(RtComm *c, int rank) {
  pthread_mutex_lock(&c->mu);
  if (c->failed < 0) c->failed = rank;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int rt_comm_failed_rank(const RtComm *c) {
  RtComm *m = (RtComm *)c;
  pthread_mutex_lock(&m->mu);
  int f = m->failed;
  pthread_mutex_unlock(&m->mu);
  return f;
}

/* Waits until every rank has arrived; false when a rank failed. */
static bool barrier(RtComm *c) {
  pthread_mutex_lock(&c->mu);
  bool ok = c->failed < 0;
  if (ok) {
    unsigned gen = c->gen;
    if (++c->count == c->n) {
      c->count = 0;
      c->gen++;
      pthread_cond_broadcast(&c->cv);
    } else {
      while (gen == c->gen && c->failed < 0) pthread_cond_wait(&c->cv, &c->mu);
      ok = gen != c->gen;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return ok;
}

static smelt_status stopped(int rank) {
  return st_error(ST_INTERNAL, "rank %d stopped: another rank failed", rank);
}

/* Rank r's share of n items: [n r / ranks, n (r + 1) / ranks). */
static void share(size_t n, int r, int ranks, size_t *lo, size_t *hi) {
  *lo = n * (size_t)r / (size_t)ranks;
  *hi = n * (size_t)(r + 1) / (size_t)ranks;
}

smelt_status rt_comm_all_reduce(RtComm *c, int rank, const void *in, void *out, size_t count, DType dt) {
  if (!dt_is_float(dt)) return st_error(ST_INVALID_INPUT, "all_reduce of %s (a float type is summed)", dt_name(dt));
  c->in[rank] = in;
  c->out[rank] = out;
  if (!barrier(c)) return stopped(rank);
  size_t lo, hi, es = dt_size(dt);
  share(count, rank, c->n, &lo, &hi);
  /* this rank's share of the sum, in rank order, into its own out (out
   * may be its in: its share of in is read only here, by this rank) */
  if (dt == DT_F32) {
    float *y = out;
    for (size_t i = lo; i < hi; i++) {
      float s = ((const float *)c->in[0])[i];
      for (int r = 1; r < c->n; r++) s += ((const float *)c->in[r])[i];
      y[i] = s;
    }
  } else {
    for (size_t i = lo; i < hi; i++) {
      double s = dt_load(dt, c->in[0], i);
      for (int r = 1; r < c->n; r++) s += dt_load(dt, c->in[r], i);
      dt_store(dt, out, i, s);
    }
  }
  if (!barrier(c)) return stopped(rank);
  /* the other ranks' shares, from their outs */
  for (int r = 0; r < c->n; r++) {
    if (r == rank) continue;
    size_t a, b;
    share(count, r, c->n, &a, &b);
    if (b > a) memcpy((char *)out + a * es, (const char *)c->out[r] + a * es, (b - a) * es);
  }
  return barrier(c) ? NULL : stopped(rank);
}

smelt_status rt_comm_all_gather(RtComm *c, int rank, const void *in, void *out, size_t outer, size_t block) {
  c->in[rank] = in;
  if (!barrier(c)) return stopped(rank);
  for (size_t o = 0; o < outer; o++)
    for (int r = 0; r < c->n; r++)
      memcpy((char *)out + (o * (size_t)c->n + (size_t)r) * block, (const char *)c->in[r] + o * block, block);
  return barrier(c) ? NULL : stopped(rank);
}

/* ---- the ranks' threads ---- */

struct RtCrew {
  int n;
  pthread_t *threads;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  unsigned step;   /* steps handed out */
  int pending;     /* ranks of the current step still running */
  bool quit;
  RtRankFn fn;
  void *ctx;
  smelt_status *st; /* per rank */
};

typedef struct {
  RtCrew *c;
  int rank;
} Worker;

static void *worker(void *arg) {
  Worker w = *(Worker *)arg;
  free(arg);
  RtCrew *c = w.c;
  unsigned seen = 0;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->quit && c->step == seen) pthread_cond_wait(&c->go, &c->mu);
    if (c->quit) break;
    seen = c->step;
    RtRankFn fn = c->fn;
    void *ctx = c->ctx;
    pthread_mutex_unlock(&c->mu);
    smelt_status st = fn(ctx, w.rank);
    pthread_mutex_lock(&c->mu);
    c->st[w.rank] = st;
    if (--c->pending == 0) pthread_cond_broadcast(&c->done);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

smelt_status rt_crew_create(int nranks, RtCrew **out_crew) {
  *out_crew = NULL;
  if (nranks < 1 || nranks > RT_MAX_RANKS)
    return st_error(ST_INVALID_INPUT, "%d ranks (1 to %d)", nranks, RT_MAX_RANKS);
  RtCrew *c = calloc(1, sizeof *c);
  if (!c) return st_error(ST_NO_MEMORY, "out of memory starting the ranks' threads");
  c->n = nranks;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->go, NULL);
  pthread_cond_init(&c->done, NULL);
  c->threads = calloc((size_t)nranks, sizeof *c->threads);
  c->st = calloc((size_t)nranks, sizeof *c->st);
  if (!c->threads || !c->st) {
    rt_crew_destroy(c);
    return st_error(ST_NO_MEMORY, "out of memory starting the ranks' threads");
  }
  for (int r = 1; r < nranks; r++) {
    Worker *w = malloc(sizeof *w);
    if (w) *w = (Worker){c, r};
    if (!w || pthread_create(&c->threads[r], NULL, worker, w) != 0) {
      free(w);
      rt_crew_destroy(c);
      return st_error(ST_NO_MEMORY, "cannot start the thread of rank %d", r);
    }
    c->started = r;
  }
  *out_crew = c;
  return NULL;
}

void rt_crew_destroy(RtCrew *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->quit = true;
  pthread_cond_broadcast(&c->go);
  pthread_mutex_unlock(&c->mu);
  for (int r = 1; r <= c->started; r++) pthread_join(c->threads[r], NULL);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->go);
  pthread_cond_destroy(&c->done);
  free(c->threads);
  free(c->st);
  free(c);
}

smelt_status rt_crew_run(RtCrew *c, RtComm *comm, RtRankFn fn, void *ctx) {
  pthread_mutex_lock(&c->mu);
  c->fn = fn;
  c->ctx = ctx;
  c->pending = c->n - 1;
  for (int r = 0; r < c->n; r++) c->st[r] = NULL;
  c->step++;
  pthread_cond_broadcast(&c->go);
  pthread_mutex_unlock(&c->mu);
  smelt_status mine = fn(ctx, 0);
  pthread_mutex_lock(&c->mu);
  c->st[0] = mine;
  while (c->pending > 0) pthread_cond_wait(&c->done, &c->mu);
  pthread_mutex_unlock(&c->mu);
  int first = comm ? rt_comm_failed_rank(comm) : -1;
  if (first < 0 || !c->st[first]) {
    first = -1;
    for (int r = 0; r < c->n && first < 0; r++)
      if (c->st[r]) first = r;
  }
  smelt_status st = first >= 0 ? c->st[first] : NULL;
  for (int r = 0; r < c->n; r++)
    if (r != first) st_free(c->st[r]);
  return st;
}
