/* Emission at coordinates: the value of any tensor of a group at a
 * coordinate vector, as CUDA C statements (see cu_emit.h for the idea
 * and for lanes).
 *
 * Each operator maps the coordinates of its result to the coordinates of
 * its operands:
 *   elementwise, broadcast   the same, right-aligned, size-1 dims at 0
 *   transpose                permuted
 *   reshape/squeeze/unsqueeze  the same linear index split over the input's
 *                            shape (only size-1 dims differing: matched
 *                            directly, no division)
 *   slice, split             an offset (and a step) on one axis
 *   concat                   a branch per operand on the axis coordinate
 *   gather                   the index value becomes the data coordinate
 *   rope                     the coordinate and its rotation partner
 * and applies its scalar rule (scalar.c).  A transform that would break the
 * lanes' affine form (coordinate c + j on the innermost dim) falls back to
 * emitting every lane on its own with scalar coordinates: always correct,
 * only slower.
 *
 * Loads: a lane-uniform load is one scalar load shared by all lanes; lanes
 * that are consecutive on the operand's innermost dim and start aligned are
 * one vector load of smelt_pack<T, lanes> (16 bytes for the group's
 * narrowest stored type), recorded in f->vec_bytes so that the loop can
 * test the pointer's alignment at run time; anything else is one scalar
 * load per lane.
 */
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "codegen/cuda/cu_emit.h"

bool cu_is_output(const CuFn *f, int v) { return f->arg_of[v] >= f->nin; }

static const char *coords_key(CuFn *f, const CuCoords *co) {
  CuBuf b = {0};
  cu_buf_printf(&b, "%d|", co->lanes);
  for (int d = 0; d < co->rank; d++) cu_buf_printf(&b, "%s:%lld,", co->c[d], (long long)co->step[d]);
  const char *k = cu_buf_str(f, &b);
  cu_buf_free(&b);
  return k;
}

static bool uniform(const CuVal *v, int lanes) {
  for (int j = 1; j < lanes; j++)
    if (strcmp(v->l[j], v->l[0]) != 0) return false;
  return true;
}

static void replicate(CuVal *v, int lanes) {
  for (int j = 1; j < lanes; j++) v->l[j] = v->l[0];
}

/* Declares a temporary of dt's compute type holding expr, with the YAML name
 * as a comment; a bare identifier or literal needs no temporary. */
static const char *decl(CuFn *f, DType dt, const char *expr, const char *comment) {
  bool simple = true;
  for (const char *p = expr; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '.'))
      simple = false;
  if (simple) return expr;
  const char *t = cu_tmp(f);
  if (comment) cu_line(f, "const %s %s = %s;  // %s", cu_ctype(dt), t, expr, comment);
  else cu_line(f, "const %s %s = %s;", cu_ctype(dt), t, expr);
  return t;
}

/* Lane 0's linear index of coordinates co in shape t, and how much it
 * grows per lane. */
static const char *linear(CuFn *f, const TensorType *t, const CuCoords *co, int64_t *out_lstep) {
  int64_t stride[IR_MAX_RANK], s = 1, lstep = 0;
  for (int d = t->rank - 1; d >= 0; d--) {
    stride[d] = s;
    s *= t->dim[d];
  }
  const char *e = "0";
  for (int d = 0; d < t->rank; d++) {
    if (t->dim[d] == 1) continue;
    e = cu_add(f, e, cu_mulk(f, co->c[d], stride[d]));
    lstep += co->step[d] * stride[d];
  }
  if (out_lstep) *out_lstep = lstep;
  return e;
}

/* The lanes of co are consecutive elements of the innermost dim of t,
 * starting at a multiple of the lane count: one vector access. */
static bool vector_ok(const TensorType *t, const CuCoords *co) {
  if (co->lanes == 1 || t->rank == 0 || !co->aligned) return false;
  int last = t->rank - 1;
  if (co->step[last] != 1 || t->dim[last] % co->lanes != 0) return false;
  for (int d = 0; d < last; d++)
    if (co->step[d] != 0 && t->dim[d] != 1) return false;
  return true;
}

static void note_vector(CuFn *f, int arg, DType dt, int lanes) {
  int bytes = (int)dt_size(dt) * lanes;
  if (f->vec_bytes[arg] < bytes) f->vec_bytes[arg] = bytes;
  f->vectorised = true;
}

static void load(CuFn *f, int v, const CuCoords *co, CuVal *out) {
  const Value *val = &f->g->val[v];
  const TensorType *t = &val->type;
  int a = f->arg_of[v];
  if (a < 0) {
    cu_fail(f, ST_INTERNAL, "value '%s' is read but is neither computed in the kernel nor an argument", val->name);
    out->l[0] = "0";
    replicate(out, co->lanes);
    return;
  }
  int64_t lstep;
  const char *lin = linear(f, t, co, &lstep);
  if (dt_is_packed(t->dt)) {
    /* i4/u4: a nibble per lane (smelt_i4/smelt_u4 of the prelude) */
    const char *rd = t->dt == DT_I4 ? "smelt_i4" : "smelt_u4";
    int nl = lstep == 0 ? 1 : co->lanes;
    for (int j = 0; j < nl; j++)
      out->l[j] = decl(f, t->dt, cu_fmt(f, "(long long)%s(a%d, %s)", rd, a, cu_addk(f, lin, lstep * j)),
                       j == 0 ? val->name : NULL);
    if (nl == 1) replicate(out, co->lanes);
    return;
  }
  if (co->lanes == 1 || lstep == 0) {
    out->l[0] = decl(f, t->dt, cu_from_storage(f, t->dt, cu_fmt(f, "a%d[%s]", a, lin)), val->name);
    replicate(out, co->lanes);
    return;
  }
  if (vector_ok(t, co)) {
    const char *pk = cu_tmp(f);
    cu_line(f, "const smelt_pack<%s, %d> %s = *reinterpret_cast<const smelt_pack<%s, %d> *>(a%d + %s);  // %s",
            cu_stype(t->dt), co->lanes, pk, cu_stype(t->dt), co->lanes, a, lin, val->name);
    note_vector(f, a, t->dt, co->lanes);
    for (int j = 0; j < co->lanes; j++) out->l[j] = decl(f, t->dt, cu_from_storage(f, t->dt, cu_fmt(f, "%s.v[%d]", pk, j)), NULL);
    return;
  }
  const char *base = lin;
  if (!cu_is_lit(lin, NULL) && strchr(lin, ' ')) {
    base = cu_tmp(f);
    cu_line(f, "const %s %s = %s;", f->idx, base, lin);
  }
  for (int j = 0; j < co->lanes; j++)
    out->l[j] = decl(f, t->dt, cu_from_storage(f, t->dt, cu_fmt(f, "a%d[%s]", a, cu_addk(f, base, lstep * j))),
                     j == 0 ? val->name : NULL);
}

