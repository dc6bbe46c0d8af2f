/* smelt bench: how fast each kernel runs, against what the machine can do.
 *
 * The bundle (or a YAML model, compiled in memory first for the device's
 * target) runs on fixed inputs: `--warmup` runs untimed, then `--iters`
 * timed passes.  Reported times are medians, which one descheduled run
 * does not move.  Each kernel's estimated bytes and FLOPs over its time give
 * achieved GB/s and GFLOP/s.
 *
 * CPU: every kernel is timed on its own (clock_gettime around
 * rt_session_run_kernel) and the whole run too; the bytes are set against
 * the host's copy bandwidth, measured once at start as the best of three
 * 256 MiB copies spread over the same number of threads the session uses (a
 * kernel run on N threads is compared with what N threads can copy),
 * counting bytes read plus bytes written as the kernels' estimates do.
 *
 * CUDA: every kernel is timed with CUDA events around its launch
 * (rt_cuda_time_kernels), and the whole model as the replay of its CUDA
 * graph: 10 replays queued back to back and waited for, over 10, which
 * hides the host's launch latency the way a serving loop does.  The
 * roofline is the device's: the copy bandwidth measured as a copy of 1 GiB
 * between two device buffers by a plain copy kernel timed with events
 * (read + write bytes, median of 10; without NVRTC a cuMemcpy timed by the
 * host clock), and a stated FLOP peak per arch (below).  A kernel's
 * "% roofline" is its roofline time, max(bytes / bandwidth, FLOPs / peak),
 * over its measured time.
 *
 * The resource report (CUDA): next to each kernel's time, the variant it
 * was generated as (the launch table's token, "mma:bm=128,...", for the
 * matmul and attention kernels), the registers per thread, the local
 * memory per thread (stack frame and register spills: a matmul kernel
 * should have none) and the shared memory, static + dynamic.  The driver
 * reports registers, local and static shared bytes of a loaded function
 * (rt_cuda_function_resources); the bench loads the bundle's units again for
 * that, as a session does (the cubin for this GPU, else NVRTC on the
 * unit's source), because a session does not hand out its functions.
 *
 * --json prints the same numbers as one JSON object instead of the table,
 * for scripts (bench/gpu/bench.py). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ir/clock.h"
#include "codegen/cuda/cg_cuda.h"
#include "runtime/cuda_driver.h"
#include "compiler/driver.h"
#include "runtime/elf_loader.h"
#include "runtime/threadpool.h"

static const char bench_help[] =
    "usage: smelt bench BUNDLE.smelt|MODEL.yaml|MODEL.onnx [flags]\n"
    "\n"
    "Times every kernel and the whole model on fixed inputs and reports median times,\n"
    "achieved GB/s and GFLOP/s (from each kernel's estimated bytes and FLOPs) and the\n"
    "fraction of the device's roofline (measured copy bandwidth; on CUDA also a FLOP\n"
    "peak).  On CUDA each kernel's variant, registers and local memory per thread and\n"
    "shared memory (static + dynamic) are shown beside its time.  A YAML model is\n"
    "compiled first for the device.\n"
    "\n"
    "flags:\n"
    "  --device cpu|cuda[:N]   where to run (default cpu)\n"
    "  --threads N             CPU worker threads (default: the bundle's, else every core)\n"
    CLI_TP_HELP
    "  --warmup N              untimed runs first (default 3)\n"
    "  --iters N               timed runs (default 20)\n"
    "  --check                 first compare the outputs on the bench's inputs with the reference\n"
    "                          interpreter (as smelt run --check); a mismatch is reported and\n"
    "                          nothing is timed (exit 1)\n"
    "  --rtol R, --atol A      with --check: judge float outputs as numpy.allclose,\n"
    "                          |x - ref| <= A + R*|ref| (the one not given is 0)\n"
    "  --json                  print the results as one JSON object instead of a table\n"
    "  --trace FILE.json       write the last timed run as a Chrome-trace/Perfetto timeline: every\n"
    "                          kernel under its YAML names, with bytes, FLOPs and variant\n"
    "  --perf-map              (cpu) write /tmp/perf-PID.map, which names the loaded kernels' machine\n"
    "                          code for perf (perf record smelt bench ... --perf-map, then perf report)\n"
    "  --dim NAME=VALUE        YAML: override a size from the model's dims; a bundle of several\n"
    "                          specialisations: the one to bench; a bundle with a ranged dim\n"
    "                          (--dim seq=1..2048 when compiled): the run's value, e.g. seq=17\n"
    "                          (the inputs are bound at that length; the kernels' bytes and FLOPs\n"
    "                          are the max's estimates)\n"
    "  --dtype DTYPE           (YAML only) default element type\n"
    "  --allow-tf32            (YAML on cuda) f32 matmuls may use the TF32 tensor cores, as\n"
    "                          smelt compile --allow-tf32\n";

#define COPY_BYTES ((size_t)256 << 20)

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
double cli_host_copy_bandwidth(int threads) {
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
      double t0 = smelt_now_s();
      rt_pool_parallel_for(pool, 1024, 0, copy_range, &job);
      double t = smelt_now_s() - t0;
      if (t > 0 && 2.0 * (double)COPY_BYTES / t > best) best = 2.0 * (double)COPY_BYTES / t;
    }
  }
  st_free(st);
  rt_pool_destroy(pool);
  free(src);
  free(dst);
  return best;
}

/* A model to compile first (YAML or ONNX, as frontend/model.c tells them
 * apart), not a bundle. */
static bool is_model(const char *path) {
  size_t n = strlen(path);
  return (n > 5 && strcmp(path + n - 5, ".yaml") == 0) || (n > 4 && strcmp(path + n - 4, ".yml") == 0) ||
         (n > 5 && strcasecmp(path + n - 5, ".onnx") == 0);
}

static smelt_status open_model(const char *path, const char *dims, const char *dtype, int threads, bool cuda,
                               bool allow_tf32, int tp, smelt_bundle **out) {
  if (!is_model(path)) return smelt_bundle_open(path, out);
  smelt_compile_options o = {.targets = cuda ? "cuda" : "cpu", .dims = dims, .dtype = dtype, .threads = threads,
                             .allow_tf32 = allow_tf32, .tp = tp};
  void *buf;
  size_t len;
  RETURN_IF_ERROR(sc_compile_model_to_memory(path, &o, &buf, &len));
  smelt_status st = rt_bundle_open_bytes(buf, len, path, out);
  free(buf);
  return st;
}

