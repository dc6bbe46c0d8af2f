/* Shape and dtype inference for every operator of ops.def.
 *
 * Each rule reads its operands' types, checks what the operator requires
 * (ranks, matching dims, dtypes, attribute ranges) and writes the types of
 * the results.  Every failure is a user error located at the node, phrased
 * like "model.yaml:14:7: error: node 'h2' (add): shapes [128,512] and [256]
 * do not broadcast".  There are no implicit dtype promotions: mixing f32 and
 * f16 is an error that asks for a cast, as in XLA, because silent promotion
 * would hide a doubled memory footprint. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ir.h"

typedef smelt_status (*InferFn)(Graph *g, Node *n);
#define OP(id, name, mn, mx, nout, fc, attrs, infer, ref) static smelt_status infer(Graph *g, Node *n);
#include "ops.def"
#undef OP

static const InferFn infer_table[OP_COUNT] = {
#define OP(id, name, mn, mx, nout, fc, attrs, infer, ref) [OP_##id] = infer,
#include "ops.def"
#undef OP
};

static smelt_status fail(const Graph *g, const Node *n, const char *fmt, ...) SMELT_PRINTF(3, 4);
static smelt_status fail(const Graph *g, const Node *n, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return st_at(n->loc, "node '%s' (%s): %s", ir_node_name(g, n), ir_op_name(n->op), msg);
}

static const TensorType *in_type(const Graph *g, const Node *n, int i) { return &g->val[n->in[i]].type; }
static void set_out(Graph *g, Node *n, int i, TensorType t) { g->val[n->out[i]].type = t; }

/* "[128,512]" for messages. */
static const char *shape_str(const TensorType *t, char *buf, size_t cap) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < t->rank && k < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)t->dim[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

static smelt_status need_float(const Graph *g, const Node *n, int i) {
  const TensorType *t = in_type(g, n, i);
  if (!dt_is_float(t->dt))
    return fail(g, n, "input %d ('%s') must be floating point, got %s", i + 1, g->val[n->in[i]].name,
                dt_name(t->dt));
  return NULL;
}

static smelt_status same_dtype(const Graph *g, const Node *n, int i, int j) {
  DType a = in_type(g, n, i)->dt, b = in_type(g, n, j)->dt;
  if (a != b)
    return fail(g, n, "dtypes of '%s' (%s) and '%s' (%s) differ; insert a cast", g->val[n->in[i]].name,
                dt_name(a), g->val[n->in[j]].name, dt_name(b));
  return NULL;
}

/* numpy broadcasting of two shapes; false when they do not broadcast. */
static bool broadcast(const TensorType *a, const TensorType *b, TensorType *out) {
  int r = a->rank > b->rank ? a->rank : b->rank;
  *out = (TensorType){.rank = r}; /* every other field zero; callers set dt */
  for (int i = 0; i < r; i++) {
    int ia = i - (r - a->rank), ib = i - (r - b->rank);
    int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    out->dim[i] = da == 1 ? db : da;
  }
  return true;
}

static smelt_status broadcast_inputs(const Graph *g, const Node *n, int first, TensorType *out) {
  *out = *in_type(g, n, first);
  for (int i = first + 1; i < n->nin; i++) {
    TensorType r;
    if (!broadcast(out, in_type(g, n, i), &r)) {
      char a[128], b[128];
      return fail(g, n, "shapes %s and %s do not broadcast", shape_str(out, a, sizeof a),
                  shape_str(in_type(g, n, i), b, sizeof b));
    }
    r.dt = out->dt;
    *out = r;
  }
  return NULL;
}

/* ---- elementwise ---- */

static smelt_status infer_unary(Graph *g, Node *n) {
  switch (n->op) {
  case OP_NEG: case OP_ABS: case OP_RELU: case OP_SIGN: break;
  default: RETURN_IF_ERROR(need_float(g, n, 0));
  }
  set_out(g, n, 0, *in_type(g, n, 0));
  return NULL;
}

static smelt_status infer_cast(Graph *g, Node *n) {
  TensorType t = *in_type(g, n, 0);
  const Attr *to = ir_attr(n, "to");
  assert(to);
  t.dt = to->dt;
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_binary(Graph *g, Node *n) {
  RETURN_IF_ERROR(same_dtype(g, n, 0, 1));
  if (n->op == OP_POW) RETURN_IF_ERROR(need_float(g, n, 0));
  TensorType t;
  RETURN_IF_ERROR(broadcast_inputs(g, n, 0, &t));
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_compare(Graph *g, Node *n) {
  RETURN_IF_ERROR(same_dtype(g, n, 0, 1));
  TensorType t;
  RETURN_IF_ERROR(broadcast_inputs(g, n, 0, &t));
  t.dt = DT_BOOL;
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_where(Graph *g, Node *n) {
  if (in_type(g, n, 0)->dt != DT_BOOL)
    return fail(g, n, "condition '%s' must be bool, got %s", g->val[n->in[0]].name, dt_name(in_type(g, n, 0)->dt));
  RETURN_IF_ERROR(same_dtype(g, n, 1, 2));
  TensorType t;
  RETURN_IF_ERROR(broadcast_inputs(g, n, 0, &t));
  t.dt = in_type(g, n, 1)->dt;
  set_out(g, n, 0, t);
  return NULL;
}

/* ---- reductions and norms ---- */

/* Reads an axes attribute into a mask over x's dims; absent = all axes. */
static smelt_status axes_mask(const Graph *g, const Node *n, const char *attr, int rank, bool *mask,
                              bool absent_all) {
  const Attr *a = ir_attr(n, attr);
  for (int i = 0; i < rank; i++) mask[i] = !a && absent_all;
  if (!a) return NULL;
  for (int i = 0; i < a->n; i++) {
    int ax = ir_norm_axis(a->ints[i], rank);
    if (ax < 0) return fail(g, n, "axis %lld out of range for rank %d", (long long)a->ints[i], rank);
    if (mask[ax]) return fail(g, n, "axis %lld repeated in '%s'", (long long)a->ints[i], attr);
    mask[ax] = true;
  }
  return NULL;
}

static smelt_status infer_reduce(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  bool mask[IR_MAX_RANK];
  RETURN_IF_ERROR(axes_mask(g, n, "axes", x->rank, mask, true));
  if (n->op == OP_MEAN) RETURN_IF_ERROR(need_float(g, n, 0));
  bool keep = ir_attr_int(n, "keepdims") != 0;
  TensorType t = {.dt = x->dt};
  for (int i = 0; i < x->rank; i++) {
    if (!mask[i]) t.dim[t.rank++] = x->dim[i];
    else if (keep) t.dim[t.rank++] = 1;
    if (mask[i] && x->dim[i] == 0 && (n->op == OP_MAX || n->op == OP_MIN))
      return fail(g, n, "%s over an empty axis", ir_op_name(n->op));
  }
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_softmax(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  RETURN_IF_ERROR(need_float(g, n, 0));
  if (ir_norm_axis(ir_attr_int(n, "axis"), x->rank) < 0)
    return fail(g, n, "axis %lld out of range for rank %d", (long long)ir_attr_int(n, "axis"), x->rank);
  set_out(g, n, 0, *x);
  return NULL;
}

static smelt_status infer_norm(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  RETURN_IF_ERROR(need_float(g, n, 0));
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), x->rank);
  if (ax < 0) return fail(g, n, "axis %lld out of range for rank %d", (long long)ir_attr_int(n, "axis"), x->rank);
  if (ir_attr_float(n, "eps") < 0) return fail(g, n, "eps must not be negative");
  for (int i = 1; i < n->nin; i++) {
    const TensorType *p = in_type(g, n, i);
    RETURN_IF_ERROR(same_dtype(g, n, 0, i));
    if (p->rank != 1 || p->dim[0] != x->dim[ax]) {
      char a[128];
      return fail(g, n, "'%s' has shape %s, expected [%lld] (the size of axis %d)", g->val[n->in[i]].name,
                  shape_str(p, a, sizeof a), (long long)x->dim[ax], ax);
    }
  }
  set_out(g, n, 0, *x);
  return NULL;
}

static smelt_status infer_batch_norm(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  RETURN_IF_ERROR(need_float(g, n, 0));
  if (x->rank < 2) return fail(g, n, "input must have rank >= 2 (channels on axis 1), got rank %d", x->rank);
  for (int i = 1; i < 5; i++) {
    const TensorType *p = in_type(g, n, i);
    RETURN_IF_ERROR(same_dtype(g, n, 0, i));
    if (p->rank != 1 || p->dim[0] != x->dim[1]) {
      char a[128];
      return fail(g, n, "'%s' has shape %s, expected [%lld] (channels)", g->val[n->in[i]].name,
                  shape_str(p, a, sizeof a), (long long)x->dim[1]);
    }
  }
  set_out(g, n, 0, *x);
  return NULL;
}

/* ---- contractions ---- */

static smelt_status infer_matmul(Graph *g, Node *n) {
  TensorType a = *in_type(g, n, 0), b = *in_type(g, n, 1);
  RETURN_IF_ERROR(same_dtype(g, n, 0, 1));
  if (a.rank == 0 || b.rank == 0) return fail(g, n, "operands must have rank >= 1");
  bool ta = ir_attr_int(n, "transpose_a") != 0, tb = ir_attr_int(n, "transpose_b") != 0;
  if ((ta && a.rank < 2) || (tb && b.rank < 2)) return fail(g, n, "transpose of a 1-D operand");
  bool a1 = a.rank == 1, b1 = b.rank == 1;
  if (a1) a.dim[1] = a.dim[0], a.dim[0] = 1, a.rank = 2;
  if (b1) b.dim[1] = 1, b.rank = 2;
  if (ta) { int64_t t = a.dim[a.rank - 1]; a.dim[a.rank - 1] = a.dim[a.rank - 2]; a.dim[a.rank - 2] = t; }
  if (tb) { int64_t t = b.dim[b.rank - 1]; b.dim[b.rank - 1] = b.dim[b.rank - 2]; b.dim[b.rank - 2] = t; }
  int64_t m = a.dim[a.rank - 2], k = a.dim[a.rank - 1], k2 = b.dim[b.rank - 2], nn = b.dim[b.rank - 1];
  if (k != k2) {
    char sa[128], sb[128];
    return fail(g, n, "inner dimensions differ: %s @ %s (%lld vs %lld)", shape_str(in_type(g, n, 0), sa, sizeof sa),
                shape_str(in_type(g, n, 1), sb, sizeof sb), (long long)k, (long long)k2);
  }
  TensorType ba = a, bb = b, out;
  ba.rank -= 2, bb.rank -= 2;
  if (!broadcast(&ba, &bb, &out)) {
    char sa[128], sb[128];
    return fail(g, n, "batch dimensions of %s and %s do not broadcast", shape_str(in_type(g, n, 0), sa, sizeof sa),
                shape_str(in_type(g, n, 1), sb, sizeof sb));
  }
  out.dt = a.dt;
  if (!a1) out.dim[out.rank++] = m;
  if (!b1) out.dim[out.rank++] = nn;
  set_out(g, n, 0, out);
  return NULL;
}

static smelt_status ints_attr(const Graph *g, const Node *n, const char *name, int count, int64_t min,
                              const int64_t **out) {
  const Attr *a = ir_attr(n, name);
  if (!a) { *out = NULL; return NULL; }
  if (a->n != count) return fail(g, n, "'%s' needs %d values, got %d", name, count, a->n);
  /* the bound keeps every window computation below far from int64 overflow */
  for (int i = 0; i < count; i++)
    if (a->ints[i] < min || a->ints[i] > ((int64_t)1 << 31))
      return fail(g, n, "'%s' values must be in [%lld, 2^31]", name, (long long)min);
  *out = a->ints;
  return NULL;
}

/* Output extent of a sliding window; < 1 means the window does not fit. */
static int64_t window_out(int64_t in, int64_t pad, int64_t k, int64_t stride, int64_t dil) {
  int64_t span = dil * (k - 1) + 1;
  if (in + pad < span) return 0;
  return (in + pad - span) / stride + 1;
}

static smelt_status infer_conv2d(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0), *w = in_type(g, n, 1);
  RETURN_IF_ERROR(need_float(g, n, 0));
  RETURN_IF_ERROR(same_dtype(g, n, 0, 1));
  if (x->rank != 4 || w->rank != 4) return fail(g, n, "conv2d needs x [N,C,H,W] and w [O,C/groups,KH,KW]");
  const int64_t *st = NULL, *pd = NULL, *dl = NULL;
  RETURN_IF_ERROR(ints_attr(g, n, "strides", 2, 1, &st));
  RETURN_IF_ERROR(ints_attr(g, n, "pads", 4, 0, &pd));
  RETURN_IF_ERROR(ints_attr(g, n, "dilations", 2, 1, &dl));
  assert(st && pd && dl); /* the schema gives all three defaults */
  int64_t grp = ir_attr_int(n, "groups");
  if (grp < 1 || x->dim[1] % grp || w->dim[0] % grp)
    return fail(g, n, "groups %lld must divide input channels %lld and output channels %lld", (long long)grp,
                (long long)x->dim[1], (long long)w->dim[0]);
  if (w->dim[1] * grp != x->dim[1])
    return fail(g, n, "weight has %lld input channels per group, input has %lld channels in %lld groups",
                (long long)w->dim[1], (long long)x->dim[1], (long long)grp);
  if (n->nin == 3) {
    RETURN_IF_ERROR(same_dtype(g, n, 0, 2));
    const TensorType *b = in_type(g, n, 2);
    if (b->rank != 1 || b->dim[0] != w->dim[0])
      return fail(g, n, "bias must have shape [%lld]", (long long)w->dim[0]);
  }
  int64_t oh = window_out(x->dim[2], pd[0] + pd[2], w->dim[2], st[0], dl[0]);
  int64_t ow = window_out(x->dim[3], pd[1] + pd[3], w->dim[3], st[1], dl[1]);
  if (oh < 1 || ow < 1) return fail(g, n, "kernel does not fit the padded input");
  TensorType t = {.dt = x->dt, .rank = 4, .dim = {x->dim[0], w->dim[0], oh, ow}};
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_pool2d(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  RETURN_IF_ERROR(need_float(g, n, 0));
  if (x->rank != 4) return fail(g, n, "input must be [N,C,H,W]");
  const int64_t *k = NULL, *st = NULL, *pd = NULL;
  RETURN_IF_ERROR(ints_attr(g, n, "kernel", 2, 1, &k));
  RETURN_IF_ERROR(ints_attr(g, n, "strides", 2, 1, &st));
  RETURN_IF_ERROR(ints_attr(g, n, "pads", 4, 0, &pd));
  assert(k && pd); /* kernel is required, pads has a default */
  if (!st) st = k;
  if (pd[0] >= k[0] || pd[2] >= k[0] || pd[1] >= k[1] || pd[3] >= k[1])
    return fail(g, n, "padding must be smaller than the kernel");
  int64_t oh = window_out(x->dim[2], pd[0] + pd[2], k[0], st[0], 1);
  int64_t ow = window_out(x->dim[3], pd[1] + pd[3], k[1], st[1], 1);
  if (oh < 1 || ow < 1) return fail(g, n, "kernel does not fit the padded input");
  TensorType t = {.dt = x->dt, .rank = 4, .dim = {x->dim[0], x->dim[1], oh, ow}};
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_global_avg_pool(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  RETURN_IF_ERROR(need_float(g, n, 0));
  if (x->rank < 3) return fail(g, n, "input must be [N,C,spatial...]");
  TensorType t = *x;
  for (int i = 2; i < t.rank; i++) t.dim[i] = 1;
  set_out(g, n, 0, t);
  return NULL;
}

/* ---- data movement ---- */

static smelt_status infer_reshape(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  const Attr *s = ir_attr(n, "shape");
  if (s->n > IR_MAX_RANK) return fail(g, n, "rank %d exceeds the maximum %d", s->n, IR_MAX_RANK);
  TensorType t = {.dt = x->dt, .rank = s->n};
  int infer_at = -1;
  int64_t known = 1;
  for (int i = 0; i < s->n; i++) {
    if (s->ints[i] == -1) {
      if (infer_at >= 0) return fail(g, n, "at most one -1 in shape");
      infer_at = i;
      continue;
    }
    if (s->ints[i] < 0) return fail(g, n, "negative size %lld in shape", (long long)s->ints[i]);
    t.dim[i] = s->ints[i];
    if (t.dim[i] && known > INT64_MAX / t.dim[i]) return fail(g, n, "shape overflows");
    known *= t.dim[i];
  }
  int64_t total = ir_type_numel(x);
  if (infer_at >= 0) {
    if (known == 0 || total % known) return fail(g, n, "cannot infer -1: %lld elements into blocks of %lld", (long long)total, (long long)known);
    t.dim[infer_at] = total / known;
  } else if (known != total) {
    char a[128], b[128];
    return fail(g, n, "cannot reshape %s (%lld elements) to %s (%lld elements)", shape_str(x, a, sizeof a),
                (long long)total, shape_str(&t, b, sizeof b), (long long)known);
  }
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_transpose(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  const Attr *p = ir_attr(n, "perm");
  TensorType t = {.dt = x->dt, .rank = x->rank};
  if (p && p->n != x->rank) return fail(g, n, "perm has %d entries for rank %d", p->n, x->rank);
  bool seen[IR_MAX_RANK] = {0};
  for (int i = 0; i < x->rank; i++) {
    int ax = p ? ir_norm_axis(p->ints[i], x->rank) : x->rank - 1 - i;
    if (ax < 0 || seen[ax]) return fail(g, n, "perm is not a permutation of 0..%d", x->rank - 1);
    seen[ax] = true;
    t.dim[i] = x->dim[ax];
  }
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_concat(Graph *g, Node *n) {
  TensorType t = *in_type(g, n, 0);
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), t.rank);
  if (ax < 0) return fail(g, n, "axis %lld out of range for rank %d", (long long)ir_attr_int(n, "axis"), t.rank);
  for (int i = 1; i < n->nin; i++) {
    const TensorType *o = in_type(g, n, i);
    RETURN_IF_ERROR(same_dtype(g, n, 0, i));
    bool ok = o->rank == t.rank;
    for (int d = 0; ok && d < t.rank; d++) ok = d == ax || o->dim[d] == t.dim[d];
    if (!ok) {
      char a[128], b[128];
      return fail(g, n, "cannot concatenate %s and %s on axis %d", shape_str(in_type(g, n, 0), a, sizeof a),
                  shape_str(o, b, sizeof b), ax);
    }
    t.dim[ax] += o->dim[ax];
  }
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_slice(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), x->rank);
  if (ax < 0) return fail(g, n, "axis %lld out of range for rank %d", (long long)ir_attr_int(n, "axis"), x->rank);
  int64_t step = ir_attr_int(n, "step");
  if (step == 0) return fail(g, n, "step must not be 0");
  int64_t start, end, len;
  ir_slice_bounds(x->dim[ax], ir_attr_int(n, "start"), ir_attr_int(n, "end"), step, &start, &end, &len);
  TensorType t = *x;
  t.dim[ax] = len;
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_split(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), x->rank);
  if (ax < 0) return fail(g, n, "axis %lld out of range for rank %d", (long long)ir_attr_int(n, "axis"), x->rank);
  const Attr *s = ir_attr(n, "sizes");
  if (n->nout > 64) return fail(g, n, "at most 64 outputs, got %d", n->nout);
  if (s) {
    if (s->n != n->nout) return fail(g, n, "%d sizes for %d outputs", s->n, n->nout);
    int64_t sum = 0;
    for (int i = 0; i < s->n; i++) {
      if (s->ints[i] < 0 || s->ints[i] > x->dim[ax]) return fail(g, n, "size %lld in sizes is out of range", (long long)s->ints[i]);
      sum += s->ints[i]; /* at most 64 terms of at most dim: no overflow */
    }
    if (sum != x->dim[ax]) return fail(g, n, "sizes add up to %lld, axis %d has %lld", (long long)sum, ax, (long long)x->dim[ax]);
  } else if (x->dim[ax] % n->nout) {
    return fail(g, n, "axis %d of size %lld does not split into %d equal parts", ax, (long long)x->dim[ax], n->nout);
  }
  for (int i = 0; i < n->nout; i++) {
    TensorType t = *x;
    t.dim[ax] = s ? s->ints[i] : x->dim[ax] / n->nout;
    set_out(g, n, i, t);
  }
  return NULL;
}

static smelt_status infer_gather(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0), *idx = in_type(g, n, 1);
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), x->rank);
  if (ax < 0) return fail(g, n, "axis %lld out of range for rank %d", (long long)ir_attr_int(n, "axis"), x->rank);
  if (!dt_is_int(idx->dt)) return fail(g, n, "indices must be integers, got %s", dt_name(idx->dt));
  if (x->rank - 1 + idx->rank > IR_MAX_RANK) return fail(g, n, "result rank exceeds %d", IR_MAX_RANK);
  TensorType t = {.dt = x->dt};
  for (int i = 0; i < ax; i++) t.dim[t.rank++] = x->dim[i];
  for (int i = 0; i < idx->rank; i++) t.dim[t.rank++] = idx->dim[i];
  for (int i = ax + 1; i < x->rank; i++) t.dim[t.rank++] = x->dim[i];
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_expand(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  const Attr *s = ir_attr(n, "shape");
  if (s->n > IR_MAX_RANK) return fail(g, n, "rank %d exceeds the maximum %d", s->n, IR_MAX_RANK);
  TensorType want = {.dt = x->dt, .rank = s->n}, t;
  for (int i = 0; i < s->n; i++) {
    if (s->ints[i] < 0) return fail(g, n, "negative size in shape");
    want.dim[i] = s->ints[i];
  }
  if (!broadcast(x, &want, &t)) {
    char a[128], b[128];
    return fail(g, n, "cannot expand %s to %s", shape_str(x, a, sizeof a), shape_str(&want, b, sizeof b));
  }
  t.dt = x->dt;
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_squeeze(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  bool mask[IR_MAX_RANK];
  RETURN_IF_ERROR(axes_mask(g, n, "axes", x->rank, mask, false));
  bool any = ir_attr(n, "axes") != NULL;
  TensorType t = {.dt = x->dt};
  for (int i = 0; i < x->rank; i++) {
    if (any && mask[i] && x->dim[i] != 1) return fail(g, n, "cannot squeeze axis %d of size %lld", i, (long long)x->dim[i]);
    if (any ? mask[i] : x->dim[i] == 1) continue;
    t.dim[t.rank++] = x->dim[i];
  }
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_unsqueeze(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  const Attr *a = ir_attr(n, "axes");
  int rank = x->rank + a->n;
  if (rank > IR_MAX_RANK) return fail(g, n, "result rank exceeds %d", IR_MAX_RANK);
  bool mask[IR_MAX_RANK];
  RETURN_IF_ERROR(axes_mask(g, n, "axes", rank, mask, false));
  TensorType t = {.dt = x->dt, .rank = rank};
  for (int i = 0, j = 0; i < rank; i++) t.dim[i] = mask[i] ? 1 : x->dim[j++];
  set_out(g, n, 0, t);
  return NULL;
}

/* ---- transformer ---- */

static smelt_status infer_attention(Graph *g, Node *n) {
  const TensorType *q = in_type(g, n, 0), *k = in_type(g, n, 1), *v = in_type(g, n, 2);
  RETURN_IF_ERROR(need_float(g, n, 0));
  RETURN_IF_ERROR(same_dtype(g, n, 0, 1));
  RETURN_IF_ERROR(same_dtype(g, n, 0, 2));
  if (q->rank != 4 || k->rank != 4 || v->rank != 4) return fail(g, n, "q, k, v must be [B,H,S,D], [B,Hkv,T,D], [B,Hkv,T,D]");
  char a[128], b[128];
  if (k->dim[0] != q->dim[0] || v->dim[0] != q->dim[0] || k->dim[1] != v->dim[1] || k->dim[2] != v->dim[2] ||
      k->dim[3] != q->dim[3])
    return fail(g, n, "k %s and v %s do not match q %s", shape_str(k, a, sizeof a), shape_str(v, b, sizeof b),
                shape_str(q, (char[128]){0}, 128));
  if (k->dim[1] == 0 || q->dim[1] % k->dim[1])
    return fail(g, n, "%lld kv heads do not divide %lld query heads", (long long)k->dim[1], (long long)q->dim[1]);
  if (ir_attr_int(n, "cache")) {
    /* k and v are caches of capacity T; the 4th input places the queries */
    if (n->nin != 4) return fail(g, n, "attention with cache: true needs a 4th input, the queries' positions [%lld]",
                                 (long long)q->dim[2]);
    const TensorType *p = in_type(g, n, 3);
    if (!dt_is_int(p->dt)) return fail(g, n, "positions must be integers, got %s", dt_name(p->dt));
    if (p->rank != 1 || p->dim[0] != q->dim[2])
      return fail(g, n, "positions must have shape [%lld], got %s", (long long)q->dim[2], shape_str(p, a, sizeof a));
    TensorType t = *q;
    t.dim[3] = v->dim[3];
    set_out(g, n, 0, t);
    return NULL;
  }
  if (ir_attr_int(n, "causal") && q->dim[2] > k->dim[2])
    return fail(g, n, "causal attention needs query length %lld <= key length %lld", (long long)q->dim[2], (long long)k->dim[2]);
  if (n->nin == 4) {
    TensorType full = {.dt = q->dt, .rank = 4, .dim = {q->dim[0], q->dim[1], q->dim[2], k->dim[2]}}, r;
    const TensorType *m = in_type(g, n, 3);
    if (m->dt != q->dt && m->dt != DT_BOOL) return fail(g, n, "mask must be %s or bool, got %s", dt_name(q->dt), dt_name(m->dt));
    if (!broadcast(m, &full, &r) || !ir_type_equal(&(TensorType){.dt = q->dt, .rank = r.rank, .dim = {r.dim[0], r.dim[1], r.dim[2], r.dim[3]}}, &full))
      return fail(g, n, "mask %s does not broadcast to %s", shape_str(m, a, sizeof a), shape_str(&full, b, sizeof b));
  }
  TensorType t = *q;
  t.dim[3] = v->dim[3];
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_scatter(Graph *g, Node *n) {
  const TensorType *d = in_type(g, n, 0), *idx = in_type(g, n, 1), *src = in_type(g, n, 2);
  char a[128], b[128];
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), d->rank);
  if (ax < 0) return fail(g, n, "axis %lld out of range for rank %d", (long long)ir_attr_int(n, "axis"), d->rank);
  if (src->dt != d->dt) return fail(g, n, "values are %s but the destination is %s", dt_name(src->dt), dt_name(d->dt));
  bool same = src->rank == d->rank;
  for (int i = 0; same && i < d->rank; i++) same = i == ax || src->dim[i] == d->dim[i];
  if (!same)
    return fail(g, n, "values %s do not match destination %s outside axis %d", shape_str(src, a, sizeof a),
                shape_str(d, b, sizeof b), ax);
  if (!dt_is_int(idx->dt)) return fail(g, n, "indices must be integers, got %s", dt_name(idx->dt));
  if (idx->rank != 1 || idx->dim[0] != src->dim[ax])
    return fail(g, n, "indices must have shape [%lld] (the values' axis %d), got %s", (long long)src->dim[ax], ax,
                shape_str(idx, a, sizeof a));
  set_out(g, n, 0, *d);
  return NULL;
}

static smelt_status infer_argmax(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), x->rank);
  if (ax < 0) return fail(g, n, "axis %lld out of range for rank %d", (long long)ir_attr_int(n, "axis"), x->rank);
  if (x->dim[ax] == 0) return fail(g, n, "argmax over an empty axis");
  if (x->dim[ax] > INT32_MAX) return fail(g, n, "axis %d is longer than an i32 index reaches", ax);
  TensorType t = {.dt = DT_I32};
  for (int i = 0; i < x->rank; i++) {
    if (i != ax) t.dim[t.rank++] = x->dim[i];
    else if (ir_attr_int(n, "keepdims")) t.dim[t.rank++] = 1;
  }
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_topk(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0);
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), x->rank);
  if (ax < 0) return fail(g, n, "axis %lld out of range for rank %d", (long long)ir_attr_int(n, "axis"), x->rank);
  int64_t k = ir_attr_int(n, "k");
  if (k <= 0) return fail(g, n, "k must be positive, got %lld", (long long)k);
  if (k > x->dim[ax])
    return fail(g, n, "k = %lld exceeds the size %lld of axis %d", (long long)k, (long long)x->dim[ax], ax);
  if (x->dim[ax] > INT32_MAX) return fail(g, n, "axis %d is longer than an i32 index reaches", ax);
  TensorType t = *x;
  t.dim[ax] = k;
  set_out(g, n, 0, t);
  t.dt = DT_I32;
  set_out(g, n, 1, t);
  return NULL;
}

