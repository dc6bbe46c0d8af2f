/* CUDA kernels whose work follows a ranged dim's run-time value (issue 12,
 * "lengths at run time"), in the CPU emulation of the generated CUDA C.
 *
 * A prefill-shaped model (rms_norm, three matmuls that the pipeline merges
 * (weights given [N, K], as the Hopper kernel wants them),
 * causal self-attention over the ranged rows, a residual, a matmul with a
 * bias + silu epilogue, a down matmul and a residual) is compiled once for
 * seq = 1..96 and run at seq = 1, 17, 40, 95 and 96 with each kernel family
 * forced in turn: the tensor-core GEMM with and without split-K, TF32, the
 * simple tiled GEMM, flash attention with and without a key split, the
 * simple attention.  Every buffer a kernel writes starts as NaN (0xFF
 * bytes), and the inputs' rows past the run are NaN too (what an earlier,
 * longer run may leave), so the test fails when
 *   - a valid result differs from the exact seq = d build's, run by the
 *     interpreter on the same inputs (a kernel read a row past the run into
 *     a kept result: flash must see zero K and V past the run's keys);
 *   - any byte of a ranged value past the run's rows is not the poison any
 *     more: a block, warp or thread past the run did work and stored it
 *     (the GEMM and flash tiles leave at once, the elementwise loops run
 *     over the run's elements, the row kernels skip the rows past it, and
 *     the stores of a tile that straddles the end are masked);
 *   - the split-K workspace is not all zero after the run (a tile skipped
 *     by some of its slices and not others would leave a counter raised).
 * The same ranged modules (and one with aligned arguments for sm_90a,
 * where the matmuls take the Hopper wgmma kernel) are compiled with NVRTC
 * for sm_90a and sm_80.  The wgmma kernel itself runs in the emulation on
 * a ranged matmul through an entry point of its own (test_wgmma), and the
 * cnn (ranged batch: conv2d, pools, the few-row GEMV of its classifier)
 * and tiny_llama (ranged seq) examples, rows of argmax and topk, and two
 * matmuls quantised to int4 and int8 (the quantised GEMVs: qmma with f16
 * x, which fails the check without its masked stores, and qgemv with f32
 * x, whose NaN results are bytes of the poison) run with the heuristics'
 * kernels, under the same checks.
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/lower.h"
#include "compiler/driver.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

#define MAX_SEQ 96
#define POISON 0xFF /* every byte: NaN in f16, bf16 and f32 */

static const char model[] =
    "smelt: 1\n"
    "name: ranged_prefill\n"
    "seed: 3\n"
    "dims: {seq: 96}\n"
    "inputs:\n"
    "  x: {shape: [seq, 64]}\n"
    "  g: {shape: [64]}\n"
    "  wq: {shape: [64, 64]}\n"
    "  wk: {shape: [64, 64]}\n"
    "  wv: {shape: [64, 64]}\n"
    "  w1: {shape: [128, 64]}\n"
    "  b1: {shape: [128]}\n"
    "  w2: {shape: [64, 128]}\n"
    "nodes:\n"
    "  - {out: h, op: rms_norm, in: [x, g], eps: 1.0e-6}\n"
    "  - {out: q0, op: matmul, in: [h, wq], transpose_b: true}\n"
    "  - {out: k0, op: matmul, in: [h, wk], transpose_b: true}\n"
    "  - {out: v0, op: matmul, in: [h, wv], transpose_b: true}\n"
    "  - {out: q1, op: reshape, in: [q0], shape: [1, seq, 2, 32]}\n"
    "  - {out: q, op: transpose, in: [q1], perm: [0, 2, 1, 3]}\n"
    "  - {out: k1, op: reshape, in: [k0], shape: [1, seq, 2, 32]}\n"
    "  - {out: k, op: transpose, in: [k1], perm: [0, 2, 1, 3]}\n"
    "  - {out: v1, op: reshape, in: [v0], shape: [1, seq, 2, 32]}\n"
    "  - {out: v, op: transpose, in: [v1], perm: [0, 2, 1, 3]}\n"
    "  - {out: att, op: attention, in: [q, k, v], causal: true}\n"
    "  - {out: att_t, op: transpose, in: [att], perm: [0, 2, 1, 3]}\n"
    "  - {out: att_m, op: reshape, in: [att_t], shape: [seq, 64]}\n"
    "  - {out: r, op: add, in: [att_m, x]}\n"
    "  - {out: m1, op: matmul, in: [r, w1], transpose_b: true}\n"
    "  - {out: e1, op: add, in: [m1, b1]}\n"
    "  - {out: s1, op: silu, in: [e1]}\n"
    "  - {out: m2, op: matmul, in: [s1, w2], transpose_b: true}\n"
    "  - {out: y, op: add, in: [m2, r]}\n"
    "outputs: [y, s1]\n";

