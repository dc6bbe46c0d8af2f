/* smelt bench: how fast each kernel runs, against what the machine can do.
 *
 * The bundle (or a YAML model, compiled in memory first) runs on random
 * inputs: `--warmup` runs untimed, then `--iters` runs in which every kernel
 * is timed on its own (clock_gettime around rt_session_run_kernel) and the
 * whole run too.  Reported times are medians, which one descheduled run
 * does not move.  Each kernel's estimated bytes and FLOPs over its time give
 * achieved GB/s and GFLOP/s; the bytes are set against the host's copy
 * bandwidth, measured once at start as the best of three 256 MiB copies
 * spread over the same number of threads the session uses (a kernel run on
 * N threads is compared with what N threads can copy), counting bytes read
 * plus bytes written as the kernels' estimates do. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "runtime/driver.h"
#include "runtime/threadpool.h"

static const char bench_help[] =
    "usage: smelt bench BUNDLE.smelt|MODEL.yaml [flags]\n"
    "\n"
    "Times every kernel and the whole model on random inputs and reports median times,\n"
    "achieved GB/s and GFLOP/s (from each kernel's estimated bytes and FLOPs) and the\n"
    "fraction of the host's measured copy bandwidth.  A YAML model is compiled first.\n"
    "\n"
    "flags:\n"
    "  --device cpu            where to run (default cpu)\n"
    "  --threads N             worker threads (default: the bundle's, else every core)\n"
    "  --warmup N              untimed runs first (default 3)\n"
    "  --iters N               timed runs (default 20)\n"
    "  --dim NAME=VALUE        (YAML only) override a size from the model's dims\n"
    "  --dtype DTYPE           (YAML only) default element type\n";

#define COPY_BYTES ((size_t)256 << 20)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct {
  char *dst;
  const char *src;
  size_t chunk;
} CopyJob;

static void copy_range(void *ctx, int64_t begin, int64_t end) {
  CopyJob *c = ctx;
  memcpy(c->dst + (size_t)begin * c->chunk, c->src + (size_t)begin * c->chunk, (size_t)(end - begin) * c->chunk);
}

/* Bytes per second (read + written) of the best of three 256 MiB copies on
 * `threads` threads; 0 when the memory or the threads cannot be had. */
static double copy_bandwidth(int threads) {
  char *src = malloc(COPY_BYTES), *dst = malloc(COPY_BYTES);
  RtPool *pool = NULL;
  smelt_status st = rt_pool_create(threads, &pool);
  double best = 0;
  if (!st && src && dst) {
    /* Touch every page first so the timing does not count page faults. */
    memset(src, 1, COPY_BYTES);
    memset(dst, 0, COPY_BYTES);
    CopyJob job = {.dst = dst, .src = src, .chunk = COPY_BYTES / 1024};
    for (int r = 0; r < 3; r++) {
      double t0 = now_s();
      rt_pool_parallel_for(pool, 1024, 0, copy_range, &job);
      double t = now_s() - t0;
      if (t > 0 && 2.0 * (double)COPY_BYTES / t > best) best = 2.0 * (double)COPY_BYTES / t;
    }
  }
  st_free(st);
  rt_pool_destroy(pool);
  free(src);
  free(dst);
  return best;
}

static bool is_yaml(const char *path) {
  size_t n = strlen(path);
  return (n > 5 && strcmp(path + n - 5, ".yaml") == 0) || (n > 4 && strcmp(path + n - 4, ".yml") == 0);
}

static smelt_status open_model(const char *path, const char *dims, const char *dtype, int threads,
                               smelt_bundle **out) {
  if (!is_yaml(path)) return smelt_bundle_open(path, out);
  smelt_compile_options o = {.dims = dims, .dtype = dtype, .threads = threads};
  void *buf;
  size_t len;
  RETURN_IF_ERROR(rt_compile_model_to_memory(path, &o, &buf, &len));
  smelt_status st = rt_bundle_open_bytes(buf, len, path, out);
  free(buf);
  return st;
}