static smelt_status infer_arange(Graph *g, Node *n) {
  const TensorType *s = in_type(g, n, 0);
  if (!dt_is_int(s->dt)) return fail(g, n, "start must be an integer tensor, got %s", dt_name(s->dt));
  if (ir_type_numel(s) != 1) return fail(g, n, "start must hold one element, got %lld", (long long)ir_type_numel(s));
  int64_t size = ir_attr_int(n, "size");
  if (size <= 0) return fail(g, n, "size must be positive, got %lld", (long long)size);
  set_out(g, n, 0, (TensorType){.dt = s->dt, .rank = 1, .dim = {size}});
  return NULL;
}

/* ---- collectives (tensor parallelism) ---- */

static smelt_status need_ranks(const Graph *g, const Node *n) {
  int64_t r = ir_attr_int(n, "ranks");
  if (r < 1 || r > 64) return fail(g, n, "ranks must be in [1, 64], got %lld", (long long)r);
  return NULL;
}

static smelt_status infer_all_reduce(Graph *g, Node *n) {
  RETURN_IF_ERROR(need_ranks(g, n));
  RETURN_IF_ERROR(need_float(g, n, 0));
  set_out(g, n, 0, *in_type(g, n, 0));
  return NULL;
}

static smelt_status infer_all_gather(Graph *g, Node *n) {
  RETURN_IF_ERROR(need_ranks(g, n));
  TensorType t = *in_type(g, n, 0);
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), t.rank);
  if (ax < 0) return fail(g, n, "axis %lld out of range for rank %d", (long long)ir_attr_int(n, "axis"), t.rank);
  t.dim[ax] *= ir_attr_int(n, "ranks");
  set_out(g, n, 0, t);
  return NULL;
}