void cu_store(CuFn *f, int v, const CuCoords *co, const CuVal *val) {
  const Value *vv = &f->g->val[v];
  const TensorType *t = &vv->type;
  int a = f->arg_of[v];
  int64_t lstep;
  const char *lin = linear(f, t, co, &lstep);
  if (co->lanes == 1) {
    cu_line(f, "a%d[%s] = %s;  // %s", a, lin, cu_to_storage(f, t->dt, val->l[0]), vv->name);
    return;
  }
  if (vector_ok(t, co)) {
    const char *pk = cu_tmp(f);
    cu_line(f, "smelt_pack<%s, %d> %s;", cu_stype(t->dt), co->lanes, pk);
    for (int j = 0; j < co->lanes; j++) cu_line(f, "%s.v[%d] = %s;", pk, j, cu_to_storage(f, t->dt, val->l[j]));
    cu_line(f, "*reinterpret_cast<smelt_pack<%s, %d> *>(a%d + %s) = %s;  // %s", cu_stype(t->dt), co->lanes, a, lin,
            pk, vv->name);
    note_vector(f, a, t->dt, co->lanes);
    return;
  }
  for (int j = 0; j < co->lanes; j++)
    cu_line(f, "a%d[%s] = %s;", a, cu_addk(f, lin, lstep * j), cu_to_storage(f, t->dt, val->l[j]));
}

/* Coordinates on dims of size 1 are 0 whatever expression reached them:
 * keys use 0 there, so that a value reached through a broadcast is the
 * same value (for the memo and for the anchor override).  Coordinates that
 * do not depend on the lane name one value for every lane count: the key
 * says "u" instead of the count, and a hit is replicated over the lanes. */
static const char *value_key(CuFn *f, int v, const CuCoords *co, bool *out_uniform) {
  const TensorType *t = &f->g->val[v].type;
  CuCoords c = *co;
  bool uni = true;
  for (int d = 0; d < c.rank && d < t->rank; d++) {
    if (t->dim[d] == 1) c.c[d] = "0", c.step[d] = 0;
    if (c.step[d] != 0) uni = false;
  }
  if (out_uniform) *out_uniform = uni;
  if (uni) c.lanes = 0;
  return coords_key(f, &c);
}

/* Copies a memoised or overriding result into out for co's lanes. */
static void take(const CuVal *from, bool uni, int lanes, CuVal *out) {
  *out = *from;
  if (uni) replicate(out, lanes);
}

void cu_set_override(CuFn *f, int v, const CuCoords *co, const CuVal *val) {
  f->ov_value = v;
  f->ov_key = value_key(f, v, co, NULL);
  f->ov_val = *val;
}

void cu_clear_override(CuFn *f) {
  f->ov_value = -1;
  f->ov_key = NULL;
}

/* ---- coordinate transforms ---- */

/* Input coordinates of a reshape-like op (the row-major data does not
 * move).  False when the lanes would not stay affine: the caller emits lane
 * by lane. */
static bool reshape_coords(CuFn *f, const TensorType *ot, const TensorType *it, const CuCoords *co, CuCoords *ci) {
  /* Only size-1 dims differ (squeeze, unsqueeze, most reshapes that add a
   * batch dim): the other dims correspond in order. */
  int od[IR_MAX_RANK], id[IR_MAX_RANK], no = 0, ni = 0;
  for (int d = 0; d < ot->rank; d++)
    if (ot->dim[d] != 1) od[no++] = d;
  for (int d = 0; d < it->rank; d++)
    if (it->dim[d] != 1) id[ni++] = d;
  bool same = no == ni;
  for (int k = 0; same && k < no; k++) same = ot->dim[od[k]] == it->dim[id[k]];
  memset(ci, 0, sizeof *ci);
  ci->rank = it->rank;
  ci->lanes = co->lanes;
  ci->aligned = co->aligned;
  if (same) {
    for (int d = 0; d < it->rank; d++) ci->c[d] = "0";
    for (int k = 0; k < no; k++) {
      ci->c[id[k]] = co->c[od[k]];
      ci->step[id[k]] = co->step[od[k]];
    }
    return true;
  }
  int laned = -1, nlaned = 0;
  for (int d = 0; d < ot->rank; d++)
    if (co->step[d] != 0 && ot->dim[d] != 1) laned = d, nlaned++;
  if (nlaned == 0) {
    const char *lin = linear(f, ot, co, NULL);
    if (!cu_is_lit(lin, NULL) && strchr(lin, ' ')) {
      const char *t = cu_tmp(f);
      cu_line(f, "const %s %s = %s;", f->idx, t, lin);
      lin = t;
    }
    cu_delinearize(f, lin, it, ci);
    ci->lanes = co->lanes;
    return true;
  }
  int L = co->lanes;
  if (nlaned > 1 || laned != ot->rank - 1 || co->step[laned] != 1 || !co->aligned || it->rank == 0 ||
      ot->dim[laned] % L != 0 || it->dim[it->rank - 1] % L != 0)
    return false;
  const char *lin = linear(f, ot, co, NULL);
  const char *t = cu_tmp(f);
  cu_line(f, "const %s %s = %s;", f->idx, t, lin);
  cu_delinearize(f, t, it, ci);
  ci->lanes = L;
  ci->step[it->rank - 1] = 1;
  ci->aligned = true;
  return true;
}

/* The one-lane coordinates of lane j of co. */
static void lane_coords(CuFn *f, const CuCoords *co, int j, CuCoords *one) {
  memset(one, 0, sizeof *one);
  one->rank = co->rank;
  one->lanes = 1;
  one->aligned = true;
  for (int d = 0; d < co->rank; d++) one->c[d] = cu_lane_coord(f, co, j, d);
}

/* The elementwise rule of node n at lane j of its operands. */
static const char *elem_expr(CuFn *f, const Node *n, DType out_dt, const CuVal *ops, int j) {
  const Graph *g = f->g;
  DType idt = g->val[n->in[0]].type.dt;
  switch (n->op) {
  case OP_CAST: return cu_convert(f, ops[0].l[j], idt, out_dt);
  case OP_WHERE: return cu_fmt(f, "(%s ? %s : %s)", ops[0].l[j], ops[1].l[j], ops[2].l[j]);
  case OP_LESS: case OP_GREATER: case OP_EQUAL: return cu_binary(f, n->op, idt, ops[0].l[j], ops[1].l[j]);
  case OP_BATCH_NORM: {
    /* (x - mean) * scale / sqrt(var + eps) + bias, as the reference */
    const char *eps = cu_const(f, idt, ir_attr_float(n, "eps"));
    const char *sq = idt == DT_F64 ? "sqrt" : "sqrtf";
    return cu_fmt(f, "((%s - %s) * (%s / %s(%s + %s)) + %s)", ops[0].l[j], ops[3].l[j], ops[1].l[j], sq, ops[4].l[j],
                  eps, ops[2].l[j]);
  }
  default:
    if (n->nin == 1) return cu_normalise(f, out_dt, cu_unary(f, n, idt, ops[0].l[j]));
    return cu_normalise(f, out_dt, cu_binary(f, n->op, idt, ops[0].l[j], ops[1].l[j]));
  }
}