/* Row kernels of state_ops.c along a ranged axis: argmax (a block per
 * row, and a thread per result when the axis is not innermost) and topk. */
static const char rows_model[] =
    "smelt: 1\n"
    "name: ranged_rows\n"
    "seed: 7\n"
    "dtype: f32\n"
    "dims: {seq: 40}\n"
    "inputs:\n"
    "  x: {shape: [seq, 300]}\n"
    "  z: {shape: [seq, 6, 5]}\n"
    "nodes:\n"
    "  - {out: a, op: argmax, in: [x], axis: 1}\n"
    "  - {out: b, op: argmax, in: [z], axis: 1}\n"
    "  - {out: [top, ids], op: topk, in: [x], k: 4, axis: 1}\n"
    "outputs: [a, b, top, ids]\n";

/* Two decode-sized matmuls whose weights the quantize pass stores
 * quantised: the quantised GEMVs (qmma for f16 x, qgemv for f32) with
 * ranged rows (M = seq <= 8). */
static const char quant_model[] =
    "smelt: 1\n"
    "name: ranged_quant\n"
    "seed: 5\n"
    "dims: {seq: 8}\n"
    "inputs:\n"
    "  x: {shape: [seq, 256]}\n"
    "params:\n"
    "  w1: {shape: [256, 64], init: {normal: 0.05}}\n"
    "  w2: {shape: [64, 40], init: {normal: 0.1}}\n"
    "nodes:\n"
    "  - {out: h, op: matmul, in: [x, w1]}\n"
    "  - {out: y, op: matmul, in: [h, w2]}\n"
    "outputs: [h, y]\n";

typedef struct {
  const char *path;
  DType dt;
  const QuantOptions *quant; /* NULL: none */
} Build;

static smelt_status build(void *ctx, const FeDim *dims, int ndims, bool probe, Graph **out) {
  (void)probe;
  const Build *b = ctx;
  FeOptions fo = {.dtype = b->dt, .dims = dims, .ndims = ndims};
  *out = NULL;
  RETURN_IF_ERROR(fe_load_yaml(b->path, &fo, out));
  PassCtx pc = {.target = "cuda", .quant = b->quant};
  smelt_status st = pass_run_pipeline(*out, &pc, b->quant ? pass_quantize_pipeline() : NULL, NULL, NULL);
  pass_ctx_free(&pc);
  return st;
}

/* The variant tokens one run forces: matmul kernels get mm, attention att
 * (NULL: the heuristic's). */
typedef struct {
  const char *name, *mm, *att;
  bool tf32;
} Forcing;

static int value_named(const Graph *g, const char *name) {
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].name && strcmp(g->val[v].name, name) == 0) return v;
  return -1;
}

/* Per kernel of k[0..nk): the forced token for its anchor's op. */
static const char **force_table(const Graph *g, const Kernel *k, int nk, const Forcing *fc) {
  const char **force = calloc((size_t)(nk ? nk : 1), sizeof *force);
  for (int i = 0; force && i < nk; i++) {
    int count;
    int a = cg_group_anchor(g, &g->groups[k[i].group], &count);
    if (a < 0) continue;
    if (g->node[a].op == OP_MATMUL) force[i] = fc->mm;
    if (g->node[a].op == OP_ATTENTION) force[i] = fc->att;
  }
  return force;
}

/* Whether element i of ranged type t lies past the run (extents at rv). */
static bool past_run(const TensorType *t, int64_t i, const int64_t *rv) {
  int64_t after = 1;
  for (int a = t->rank - 1; a >= 0; a--) {
    if (t->dyn[a]) return (i / after) % t->dim[a] >= ir_type_extent(t, a, rv);
    after *= t->dim[a];
  }
  return false;
}

/* Max |got - ref| over the run's elements of ranged value t (laid out at
 * the max in got, exact in ref), relative to ref's largest magnitude; NaN
 * or inf in got count as infinitely wrong. */
static double run_error(const TensorType *t, const unsigned char *got, const void *ref, const int64_t *rv) {
  double worst = 0, big = 1e-30;
  int64_t n = ir_type_numel(t), j = 0;
  for (int64_t i = 0; i < n; i++) {
    if (past_run(t, i, rv)) continue;
    double a = dt_load(t->dt, got, (size_t)i), b = dt_load(t->dt, ref, (size_t)j++);
    if (!isfinite(a)) return INFINITY;
    if (fabs(b) > big) big = fabs(b);
    if (fabs(a - b) > worst) worst = fabs(a - b);
  }
  return worst / big;
}

