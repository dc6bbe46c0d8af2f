/* The checkers: compiled kernels against the reference interpreter.
 *
 * Both checkers evaluate the bundle's graph with the interpreter first (it
 * keeps every value, so any value can be compared afterwards), then run the
 * session on the same inputs into buffers of their own.  sc_check_outputs
 * compares the graph outputs after a whole run.  sc_check_groups drives the
 * session one kernel at a time through rt_session_run_kernel (reading values
 * through rt_session_read_value, which downloads them from a GPU) and compares
 * each value a kernel writes right after it ran, before a later kernel can
 * reuse the memory, and each intermediate a kernel reads right before it
 * runs: a value that passed when written and fails when read was overwritten
 * in between, which points at the memory plan instead of at the kernel.
 *
 * All arithmetic is in double on elements widened with dt_load, so one
 * routine serves every dtype.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp.h"
#include "compiler/check.h"
#include "compiler/driver.h"

void sc_diff(DType dt, const void *x, const void *ref, size_t n, ScDiff *out) { sc_diff_tol(dt, x, ref, n, NULL, out); }

/* x in dtype xdt against ref in rdt (the same but for the f32 reference),
 * judged as dtype dt. */
static void diff_mixed(DType dt, DType xdt, const void *x, DType rdt, const void *ref, size_t n, const ScTol *tol,
                       ScDiff *out) {
  bool allclose = tol && tol->set && dt_is_float(dt);
  double max_abs = 0, max_rel = 0, sdd = 0, sxx = 0, srr = 0, sxr = 0, worst = 0;
  int64_t worst_at = -1;
  int64_t nonfinite = 0, nfinite = 0;
  for (size_t i = 0; i < n; i++) {
    double a = dt_load(xdt, x, i), r = dt_load(rdt, ref, i);
    if (!isfinite(a) || !isfinite(r)) {
      bool same = (isnan(a) && isnan(r)) || a == r;
      if (!same) nonfinite++;
      continue;
    }
    double d = fabs(a - r);
    nfinite++;
    if (d > max_abs) max_abs = d;
    double rel = d / fmax(fabs(r), 1e-6);
    if (rel > max_rel) max_rel = rel;
    if (allclose) {
      /* d / bound without dividing by a zero bound (atol = rtol = 0:
       * exact, any difference infinitely over) */
      double bound = tol->atol + tol->rtol * fabs(r), ratio = d == 0 ? 0 : bound > 0 ? d / bound : INFINITY;
      if (worst_at < 0 || ratio > worst) worst = ratio, worst_at = (int64_t)i;
    }
    sdd += d * d;
    sxx += a * a;
    srr += r * r;
    sxr += a * r;
  }
  out->max_abs = max_abs;
  out->max_rel = max_rel;
  out->nonfinite = nonfinite;
  out->rel_l2 = srr > 0 ? sqrt(sdd) / sqrt(srr) : (sdd > 0 ? INFINITY : 0);
  if (sxx > 0 && srr > 0) out->cosine = sxr / (sqrt(sxx) * sqrt(srr));
  else out->cosine = sxx == 0 && srr == 0 ? 1 : 0;
  bool half = dt == DT_F16 || dt == DT_BF16;
  /* a (near-)zero reference has no scale: relative error and cosine are
   * meaningless there (inf, 0), so an absolute floor judges */
  bool tiny = nfinite == 0 || sqrt(srr / (double)nfinite) < SC_CHECK_TINY_REF;
  bool close;
  out->atol = 0;
  out->worst = worst;
  out->worst_at = worst_at;
  if (allclose) {
    out->rule = SC_RULE_ALLCLOSE;
    out->limit = tol->rtol;
    out->atol = tol->atol;
    close = worst <= 1;
  } else if (!dt_is_float(dt)) {
    out->rule = SC_RULE_EXACT;
    out->limit = 0;
    close = max_abs == 0;
  } else if (tiny) {
    out->rule = SC_RULE_ABS_FLOOR;
    out->limit = half ? SC_CHECK_ABS_FLOOR_16 : SC_CHECK_ABS_FLOOR;
    close = max_abs <= out->limit;
  } else if (half) {
    out->rule = SC_RULE_COSINE;
    out->limit = SC_CHECK_COSINE;
    close = out->cosine >= SC_CHECK_COSINE;
  } else {
    out->rule = SC_RULE_REL_L2;
    out->limit = SC_CHECK_REL_L2;
    close = out->rel_l2 <= SC_CHECK_REL_L2;
  }
  out->pass = close && nonfinite == 0;
}

