/* The CPU thread pool: fork-join over contiguous task ranges.
 *
 * A loop is published as a job (fn, ctx, ntasks, nparts) together with a new
 * generation number, under the pool's mutex.  Worker w (1 .. N-1) waits for
 * the generation to change, copies the job under the mutex and, when w <
 * nparts, runs range w; the caller runs range 0 and then waits until the
 * count of unfinished worker ranges drops to zero.  Ranges are contiguous,
 * so neighbouring tasks (rows, tiles) stay on one core, and their sizes
 * differ by at most one task.
 *
 * Kernels of a small model take microseconds, about the cost of waking a
 * sleeping thread, so both sides first spin for a short while on the atomic
 * generation/pending counters and only then sleep on a condition variable.
 * The spin is bounded in time (SPIN_NS), so an idle pool soon sleeps.
 *
 * Why the job is copied under the mutex: a worker that had no range in one
 * loop may wake late, when the caller is already publishing the next job;
 * reading the fields under the lock gives it a consistent (generation, job)
 * pair.  A worker that has a range cannot miss its job, because the caller
 * does not publish the next one until every range is done.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "threadpool.h"

/* How long a thread spins before it sleeps.  Waking a sleeping thread costs
 * from a few to ~100 microseconds (measured: 80 us on a 2-core VM), while
 * the kernels of one run follow each other within microseconds; 100 us of
 * spinning after each loop catches the next one and bounds the waste. */
#define SPIN_NS 100000

int64_t rt_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spin until the generation differs from `old` / the count drops to zero,
 * for at most SPIN_NS; they return whether the wait is over. */
static bool spin_generation(atomic_uint_fast64_t *a, uint_fast64_t old) {
  int64_t deadline = 0;
  for (unsigned i = 0;; i++) {
    if (atomic_load_explicit(a, memory_order_acquire) != old) return true;
    if (i % 64 == 0) {
      int64_t t = rt_now_ns();
      if (!deadline) deadline = t + SPIN_NS;
      else if (t > deadline) return false;
    }
    rt_cpu_relax();
  }
}

static bool spin_zero(atomic_int *a) {
  int64_t deadline = 0;
  for (unsigned i = 0;; i++) {
    if (atomic_load_explicit(a, memory_order_acquire) <= 0) return true;
    if (i % 64 == 0) {
      int64_t t = rt_now_ns();
      if (!deadline) deadline = t + SPIN_NS;
      else if (t > deadline) return false;
    }
    rt_cpu_relax();
  }
}

typedef struct {
  RtTaskFn fn;
  void *ctx;
  int64_t ntasks;
  int nparts;
} Job;

typedef struct {
  RtPool *pool;
  int id; /* 1 .. nthreads-1; range 0 belongs to the caller */
} Worker;

struct RtPool {
  int nthreads;
  pthread_t *threads;
  Worker *workers;
  int nstarted;
  pthread_mutex_t mu;
  pthread_cond_t wake; /* a new generation (or stop) */
  pthread_cond_t done; /* pending reached zero */
  Job job;             /* guarded by mu */
  bool stop;           /* guarded by mu */
  atomic_uint_fast64_t generation;
  atomic_int pending;  /* worker ranges of the current job not yet finished */
};

int rt_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n >= 1 ? (int)n : 1;
}

int rt_pool_threads(const RtPool *pool) { return pool->nthreads; }

static void run_part(const Job *job, int part) {
  /* The first ntasks % nparts ranges get one task more; no product that
   * could overflow. */
  int64_t q = job->ntasks / job->nparts, r = job->ntasks % job->nparts;
  int64_t b = q * part + (part < r ? part : r);
  int64_t e = b + q + (part < r ? 1 : 0);
  if (b < e) job->fn(job->ctx, b, e);
}

static void *worker_main(void *arg) {
  Worker *w = arg;
  RtPool *p = w->pool;
  uint_fast64_t seen = 0;
  for (;;) {
    spin_generation(&p->generation, seen);
    pthread_mutex_lock(&p->mu);
    while (!p->stop && atomic_load(&p->generation) == seen) pthread_cond_wait(&p->wake, &p->mu);
    if (p->stop) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    seen = atomic_load(&p->generation);
    Job job = p->job;
    pthread_mutex_unlock(&p->mu);
    if (w->id >= job.nparts) continue;
    run_part(&job, w->id);
    if (atomic_fetch_sub(&p->pending, 1) == 1) {
      /* Lock so that the signal cannot fall between the caller's check of
       * pending and its wait. */
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

smelt_status rt_pool_create(int nthreads, RtPool **out_pool) {
  *out_pool = NULL;
  if (nthreads < 1) return st_error(ST_INVALID_INPUT, "thread pool: %d threads (at least 1 needed)", nthreads);
  RtPool *p = calloc(1, sizeof *p);
  if (!p) return st_error(ST_NO_MEMORY, "thread pool: out of memory");
  p->nthreads = nthreads;
  atomic_init(&p->generation, 0);
  atomic_init(&p->pending, 0);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  if (nthreads > 1) {
    p->threads = calloc((size_t)nthreads - 1, sizeof *p->threads);
    p->workers = calloc((size_t)nthreads - 1, sizeof *p->workers);
    if (!p->threads || !p->workers) {
      rt_pool_destroy(p);
      return st_error(ST_NO_MEMORY, "thread pool: out of memory");
    }
  }
  for (int i = 0; i < nthreads - 1; i++) {
    p->workers[i] = (Worker){.pool = p, .id = i + 1};
    int err = pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]);
    if (err) {
      rt_pool_destroy(p);
      return st_error(ST_NO_MEMORY, "thread pool: cannot start thread %d of %d (error %d)", i + 2, nthreads, err);
    }
    p->nstarted++;
  }
  *out_pool = p;
  return NULL;
}

void rt_pool_destroy(RtPool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nstarted; i++) pthread_join(p->threads[i], NULL);
  pthread_cond_destroy(&p->done);
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->mu);
  free(p->threads);
  free(p->workers);
  free(p);
}

void rt_pool_parallel_for(RtPool *p, int64_t ntasks, int max_parts, RtTaskFn fn, void *ctx) {
  if (ntasks <= 0) return;
  int64_t parts = p->nthreads;
  if (max_parts > 0 && max_parts < parts) parts = max_parts;
  if (ntasks < parts) parts = ntasks;
  if (parts <= 1) {
    fn(ctx, 0, ntasks);
    return;
  }
  Job job = {.fn = fn, .ctx = ctx, .ntasks = ntasks, .nparts = (int)parts};
  atomic_store(&p->pending, (int)parts - 1);
  pthread_mutex_lock(&p->mu);
  p->job = job;
  atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);

  run_part(&job, 0);

  if (!spin_zero(&p->pending)) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
}