/* One run of ranged graph r at seq = d against exact graph x; failures. */
static int run_case(Exec *e, Graph *r, Graph *x, int64_t d, const Forcing *fc, double tol, const char *what) {
  int failures = 0;
  Kernel *k = NULL;
  int nk = 0;
  FmtCudaModule *m = NULL;
  Interp *it = NULL;
  const char **force = NULL;
  void **xdata = calloc((size_t)x->nval, sizeof(void *)), **rdata = calloc((size_t)r->nval, sizeof(void *));
  uint64_t *buf = calloc((size_t)r->nval, sizeof(uint64_t)), rng = 0, ws = 0;
  bool *stored = calloc((size_t)r->nval, sizeof(bool));
  int64_t rv[IR_MAX_RANGES] = {d};
  smelt_status st = xdata && rdata && buf && stored ? NULL : st_error(ST_NO_MEMORY, "out of memory");
  if (!st) st = cg_lower(r, &k, &nk);
  if (!st && !(force = force_table(r, k, nk, fc))) st = st_error(ST_NO_MEMORY, "out of memory");
  CgCudaOptions o = {.max_units = 1, .emulation = true, .force = force, .allow_tf32 = fc->tf32};
  if (!st) st = cg_cuda_generate(r, k, nk, &o, &m);
  for (int i = 0; !st && fc->mm && i < nk; i++)
    if (force[i] && strcmp(m->kernels[i].variant, force[i]) != 0)
      st = st_error(ST_INTERNAL, "kernel %s was forced to %s but used %s", k[i].name, force[i], m->kernels[i].variant);
  if (!st) st = h_interp_random(x, NULL, xdata, &it);
  /* the ranged graph's inputs: the exact build's in the run's rows, NaN
   * past them (stale rows of an earlier run) */
  for (int v = 0; v < r->nval && !st; v++) {
    const Value *val = &r->val[v];
    if (val->kind != VK_INPUT) continue;
    int xv = value_named(x, val->name);
    if (xv < 0 || !xdata[xv]) {
      st = st_error(ST_INTERNAL, "'%s' has no counterpart in the exact build", val->name);
      break;
    }
    size_t rb = ir_type_bytes(&val->type), xb = ir_type_bytes(&x->val[xv].type);
    rdata[v] = malloc(rb ? rb : 1);
    if (!rdata[v]) {
      st = st_error(ST_NO_MEMORY, "out of memory");
      break;
    }
    memset(rdata[v], POISON, rb);
    memcpy(rdata[v], xdata[xv], xb < rb ? xb : rb); /* the ranged axis is outermost: the leading rows */
  }
  if (!st) st = e->load(e, m);
  if (!st) st = h_upload_guarded(e, r, k, nk, rdata, 0, buf, stored);
  /* every value a kernel writes starts as NaN */
  for (int v = 0; v < r->nval && !st; v++) {
    if (!stored[v] || r->val[v].kind == VK_INPUT) continue;
    size_t n = ir_type_bytes(&r->val[v].type);
    unsigned char *p = malloc(n ? n : 1);
    if (!p) {
      st = st_error(ST_NO_MEMORY, "out of memory");
      break;
    }
    memset(p, POISON, n);
    st = e->upload(e, buf[v] + H_GUARD, p, n);
    free(p);
  }
  if (!st) st = h_kernel_scratch(e, r, m, nk, rv, &rng, &ws);
  if (!st) st = h_launch_all(e, k, nk, m, buf, 0, rng, ws);
  int checked = 0;
  for (int v = 0; v < r->nval && !st; v++) {
    const Value *val = &r->val[v];
    if (!stored[v] || val->kind == VK_INPUT) continue;
    unsigned char *host = NULL;
    ssize_t guard = 0;
    st = h_download_guarded(e, r, v, buf[v], 0, &host, &guard);
    if (st) break;
    const unsigned char *p = host + H_GUARD;
    if (guard) {
      fprintf(stderr, "%s: '%s' wrote outside its buffer (guard byte %zd)\n", what, val->name, guard);
      failures++;
    }
    /* past the run: untouched */
    const TensorType *t = &val->type;
    size_t es = dt_size(t->dt);
    int64_t touched = 0, n = ir_type_numel(t);
    for (int64_t i = 0; ir_type_dynamic(t) && i < n; i++) {
      if (!past_run(t, i, rv)) continue;
      for (size_t b = 0; b < es; b++) touched += p[(size_t)i * es + b] != POISON;
    }
    if (touched) {
      fprintf(stderr, "%s: '%s' %s: %lld bytes past the run's rows were written\n", what, val->name,
              ir_type_str(t, (char[128]){0}, 128), (long long)touched);
      failures++;
    }
    /* in the run: the exact build's, where it has the value (outputs and
     * whatever the two pipelines kept alike) */
    int xv = value_named(x, val->name);
    const void *ref = xv >= 0 && x->val[xv].kind == VK_NODE ? ir_interp_value(it, xv) : NULL;
    bool out = false;
    for (int i = 0; i < r->noutputs; i++) out |= r->outputs[i] == v;
    if (out && !ref) {
      fprintf(stderr, "%s: output '%s' has no reference\n", what, val->name);
      failures++;
    }
    if (ref) {
      double err = run_error(t, p, ref, rv);
      checked++;
      if (!(err <= tol)) {
        fprintf(stderr, "%s: '%s' differs from the exact build's: error %.3g of the largest magnitude (tolerance %.3g)\n",
                what, val->name, err, tol);
        failures++;
      }
    }
    free(host);
  }
  if (!st && checked < r->noutputs) {
    fprintf(stderr, "%s: only %d values compared\n", what, checked);
    failures++;
  }
  /* split-K: every counter and partial tile back to zero */
  uint64_t ws_bytes = 0;
  for (int i = 0; m && i < nk; i++)
    if (m->kernels[i].workspace > ws_bytes) ws_bytes = m->kernels[i].workspace;
  if (!st && ws_bytes) {
    unsigned char *w = malloc((size_t)ws_bytes);
    st = w ? e->download(e, w, ws, (size_t)ws_bytes) : st_error(ST_NO_MEMORY, "out of memory");
    size_t nz = 0;
    for (uint64_t i = 0; !st && i < ws_bytes; i++) nz += w[i] != 0;
    if (nz) {
      fprintf(stderr, "%s: %zu bytes of the split-K workspace are not zero after the run\n", what, nz);
      failures++;
    }
    free(w);
  }
  if (st) {
    fprintf(stderr, "%s: %s\n", what, st_message(st));
    st_free(st);
    failures++;
  }
  if (m) e->unload(e);
  for (int v = 0; buf && v < r->nval; v++)
    if (buf[v]) e->free(e, buf[v]);
  if (rng) e->free(e, rng);
  if (ws) e->free(e, ws);
  for (int v = 0; xdata && v < x->nval; v++) free(xdata[v]);
  for (int v = 0; rdata && v < r->nval; v++) free(rdata[v]);
  free(xdata), free(rdata), free(buf), free(stored), free(force);
  ir_interp_destroy(it);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
  return failures;
}