/* The rotation angle of pair index `pair` (an expression) at position
 * `pos` into sn/cs (new temporaries).  f16/bf16 results: the angle in float
 * is exact enough (at position 32k its error is ~2e-3 rad of rounding,
 * under f16's step) and several times cheaper than double pow/sincos,
 * which matters where rope is computed in an attention kernel's loads; f32
 * and f64: in double, because positions reach thousands, where float would
 * lose the low bits of the product. */
static void rope_angle(CuFn *f, const Node *n, bool low, const char *pos, const char *pair, int64_t rd,
                       const char **out_sn, const char **out_cs) {
  const char *th = cu_tmp(f), *sn = cu_tmp(f), *cs = cu_tmp(f);
  if (low) {
    /* reduced to [-pi, pi] (2 pi as float + its error, two FMAs: the
     * remainder is exact to ~1e-7 rad up to angle 1e5), then the fast
     * sincos, which is accurate there (~1e-6): sincosf's slow path for
     * large angles would cost a stack frame in every kernel using it */
    const char *k = cu_tmp(f), *rr = cu_tmp(f);
    cu_line(f, "const float %s = (float)%s * exp2f(%.9gf * (float)(%s));", th, pos,
            -2.0 * log2(ir_attr_float(n, "base")) / (double)rd, pair);
    cu_line(f, "const float %s = rintf(%s * 0.159154943f);", k, th);
    cu_line(f, "const float %s = fmaf(%s, 1.74845553e-7f, fmaf(%s, -6.28318548f, %s));", rr, k, k, th);
    cu_line(f, "float %s, %s;", sn, cs);
    cu_line(f, "__sincosf(%s, &%s, &%s);", rr, sn, cs);
  } else {
    cu_line(f, "const double %s = (double)%s * pow(%.17g, -2.0 * (double)(%s) / %lld.0);", th, pos,
            ir_attr_float(n, "base"), pair, (long long)rd);
    cu_line(f, "double %s, %s;", sn, cs);
    cu_line(f, "sincos(%s, &%s, &%s);", th, sn, cs);
  }
  *out_sn = sn;
  *out_cs = cs;
}

/* The feature that half-style rope pairs with feature d (a temporary):
 * d + rd/2 in the first half, d - rd/2 in the second, d itself past rd. */
static const char *half_partner(CuFn *f, const char *d, int64_t rd) {
  int64_t h = rd / 2;
  const char *part = cu_tmp(f);
  cu_line(f, "const %s %s = %s < %lld ? %s + %lld : %s < %lld ? %s - %lld : %s;  // the partner feature", f->idx, part, d,
          (long long)h, d, (long long)h, d, (long long)rd, d, (long long)h, d);
  return part;
}

/* ---- emission without recursion ----
 *
 * A member's value at coordinates needs its operands' values first, and
 * they need theirs: a chain of N members is N levels.  The levels are
 * frames on an explicit stack (heap memory, grown as needed), never C stack
 * frames, so that a group's depth is bounded by memory, not by the thread's
 * stack.  A frame is one value being computed at one coordinate vector;
 * node_step advances it: each call either asks for one value at
 * coordinates (an operand, or the same value at one lane's coordinates when
 * the lanes do not stay affine) and resumes at its next stage with it, or
 * finishes with the result.  The stages write exactly the lines, in the
 * order, and with the temporaries that one recursive function per op
 * would. */

typedef struct {
  int v;           /* the value computed */
  CuCoords co;     /* at these coordinates */
  int stage;       /* where the op's rule resumes */
  int k;           /* a loop counter: operand, lane */
  bool lanewise;   /* computing lane by lane (stage counts lanes) */
  bool uni;        /* elementwise: every operand so far is lane-uniform */
  int emitted;     /* concat: operands emitted */
  int64_t off;     /* concat: offset of operand k */
  CuCoords ci;     /* coordinates of the value asked for */
  CuVal ops[5];    /* values received */
  CuVal out;       /* the result being assembled */
  const char *s[4]; /* temporaries kept between stages */
} CuFrame;

typedef struct {
  int v;
  const CuCoords *co;
} CuNeed;

#define NEED(value, coords)                                                                                            \
  do {                                                                                                                 \
    need->v = (value);                                                                                                 \
    need->co = (coords);                                                                                               \
    return false;                                                                                                      \
  } while (0)

/* Lane by lane: lane k of fr->v at its one-lane coordinates. */
static bool lanewise_step(CuFn *f, CuFrame *fr, const CuVal *got, CuNeed *need) {
  if (!fr->lanewise) {
    fr->lanewise = true;
    fr->k = 0;
  } else {
    fr->out.l[fr->k++] = got->l[0];
  }
  if (fr->k == fr->co.lanes) return true;
  lane_coords(f, &fr->co, fr->k, &fr->ci);
  NEED(fr->v, &fr->ci);
}

static bool elementwise_step(CuFn *f, const Node *n, CuFrame *fr, int stage, const CuVal *got, CuNeed *need) {
  const Graph *g = f->g;
  const CuCoords *co = &fr->co;
  if (stage == 0) fr->uni = true;
  else {
    fr->ops[stage - 1] = *got;
    fr->uni = fr->uni && uniform(got, co->lanes);
  }
  int i = stage;
  if (i < n->nin && i < 5) {
    CuCoords *ci = &fr->ci;
    const TensorType *it = &g->val[n->in[i]].type;
    if (n->op == OP_BATCH_NORM && i > 0) {
      /* per-channel parameters: channel = result dim 1 */
      memset(ci, 0, sizeof *ci);
      ci->rank = 1;
      ci->lanes = co->lanes;
      ci->aligned = co->aligned;
      ci->c[0] = co->c[1];
      ci->step[0] = co->step[1];
    } else {
      cu_bcast_coords(it, co, ci);
    }
    NEED(n->in[i], ci);
  }
  int v = fr->v;
  DType dt = g->val[v].type.dt;
  int nl = fr->uni ? 1 : co->lanes;
  for (int j = 0; j < nl; j++)
    fr->out.l[j] = decl(f, dt, elem_expr(f, n, dt, fr->ops, j),
                        j == 0 ? cu_fmt(f, "%s (%s)", g->val[v].name, ir_op_name(n->op)) : NULL);
  if (fr->uni) replicate(&fr->out, co->lanes);
  return true;
}