/* Fills every input with a fixed pattern: floats in [-1, 1), integers
 * 0, 1, 2, ... along the last axis (valid positions and indices), bools
 * alternating.  Timing does not depend on the values. */
/* range > 0: the input is the indices of a gather over that many rows
 * (cli_gather_range): ids uniform in [0, range). */
static void *make_input(const smelt_tensor_info *ti, int64_t range, size_t *out_bytes) {
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
    else if (range > 0) v = (double)((s >> 17) % (uint64_t)range);
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

/* The specialisation of bundle b (*out_spec) whose ranged dims hold every
 * item NAME=VALUE of dims (';'-separated), with each range's value for
 * the run in out_rv (the max where dims gives none); false when none. */
static bool find_ranged_spec(const smelt_bundle *b, const char *dims, int *out_spec, int64_t *out_rv) {
  for (int i = 0; i < rt_bundle_num_specs(b); i++) {
    const Graph *g = rt_bundle_graph(rt_bundle_spec(b, i));
    if (!g->nranges) continue;
    for (int r = 0; r < g->nranges; r++) out_rv[r] = g->ranges[r].max;
    bool ok = true;
    for (const char *p = dims; *p && ok; p += strspn(p, ";")) {
      size_t n = strcspn(p, ";");
      const char *eq = memchr(p, '=', n);
      char *end = NULL;
      long long v = eq ? strtoll(eq + 1, &end, 10) : 0;
      ok = eq && end == p + n;
      int at = -1;
      for (int r = 0; ok && r < g->nranges; r++)
        if (strlen(g->ranges[r].name) == (size_t)(eq - p) && strncmp(g->ranges[r].name, p, (size_t)(eq - p)) == 0) at = r;
      ok = ok && at >= 0 && v >= g->ranges[at].min && v <= g->ranges[at].max;
      if (ok) out_rv[at] = v;
      p += n;
    }
    if (ok) {
      *out_spec = i;
      return true;
    }
  }
  return false;
}

/* Random inputs and output buffers bound to s; rv (NULL: every range at
 * its max) the values of the ranged dims, which size the ranged ones. */
static smelt_status bind_random(smelt_session *s, Buffers *keep, const int64_t *rv) {
  const Graph *g = rt_bundle_graph(rt_session_bundle(s));
  int ni = smelt_session_num_inputs(s), no = smelt_session_num_outputs(s);
  keep->bufs = calloc((size_t)(ni + no + 1), sizeof *keep->bufs);
  if (!keep->bufs) return st_error(ST_NO_MEMORY, "out of memory");
  for (int i = 0; i < ni + no; i++) {
    smelt_tensor_info ti;
    if (i < ni) smelt_session_input_info(s, i, &ti);
    else smelt_session_output_info(s, i - ni, &ti);
    int v = ir_find_value(g, ti.name);
    for (int a = 0; rv && v >= 0 && a < ti.rank && a < g->val[v].type.rank; a++)
      ti.dims[a] = ir_type_extent(&g->val[v].type, a, rv);
    size_t bytes;
    const char *gnode;
    int64_t range = i < ni && dt_is_int((DType)ti.dtype) ? cli_gather_range(g, ir_find_value(g, ti.name), &gnode) : 0;
    void *p = make_input(&ti, range, &bytes);
    if (!p) return st_error(ST_NO_MEMORY, "out of memory for '%s'", ti.name);
    keep->bufs[keep->n++] = p;
    if (i < ni) RETURN_IF_ERROR(smelt_session_bind_input(s, ti.name, p, bytes));
    else RETURN_IF_ERROR(smelt_session_bind_output(s, ti.name, p, bytes));
  }
  return NULL;
}

/* ---- results: one row per kernel, then the total ---- */

/* What the resource report shows of one CUDA kernel. */
typedef struct {
  const char *kind;              /* "matmul", "attention", ... ("" unknown) */
  char variant[CG_VARIANT_LEN];  /* "" for kernels without variants */
  int regs, local_bytes, smem_static; /* from the driver; -1 = not known */
  unsigned smem_dynamic;
  uint64_t workspace;
} KernelRes;

typedef struct {
  const char *name;
  int64_t tasks;   /* -1: not a kernel */
  double t;        /* median seconds */
  double bytes, flops;
  double peak;     /* FLOP/s this row's roofline uses; 0 = bytes only */
  const KernelRes *res; /* CUDA kernels; NULL otherwise */
} Row;

typedef struct {
  const char *model, *device;
  char hw[512];          /* "NVIDIA H200 (sm_90a, 132 SMs)" or "8 threads" */
  double copy_bw;        /* bytes/s, read + write; 0 = not measured */
  char copy_how[160];
  char peak_how[200];
  int warmup, iters;
  Row *rows;
  int nrows;             /* kernels, then totals */
  int nkernels;
  char note[200];
  char ranged[200];      /* a ranged bundle's run: "seq=17 (of 1..2048)", else "" */
  KernelRes *res;        /* CUDA: per kernel */
  double *start, *dur;   /* per kernel, seconds: the last timed run's timeline (--trace) */
  double run_s;          /* that run's length (CPU) or the graph replay's (CUDA) */
  char res_note[240];    /* why some resources are unknown */
  json_t *check;         /* --check --json: the comparison's findings (owned) */
} Report;

static double roofline_pct(const Row *r, double bw) {
  if (r->t <= 0) return 0;
  double tb = bw > 0 ? r->bytes / bw : 0, tf = r->peak > 0 ? r->flops / r->peak : 0;
  double troof = tb > tf ? tb : tf;
  return troof > 0 ? 100.0 * troof / r->t : 0;
}

static void print_table(const Report *rep) {
  printf("%-44s %8s %11s %9s %9s %9s", "kernel", "tasks", "median(us)", "GB/s", "GFLOP/s", "%roofline");
  if (rep->res) printf(" %5s %6s %15s  %s", "regs", "local", "smem(st+dyn)", "variant");
  printf("\n");
  for (int i = 0; i < rep->nrows; i++) {
    const Row *r = &rep->rows[i];
    double gbs = r->t > 0 ? r->bytes / r->t * 1e-9 : 0, gfs = r->t > 0 ? r->flops / r->t * 1e-9 : 0;
    char tasks_s[24] = "";
    if (r->tasks >= 0) snprintf(tasks_s, sizeof tasks_s, "%lld", (long long)r->tasks);
    printf("%-44s %8s %11.2f %9.2f %9.2f", r->name, tasks_s, r->t * 1e6, gbs, gfs);
    double pct = roofline_pct(r, rep->copy_bw);
    if (pct > 0) printf(" %8.1f%%", pct);
    else if (r->res) printf(" %9s", "");
    if (r->res) {
      const KernelRes *k = r->res;
      char regs[16] = "?", local[16] = "?", smem[40];
      if (k->regs >= 0) snprintf(regs, sizeof regs, "%d", k->regs);
      if (k->local_bytes >= 0) snprintf(local, sizeof local, "%d", k->local_bytes);
      if (k->smem_static >= 0) snprintf(smem, sizeof smem, "%d+%u", k->smem_static, k->smem_dynamic);
      else snprintf(smem, sizeof smem, "?+%u", k->smem_dynamic);
      printf(" %5s %6s %15s  %s", regs, local, smem, k->variant);
      if (k->workspace) printf(" (workspace %llu B)", (unsigned long long)k->workspace);
    }
    printf("\n");
  }
  if (rep->note[0]) printf("%s\n", rep->note);
  if (rep->res) {
    printf("regs: registers per thread; local: bytes of local memory per thread (stack and spills); smem: bytes "
           "of static + dynamic shared memory per block\n");
    if (rep->res_note[0]) printf("%s\n", rep->res_note);
  }
}

/* One table row as a JSON object (a kernel or a total). */
static json_t *json_row(const Row *r, double bw) {
  json_t *o = json_pack("{s:s, s:f, s:I, s:I, s:f, s:f, s:f}", "name", r->name, "median_us", r->t * 1e6, "bytes",
                        (json_int_t)(r->bytes + 0.5), "flops", (json_int_t)(r->flops + 0.5), "gbs",
                        r->t > 0 ? r->bytes / r->t * 1e-9 : 0.0, "gflops", r->t > 0 ? r->flops / r->t * 1e-9 : 0.0,
                        "roofline_pct", roofline_pct(r, bw));
  if (o && r->res) {
    /* -1: the driver could not say */
    const KernelRes *k = r->res;
    json_t *res = json_pack("{s:s, s:s, s:i, s:i, s:i, s:I, s:I}", "kind", k->kind, "variant", k->variant, "registers",
                            k->regs, "local_bytes", k->local_bytes, "smem_static", k->smem_static, "smem_dynamic",
                            (json_int_t)k->smem_dynamic, "workspace", (json_int_t)k->workspace);
    if (!res || json_object_update(o, res)) {
      json_decref(res);
      json_decref(o);
      return NULL;
    }
    json_decref(res);
  }
  return o;
}

/* The report as one JSON object on stdout (jansson escapes the names). */
static smelt_status print_json(const Report *rep) {
  json_t *root = json_pack("{s:s, s:s, s:s, s:i, s:i, s:f, s:s, s:s}", "model", rep->model, "device", rep->device,
                           "hardware", rep->hw, "warmup", rep->warmup, "iters", rep->iters, "copy_bandwidth_gbs",
                           rep->copy_bw * 1e-9, "copy_method", rep->copy_how, "flop_peak", rep->peak_how);
  json_t *kernels = json_array(), *totals = json_array();
  bool ok = root && kernels && totals;
  if (ok && rep->res) ok = json_object_set_new(root, "resources_note", json_string(rep->res_note)) == 0;
  if (ok && rep->ranged[0]) ok = json_object_set_new(root, "ranged_dims", json_string(rep->ranged)) == 0;
  if (ok && rep->check) ok = json_object_set(root, "check", rep->check) == 0;
  for (int i = 0; ok && i < rep->nrows; i++) {
    json_t *row = json_row(&rep->rows[i], rep->copy_bw);
    ok = row && json_array_append_new(i < rep->nkernels ? kernels : totals, row) == 0;
  }
  if (ok) ok = json_object_set(root, "kernels", kernels) == 0 && json_object_set(root, "totals", totals) == 0;
  if (ok) ok = json_dumpf(root, stdout, JSON_INDENT(1) | JSON_PRESERVE_ORDER) == 0 && putchar('\n') != EOF;
  json_decref(kernels);
  json_decref(totals);
  json_decref(root);
  return ok ? NULL : st_error(ST_IO, "cannot write the JSON report (out of memory, or a name that is not UTF-8)");
}

/* ---- --check ---- */

/* The findings of a --check as JSON: pass, then per output its errors,
 * cosine, pass and the rule that decided; NULL when out of memory. */
static json_t *check_json(const ScOutputReport *r) {
  json_t *outs = json_array(), *o = json_pack("{s:b}", "pass", r->pass);
  bool ok = outs && o;
  for (int i = 0; ok && i < r->noutputs; i++) {
    const ScOutputCheck *c = &r->outputs[i];
    char rule[128];
    /* JSON has no infinity: a rel L2 that is infinite (a zero reference) is null */
    json_t *row = json_pack("{s:s, s:f, s:f, s:o, s:f, s:b, s:s}", "name", c->name, "max_abs", c->diff.max_abs,
                            "max_rel", c->diff.max_rel, "rel_l2",
                            isfinite(c->diff.rel_l2) ? json_real(c->diff.rel_l2) : json_null(), "cosine", c->diff.cosine,
                            "pass", c->diff.pass, "rule", sc_rule_text(&c->diff, rule, sizeof rule));
    if (row && c->has_f32) {
      /* against the f32 reference: informational ("ok" says the f16 rule holds) */
      json_t *f = json_pack("{s:f, s:f, s:o, s:f, s:b, s:s}", "max_abs", c->f32.max_abs, "max_rel", c->f32.max_rel,
                            "rel_l2", isfinite(c->f32.rel_l2) ? json_real(c->f32.rel_l2) : json_null(), "cosine",
                            c->f32.cosine, "ok", c->f32.pass, "rule", sc_rule_text(&c->f32, rule, sizeof rule));
      ok = f && json_object_set_new(row, "vs_f32", f) == 0;
    }
    if (!ok) json_decref(row);
    ok = ok && row && json_array_append_new(outs, row) == 0;
  }
  if (ok && r->f32_note[0]) ok = json_object_set_new(o, "f32_note", json_string(r->f32_note)) == 0;
  if (ok) ok = json_object_set(o, "outputs", outs) == 0;
  json_decref(outs);
  if (!ok) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* Compares the session's outputs on the bound inputs (kept in `inputs`, in
 * input order) with the reference; prints the table (or keeps the JSON in
 * rep->check); *pass says whether every output passed.  The check binds its
 * own output buffers: the caller binds again before timing. */
static smelt_status run_check(smelt_session *s, void *const *inputs, const ScTol *tol, bool json, Report *rep,
                              bool *pass) {
  ScOutputReport r;
  RETURN_IF_ERROR(sc_check_outputs_tol(s, (const void *const *)inputs, tol->set ? tol : NULL, &r));
  *pass = r.pass;
  smelt_status st = NULL;
  if (json) {
    if (!(rep->check = check_json(&r))) st = st_error(ST_NO_MEMORY, "out of memory");
  } else {
    cli_print_output_check(&r);
    if (!r.pass) printf("check FAILED: nothing timed\n");
  }
  sc_output_report_free(&r);
  return st;
}

/* ---- CPU ---- */

/* Times the session; times[k * iters + i] is kernel k in run i. */
static smelt_status bench_cpu(smelt_session *s, Report *rep) {
  const smelt_bundle *b = rt_session_bundle(s);
  int nk = rt_bundle_num_kernels(b), iters = rep->iters;
  double *times = calloc((size_t)(nk + 1) * (size_t)iters, sizeof *times);
  if (!times) return st_error(ST_NO_MEMORY, "out of memory");
  double *total = times + (size_t)nk * (size_t)iters;
  smelt_status st = NULL;
  for (int i = 0; i < rep->warmup && !st; i++) st = smelt_session_run(s);
  for (int i = 0; i < iters && !st; i++) {
    double t0 = smelt_now_s();
    st = rt_session_prepare(s);
    for (int k = 0; k < nk && !st; k++) {
      double k0 = smelt_now_s();
      st = rt_session_run_kernel(s, k);
      times[(size_t)k * (size_t)iters + (size_t)i] = smelt_now_s() - k0;
      if (rep->start && i == iters - 1) {
        rep->start[k] = k0 - t0;
        rep->dur[k] = smelt_now_s() - k0;
      }
    }
    if (!st) st = rt_session_finish(s);
    total[i] = smelt_now_s() - t0;
    rep->run_s = total[i];
  }
  if (st) {
    free(times);
    return st;
  }
  double all_bytes = 0, all_flops = 0;
  for (int k = 0; k < nk; k++) {
    const Kernel *kn = rt_bundle_kernel(b, k);
    rep->rows[k] = (Row){kn->name, kn->ntasks, median(times + (size_t)k * (size_t)iters, iters), kn->bytes, kn->flops, 0,
                         NULL};
    all_bytes += kn->bytes;
    all_flops += kn->flops;
  }
  rep->rows[nk] = (Row){"total (whole run)", -1, median(total, iters), all_bytes, all_flops, 0, NULL};
  rep->nrows = nk + 1;
  free(times);
  return NULL;
}

/* ---- CUDA ---- */

#define GPU_COPY_BYTES ((size_t)1 << 30)
#define GRAPH_BATCH 10

/* A plain copy, 16 bytes per thread: what the memory system gives a
 * kernel that only streams. */
static const char copy_kernel[] =
    "extern \"C\" __global__ void smelt_copy(const int4 *__restrict__ src, int4 *__restrict__ dst,\n"
    "                                        unsigned long long n) {\n"
    "  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
    "  if (i < n) dst[i] = src[i];\n"
    "}\n";

/* Seconds of the median of 10 event-timed copy-kernel runs over n bytes. */
static smelt_status time_copy_kernel(RtCudaDevice *d, RtCudaPtr src, RtCudaPtr dst, size_t n, double *out_s) {
  CgNvrtc *nv;
  RETURN_IF_ERROR(cg_cuda_nvrtc_open(&nv));
  CgCudaBinary bin;
  smelt_status st = cg_cuda_compile_source(nv, copy_kernel, "copy kernel", rt_cuda_device_info(d)->arch, NULL, &bin);
  cg_cuda_nvrtc_close(nv);
  RETURN_IF_ERROR(st);
  RtCudaModule *m = NULL;
  st = rt_cuda_module_load_image(d, bin.cubin, "copy kernel", &m);
  cg_cuda_binary_clear(&bin);
  RtCudaFunction fn = NULL;
  if (!st) st = rt_cuda_module_function(m, "smelt_copy", 0, &fn);
  unsigned long long n16 = n / 16;
  void *params[3] = {&src, &dst, &n16};
  RtCudaLaunch l = {fn, "copy", {(unsigned)((n16 + 255) / 256), 1, 1}, {256, 1, 1}, 0, params, false, NULL, NULL};
  double ms[10];
  for (int r = 0; r < 10 && !st; r++) st = rt_cuda_time_kernels(d, &l, 1, 1, &ms[r]);
  if (!st) *out_s = median(ms, 10) * 1e-3;
  rt_cuda_module_unload(m);
  return st;
}

/* The device's copy bandwidth in bytes/s (read + write); 0 when it cannot
 * be measured (how says why). */
double cli_gpu_copy_bandwidth(RtCudaDevice *d, char *how, size_t cap) {
  RtCudaPtr src = 0, dst = 0;
  size_t n = GPU_COPY_BYTES;
  smelt_status st = rt_cuda_alloc(d, n, &src);
  if (!st) st = rt_cuda_alloc(d, n, &dst);
  if (!st) st = rt_cuda_memset(d, src, 1, n);
  double bw = 0, t = 0;
  if (!st) {
    smelt_status kst = time_copy_kernel(d, src, dst, n, &t);
    if (!kst && t > 0) {
      bw = 2.0 * (double)n / t;
      snprintf(how, cap, "copy kernel over 1 GiB device to device, CUDA events, median of 10, read + write bytes");
    } else {
      /* no NVRTC: the driver's own copy, timed by the host clock (a few
       * microseconds of call overhead against ~0.5 ms) */
      double s[5];
      for (int r = 0; r < 5 && !st; r++) {
        double t0 = smelt_now_s();
        st = rt_cuda_upload(d, dst, (const void *)(uintptr_t)src, n);
        s[r] = smelt_now_s() - t0;
      }
      if (!st) {
        bw = 2.0 * (double)n / median(s, 5);
        snprintf(how, cap, "cuMemcpyDtoD of 1 GiB timed by the host clock, median of 5 (copy kernel failed: %.60s)",
                 kst ? st_message(kst) : "zero time");
      }
    }
    st_free(kst);
  }
  if (st) {
    snprintf(how, cap, "not measured: %.120s", st_message(st));
    st_free(st);
  }
  rt_cuda_free(d, src);
  rt_cuda_free(d, dst);
  return bw;
}

/* Stated peaks (dense, per the vendor's data sheets; SXM parts), by
 * compute capability: tensor cores for 16-bit floats, CUDA cores for f32.
 * 0: unknown, and the roofline then counts bytes only. */
static double flop_peak(int cc, DType dt) {
  bool half = dt == DT_F16 || dt == DT_BF16;
  switch (cc) {
  case 90: return half ? 989.4e12 : 66.9e12; /* H100/H200 SXM */
  case 80: return half ? 312e12 : 19.5e12;   /* A100 SXM */
  default: return 0;
  }
}

/* Appends "; what: message" to the resource note (first few only). */
static void res_note(Report *rep, const char *what, smelt_status st) {
  size_t n = strlen(rep->res_note);
  if (n + 8 < sizeof rep->res_note)
    snprintf(rep->res_note + n, sizeof rep->res_note - n, "%s%s: %.100s", n ? "; " : "resources unknown: ", what,
             st_message(st));
  st_free(st);
}

/* Loads unit u of spec the way a session does (the cubin for the device's
 * arch, else NVRTC on the unit's source) and fills the driver's numbers of
 * each of its kernels into res. */
static smelt_status unit_resources(const smelt_bundle *spec, RtCudaDevice *d, const FmtCudaModule *m, int u,
                                   KernelRes *res) {
  const char *arch = rt_cuda_device_info(d)->arch;
  char name[48];
  const void *src, *bin;
  size_t src_len, bin_len;
  snprintf(name, sizeof name, "u%d", u);
  if (!rt_bundle_spec_find(spec, FMT_SEC_CUDA_SOURCE, name, &src, &src_len))
    return st_error(ST_INVALID_INPUT, "no CUDA source for unit %s", name);
  snprintf(name, sizeof name, "%s/u%d", arch, u);
  RtCudaImage img = {.arch = arch};
  if (rt_bundle_spec_find(spec, FMT_SEC_CUBIN, name, &bin, &bin_len) && bin_len > 0) {
    img.cubin = bin;
    img.cubin_len = bin_len;
  }
  char *source = strndup(src, src_len);
  if (!source) return st_error(ST_NO_MEMORY, "out of memory");
  RtCudaModule *mod = NULL;
  RtCudaLoadKind how;
  snprintf(name, sizeof name, "unit u%d", u);
  smelt_status st = rt_cuda_module_load(d, &img, img.cubin ? 1 : 0, source, name, &mod, &how);
  free(source);
  for (int k = 0; k < m->nkernels && !st; k++) {
    const FmtCudaLaunch *l = &m->kernels[k];
    if (l->unit != u || fmt_cuda_launch_is_collective(l)) continue;
    RtCudaFunction fn;
    RtCudaResources r;
    st = rt_cuda_module_function(mod, l->symbol, l->smem, &fn);
    if (!st) st = rt_cuda_function_resources(d, fn, &r);
    if (!st) {
      res[k].regs = r.registers;
      res[k].local_bytes = r.local_bytes;
      res[k].smem_static = r.static_smem;
    }
  }
  rt_cuda_module_unload(mod);
  return st;
}

/* The resource report of every kernel of spec (see the top of the file):
 * variant, kind, dynamic shared memory and workspace from the launch
 * table, the rest from the driver.  What cannot be had stays unknown (-1)
 * and rep->res_note says why; the benchmark goes on. */
static void cuda_resources(const smelt_bundle *spec, RtCudaDevice *d, Report *rep) {
  int nk = rep->nkernels;
  for (int k = 0; k < nk; k++) rep->res[k] = (KernelRes){.kind = "", .regs = -1, .local_bytes = -1, .smem_static = -1};
  const void *lt;
  size_t ll;
  FmtCudaModule *m = NULL;
  if (!rt_bundle_spec_find(spec, FMT_SEC_CUDA_LAUNCH, "", &lt, &ll)) {
    res_note(rep, "bundle", st_error(ST_INVALID_INPUT, "no CUDA launch table"));
    return;
  }
  smelt_status st = fmt_cuda_launch_decode(lt, ll, &m);
  if (!st && m->nkernels != nk)
    st = st_error(ST_INVALID_INPUT, "%d launches for %d kernels", m->nkernels, nk);
  if (st) {
    res_note(rep, "launch table", st);
    fmt_cuda_module_free(m);
    return;
  }
  for (int k = 0; k < nk; k++) {
    const FmtCudaLaunch *l = &m->kernels[k];
    KernelRes *r = &rep->res[k];
    r->kind = l->kind ? l->kind : "";
    snprintf(r->variant, sizeof r->variant, "%s", l->variant);
    r->smem_dynamic = l->smem;
    r->workspace = l->workspace;
  }
  for (int u = 0; u < m->nunits; u++) {
    st = unit_resources(spec, d, m, u, rep->res);
    if (st) {
      char what[32];
      snprintf(what, sizeof what, "unit u%d", u);
      res_note(rep, what, st);
    }
  }
  fmt_cuda_module_free(m);
}

static smelt_status bench_cuda(smelt_session *s, const smelt_bundle *spec, Report *rep) {
  const smelt_bundle *b = rt_session_bundle(s);
  const Graph *g = rt_bundle_graph(b);
  RtCudaDevice *d = rt_session_cuda_device(s);
  const RtCudaInfo *info = rt_cuda_device_info(d);
  int nk = rt_bundle_num_kernels(b), iters = rep->iters;
  char loaded[160];
  rt_session_cuda_loaded(s, loaded, sizeof loaded);
  snprintf(rep->hw, sizeof rep->hw, "%s (%s, %d SMs; %s)", info->name, info->arch, info->sm_count, loaded);
  snprintf(rep->peak_how, sizeof rep->peak_how, "%s", flop_peak(info->cc, DT_F16) > 0
               ? "stated dense peak: 16-bit floats on tensor cores, f32 on CUDA cores (data sheet)"
               : "unknown for this GPU: bytes only");
  smelt_status st = NULL;
  for (int i = 0; i < (rep->warmup > 0 ? rep->warmup : 1) && !st; i++) st = smelt_session_run(s);
  if (st) return st;
  rep->copy_bw = cli_gpu_copy_bandwidth(d, rep->copy_how, sizeof rep->copy_how);
  double *times = calloc((size_t)(nk + 1) * (size_t)iters, sizeof *times);
  if (!times) return st_error(ST_NO_MEMORY, "out of memory");
  /* the graph again after the copy buffers came and went: its replays are
   * what a caller sees */
  st = smelt_session_run(s);
  if (!st) st = rt_session_cuda_time_kernels(s, iters, times);
  double *graph = times + (size_t)nk * (size_t)iters;
  if (!st) st = rt_session_cuda_time_graph(s, iters, GRAPH_BATCH, graph);
  if (st) {
    free(times);
    return st;
  }
  double all_bytes = 0, all_flops = 0, sum = 0;
  for (int k = 0, at = 0; rep->start && k < nk; k++) {
    /* the last run's event-timed kernels, each after the one before */
    rep->start[k] = at ? rep->start[k - 1] + rep->dur[k - 1] : 0;
    rep->dur[k] = times[(size_t)k * (size_t)iters + (size_t)iters - 1] * 1e-3;
    at = 1;
  }
  rep->run_s = median(graph, iters) * 1e-3;
  for (int k = 0; k < nk; k++) {
    const Kernel *kn = rt_bundle_kernel(b, k);
    DType dt = g->val[kn->args[kn->nargs - 1]].type.dt;
    double t = median(times + (size_t)k * (size_t)iters, iters) * 1e-3;
    rep->rows[k] = (Row){kn->name, kn->ntasks, t, kn->bytes, kn->flops, flop_peak(info->cc, dt), &rep->res[k]};
    all_bytes += kn->bytes;
    all_flops += kn->flops;
    sum += t;
  }
  DType out_dt = g->noutputs ? g->val[g->outputs[0]].type.dt : DT_F32;
  rep->rows[nk] = (Row){"total (sum of kernels)", -1, sum, all_bytes, all_flops, flop_peak(info->cc, out_dt), NULL};
  rep->rows[nk + 1] = (Row){"total (CUDA graph replay)", -1, median(graph, iters) * 1e-3, all_bytes, all_flops,
                            flop_peak(info->cc, out_dt), NULL};
  rep->nrows = nk + 2;
  snprintf(rep->note, sizeof rep->note, "graph replay: median over %d runs of %d replays queued back to back", iters,
           GRAPH_BATCH);
  free(times);
  /* after the timings: loading the units again must not disturb them */
  cuda_resources(spec, d, rep);
  return NULL;
}

/* perf's map of code it cannot see in a file (perf-PID.map, as JIT
 * compilers write it): one "START SIZE NAME" line per exported function of
 * the bundle's loaded CPU object, in hexadecimal, each function's size
 * running to the next function or the end of the code. */
typedef struct {
  uintptr_t addr;
  const char *name;
} MapSym;
static int cmp_mapsym(const void *a, const void *b) {
  uintptr_t x = ((const MapSym *)a)->addr, y = ((const MapSym *)b)->addr;
  return x < y ? -1 : x > y;
}
static smelt_status write_perf_map(const smelt_bundle *b, char *path, size_t path_len) {
  const RtElfImage *img = rt_bundle_code_image(b);
  snprintf(path, path_len, "/tmp/perf-%ld.map", (long)getpid());
  if (!img) return st_error(ST_INVALID_INPUT, "--perf-map: the bundle has no loaded CPU code");
  int n = rt_elf_symbol_count(img);
  MapSym *syms = malloc((size_t)(n ? n : 1) * sizeof *syms);
  if (!syms) return st_error(ST_NO_MEMORY, "out of memory");
  for (int i = 0; i < n; i++) {
    syms[i].name = rt_elf_symbol_name(img, i);
    syms[i].addr = (uintptr_t)rt_elf_lookup(img, syms[i].name);
  }
  qsort(syms, (size_t)n, sizeof *syms, cmp_mapsym);
  RtElfLayout lay;
  rt_elf_layout(img, &lay);
  uintptr_t end = (uintptr_t)lay.text + lay.text_size;
  FILE *fp = fopen(path, "a");
  if (!fp) {
    free(syms);
    return st_error(ST_IO, "%s: cannot write the perf map", path);
  }
  for (int i = 0; i < n; i++) {
    uintptr_t next = i + 1 < n ? syms[i + 1].addr : end;
    fprintf(fp, "%lx %lx %s\n", (unsigned long)syms[i].addr, (unsigned long)(next - syms[i].addr), syms[i].name);
  }
  int rc = ferror(fp);
  rc |= fclose(fp);
  free(syms);
  return rc ? st_error(ST_IO, "%s: cannot write the perf map", path) : NULL;
}

/* A Chrome-trace / Perfetto JSON file: one complete ("X") event per
 * kernel of the last timed run, named as the kernel (its YAML names), with
 * its bytes, FLOPs, tasks and, on CUDA, kind and variant; then the whole
 * run (CPU) or the CUDA graph replay's median on a track of its own.  CPU:
 * the kernels' host-clock start and end in that run.  CUDA: each kernel
 * launched alone and timed by CUDA events, placed back to back (the graph
 * replays them without the gaps launching alone adds). */
static smelt_status write_trace(const char *path, const Report *rep, bool cuda) {
  json_t *root = json_object(), *ev = json_array();
  if (!root || !ev) {
    json_decref(root);
    json_decref(ev);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  json_object_set_new(root, "traceEvents", ev);
  json_object_set_new(root, "displayTimeUnit", json_string("ns"));
  json_t *meta = json_pack("{s:s, s:s, s:s, s:i, s:s}", "model", rep->model, "device", rep->device, "hardware",
                           rep->hw, "iters", rep->iters, "timeline",
                           cuda ? "kernels launched one at a time, CUDA-event durations, back to back"
                                : "host clock of the last timed run");
  json_object_set_new(root, "otherData", meta);
  const char *tracks[2] = {cuda ? "kernels (one launch each)" : "kernels", cuda ? "CUDA graph replay" : "whole run"};
  for (int t = 0; t < 2; t++)
    json_array_append_new(ev, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "name", "thread_name", "ph", "M", "pid", 1,
                                        "tid", t + 1, "args", "name", tracks[t]));
  json_array_append_new(ev, json_pack("{s:s, s:s, s:i, s:{s:s}}", "name", "process_name", "ph", "M", "pid", 1, "args",
                                      "name", rep->model));
  for (int k = 0; k < rep->nkernels; k++) {
    const Row *r = &rep->rows[k];
    json_t *args = json_pack("{s:f, s:f, s:I}", "bytes", r->bytes, "flops", r->flops, "tasks", (json_int_t)r->tasks);
    if (r->res) {
      json_object_set_new(args, "kind", json_string(r->res->kind));
      json_object_set_new(args, "variant", json_string(r->res->variant));
    }
    json_array_append_new(ev, json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i, s:o}", "name", r->name, "cat", "kernel",
                                        "ph", "X", "ts", rep->start[k] * 1e6, "dur", rep->dur[k] * 1e6, "pid", 1,
                                        "tid", 1, "args", args));
  }
  json_array_append_new(ev, json_pack("{s:s, s:s, s:s, s:f, s:f, s:i, s:i}", "name", tracks[1], "cat", "run", "ph", "X",
                                      "ts", 0.0, "dur", rep->run_s * 1e6, "pid", 1, "tid", 2));
  int rc = json_dump_file(root, path, JSON_INDENT(1));
  json_decref(root);
  return rc ? st_error(ST_IO, "%s: cannot write the trace", path) : NULL;
}

