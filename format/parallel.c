/* Parallel loops over bytes (format/parallel.h). */
#include "format/parallel.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/bundle.h"

#define FMT_PAR_MAX_THREADS 16
#define FMT_PAR_BYTES_PER_THREAD ((uint64_t)4 << 20)
#define FMT_CRC_PIECE ((size_t)2 << 20)

int fmt_parallel_threads(uint64_t bytes) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int cap = FMT_PAR_MAX_THREADS;
  const char *e = getenv("SMELT_FMT_THREADS");
  if (e && *e) cap = atoi(e);
  if (cap < 1) cap = 1;
  if (cpus < 1) cpus = 1;
  if (cap > cpus) cap = (int)cpus;
  uint64_t want = bytes / FMT_PAR_BYTES_PER_THREAD;
  if (want < 1) want = 1;
  return want < (uint64_t)cap ? (int)want : cap;
}

typedef struct {
  void (*fn)(void *ctx, int task);
  void *ctx;
  int ntasks;
  int next; /* taken with __atomic_fetch_add */
} Loop;

static void *worker(void *arg) {
  Loop *l = arg;
  for (;;) {
    int i = __atomic_fetch_add(&l->next, 1, __ATOMIC_RELAXED);
    if (i >= l->ntasks) break;
    l->fn(l->ctx, i);
  }
  return NULL;
}

void fmt_parallel_for(int nthreads, int ntasks, void (*fn)(void *ctx, int task), void *ctx) {
  Loop l = {fn, ctx, ntasks, 0};
  if (nthreads > ntasks) nthreads = ntasks;
  if (nthreads > FMT_PAR_MAX_THREADS) nthreads = FMT_PAR_MAX_THREADS;
  pthread_t t[FMT_PAR_MAX_THREADS];
  int started = 0;
  for (int i = 1; i < nthreads; i++) {
    if (pthread_create(&t[started], NULL, worker, &l) != 0) break;
    started++;
  }
  worker(&l);
  for (int i = 0; i < started; i++) pthread_join(t[i], NULL);
}

typedef struct {
  const unsigned char *p;
  size_t n;
  uint32_t *crc;
} CrcJob;

static void crc_piece(void *ctx, int i) {
  const CrcJob *j = ctx;
  size_t off = (size_t)i * FMT_CRC_PIECE, len = j->n - off < FMT_CRC_PIECE ? j->n - off : FMT_CRC_PIECE;
  j->crc[i] = fmt_crc32c(0, j->p + off, len);
}

uint32_t fmt_crc32c_parallel(const void *data, size_t n) {
  int threads = fmt_parallel_threads(n);
  size_t npieces = (n + FMT_CRC_PIECE - 1) / FMT_CRC_PIECE;
  uint32_t *crc = threads > 1 && npieces > 1 && npieces < (size_t)1 << 30 ? malloc(npieces * sizeof *crc) : NULL;
  if (!crc) return fmt_crc32c(0, data, n);
  CrcJob j = {data, n, crc};
  fmt_parallel_for(threads, (int)npieces, crc_piece, &j);
  uint32_t c = crc[0];
  for (size_t i = 1; i < npieces; i++) {
    size_t len = n - i * FMT_CRC_PIECE < FMT_CRC_PIECE ? n - i * FMT_CRC_PIECE : FMT_CRC_PIECE;
    c = fmt_crc32c_combine(c, crc[i], len);
  }
  free(crc);
  return c;
}

typedef struct {
  unsigned char *dst;
  const unsigned char *src;
  size_t n;
} CopyJob;

static void copy_piece(void *ctx, int i) {
  const CopyJob *j = ctx;
  size_t off = (size_t)i * FMT_CRC_PIECE, len = j->n - off < FMT_CRC_PIECE ? j->n - off : FMT_CRC_PIECE;
  memcpy(j->dst + off, j->src + off, len);
}

void fmt_parallel_copy(void *dst, const void *src, size_t n) {
  int threads = fmt_parallel_threads(n);
  size_t npieces = (n + FMT_CRC_PIECE - 1) / FMT_CRC_PIECE;
  if (threads < 2 || npieces < 2 || npieces >= (size_t)1 << 30) {
    if (n) memcpy(dst, src, n);
    return;
  }
  CopyJob j = {dst, src, n};
  fmt_parallel_for(threads, (int)npieces, copy_piece, &j);
}
