/* A fixed pool of CPU threads that runs one data-parallel loop at a time.
 *
 * Every kernel the CPU backend generates is a function of a task range
 * [task_begin, task_end); the pool splits [0, ntasks) into contiguous
 * ranges, one per thread, and returns when all of them are done.  The
 * calling thread takes the first range itself, so a pool of N threads owns
 * N - 1 pthreads and a pool of one runs everything inline.
 *
 * There is no global state: each session creates its own pool.  A pool is
 * driven by one thread at a time (the thread that runs the session).
 */
#ifndef SMELT_THREADPOOL_H
#define SMELT_THREADPOOL_H

#include <stdint.h>

#include "ir/status.h"

typedef struct RtPool RtPool;

/* The body of a parallel loop: process tasks [begin, end). */
typedef void (*RtTaskFn)(void *ctx, int64_t begin, int64_t end);

/* Creates a pool of `nthreads` threads of execution (the caller included),
 * nthreads >= 1.  Owned by the caller; released with rt_pool_destroy. */
smelt_status rt_pool_create(int nthreads, RtPool **out_pool) SMELT_MUST_USE;
/* Stops and joins the workers.  NULL is allowed. */
void rt_pool_destroy(RtPool *pool);
int rt_pool_threads(const RtPool *pool);

/* Calls fn on disjoint contiguous ranges covering [0, ntasks), on at most
 * min(max_parts, threads, ntasks) threads, and returns when every range is
 * done.  max_parts <= 0 means no limit beyond the pool's size.  Nothing is
 * called when ntasks <= 0. */
void rt_pool_parallel_for(RtPool *pool, int64_t ntasks, int max_parts, RtTaskFn fn, void *ctx);

/* CLOCK_MONOTONIC in nanoseconds, and a spin-wait hint to the CPU (pause):
 * for the bounded spins before a thread sleeps (here and runtime/comm.c). */
int64_t rt_now_ns(void);
static inline void rt_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* The number of CPUs this process may run on (at least 1). */
int rt_cpu_count(void);

#endif
