/* The tuner engine (compiler/tune.h): measure every variant of a model's
 * matmul and attention kernels on the GPU and record the fastest in the
 * tuning table (codegen/cuda/table.h) that `smelt compile --target cuda`
 * reads.  `smelt tune` (cli/tune.c) is its command line; the flags named
 * below stand for the ScTuneOptions fields of the same names (--dim is
 * dims, --budget budget_s).  Progress goes to ScTuneOptions.log, a line at
 * a time.
 *
 * The model is loaded and optimised exactly as `smelt compile --target
 * cuda` does (the same pass pipeline, the fuse pass budgeted for the arch),
 * once per combination of the --dim values, and lowered to kernels.  Every
 * kernel with a tuning key (cg_cuda_tune_key: op, dtype, rows M, the rest of
 * the shape) is a job; jobs whose key falls in the same table row (the same
 * op, dtype, shape and bucket of M, cg_tune_bucket) are measured once.
 *
 * Per job: the backend lists the variants it can generate for the kernel on
 * the arch, the heuristic's first (cg_cuda_variants; with --allow-tf32,
 * cg_cuda_variants_tf32: f32 matmuls get their tf32 candidates too, and
 * outputs are compared with a TF32 tolerance).  Each candidate is
 * generated alone first, so one the backend cannot generate is dropped with
 * its reason; the rest become one module of copies of the kernel, one per
 * candidate with the candidate forced, one compilation unit each, which
 * NVRTC compiles in parallel through the disk cache (a unit NVRTC rejects is
 * dropped the same way).  On the GPU every candidate gets the same inputs
 * (constants from the graph, deterministic random data in [-1, 1] for the
 * rest) and outputs of its own, pre-filled with 0xFF bytes so that an
 * element a candidate forgets to write cannot pass; it runs once and its
 * outputs are compared with the heuristic's (largest error over the
 * largest magnitude, per-dtype tolerance; NaN and infinities must match),
 * and the shared workspace must be all zero again afterwards (the contract
 * of FmtCudaLaunch.workspace).  A candidate that fails either check is
 * REJECTED loudly and not timed; the run goes on.
 *
 * Timing: a kernel run right after itself finds its operands in L2, which
 * in a model it does not (the layers around it stream other weights
 * through), and the time between two host launches is not kernel time.  So
 * each timed launch follows a "scrub" kernel that reads twice the L2's size
 * (reads, so that the lines left behind are clean and evicting them costs
 * the candidate nothing), queued back to back, and CUDA events bracket only
 * the candidate (rt_cuda_time_kernels over the list scrub, cand, scrub,
 * cand, ...).  A round holds enough pairs for about 20 ms of work; the time
 * reported is the median of every sample of 5 rounds.  Achieved GB/s and TFLOP/s come
 * from the kernel's estimated bytes and FLOPs, the bandwidth set against
 * the device's copy bandwidth (a copy kernel over 256 MiB, measured once).
 *
 * The fastest candidate that passed goes into the table (an existing file
 * is read first, and only the rows measured now are replaced), with a note
 * of its time; the file is rewritten after every job, so stopping at the
 * --budget (checked before each job), an error or an interrupt keeps what
 * was measured.  --dry-run does everything up to the GPU (jobs, candidates,
 * generation, NVRTC) without one, and writes nothing.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "compiler/tune.h"
#include "ir/clock.h"
#include "codegen/cuda/cg_cuda.h"
#include "codegen/cuda/table.h"
#include "codegen/lower.h"
#include "compiler/driver.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "runtime/cuda_driver.h"

#define TUNE_MAX_CANDS 64
#define TUNE_ROUNDS 5
#define TUNE_ROUND_MS 20.0
#define TUNE_MAX_PAIRS 256
#define TUNE_MAX_ARGS 256
/* FLOPs per byte above which a kernel is reported as compute-bound: the
 * ridge of the roofline of 16-bit tensor cores is ~200 on the H100/H200 and
 * ~150 on the A100; below it the bytes are what bound the time. */
#define TUNE_RIDGE 150.0
#define TUNE_COPY_BYTES ((size_t)256 << 20)

/* ---- small helpers ---- */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* "matmul f16 M=1 K=4096 N=11008 Z=1 ta=0 tb=1" */
static void key_label(const CgTuneKey *k, char *buf, size_t cap) {
  const char *m = strcmp(k->op, "matmul") == 0 ? "M" : strcmp(k->op, "attention") == 0 ? "S" : "m";
  snprintf(buf, cap, "%s %s %s=%lld %s", k->op, k->dtype, m, (long long)k->m, k->rest);
}

/* The first line of a message (NVRTC logs run long). */
static void first_line(const char *msg, char *buf, size_t cap) {
  size_t n = strcspn(msg, "\n");
  if (n >= cap) n = cap - 1;
  memcpy(buf, msg, n);
  buf[n] = 0;
}

/* Whether a cubin for arch runs on a GPU of compute capability dev_cc (the
 * driver's rule: same major version, minor not above the GPU's; an 'a'
 * arch only on exactly its GPU). */
static bool arch_runs_on(const char *arch, int dev_cc) {
  int cc;
  bool specific;
  if (!ir_cuda_parse_arch(arch, &cc, &specific)) return false;
  return cc / 10 == dev_cc / 10 && cc <= dev_cc && (!specific || cc == dev_cc);
}

/* Creates the directories above path (mkdir -p of its dirname). */
static smelt_status make_parent_dirs(const char *path) {
  char *p = strdup(path);
  if (!p) return st_error(ST_NO_MEMORY, "out of memory");
  smelt_status st = NULL;
  for (char *s = strchr(p + 1, '/'); s && !st; s = strchr(s + 1, '/')) {
    *s = 0;
    if (mkdir(p, 0777) != 0 && errno != EEXIST)
      st = st_error(ST_IO, "%s: error: cannot create directory: %s", p, strerror(errno));
    *s = '/';
  }
  free(p);
  return st;
}

/* ---- the tuner's state ---- */

typedef struct {
  Graph *g;
  Kernel *k;
  int nk;
} Spec;

typedef struct {
  int spec, kernel;
  CgTuneKey key;
  int64_t lo, hi; /* its table row's interval */
} Job;

