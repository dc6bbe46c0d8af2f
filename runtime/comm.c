/* In-process collectives and the threads that run the ranks (comm.h). */
#include "runtime/comm.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/threadpool.h"

#define RT_MAX_RANKS 64

/* Waits spin first, as the thread pool's do (threadpool.c): waking a
 * sleeping thread costs tens of microseconds, a collective of a small
 * model a few.  With more ranks than cores a waiting rank yields its core
 * instead of pausing (the rank it waits for may need it). */
#define SPIN_NS 100000


/* Spins while *a == old (and *stop < 0 when given), for at most
 * spin_ns, yielding the core between looks when `yield`; whether *a
 * changed. */
static bool spin_while(atomic_uint *a, unsigned old, atomic_int *stop, int64_t spin_ns, bool yield) {
  int64_t deadline = 0;
  for (unsigned i = 0;; i++) {
    if (atomic_load_explicit(a, memory_order_acquire) != old) return true;
    if (stop && atomic_load_explicit(stop, memory_order_acquire) >= 0) return false;
    if (i % 64 == 0) {
      int64_t t = rt_now_ns();
      if (!deadline) deadline = t + spin_ns;
      else if (t > deadline) return false;
    }
    if (yield) sched_yield();
    else rt_cpu_relax();
  }
}

struct RtComm {
  int n;
  int64_t spin_ns;
  bool yield;          /* more ranks than cores */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_int count;     /* ranks arrived at the current barrier */
  atomic_uint gen;      /* barriers passed */
  atomic_int sleepers;  /* ranks blocked on cv */
  atomic_int failed;    /* the first rank that failed in this step, -1 none */
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
  c->spin_ns = SPIN_NS;
  c->yield = nranks > rt_cpu_count();
  atomic_init(&c->failed, -1);
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
  atomic_store(&c->failed, -1);
  atomic_store(&c->count, 0);
}

void rt_comm_fail(RtComm *c, int rank) {
  int none = -1;
  atomic_compare_exchange_strong(&c->failed, &none, rank);
  pthread_mutex_lock(&c->mu);
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

int rt_comm_failed_rank(const RtComm *c) { return atomic_load(&((RtComm *)c)->failed); }

/* Waits until every rank has arrived; false when a rank failed.  The last
 * to arrive resets the count and advances the generation (both before any
 * rank can leave, so the next barrier starts clean); the others spin on
 * the generation, then sleep.  A sleeper counts itself in before it looks
 * at the generation a last time, and the last arrival looks at the
 * sleepers after it advanced the generation (both sequentially
 * consistent), so one of the two sees the other: no wake-up is lost. */
static bool barrier(RtComm *c) {
  if (atomic_load(&c->failed) >= 0) return false;
  unsigned gen = atomic_load(&c->gen);
  if (atomic_fetch_add(&c->count, 1) == c->n - 1) {
    atomic_store(&c->count, 0);
    atomic_fetch_add(&c->gen, 1);
    if (atomic_load(&c->sleepers) > 0) {
      pthread_mutex_lock(&c->mu);
      pthread_cond_broadcast(&c->cv);
      pthread_mutex_unlock(&c->mu);
    }
    return true;
  }
  if (!spin_while(&c->gen, gen, &c->failed, c->spin_ns, c->yield)) {
    pthread_mutex_lock(&c->mu);
    atomic_fetch_add(&c->sleepers, 1);
    while (atomic_load(&c->gen) == gen && atomic_load(&c->failed) < 0) pthread_cond_wait(&c->cv, &c->mu);
    atomic_fetch_sub(&c->sleepers, 1);
    pthread_mutex_unlock(&c->mu);
  }
  return atomic_load(&c->gen) != gen;
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
  int64_t spin_ns;
  bool yield;
  pthread_t *threads;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  atomic_uint step;     /* steps handed out */
  atomic_int pending;   /* ranks of the current step still running */
  atomic_int sleepers;  /* workers blocked on go */
  atomic_bool quit;
  RtRankFn fn;
  void *ctx;
  smelt_status *st; /* per rank */
};

typedef struct {
  RtCrew *c;
  int rank;
} Worker;

/* Workers wait for the next step as the barrier waits (spin, then sleep;
 * the same ordering argument); the step's job is written before the step
 * number is advanced (release), and read after it is seen (acquire). */
static void *worker(void *arg) {
  Worker w = *(Worker *)arg;
  free(arg);
  RtCrew *c = w.c;
  unsigned seen = 0;
  for (;;) {
    if (!spin_while(&c->step, seen, NULL, c->spin_ns, c->yield)) {
      pthread_mutex_lock(&c->mu);
      atomic_fetch_add(&c->sleepers, 1);
      while (atomic_load(&c->step) == seen && !atomic_load(&c->quit)) pthread_cond_wait(&c->go, &c->mu);
      atomic_fetch_sub(&c->sleepers, 1);
      pthread_mutex_unlock(&c->mu);
    }
    if (atomic_load(&c->quit)) break;
    seen = atomic_load(&c->step);
    smelt_status st = c->fn(c->ctx, w.rank);
    c->st[w.rank] = st;
    if (atomic_fetch_sub(&c->pending, 1) == 1) {
      pthread_mutex_lock(&c->mu);
      pthread_cond_broadcast(&c->done);
      pthread_mutex_unlock(&c->mu);
    }
  }
  return NULL;
}

smelt_status rt_crew_create(int nranks, RtCrew **out_crew) {
  *out_crew = NULL;
  if (nranks < 1 || nranks > RT_MAX_RANKS)
    return st_error(ST_INVALID_INPUT, "%d ranks (1 to %d)", nranks, RT_MAX_RANKS);
  RtCrew *c = calloc(1, sizeof *c);
  if (!c) return st_error(ST_NO_MEMORY, "out of memory starting the ranks' threads");
  c->n = nranks;
  c->spin_ns = SPIN_NS;
  c->yield = nranks > rt_cpu_count();
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
  atomic_store(&c->quit, true);
  atomic_fetch_add(&c->step, 1);
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
  c->fn = fn;
  c->ctx = ctx;
  for (int r = 0; r < c->n; r++) c->st[r] = NULL;
  atomic_store(&c->pending, c->n - 1);
  atomic_fetch_add(&c->step, 1);
  if (atomic_load(&c->sleepers) > 0) {
    pthread_mutex_lock(&c->mu);
    pthread_cond_broadcast(&c->go);
    pthread_mutex_unlock(&c->mu);
  }
  c->st[0] = fn(ctx, 0);
  /* the others: spin on the count, then sleep (the last worker broadcasts
   * under the mutex after its decrement, so a sleeper cannot miss it) */
  int64_t deadline = 0;
  for (unsigned i = 0; atomic_load(&c->pending) > 0; i++) {
    if (i % 64 == 0) {
      int64_t t = rt_now_ns();
      if (!deadline) deadline = t + c->spin_ns;
      else if (t > deadline) break;
    }
    if (c->yield) sched_yield();
    else rt_cpu_relax();
  }
  if (atomic_load(&c->pending) > 0) {
    pthread_mutex_lock(&c->mu);
    while (atomic_load(&c->pending) > 0) pthread_cond_wait(&c->done, &c->mu);
    pthread_mutex_unlock(&c->mu);
  }
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
