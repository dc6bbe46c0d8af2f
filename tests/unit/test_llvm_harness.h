/* The harness of the CPU-backend tests (test_llvm_*.c): build a small graph
 * with the ir.h API, compile its kernels with LLVM, run them through the
 * JIT and compare every result a kernel writes with the reference
 * interpreter.
 *
 * What a run checks, for every kernel output (intermediates included):
 *   - floats: relative L2 error against the interpreter within the test's
 *     tolerance (1e-5 for f32, 2e-3 for f16/bf16 in the op tests), NaN and
 *     infinity exactly where the reference has them;
 *   - integers and bool: equality;
 *   - nothing outside the buffers is written: 64 bytes of 0xAB on both
 *     sides of every buffer stay intact, and inputs are unchanged;
 *   - task splitting: each kernel runs as three uneven task ranges (plus an
 *     empty one), so a kernel that ignores its range or miscounts tasks
 *     leaves holes (outputs start as 0xCD garbage) or writes twice;
 *   - packed weights: the kernels' prepack functions run first (as the
 *     runtime's loader runs them); where there are any, the module is
 *     compiled again with the weights packed at compile time
 *     (CgLlvmOptions.pack_at_compile) and every output must be the same
 *     bits.
 * Inputs are random (a fixed seed per test) in a domain each input names:
 * any sign, positive (log, sqrt), away from zero (division), small integer
 * indices.
 */
#ifndef SMELT_TEST_LLVM_HARNESS_H
#define SMELT_TEST_LLVM_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/llvm/cg_llvm.h"
#include "codegen/lower.h"
#include "ir/interp.h"
#include "ir/ir.h"
#include "tests/unit/check.h"

#define GUARD 64
#define GUARD_BYTE 0xAB

typedef enum {
  DOM_ANY,      /* uniform [-2, 2] (ints: [-5, 5], u8: [0, 10]) */
  DOM_POS,      /* uniform [0.1, 3] (ints: [1, 5]) */
  DOM_NONZERO,  /* magnitude in [0.3, 2], either sign (ints: 0 included on purpose) */
  DOM_INDEX,    /* integers in [-bound, bound) */
  DOM_SMALLPOS, /* integers in [0, bound) */
  DOM_WIDE,     /* uniform [-8, 8] */
  DOM_HUGE,     /* uniform [-300, 300] (ints too): saturating conversions */
  DOM_SPECIAL,  /* floats: NaN, infinities, signed zeros, tiny and huge values, in turn */
} Domain;

typedef struct {
  int value;
  Domain dom;
  int64_t bound;
} InputSpec;

typedef struct {
  Graph *g;
  InputSpec in[32];
  int nin;
  uint64_t rng, nspecial;
  const char *label;
} TG;

static const SrcLoc here = {"test_llvm", 1, 1};

static uint64_t tg_next(TG *t) {
  t->rng ^= t->rng << 13;
  t->rng ^= t->rng >> 7;
  t->rng ^= t->rng << 17;
  return t->rng;
}
static double tg_unif(TG *t, double lo, double hi) {
  return lo + (hi - lo) * (double)(tg_next(t) >> 11) / 9007199254740992.0;
}