/* concat: a branch per operand on the axis coordinate */
static bool concat_step(CuFn *f, const Node *n, CuFrame *fr, int stage, const CuVal *got, CuNeed *need) {
  const Graph *g = f->g;
  const CuCoords *co = &fr->co;
  const TensorType *ot = &g->val[fr->v].type;
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), ot->rank);
  int L = co->lanes;
  const char *r;
  if (stage == 0) {
    bool ok = co->step[ax] == 0 || co->aligned;
    for (int i = 0; ok && i < n->nin; i++)
      if (co->step[ax] != 0 && g->val[n->in[i]].type.dim[ax] % L != 0) ok = false;
    if (!ok) return lanewise_step(f, fr, got, need);
    r = fr->s[0] = cu_tmp(f);
    if (L == 1) cu_line(f, "%s %s;  // %s (concat)", cu_ctype(ot->dt), r, g->val[fr->v].name);
    else cu_line(f, "%s %s[%d];  // %s (concat)", cu_ctype(ot->dt), r, L, g->val[fr->v].name);
    fr->off = 0;
    fr->emitted = 0;
    fr->k = 0;
  } else {
    r = fr->s[0];
    for (int j = 0; j < L; j++) {
      if (L == 1) cu_line(f, "%s = %s;", r, got->l[j]);
      else cu_line(f, "%s[%d] = %s;", r, j, got->l[j]);
    }
    cu_close(f);
    fr->emitted++;
    fr->off += g->val[n->in[fr->k]].type.dim[ax];
    fr->k++;
  }
  for (; fr->k < n->nin; fr->k++) {
    int i = fr->k;
    const TensorType *it = &g->val[n->in[i]].type;
    if (it->dim[ax] == 0) continue;
    bool last = true;
    for (int k = i + 1; k < n->nin; k++)
      if (g->val[n->in[k]].type.dim[ax] != 0) last = false;
    if (last && fr->emitted == 0) cu_open(f, "%s", "");
    else if (last) cu_open(f, "else");
    else cu_open(f, "%sif (%s < %lld)", fr->emitted ? "else " : "", co->c[ax], (long long)(fr->off + it->dim[ax]));
    fr->ci = *co;
    fr->ci.c[ax] = cu_addk(f, co->c[ax], -fr->off);
    NEED(n->in[i], &fr->ci);
  }
  for (int j = 0; j < L; j++) fr->out.l[j] = L == 1 ? r : cu_fmt(f, "%s[%d]", r, j);
  return true;
}

/* gather: the index value becomes the data coordinate */
static bool gather_step(CuFn *f, const Node *n, CuFrame *fr, int stage, const CuVal *got, CuNeed *need) {
  const Graph *g = f->g;
  const CuCoords *co = &fr->co;
  const TensorType *dt = &g->val[n->in[0]].type, *it = &g->val[n->in[1]].type;
  int ax = ir_norm_axis(ir_attr_int(n, "axis"), dt->rank);
  if (stage == 0) {
    CuCoords *ci = &fr->ci;
    memset(ci, 0, sizeof *ci);
    ci->rank = it->rank;
    ci->lanes = co->lanes;
    ci->aligned = co->aligned;
    for (int d = 0; d < it->rank; d++) {
      ci->c[d] = co->c[ax + d];
      ci->step[d] = co->step[ax + d];
    }
    NEED(n->in[1], ci);
  }
  if (stage == 1) {
    if (!uniform(got, co->lanes)) return lanewise_step(f, fr, got, need);
    /* negative indices count from the end; out-of-range ones are clamped so
     * that a bad index cannot fault (the reference reports it) */
    const char *k = cu_tmp(f);
    cu_line(f, "const %s %s = (%s)smelt_gather_index(%s, %lldLL);", f->idx, k, f->idx, got->l[0],
            (long long)dt->dim[ax]);
    CuCoords *cd = &fr->ci;
    memset(cd, 0, sizeof *cd);
    cd->rank = dt->rank;
    cd->lanes = co->lanes;
    cd->aligned = co->aligned;
    for (int d = 0; d < dt->rank; d++) {
      int src = d < ax ? d : d == ax ? -1 : d + it->rank - 1;
      cd->c[d] = src < 0 ? k : co->c[src];
      cd->step[d] = src < 0 ? 0 : co->step[src];
    }
    NEED(n->in[0], cd);
  }
  fr->out = *got;
  return true;
}

/* rope at L lanes along the feature dim, all in one rotation half (half
 * style: L divides rd/2) or in whole pairs (interleaved: L even, L divides
 * rd): the input and its partners are L-lane loads (vectors where the
 * producers allow), one angle per pair.  Otherwise lane by lane; at one
 * lane, the partner, pair and sign per element.  Stages: the coordinates
 * and masks, then x at co, x at the partner (fr->s[0], skipped when NULL),
 * the row's position, and the rotation. */
static bool rope_step(CuFn *f, const Node *n, CuFrame *fr, int stage, const CuVal *got, CuNeed *need) {
  const Graph *g = f->g;
  const CuCoords *co = &fr->co;
  int v = fr->v;
  const TensorType *xt = &g->val[n->in[0]].type;
  int r = xt->rank;
  int64_t D = xt->dim[r - 1];
  const Attr *rda = ir_attr(n, "rotary_dim");
  int64_t rd = rda ? rda->i : D;
  int64_t h = rd / 2;
  bool half = strcmp(ir_attr_enum(n, "style"), "half") == 0;
  DType dt = g->val[v].type.dt;
  bool low = dt == DT_F16 || dt == DT_BF16;
  const char *ct = low ? "float" : "double";
  int L = co->lanes;
  const char *d = co->c[r - 1];
  if (stage == 0) {
    if (L > 1) {
      bool ok = co->aligned && co->step[r - 1] == 1 && (half ? h % L == 0 : L % 2 == 0 && rd % L == 0);
      for (int e = 0; ok && e < r - 1; e++) ok = co->step[e] == 0;
      if (!ok) return lanewise_step(f, fr, got, need);
      /* half: lanes d .. d + L - 1 pair with d + h .. (first half) or d - h .. */
      fr->s[0] = half ? half_partner(f, d, rd) : NULL;
    } else {
      /* the partner of feature d, its pair index and the sign of its sine term:
       * half (LLaMA/NeoX) pairs p with p + rd/2, interleaved (GPT-J) 2p with 2p+1 */
      const char *part, *pair = cu_tmp(f), *sign = cu_tmp(f);
      if (half) {
        part = half_partner(f, d, rd);
        cu_line(f, "const %s %s = %s < %lld ? %s : %s - %lld;", f->idx, pair, d, (long long)h, d, d, (long long)h);
        cu_line(f, "const %s %s = %s < %lld ? -1 : %s < %lld ? 1 : 0;", ct, sign, d, (long long)h, d, (long long)rd);
      } else {
        part = cu_tmp(f);
        cu_line(f, "const %s %s = %s < %lld ? (%s ^ 1) : %s;", f->idx, part, d, (long long)rd, d, d);
        cu_line(f, "const %s %s = %s / 2;", f->idx, pair, d);
        cu_line(f, "const %s %s = %s < %lld ? (%s %% 2 == 0 ? -1 : 1) : 0;", ct, sign, d, (long long)rd, d);
      }
      fr->s[0] = part;
      fr->s[1] = pair;
      fr->s[2] = sign;
    }
    NEED(n->in[0], co);
  }
  if (stage == 1) {
    fr->ops[0] = *got;
    if (fr->s[0]) {
      fr->ci = *co;
      fr->ci.c[r - 1] = fr->s[0];
      NEED(n->in[0], &fr->ci);
    }
    fr->stage++; /* no partner operand */
    stage++;
  } else if (stage == 2) {
    fr->ops[1] = *got;
  }
  if (stage == 2) {
    const char *s = co->c[r - 2];
    cu_coords_scalar(&fr->ci, 1, &s);
    NEED(n->in[1], &fr->ci);
  }
  const CuVal *x = &fr->ops[0], *xp = &fr->ops[1];
  const char *pos = got->l[0];
  if (L == 1) {
    const char *pair = fr->s[1], *sign = fr->s[2], *sn, *cs2;
    rope_angle(f, n, low, pos, pair, rd, &sn, &cs2);
    const char *y = cu_tmp(f);
    cu_line(f, "const %s %s = %s < %lld ? (%s)((%s)%s * %s + %s * (%s)%s * %s) : %s;  // %s (rope)", cu_ctype(dt), y, d,
            (long long)rd, cu_ctype(dt), ct, x->l[0], cs2, sign, ct, xp->l[0], sn, x->l[0], g->val[v].name);
    fr->out.l[0] = y;
    return true;
  }
  const char *rot = cu_tmp(f), *sign = cu_tmp(f);
  cu_line(f, "const bool %s = %s < %lld;  // rotated features", rot, d, (long long)rd);
  if (half) cu_line(f, "const %s %s = %s < %lld ? -1 : 1;  // the sine term's sign", ct, sign, d, (long long)h);
  for (int j = 0; j < L; j++) {
    const char *pair, *sgn, *other;
    if (half) {
      pair = cu_fmt(f, "(%s < %lld ? %s : %s - %lld) + %d", d, (long long)h, d, d, (long long)h, j);
      sgn = sign;
      other = xp->l[j];
    } else {
      pair = cu_fmt(f, "%s / 2 + %d", d, j / 2);
      sgn = j % 2 ? "1" : "-1";
      other = x->l[j ^ 1];
    }
    const char *sn, *cs2;
    rope_angle(f, n, low, pos, pair, rd, &sn, &cs2);
    const char *y = cu_tmp(f);
    cu_line(f, "const %s %s = %s ? (%s)((%s)%s * %s + %s * (%s)%s * %s) : %s;%s", cu_ctype(dt), y, rot, cu_ctype(dt), ct,
            x->l[j], cs2, sgn, ct, other, sn, x->l[j], j == 0 ? cu_fmt(f, "  // %s (rope)", g->val[v].name) : "");
    fr->out.l[j] = y;
  }
  return true;
}

