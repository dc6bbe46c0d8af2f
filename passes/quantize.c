/* quantize: matmul weights to int8, int4 or fp8, read through dequantize,
 * with a per-layer accuracy report.
 *
 * Every live matmul whose weight B is a 2-D float constant (and whose
 * weight or result name matches QuantOptions.only) is rewritten
 *   y = x @ W   into   y = x @ dequantize(Wq, S)
 * where Wq holds the weight rounded to nearest on a grid of one scale per
 * group of `group` consecutive elements along K (the input dim; 0 = one
 * scale per output channel):
 *   int8   symmetric, S = amax / 127, Wq = clamp(round(W / S), -127, 127)
 *   int4   symmetric, S = amax / 7,   Wq = clamp(round(W / S), -8, 7), packed
 *          two per byte (dtype i4)
 *   fp8    S = amax / 448, Wq = W / S in e4m3 (round to nearest even)
 * amax is the group's largest magnitude, round() is ties-to-even
 * (nearbyint, as torch.round), and S is stored in the weight's dtype and
 * read back before dividing, so that Wq is the best grid point for the
 * scale the kernels actually see.  Wq is stored [N, K] whatever the
 * weight's layout ([K, N] or [N, K] with transpose_b), S [N, K/G], the
 * dequantize's axis is 1 and the matmul reads it with transpose_b: each
 * output channel's weights and scales are then one contiguous run along K,
 * what the decode GEMVs stream (codegen/llvm/qmatmul.c, codegen/cuda/
 * qgemv.c; a [K, N] int4 weight read 128 columns at a time touches a page
 * per k, and ran 10x slower on the CPU).  The kernels dequantise inside
 * the matmul; const-fold keeps dequantize nodes.
 *
 * Accuracy.  Each rewritten matmul's output is compared with the
 * unquantised one on calibration rows: the rows of its input x that the
 * model computes when the reference interpreter runs it on random inputs
 * (seeded: floats uniform in [-1, 1), integer inputs 0, 1, 2, ... along the
 * last axis, as positions and token ids; states zero).  A model too big to
 * interpret quickly (more than CALIB_MAX_MACS multiply-adds in its matmuls)
 * gets synthetic rows, normal(0, 1) per feature, and the report says so.
 * At most CALIB_ROWS rows per layer; both products in double.  A layer
 * whose cosine is under 0.999 is flagged; with keep_below, a layer under
 * that cosine keeps its float weight (and is reported as kept).  The
 * report goes to ctx->quant_report; nothing is printed.
 *
 * A weight shared by several matmuls is quantised once (one Wq, one S);
 * each matmul gets a dequantize node of its own, so each fuses into its
 * own kernel.  Other users of the constant (a gather of tied embeddings)
 * keep reading the float weight.
 *
 * Requires: const-fold (weights computed from constants are constants),
 * and runs after layout (a CUDA weight is [N, K] by then).
 */
#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../format/parallel.h"
#include "../ir/interp.h"
#include "passes.h"
#include "rewrite.h"

enum { CALIB_ROWS = 64 };
#define CALIB_MAX_MACS 2e9
#define FLAG_COSINE 0.999

QuantMode pass_quant_mode(const char *name) {
  if (!name) return QM_NONE;
  if (strcmp(name, "int8") == 0) return QM_INT8;
  if (strcmp(name, "int4") == 0) return QM_INT4;
  if (strcmp(name, "fp8") == 0) return QM_FP8;
  return QM_NONE;
}

const char *pass_quant_mode_name(QuantMode m) {
  switch (m) {
  case QM_INT8: return "int8";
  case QM_INT4: return "int4";
  case QM_FP8: return "fp8";
  default: return "none";
  }
}

