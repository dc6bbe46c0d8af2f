/* shard: one rank's part of a tensor-parallel model (smelt compile --tp N).
 *
 * The compiler runs the pipeline once per rank; this pass, with
 * ctx->tp = N and ctx->rank = r, rewrites the graph into what rank r
 * computes, Megatron-style (Shoeybi et al. 2019; GSPMD's propagation in
 * miniature):
 *   - a matmul whose input is whole on every rank and whose weight is a
 *     2-D constant is column-parallel: rank r keeps columns
 *     [r N/tp, (r+1) N/tp) of the weight, and its result is split along
 *     its last axis;
 *   - a matmul whose input is split along K is row-parallel: rank r keeps
 *     the rows of the weight that meet its part of K, and its result is a
 *     partial sum that an all_reduce completes;
 *   - so q, k, v and the gate/up projections split by columns, the
 *     attention output and down projections by rows, with one all_reduce
 *     after each of the latter: two per layer;
 *   - an embedding (gather from a 2-D constant table) is split by
 *     vocabulary: rank r looks up the ids in its rows, zeroes the others,
 *     and an all_reduce sums the ranks' rows;
 *   - the LM head is column-parallel too; its logits are gathered
 *     (all_gather) where something needs them whole, at the latest at the
 *     graph outputs.
 * Every value gets a layout: whole (replicated), split along one axis into
 * tp contiguous parts in rank order, or a partial sum.  Layouts flow
 * forward through the ops that keep them (elementwise with a matching or
 * broadcast operand, reshapes that keep the split axis's parts contiguous,
 * transposes, norms and softmaxes over another axis, rope over the head
 * axis, attention over heads with GQA when both the query and the kv heads
 * divide by tp, the KV-cache scatter, whose state is then stored split).
 * An op that cannot take its operand's layout gets it whole: all_gather or
 * all_reduce inserted before it, once per value.  A whole operand that
 * must be split is sliced locally (a constant is then folded by the
 * const-fold after this pass: each rank's bundle stores only its part of
 * the weights).  The result is correct for any graph; how much is split
 * depends on the model, and the pass log says what was kept whole and why.
 *
 * Requires canonicalize (explicit perms, axes, reshape shapes); runs before
 * fuse-attention and the CUDA layout passes, followed by const-fold and dce.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"
#include "rewrite.h"

typedef enum { L_WHOLE, L_SPLIT, L_PARTIAL } LayKind;

typedef struct {
  Graph *g;
  PassCtx *ctx;
  int tp, rank;
  int cap;
  int8_t *kind, *axis; /* per value: its layout */
  int *whole;          /* per value: its whole form (all_gather/all_reduce), -1 none yet */
  int *part;           /* per value: its local slice, -1 none yet */
  int8_t *part_axis;
  int ncol, nrow, nvocab, nreduce, ngather, nslice, nheads;
  smelt_status err;
} Sh;

static void grow(Sh *s) {
  if (s->g->nval <= s->cap) return;
  int cap = s->g->nval * 2 + 16;
  int8_t *k = realloc(s->kind, (size_t)cap), *a = realloc(s->axis, (size_t)cap);
  if (k) s->kind = k;
  if (a) s->axis = a;
  int *w = realloc(s->whole, sizeof(int) * (size_t)cap), *p = realloc(s->part, sizeof(int) * (size_t)cap);
  if (w) s->whole = w;
  if (p) s->part = p;
  int8_t *pa = realloc(s->part_axis, (size_t)cap);
  if (pa) s->part_axis = pa;
  if (!k || !a || !w || !p || !pa) {
    if (!s->err) s->err = st_error(ST_NO_MEMORY, "shard: out of memory");
    return;
  }
  for (int v = s->cap; v < cap; v++) s->kind[v] = L_WHOLE, s->axis[v] = -1, s->whole[v] = -1, s->part[v] = -1;
  s->cap = cap;
}

static void note_state(Sh *s, const char *name, int axis);

static void set_lay(Sh *s, int v, LayKind k, int axis) {
  s->kind[v] = (int8_t)k;
  s->axis[v] = (int8_t)axis;
}