/* dequantize, one lane at a time: q at the coordinates, the scales (and
 * zeros) at them with the axis coordinate divided by the group; (q - z) * s
 * in the result's compute type, rounded to its dtype as the reference
 * stores it.  (The quantised matmul kernels do not come here: they read
 * the packed weights themselves, qgemv.c.) */
static bool dequant_step(CuFn *f, const Node *n, CuFrame *fr, int stage, const CuVal *got, CuNeed *need) {
  const Graph *g = f->g;
  const CuCoords *co = &fr->co;
  if (co->lanes > 1) return lanewise_step(f, fr, got, need);
  const TensorType *qt = &g->val[n->in[0]].type;
  int axis = ir_norm_axis(ir_attr_int(n, "axis"), qt->rank);
  int64_t group = ir_attr_int(n, "group");
  if (stage == 0) NEED(n->in[0], co);
  if (stage == 1) {
    fr->ops[0] = *got;
    fr->ci = *co;
    fr->ci.c[axis] = group == 0 ? "0" : group == 1 ? co->c[axis] : cu_fmt(f, "(%s) / %lld", co->c[axis], (long long)group);
    fr->ci.step[axis] = 0;
    NEED(n->in[1], &fr->ci);
  }
  if (stage == 2 && n->nin > 2) {
    fr->ops[1] = *got;
    NEED(n->in[2], &fr->ci);
  }
  DType ot = g->val[fr->v].type.dt, cdt = ot == DT_F64 ? DT_F64 : DT_F32;
  const char *sc = n->nin > 2 ? fr->ops[1].l[0] : got->l[0];
  const char *y = cu_convert(f, fr->ops[0].l[0], qt->dt, cdt);
  if (n->nin > 2) y = cu_fmt(f, "(%s - %s)", y, cu_convert(f, got->l[0], g->val[n->in[2]].type.dt, cdt));
  y = cu_fmt(f, "(%s * %s)", y, cu_convert(f, sc, g->val[n->in[1]].type.dt, cdt));
  fr->out.l[0] = decl(f, ot, cu_convert(f, y, cdt, ot), cu_fmt(f, "%s (dequantize)", g->val[fr->v].name));
  return true;
}

/* Advances frame fr given the value it asked for last (got; unset at its
 * first step).  True: fr->out is the result.  False: *need is asked for. */
static bool node_step(CuFn *f, CuFrame *fr, const CuVal *got, CuNeed *need) {
  const Graph *g = f->g;
  int v = fr->v;
  const Node *n = &g->node[g->val[v].node];
  const TensorType *ot = &g->val[v].type;
  const CuCoords *co = &fr->co;
  int stage = fr->stage++;
  if (fr->lanewise) return lanewise_step(f, fr, got, need);
  switch (n->op) {
  case OP_EXPAND: case OP_RESHAPE: case OP_SQUEEZE: case OP_UNSQUEEZE: case OP_TRANSPOSE: case OP_SLICE:
  case OP_SPLIT: {
    if (stage > 0) {
      fr->out = *got;
      return true;
    }
    CuCoords *ci = &fr->ci;
    if (n->op == OP_EXPAND) {
      cu_bcast_coords(&g->val[n->in[0]].type, co, ci);
    } else if (n->op == OP_TRANSPOSE) {
      const Attr *p = ir_attr(n, "perm");
      *ci = *co;
      for (int j = 0; j < ot->rank; j++) {
        int src = p ? ir_norm_axis(p->ints[j], ot->rank) : ot->rank - 1 - j;
        ci->c[src] = co->c[j];
        ci->step[src] = co->step[j];
      }
    } else if (n->op == OP_SLICE) {
      const TensorType *it = &g->val[n->in[0]].type;
      int ax = ir_norm_axis(ir_attr_int(n, "axis"), it->rank);
      int64_t start, end, len, step = ir_attr_int(n, "step");
      ir_slice_bounds(it->dim[ax], ir_attr_int(n, "start"), ir_attr_int(n, "end"), step, &start, &end, &len);
      if (step > it->dim[ax] + 1) step = it->dim[ax] + 1; /* as ir_slice_bounds clamps it */
      if (step < -(it->dim[ax] + 1)) step = -(it->dim[ax] + 1);
      *ci = *co;
      ci->c[ax] = cu_addk(f, cu_mulk(f, co->c[ax], step), start);
      ci->step[ax] = co->step[ax] * step;
      if (co->step[ax] != 0 && (step != 1 || start % co->lanes != 0)) ci->aligned = false;
      if (it->dyn[ax]) {
        /* along a ranged axis (step 1, codegen/ranges.c) a start counted
         * from the end moves with this run's extent; one from the front
         * stays (clamped to the extent, as ir_slice_bounds does) */
        int64_t s0 = ir_attr_int(n, "start");
        const char *e = cu_extent(f, it, ax);
        const char *st0 = s0 < 0 ? cu_fmt(f, "(%s > %lldLL ? %s - %lldLL : 0LL)", e, (long long)-s0, e, (long long)-s0)
                                 : cu_fmt(f, "(%s < %lldLL ? %s : %lldLL)", e, (long long)s0, e, (long long)s0);
        ci->c[ax] = cu_add(f, co->c[ax], cu_fmt(f, "(%s)%s", f->idx, st0));
        ci->aligned = false;
      }
    } else if (n->op == OP_SPLIT) {
      const TensorType *it = &g->val[n->in[0]].type;
      int ax = ir_norm_axis(ir_attr_int(n, "axis"), it->rank);
      int64_t off = 0;
      for (int i = 0; i < n->nout && n->out[i] != v; i++) off += g->val[n->out[i]].type.dim[ax];
      *ci = *co;
      ci->c[ax] = cu_addk(f, co->c[ax], off);
      if (co->step[ax] != 0 && off % co->lanes != 0) ci->aligned = false;
    } else if (!reshape_coords(f, ot, &g->val[n->in[0]].type, co, ci)) {
      return lanewise_step(f, fr, got, need);
    }
    NEED(n->in[0], ci);
  }
  case OP_CONCAT: return concat_step(f, n, fr, stage, got, need);
  case OP_GATHER: return gather_step(f, n, fr, stage, got, need);
  case OP_ROPE: return rope_step(f, n, fr, stage, got, need);
  case OP_DEQUANTIZE: return dequant_step(f, n, fr, stage, got, need);
  default: break;
  }
  FusionClass fc = ir_op_info(n->op)->fclass;
  if (fc == FC_ELEMWISE || fc == FC_BROADCAST) return elementwise_step(f, n, fr, stage, got, need);
  cu_fail(f, ST_UNSUPPORTED,
          "value '%s' (%s) is needed at coordinates where the kernel does not compute it; "
          "a %s result can only feed an elementwise epilogue of its own shape",
          g->val[v].name, ir_op_name(n->op), ir_op_name(n->op));
  fr->out.l[0] = "0";
  replicate(&fr->out, co->lanes);
  return true;
}