void sc_diff_tol(DType dt, const void *x, const void *ref, size_t n, const ScTol *tol, ScDiff *out) {
  diff_mixed(dt, dt, x, dt, ref, n, tol, out);
}

static bool is_half(DType dt) { return dt == DT_F16 || dt == DT_BF16; }

smelt_status sc_widen_f32(const Graph *g, Graph **out) {
  *out = NULL;
  Graph *w = ir_graph_clone(g);
  if (!w) return st_error(ST_NO_MEMORY, "out of memory for the f32 copy of the graph");
  for (int v = 0; v < w->nval; v++) {
    Value *val = &w->val[v];
    if (val->kind == VK_DEAD || !is_half(val->type.dt)) continue;
    if (val->kind == VK_CONST && val->data) {
      size_t n = (size_t)ir_type_numel(&val->type);
      float *f = ir_graph_alloc(w, n * sizeof *f + 1);
      if (!f) break; /* marked: reported below */
      for (size_t i = 0; i < n; i++) f[i] = (float)dt_load(val->type.dt, val->data, i);
      val->data = f;
      val->source = NULL; /* its bytes are no longer the file's */
    }
    val->type.dt = DT_F32;
  }
  for (int k = 0; k < w->nnode; k++)
    for (int a = 0; a < w->node[k].nattr; a++) {
      Attr *at = &w->node[k].attr[a];
      if (at->type == AT_DTYPE && is_half(at->dt)) at->dt = DT_F32;
    }
  smelt_status st = ir_graph_status(w);
  if (!st) st = ir_verify(w);
  if (st) {
    ir_graph_destroy(w);
    return st;
  }
  *out = w;
  return NULL;
}

static bool graph_has_half(const Graph *g) {
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].kind != VK_DEAD && is_half(g->val[v].type.dt)) return true;
  return false;
}

/* Runs the f32 copy of g on the inputs (widened where they are f16/bf16)
 * and compares every half output of the report with it.  What cannot be
 * done is said in r->f32_note; only running out of memory is an error. */
static smelt_status check_f32(const Graph *g, const void *const *inputs, ScOutputReport *r) {
  Graph *w;
  smelt_status st = sc_widen_f32(g, &w);
  if (st) {
    bool oom = smelt_status_code(st) == SMELT_NO_MEMORY;
    snprintf(r->f32_note, sizeof r->f32_note, "no f32 reference: %s", smelt_status_message(st));
    if (oom) return st;
    smelt_status_free(st);
    return NULL;
  }
  void **wide = calloc(g->ninputs ? (size_t)g->ninputs : 1, sizeof *wide);
  Interp *it = NULL;
  if (!wide) st = st_error(ST_NO_MEMORY, "out of memory for the f32 inputs");
  for (int i = 0; i < g->ninputs && !st; i++) {
    const Value *v = &g->val[g->inputs[i]];
    if (!is_half(v->type.dt)) continue;
    size_t n = (size_t)ir_type_numel(&v->type);
    float *f = malloc(n * sizeof *f + 1);
    if (!f) st = st_error(ST_NO_MEMORY, "out of memory for the f32 inputs");
    else
      for (size_t e = 0; e < n; e++) f[e] = (float)dt_load(v->type.dt, inputs[i], e);
    wide[i] = f;
  }
  if (!st) st = ir_interp_create(w, &it);
  for (int i = 0; i < g->ninputs && !st; i++) st = ir_interp_set_input(it, w->inputs[i], wide[i] ? wide[i] : inputs[i]);
  if (!st) st = ir_interp_run(it);
  if (st && smelt_status_code(st) != SMELT_NO_MEMORY) {
    snprintf(r->f32_note, sizeof r->f32_note, "no f32 reference: %s", smelt_status_message(st));
    smelt_status_free(st);
    st = NULL;
  } else if (!st) {
    for (int i = 0; i < r->noutputs; i++) {
      ScOutputCheck *o = &r->outputs[i];
      if (!is_half(o->type.dt)) continue;
      diff_mixed(o->type.dt, o->type.dt, o->data, DT_F32, ir_interp_value(it, w->outputs[i]),
                 (size_t)ir_type_numel(&o->type), NULL, &o->f32);
      o->has_f32 = true;
    }
  }
  ir_interp_destroy(it);
  for (int i = 0; wide && i < g->ninputs; i++) free(wide[i]);
  free(wide);
  ir_graph_destroy(w);
  return st;
}