typedef struct {
  const char *model, *out_path;
  char arch[16];
  double budget, t0; /* budget <= 0: none */
  bool dry_run;
  bool allow_tf32; /* f32 matmuls: tf32 variants are candidates (CgCudaOptions.allow_tf32) */
  const QuantOptions *quant; /* the quantize pass's options; NULL = not quantised */
  void (*log)(void *ctx, const char *line);
  void *log_ctx;
  RtCudaDevice *dev;
  CgNvrtc *nv;
  CgTuneTable *table;
  /* the helper kernels: an L2 scrub before each timed launch, and a copy
   * for the bandwidth the notes are set against */
  RtCudaModule *aux;
  RtCudaFunction scrub_fn, copy_fn;
  RtCudaPtr scrub_buf;
  unsigned long long scrub_n16;
  void *scrub_params[1 + 1];
  RtCudaLaunch scrub;
  double copy_bw; /* bytes/s; 0 when not measured */
  int tuned, rejected, dropped;
} Tuner;

/* One candidate variant of the job's kernel. */
typedef struct {
  char token[CG_VARIANT_LEN]; /* the variant forced */
  char used[CG_VARIANT_LEN];  /* the variant the emitter says it generated (FmtCudaLaunch.variant) */
  char name[96];
  bool ok;                 /* still in the running */
  int mk;                  /* its kernel in the module, -1 before */
  RtCudaModule *mod;
  RtCudaFunction fn;
  RtCudaPtr *out;          /* per output of the kernel */
  RtCudaPtr vals[TUNE_MAX_ARGS + 2];
  void *params[TUNE_MAX_ARGS + 2 + FMT_MAX_TMAPS];
  unsigned char *maps;     /* 64-byte aligned, 128 bytes per TMA descriptor */
  RtCudaLaunch launch;
  double ms;
} Cand;

/* One line of the report to the caller's log.  Lines are formatted whole
 * (a model path or an NVRTC message has no fixed length), on the stack when
 * they fit. */