static const TensorType *ty(const Sh *s, int v) { return &s->g->val[v].type; }

/* A new one-result node named after value `base`; its attributes are set
 * by the caller before finish(). */
static int begin(Sh *s, Op op, int nin, const int *in, int base, const char *suffix, SrcLoc loc) {
  const char *name = pass_fresh_name(s->g, ir_graph_printf(s->g, "%s/%s", s->g->val[base].name, suffix));
  return ir_add_node(s->g, op, nin, in, 1, &name, loc);
}

static int finish(Sh *s, int n) {
  ir_fill_default_attrs(s->g, n);
  smelt_status st = ir_infer_node(s->g, n);
  if (st && !s->err) s->err = st_prefix(st, "shard (internal)");
  else st_free(st);
  grow(s);
  return s->g->node[n].out[0];
}

/* v whole on every rank: all_gather of a split value, all_reduce of a
 * partial sum; once per value. */
static int whole(Sh *s, int v, SrcLoc loc) {
  if (s->kind[v] == L_WHOLE) return v;
  if (s->whole[v] >= 0) return s->whole[v];
  bool sum = s->kind[v] == L_PARTIAL;
  int n = begin(s, sum ? OP_ALL_REDUCE : OP_ALL_GATHER, 1, &v, v, sum ? "tp_sum" : "tp_gather", loc);
  ir_set_attr_int(s->g, n, "ranks", s->tp);
  if (!sum) ir_set_attr_int(s->g, n, "axis", s->axis[v]);
  int r = finish(s, n);
  if (sum) s->nreduce++;
  else s->ngather++;
  set_lay(s, r, L_WHOLE, -1);
  s->whole[v] = r;
  return r;
}

/* Whether a whole value of type t can be split along axis a. */
static bool splits(const Sh *s, const TensorType *t, int a) {
  return a >= 0 && a < t->rank && t->dim[a] >= s->tp && t->dim[a] % s->tp == 0;
}

/* v split along axis a: this rank's contiguous part, sliced locally. */
static int part(Sh *s, int v, int a, SrcLoc loc) {
  if (s->kind[v] == L_SPLIT && s->axis[v] == a) return v;
  if (s->kind[v] != L_WHOLE) v = whole(s, v, loc);
  if (s->part[v] >= 0 && s->part_axis[v] == a) return s->part[v];
  int64_t chunk = ty(s, v)->dim[a] / s->tp;
  int n = begin(s, OP_SLICE, 1, &v, v, "tp_part", loc);
  ir_set_attr_int(s->g, n, "axis", a);
  ir_set_attr_int(s->g, n, "start", s->rank * chunk);
  ir_set_attr_int(s->g, n, "end", (s->rank + 1) * chunk);
  ir_set_attr_int(s->g, n, "step", 1);
  int r = finish(s, n);
  s->nslice++;
  set_lay(s, r, L_SPLIT, a);
  s->part[v] = r;
  s->part_axis[v] = (int8_t)a;
  return r;
}

static void set_in(Sh *s, int n, int j, int v) { s->g->node[n].in[j] = v; }

/* Every operand whole; every result whole. */
static void all_whole(Sh *s, int n) {
  for (int j = 0; j < s->g->node[n].nin; j++) set_in(s, n, j, whole(s, s->g->node[n].in[j], s->g->node[n].loc));
  for (int j = 0; j < s->g->node[n].nout; j++) set_lay(s, s->g->node[n].out[j], L_WHOLE, -1);
}

static int out0(const Sh *s, int n) { return s->g->node[n].out[0]; }

/* Elementwise and broadcasting ops: split along one output axis when the
 * split operands agree on it; the whole operands that span that axis are
 * sliced, those broadcast along it stay. */