void pass_quant_report_free(QuantReport *r) {
  for (int i = 0; i < r->nlayers; i++) {
    free(r->layers[i].layer);
    free(r->layers[i].weight);
  }
  free(r->layers);
  free(r->calibration);
  memset(r, 0, sizeof *r);
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

/* ---- the text ---- */

typedef struct {
  char *s;
  size_t len, cap;
  bool oom;
} Text;

static void text_printf(Text *t, const char *fmt, ...) SMELT_PRINTF(2, 3);
static void text_printf(Text *t, const char *fmt, ...) {
  if (t->oom) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (t->len + (size_t)n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 512;
    while (cap < t->len + (size_t)n + 1) cap *= 2;
    char *p = realloc(t->s, cap);
    if (!p) {
      t->oom = true;
      return;
    }
    t->s = p;
    t->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(t->s + t->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  t->len += (size_t)n;
}

char *pass_quant_report_text(const QuantReport *r) {
  Text t = {0};
  int nq = 0, nflag = 0;
  double before = 0, after = 0;
  size_t wl = 5, ww = 6;
  for (int i = 0; i < r->nlayers; i++) {
    const QuantLayer *l = &r->layers[i];
    nq += !l->kept;
    nflag += l->flagged;
    before += l->bytes_before;
    after += l->kept ? l->bytes_before : l->bytes_after;
    if (strlen(l->layer) > wl) wl = strlen(l->layer);
    if (strlen(l->weight) > ww) ww = strlen(l->weight);
  }
  const QuantOptions *o = &r->opt;
  char grp[48];
  if (o->group) snprintf(grp, sizeof grp, "groups of %lld along K", (long long)o->group);
  else snprintf(grp, sizeof grp, "one scale per output channel");
  text_printf(&t, "quantize %s (%s, %s, round to nearest): %d of %d matmuls quantised\n",
              pass_quant_mode_name(o->mode), o->mode == QM_FP8 ? "e4m3" : "symmetric", grp, nq, r->nlayers);
  text_printf(&t, "calibration: %s\n", r->calibration ? r->calibration : "none");
  text_printf(&t, "  %-*s  %-*s  %6s  %6s  %5s  %9s  %9s\n", (int)wl, "layer", (int)ww, "weight", "K", "N", "group",
              "cosine", "rel.err");
  for (int i = 0; i < r->nlayers; i++) {
    const QuantLayer *l = &r->layers[i];
    text_printf(&t, "  %-*s  %-*s  %6lld  %6lld  %5lld  %9.6f  %9.3e%s%s\n", (int)wl, l->layer, (int)ww, l->weight,
                (long long)l->K, (long long)l->N, (long long)l->group, l->cosine, l->rel_err,
                l->flagged ? "  FLAGGED (cosine < 0.999)" : "", l->kept ? "; kept in float" : "");
  }
  if (nflag)
    text_printf(&t, "%d layer%s under cosine 0.999%s\n", nflag, nflag == 1 ? "" : "s",
                o->keep_below > 0 ? "" : " (--keep-below 0.999 keeps such layers in float)");
  text_printf(&t, "weights: %.0f bytes -> %.0f bytes (%.2fx smaller)\n", before, after, after > 0 ? before / after : 0.0);
  if (t.oom) {
    free(t.s);
    return NULL;
  }
  return t.s ? t.s : xstrdup("");
}

/* ---- quantising one weight ---- */

/* A weight's quantised form, in buffers of its own until the interpreter
 * (which sizes its state by the graph's values) is done with the graph. */
typedef struct {
  TensorType qt, st; /* Wq's and S's types */
  void *q, *s;       /* their bytes (malloc'd) */
  int qv, sv;        /* the constants made from them, -1 until then */
  int axis;          /* K's axis in the float weight it was made from */
  int next;          /* another entry of the same weight (the other axis), -1 */
  int w;             /* the float weight */
  smelt_status status; /* quantise_weight's, on a thread of its own */
} QuantWeight;

static double qmax_of(QuantMode m) { return m == QM_INT8 ? 127 : m == QM_INT4 ? 7 : 448; }

/* out[j] = element i0 + j * stride of base (dtype dt), j < n: f32, f16
 * and bf16 without dt_load's switch per element. */
static void load_f64(DType dt, const void *base, size_t i0, size_t stride, int64_t n, double *out) {
  switch (dt) {
  case DT_F32:
    for (int64_t j = 0; j < n; j++) out[j] = ((const float *)base)[i0 + (size_t)j * stride];
    return;
  case DT_F16:
    for (int64_t j = 0; j < n; j++) out[j] = dt_f16_to_f32(((const uint16_t *)base)[i0 + (size_t)j * stride]);
    return;
  case DT_BF16:
    for (int64_t j = 0; j < n; j++) out[j] = dt_bf16_to_f32(((const uint16_t *)base)[i0 + (size_t)j * stride]);
    return;
  default:
    for (int64_t j = 0; j < n; j++) out[j] = dt_load(dt, base, i0 + (size_t)j * stride);
  }
}

/* Column n's K weights (along axis) as doubles. */
static void load_column(const TensorType *wt, const void *wd, int axis, int64_t n, double *out) {
  int64_t K = wt->dim[axis], N = wt->dim[1 - axis];
  if (axis == 1) load_f64(wt->dt, wd, (size_t)(n * K), 1, K, out);
  else load_f64(wt->dt, wd, (size_t)n, (size_t)N, K, out);
}

/* Column n of dequantize(Wq, S) as doubles: q[n, k] s[n, k / G]. */
static void dequant_column(const QuantWeight *qw, int64_t n, int64_t G, double *out) {
  int64_t K = qw->qt.dim[1], ng = qw->st.dim[1];
  for (int64_t gi = 0; gi < ng; gi++) {
    double sc = dt_load(qw->st.dt, qw->s, (size_t)(n * ng + gi));
    load_f64(qw->qt.dt, qw->q, (size_t)(n * K + gi * G), 1, G, out + gi * G);
    for (int64_t k = 0; k < G; k++) out[gi * G + k] *= sc;
  }
}

/* Wq [N, K] and S [N, K/G] whatever the weight's layout: see the top. */
static smelt_status quantise_weight(const Graph *g, int w, int axis, int64_t group, QuantMode mode, QuantWeight *out) {
  const TensorType wt = g->val[w].type;
  int64_t K = wt.dim[axis], N = wt.dim[1 - axis], G = group ? group : K, ng = K / G;
  out->qt = out->st = wt;
  out->qt.dt = mode == QM_INT8 ? DT_I8 : mode == QM_INT4 ? DT_I4 : DT_F8E4M3;
  out->qt.dim[0] = out->st.dim[0] = N;
  out->qt.dim[1] = K;
  out->st.dim[1] = ng;
  out->qv = out->sv = -1;
  out->q = calloc(ir_type_bytes(&out->qt) + 1, 1);
  out->s = calloc(ir_type_bytes(&out->st) + 1, 1);
  if (!out->q || !out->s) return st_error(ST_NO_MEMORY, "out of memory quantising '%s'", g->val[w].name);
  const void *wd = g->val[w].data;
  double qmax = qmax_of(mode);
  double *col = malloc(sizeof(double) * (size_t)(K + 1));
  if (!col) return st_error(ST_NO_MEMORY, "out of memory quantising '%s'", g->val[w].name);
  for (int64_t n = 0; n < N; n++) {
    load_column(&wt, wd, axis, n, col);
    for (int64_t gi = 0; gi < ng; gi++) {
      const double *c = col + gi * G;
      double amax = 0;
      for (int64_t k = 0; k < G; k++) amax = fabs(c[k]) > amax ? fabs(c[k]) : amax;
      size_t si = (size_t)(n * ng + gi);
      dt_store(wt.dt, out->s, si, amax / qmax);
      double sc = dt_load(wt.dt, out->s, si); /* as the kernels read it */
      size_t q0 = (size_t)(n * K + gi * G);
      for (int64_t k = 0; k < G; k++) {
        double v = sc > 0 ? c[k] / sc : 0;
        dt_store(out->qt.dt, out->q, q0 + (size_t)k, mode == QM_FP8 ? v : nearbyint(v)); /* saturates */
      }
    }
  }
  free(col);
  return NULL;
}

static void quant_weight_free(QuantWeight *q) {
  free(q->q);
  free(q->s);
  q->q = q->s = NULL;
}

/* ---- calibration ---- */

static uint64_t rng_next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }

static double rng_normal(uint64_t *s) {
  double u1 = 1.0 - rng_unit(s), u2 = rng_unit(s);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Multiply-adds of the graph's matmuls and attention, to decide whether
 * interpreting it is affordable. */
static double graph_macs(const Graph *g) {
  double macs = 0;
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    const TensorType *y = &g->val[n->out[0]].type;
    if (n->op == OP_MATMUL) {
      const TensorType *a = &g->val[n->in[0]].type;
      bool ta = ir_attr_int(n, "transpose_a") != 0;
      int64_t K = a->rank == 1 ? a->dim[0] : a->dim[ta ? a->rank - 2 : a->rank - 1];
      macs += (double)ir_type_numel(y) * (double)K;
    } else if (n->op == OP_ATTENTION || n->op == OP_CONV2D) {
      const TensorType *k = &g->val[n->in[1]].type;
      macs += (double)ir_type_numel(y) * (double)ir_type_numel(k) / (k->dim[0] ? k->dim[0] : 1);
    }
  }
  return macs;
}

/* Runs g on seeded random inputs; *out_it is NULL (and the reason in why)
 * when the model is too large or the run fails. */
static smelt_status interpret(const Graph *g, uint64_t seed, Interp **out_it, char *why, size_t cap) {
  *out_it = NULL;
  double macs = graph_macs(g);
  if (macs > CALIB_MAX_MACS) {
    snprintf(why, cap, "the model takes %.1f GMAC, too many to interpret", macs / 1e9);
    return NULL;
  }
  Interp *it;
  RETURN_IF_ERROR(ir_interp_create(g, &it));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  smelt_status st = NULL;
  for (int i = 0; i < g->ninputs && !st; i++) {
    const Value *v = &g->val[g->inputs[i]];
    int64_t n = ir_type_numel(&v->type), last = v->type.rank ? v->type.dim[v->type.rank - 1] : 1;
    void *buf = calloc(ir_type_bytes(&v->type) + 1, 1);
    if (!buf) {
      st = st_error(ST_NO_MEMORY, "out of memory for calibration inputs");
      break;
    }
    for (int64_t j = 0; j < n; j++) {
      double x = dt_is_float(v->type.dt) ? rng_unit(&s) * 2 - 1 : v->type.dt == DT_BOOL ? 1 : (double)(j % (last ? last : 1));
      dt_store(v->type.dt, buf, (size_t)j, x);
    }
    st = ir_interp_set_input(it, g->inputs[i], buf);
    free(buf);
  }
  if (!st) st = ir_interp_run(it);
  if (st) {
    /* a model the interpreter cannot run on random data (an index out of
     * range) still quantises: with synthetic rows */
    snprintf(why, cap, "the model did not run on random inputs (%s)", st_message(st));
    st_free(st);
    ir_interp_destroy(it);
    return NULL;
  }
  *out_it = it;
  return NULL;
}

/* Up to CALIB_ROWS rows of K features of matmul n's input A (into x,
 * rows * K doubles); synthetic when it has none from the interpreter. */
static int64_t calib_rows(const Graph *g, const Node *n, const Interp *it, int64_t K, uint64_t *rng, double *x) {
  const TensorType *at = &g->val[n->in[0]].type;
  const void *a = it ? ir_interp_value(it, n->in[0]) : NULL;
  bool ta = ir_attr_int(n, "transpose_a") != 0;
  int64_t total = ir_type_numel(at) / (K ? K : 1);
  if (!a || total <= 0 || (ta && at->rank != 2)) {
    for (int64_t i = 0; i < 16 * K; i++) x[i] = rng_normal(rng);
    return 16;
  }
  int64_t rows = total < CALIB_ROWS ? total : CALIB_ROWS;
  for (int64_t r = 0; r < rows; r++) {
    int64_t src = r * total / rows; /* spread over the rows there are */
    for (int64_t k = 0; k < K; k++)
      x[r * K + k] = dt_load(at->dt, a, (size_t)(ta ? k * total + src : src * K + k));
  }
  return rows;
}

/* x (rows x K) times the weight w and times dequantize(q, s), both in
 * double, column by column; cosine and relative L2 error of the second
 * against the first.  False when out of memory. */
static bool compare_layer(const Graph *g, int w, const QuantWeight *qw, int axis, int64_t group, const double *x,
                          int64_t rows, double *out_cos, double *out_rel) {
  const TensorType *wt = &g->val[w].type;
  int64_t K = wt->dim[axis], N = wt->dim[1 - axis], G = group ? group : K;
  double *wcol = malloc(sizeof(double) * (size_t)(K + 1)), *qcol = malloc(sizeof(double) * (size_t)(K + 1));
  double dot = 0, na = 0, nb = 0, nd = 0;
  bool ok = wcol && qcol;
  if (!ok) goto done;
  for (int64_t n = 0; n < N; n++) {
    load_column(wt, g->val[w].data, axis, n, wcol);
    dequant_column(qw, n, G, qcol);
    for (int64_t r = 0; r < rows; r++) {
      const double *xr = x + r * K;
      double y[4] = {0, 0, 0, 0}, yq[4] = {0, 0, 0, 0}; /* four sums each: independent adds */
      int64_t k = 0;
      for (; k + 4 <= K; k += 4)
        for (int i = 0; i < 4; i++) {
          y[i] += xr[k + i] * wcol[k + i];
          yq[i] += xr[k + i] * qcol[k + i];
        }
      for (; k < K; k++) y[0] += xr[k] * wcol[k], yq[0] += xr[k] * qcol[k];
      double a = (y[0] + y[1]) + (y[2] + y[3]), b = (yq[0] + yq[1]) + (yq[2] + yq[3]);
      dot += a * b;
      na += a * a;
      nb += b * b;
      nd += (b - a) * (b - a);
    }
  }
  /* an all-zero layer is reproduced exactly: cosine 1 */
  *out_cos = na == 0 && nb == 0 ? 1.0 : na == 0 || nb == 0 ? 0.0 : dot / sqrt(na * nb);
  *out_rel = na == 0 ? (nd == 0 ? 0.0 : INFINITY) : sqrt(nd / na);
done:
  free(wcol);
  free(qcol);
  return ok;
}

/* ---- the jobs on threads ---- */

typedef struct {
  double cosine, rel_err;
  int64_t rows;
  bool oom;
} Measure;

typedef struct {
  const Graph *g;
  const QuantOptions *o;
  const Interp *it;
  const int *cand;
  QuantWeight *qws;
  const int *qent;
  Measure *ms;
} QuantJobs;

/* Entry e of qws quantised (its status in qws[e].status). */
static void quantise_task(void *ctx, int e) {
  QuantJobs *j = ctx;
  QuantWeight *q = &j->qws[e];
  q->status = quantise_weight(j->g, q->w, q->axis, j->o->group, j->o->mode, q);
}

/* Candidate c measured: its calibration rows (synthetic ones from a
 * generator seeded by the options' seed and c, so that the threads'
 * order does not matter) through both products. */
static void measure_task(void *ctx, int c) {
  QuantJobs *j = ctx;
  const Node *n = &j->g->node[j->cand[c]];
  int w = n->in[1], axis = ir_attr_int(n, "transpose_b") ? 1 : 0;
  int64_t K = j->g->val[w].type.dim[axis];
  uint64_t rng = (j->o->seed * 0x2545F4914F6CDD1Dull + 7) ^ ((uint64_t)(c + 1) * 0x9E3779B97F4A7C15ull);
  if (!rng) rng = 1;
  double *x = malloc(sizeof(double) * (size_t)(CALIB_ROWS * K + 1));
  Measure *m = &j->ms[c];
  if (!x) {
    m->oom = true;
    return;
  }
  m->rows = calib_rows(j->g, n, j->it, K, &rng, x);
  m->oom = !compare_layer(j->g, w, &j->qws[j->qent[c]], axis, j->o->group, x, m->rows, &m->cosine, &m->rel_err);
  free(x);
}

/* ---- the pass ---- */

static bool matches(const QuantOptions *o, const Graph *g, const Node *n) {
  if (!o->only) return true;
  return fnmatch(o->only, g->val[n->in[1]].name, 0) == 0 || fnmatch(o->only, ir_node_name(g, n), 0) == 0;
}

/* Whether matmul n reads a weight this pass quantises. */
static bool candidate(const Graph *g, const Node *n) {
  if (n->dead || n->op != OP_MATMUL || n->nin != 2) return false;
  const Value *w = &g->val[n->in[1]];
  if (w->kind != VK_CONST || !w->data || w->type.rank != 2 || !dt_is_float(w->type.dt) || w->type.dt == DT_F64)
    return false;
  return ir_type_numel(&w->type) > 0 && n->in[0] != n->in[1];
}

static smelt_status report_add(QuantReport *r, const QuantLayer *l) {
  if (r->nlayers == r->cap) {
    int cap = r->cap ? r->cap * 2 : 16;
    QuantLayer *p = realloc(r->layers, sizeof *p * (size_t)cap);
    if (!p) return st_error(ST_NO_MEMORY, "out of memory for the quantisation report");
    r->layers = p;
    r->cap = cap;
  }
  r->layers[r->nlayers++] = *l;
  return NULL;
}

smelt_status pass_quantize(Graph *g, PassCtx *ctx, bool *changed) {
  *changed = false;
  const QuantOptions *o = ctx->quant;
  if (!o || o->mode == QM_NONE) return NULL;
  if (o->group < 0) return st_error(ST_INVALID_INPUT, "quantize: group %lld must be 0 or positive", (long long)o->group);

  /* the candidates, and a located error for a group that does not fit */
  int nnode = g->nnode, ncand = 0;
  int *cand = malloc(sizeof(int) * (size_t)(nnode + 1));
  if (!cand) return st_error(ST_NO_MEMORY, "out of memory");
  for (int i = 0; i < nnode; i++) {
    const Node *n = &g->node[i];
    if (!candidate(g, n) || !matches(o, g, n)) continue;
    int axis = ir_attr_int(n, "transpose_b") ? 1 : 0;
    int64_t K = g->val[n->in[1]].type.dim[axis];
    if (o->group > 0 && K % o->group != 0) {
      smelt_status st = st_at(n->loc, "node '%s' (matmul): --quantize group %lld does not divide K = %lld of weight '%s'; "
                              "give --group with a divisor of K, or 0 for one scale per output channel",
                              ir_node_name(g, n), (long long)o->group, (long long)K, g->val[n->in[1]].name);
      free(cand);
      return st;
    }
    cand[ncand++] = i;
  }

  QuantReport *rep = ctx->quant_report;
  if (!rep) {
    rep = ctx->quant_report = calloc(1, sizeof *rep);
    if (!rep) {
      free(cand);
      return st_error(ST_NO_MEMORY, "out of memory");
    }
  }
  pass_quant_report_free(rep);
  rep->opt = *o;
  rep->opt.only = NULL; /* not owned */

  Interp *it = NULL;
  char why[512] = "";
  smelt_status st = ncand ? interpret(g, o->seed, &it, why, sizeof why) : NULL;
  char desc[700];
  if (!ncand) snprintf(desc, sizeof desc, "none (no matmul with a constant 2-D float weight%s)", o->only ? " matches" : "");
  else if (it) snprintf(desc, sizeof desc, "up to %d rows of each matmul's input, from the model run by the reference interpreter on random inputs (seed %llu)", CALIB_ROWS, (unsigned long long)o->seed);
  else snprintf(desc, sizeof desc, "16 synthetic rows of normal(0, 1) features per layer (%s)", why);
  rep->calibration = xstrdup(desc);

  int nval0 = g->nval;
  int *wq = st ? NULL : malloc(sizeof(int) * (size_t)(nval0 + 1)); /* weight -> its entry of qws, -1 */
  QuantWeight *qws = st ? NULL : calloc((size_t)ncand + 1, sizeof *qws);
  bool *keep = st ? NULL : calloc((size_t)ncand + 1, sizeof *keep);
  int *qent = st ? NULL : calloc((size_t)ncand + 1, sizeof *qent); /* candidate -> its entry of qws */
  Measure *ms = st ? NULL : calloc((size_t)ncand + 1, sizeof *ms);
  int nqw = 0;
  if (!st && (!wq || !qws || !keep || !qent || !ms)) st = st_error(ST_NO_MEMORY, "out of memory");
  for (int v = 0; !st && v < nval0; v++) wq[v] = -1;

  /* 1: quantise and measure, the graph unchanged (the interpreter reads
   * it): one quantised form per weight and K axis (a square weight may be
   * read both ways), the forms made and the layers measured on threads */
  uint64_t bytes = 0;
  for (int c = 0; c < ncand && !st; c++) {
    const Node *n = &g->node[cand[c]];
    int w = n->in[1], axis = ir_attr_int(n, "transpose_b") ? 1 : 0;
    int e = wq[w];
    while (e >= 0 && qws[e].axis != axis) e = qws[e].next;
    if (e < 0) {
      e = nqw++;
      qws[e] = (QuantWeight){.qv = -1, .sv = -1, .axis = axis, .next = wq[w], .w = w};
      wq[w] = e;
      bytes += ir_type_bytes(&g->val[w].type);
    }
    qent[c] = e;
  }
  QuantJobs jobs = {g, o, it, cand, qws, qent, ms};
  int threads = fmt_parallel_threads(bytes);
  if (!st) fmt_parallel_for(threads, nqw, quantise_task, &jobs);
  for (int e = 0; e < nqw && !st; e++) st = qws[e].status, qws[e].status = NULL;
  if (!st) fmt_parallel_for(threads, ncand, measure_task, &jobs);
  for (int c = 0; c < ncand && !st; c++) {
    const Node *n = &g->node[cand[c]];
    int w = n->in[1], axis = ir_attr_int(n, "transpose_b") ? 1 : 0;
    const TensorType *wt = &g->val[w].type;
    const QuantWeight *qw = &qws[qent[c]];
    if (ms[c].oom) {
      st = st_error(ST_NO_MEMORY, "out of memory measuring '%s'", ir_node_name(g, n));
      break;
    }
    QuantLayer l = {.K = wt->dim[axis], .N = wt->dim[1 - axis], .group = o->group, .rows = ms[c].rows,
                    .cosine = ms[c].cosine, .rel_err = ms[c].rel_err};
    l.flagged = !(l.cosine >= FLAG_COSINE);
    l.kept = keep[c] = o->keep_below > 0 && !(l.cosine >= o->keep_below);
    l.bytes_before = (double)ir_type_bytes(wt);
    l.bytes_after = (double)(ir_type_bytes(&qw->qt) + ir_type_bytes(&qw->st));
    l.layer = xstrdup(ir_node_name(g, n));
    l.weight = xstrdup(g->val[w].name);
    if (!l.layer || !l.weight || (st = report_add(rep, &l))) {
      free(l.layer);
      free(l.weight);
      if (!st) st = st_error(ST_NO_MEMORY, "out of memory");
    }
  }
  ir_interp_destroy(it);
  it = NULL;

  /* 2: the rewrite */
  for (int c = 0; c < ncand && !st; c++) {
    int id = cand[c], w = g->node[id].in[1];
    const QuantLayer *l = &rep->layers[c];
    if (keep[c]) {
      pass_ctx_logf(ctx, "quantize: kept '%s' in %s: cosine %.6f < %g", l->layer, dt_name(g->val[w].type.dt), l->cosine,
                    o->keep_below);
      continue;
    }
    QuantWeight *qw = &qws[qent[c]];
    if (qw->qv < 0) {
      char base[512];
      SrcLoc wloc = g->val[w].loc;
      snprintf(base, sizeof base, "%s.q", g->val[w].name);
      qw->qv = ir_add_const(g, pass_fresh_name(g, base), qw->qt, qw->q, wloc);
      snprintf(base, sizeof base, "%s.scale", g->val[w].name);
      qw->sv = ir_add_const(g, pass_fresh_name(g, base), qw->st, qw->s, wloc);
      g->val[qw->qv].init = g->val[qw->sv].init = "quantized";
    }
    char base[512];
    snprintf(base, sizeof base, "%s.dq", g->val[w].name);
    const char *name = pass_fresh_name(g, base);
    DType wdt = g->val[w].type.dt;
    int dq = ir_add_node(g, OP_DEQUANTIZE, 2, (int[]){qw->qv, qw->sv}, 1, &name, g->node[id].loc);
    ir_set_attr_int(g, dq, "axis", 1);
    ir_set_attr_int(g, dq, "group", o->group);
    ir_set_attr_dtype(g, dq, "to", wdt);
    if ((st = ir_infer_node(g, dq))) break;
    g->node[id].in[1] = g->node[dq].out[0];
    ir_set_attr_bool(g, id, "transpose_b", true);
    if ((st = ir_infer_node(g, id))) break;
    pass_ctx_logf(ctx, "quantize: '%s' reads %s %s through dequantize (cosine %.6f, rel.err %.3e)", l->layer,
                  dt_name(qw->qt.dt), g->val[qw->qv].name, l->cosine, l->rel_err);
    *changed = true;
  }
  for (int i = 0; qws && i < nqw; i++) quant_weight_free(&qws[i]), st_free(qws[i].status);
  free(qws);
  free(wq);
  free(keep);
  free(qent);
  free(ms);
  free(cand);
  ir_interp_destroy(it);
  return st;
}