static void tune_log(const Tuner *tu, const char *fmt, ...) SMELT_PRINTF(2, 3);
static void tune_log(const Tuner *tu, const char *fmt, ...) {
  if (!tu->log) return;
  char small[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  char *big = (size_t)n < sizeof small ? NULL : malloc((size_t)n + 1);
  if (big) {
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  /* out of memory: the line cut short rather than lost */
  tu->log(tu->log_ctx, big ? big : small);
  free(big);
}

/* A line about candidate c, under its variant's name.  The messages are
 * bounded (first lines of at most 300 bytes, reject()'s 512). */
static void cand_line(const Tuner *tu, const Cand *c, const char *fmt, ...) SMELT_PRINTF(3, 4);
static void cand_line(const Tuner *tu, const Cand *c, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  tune_log(tu, "  %-50s %s", c->token, msg);
}

/* ---- the helper kernels ---- */

static const char aux_source[] =
    "// smelt tune's helpers: an L2 scrub and a plain copy\n"
    "// Reads twice the L2's size (a zeroed buffer): what the previous launch left in L2 is\n"
    "// evicted, and the lines that replace it are clean, so the next kernel pays no\n"
    "// write-backs for them.  The store never happens; it keeps the loads alive.\n"
    "extern \"C\" __global__ void smelt_scrub(int4 *p, unsigned long long n) {\n"
    "  int acc = 0;\n"
    "  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;\n"
    "       i += (unsigned long long)gridDim.x * blockDim.x) {\n"
    "    int4 v = p[i];\n"
    "    acc ^= v.x ^ v.y ^ v.z ^ v.w;\n"
    "  }\n"
    "  if (acc == 0x5eed1234) ((int *)p)[0] = acc;\n"
    "}\n"
    "extern \"C\" __global__ void smelt_copy(const int4 *__restrict__ src, int4 *__restrict__ dst,\n"
    "                                        unsigned long long n) {\n"
    "  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
    "  if (i < n) dst[i] = src[i];\n"
    "}\n";

/* Loads the helpers, allocates the scrub buffer and measures the copy
 * bandwidth (read + write bytes over the median of 5 event-timed copies). */
static smelt_status aux_setup(Tuner *tu) {
  const RtCudaInfo *info = rt_cuda_device_info(tu->dev);
  CgCudaBinary bin;
  memset(&bin, 0, sizeof bin);
  RETURN_IF_ERROR(cg_cuda_compile_source(tu->nv, aux_source, "smelt tune helpers", info->arch, NULL, &bin));
  smelt_status st = rt_cuda_module_load_image(tu->dev, bin.cubin, "smelt tune helpers", &tu->aux);
  cg_cuda_binary_clear(&bin);
  if (!st) st = rt_cuda_module_function(tu->aux, "smelt_scrub", 0, &tu->scrub_fn);
  if (!st) st = rt_cuda_module_function(tu->aux, "smelt_copy", 0, &tu->copy_fn);
  size_t scrub_bytes = info->l2_bytes > 0 ? 2 * (size_t)info->l2_bytes : (size_t)128 << 20;
  if (scrub_bytes < ((size_t)32 << 20)) scrub_bytes = (size_t)32 << 20;
  tu->scrub_n16 = scrub_bytes / 16;
  if (!st) st = rt_cuda_alloc(tu->dev, scrub_bytes, &tu->scrub_buf);
  if (!st) st = rt_cuda_memset(tu->dev, tu->scrub_buf, 0, scrub_bytes);
  RETURN_IF_ERROR(st);
  tu->scrub_params[0] = &tu->scrub_buf;
  tu->scrub_params[1] = &tu->scrub_n16;
  unsigned grid = (unsigned)(info->sm_count > 0 ? info->sm_count * 8 : 1024);
  tu->scrub = (RtCudaLaunch){tu->scrub_fn, "L2 scrub", {grid, 1, 1}, {256, 1, 1}, 0, tu->scrub_params, false, NULL, NULL};

  RtCudaPtr src = 0, dst = 0;
  st = rt_cuda_alloc(tu->dev, TUNE_COPY_BYTES, &src);
  if (!st) st = rt_cuda_alloc(tu->dev, TUNE_COPY_BYTES, &dst);
  if (!st) st = rt_cuda_memset(tu->dev, src, 1, TUNE_COPY_BYTES);
  unsigned long long n16 = TUNE_COPY_BYTES / 16;
  void *params[3] = {&src, &dst, &n16};
  RtCudaLaunch copy = {tu->copy_fn, "copy", {(unsigned)((n16 + 255) / 256), 1, 1}, {256, 1, 1}, 0, params, false, NULL, NULL};
  double ms[5];
  for (int r = 0; r < 5 && !st; r++) st = rt_cuda_time_kernels(tu->dev, &copy, 1, 3, &ms[r]);
  if (!st) {
    double t = median(ms, 5) * 1e-3;
    tu->copy_bw = t > 0 ? 2.0 * (double)TUNE_COPY_BYTES / t : 0;
  }
  if (src) rt_cuda_free(tu->dev, src);
  if (dst) rt_cuda_free(tu->dev, dst);
  return st;
}

static void aux_free(Tuner *tu) {
  if (tu->scrub_buf) rt_cuda_free(tu->dev, tu->scrub_buf);
  rt_cuda_module_unload(tu->aux);
  tu->scrub_buf = 0, tu->aux = NULL;
}

/* ---- data and comparison ---- */

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* The last slot of the KV cache when v is the positions operand of an
 * attention over a cache (cache: true), else -1. */
static int64_t cache_last_slot(const Graph *g, int v) {
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (!n->dead && n->op == OP_ATTENTION && n->nin > 3 && n->in[3] == v && ir_attr_int(n, "cache"))
      return g->val[n->in[1]].type.dim[2] - 1;
  }
  return -1;
}

/* Host data for input value v: the constant's own data, else random
 * numbers in [-1, 1) for floats, zeros for integers (indices stay in
 * range) and true for bools (masks let everything through).  The positions
 * of an attention over a KV cache are its last slot, so that every key is
 * attended: with zeros (one key) a decode kernel that walks the keys alone
 * timed fastest, and at a real context it was 10x slower than the split
 * one (W5 decode on an H100, 2026-12-08). */
static void *input_data(const Graph *g, int v, size_t bytes, bool *out_owned) {
  const Value *val = &g->val[v];
  *out_owned = false;
  if (val->kind == VK_CONST && val->data) return val->data;
  void *p = calloc(bytes ? bytes : 1, 1);
  if (!p) return NULL;
  *out_owned = true;
  DType dt = val->type.dt;
  int64_t n = ir_type_numel(&val->type);
  uint64_t s = (uint64_t)v * 0x9E3779B97F4A7C15ull + 12345;
  int64_t last = dt_is_float(dt) || dt == DT_BOOL ? -1 : cache_last_slot(g, v);
  if (dt == DT_BOOL) memset(p, 1, (size_t)n);
  else if (dt_is_float(dt))
    for (int64_t i = 0; i < n; i++) dt_store(dt, p, (size_t)i, (double)(xorshift(&s) >> 11) / 4503599627370496.0 - 1.0);
  else if (last >= 0)
    for (int64_t i = 0; i < n; i++) dt_store(dt, p, (size_t)i, (double)last);
  return p;
}

/* tf32: f32 results may come from TF32 operands (10-bit mantissas) */
static double tolerance(DType dt, bool tf32) {
  switch (dt) {
  case DT_F16: return 1e-2;
  case DT_BF16: return 5e-2;
  case DT_F32: return tf32 ? 2e-3 : 1e-4;
  case DT_F64: return 1e-9;
  default: return 0; /* integers and bools: exactly */
  }
}

/* Whether got matches ref: the largest error over the largest magnitude of
 * ref within tol, NaN and infinities in the same places.  *out_err is that
 * ratio (infinite for a NaN/infinity mismatch, *out_at its element). */
static bool outputs_match(DType dt, bool tf32, const void *got, const void *ref, int64_t n, double *out_err,
                          int64_t *out_at) {
  double maxref = 0, maxerr = 0;
  *out_at = -1;
  for (int64_t i = 0; i < n; i++) {
    double a = dt_load(dt, got, (size_t)i), b = dt_load(dt, ref, (size_t)i);
    if (!isfinite(a) || !isfinite(b)) {
      bool same = isnan(b) ? isnan(a) : a == b;
      if (!same) {
        *out_err = INFINITY;
        *out_at = i;
        return false;
      }
      continue;
    }
    if (fabs(b) > maxref) maxref = fabs(b);
    if (fabs(a - b) > maxerr) maxerr = fabs(a - b), *out_at = i;
  }
  *out_err = maxerr == 0 ? 0 : maxerr / (maxref > 1e-30 ? maxref : 1e-30);
  return *out_err <= tolerance(dt, tf32);
}

/* ---- one job ---- */

typedef struct {
  int nin, nout;
  RtCudaPtr *in;           /* per input argument */
  RtCudaPtr ws;
  uint64_t ws_bytes;
  RtCudaPtr rng;           /* ranged dims: each range at its max (the kernels' rng argument) */
  void **ref;              /* per output: the reference candidate's result (host) */
  int ref_cand;            /* which candidate gave it, -1 before */
  int compared, mismatches; /* candidates compared with it, and those that differed */
} JobBuffers;

static void job_buffers_free(Tuner *tu, JobBuffers *b) {
  for (int a = 0; b->in && a < b->nin; a++)
    if (b->in[a]) rt_cuda_free(tu->dev, b->in[a]);
  if (b->ws) rt_cuda_free(tu->dev, b->ws);
  if (b->rng) rt_cuda_free(tu->dev, b->rng);
  for (int o = 0; b->ref && o < b->nout; o++) free(b->ref[o]);
  free(b->in), free(b->ref);
  memset(b, 0, sizeof *b);
}

static void cands_free(Tuner *tu, Cand *c, int n, int nout) {
  for (int i = 0; c && i < n; i++) {
    for (int o = 0; c[i].out && o < nout; o++)
      if (c[i].out[o]) rt_cuda_free(tu->dev, c[i].out[o]);
    free(c[i].out);
    free(c[i].maps);
    rt_cuda_module_unload(c[i].mod);
  }
  free(c);
}

/* Generates each candidate alone (dropping those the backend cannot
 * generate), then all survivors as one module, one unit each; cand[i].mk
 * is its kernel there. */
static smelt_status generate(Tuner *tu, const Graph *g, const Kernel *k, Cand *c, int n, FmtCudaModule **out_m) {
  *out_m = NULL;
  Kernel *copies = calloc((size_t)n, sizeof *copies);
  const char **force = calloc((size_t)n, sizeof *force);
  if (!copies || !force) {
    free(copies), free(force);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  int nm = 0;
  for (int i = 0; i < n; i++) {
    Kernel kc = *k; /* shares k's args: never freed through the copy */
    char suffix[16];
    int ns = snprintf(suffix, sizeof suffix, "__c%d", i);
    size_t base = strnlen(kc.name, sizeof kc.name - 1 - (size_t)ns);
    memcpy(kc.name + base, suffix, (size_t)ns + 1);
    snprintf(c[i].name, sizeof c[i].name, "%s", kc.name);
    const char *one[1] = {c[i].token};
    CgCudaOptions o = {.args_aligned = true, .arch = tu->arch, .force = one, .max_units = 1, .allow_tf32 = tu->allow_tf32};
    FmtCudaModule *m1 = NULL;
    smelt_status st = cg_cuda_generate(g, &kc, 1, &o, &m1);
    if (st) {
      char why[300];
      first_line(st_message(st), why, sizeof why);
      cand_line(tu, &c[i], "dropped: not generated: %s", why);
      st_free(st);
      tu->dropped++;
      continue;
    }
    /* the table records what was measured: the emitter's own name for it */
    snprintf(c[i].used, sizeof c[i].used, "%s", m1->kernels[0].variant[0] ? m1->kernels[0].variant : c[i].token);
    if (strcmp(c[i].used, c[i].token) != 0) cand_line(tu, &c[i], "note: generated as '%s'", c[i].used);
    fmt_cuda_module_free(m1);
    c[i].ok = true;
    c[i].mk = nm;
    copies[nm] = kc;
    force[nm++] = c[i].token;
  }
  smelt_status st = NULL;
  if (nm > 0) {
    CgCudaOptions o = {.args_aligned = true, .arch = tu->arch, .force = force, .max_units = nm,
                       .allow_tf32 = tu->allow_tf32};
    st = cg_cuda_generate(g, copies, nm, &o, out_m);
    if (st) st = st_prefix(st, "the candidates of %s together (each alone was generated)", k->name);
  }
  free(copies);
  free(force);
  return st;
}

/* Compiles the module's units for the arch; a unit NVRTC rejects drops its
 * candidate.  out_bins: one per unit (those of dropped units empty). */
static smelt_status compile(Tuner *tu, const FmtCudaModule *m, Cand *c, int n, CgCudaBinary **out_bins) {
  const char *arch = tu->arch;
  double t0 = smelt_now_s();
  smelt_status st = cg_cuda_compile_module(tu->nv, m, &arch, 1, NULL, out_bins);
  int hits = 0;
  if (!st) {
    for (int u = 0; u < m->nunits; u++) hits += (*out_bins)[u].cache_hit;
    tune_log(tu, "  compiled %d candidate%s for %s in %.1f s (%d from the cache)", m->nunits,
             m->nunits == 1 ? "" : "s", arch, smelt_now_s() - t0, hits);
    return NULL;
  }
  /* some unit failed: compile each on its own (the good ones are cached
   * now) to know which */
  st_free(st);
  CgCudaBinary *bins = calloc((size_t)m->nunits, sizeof *bins);
  if (!bins) return st_error(ST_NO_MEMORY, "out of memory");
  for (int i = 0; i < n; i++) {
    if (!c[i].ok) continue;
    int u = m->kernels[c[i].mk].unit;
    char what[160];
    snprintf(what, sizeof what, "candidate %s", c[i].token);
    smelt_status ust = cg_cuda_compile_source(tu->nv, m->units[u], what, arch, NULL, &bins[u]);
    if (ust) {
      char why[300];
      /* NVRTC's log follows the first line: its first error is what matters */
      const char *msg = st_message(ust), *err = strstr(msg, "error");
      first_line(err ? err : msg, why, sizeof why);
      cand_line(tu, &c[i], "dropped: NVRTC: %s", why);
      st_free(ust);
      c[i].ok = false;
      tu->dropped++;
    }
  }
  tune_log(tu, "  compiled for %s in %.1f s", arch, smelt_now_s() - t0);
  *out_bins = bins;
  return NULL;
}

/* Device buffers shared by the candidates (inputs, workspace), each
 * candidate's outputs, parameters and TMA descriptors. */
static smelt_status prepare(Tuner *tu, const Graph *g, const Kernel *k, const FmtCudaModule *m, Cand *c, int n,
                            JobBuffers *b) {
  b->nin = k->nargs - k->nouts;
  b->nout = k->nouts;
  b->ref_cand = -1;
  b->in = calloc((size_t)(b->nin ? b->nin : 1), sizeof *b->in);
  b->ref = calloc((size_t)(b->nout ? b->nout : 1), sizeof *b->ref);
  if (!b->in || !b->ref) return st_error(ST_NO_MEMORY, "out of memory");
  for (int a = 0; a < b->nin; a++) {
    int v = k->args[a];
    size_t bytes = ir_type_bytes(&g->val[v].type);
    bool owned;
    void *data = input_data(g, v, bytes, &owned);
    if (!data) return st_error(ST_NO_MEMORY, "out of memory making the data of '%s'", g->val[v].name);
    smelt_status st = rt_cuda_alloc(tu->dev, bytes ? bytes : 16, &b->in[a]);
    if (!st && bytes) st = rt_cuda_upload(tu->dev, b->in[a], data, bytes);
    if (owned) free(data);
    RETURN_IF_ERROR(st);
  }
  if (g->nranges) {
    int64_t rv[IR_MAX_RANGES] = {0};
    for (int r = 0; r < g->nranges; r++) rv[r] = g->ranges[r].max;
    RETURN_IF_ERROR(rt_cuda_alloc(tu->dev, sizeof rv, &b->rng));
    RETURN_IF_ERROR(rt_cuda_upload(tu->dev, b->rng, rv, sizeof rv));
  }
  for (int i = 0; i < n; i++)
    if (c[i].ok && m->kernels[c[i].mk].workspace > b->ws_bytes) b->ws_bytes = m->kernels[c[i].mk].workspace;
  if (b->ws_bytes) {
    RETURN_IF_ERROR(rt_cuda_alloc(tu->dev, (size_t)b->ws_bytes, &b->ws));
    RETURN_IF_ERROR(rt_cuda_memset(tu->dev, b->ws, 0, (size_t)b->ws_bytes));
  }
  for (int i = 0; i < n; i++) {
    Cand *ci = &c[i];
    if (!ci->ok) continue;
    const FmtCudaLaunch *l = &m->kernels[ci->mk];
    if (!(ci->out = calloc((size_t)(b->nout ? b->nout : 1), sizeof *ci->out))) return st_error(ST_NO_MEMORY, "out of memory");
    for (int o = 0; o < b->nout; o++) {
      size_t bytes = ir_type_bytes(&g->val[k->args[b->nin + o]].type);
      RETURN_IF_ERROR(rt_cuda_alloc(tu->dev, bytes ? bytes : 16, &ci->out[o]));
    }
    int np = 0;
    for (int a = 0; a < k->nargs; a++) ci->vals[np++] = a < b->nin ? b->in[a] : ci->out[a - b->nin];
    if (g->nranges) ci->vals[np++] = b->rng; /* format/cuda_launch.h */
    if (l->workspace) ci->vals[np++] = b->ws;
    for (int p = 0; p < np; p++) ci->params[p] = &ci->vals[p];
    if (l->ntmaps > 0) {
      if (!(ci->maps = aligned_alloc(64, (size_t)l->ntmaps * 128))) return st_error(ST_NO_MEMORY, "out of memory");
      for (int t = 0; t < l->ntmaps; t++) {
        const FmtCudaTmap *tm = &l->tmaps[t];
        smelt_status st =
            tm->arg >= 0 && tm->arg < k->nargs
                ? rt_cuda_tensor_map(tu->dev, tm->dtype, tm->rank, ci->vals[tm->arg], tm->dims, tm->strides, tm->box,
                                     tm->swizzle, ci->maps + (size_t)t * 128)
                : st_error(ST_INTERNAL, "TMA descriptor %d maps argument %d of %d", t, tm->arg, k->nargs);
        if (st) {
          char why[300];
          first_line(st_message(st), why, sizeof why);
          cand_line(tu, ci, "dropped: TMA descriptor %d: %s", t, why);
          st_free(st);
          ci->ok = false;
          tu->dropped++;
          break;
        }
        ci->params[np + t] = ci->maps + (size_t)t * 128;
      }
      if (!ci->ok) continue;
    }
    ci->launch = (RtCudaLaunch){ci->fn, ci->name, {l->grid[0], l->grid[1], l->grid[2]},
                                {l->block[0], l->block[1], l->block[2]}, l->smem, ci->params, false, NULL, NULL};
  }
  return NULL;
}

/* A launch failed: whether the context survived (an illegal address, say,
 * poisons it for everything after). */
static smelt_status device_alive(Tuner *tu) {
  smelt_status st = rt_cuda_sync(tu->dev);
  if (st) st = st_prefix(st, "the GPU context is unusable after a failed candidate");
  return st;
}

static void reject(Tuner *tu, Cand *c, const char *fmt, ...) SMELT_PRINTF(3, 4);
static void reject(Tuner *tu, Cand *c, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cand_line(tu, c, "REJECTED: %s", msg);
  c->ok = false;
  tu->rejected++;
}

/* Runs candidate c once and checks it: its outputs against the reference
 * (the first candidate that ran, the heuristic unless it failed), the
 * workspace left zero.  Fatal errors only in the status. */
static smelt_status check(Tuner *tu, const Graph *g, const Kernel *k, Cand *all, int ci, JobBuffers *b) {
  Cand *c = &all[ci];
  for (int o = 0; o < b->nout; o++)
    RETURN_IF_ERROR(rt_cuda_memset(tu->dev, c->out[o], 0xFF, ir_type_bytes(&g->val[k->args[b->nin + o]].type)));
  smelt_status st = rt_cuda_launch(tu->dev, &c->launch, 1);
  if (!st) st = rt_cuda_sync(tu->dev);
  if (st) {
    char why[300];
    first_line(st_message(st), why, sizeof why);
    st_free(st);
    reject(tu, c, "the launch failed: %s", why);
    return device_alive(tu);
  }
  if (b->ws_bytes) {
    unsigned char *ws = malloc((size_t)b->ws_bytes);
    if (!ws) return st_error(ST_NO_MEMORY, "out of memory");
    st = rt_cuda_download(tu->dev, ws, b->ws, (size_t)b->ws_bytes);
    size_t dirty = 0;
    for (size_t i = 0; !st && i < b->ws_bytes; i++) dirty += ws[i] != 0;
    free(ws);
    RETURN_IF_ERROR(st);
    if (dirty) {
      reject(tu, c, "left %zu of the workspace's %llu bytes non-zero (a kernel must leave it zero)", dirty,
             (unsigned long long)b->ws_bytes);
      return rt_cuda_memset(tu->dev, b->ws, 0, (size_t)b->ws_bytes);
    }
  }
  bool is_ref = b->ref_cand < 0;
  for (int o = 0; o < b->nout && c->ok; o++) {
    const Value *v = &g->val[k->args[b->nin + o]];
    size_t bytes = ir_type_bytes(&v->type);
    void *got = malloc(bytes ? bytes : 1);
    if (!got) return st_error(ST_NO_MEMORY, "out of memory");
    st = rt_cuda_download(tu->dev, got, c->out[o], bytes);
    if (st) {
      free(got);
      return st;
    }
    if (is_ref) {
      b->ref[o] = got;
      continue;
    }
    double err;
    int64_t at;
    if (!outputs_match(v->type.dt, tu->allow_tf32, got, b->ref[o], ir_type_numel(&v->type), &err, &at)) {
      char ty[96];
      ir_type_str(&v->type, ty, sizeof ty);
      const char *ref = b->ref_cand == 0 ? "the heuristic" : all[b->ref_cand].token;
      if (isinf(err))
        reject(tu, c, "output '%s' %s: element %lld is %g where %s has %g", v->name, ty, (long long)at,
               dt_load(v->type.dt, got, (size_t)at), ref, dt_load(v->type.dt, b->ref[o], (size_t)at));
      else
        reject(tu, c, "output '%s' %s: error %.3g of the largest magnitude (tolerance %g; element %lld: %g, %s %g)",
               v->name, ty, err, tolerance(v->type.dt, tu->allow_tf32), (long long)at, dt_load(v->type.dt, got, (size_t)at), ref,
               dt_load(v->type.dt, b->ref[o], (size_t)at));
      b->mismatches++;
    }
    b->compared += o == 0;
    free(got);
  }
  if (is_ref) {
    b->ref_cand = ci;
    if (ci > 0) {
      tune_log(tu, "  (the heuristic did not run: the others are compared with %s)", c->token);
    }
  }
  return NULL;
}

/* Median milliseconds of c's launch, each run right after an L2 scrub. */
static smelt_status time_launch(Tuner *tu, const RtCudaLaunch *l, double *out_ms) {
  RtCudaLaunch pair[2] = {tu->scrub, *l};
  double pilot[2];
  RETURN_IF_ERROR(rt_cuda_time_kernels(tu->dev, pair, 2, 3, pilot));
  double per = pilot[0] + pilot[1];
  int pairs = per > 0 ? (int)ceil(TUNE_ROUND_MS / per) : TUNE_MAX_PAIRS;
  if (pairs < 2) pairs = 2;
  if (pairs > TUNE_MAX_PAIRS) pairs = TUNE_MAX_PAIRS;
  RtCudaLaunch *list = malloc(sizeof *list * 2 * (size_t)pairs);
  double *ms = malloc(sizeof *ms * 2 * (size_t)pairs), *samples = malloc(sizeof *samples * TUNE_ROUNDS * (size_t)pairs);
  smelt_status st = list && ms && samples ? NULL : st_error(ST_NO_MEMORY, "out of memory");
  for (int p = 0; !st && p < pairs; p++) list[2 * p] = tu->scrub, list[2 * p + 1] = *l;
  int ns = 0;
  for (int r = 0; r < TUNE_ROUNDS && !st; r++) {
    st = rt_cuda_time_kernels(tu->dev, list, 2 * pairs, 1, ms);
    for (int p = 0; !st && p < pairs; p++) samples[ns++] = ms[2 * p + 1];
  }
  if (!st) *out_ms = median(samples, ns);
  free(list), free(ms), free(samples);
  return st;
}

/* "0.0312 ms, 83% of 4280 GB/s" or "0.41 ms, 612 TFLOP/s", and the gain. */
static void row_note(const Tuner *tu, const Kernel *k, double ms, double speedup, char *buf, size_t cap) {
  double s = ms * 1e-3;
  bool compute = k->bytes > 0 && k->flops / k->bytes >= TUNE_RIDGE;
  int n;
  if (compute || k->bytes <= 0) n = snprintf(buf, cap, "%.4g ms, %.0f TFLOP/s", ms, k->flops / s * 1e-12);
  else if (tu->copy_bw > 0)
    n = snprintf(buf, cap, "%.4g ms, %.0f%% of %.0f GB/s", ms, 100.0 * k->bytes / s / tu->copy_bw, tu->copy_bw * 1e-9);
  else n = snprintf(buf, cap, "%.4g ms, %.0f GB/s", ms, k->bytes / s * 1e-9);
  if (speedup > 0 && n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "; %.2fx the heuristic", speedup);
}

/* Measures the candidates of job j and puts the winner into the table;
 * *out_put says whether a row was written.  head begins the job's first
 * line ("[1/4] matmul ... (kernel k00_h): "), which the number of
 * candidates ends.  Candidates that fail are
 * reported and skipped; only an error that leaves nothing to go on with
 * (the device lost, out of memory) is returned. */
static smelt_status tune_job(Tuner *tu, const Graph *g, const Kernel *k, const Job *j, const char *head,
                              bool *out_put) {
  *out_put = false;
  if (k->nargs > TUNE_MAX_ARGS) {
    tune_log(tu, "%sskipped: %d arguments (the tuner passes at most %d)", head, k->nargs, TUNE_MAX_ARGS);
    return NULL;
  }
  char (*tok)[CG_VARIANT_LEN] = calloc(TUNE_MAX_CANDS, sizeof *tok);
  if (!tok) return st_error(ST_NO_MEMORY, "out of memory");
  int n = tu->allow_tf32 ? cg_cuda_variants_tf32(g, k, tu->arch, tok, TUNE_MAX_CANDS)
                         : cg_cuda_variants(g, k, tu->arch, tok, TUNE_MAX_CANDS);
  tune_log(tu, "%s%d candidate%s", head, n, n == 1 ? "" : "s");
  if (n <= 1) {
    tune_log(tu, "  nothing to choose from: the compiler's heuristic stays");
    free(tok);
    return NULL;
  }
  Cand *c = calloc((size_t)n, sizeof *c);
  if (!c) {
    free(tok);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  for (int i = 0; i < n; i++) snprintf(c[i].token, sizeof c[i].token, "%s", tok[i]), c[i].mk = -1;
  free(tok);
  FmtCudaModule *m = NULL;
  CgCudaBinary *bins = NULL;
  JobBuffers b;
  memset(&b, 0, sizeof b);
  smelt_status st = generate(tu, g, k, c, n, &m);
  if (!st && !m) tune_log(tu, "  -> no candidate could be generated: the table is left as it was for this shape");
  if (!st && m) st = compile(tu, m, c, n, &bins);
  if (!st && m && tu->dry_run) {
    for (int i = 0; i < n; i++) {
      if (!c[i].ok) continue;
      const FmtCudaLaunch *l = &m->kernels[c[i].mk];
      cand_line(tu, &c[i], "grid %ux%ux%u block %ux%ux%u smem %u ws %llu tmaps %d cubin %zu bytes", l->grid[0], l->grid[1],
                l->grid[2], l->block[0], l->block[1], l->block[2], l->smem, (unsigned long long)l->workspace,
                l->ntmaps, bins[l->unit].cubin_len);
    }
  } else if (!st && m) {
    /* load each survivor */
    for (int i = 0; i < n && !st; i++) {
      if (!c[i].ok) continue;
      const FmtCudaLaunch *l = &m->kernels[c[i].mk];
      smelt_status lst = rt_cuda_module_load_image(tu->dev, bins[l->unit].cubin, c[i].name, &c[i].mod);
      if (!lst) lst = rt_cuda_module_function(c[i].mod, l->symbol, l->smem, &c[i].fn);
      if (lst) {
        char why[300];
        first_line(st_message(lst), why, sizeof why);
        cand_line(tu, &c[i], "dropped: not loaded: %s", why);
        st_free(lst);
        c[i].ok = false;
        tu->dropped++;
      }
    }
    if (!st) st = prepare(tu, g, k, m, c, n, &b);
    for (int i = 0; i < n && !st; i++)
      if (c[i].ok) st = check(tu, g, k, c, i, &b);
    /* the reference is only the heuristic's kernel: when most of the
     * others agree with each other and not with it, suspect it instead */
    if (!st && b.mismatches >= 2 && 2 * b.mismatches > b.compared)
      tune_log(tu, "  (%d of %d candidates differ from %s: the reference itself may be wrong)", b.mismatches,
               b.compared, b.ref_cand == 0 ? "the heuristic" : c[b.ref_cand].token);
    int best = -1;
    for (int i = 0; i < n && !st; i++) {
      if (!c[i].ok) continue;
      smelt_status tst = time_launch(tu, &c[i].launch, &c[i].ms);
      if (tst) {
        char why[300];
        first_line(st_message(tst), why, sizeof why);
        st_free(tst);
        reject(tu, &c[i], "timing failed: %s", why);
        st = device_alive(tu);
        continue;
      }
      double s = c[i].ms * 1e-3;
      cand_line(tu, &c[i], "%9.4f ms %7.0f GB/s %7.1f TFLOP/s", c[i].ms, k->bytes / s * 1e-9, k->flops / s * 1e-12);
      if (best < 0 || c[i].ms < c[best].ms) best = i;
    }
    if (!st && best < 0) {
      tune_log(tu, "  -> no candidate passed: the table is left as it was for this shape");
    } else if (!st) {
      double speedup = c[0].ok && c[best].ms > 0 ? c[0].ms / c[best].ms : 0;
      if (best == 0) tune_log(tu, "  -> best %s (the heuristic)", c[best].token);
      else if (speedup > 0) tune_log(tu, "  -> best %s (%.2fx the heuristic)", c[best].token, speedup);
      else tune_log(tu, "  -> best %s (the heuristic did not pass)", c[best].token);
      CgTuneRow r;
      memset(&r, 0, sizeof r);
      snprintf(r.op, sizeof r.op, "%s", j->key.op);
      snprintf(r.dtype, sizeof r.dtype, "%s", j->key.dtype);
      snprintf(r.arch, sizeof r.arch, "%s", tu->arch);
      r.m_lo = j->lo, r.m_hi = j->hi;
      snprintf(r.rest, sizeof r.rest, "%s", j->key.rest);
      snprintf(r.variant, sizeof r.variant, "%s", c[best].used);
      row_note(tu, k, c[best].ms, best == 0 ? 0 : speedup, r.note, sizeof r.note);
      if (cg_tune_table_put(tu->table, &r)) *out_put = true;
      else st = st_error(ST_NO_MEMORY, "out of memory in the tuning table");
    }
  }
  job_buffers_free(tu, &b);
  cands_free(tu, c, n, k->nouts);
  if (m && bins) cg_cuda_binaries_free(bins, m->nunits);
  fmt_cuda_module_free(m);
  return st;
}

/* ---- the run ---- */

/* Loads and optimises every specialisation and lists the jobs. */
static smelt_status collect_jobs(Tuner *tu, const ScDimSpace *space, DType dtype, Spec *specs, int *out_nspec,
                                 Job **out_jobs, int *out_njobs) {
  *out_nspec = 0;
  smelt_status st = NULL;
  Job *jobs = NULL;
  int njobs = 0, cap = 0;
  for (int s = 0; s < space->ncombos && !st; s++) {
    FeDim dims[SC_MAX_DIMS];
    char label[256];
    sc_dim_space_combo(space, s, dims);
    sc_dim_space_label(space, s, label, sizeof label);
    FeOptions fo = {.dims = dims, .ndims = space->ndims, .dtype = dtype};
    Spec *sp = &specs[(*out_nspec)++];
    st = fe_load_model(tu->model, &fo, &sp->g);
    /* the pipeline `smelt compile --target cuda --arch ARCH` runs */
    PassCtx pc = {.target = "cuda", .arch = tu->arch, .quant = tu->quant};
    if (!st) st = pass_run_pipeline(sp->g, &pc, tu->quant ? pass_quantize_pipeline() : NULL, NULL, NULL);
    pass_ctx_free(&pc);
    if (!st && sp->g->ngroups == 0) st = cg_single_node_groups(sp->g);
    if (!st) st = cg_lower(sp->g, &sp->k, &sp->nk);
    if (st && space->ncombos > 1) st = st_prefix(st, "specialisation %s", label);
    for (int i = 0; !st && i < sp->nk; i++) {
      CgTuneKey key;
      if (!cg_cuda_tune_key(sp->g, &sp->k[i], &key)) continue;
      int64_t lo, hi;
      cg_tune_bucket(key.m, &lo, &hi);
      /* one measurement per table row: the same op, dtype, shape and bucket */
      bool seen = false;
      for (int q = 0; q < njobs && !seen; q++)
        seen = strcmp(jobs[q].key.op, key.op) == 0 && strcmp(jobs[q].key.dtype, key.dtype) == 0 &&
               strcmp(jobs[q].key.rest, key.rest) == 0 && jobs[q].lo == lo;
      if (seen) continue;
      if (njobs == cap) {
        cap = cap ? cap * 2 : 16;
        Job *p = realloc(jobs, sizeof *p * (size_t)cap);
        if (!p) {
          st = st_error(ST_NO_MEMORY, "out of memory");
          break;
        }
        jobs = p;
      }
      jobs[njobs++] = (Job){s, i, key, lo, hi};
    }
  }
  if (st) {
    free(jobs);
    return st;
  }
  *out_jobs = jobs;
  *out_njobs = njobs;
  return NULL;
}

/* Opens the table to update: an existing file is read (a broken one stops
 * the run before any GPU time is spent), a missing one starts empty. */
static smelt_status table_open(Tuner *tu) {
  struct stat sb;
  if (stat(tu->out_path, &sb) == 0) return cg_tune_table_load(tu->out_path, &tu->table);
  if (errno != ENOENT)
    return st_error(ST_IO, "%s: error: cannot read the tuning table: %s", tu->out_path, strerror(errno));
  tu->table = cg_tune_table_new();
  return tu->table ? NULL : st_error(ST_NO_MEMORY, "out of memory");
}

/* The GPU, and the arch it runs (o->arch, else the GPU's, else in a dry run
 * the compiler's default). */
static smelt_status device_open(Tuner *tu, const ScTuneOptions *o) {
  if (!tu->dry_run) {
    smelt_status st = rt_cuda_device_create(o->device, &tu->dev);
    if (st)
      return st_prefix(st, "smelt tune: no CUDA device %d to measure on (--dry-run works without one)", o->device);
  }
  if (o->arch) snprintf(tu->arch, sizeof tu->arch, "%s", o->arch);
  else if (tu->dev) snprintf(tu->arch, sizeof tu->arch, "%s", rt_cuda_device_info(tu->dev)->arch);
  else sc_cuda_default_arch(tu->arch, sizeof tu->arch);
  if (tu->dev && !arch_runs_on(tu->arch, rt_cuda_device_info(tu->dev)->cc))
    return st_error(ST_INVALID_INPUT, "smelt tune: --arch %s does not run on GPU %d (%s, %s): tuning measures on the GPU",
                    tu->arch, o->device, rt_cuda_device_info(tu->dev)->name, rt_cuda_device_info(tu->dev)->arch);
  return NULL;
}

static void log_summary(const Tuner *tu, int done, int njobs, bool out_of_time) {
  if (out_of_time)
    tune_log(tu, "budget of %g s used up: %d of %d shapes measured (run again with a larger --budget for the rest)",
             tu->budget, done, njobs);
  if (tu->dry_run)
    tune_log(tu, "dry run: %d shape%s, %d candidate%s dropped; nothing timed, no table written", done,
             done == 1 ? "" : "s", tu->dropped, tu->dropped == 1 ? "" : "s");
  else
    tune_log(tu, "%d shape%s tuned, %d candidate%s rejected, %d dropped%s%s", tu->tuned, tu->tuned == 1 ? "" : "s",
             tu->rejected, tu->rejected == 1 ? "" : "s", tu->dropped, tu->tuned ? "; wrote " : "",
             tu->tuned ? tu->out_path : "");
}

smelt_status sc_tune_model(const ScTuneOptions *o, ScTuneResult *out_result) {
  if (out_result) memset(out_result, 0, sizeof *out_result);
  Tuner tu;
  memset(&tu, 0, sizeof tu);
  tu.t0 = smelt_now_s();
  if (!o || !o->model || !o->table_path)
    return st_error(ST_INVALID_INPUT, "sc_tune_model: a model and a table to write are required");
  int cc;
  bool specific;
  if (o->arch && (strncmp(o->arch, "sm_", 3) != 0 || strlen(o->arch) >= sizeof tu.arch ||
                  !ir_cuda_parse_arch(o->arch, &cc, &specific)))
    return st_error(ST_INVALID_INPUT, "smelt tune: '%s' is not one real CUDA arch such as sm_90a or sm_80", o->arch);
  ScDimSpace no_dims = {.ncombos = 1};
  const ScDimSpace *space = o->dims ? o->dims : &no_dims;
  tu.model = o->model;
  tu.out_path = o->table_path;
  tu.budget = o->budget_s;
  tu.dry_run = o->dry_run;
  tu.allow_tf32 = o->allow_tf32;
  tu.quant = o->quant;
  tu.log = o->log;
  tu.log_ctx = o->log_ctx;

  smelt_status st = table_open(&tu);
  if (!st && !tu.dry_run) st = make_parent_dirs(tu.out_path);
  if (!st) st = device_open(&tu, o);
  if (!st) st = cg_cuda_nvrtc_open(&tu.nv);

  Spec specs[FMT_MAX_SPECIALISATIONS];
  memset(specs, 0, sizeof specs);
  int nspec = 0, njobs = 0;
  Job *jobs = NULL;
  if (!st) st = collect_jobs(&tu, space, o->dtype, specs, &nspec, &jobs, &njobs);
  if (!st && tu.dev) {
    st = aux_setup(&tu);
    if (st) st = st_prefix(st, "smelt tune: setting up the timing kernels");
  }
  if (!st) {
    if (tu.dev) {
      const RtCudaInfo *info = rt_cuda_device_info(tu.dev);
      tune_log(&tu, "tuning %s for %s on GPU %d: %s (%s, %d SMs), copy bandwidth %.0f GB/s", tu.model, tu.arch,
               o->device, info->name, info->arch, info->sm_count, tu.copy_bw * 1e-9);
    } else {
      tune_log(&tu, "dry run: %s for %s (no GPU: candidates are generated and compiled, not run)", tu.model, tu.arch);
    }
    tune_log(&tu, "%d shape%s to tune, budget %g s, table %s", njobs, njobs == 1 ? "" : "s", tu.budget, tu.out_path);
  }
  int done = 0;
  bool out_of_time = false;
  for (int q = 0; q < njobs && !st; q++) {
    if (tu.budget > 0 && smelt_now_s() - tu.t0 > tu.budget) {
      out_of_time = true;
      break;
    }
    const Job *j = &jobs[q];
    const Kernel *k = &specs[j->spec].k[j->kernel];
    char label[256], head[sizeof label + sizeof k->name + 48];
    key_label(&j->key, label, sizeof label);
    snprintf(head, sizeof head, "[%d/%d] %s (kernel %s): ", q + 1, njobs, label, k->name);
    bool put = false;
    st = tune_job(&tu, specs[j->spec].g, k, j, head, &put);
    done++;
    if (put) {
      tu.tuned++;
      /* written after every shape: an interruption keeps what was measured */
      smelt_status sst = cg_tune_table_save(tu.table, tu.out_path);
      if (sst && !st) st = sst;
      else st_free(sst);
    }
  }
  if (!st || tu.tuned) log_summary(&tu, done, njobs, out_of_time);
  if (out_result)
    *out_result = (ScTuneResult){.shapes = njobs, .measured = done, .tuned = tu.tuned, .rejected = tu.rejected,
                                 .dropped = tu.dropped, .out_of_time = out_of_time};
  free(jobs);
  for (int s = 0; s < nspec; s++) {
    cg_kernels_free(specs[s].k, specs[s].nk);
    ir_graph_destroy(specs[s].g);
  }
  if (tu.dev) aux_free(&tu);
  cg_cuda_nvrtc_close(tu.nv);
  if (tu.dev) rt_cuda_device_destroy(tu.dev);
  cg_tune_table_free(tu.table);
  return st;
}