static void visit_broadcast(Sh *s, int n) {
  Graph *g = s->g;
  int nin = g->node[n].nin, ro = ty(s, out0(s, n))->rank, axis = -1;
  bool clash = false;
  for (int j = 0; j < nin; j++) {
    int v = g->node[n].in[j];
    if (s->kind[v] == L_PARTIAL) set_in(s, n, j, v = whole(s, v, g->node[n].loc));
    if (s->kind[v] != L_SPLIT) continue;
    int a = s->axis[v] + ro - ty(s, v)->rank;
    if (axis >= 0 && a != axis) clash = true;
    axis = a;
  }
  if (axis < 0 || clash) {
    all_whole(s, n);
    return;
  }
  for (int j = 0; j < nin; j++) {
    int v = g->node[n].in[j], la = axis - (ro - ty(s, v)->rank);
    if (s->kind[v] == L_SPLIT || la < 0 || ty(s, v)->dim[la] == 1) continue;
    if (!splits(s, ty(s, v), la)) {
      all_whole(s, n);
      return;
    }
    set_in(s, n, j, part(s, v, la, g->node[n].loc));
  }
  set_lay(s, out0(s, n), L_SPLIT, axis);
}

/* Ops over one axis (softmax, norms) or a list (reductions): the split
 * passes through when it is on another axis. */
static void visit_axis_op(Sh *s, int n, const int64_t *axes, int naxes, bool keepdims) {
  Graph *g = s->g;
  int x = g->node[n].in[0];
  if (s->kind[x] != L_SPLIT) {
    all_whole(s, n);
    return;
  }
  int a = s->axis[x], rank = ty(s, x)->rank, below = 0;
  for (int i = 0; i < naxes; i++) {
    int ax = ir_norm_axis(axes[i], rank);
    if (ax == a) {
      all_whole(s, n);
      return;
    }
    if (ax < a) below++;
  }
  for (int j = 1; j < g->node[n].nin; j++) set_in(s, n, j, whole(s, g->node[n].in[j], g->node[n].loc));
  for (int j = 0; j < g->node[n].nout; j++) set_lay(s, g->node[n].out[j], L_SPLIT, keepdims ? a : a - below);
}

/* reshape: a split along input axis a stays a split along the output axis
 * b that starts at the same element stride (the product of the axes before
 * it is the same) when tp divides that axis: each rank's part is then the
 * same contiguous run of every row in both shapes. */
static void visit_reshape(Sh *s, int n) {
  Graph *g = s->g;
  int x = g->node[n].in[0], y = out0(s, n);
  if (s->kind[x] != L_SPLIT) {
    all_whole(s, n);
    return;
  }
  const TensorType *it = ty(s, x);
  TensorType ot = *ty(s, y); /* still the whole shape: not inferred again yet */
  int64_t pre = 1;
  for (int i = 0; i < s->axis[x]; i++) pre *= it->dim[i];
  int64_t p = 1;
  for (int b = 0; b < ot.rank; b++) {
    if (p == pre && ot.dim[b] != 1 && splits(s, &ot, b)) {
      ot.dim[b] /= s->tp;
      ir_set_attr_ints(g, n, "shape", ot.dim, ot.rank);
      set_lay(s, y, L_SPLIT, b);
      return;
    }
    p *= ot.dim[b];
    if (p > pre) break;
  }
  all_whole(s, n);
}