#undef NEED

/* v at co when it needs no operand (an error, the override, a memoised
 * value, a load): true with *out set; false for a member's result still to
 * compute. */
static bool emit_leaf(CuFn *f, int v, const CuCoords *co, CuVal *out) {
  const Graph *g = f->g;
  if (co->rank != g->val[v].type.rank) {
    cu_fail(f, ST_INTERNAL, "value '%s' emitted with %d coordinates for rank %d", g->val[v].name, co->rank,
            g->val[v].type.rank);
    out->l[0] = "0";
    replicate(out, co->lanes);
    return true;
  }
  bool uni;
  const char *key = value_key(f, v, co, &uni);
  if (v == f->ov_value && f->ov_key && strcmp(key, f->ov_key) == 0) {
    take(&f->ov_val, uni, co->lanes, out);
    return true;
  }
  for (int i = f->nmemo - 1; i >= 0; i--)
    if (f->memo[i].value == v && strcmp(f->memo[i].key, key) == 0) {
      take(&f->memo[i].val, uni, co->lanes, out);
      return true;
    }
  const Value *val = &g->val[v];
  if (val->kind == VK_NODE && f->member[val->node]) return false;
  load(f, v, co, out);
  cu_memo_put(f, v, co, out);
  return true;
}

#define CU_LOCAL_FRAMES 4

void cu_emit(CuFn *f, int v, const CuCoords *co, CuVal *out) {
  if (emit_leaf(f, v, co, out)) return;
  CuFrame local[CU_LOCAL_FRAMES], *st = local;
  size_t n = 0, cap = CU_LOCAL_FRAMES;
  int want_v = v;
  CuCoords want_co = *co;
  CuVal got;
  memset(&got, 0, sizeof got);
  for (;;) {
    if (n == cap) {
      size_t ncap = cap * 2;
      CuFrame *ns = st == local ? malloc(sizeof *ns * ncap) : realloc(st, sizeof *ns * ncap);
      if (!ns) {
        cu_fail(f, ST_NO_MEMORY, "out of memory for an expression %zu members deep", n);
        out->l[0] = "0";
        replicate(out, co->lanes);
        break;
      }
      if (st == local) memcpy(ns, local, sizeof local);
      st = ns;
      cap = ncap;
    }
    CuFrame *fr = &st[n++];
    memset(fr, 0, sizeof *fr);
    fr->v = want_v;
    fr->co = want_co;
    bool pushed = false;
    while (!pushed) {
      CuFrame *top = &st[n - 1];
      CuNeed need;
      if (node_step(f, top, &got, &need)) {
        cu_memo_put(f, top->v, &top->co, &top->out);
        got = top->out;
        if (--n == 0) break;
        continue;
      }
      if (!emit_leaf(f, need.v, need.co, &got)) {
        want_v = need.v;
        want_co = *need.co;
        pushed = true;
      }
    }
    if (n == 0) {
      *out = got;
      break;
    }
  }
  if (st != local) free(st);
}

void cu_memo_put(CuFn *f, int v, const CuCoords *co, const CuVal *val) {
  bool uni;
  const char *key = value_key(f, v, co, &uni);
  if (f->nmemo == f->cap_memo) {
    int cap = f->cap_memo ? f->cap_memo * 2 : 64;
    CuMemo *m = arena_alloc(&f->arena, sizeof(CuMemo) * (size_t)cap);
    if (!m) {
      cu_fail(f, ST_NO_MEMORY, "out of memory for the emission memo");
      return;
    }
    if (f->nmemo) memcpy(m, f->memo, sizeof(CuMemo) * (size_t)f->nmemo);
    f->memo = m;
    f->cap_memo = cap;
  }
  f->memo[f->nmemo++] = (CuMemo){v, key, *val};
}

/* ---- loops over stored values ---- */

int cu_pick_lanes(const CuFn *f, const TensorType *t, const int *vals, int n) {
  size_t smallest = 8;
  for (int i = 0; i < n; i++) {
    size_t s = dt_size(f->g->val[vals[i]].type.dt);
    if (s < smallest) smallest = s;
  }
  int lanes = (int)(16 / smallest);
  if (lanes > CU_MAX_LANES) lanes = CU_MAX_LANES;
  if (t->rank == 0 || ir_type_numel(t) == 0 || t->dim[t->rank - 1] % lanes != 0) return 1;
  return lanes;
}

const char *cu_vec_condition(CuFn *f) {
  CuBuf b = {0};
  for (int a = 0; a < f->k->nargs; a++)
    if (f->vec_bytes[a]) cu_buf_printf(&b, "%ssmelt_aligned(a%d, %d)", b.len ? " && " : "", a, f->vec_bytes[a]);
  const char *c = cu_buf_str(f, &b);
  cu_buf_free(&b);
  return c;
}

/* Computes and stores vals (all of shape t) at flat element index e
 * (`lanes` elements from it along the last axis). */