const char *sc_rule_text(const ScDiff *d, char *buf, size_t cap) {
  switch (d->rule) {
  case SC_RULE_REL_L2: snprintf(buf, cap, "rel L2 <= %g", d->limit); break;
  case SC_RULE_COSINE: snprintf(buf, cap, "cosine >= %g", d->limit); break;
  case SC_RULE_ABS_FLOOR: snprintf(buf, cap, "max abs <= %g, reference ~0", d->limit); break;
  case SC_RULE_EXACT: snprintf(buf, cap, "exact"); break;
  case SC_RULE_ALLCLOSE:
    snprintf(buf, cap, "|x-ref| <= %g + %g*|ref| (--atol, --rtol), worst %.3g", d->atol, d->limit, d->worst);
    break;
  }
  return buf;
}

/* Buffers for the session's outputs, one per output slot. */
typedef struct {
  void **buf;
  int n;
} OutBufs;

static void out_bufs_free(OutBufs *o) {
  if (!o->buf) return;
  for (int i = 0; i < o->n; i++) free(o->buf[i]);
  free(o->buf);
  o->buf = NULL;
}

/* Binds inputs[] and fresh output buffers (64-byte aligned, zeroed). */
static smelt_status bind_all(smelt_session *s, const void *const *inputs, OutBufs *ob) {
  const Graph *g = rt_bundle_graph(rt_session_bundle(s));
  for (int i = 0; i < g->ninputs; i++) {
    const Value *v = &g->val[g->inputs[i]];
    RETURN_IF_ERROR(smelt_session_bind_input(s, v->name, inputs[i], ir_type_bytes(&v->type)));
  }
  ob->n = g->noutputs;
  ob->buf = calloc(g->noutputs ? (size_t)g->noutputs : 1, sizeof *ob->buf);
  if (!ob->buf) return st_error(ST_NO_MEMORY, "out of memory for the outputs");
  for (int i = 0; i < g->noutputs; i++) {
    const Value *v = &g->val[g->outputs[i]];
    size_t bytes = ir_type_bytes(&v->type), cap = (bytes + 63) / 64 * 64;
    ob->buf[i] = aligned_alloc(64, cap ? cap : 64);
    if (!ob->buf[i]) return st_error(ST_NO_MEMORY, "out of memory for output '%s'", v->name);
    memset(ob->buf[i], 0, cap ? cap : 64);
  }
  /* Binding by name binds every slot of that name: bind each distinct
   * output once, in slot order, so slot i's buffer is the first slot's. */
  for (int i = g->noutputs - 1; i >= 0; i--) {
    const Value *v = &g->val[g->outputs[i]];
    RETURN_IF_ERROR(smelt_session_bind_output(s, v->name, ob->buf[i], ir_type_bytes(&v->type)));
  }
  return NULL;
}

/* The interpreter's run of the session's graph on inputs; of a
 * tensor-parallel session, of every rank's graph together
 * (ir_interp_run_ranks), rank 0's interpreter kept. */