static void visit_matmul(Sh *s, int n) {
  Graph *g = s->g;
  Node *nd = &g->node[n];
  bool ta = ir_attr_int(nd, "transpose_a") != 0, tb = ir_attr_int(nd, "transpose_b") != 0;
  int A = nd->in[0], B = nd->in[1];
  SrcLoc loc = nd->loc;
  if (s->kind[A] == L_PARTIAL) set_in(s, n, 0, A = whole(s, A, loc));
  if (s->kind[B] == L_PARTIAL) set_in(s, n, 1, B = whole(s, B, loc));
  const TensorType *at = ty(s, A), *bt = ty(s, B);
  int ra = at->rank, rb = bt->rank, ro = ty(s, out0(s, n))->rank;
  int ka = ra == 1 ? 0 : ta ? ra - 2 : ra - 1, ma = ra == 1 ? -1 : ta ? ra - 1 : ra - 2;
  int kb = rb == 1 ? 0 : tb ? rb - 1 : rb - 2, nb = rb == 1 ? -1 : tb ? rb - 2 : rb - 1;
  int la = s->kind[A] == L_SPLIT ? s->axis[A] : -1, lb = s->kind[B] == L_SPLIT ? s->axis[B] : -1;
  if (la < 0 && lb < 0) {
    /* column-parallel: a constant weight split by output columns */
    if (ir_is_const(g, B) && rb == 2 && splits(s, bt, nb)) {
      set_in(s, n, 1, part(s, B, nb, loc));
      set_lay(s, out0(s, n), L_SPLIT, ro - 1);
      s->ncol++;
      return;
    }
    set_lay(s, out0(s, n), L_WHOLE, -1);
    return;
  }
  if (la == ka && (lb == kb || (lb < 0 && splits(s, bt, kb)))) {
    /* row-parallel: the contraction split, a partial sum per rank */
    if (lb < 0) set_in(s, n, 1, part(s, B, kb, loc));
    set_lay(s, out0(s, n), L_PARTIAL, -1);
    s->nrow++;
    return;
  }
  if (la >= 0 && la == ma && lb < 0) { /* rows of A split: rows of the result */
    set_lay(s, out0(s, n), L_SPLIT, ro - 2);
    return;
  }
  if (la < 0 && lb >= 0 && lb == nb) { /* columns of B split: columns of the result */
    set_lay(s, out0(s, n), L_SPLIT, ro - 1);
    return;
  }
  /* a batch axis split (attention's heads in an unfused form): the other
   * operand follows, or broadcasts */
  int oa = la >= 0 && la < ra - 2 ? la + ro - ra : -1, ob = lb >= 0 && lb < rb - 2 ? lb + ro - rb : -1;
  if ((oa >= 0 || ob >= 0) && (oa < 0 || ob < 0 || oa == ob) && (la < 0 || oa >= 0) && (lb < 0 || ob >= 0)) {
    int o = oa >= 0 ? oa : ob;
    int other = oa >= 0 ? 1 : 0, ov = oa >= 0 ? B : A, orank = oa >= 0 ? rb : ra;
    int local = o - (ro - orank);
    if (s->kind[ov] != L_SPLIT && local >= 0 && local < orank - 2 && ty(s, ov)->dim[local] != 1) {
      if (!splits(s, ty(s, ov), local)) {
        all_whole(s, n);
        return;
      }
      set_in(s, n, other, part(s, ov, local, loc));
    }
    set_lay(s, out0(s, n), L_SPLIT, o);
    return;
  }
  all_whole(s, n);
}

/* attention over heads: q [B,H,S,D], k and v [B,Hkv,T,D] all split along
 * axis 1 when tp divides both head counts (then rank r's query heads use
 * exactly its kv heads: GQA groups do not straddle ranks). */
static void visit_attention(Sh *s, int n) {
  Graph *g = s->g;
  Node *nd = &g->node[n];
  SrcLoc loc = nd->loc;
  int q = nd->in[0], k = nd->in[1];
  bool any = false, ok = true;
  for (int j = 0; j < 3; j++) {
    int x = g->node[n].in[j];
    if (s->kind[x] == L_SPLIT && s->axis[x] == 1) any = true;
    else if (s->kind[x] == L_SPLIT || s->kind[x] == L_PARTIAL) ok = false;
  }
  int64_t h = ty(s, q)->dim[1] * (s->kind[q] == L_SPLIT ? s->tp : 1);
  int64_t hkv = ty(s, k)->dim[1] * (s->kind[k] == L_SPLIT ? s->tp : 1);
  if (any && (h % s->tp || hkv % s->tp)) {
    pass_ctx_logf(s->ctx, "shard: %s kept whole: %lld query and %lld kv heads do not split over %d ranks",
                  ir_node_name(g, nd), (long long)h, (long long)hkv, s->tp);
    s->nheads++;
    ok = false;
  }
  if (!any || !ok) {
    all_whole(s, n);
    return;
  }
  for (int j = 0; j < 3; j++) set_in(s, n, j, part(s, g->node[n].in[j], 1, loc));
  if (g->node[n].nin == 4) {
    int m = g->node[n].in[3];
    if (ir_attr_int(&g->node[n], "cache")) {
      set_in(s, n, 3, whole(s, m, loc));
    } else {
      m = whole(s, m, loc);
      int la = 1 - (4 - ty(s, m)->rank);
      if (la >= 0 && ty(s, m)->dim[la] != 1) m = part(s, m, la, loc);
      set_in(s, n, 3, m);
    }
  }
  set_lay(s, out0(s, n), L_SPLIT, 1);
}