/* Fills every input with a fixed pattern: floats in [-1, 1), integers
 * 0, 1, 2, ... along the last axis (valid positions and indices), bools
 * alternating.  Timing does not depend on the values. */
static void *make_input(const smelt_tensor_info *ti, size_t *out_bytes) {
  TensorType t = {.dt = (DType)ti->dtype, .rank = ti->rank};
  for (int i = 0; i < ti->rank; i++) t.dim[i] = ti->dims[i];
  size_t n = (size_t)ir_type_numel(&t), bytes = ir_type_bytes(&t);
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (!p) return NULL;
  int64_t last = t.rank && t.dim[t.rank - 1] ? t.dim[t.rank - 1] : 1;
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i++) {
    double v;
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    if (dt_is_float(t.dt)) v = (double)(s >> 11) * 0x1.0p-52 - 1.0;
    else if (t.dt == DT_BOOL) v = (double)(i % 2);
    else v = (double)((int64_t)i % last);
    dt_store(t.dt, p, i, v);
  }
  *out_bytes = bytes;
  return p;
}

typedef struct {
  void **bufs;
  int n;
} Buffers;

static void buffers_free(Buffers *b) {
  for (int i = 0; i < b->n; i++) free(b->bufs[i]);
  free(b->bufs);
}

static smelt_status bind_random(smelt_session *s, Buffers *keep) {
  int ni = smelt_session_num_inputs(s), no = smelt_session_num_outputs(s);
  keep->bufs = calloc((size_t)(ni + no + 1), sizeof *keep->bufs);
  if (!keep->bufs) return st_error(ST_NO_MEMORY, "out of memory");
  for (int i = 0; i < ni + no; i++) {
    smelt_tensor_info ti;
    if (i < ni) smelt_session_input_info(s, i, &ti);
    else smelt_session_output_info(s, i - ni, &ti);
    size_t bytes;
    void *p = make_input(&ti, &bytes);
    if (!p) return st_error(ST_NO_MEMORY, "out of memory for '%s'", ti.name);
    keep->bufs[keep->n++] = p;
    if (i < ni) RETURN_IF_ERROR(smelt_session_bind_input(s, ti.name, p, bytes));
    else RETURN_IF_ERROR(smelt_session_bind_output(s, ti.name, p, bytes));
  }
  return NULL;
}

static void print_row(const char *name, int64_t tasks, double t, double bytes, double flops, double bw) {
  double gbs = t > 0 ? bytes / t * 1e-9 : 0, gfs = t > 0 ? flops / t * 1e-9 : 0;
  char tasks_s[24] = "";
  if (tasks >= 0) snprintf(tasks_s, sizeof tasks_s, "%lld", (long long)tasks);
  printf("%-44s %8s %11.2f %9.2f %9.2f", name, tasks_s, t * 1e6, gbs, gfs);
  if (bw > 0) printf(" %6.1f%%", 100.0 * (bytes / t) / bw);
  printf("\n");
}

/* Times the session; times[k * iters + i] is kernel k in run i. */
static smelt_status bench_session(smelt_session *s, int warmup, int iters, double copy_bw) {
  const smelt_bundle *b = rt_session_bundle(s);
  int nk = rt_bundle_num_kernels(b);
  double *times = calloc((size_t)(nk + 1) * (size_t)iters, sizeof *times);
  if (!times) return st_error(ST_NO_MEMORY, "out of memory");
  double *total = times + (size_t)nk * (size_t)iters;
  for (int i = 0; i < warmup; i++) {
    smelt_status st = smelt_session_run(s);
    if (st) {
      free(times);
      return st;
    }
  }
  for (int i = 0; i < iters; i++) {
    double t0 = now_s();
    smelt_status st = rt_session_prepare(s);
    if (st) {
      free(times);
      return st;
    }
    for (int k = 0; k < nk; k++) {
      double k0 = now_s();
      rt_session_run_kernel(s, k);
      times[(size_t)k * (size_t)iters + (size_t)i] = now_s() - k0;
    }
    rt_session_finish(s);
    total[i] = now_s() - t0;
  }
  printf("%-44s %8s %11s %9s %9s %7s\n", "kernel", "tasks", "median(us)", "GB/s", "GFLOP/s", "%copy");
  double all_bytes = 0, all_flops = 0;
  for (int k = 0; k < nk; k++) {
    const Kernel *kn = rt_bundle_kernel(b, k);
    double t = median(times + (size_t)k * (size_t)iters, iters);
    print_row(kn->name, kn->ntasks, t, kn->bytes, kn->flops, copy_bw);
    all_bytes += kn->bytes;
    all_flops += kn->flops;
  }
  print_row("total (whole run)", -1, median(total, iters), all_bytes, all_flops, copy_bw);
  free(times);
  return NULL;
}