static smelt_status run_reference(smelt_session *s, const void *const *inputs, Interp **out_it) {
  *out_it = NULL;
  const smelt_bundle *b = rt_session_bundle(s);
  int nranks = rt_bundle_num_ranks(b), spec = smelt_session_specialisation(s);
  if (spec < 0) spec = 0;
  Interp *its[64] = {NULL};
  if (nranks > 64) return st_error(ST_INVALID_INPUT, "%d ranks", nranks);
  smelt_status st = NULL;
  for (int r = 0; r < nranks && !st; r++) {
    const Graph *g = rt_bundle_graph(r ? rt_bundle_rank_spec(b, r, spec) : b);
    st = ir_interp_create(g, &its[r]);
    for (int i = 0; i < g->ninputs && !st; i++) st = ir_interp_set_input(its[r], g->inputs[i], inputs[i]);
  }
  if (!st) st = nranks > 1 ? ir_interp_run_ranks(its, nranks) : ir_interp_run(its[0]);
  for (int r = st ? 0 : 1; r < nranks; r++) ir_interp_destroy(its[r]);
  if (st) return st_prefix(st, "reference interpreter");
  *out_it = its[0];
  return NULL;
}

smelt_status sc_check_outputs(smelt_session *s, const void *const *inputs, ScOutputReport *out_report) {
  return sc_check_outputs_tol(s, inputs, NULL, out_report);
}

smelt_status sc_check_outputs_tol(smelt_session *s, const void *const *inputs, const ScTol *tol,
                                  ScOutputReport *out_report) {
  memset(out_report, 0, sizeof *out_report);
  const Graph *g = rt_bundle_graph(rt_session_bundle(s));
  OutBufs ob = {0};
  Interp *it = NULL;
  smelt_status st = bind_all(s, inputs, &ob);
  if (!st) st = smelt_session_run(s);
  if (!st) st = run_reference(s, inputs, &it);
  ScOutputCheck *oc = NULL;
  if (!st && !(oc = calloc(g->noutputs ? (size_t)g->noutputs : 1, sizeof *oc)))
    st = st_error(ST_NO_MEMORY, "out of memory for the report");
  if (st) {
    out_bufs_free(&ob);
    ir_interp_destroy(it);
    return st;
  }
  bool pass = true;
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    const Value *val = &g->val[v];
    oc[i] = (ScOutputCheck){.name = val->name, .value = v, .type = val->type, .data = ob.buf[i]};
    /* Duplicate slots were bound to the first slot's buffer. */
    for (int j = 0; j < i; j++)
      if (g->outputs[j] == v) memcpy(ob.buf[i], ob.buf[j], ir_type_bytes(&val->type));
    sc_diff_tol(val->type.dt, ob.buf[i], ir_interp_value(it, v), (size_t)ir_type_numel(&val->type), tol, &oc[i].diff);
    pass = pass && oc[i].diff.pass;
  }
  free(ob.buf); /* the buffers now belong to the report */
  ir_interp_destroy(it);
  *out_report = (ScOutputReport){.outputs = oc, .noutputs = g->noutputs, .pass = pass};
  if (graph_has_half(g) && (st = check_f32(g, inputs, out_report))) {
    sc_output_report_free(out_report);
    return st;
  }
  return NULL;
}

void sc_output_report_free(ScOutputReport *r) {
  if (!r || !r->outputs) return;
  for (int i = 0; i < r->noutputs; i++) free(r->outputs[i].data);
  free(r->outputs);
  memset(r, 0, sizeof *r);
}

typedef struct {
  ScValueCheck *v;
  int n, cap;
} Checks;

static smelt_status add_check(Checks *c, const ScValueCheck *x) {
  if (c->n == c->cap) {
    int cap = c->cap ? 2 * c->cap : 32;
    ScValueCheck *p = realloc(c->v, (size_t)cap * sizeof *p);
    if (!p) return st_error(ST_NO_MEMORY, "out of memory for the report");
    c->v = p;
    c->cap = cap;
  }
  c->v[c->n++] = *x;
  return NULL;
}

