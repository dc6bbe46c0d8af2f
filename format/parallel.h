/* Work over large byte ranges (checksums of weights, assembling merged
 * weights) spread over the machine's cores: a 700 MB model is checked in
 * a fraction of the time one core takes.  No pool is kept: threads are
 * started per call and joined before it returns, which costs tens of
 * microseconds against jobs of tens of milliseconds; when a thread cannot
 * be started its share runs on the caller's.  Nothing here allocates
 * state that outlives a call. */
#ifndef SMELT_FMT_PARALLEL_H
#define SMELT_FMT_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

/* How many threads a job over `bytes` bytes is worth: one per 4 MB, at
 * most the online CPUs and 16 (SMELT_FMT_THREADS overrides the cap). */
int fmt_parallel_threads(uint64_t bytes);
/* Calls fn(ctx, i) for every 0 <= i < ntasks, on up to nthreads threads
 * (the caller's included); tasks are taken in order by whichever thread
 * is free.  Returns when all are done. */
void fmt_parallel_for(int nthreads, int ntasks, void (*fn)(void *ctx, int task), void *ctx);
/* CRC-32C (fmt_crc32c) of n bytes, computed in pieces on up to
 * fmt_parallel_threads(n) threads and joined with fmt_crc32c_combine. */
uint32_t fmt_crc32c_parallel(const void *data, size_t n);
/* memcpy(dst, src, n) in pieces on up to fmt_parallel_threads(n) threads:
 * copying a weight out of a mapped file into fresh memory is mostly page
 * faults, which the cores then take side by side. */
void fmt_parallel_copy(void *dst, const void *src, size_t n);

#endif