static bool parse_count(const char *s, int lo, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > 1000000) return false;
  *out = (int)v;
  return true;
}

int cli_bench(int argc, char **argv) {
  const char *path = NULL, *device = "cpu", *dtype = NULL;
  int threads = 0, warmup = 3, iters = 20;
  char dims[1024] = "";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    bool missing;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(bench_help, stdout);
      return 0;
    }
    if ((v = cli_flag_value("--device", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("bench", "--device needs a device (cpu)");
      device = v;
    } else if ((v = cli_flag_value("--threads", argc, argv, &i, &missing)) || missing) {
      if (missing || !parse_count(v, 1, &threads)) return cli_usage("bench", "--threads needs a count >= 1");
    } else if ((v = cli_flag_value("--warmup", argc, argv, &i, &missing)) || missing) {
      if (missing || !parse_count(v, 0, &warmup)) return cli_usage("bench", "--warmup needs a count >= 0");
    } else if ((v = cli_flag_value("--iters", argc, argv, &i, &missing)) || missing) {
      if (missing || !parse_count(v, 1, &iters)) return cli_usage("bench", "--iters needs a count >= 1");
    } else if ((v = cli_flag_value("--dim", argc, argv, &i, &missing)) || missing) {
      if (missing || !strchr(v, '=')) return cli_usage("bench", "--dim needs NAME=VALUE");
      size_t n = strlen(dims);
      if (n + strlen(v) + 2 > sizeof dims) return cli_usage("bench", "too many --dim flags");
      snprintf(dims + n, sizeof dims - n, "%s%s", n ? ";" : "", v);
    } else if ((v = cli_flag_value("--dtype", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("bench", "--dtype needs a dtype");
      dtype = v;
    } else if (a[0] == '-' && a[1]) return cli_usage("bench", "unknown flag '%s'", a);
    else if (path) return cli_usage("bench", "one model at a time ('%s' and '%s')", path, a);
    else path = a;
  }
  if (!path) return cli_usage("bench", "which bundle or model? (smelt bench BUNDLE.smelt)");
  if ((dims[0] || dtype) && !is_yaml(path)) return cli_usage("bench", "--dim and --dtype apply to a YAML model only");

  smelt_bundle *b = NULL;
  smelt_session *s = NULL;
  Buffers keep = {0};
  smelt_session_options so = {.threads = threads};
  smelt_status st = open_model(path, dims[0] ? dims : NULL, dtype, threads, &b);
  if (!st) st = smelt_session_create(b, device, &so, &s);
  if (!st) st = bind_random(s, &keep);
  if (!st) {
    int nt = rt_session_threads(s);
    double bw = copy_bandwidth(nt);
    printf("bench %s on %s, %d thread%s: %d kernels, %d warm-up runs, median of %d runs\n", path, device, nt,
           nt == 1 ? "" : "s", rt_bundle_num_kernels(b), warmup, iters);
    if (bw > 0) printf("host copy bandwidth: %.2f GB/s (best of 3 copies of 256 MiB on %d threads, read + write)\n",
                       bw * 1e-9, nt);
    else printf("host copy bandwidth: not measured (out of memory)\n");
    st = bench_session(s, warmup, iters, bw);
  }
  buffers_free(&keep);
  smelt_session_destroy(s);
  smelt_bundle_close(b);
  return st ? cli_fail(st) : 0;
}