/* scatter into a state (the KV-cache append): the state is stored split
 * like the rows written into it. */
static void visit_scatter(Sh *s, int n) {
  Graph *g = s->g;
  Node *nd = &g->node[n];
  int dst = nd->in[0], src = nd->in[2];
  int ax = ir_norm_axis(ir_attr_int(nd, "axis"), ty(s, dst)->rank);
  bool state = g->val[dst].kind == VK_INPUT && g->val[dst].state;
  if (s->kind[src] == L_SPLIT && s->axis[src] != ax && state && s->kind[dst] == L_WHOLE &&
      splits(s, ty(s, dst), s->axis[src])) {
    g->val[dst].type.dim[s->axis[src]] /= s->tp;
    set_lay(s, dst, L_SPLIT, s->axis[src]);
    note_state(s, g->val[dst].name, s->axis[src]);
    set_in(s, n, 1, whole(s, nd->in[1], nd->loc));
    set_lay(s, out0(s, n), L_SPLIT, s->axis[src]);
    return;
  }
  all_whole(s, n);
}

/* Records that state `name` is stored split along axis (PassCtx.tp_states). */
static void note_state(Sh *s, const char *name, int axis) {
  char *old = s->ctx->tp_states;
  size_t n = (old ? strlen(old) + 1 : 0) + strlen(name) + 16;
  char *p = malloc(n);
  if (!p) {
    if (!s->err) s->err = st_error(ST_NO_MEMORY, "shard: out of memory");
    return;
  }
  snprintf(p, n, "%s%s%s:%d", old ? old : "", old ? ";" : "", name, axis);
  free(old);
  s->ctx->tp_states = p;
}

/* An embedding split by vocabulary: rank r holds rows [r V/tp, (r+1) V/tp)
 * of the table, looks up ids - r V/tp clamped to its rows, and zeroes the
 * rows of ids that are not its own; the ranks' sum (an all_reduce) is the
 * lookup. */
static bool visit_vocab_gather(Sh *s, int n) {
  Graph *g = s->g;
  Node *nd = &g->node[n];
  int tab = nd->in[0], idx = nd->in[1], y = nd->out[0];
  const TensorType *tt = ty(s, tab), *it = ty(s, idx);
  if (ir_attr_int(nd, "axis") != 0 || !ir_is_const(g, tab) || tt->rank != 2 || !splits(s, tt, 0) ||
      s->kind[idx] != L_WHOLE || !(it->dt == DT_I32 || it->dt == DT_I64) || it->rank + 1 > IR_MAX_RANK)
    return false;
  SrcLoc loc = nd->loc;
  int64_t rows = tt->dim[0] / s->tp;
  TensorType one = {.dt = it->dt, .rank = 1, .dim = {1}};
  int64_t vals[3] = {s->rank * rows, 0, rows - 1};
  int c[3];
  for (int i = 0; i < 3; i++) {
    int32_t v32 = (int32_t)vals[i];
    c[i] = ir_add_const(g, pass_fresh_name(g, ir_graph_printf(g, "%s/tp_vocab_c%d", g->val[y].name, i)), one,
                        it->dt == DT_I32 ? (const void *)&v32 : (const void *)&vals[i], loc);
    g->val[c[i]].init = "shard";
  }
  grow(s);
  int in2[2] = {idx, c[0]};
  int local = finish(s, begin(s, OP_SUB, 2, in2, y, "tp_vocab_id", loc));
  in2[0] = local, in2[1] = c[1];
  int lo = finish(s, begin(s, OP_MAXIMUM, 2, in2, y, "tp_vocab_lo", loc));
  in2[0] = lo, in2[1] = c[2];
  int cl = finish(s, begin(s, OP_MINIMUM, 2, in2, y, "tp_vocab_row", loc));
  in2[0] = cl, in2[1] = local;
  int own = finish(s, begin(s, OP_EQUAL, 2, in2, y, "tp_vocab_own", loc));
  int rs = begin(s, OP_RESHAPE, 1, &own, y, "tp_vocab_mask", loc);
  TensorType mt = *ty(s, own);
  mt.dim[mt.rank++] = 1;
  ir_set_attr_ints(g, rs, "shape", mt.dim, mt.rank);
  int mask = finish(s, rs);
  set_in(s, n, 0, part(s, tab, 0, loc));
  set_in(s, n, 1, cl);
  smelt_status st = ir_infer_node(g, n);
  if (st) {
    if (!s->err) s->err = st_prefix(st, "shard (internal)");
    else st_free(st);
    return true;
  }
  TensorType zt = {.dt = tt->dt, .rank = 1, .dim = {1}};
  int zero = ir_add_const(g, pass_fresh_name(g, ir_graph_printf(g, "%s/tp_vocab_zero", g->val[y].name)), zt, NULL, loc);
  g->val[zero].init = "zeros";
  grow(s);
  int in3[3] = {mask, y, zero};
  int w = begin(s, OP_WHERE, 3, in3, y, "tp_vocab", loc);
  int wv = finish(s, w);
  /* every reader of the lookup reads the masked rows instead */
  ir_replace_all_uses(g, y, wv);
  g->node[w].in[1] = y;
  set_lay(s, y, L_PARTIAL, -1);
  set_lay(s, wv, L_PARTIAL, -1);
  s->nvocab++;
  return true;
}