/* The ranged graph's module with opt, compiled for arch. */
static int compile_ranged(CgNvrtc *nv, const CgCudaCompileOptions *copts, Graph *r, const Forcing *fc,
                          CgCudaOptions opt, const char *what) {
  Kernel *k = NULL;
  int nk = 0;
  const char **force = NULL;
  FmtCudaModule *m = NULL;
  smelt_status st = cg_lower(r, &k, &nk);
  if (!st && !(force = force_table(r, k, nk, fc))) st = st_error(ST_NO_MEMORY, "out of memory");
  opt.force = force;
  opt.allow_tf32 = fc->tf32;
  if (!st) st = cg_cuda_generate(r, k, nk, &opt, &m);
  bool wgmma = false;
  for (int i = 0; !st && i < nk; i++) wgmma |= strncmp(m->kernels[i].variant, "wgmma:", 6) == 0;
  if (!st && opt.args_aligned && !fc->mm && !wgmma) st = st_error(ST_INTERNAL, "no matmul took the wgmma kernel");
  CgCudaBinary *bins = NULL;
  if (!st) st = cg_cuda_compile_module(nv, m, &opt.arch, 1, copts, &bins);
  if (!st) cg_cuda_binaries_free(bins, m->nunits);
  int failures = 0;
  if (st) {
    fprintf(stderr, "%s (%s): %s\n", what, opt.arch, st_message(st));
    st_free(st);
    failures++;
  }
  fmt_cuda_module_free(m);
  free(force);
  cg_kernels_free(k, nk);
  return failures;
}

/* ---- the Hopper kernel (wgmma.c) ----
 * The harness's launcher refuses kernels with TMA descriptors; the
 * kernel's host stand-ins read the operands through their pointers and
 * ignore the descriptors, so one entry point that passes them unused runs
 * it (as test_cuda_wgmma_compile does).  A ranged matmul with a bias +
 * silu epilogue, BM 64 (and 128), with and without split-K: the persistent
 * loop's producer and consumers must skip the same tiles, or the emulated
 * mbarriers would wait forever. */