static TensorType tt(DType dt, int rank, const int64_t *dims) {
  TensorType t = {.dt = dt, .rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  return t;
}

static void tg_init(TG *t, const char *label, uint64_t seed) {
  memset(t, 0, sizeof *t);
  t->g = ir_graph_create(label);
  t->g->file = "test_llvm";
  t->rng = seed * 2654435761u + 88172645463325252ull;
  t->label = label;
}

static int tg_input(TG *t, const char *name, DType dt, int rank, const int64_t *dims, Domain dom, int64_t bound) {
  int v = ir_add_input(t->g, name, tt(dt, rank, dims), here);
  t->in[t->nin++] = (InputSpec){v, dom, bound};
  return v;
}

static double tg_sample(TG *t, DType dt, Domain dom, int64_t bound) {
  if (dt == DT_BOOL) return (double)(tg_next(t) & 1);
  switch (dom) {
  case DOM_INDEX: return (double)((int64_t)(tg_next(t) % (uint64_t)(2 * bound)) - bound);
  case DOM_SMALLPOS: return (double)(int64_t)(tg_next(t) % (uint64_t)bound);
  default: break;
  }
  if (dom == DOM_SPECIAL && dt_is_float(dt)) {
    static const double sp[] = {NAN,  INFINITY, -INFINITY, 0.0,  -0.0, 1e-30, -1e-30, 1e-4, -1e-4, 0.3, -0.3,
                                0.55, -0.6,     0.7,       -0.7, 3,    -3,    20,     -20,  100,   -100, 1e4, -1e4};
    return sp[t->nspecial++ % (sizeof sp / sizeof sp[0])];
  }
  if (dom == DOM_HUGE) {
    double v = tg_unif(t, -300, 300);
    return dt_is_int(dt) ? trunc(v) : v;
  }
  if (dt_is_int(dt)) {
    if (dom == DOM_NONZERO) return (double)((int64_t)(tg_next(t) % 7) - 3); /* -3..3, zeros included */
    if (dom == DOM_POS) return (double)(1 + tg_next(t) % 5);
    return dt == DT_U8 ? (double)(tg_next(t) % 11) : (double)((int64_t)(tg_next(t) % 11) - 5);
  }
  switch (dom) {
  case DOM_POS: return tg_unif(t, 0.1, 3);
  case DOM_NONZERO: {
    double v = tg_unif(t, 0.3, 2);
    return tg_next(t) & 1 ? v : -v;
  }
  case DOM_WIDE: return tg_unif(t, -8, 8);
  default: return tg_unif(t, -2, 2);
  }
}

static void tg_fill(TG *t, DType dt, void *data, int64_t n, Domain dom, int64_t bound) {
  for (int64_t i = 0; i < n; i++) dt_store(dt, data, (size_t)i, tg_sample(t, dt, dom, bound));
}

/* A constant with random data (a weight). */
static int tg_const(TG *t, const char *name, DType dt, int rank, const int64_t *dims, Domain dom) {
  TensorType ty = tt(dt, rank, dims);
  size_t bytes = ir_type_bytes(&ty);
  void *tmp = malloc(bytes ? bytes : 1);
  tg_fill(t, dt, tmp, ir_type_numel(&ty), dom, 4);
  int v = ir_add_const(t->g, name, ty, tmp, here);
  free(tmp);
  return v;
}

/* A one-result node; returns its node id (attributes are set by the caller
 * before tg_run, defaults are filled there). */
static int tg_node(TG *t, Op op, int nin, const int *in, const char *out) {
  const char *names[1] = {out};
  return ir_add_node(t->g, op, nin, in, 1, names, here);
}
static inline int tg_val(TG *t, int node) { return t->g->node[node].out[0]; }

/* Forms a group of the listed nodes (ids) with the given kind and anchor. */
static inline void tg_group(TG *t, GroupKind kind, const int *nodes, int n, int anchor) {
  Graph *g = t->g;
  int gi = ir_add_group(g, kind);
  Group *gr = &g->groups[gi];
  gr->nodes = ir_graph_alloc(g, sizeof(int) * (size_t)n);
  memcpy(gr->nodes, nodes, sizeof(int) * (size_t)n);
  gr->nnodes = n;
  gr->anchor = anchor;
  for (int i = 0; i < n; i++) g->node[nodes[i]].group = gi;
}

typedef struct {
  unsigned char *mem; /* GUARD + bytes + GUARD */
  size_t bytes;
} Buf;

static void *buf_data(Buf *b) { return b->mem + GUARD; }

static bool buf_guards_ok(const Buf *b) {
  for (size_t i = 0; i < GUARD; i++)
    if (b->mem[i] != GUARD_BYTE || b->mem[GUARD + b->bytes + i] != GUARD_BYTE) return false;
  return true;
}

static double tol_for(DType dt, double tol32, double tol16) {
  if (dt == DT_F16 || dt == DT_BF16) return tol16;
  if (dt == DT_F64) return tol32 * 1e-3;
  return tol32;
}

/* Compares value v computed by the kernels with the interpreter's. */
static bool compare_value(const TG *t, int v, const void *got, const void *want, double tol32, double tol16) {
  const Value *val = &t->g->val[v];
  DType dt = val->type.dt;
  int64_t n = ir_type_numel(&val->type);
  if (!dt_is_float(dt)) {
    for (int64_t i = 0; i < n; i++) {
      double a = dt_load(dt, got, (size_t)i), b = dt_load(dt, want, (size_t)i);
      if (a != b) {
        fprintf(stderr, "%s: '%s' (%s)[%lld] = %.17g, reference %.17g\n", t->label, val->name, dt_name(dt),
                (long long)i, a, b);
        return false;
      }
    }
    return true;
  }
  double num = 0, den = 0;
  int64_t worst = -1;
  double worst_d = -1;
  for (int64_t i = 0; i < n; i++) {
    double a = dt_load(dt, got, (size_t)i), b = dt_load(dt, want, (size_t)i);
    if (isnan(b) || isinf(b)) {
      bool same = isnan(b) ? isnan(a) : a == b;
      if (!same) {
        fprintf(stderr, "%s: '%s' (%s)[%lld] = %g, reference %g\n", t->label, val->name, dt_name(dt), (long long)i, a, b);
        return false;
      }
      continue;
    }
    if (!isfinite(a)) {
      fprintf(stderr, "%s: '%s' (%s)[%lld] = %g, reference %g\n", t->label, val->name, dt_name(dt), (long long)i, a, b);
      return false;
    }
    double d = (a - b) * (a - b);
    if (d > worst_d) worst_d = d, worst = i;
    num += d;
    den += b * b;
  }
  double floor_ = 1e-6 * sqrt((double)(n ? n : 1));
  double err = sqrt(num) / fmax(sqrt(den), floor_);
  double tol = tol_for(dt, tol32, tol16);
  if (err > tol) {
    fprintf(stderr, "%s: '%s' (%s) relative L2 error %.3g > %.3g; worst [%lld]: %.9g vs reference %.9g\n", t->label,
            val->name, dt_name(dt), err, tol, (long long)worst, dt_load(dt, got, (size_t)worst),
            dt_load(dt, want, (size_t)worst));
    return false;
  }
  return true;
}

typedef struct {
  double tol32, tol16;
  bool soft_f16;
  bool no_opt;             /* unoptimised code must be right too */
  const char *cpu;         /* compile for this CPU instead of the host's */
  bool expect_unsupported; /* the compile must fail with ST_UNSUPPORTED */
} RunOpts;

static int tg_kernels_run; /* counts kernels executed, for the summary */

static void free_bufs(Buf *bufs, int n) {
  if (!bufs) return;
  for (int v = 0; v < n; v++) free(bufs[v].mem);
  free(bufs);
}

/* Loads obj into a JIT, runs its prepack functions (*out_npacked of them)
 * and then every kernel, each as three uneven task ranges and an empty
 * one, on fresh buffers (*out_bufs, per value: constants and inputs
 * copied in, the rest 0xCD garbage, guards around each). */
static smelt_status run_object(const TG *t, const Kernel *ks, int nk, const void *obj, size_t len, void **inputs,
                               Buf **out_bufs, int *out_npacked) {
  const Graph *g = t->g;
  CgJit *jit = NULL;
  *out_bufs = NULL;
  *out_npacked = 0;
  RETURN_IF_ERROR(cg_jit_create(obj, len, &jit));
  smelt_status st = cg_jit_prepack(jit, g, ks, nk, out_npacked);
  Buf *bufs = calloc((size_t)g->nval, sizeof *bufs);
  for (int v = 0; v < g->nval; v++) {
    const Value *val = &g->val[v];
    if (val->type.dt == DT_INVALID || val->kind == VK_DEAD) continue;
    size_t bytes = ir_type_bytes(&val->type);
    bufs[v].bytes = bytes;
    bufs[v].mem = malloc(bytes + 2 * GUARD);
    memset(bufs[v].mem, GUARD_BYTE, bytes + 2 * GUARD);
    memset(buf_data(&bufs[v]), 0xCD, bytes); /* garbage where nothing was written */
    if (val->kind == VK_CONST && val->data) memcpy(buf_data(&bufs[v]), val->data, bytes);
  }
  for (int i = 0; i < t->nin; i++)
    memcpy(buf_data(&bufs[t->in[i].value]), inputs[i], bufs[t->in[i].value].bytes);

  for (int i = 0; i < nk && !st; i++) {
    void *fn = NULL;
    if ((st = cg_jit_find(jit, ks[i].name, &fn))) break;
    void *args[256];
    for (int a = 0; a < ks[i].nargs; a++) args[a] = buf_data(&bufs[ks[i].args[a]]);
    CgKernelFn kf;
    memcpy(&kf, &fn, sizeof kf); /* object to function pointer, as dlsym users do */
    int64_t n = ks[i].ntasks, s1 = n / 5, s2 = s1 + (n - s1) * 3 / 4;
    kf(args, s1, s2);
    kf(args, n, n);
    kf(args, s2, n);
    kf(args, 0, s1);
  }
  cg_jit_destroy(jit);
  *out_bufs = bufs;
  return st;
}

/* Infers the graph, forms single-node groups unless the test made groups,
 * runs interpreter and JIT, compares.  Returns false on any failure (and
 * counts it). */
static bool tg_run(TG *t, const RunOpts *ro) {
  Graph *g = t->g;
  bool ok = false;
  Kernel *ks = NULL;
  int nk = 0;
  void *obj = NULL;
  size_t len = 0;
  char *desc = NULL;
  Interp *it = NULL;
  Buf *bufs = NULL;
  void **inputs = NULL;
  smelt_status st = NULL;
  char label[320];
  snprintf(label, sizeof label, "%s%s%s%s%s", t->label, ro->no_opt ? " (unoptimised)" : "", ro->cpu ? " (cpu " : "",
           ro->cpu ? ro->cpu : "", ro->cpu ? ")" : "");
  t->label = label;
  for (int i = 0; i < g->nnode; i++) {
    ir_fill_default_attrs(g, i);
    st = ir_infer_node(g, i);
    if (st) goto fail;
  }
  if (g->noutputs == 0) {
    /* results nobody reads are the graph's outputs */
    int *uses = ir_use_counts(g);
    for (int i = 0; i < g->nnode; i++)
      for (int j = 0; j < g->node[i].nout; j++)
        if (!uses[g->node[i].out[j]]) ir_add_output(g, g->node[i].out[j]);
    free(uses);
  }
  if (g->ngroups == 0 && (st = cg_single_node_groups(g))) goto fail;
  if ((st = ir_verify(g))) goto fail;

  /* the reference */
  inputs = calloc((size_t)t->nin + 1, sizeof *inputs);
  if ((st = ir_interp_create(g, &it))) goto fail;
  for (int i = 0; i < t->nin; i++) {
    const Value *val = &g->val[t->in[i].value];
    size_t bytes = ir_type_bytes(&val->type);
    inputs[i] = malloc(bytes ? bytes : 1);
    tg_fill(t, val->type.dt, inputs[i], ir_type_numel(&val->type), t->in[i].dom, t->in[i].bound);
    if ((st = ir_interp_set_input(it, t->in[i].value, inputs[i]))) goto fail;
  }
  if ((st = ir_interp_run(it))) goto fail;

  /* the CPU backend */
  CgLlvmOptions opt = {.soft_f16 = ro->soft_f16, .no_opt = ro->no_opt, .cpu = ro->cpu};
  if ((st = cg_lower(g, &ks, &nk))) goto fail;
  st = cg_llvm_compile(g, ks, nk, &opt, &obj, &len, &desc);
  if (ro->expect_unsupported) {
    if (st && st_code(st) == ST_UNSUPPORTED) {
      st_free(st);
      st = NULL;
      ok = true;
    } else {
      fprintf(stderr, "%s: expected ST_UNSUPPORTED from the compile, got %s\n", t->label, st ? st_message(st) : "success");
      check_failures++;
    }
    goto done;
  }
  if (st) goto fail;
  int npacked = 0;
  if ((st = run_object(t, ks, nk, obj, len, inputs, &bufs, &npacked))) goto fail;
  tg_kernels_run += nk;

  ok = true;
  for (int i = 0; i < nk; i++)
    for (int a = ks[i].nargs - ks[i].nouts; a < ks[i].nargs; a++) {
      int v = ks[i].args[a];
      const void *want = ir_interp_value(it, v);
      if (!want) {
        fprintf(stderr, "%s: the interpreter has no '%s'\n", t->label, g->val[v].name);
        ok = false;
        continue;
      }
      if (!compare_value(t, v, buf_data(&bufs[v]), want, ro->tol32, ro->tol16)) ok = false;
    }
  for (int v = 0; v < g->nval; v++)
    if (bufs[v].mem && !buf_guards_ok(&bufs[v])) {
      fprintf(stderr, "%s: a guard region around '%s' was overwritten\n", t->label, g->val[v].name);
      ok = false;
    }
  for (int i = 0; i < t->nin; i++)
    if (memcmp(buf_data(&bufs[t->in[i].value]), inputs[i], bufs[t->in[i].value].bytes) != 0) {
      fprintf(stderr, "%s: input '%s' was modified\n", t->label, g->val[t->in[i].value].name);
      ok = false;
    }
  /* the weights packed at load time (NAME__prepack) against the same
   * kernels with the weights packed at compile time: bit-identical */
  if (npacked > 0) {
    opt.pack_at_compile = true;
    void *obj2 = NULL;
    size_t len2 = 0;
    Buf *bufs2 = NULL;
    int npacked2 = 0;
    st = cg_llvm_compile(g, ks, nk, &opt, &obj2, &len2, NULL);
    if (!st) st = run_object(t, ks, nk, obj2, len2, inputs, &bufs2, &npacked2);
    if (!st && npacked2 != 0) st = st_error(ST_INTERNAL, "packed at compile time, yet %d prepack functions", npacked2);
    for (int i = 0; i < nk && !st; i++)
      for (int a = ks[i].nargs - ks[i].nouts; a < ks[i].nargs; a++) {
        int v = ks[i].args[a];
        if (memcmp(buf_data(&bufs[v]), buf_data(&bufs2[v]), bufs[v].bytes) != 0) {
          fprintf(stderr, "%s: '%s' differs between weights packed at load time and at compile time\n", t->label,
                  g->val[v].name);
          ok = false;
        }
      }
    free_bufs(bufs2, g->nval);
    free(obj2);
    if (st) goto fail;
  }
  if (!ok) check_failures++;
  goto done;
fail:
  fprintf(stderr, "%s: %s\n", t->label, st ? st_message(st) : "failed");
  st_free(st);
  check_failures++;
done:
  free_bufs(bufs, g->nval);
  if (inputs)
    for (int i = 0; i < t->nin; i++) free(inputs[i]);
  free(inputs);
  ir_interp_destroy(it);
  free(obj);
  free(desc);
  cg_kernels_free(ks, nk);
  ir_graph_destroy(g);
  t->g = NULL;
  return ok;
}

#endif