static void visit(Sh *s, int n) {
  Graph *g = s->g;
  Node *nd = &g->node[n];
  Op op = nd->op;
  switch (op) {
  case OP_MATMUL: visit_matmul(s, n); break;
  case OP_RESHAPE: visit_reshape(s, n); break;
  case OP_TRANSPOSE: {
    int x = nd->in[0];
    if (s->kind[x] != L_SPLIT) {
      all_whole(s, n);
      break;
    }
    const Attr *p = ir_attr(nd, "perm");
    int b = -1;
    for (int i = 0; p && i < p->n; i++)
      if (p->ints[i] == s->axis[x]) b = i;
    if (b < 0) all_whole(s, n);
    else set_lay(s, out0(s, n), L_SPLIT, b);
    break;
  }
  case OP_SUM:
  case OP_MEAN:
  case OP_MAX:
  case OP_MIN: {
    const Attr *ax = ir_attr(nd, "axes");
    if (!ax) all_whole(s, n);
    else visit_axis_op(s, n, ax->ints, ax->n, ir_attr_int(nd, "keepdims") != 0);
    break;
  }
  case OP_SOFTMAX:
  case OP_LOG_SOFTMAX:
  case OP_LAYER_NORM:
  case OP_RMS_NORM:
  case OP_ARGMAX: {
    int64_t a = ir_attr_int(nd, "axis");
    visit_axis_op(s, n, &a, 1, op != OP_ARGMAX || ir_attr_int(nd, "keepdims") != 0);
    break;
  }
  case OP_SLICE: {
    int64_t a = ir_attr_int(nd, "axis");
    visit_axis_op(s, n, &a, 1, true);
    break;
  }
  case OP_ROPE: { /* rotates the last axis, positions along the one before */
    int x = nd->in[0], r = ty(s, x)->rank;
    int64_t axes[2] = {r - 1, r - 2};
    visit_axis_op(s, n, axes, 2, true);
    break;
  }
  case OP_CONCAT: {
    int a = -1;
    bool ok = true;
    int c = ir_norm_axis(ir_attr_int(nd, "axis"), ty(s, nd->in[0])->rank);
    for (int j = 0; j < nd->nin; j++) {
      int v = nd->in[j];
      if (s->kind[v] == L_SPLIT) ok = ok && (a < 0 || s->axis[v] == a), a = s->axis[v];
    }
    ok = ok && a >= 0 && a != c;
    for (int j = 0; ok && j < g->node[n].nin; j++) {
      int v = g->node[n].in[j];
      if (s->kind[v] == L_SPLIT) continue;
      if (s->kind[v] == L_PARTIAL) v = whole(s, v, g->node[n].loc);
      if (!splits(s, ty(s, v), a)) ok = false;
      else set_in(s, n, j, part(s, v, a, g->node[n].loc));
    }
    if (ok) set_lay(s, out0(s, n), L_SPLIT, a);
    else all_whole(s, n);
    break;
  }
  case OP_ATTENTION: visit_attention(s, n); break;
  case OP_SCATTER: visit_scatter(s, n); break;
  case OP_GATHER:
    if (s->tp > 1 && visit_vocab_gather(s, n)) break;
    all_whole(s, n);
    break;
  default: {
    FusionClass fc = ir_op_info(op)->fclass;
    if ((fc == FC_ELEMWISE || fc == FC_BROADCAST) && op != OP_EXPAND && op != OP_BATCH_NORM && nd->nout == 1)
      visit_broadcast(s, n);
    else
      all_whole(s, n);
  }
  }
}