static void store_at(CuFn *f, const int *vals, int n, const TensorType *t, int lanes, const char *e) {
  CuCoords co;
  cu_delinearize(f, e, t, &co);
  co.lanes = lanes;
  if (lanes > 1) co.step[t->rank - 1] = 1;
  for (int k = 0; k < n; k++) {
    CuVal r;
    cu_emit(f, vals[k], &co, &r);
    cu_store(f, vals[k], &co, &r);
  }
}

/* One grid-stride loop computing and storing vals (all of shape t), with
 * `lanes` elements per thread and iteration. */
static void store_loop(CuFn *f, const int *vals, int n, const TensorType *t, int lanes) {
  int64_t items = ir_type_numel(t) / lanes;
  const char *i = cu_tmp(f);
  if (ir_type_dynamic(t)) {
    /* A ranged shape: the loop runs over this run's elements only (the
     * grid is the max's; the threads past them do nothing), and each
     * index maps to its place in the max's layout.  Lanes never straddle
     * a row of the ranged axis: they lie along the last axis, which is
     * not ranged when lanes > 1 (cu_store_loops). */
    const char *nrun = cu_tmp(f);
    cu_line(f, "const %s %s = (%s)(%s / %d);  // this run's items (ranged dims)", f->idx, nrun, f->idx, cu_run_numel(f, t),
            lanes);
    cu_open(f, "for (%s %s = (%s)blockIdx.x * blockDim.x + threadIdx.x; %s < %s; %s += (%s)gridDim.x * blockDim.x)",
            f->idx, i, f->idx, i, nrun, i, f->idx);
    const char *c = lanes > 1 ? cu_fmt(f, "%s * %d", i, lanes) : i;
    const char *e = cu_run_index(f, t, c);
    if (e != c || lanes > 1) {
      const char *name = cu_tmp(f);
      cu_line(f, "const %s %s = (%s)%s;", f->idx, name, f->idx, e);
      e = name;
    }
    store_at(f, vals, n, t, lanes, e);
    cu_close(f);
    return;
  }
  cu_open(f, "for (%s %s = (%s)blockIdx.x * blockDim.x + threadIdx.x; %s < %lld; %s += (%s)gridDim.x * blockDim.x)",
          f->idx, i, f->idx, i, (long long)items, i, f->idx);
  const char *e = i;
  if (lanes > 1) {
    e = cu_tmp(f);
    cu_line(f, "const %s %s = %s * %d;", f->idx, e, i, lanes);
  }
  store_at(f, vals, n, t, lanes, e);
  cu_close(f);
}

void cu_store_loops(CuFn *f, const int *vals, int n) {
  bool *done = arena_alloc(&f->arena, sizeof(bool) * (size_t)(n ? n : 1));
  int *same = arena_alloc(&f->arena, sizeof(int) * (size_t)(n ? n : 1));
  if (!done || !same) {
    cu_fail(f, ST_NO_MEMORY, "out of memory for a kernel's store loops");
    return;
  }
  for (int a = 0; a < n; a++) {
    if (done[a]) continue;
    const TensorType *t = &f->g->val[vals[a]].type;
    int ns = 0;
    for (int b = a; b < n; b++) {
      const TensorType *u = &f->g->val[vals[b]].type;
      bool eq = u->rank == t->rank;
      for (int d = 0; eq && d < t->rank; d++) eq = u->dim[d] == t->dim[d];
      if (eq && !done[b]) {
        done[b] = true;
        same[ns++] = vals[b];
      }
    }
    if (ir_type_numel(t) == 0) continue;
    int lanes = cu_pick_lanes(f, t, same, ns);
    /* a ranged last axis: a run's row need not be whole vectors */
    if (t->rank && t->dyn[t->rank - 1]) lanes = 1;
    if (lanes == 1) {
      store_loop(f, same, ns, t, 1);
      continue;
    }
    /* The vector loop goes into a buffer of its own first: only after it is
     * written do we know which pointers it accesses as vectors. */
    CuBuf vec = {0};
    CuBuf *saved = f->out;
    int saved_indent = f->indent;
    f->out = &vec;
    f->indent = saved_indent + 1; /* it goes inside a block opened below */
    memset(f->vec_bytes, 0, sizeof(int) * (size_t)f->k->nargs);
    store_loop(f, same, ns, t, lanes);
    f->out = saved;
    f->indent = saved_indent;
    const char *cond = cu_vec_condition(f);
    if (!cond[0] || f->opt->args_aligned) {
      /* every access is scalar anyway, or alignment is guaranteed */
      cu_open(f, "%s", "");
      cu_buf_append_buf(f->out, &vec);
      cu_close(f);
    } else {
      cu_open(f, "if (%s)", cond);
      cu_buf_append_buf(f->out, &vec);
      f->indent--;
      cu_line(f, "} else {");
      f->indent++;
      store_loop(f, same, ns, t, 1);
      cu_close(f);
    }
    cu_buf_free(&vec);
  }
}

/* ---- epilogues ---- */

void cu_split_outputs(CuFn *f, int **out_epi, int *out_nepi, int **out_side, int *out_nside) {
  int nout = f->k->nargs - f->nin;
  int *epi = arena_alloc(&f->arena, sizeof(int) * (size_t)(nout ? nout : 1));
  int *side = arena_alloc(&f->arena, sizeof(int) * (size_t)(nout ? nout : 1));
  if (!epi || !side) {
    cu_fail(f, ST_NO_MEMORY, "out of memory for a kernel's outputs");
    *out_epi = *out_side = NULL;
    *out_nepi = *out_nside = 0;
    return;
  }
  int ne = 0, ns = 0;
  for (int i = f->nin; i < f->k->nargs; i++) {
    int v = f->k->args[i];
    const Value *val = &f->g->val[v];
    bool d = val->kind == VK_NODE && f->member[val->node] && f->dep[val->node];
    if (d) epi[ne++] = v;
    else side[ns++] = v;
  }
  *out_epi = epi;
  *out_nepi = ne;
  *out_side = side;
  *out_nside = ns;
}

bool cu_moves_data(Op op) {
  return op == OP_TRANSPOSE || op == OP_RESHAPE || op == OP_SQUEEZE || op == OP_UNSQUEEZE;
}

/* Where node n (one that moves data: cu_moves_data) puts the element its
 * input has at ci: the coordinates of that element in n's result.  A
 * transpose permutes them; a reshape keeps the row-major position (the
 * same mapping as a reshape read backwards).  False when the lanes would
 * not stay affine. */
static bool forward_coords(CuFn *f, const Node *n, const CuCoords *ci, CuCoords *co) {
  const Graph *g = f->g;
  const TensorType *it = &g->val[n->in[0]].type, *ot = &g->val[n->out[0]].type;
  if (n->op == OP_TRANSPOSE) {
    const Attr *p = ir_attr(n, "perm");
    *co = *ci;
    co->rank = ot->rank;
    for (int j = 0; j < ot->rank; j++) {
      int src = p ? ir_norm_axis(p->ints[j], ot->rank) : ot->rank - 1 - j;
      co->c[j] = ci->c[src];
      co->step[j] = ci->step[src];
    }
    return true;
  }
  return reshape_coords(f, it, ot, ci, co);
}