static const char wg_model[] =
    "smelt: 1\n"
    "name: ranged_wgmma\n"
    "seed: 5\n"
    "dtype: f16\n"
    "dims: {seq: 160}\n"
    "inputs:\n"
    "  x: {shape: [seq, 192]}\n"
    "  w: {shape: [96, 192]}\n"
    "  b: {shape: [96]}\n"
    "nodes:\n"
    "  - {out: mm0, op: matmul, in: [x, w], transpose_b: true}\n"
    "  - {out: e0, op: add, in: [mm0, b]}\n"
    "  - {out: y, op: silu, in: [e0]}\n"
    "outputs: [y]\n";

static int wgmma_case(Graph *r, Graph *x, int64_t d, const char *tok, const char *tmpdir, const char *what) {
  Kernel *k = NULL;
  int nk = 0, failures = 0;
  FmtCudaModule *m = NULL;
  Interp *it = NULL;
  void **xdata = calloc((size_t)x->nval, sizeof(void *));
  void *args[16] = {0};
  const char *force[1] = {tok};
  int64_t rv[IR_MAX_RANGES] = {d};
  smelt_status st = xdata ? cg_lower(r, &k, &nk) : st_error(ST_NO_MEMORY, "out of memory");
  if (!st && (nk != 1 || k[0].nargs > 8)) st = st_error(ST_INTERNAL, "%d kernels, expected one matmul", nk);
  CgCudaOptions o = {.arch = "sm_90a", .args_aligned = true, .emulation = true, .force = force, .max_units = 1};
  if (!st) st = cg_cuda_generate(r, k, nk, &o, &m);
  if (!st && strcmp(m->kernels[0].variant, tok) != 0)
    st = st_error(ST_INTERNAL, "forced to %s, used %s", tok, m->kernels[0].variant);
  if (!st) st = h_interp_random(x, NULL, xdata, &it);
  void *lib = NULL;
  if (!st) {
    const FmtCudaLaunch *l = &m->kernels[0];
    char src[512], so[512], cmd[2048];
    static int serial;
    serial++;
    snprintf(src, sizeof src, "%s/rwg%d.cpp", tmpdir, serial);
    snprintf(so, sizeof so, "%s/rwg%d.so", tmpdir, serial);
    FILE *fp = fopen(src, "w");
    if (fp) {
      /* the entry point: the arguments, rng, the workspace, the descriptors (unused on the host) */
      fputs(m->units[0], fp);
      fprintf(fp, "\nextern \"C\" void rwg_entry(void **args) {\n  smelt_tmap tm{};\n  %s(", l->symbol);
      for (int a = 0; a < k[0].nargs; a++)
        fprintf(fp, "%s(%s__half *)args[%d]", a ? ", " : "", a < k[0].nargs - k[0].nouts ? "const " : "", a);
      fprintf(fp, ", (const long long *)args[%d]", k[0].nargs);
      if (l->workspace) fprintf(fp, ", (unsigned char *)args[%d]", k[0].nargs + 1);
      for (int t = 0; t < l->ntmaps; t++) fprintf(fp, ", tm");
      fprintf(fp, ");\n}\n");
      fclose(fp);
    }
    snprintf(cmd, sizeof cmd,
             "c++ -std=c++17 -O1 -w -Wno-psabi -shared -fPIC -Wl,-Bsymbolic -DSMELT_EMU_IMPLEMENTATION "
             "-Itests/gpu/emu_include -include tests/gpu/cuda_emu.hpp %s -o %s -lpthread",
             src, so);
    int rc = fp ? system(cmd) : -1;
    unlink(src);
    if (rc == 0) lib = dlopen(so, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    unlink(so);
    if (!lib) st = st_error(ST_INTERNAL, "the emulated unit did not build or load");
  }
  void (*entry)(void **) = lib ? (void (*)(void **))dlsym(lib, "rwg_entry") : NULL;
  int (*launch)(void (*)(void **), void **, const unsigned *, const unsigned *) =
      lib ? (int (*)(void (*)(void **), void **, const unsigned *, const unsigned *))dlsym(lib, "smelt_emu_launch") : NULL;
  if (!st && (!entry || !launch)) st = st_error(ST_INTERNAL, "emulation entry points missing");
  const FmtCudaLaunch *l = m ? &m->kernels[0] : NULL;
  for (int a = 0; a < (k ? k[0].nargs : 0) && !st; a++) {
    int v = k[0].args[a];
    const Value *val = &r->val[v];
    size_t bytes = ir_type_bytes(&val->type);
    args[a] = aligned_alloc(1024, (bytes + 1023) / 1024 * 1024);
    if (!args[a]) {
      st = st_error(ST_NO_MEMORY, "out of memory");
      break;
    }
    memset(args[a], POISON, bytes); /* outputs, and the inputs' rows past the run */
    int xv = value_named(x, val->name);
    if (val->kind == VK_INPUT && xv >= 0) memcpy(args[a], xdata[xv], ir_type_bytes(&x->val[xv].type));
    else if (val->kind == VK_CONST) memcpy(args[a], val->data, bytes);
  }
  int64_t vals[IR_MAX_RANGES] = {d};
  if (!st) {
    args[k[0].nargs] = malloc(sizeof vals);
    args[k[0].nargs + 1] = l->workspace ? calloc(1, (size_t)l->workspace) : NULL;
    if (!args[k[0].nargs] || (l->workspace && !args[k[0].nargs + 1])) st = st_error(ST_NO_MEMORY, "out of memory");
    else memcpy(args[k[0].nargs], vals, sizeof vals);
  }
  if (!st && launch(entry, args, l->grid, l->block) != 0) st = st_error(ST_INTERNAL, "emulated launch failed");
  int y = value_named(r, "y"), xy = value_named(x, "y");
  for (int a = k ? k[0].nargs - k[0].nouts : 0; !st && a < k[0].nargs; a++) {
    if (k[0].args[a] != y || xy < 0) continue;
    const TensorType *t = &r->val[y].type;
    double err = run_error(t, args[a], ir_interp_value(it, xy), rv);
    if (!(err <= 2e-2)) {
      fprintf(stderr, "%s: 'y' differs from the exact build's: error %.3g\n", what, err);
      failures++;
    }
    int64_t touched = 0;
    for (int64_t i = 0; i < ir_type_numel(t); i++)
      if (past_run(t, i, rv)) touched += ((const unsigned short *)args[a])[i] != 0xFFFF;
    if (touched) {
      fprintf(stderr, "%s: %lld elements of 'y' past the run's rows were written\n", what, (long long)touched);
      failures++;
    }
    y = -2; /* checked */
  }
  if (!st && y != -2) st = st_error(ST_INTERNAL, "'y' is not the kernel's output");
  if (!st && l->workspace)
    for (uint64_t i = 0; i < l->workspace; i++)
      if (((const unsigned char *)args[k[0].nargs + 1])[i]) {
        fprintf(stderr, "%s: the split-K workspace is not zero after the run (byte %llu)\n", what, (unsigned long long)i);
        failures++;
        break;
      }
  if (st) {
    fprintf(stderr, "%s: %s\n", what, st_message(st));
    st_free(st);
    failures++;
  }
  for (int a = 0; a < 16; a++) free(args[a]);
  for (int v = 0; xdata && v < x->nval; v++) free(xdata[v]);
  free(xdata);
  ir_interp_destroy(it);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
  return failures;
}

static int test_wgmma(const char *tmpdir) {
  char path[] = "/tmp/smelt-ranged-wg-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return 1;
  FILE *fp = fdopen(fd, "w");
  fputs(wg_model, fp);
  fclose(fp);
  Build b = {path, DT_INVALID, NULL};
  FeDim range = {.name = "seq", .value = 1, .max = 160};
  Graph *r = NULL;
  int runs = 0;
  smelt_status st = sc_build_ranged(build, &b, &range, 1, &r);
  if (st) {
    fprintf(stderr, "ranged_wgmma: %s\n", st_message(st));
    st_free(st);
    check_failures++;
  }
  static const char *const toks[] = {"wgmma:bm=64,bn=64,bk=64,st=4,c=1", "wgmma:bm=64,bn=64,bk=64,st=4,c=1,sk=3",
                                     "wgmma:bm=128,bn=64,bk=64,st=4,c=2,sk=2"};
  static const int64_t lens[] = {1, 64, 65, 100, 160};
  for (size_t i = 0; r && i < sizeof lens / sizeof *lens; i++) {
    FeDim exact = {.name = "seq", .value = lens[i]};
    Graph *x = NULL;
    st = build(&b, &exact, 1, false, &x);
    if (st) {
      fprintf(stderr, "ranged_wgmma seq=%lld: %s\n", (long long)lens[i], st_message(st));
      st_free(st);
      check_failures++;
      continue;
    }
    for (size_t t = 0; t < sizeof toks / sizeof *toks; t++) {
      char what[160];
      snprintf(what, sizeof what, "ranged_wgmma seq=1..160 at %lld, %s", (long long)lens[i], toks[t]);
      CHECK(wgmma_case(r, x, lens[i], toks[t], tmpdir, what) == 0);
      runs++;
    }
    ir_graph_destroy(x);
  }
  ir_graph_destroy(r);
  unlink(path);
  return runs;
}

/* An example model with a ranged dim, with the heuristics' kernels: cnn's
 * batch (conv2d as an implicit GEMM, pools, a row reduction) and tiny_llama's
 * seq, each at 1, max - 1 and max. */
static int test_example(Exec *e, CgNvrtc *nv, const CgCudaCompileOptions *copts, const char *path, const char *dim,
                        int64_t max, DType dt, const QuantOptions *quant, int *compiled) {
  Build b = {path, dt, quant};
  FeDim range = {.name = dim, .value = 1, .max = max};
  Graph *r = NULL;
  int runs = 0;
  smelt_status st = sc_build_ranged(build, &b, &range, 1, &r);
  if (st) {
    fprintf(stderr, "%s %s=1..%lld: %s\n", path, dim, (long long)max, st_message(st));
    st_free(st);
    check_failures++;
    return 0;
  }
  static const Forcing heur = {"heuristics", NULL, NULL, false};
  char what[256];
  snprintf(what, sizeof what, "%s %s=1..%lld %s%s", path, dim, (long long)max, dt ? dt_name(dt) : "",
           quant ? pass_quant_mode_name(quant->mode) : "");
  if (nv) {
    CHECK(compile_ranged(nv, copts, r, &heur, (CgCudaOptions){.arch = "sm_90a"}, what) == 0);
    ++*compiled;
  }
  const int64_t lens[] = {1, max - 1, max};
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
    FeDim exact = {.name = dim, .value = lens[i]};
    Graph *x = NULL;
    st = build(&b, &exact, 1, false, &x);
    if (st) {
      fprintf(stderr, "%s %s=%lld: %s\n", path, dim, (long long)lens[i], st_message(st));
      st_free(st);
      check_failures++;
      continue;
    }
    snprintf(what, sizeof what, "%s %s=1..%lld at %lld %s%s", path, dim, (long long)max, (long long)lens[i],
             dt ? dt_name(dt) : "", quant ? pass_quant_mode_name(quant->mode) : "");
    CHECK(run_case(e, r, x, lens[i], &heur, dt == DT_F16 ? 2e-2 : 1e-4, what) == 0);
    runs++;
    ir_graph_destroy(x);
  }
  ir_graph_destroy(r);
  return runs;
}