static smelt_status infer_rope(Graph *g, Node *n) {
  const TensorType *x = in_type(g, n, 0), *pos = in_type(g, n, 1);
  RETURN_IF_ERROR(need_float(g, n, 0));
  if (x->rank < 2) return fail(g, n, "x must be [..., S, D]");
  int64_t s = x->dim[x->rank - 2], d = x->dim[x->rank - 1];
  if (!dt_is_int(pos->dt)) return fail(g, n, "positions must be integers, got %s", dt_name(pos->dt));
  if (pos->rank != 1 || pos->dim[0] != s) return fail(g, n, "positions must have shape [%lld]", (long long)s);
  const Attr *rd = ir_attr(n, "rotary_dim");
  int64_t r = rd ? rd->i : d;
  if (r <= 0 || r > d || r % 2) return fail(g, n, "rotary_dim %lld must be even and in [2, %lld]", (long long)r, (long long)d);
  set_out(g, n, 0, *x);
  return NULL;
}

/* ---- quantised weights ---- */

/* The shape scales (and zeros) must have for qweight q with `group` along
 * `axis`: q's, with K/group (group 0: 1) along the axis. */
static TensorType dequant_scale_shape(const TensorType *q, int axis, int64_t group) {
  TensorType t = *q;
  t.dim[axis] = group ? q->dim[axis] / group : 1;
  return t;
}