/* The epilogue when some stored value does not have the anchor's shape:
 * the members after the anchor are a chain of data movement (transpose,
 * reshape) and elementwise ops, so each anchor element has one place in
 * each of their results.  Walking the members forward, a data-movement
 * result is the same value at forward-mapped coordinates (memoised there),
 * an elementwise result is computed at its operand's coordinates; every
 * stored value is then emitted and stored where it lands.  False (nothing
 * stored) when the lanes do not survive a reshape: the caller goes lane
 * by lane. */
static bool store_forward(CuFn *f, const int *epi, int nepi, const CuCoords *co) {
  const Graph *g = f->g;
  int av = g->node[f->anchor].out[0];
  CuCoords **fw = arena_alloc(&f->arena, sizeof(CuCoords *) * (size_t)g->nval);
  if (!fw) {
    cu_fail(f, ST_NO_MEMORY, "out of memory for an epilogue");
    return true;
  }
  fw[av] = (CuCoords *)co;
  int mark = cu_scope_push(f);
  for (int i = 0; i < f->grp->nnodes; i++) {
    const Node *n = &g->node[f->grp->nodes[i]];
    if (f->grp->nodes[i] == f->anchor || !f->dep[f->grp->nodes[i]]) continue;
    int out = n->out[0];
    if (n->op == OP_SLICE) {
      /* a slice of step L along the laned last dim, from lane s to the
       * end, takes lane s of each L-lane group: one element of its result
       * (the halves of an interleaved gated pair, L = 2) */
      const CuCoords *ci = fw[n->in[0]];
      const TensorType *it = &g->val[n->in[0]].type;
      int r = it->rank, ax = r ? ir_norm_axis(ir_attr_int(n, "axis"), r) : 0;
      int64_t st, en, len, step = ir_attr_int(n, "step");
      if (!ci || r == 0) goto unsupported;
      ir_slice_bounds(it->dim[ax], ir_attr_int(n, "start"), ir_attr_int(n, "end"), step, &st, &en, &len);
      if (it->dyn[ax]) goto unsupported; /* its start moves with the run's extent */
      bool whole = ci->aligned || ci->whole_lanes;
      if (ax != r - 1 || step != ci->lanes || ci->step[ax] != 1 || !whole || st >= step || it->dim[ax] % step ||
          len != it->dim[ax] / step)
        goto unsupported;
      for (int d = 0; d < r - 1; d++)
        if (ci->step[d] != 0) goto unsupported;
      CuVal x;
      cu_emit(f, n->in[0], ci, &x);
      CuCoords *o = arena_alloc(&f->arena, sizeof *o);
      if (!o) goto no_memory;
      *o = *ci;
      o->lanes = 1;
      o->aligned = true;
      o->whole_lanes = false;
      o->step[ax] = 0;
      o->c[ax] = cu_fmt(f, "(%s / %lld)", ci->c[ax], (long long)step);
      CuVal one = {{x.l[st]}};
      cu_memo_put(f, out, o, &one);
      fw[out] = o;
      continue;
    }
    if (cu_moves_data(n->op)) {
      if (!fw[n->in[0]]) goto unsupported;
      CuCoords *o = arena_alloc(&f->arena, sizeof *o);
      if (!o) goto no_memory;
      if (!forward_coords(f, n, fw[n->in[0]], o)) {
        cu_scope_pop(f, mark);
        return false;
      }
      CuVal x;
      cu_emit(f, n->in[0], fw[n->in[0]], &x);
      cu_memo_put(f, out, o, &x);
      fw[out] = o;
      continue;
    }
    FusionClass fc = ir_op_info(n->op)->fclass;
    if (fc != FC_ELEMWISE && fc != FC_BROADCAST) goto unsupported;
    /* its operands from the anchor have its shape (the fuser's rule) and
     * one place: computed where they are, by cu_emit below */
    for (int j = 0; j < n->nin; j++) {
      int u = n->in[j];
      const Value *uv = &g->val[u];
      bool dep = u == av || (uv->kind == VK_NODE && f->member[uv->node] && f->dep[uv->node]);
      if (!dep) continue;
      const TensorType *ut = &uv->type, *ot = &g->val[out].type;
      bool same = ut->rank == ot->rank && fw[u];
      for (int d = 0; same && d < ut->rank; d++) same = ut->dim[d] == ot->dim[d];
      if (!same) goto unsupported;
      if (!fw[out]) fw[out] = fw[u];
      else if (strcmp(value_key(f, u, fw[u], NULL), value_key(f, u, fw[out], NULL)) != 0) goto unsupported;
    }
  }
  for (int i = 0; i < nepi; i++) {
    if (!fw[epi[i]]) goto unsupported;
    CuVal r;
    cu_emit(f, epi[i], fw[epi[i]], &r);
    cu_store(f, epi[i], fw[epi[i]], &r);
  }
  cu_scope_pop(f, mark);
  return true;
no_memory:
  cu_scope_pop(f, mark);
  cu_fail(f, ST_NO_MEMORY, "out of memory for an epilogue");
  return true;
unsupported:
  cu_scope_pop(f, mark);
  cu_fail(f, ST_UNSUPPORTED, "the epilogue of the %s result '%s' is not a chain of data movement and elementwise ops",
          ir_op_name(g->node[f->anchor].op), g->val[av].name);
  return true;
}

void cu_store_epilogue(CuFn *f, const int *epi, int nepi, const CuCoords *co, const CuVal *val) {
  const Graph *g = f->g;
  int av = g->node[f->anchor].out[0];
  const TensorType *at = &g->val[av].type;
  /* a member that moves data (a transpose of a square result) keeps the
   * shape but not the coordinates: the forward walk places it */
  bool all_same = true;
  for (int i = 0; i < f->grp->nnodes && all_same; i++) {
    int nd = f->grp->nodes[i];
    if (nd != f->anchor && f->dep[nd] && (cu_moves_data(g->node[nd].op) || g->node[nd].op == OP_SLICE))
      all_same = false;
  }
  for (int i = 0; i < nepi && all_same; i++) {
    const TensorType *t = &g->val[epi[i]].type;
    all_same = t->rank == at->rank;
    for (int d = 0; all_same && d < t->rank; d++) all_same = t->dim[d] == at->dim[d];
  }
  if (!all_same) {
    cu_set_override(f, av, co, val);
    bool done = store_forward(f, epi, nepi, co);
    cu_clear_override(f);
    for (int j = 0; !done && j < co->lanes; j++) {
      /* lane by lane */
      CuCoords one;
      lane_coords(f, co, j, &one);
      CuVal v1 = {{val->l[j]}};
      cu_set_override(f, av, &one, &v1);
      if (!store_forward(f, epi, nepi, &one))
        cu_fail(f, ST_INTERNAL, "epilogue of '%s': a one-lane forward map failed", g->val[av].name);
      cu_clear_override(f);
    }
    return;
  }
  cu_set_override(f, av, co, val);
  for (int i = 0; i < nepi; i++) {
    CuVal r;
    cu_emit(f, epi[i], co, &r);
    cu_store(f, epi[i], co, &r);
  }
  cu_clear_override(f);
}