int main(void) {
  Exec e;
  const char *skip = NULL;
  CHECK_OK(h_exec_emulated(&e, &skip));
  char dir[] = "/tmp/smelt-ranged-nvrtc-XXXXXX";
  bool dir_ok = false;
  CgCudaCompileOptions copts = {0};
  CgNvrtc *nv = h_nvrtc_open(dir, &copts, &dir_ok);
  char path[] = "/tmp/smelt-ranged-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0) return check_done("test_cuda_ranged");
  FILE *fp = fdopen(fd, "w");
  fputs(model, fp);
  fclose(fp);

  static const Forcing f16_runs[] = {
      {"heuristics", NULL, NULL, false},
      {"mma + flash", "mma:bm=32,bn=64,bk=32,wm=32,wn=32,st=3,sk=1", "flash:bm=32,bn=32,w=2,st=2", false},
      {"mma split-K + flash key split", "mma:bm=32,bn=64,bk=32,wm=32,wn=32,st=2,sk=2", "flash:bm=32,bn=64,w=2,st=2,ks=2",
       false},
      {"simple + simple attention", "simple", "simple", false},
  };
  static const Forcing f32_runs[] = {
      {"tf32 + simple attention", "tf32:bm=32,bn=64,bk=32,wm=32,wn=32,st=2", "simple", true},
      {"simple + simple attention (f32)", "simple", "simple", false},
  };
  static const int64_t lens[] = {1, 17, 40, 95, 96};
  int runs = 0, compiled = 0;
  for (int h = 0; h < 2; h++) {
    Build b = {path, h ? DT_F32 : DT_F16, NULL};
    FeDim range = {.name = "seq", .value = 1, .max = MAX_SEQ};
    Graph *r = NULL;
    smelt_status st = sc_build_ranged(build, &b, &range, 1, &r);
    if (st) {
      fprintf(stderr, "ranged_prefill seq=1..%d: %s\n", MAX_SEQ, st_message(st));
      st_free(st);
      check_failures++;
      continue;
    }
    CHECK(r->nranges == 1);
    const Forcing *runs_of = h ? f32_runs : f16_runs;
    int nf = h ? (int)(sizeof f32_runs / sizeof *f32_runs) : (int)(sizeof f16_runs / sizeof *f16_runs);
    for (int fi = 0; fi < nf; fi++) {
      const Forcing *fc = &runs_of[fi];
      char what[160];
      if (nv) {
        static const char *const archs[] = {"sm_90a", "sm_80"};
        for (int a = 0; a < 2; a++) {
          snprintf(what, sizeof what, "ranged_prefill seq=1..%d %s, %s", MAX_SEQ, dt_name(b.dt), fc->name);
          CHECK(compile_ranged(nv, &copts, r, fc, (CgCudaOptions){.arch = archs[a]}, what) == 0);
          compiled++;
        }
      }
      for (size_t i = 0; !skip && i < sizeof lens / sizeof *lens; i++) {
        FeDim exact = {.name = "seq", .value = lens[i]};
        Graph *x = NULL;
        st = build(&b, &exact, 1, false, &x);
        if (st) {
          fprintf(stderr, "ranged_prefill seq=%lld: %s\n", (long long)lens[i], st_message(st));
          st_free(st);
          check_failures++;
          continue;
        }
        snprintf(what, sizeof what, "ranged_prefill seq=1..%d at %lld, %s, %s", MAX_SEQ, (long long)lens[i],
                 dt_name(b.dt), fc->name);
        double tol = b.dt == DT_F16 ? 2e-2 : fc->tf32 ? 1e-2 : 1e-4;
        CHECK(run_case(&e, r, x, lens[i], fc, tol, what) == 0);
        runs++;
        ir_graph_destroy(x);
      }
    }
    /* f16 with aligned arguments for sm_90a: the matmuls take wgmma */
    if (nv && !h) {
      static const Forcing none = {"wgmma (heuristics, aligned arguments)", NULL, NULL, false};
      CHECK(compile_ranged(nv, &copts, r, &none, (CgCudaOptions){.arch = "sm_90a", .args_aligned = true},
                           "ranged_prefill seq=1..96 f16, wgmma") == 0);
      compiled++;
    }
    ir_graph_destroy(r);
  }
  unlink(path);
  int wg_runs = skip ? 0 : test_wgmma(e.tmpdir);
  int ex_runs = 0;
  char rpath[] = "/tmp/smelt-ranged-rows-XXXXXX";
  int rfd = mkstemp(rpath);
  CHECK(rfd >= 0);
  if (rfd >= 0) {
    FILE *rf = fdopen(rfd, "w");
    fputs(rows_model, rf);
    fclose(rf);
    if (!skip) ex_runs += test_example(&e, nv, &copts, rpath, "seq", 40, DT_INVALID, NULL, &compiled);
    unlink(rpath);
  }
  for (int h = 0; !skip && h < 2; h++) {
    ex_runs += test_example(&e, nv, &copts, "examples/cnn.yaml", "batch", 3, h ? DT_F16 : DT_INVALID, NULL, &compiled);
    ex_runs += test_example(&e, nv, &copts, "examples/tiny_llama.yaml", "seq", 12, h ? DT_F16 : DT_INVALID, NULL, &compiled);
  }
  /* the quantised GEMVs (qmma with f16 x, qgemv with f32) at 1, 7 and 8 rows of seq=1..8 */
  char qpath[] = "/tmp/smelt-ranged-quant-XXXXXX";
  int qfd = mkstemp(qpath);
  CHECK(qfd >= 0);
  if (qfd >= 0) {
    FILE *qf = fdopen(qfd, "w");
    fputs(quant_model, qf);
    fclose(qf);
    static const QuantOptions q4 = {.mode = QM_INT4, .group = 64, .seed = 1}, q8 = {.mode = QM_INT8, .seed = 1};
    for (int h = 0; !skip && h < 2; h++) {
      ex_runs += test_example(&e, nv, &copts, qpath, "seq", 8, h ? DT_F16 : DT_F32, &q4, &compiled);
      ex_runs += test_example(&e, nv, &copts, qpath, "seq", 8, h ? DT_F16 : DT_F32, &q8, &compiled);
    }
    unlink(qpath);
  }
  if (skip) printf("SKIP: emulated ranged runs: %s\n", skip);
  else printf("emulated CUDA, ranged: %d runs of the Hopper kernel (wgmma) at 1..160 rows of a seq=1..160 matmul, "
              "%d of the rows, cnn, tiny_llama and quantised models\n", wg_runs, ex_runs);
  printf("emulated CUDA, ranged: %d runs of a seq=1..%d prefill against exact builds (nothing past the run written); "
         "%d ranged modules compiled with NVRTC\n",
         runs, MAX_SEQ, compiled);
  h_exec_close(&e);
  if (nv) cg_cuda_nvrtc_close(nv);
  if (dir_ok) rmdir(dir);
  return check_done("test_cuda_ranged");
}