smelt_status pass_shard(Graph *g, PassCtx *ctx, bool *changed) {
  if (ctx->tp <= 1) return NULL;
  if (ctx->tp > 64) return st_error(ST_INVALID_INPUT, "--tp %d: at most 64 ranks", ctx->tp);
  if (ctx->rank < 0 || ctx->rank >= ctx->tp)
    return st_error(ST_INTERNAL, "shard: rank %d of %d", ctx->rank, ctx->tp);
  Sh s = {.g = g, .ctx = ctx, .tp = ctx->tp, .rank = ctx->rank};
  grow(&s);
  int nout = g->noutputs;
  const char **names = malloc(sizeof *names * (size_t)(nout ? nout : 1));
  int *orig = malloc(sizeof *orig * (size_t)(nout ? nout : 1));
  if (!names || !orig) {
    free(names), free(orig);
    free(s.kind), free(s.axis), free(s.whole), free(s.part), free(s.part_axis);
    return st_error(ST_NO_MEMORY, "shard: out of memory");
  }
  for (int i = 0; i < nout; i++) orig[i] = g->outputs[i], names[i] = g->val[g->outputs[i]].name;
  int nnode = g->nnode; /* nodes added on the way are conversions, already placed */
  for (int n = 0; n < nnode && !s.err; n++) {
    if (g->node[n].dead) continue;
    visit(&s, n);
    if (s.err) break;
    smelt_status st = ir_infer_node(g, n);
    if (st) s.err = st_prefix(st, "shard: after splitting '%s' (internal)", ir_node_name(g, &g->node[n]));
  }
  /* the outputs whole, under the model's names */
  for (int i = 0; i < nout && !s.err; i++) {
    int v = g->outputs[i];
    int w = whole(&s, v, g->val[v].loc);
    if (w == v && v == orig[i]) continue;
    g->outputs[i] = w;
    /* the values that carried the name before (the output as computed
     * here, and what it was before a rewrite above) give it up */
    if (v != w) g->val[v].name = pass_fresh_name(g, ir_graph_printf(g, "%s/tp_local", names[i]));
    if (orig[i] != w && orig[i] != v)
      g->val[orig[i]].name = pass_fresh_name(g, ir_graph_printf(g, "%s/tp_orig", names[i]));
    g->val[w].name = names[i];
  }
  if (!s.err) {
    pass_ctx_logf(ctx,
                  "shard: rank %d of %d: %d matmuls split by columns, %d by rows, %d embeddings by vocabulary; "
                  "%d all_reduce, %d all_gather, %d local slices%s",
                  s.rank, s.tp, s.ncol, s.nrow, s.nvocab, s.nreduce, s.ngather, s.nslice,
                  s.nheads ? " (see the attentions kept whole above)" : "");
    *changed = true;
  }
  free(names), free(orig);
  free(s.kind), free(s.axis), free(s.whole), free(s.part), free(s.part_axis);
  smelt_status st = s.err;
  if (!st) st = ir_graph_status(g);
  return st;
}