static smelt_status infer_dequantize(Graph *g, Node *n) {
  if (n->nin < 2)
    return fail(g, n, "dequantize(qweight, scales, zeros?) needs the scales of '%s' as its second input",
                g->val[n->in[0]].name);
  const TensorType *q = in_type(g, n, 0), *s = in_type(g, n, 1);
  DType qd = q->dt;
  if (!(qd == DT_I8 || qd == DT_U8 || dt_is_storage_only(qd)))
    return fail(g, n, "qweight '%s' has dtype %s; dequantize reads i8, u8, i4, u4, f8e4m3 or f8e5m2",
                g->val[n->in[0]].name, dt_name(qd));
  if (q->rank < 1) return fail(g, n, "qweight '%s' must have rank >= 1", g->val[n->in[0]].name);
  if (!dt_is_float(s->dt))
    return fail(g, n, "scales '%s' must be floating point, got %s", g->val[n->in[1]].name, dt_name(s->dt));
  int axis = ir_norm_axis(ir_attr_int(n, "axis"), q->rank);
  if (axis < 0)
    return fail(g, n, "axis %lld is out of range for qweight of rank %d", (long long)ir_attr_int(n, "axis"), q->rank);
  int64_t group = ir_attr_int(n, "group"), K = q->dim[axis];
  if (group < 0) return fail(g, n, "group %lld must be 0 (one scale per slice) or positive", (long long)group);
  if (group > 0 && K % group != 0)
    return fail(g, n, "group %lld does not divide the %lld elements of qweight '%s' along axis %d", (long long)group,
                (long long)K, g->val[n->in[0]].name, axis);
  TensorType want = dequant_scale_shape(q, axis, group);
  char a[128], b[128], c[128];
  for (int i = 1; i < n->nin; i++) {
    const TensorType *t = in_type(g, n, i);
    bool ok = t->rank == want.rank;
    for (int d = 0; ok && d < t->rank; d++) ok = t->dim[d] == want.dim[d];
    if (!ok)
      return fail(g, n, "%s '%s' has shape %s; qweight %s with group %lld along axis %d needs %s",
                  i == 1 ? "scales" : "zeros", g->val[n->in[i]].name, shape_str(t, a, sizeof a),
                  shape_str(q, b, sizeof b), (long long)group, axis, shape_str(&want, c, sizeof c));
  }
  if (n->nin > 2) {
    DType zd = in_type(g, n, 2)->dt;
    if (zd != s->dt && zd != qd)
      return fail(g, n, "zeros '%s' has dtype %s; it takes the scales' (%s) or the qweight's (%s)",
                  g->val[n->in[2]].name, dt_name(zd), dt_name(s->dt), dt_name(qd));
  }
  TensorType out = *q;
  const Attr *to = ir_attr(n, "to");
  out.dt = to ? to->dt : s->dt;
  if (!dt_is_float(out.dt)) return fail(g, n, "to: %s is not a floating-point dtype", dt_name(out.dt));
  set_out(g, n, 0, out);
  return NULL;
}