static bool parse_count(const char *s, int lo, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (end == s || *end || v < lo || v > 1000000) return false;
  *out = (int)v;
  return true;
}

static bool is_cuda_device(const char *d) { return cli_cuda_devices(d) > 0; }

int cli_bench(int argc, char **argv) {
  const char *path = NULL, *device = "cpu", *dtype = NULL;
  int threads = 0, warmup = 3, iters = 20;
  bool json = false, allow_tf32 = false, check = false, perf_map = false;
  int tp = 1;
  ScTol tol = {0};
  const char *trace = NULL;
  char dims[1024] = "";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    bool missing;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(bench_help, stdout);
      return 0;
    }
    if (strcmp(a, "--json") == 0) {
      json = true;
    } else if (strcmp(a, "--check") == 0) {
      check = true;
    } else if (strcmp(a, "--perf-map") == 0) {
      perf_map = true;
    } else if ((v = cli_flag_value("--rtol", argc, argv, &i, &missing)) || missing) {
      if (!cli_parse_tolerance(v, &tol.rtol)) return cli_usage("bench", "--rtol needs a number >= 0");
      tol.set = true;
    } else if ((v = cli_flag_value("--atol", argc, argv, &i, &missing)) || missing) {
      if (!cli_parse_tolerance(v, &tol.atol)) return cli_usage("bench", "--atol needs a number >= 0");
      tol.set = true;
    } else if (strcmp(a, "--allow-tf32") == 0) {
      allow_tf32 = true;
    } else if ((v = cli_flag_value("--tp", argc, argv, &i, &missing)) || missing) {
      if (!cli_parse_tp(v, &tp)) return cli_usage("bench", "--tp needs a number of ranks, 1 to 64");
    } else if ((v = cli_flag_value("--device", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("bench", "--device needs a device (cpu, cuda, cuda:N)");
      if (strcmp(v, "cpu") != 0 && !is_cuda_device(v))
        return cli_usage("bench", "unknown device '%s' (cpu, cuda, cuda:N)", v);
      device = v;
    } else if ((v = cli_flag_value("--devices", argc, argv, &i, &missing)) || missing) {
      if (missing || cli_cuda_devices(v) < 1) return cli_usage("bench", "--devices needs a list of GPUs: cuda:0,cuda:1");
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
    } else if ((v = cli_flag_value("--trace", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("bench", "--trace needs a file name (FILE.json)");
      trace = v;
    } else if (a[0] == '-' && a[1]) return cli_unknown_flag("bench", bench_help, a);
    else if (path) return cli_usage("bench", "one model at a time ('%s' and '%s')", path, a);
    else path = a;
  }
  if (!path) return cli_usage("bench", "which bundle or model? (smelt bench BUNDLE.smelt)");
  if (tol.set && !check) return cli_usage("bench", "--rtol and --atol set the tolerance of --check: add --check");
  if (dtype && !is_model(path)) return cli_usage("bench", "--dtype applies to a model (YAML or ONNX) only");
  if (is_model(path) && strchr(dims, ','))
    return cli_usage("bench", "several --dim values make specialisations: compile a bundle and bench one with --dim");
  bool cuda = is_cuda_device(device);
  if (perf_map && cuda) return cli_usage("bench", "--perf-map names CPU kernels: it applies to --device cpu");
  if (tp > 1 && !is_model(path))
    return cli_usage("bench", "--tp applies to a model (a bundle's ranks are set by smelt compile --tp)");
  int bad = cli_devices_tp("bench", device, is_model(path), &tp);
  if (bad) return bad;
  if (allow_tf32 && !(cuda && is_model(path)))
    return cli_usage("bench", "--allow-tf32 applies to a YAML model on cuda (smelt compile --allow-tf32 for a bundle)");

  smelt_bundle *b = NULL;
  smelt_session *s = NULL;
  Buffers keep = {0};
  smelt_session_options so = {.threads = threads, .cuda_compile = smelt_nvrtc_compile};
  Report rep = {.model = path, .device = device, .warmup = warmup, .iters = iters};
  smelt_status st = open_model(path, is_model(path) && dims[0] ? dims : NULL, dtype, threads, cuda, allow_tf32, tp, &b);
  /* of a bundle of several specialisations, the one --dim names */
  int spec = 0;
  int64_t rv[IR_MAX_RANGES];
  bool ranged = false; /* --dim gave a value inside a ranged dim: rv */
  if (!st && !is_model(path) && (dims[0] || rt_bundle_num_specs(b) > 1)) {
    if (!dims[0])
      st = st_error(ST_INVALID_INPUT, "%s: error: the bundle holds %d specialisations: choose one with --dim", path,
                    rt_bundle_num_specs(b));
    else st = rt_bundle_find_spec(b, dims, &spec);
    if (st && find_ranged_spec(b, dims, &spec, rv)) {
      st_free(st);
      st = NULL;
      ranged = true;
    }
  }
  if (!st && ranged && check)
    st = st_error(ST_INVALID_INPUT, "%s: --check compares runs at the ranges' max; bench a ranged length without it "
                  "(smelt run --check takes inputs of any length)", path);
  if (!st && ranged) {
    const Graph *g = rt_bundle_graph(rt_bundle_spec(b, spec));
    for (int r = 0; r < g->nranges; r++) {
      size_t n = strlen(rep.ranged);
      snprintf(rep.ranged + n, sizeof rep.ranged - n, "%s%s=%lld (of %lld..%lld)", r ? " " : "", g->ranges[r].name,
               (long long)rv[r], (long long)g->ranges[r].min, (long long)g->ranges[r].max);
    }
    if (!json) printf("ranged dims of this run: %s\n", rep.ranged);
  }
  if (!st) st = smelt_session_create(b, device, &so, &s);
  if (!st) st = smelt_session_select(s, spec);
  if (!st) st = bind_random(s, &keep, ranged ? rv : NULL);
  bool check_pass = true;
  if (!st && check) {
    st = run_check(s, keep.bufs, &tol, json, &rep, &check_pass);
    /* the check bound buffers of its own: bind the bench's again */
    buffers_free(&keep);
    keep = (Buffers){0};
    if (!st) st = bind_random(s, &keep, ranged ? rv : NULL);
  }
  if (!st && !check_pass) {
    if (json) st = print_json(&rep);
    json_decref(rep.check);
    buffers_free(&keep);
    smelt_session_destroy(s);
    smelt_bundle_close(b);
    return st ? cli_fail(st) : 1;
  }
  if (!st) {
    rep.nkernels = rt_bundle_num_kernels(rt_bundle_spec(b, spec));
    if (!(rep.rows = calloc((size_t)rep.nkernels + 2, sizeof *rep.rows))) st = st_error(ST_NO_MEMORY, "out of memory");
    if (!st && cuda && !(rep.res = calloc((size_t)rep.nkernels + 1, sizeof *rep.res)))
      st = st_error(ST_NO_MEMORY, "out of memory");
    if (!st && trace && (!(rep.start = calloc((size_t)rep.nkernels + 1, sizeof *rep.start)) ||
                         !(rep.dur = calloc((size_t)rep.nkernels + 1, sizeof *rep.dur))))
      st = st_error(ST_NO_MEMORY, "out of memory");
  }
  if (!st && cuda) {
    st = bench_cuda(s, rt_bundle_spec(b, spec), &rep);
    if (!st && !json) {
      printf("bench %s on %s: %s\n%d kernels, %d warm-up runs, median of %d runs\n", path, device, rep.hw,
             rep.nkernels, warmup, iters);
      if (rep.copy_bw > 0) printf("device copy bandwidth: %.1f GB/s (%s)\n", rep.copy_bw * 1e-9, rep.copy_how);
      else printf("device copy bandwidth: %s\n", rep.copy_how);
      printf("FLOP peak: %s\n", rep.peak_how);
    }
  } else if (!st) {
    int nt = rt_session_threads(s);
    rep.copy_bw = cli_host_copy_bandwidth(nt);
    snprintf(rep.hw, sizeof rep.hw, "%d thread%s", nt, nt == 1 ? "" : "s");
    if (rep.copy_bw > 0)
      snprintf(rep.copy_how, sizeof rep.copy_how, "best of 3 host copies of 256 MiB on %d threads, read + write", nt);
    else snprintf(rep.copy_how, sizeof rep.copy_how, "not measured (out of memory)");
    snprintf(rep.peak_how, sizeof rep.peak_how, "not used on the CPU: bytes only");
    if (!json) {
      printf("bench %s on %s, %d thread%s: %d kernels, %d warm-up runs, median of %d runs\n", path, device, nt,
             nt == 1 ? "" : "s", rep.nkernels, warmup, iters);
      if (rep.copy_bw > 0) printf("host copy bandwidth: %.2f GB/s (%s)\n", rep.copy_bw * 1e-9, rep.copy_how);
      else printf("host copy bandwidth: not measured (out of memory)\n");
    }
    char map[64];
    if (perf_map) {
      st = write_perf_map(rt_bundle_spec(b, spec), map, sizeof map);
      if (!st && !json) printf("perf map: %s\n", map);
    }
    if (!st) st = bench_cpu(s, &rep);
  }
  if (!st) {
    if (json) st = print_json(&rep);
    else print_table(&rep);
  }
  if (!st && trace) {
    st = write_trace(trace, &rep, cuda);
    if (!st && !json) printf("trace: %s (open it in https://ui.perfetto.dev or chrome://tracing)\n", trace);
  }
  json_decref(rep.check);
  free(rep.start);
  free(rep.dur);
  free(rep.rows);
  free(rep.res);
  buffers_free(&keep);
  smelt_session_destroy(s);
  smelt_bundle_close(b);
  return st ? cli_fail(st) : 0;
}