/* Compares value v as the session holds it now with the reference. */
static smelt_status compare_value(smelt_session *s, const Interp *it, const ScTol *tol, int k, int v,
                                  ScValueCheck *out) {
  const smelt_bundle *b = rt_session_bundle(s);
  const Graph *g = rt_bundle_graph(b);
  const Kernel *kn = rt_bundle_kernel(b, k);
  const Value *val = &g->val[v];
  *out = (ScValueCheck){.kernel = k, .group = kn->group, .kernel_name = kn->name, .value = v,
                        .value_name = val->name, .type = val->type};
  const void *data;
  RETURN_IF_ERROR(rt_session_read_value(s, v, &data));
  if (!data) return st_error(ST_INTERNAL, "value '%s' of kernel '%s' has no memory", val->name, kn->name);
  sc_diff_tol(val->type.dt, data, ir_interp_value(it, v), (size_t)ir_type_numel(&val->type), tol, &out->diff);
  return NULL;
}

/* Runs every kernel of the session, checking before and after each. */
static smelt_status check_kernels(smelt_session *s, const Interp *it, const ScTol *tol, bool *good, Checks *c) {
  const smelt_bundle *b = rt_session_bundle(s);
  const Graph *g = rt_bundle_graph(b);
  for (int k = 0; k < rt_bundle_num_kernels(b); k++) {
    const Kernel *kn = rt_bundle_kernel(b, k);
    ScValueCheck x;
    for (int a = 0; a < kn->nargs - kn->nouts; a++) {
      int v = kn->args[a];
      if (g->val[v].kind != VK_NODE || !good[v]) continue;
      RETURN_IF_ERROR(compare_value(s, it, tol, k, v, &x));
      if (x.diff.pass) continue;
      x.clobbered = true;
      good[v] = false; /* reported once */
      RETURN_IF_ERROR(add_check(c, &x));
    }
    RETURN_IF_ERROR(rt_session_run_kernel(s, k));
    for (int a = kn->nargs - kn->nouts; a < kn->nargs; a++) {
      RETURN_IF_ERROR(compare_value(s, it, tol, k, kn->args[a], &x));
      good[kn->args[a]] = x.diff.pass;
      RETURN_IF_ERROR(add_check(c, &x));
    }
  }
  return rt_session_finish(s);
}

smelt_status sc_check_groups(smelt_session *s, const void *const *inputs, ScGroupReport *out_report) {
  return sc_check_groups_tol(s, inputs, NULL, out_report);
}

smelt_status sc_check_groups_tol(smelt_session *s, const void *const *inputs, const ScTol *tol,
                                 ScGroupReport *out_report) {
  memset(out_report, 0, sizeof *out_report);
  out_report->first_bad = -1;
  const Graph *g = rt_bundle_graph(rt_session_bundle(s));
  OutBufs ob = {0};
  Interp *it = NULL;
  Checks c = {0};
  bool *good = NULL;
  smelt_status st = bind_all(s, inputs, &ob);
  if (!st) st = run_reference(s, inputs, &it);
  if (!st && !(good = calloc(g->nval ? (size_t)g->nval : 1, sizeof *good)))
    st = st_error(ST_NO_MEMORY, "out of memory for the report");
  if (!st) st = rt_session_prepare(s);
  if (!st) st = check_kernels(s, it, tol, good, &c);
  free(good);
  ir_interp_destroy(it);
  out_bufs_free(&ob);
  if (st) {
    free(c.v);
    return st;
  }
  out_report->checks = c.v;
  out_report->nchecks = c.n;
  for (int i = 0; i < c.n; i++)
    if (!c.v[i].diff.pass) {
      out_report->first_bad = i;
      break;
    }
  return NULL;
}

void sc_group_report_free(ScGroupReport *r) {
  if (!r) return;
  free(r->checks);
  memset(r, 0, sizeof *r);
  r->first_bad = -1;
}