/* Quantised storage types are read only by dequantize (its qweight and
 * zeros) and cast, and made by no node: the backends have loads for them
 * and no arithmetic or stores. */
static smelt_status check_storage_only(const Graph *g, const Node *n) {
  for (int i = 0; i < n->nin; i++) {
    DType dt = in_type(g, n, i)->dt;
    if (!dt_is_storage_only(dt)) continue;
    if (n->op == OP_CAST || (n->op == OP_DEQUANTIZE && i != 1)) continue;
    return fail(g, n, "input '%s' has the quantised storage type %s, which only dequantize and cast read",
                g->val[n->in[i]].name, dt_name(dt));
  }
  for (int i = 0; i < n->nout; i++) {
    DType dt = g->val[n->out[i]].type.dt;
    if (dt_is_storage_only(dt))
      return fail(g, n, "result '%s' would have the quantised storage type %s, which no operator computes "
                  "(quantised weights are constants)", g->val[n->out[i]].name, dt_name(dt));
  }
  return NULL;
}

/* Checks operand counts, runs the rule, then guards against sizes whose byte
 * counts overflow: later stages multiply them freely. */
smelt_status ir_infer_node(Graph *g, int node) {
  /* a node built out of memory may lack operands and attributes */
  if (g->oom) return ir_graph_status(g);
  Node *n = &g->node[node];
  const OpInfo *oi = ir_op_info(n->op);
  if (n->nin < oi->min_in || n->nin > oi->max_in) {
    if (oi->min_in == oi->max_in) return fail(g, n, "takes %d inputs, got %d", oi->min_in, n->nin);
    return fail(g, n, "takes %d to %d inputs, got %d", oi->min_in, oi->max_in, n->nin);
  }
  if (oi->nout >= 0 && n->nout != oi->nout) return fail(g, n, "has %d output(s), got %d names", oi->nout, n->nout);
  for (int i = 0; i < n->nin; i++) {
    const Value *v = &g->val[n->in[i]];
    if (v->type.dt == DT_INVALID) return fail(g, n, "input '%s' has no type", v->name);
  }
  RETURN_IF_ERROR(infer_table[n->op](g, n));
  RETURN_IF_ERROR(check_storage_only(g, n));
  for (int i = 0; i < n->nout; i++) {
    const TensorType *t = &g->val[n->out[i]].type;
    int64_t bytes = (int64_t)dt_size(t->dt);
    for (int d = 0; d < t->rank; d++) {
      if (t->dim[d] < 0) return fail(g, n, "negative dimension");
      if (t->dim[d] && bytes > ((int64_t)1 << 50) / t->dim[d]) return fail(g, n, "result size overflows");
      bytes *= t->dim[d];
    }
  }
  return NULL;
}

void ir_slice_bounds(int64_t size, int64_t start, int64_t end, int64_t step, int64_t *out_start,
                     int64_t *out_end, int64_t *out_len) {
  /* Python's slice.indices(): negative indices count from the end, then
   * clamp to [0, size] for a positive step and [-1, size-1] for a negative one. */
  /* a step longer than the axis selects at most one element: clamping it
   * keeps the arithmetic below from overflowing */
  if (step > size + 1) step = size + 1;
  if (step < -(size + 1)) step = -(size + 1);
  int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? size : size - 1;
  bool end_open = end == INT64_MAX; /* the schema's default: "to the end" in the step's direction */
  if (start < 0) start = start < -size ? lo : start + size;
  else start = start > hi ? hi : start;
  if (end_open) end = step > 0 ? hi : lo;
  else if (end < 0) end = end < -size ? lo : end + size;
  else end = end > hi ? hi : end;
  int64_t len = 0;
  if (step > 0 && end > start) len = (end - start + step - 1) / step;
  if (step < 0 && start > end) len = (start - end + (-step) - 1) / (-step);
  *out_start = start;
  *out_end = end;
  *out_len = len;
}
