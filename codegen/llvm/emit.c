/* Emit at coordinates: the value of a tensor at one coordinate vector.
 *
 * cg_emit(f, v, c) generates, in the current block, the scalar v[c]:
 *   - an argument of the kernel is loaded (row-major, its own shape);
 *   - a one-element constant becomes an immediate;
 *   - the anchor's result is the value the kernel installed for exactly
 *     these coordinates (cg_store_epilogue); anywhere else it is an error,
 *     since the anchor exists only row by row or tile by tile;
 *   - any other member's result is its op applied to its operands, emitted
 *     at coordinates that the op derives from c: the same ones for
 *     elementwise ops, right-aligned with size-1 dims pinned to 0 for
 *     broadcasting, permuted for transpose, start + c*step for slice,
 *     shifted for split, chosen by range for concat, read from the index
 *     tensor for gather, and relinearised for reshape.
 * Nothing is materialised between members: a fused chain is one expression
 * per element, which LLVM then vectorises along the innermost loop.
 *
 * A value read twice at the same coordinates (x in x * sigmoid(x) through
 * two members, a residual read by two consumers) would be generated twice,
 * and a diamond-shaped group exponentially often; a memo of (value,
 * coordinates) -> result, valid until the enclosing loop ends, keeps every
 * value at every coordinate emitted once.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/llvm/cg_internal.h"

/* ---- element access ---- */

static DType arg_dtype(CgFn *f, int arg) { return f->g->val[f->k->args[arg]].type.dt; }

/* i4/u4: the nibble of byte lin/2 (the high one for odd lin), sign-extended
 * for i4 with (x ^ 8) - 8. */
static LLVMValueRef load_nibble(CgFn *f, int arg, DType dt, LLVMValueRef lin) {
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  LLVMValueRef byte = LLVMBuildLShr(B, lin, cg_i64(m, 1), "");
  LLVMValueRef p = LLVMBuildInBoundsGEP2(B, m->t_i8, f->base[arg], &byte, 1, "");
  LLVMValueRef raw = LLVMBuildLoad2(B, m->t_i8, p, "");
  LLVMSetAlignment(raw, 1);
  cg_tag_access(f, raw);
  LLVMValueRef sh = LLVMBuildTrunc(B, LLVMBuildShl(B, LLVMBuildAnd(B, lin, cg_i64(m, 1), ""), cg_i64(m, 2), ""), m->t_i8, "");
  LLVMValueRef v = LLVMBuildAnd(B, LLVMBuildLShr(B, raw, sh, ""), LLVMConstInt(m->t_i8, 15, 0), "");
  if (dt == DT_I4) v = LLVMBuildSub(B, LLVMBuildXor(B, v, LLVMConstInt(m->t_i8, 8, 0), ""), LLVMConstInt(m->t_i8, 8, 0), "");
  return v;
}

LLVMValueRef cg_load_arg(CgFn *f, int arg, LLVMValueRef lin) {
  CgMod *m = f->m;
  DType dt = arg_dtype(f, arg);
  if (dt_is_packed(dt)) return load_nibble(f, arg, dt, lin);
  LLVMTypeRef st = cg_stype(m, dt);
  LLVMValueRef p = LLVMBuildInBoundsGEP2(f->b, st, f->base[arg], &lin, 1, "");
  LLVMValueRef raw = LLVMBuildLoad2(f->b, st, p, "");
  LLVMSetAlignment(raw, (unsigned)dt_size(dt));
  cg_tag_access(f, raw);
  return cg_from_storage(m, dt, raw);
}

void cg_store_arg(CgFn *f, int arg, LLVMValueRef lin, LLVMValueRef v) {
  CgMod *m = f->m;
  DType dt = arg_dtype(f, arg);
  LLVMTypeRef st = cg_stype(m, dt);
  LLVMValueRef p = LLVMBuildInBoundsGEP2(f->b, st, f->base[arg], &lin, 1, "");
  LLVMValueRef s = LLVMBuildStore(f->b, cg_to_storage(m, dt, v), p);
  LLVMSetAlignment(s, (unsigned)dt_size(dt));
  cg_tag_access(f, s);
}

void cg_bcast_coords(CgFn *f, const TensorType *in, int out_rank, LLVMValueRef const *coords, LLVMValueRef *out) {
  for (int i = 0; i < in->rank; i++) {
    int j = out_rank - in->rank + i;
    out[i] = in->dim[i] == 1 || j < 0 ? cg_i64(f->m, 0) : coords[j];
  }
}

/* A one-element constant as an immediate of its compute type. */
static LLVMValueRef const_scalar(CgMod *m, const Value *val) {
  DType dt = val->type.dt;
  if (dt == DT_I64) return LLVMConstInt(m->t_i64, (unsigned long long)*(const int64_t *)val->data, 1);
  double v = dt_load(dt, val->data, 0);
  return cg_const_of(m, dt, v);
}

/* ---- coordinate maps of the data-movement ops ---- */

/* reshape, squeeze, unsqueeze: dims that agree at the front and the back
 * map one to one; only the middle is relinearised (often nothing is: an
 * unsqueeze leaves only size-1 dims there). */
static void reshape_coords(CgFn *f, const TensorType *in, const TensorType *out, LLVMValueRef const *c,
                           LLVMValueRef *ic) {
  int p = 0;
  while (p < in->rank && p < out->rank && in->dim[p] == out->dim[p]) {
    ic[p] = c[p];
    p++;
  }
  int s = 0;
  while (s < in->rank - p && s < out->rank - p && in->dim[in->rank - 1 - s] == out->dim[out->rank - 1 - s]) {
    ic[in->rank - 1 - s] = c[out->rank - 1 - s];
    s++;
  }
  TensorType om = {.rank = out->rank - p - s};
  for (int i = 0; i < om.rank; i++) om.dim[i] = out->dim[p + i];
  LLVMValueRef lin = cg_linear(f, &om, c + p);
  cg_delinearize(f, lin, in->dim + p, in->rank - p - s, ic + p);
}

/* ---- emission without recursion ----
 *
 * The value of a member at coordinates needs its operands' values at
 * derived coordinates first, and they need theirs: a chain of N members is
 * N levels.  The levels are frames on an explicit stack (heap memory,
 * grown as needed), never C stack frames, so that a group's depth is
 * bounded by memory, not by the thread's stack.  A frame is one node being
 * computed at one coordinate vector; node_step advances it: each call
 * either asks for one operand's value at coordinates (the frame resumes at
 * the next stage with that value) or finishes with the node's result.  The
 * stages emit exactly the instructions, in exactly the order, that one
 * recursive function per op would. */

typedef struct {
  int v;                        /* the value computed (a member's result) */
  LLVMValueRef c[IR_MAX_RANK];  /* at these coordinates */
  int stage, k;                 /* where the node's rule resumes; a loop counter */
  LLVMValueRef ic[IR_MAX_RANK]; /* coordinates of an operand asked for */
  LLVMValueRef x[5];            /* operand values and temporaries kept between stages */
} EmitFrame;

/* What node_step wants next. */
typedef struct {
  int v;                   /* the operand's value */
  LLVMValueRef const *c;   /* its coordinates (in the frame) */
} EmitNeed;

static LLVMValueRef clamp_index(CgFn *f, LLVMValueRef i, int64_t size) {
  return cg_min(f, cg_max(f, i, cg_i64(f->m, 0)), cg_i64(f->m, size > 0 ? size - 1 : 0));
}

/* concat: every operand is computed at a clamped coordinate and the one
 * whose range holds c[axis] is selected: branch-free, so the loop still
 * vectorises, and no read falls outside an operand.  Operands are taken
 * from the last to the first; fr->x[0] is the selection so far. */
static bool concat_next(CgFn *f, const Node *n, const TensorType *ot, EmitFrame *fr, EmitNeed *need,
                        LLVMValueRef *res) {
  CgMod *m = f->m;
  int axis = ir_norm_axis(ir_attr_int(n, "axis"), ot->rank);
  for (; fr->k >= 0; fr->k--) {
    int64_t off = 0;
    for (int i = 0; i < fr->k; i++) off += f->g->val[n->in[i]].type.dim[axis];
    int64_t size = f->g->val[n->in[fr->k]].type.dim[axis];
    if (size == 0) continue;
    memcpy(fr->ic, fr->c, sizeof(LLVMValueRef) * (size_t)ot->rank);
    fr->ic[axis] = clamp_index(f, LLVMBuildNSWSub(f->b, fr->c[axis], cg_i64(m, off), ""), size);
    need->v = n->in[fr->k];
    need->c = fr->ic;
    return false;
  }
  *res = fr->x[0] ? fr->x[0] : LLVMGetUndef(cg_ctype(m, ot->dt));
  return true;
}

static void concat_take(CgFn *f, const Node *n, const TensorType *ot, EmitFrame *fr, LLVMValueRef v) {
  int axis = ir_norm_axis(ir_attr_int(n, "axis"), ot->rank);
  if (!fr->x[0]) {
    fr->x[0] = v;
  } else {
    int64_t end = 0;
    for (int i = 0; i <= fr->k; i++) end += f->g->val[n->in[i]].type.dim[axis];
    LLVMValueRef inside = LLVMBuildICmp(f->b, LLVMIntSLT, fr->c[axis], cg_i64(f->m, end), "");
    fr->x[0] = LLVMBuildSelect(f->b, inside, v, fr->x[0], "");
  }
  fr->k--;
}

/* gather, once the index is known (idx): the data operand's coordinates. */
static void gather_coords(CgFn *f, const Node *n, EmitFrame *fr, LLVMValueRef idx) {
  CgMod *m = f->m;
  const TensorType *dt = &f->g->val[n->in[0]].type, *it = &f->g->val[n->in[1]].type;
  int axis = ir_norm_axis(ir_attr_int(n, "axis"), dt->rank);
  idx = cg_convert(m, idx, it->dt, DT_I64);
  int64_t len = dt->dim[axis];
  /* negative indices count from the end; an index out of range (an error
   * in the reference) is clamped so that no read leaves the tensor */
  LLVMValueRef neg = LLVMBuildICmp(f->b, LLVMIntSLT, idx, cg_i64(m, 0), "");
  idx = LLVMBuildSelect(f->b, neg, cg_add(f, idx, cg_i64(m, len)), idx, "");
  for (int i = 0; i < axis; i++) fr->ic[i] = fr->c[i];
  fr->ic[axis] = clamp_index(f, idx, len);
  for (int i = axis + 1; i < dt->rank; i++) fr->ic[i] = fr->c[i - 1 + it->rank];
}

/* rope: y[d] = x[d] cos(theta) -/+ x[partner(d)] sin(theta) for d below
 * rotary_dim, theta = pos * base^(-2p/rotary_dim) for pair p.  The angle,
 * its sine and cosine are computed in double: positions run to thousands of
 * radians, where an f32 angle is off by ~1e-4.  rope_begin computes the
 * pair, the partner coordinates (into fr->ic) and the masks (fr->x[0..2]);
 * rope_end the rotation from x, x at the partner and the position. */
static void rope_begin(CgFn *f, const Node *n, const TensorType *ot, EmitFrame *fr) {
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  int r = ot->rank;
  int64_t D = ot->dim[r - 1];
  const Attr *rda = ir_attr(n, "rotary_dim");
  int64_t rd = rda ? rda->i : D;
  bool half = strcmp(ir_attr_enum(n, "style"), "half") == 0;
  LLVMValueRef d = fr->c[r - 1];
  LLVMValueRef p, partner, first;
  if (half) {
    first = LLVMBuildICmp(B, LLVMIntSLT, d, cg_i64(m, rd / 2), "");
    p = LLVMBuildSelect(B, first, d, LLVMBuildNSWSub(B, d, cg_i64(m, rd / 2), ""), "");
    partner = LLVMBuildSelect(B, first, cg_add(f, d, cg_i64(m, rd / 2)), p, "");
  } else {
    first = LLVMBuildICmp(B, LLVMIntEQ, LLVMBuildAnd(B, d, cg_i64(m, 1), ""), cg_i64(m, 0), "");
    p = LLVMBuildLShr(B, d, cg_i64(m, 1), "");
    partner = LLVMBuildXor(B, d, cg_i64(m, 1), "");
  }
  LLVMValueRef rot = LLVMBuildICmp(B, LLVMIntSLT, d, cg_i64(m, rd), "");
  partner = LLVMBuildSelect(B, rot, partner, d, ""); /* stays in range past rotary_dim */
  memcpy(fr->ic, fr->c, sizeof(LLVMValueRef) * (size_t)r);
  fr->ic[r - 1] = partner;
  fr->x[0] = first;
  fr->x[1] = p;
  fr->x[2] = rot;
}

static LLVMValueRef rope_end(CgFn *f, const Node *n, const TensorType *ot, EmitFrame *fr, LLVMValueRef x,
                             LLVMValueRef xp, LLVMValueRef posv) {
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  int64_t D = ot->dim[ot->rank - 1];
  const Attr *rda = ir_attr(n, "rotary_dim");
  int64_t rd = rda ? rda->i : D;
  LLVMValueRef first = fr->x[0], p = fr->x[1], rot = fr->x[2];
  const TensorType *post = &f->g->val[n->in[1]].type;
  LLVMValueRef pos = cg_convert(m, posv, post->dt, DT_F64);
  double base = ir_attr_float(n, "base");
  /* base^(-2p/rd) = exp(p * (-2 ln(base) / rd)) */
  LLVMValueRef pf = LLVMBuildSIToFP(B, p, m->t_f64, "");
  LLVMValueRef e = LLVMBuildFMul(B, pf, cg_fconst(m->t_f64, -2.0 * log(base) / (double)rd), "");
  LLVMTypeRef t64 = m->t_f64;
  LLVMValueRef theta = LLVMBuildFMul(B, pos, cg_intrinsic(m, "llvm.exp", &t64, 1, &e, 1), "");
  LLVMValueRef cs = cg_intrinsic(m, "llvm.cos", &t64, 1, &theta, 1);
  LLVMValueRef sn = cg_intrinsic(m, "llvm.sin", &t64, 1, &theta, 1);
  LLVMTypeRef ct = LLVMTypeOf(x);
  if (ct != t64) {
    cs = LLVMBuildFPTrunc(B, cs, ct, "");
    sn = LLVMBuildFPTrunc(B, sn, ct, "");
  }
  sn = LLVMBuildSelect(B, first, LLVMBuildFNeg(B, sn, ""), sn, "");
  LLVMValueRef y = LLVMBuildFAdd(B, LLVMBuildFMul(B, x, cs, ""), LLVMBuildFMul(B, xp, sn, ""), "");
  return LLVMBuildSelect(B, rot, y, x, "");
}

static LLVMValueRef batch_norm_end(CgFn *f, const Node *n, LLVMValueRef const *x, LLVMValueRef var) {
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  LLVMValueRef scale = x[1], bias = x[2], mean = x[3];
  LLVMTypeRef t = LLVMTypeOf(x[0]);
  LLVMValueRef ve = LLVMBuildFAdd(B, var, cg_fconst(t, ir_attr_float(n, "eps")), "");
  LLVMValueRef k = LLVMBuildFDiv(B, scale, cg_intrinsic(m, "llvm.sqrt", &t, 1, &ve, 1), "");
  return LLVMBuildFAdd(B, LLVMBuildFMul(B, LLVMBuildFSub(B, x[0], mean, ""), k, ""), bias, "");
}

/* Advances frame fr (the member computing value fr->v at fr->c), given the
 * value `got` of the operand it asked for last (NULL at its first step).
 * Returns true with the result in *res, or false with the next operand it
 * needs in *need. */
static bool node_step(CgFn *f, EmitFrame *fr, LLVMValueRef got, EmitNeed *need, LLVMValueRef *res) {
  CgMod *m = f->m;
  Graph *g = f->g;
  const Value *val = &g->val[fr->v];
  const Node *n = &g->node[val->node];
  int out = val->out_index;
  const TensorType *ot = &val->type;
  const TensorType *t0 = &g->val[n->in[0]].type;
  LLVMValueRef const *c = fr->c;
  int stage = fr->stage++;
#define NEED(value, coords)                                                                                            \
  do {                                                                                                                 \
    need->v = (value);                                                                                                 \
    need->c = (coords);                                                                                                \
    return false;                                                                                                      \
  } while (0)
#define DONE(r)                                                                                                        \
  do {                                                                                                                 \
    *res = (r);                                                                                                        \
    return true;                                                                                                       \
  } while (0)
  switch (n->op) {
  case OP_NEG: case OP_ABS: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_RSQRT: case OP_RECIPROCAL:
  case OP_TANH: case OP_SIGMOID: case OP_RELU: case OP_GELU: case OP_SILU: case OP_ERF: case OP_SIN:
  case OP_COS: case OP_FLOOR: case OP_CEIL: case OP_ROUND: case OP_SIGN: case OP_CAST:
    if (stage == 0) NEED(n->in[0], c);
    DONE(cg_unary(m, n, t0->dt, got));
  case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_POW: case OP_MAXIMUM: case OP_MINIMUM:
  case OP_LESS: case OP_GREATER: case OP_EQUAL: case OP_WHERE:
    /* operands broadcast to the result's coordinates, in order */
    if (stage > 0) fr->x[stage - 1] = got;
    if (stage < n->nin) {
      cg_bcast_coords(f, &g->val[n->in[stage]].type, ot->rank, c, fr->ic);
      NEED(n->in[stage], fr->ic);
    }
    if (n->op == OP_WHERE) DONE(LLVMBuildSelect(f->b, fr->x[0], fr->x[1], fr->x[2], ""));
    DONE(cg_binary(m, n->op, t0->dt, fr->x[0], fr->x[1]));
  case OP_BATCH_NORM:
    /* x at c, then scale, bias, mean and var at the channel c[1] */
    if (stage == 0) NEED(n->in[0], c);
    if (stage < 5) {
      fr->x[stage - 1] = got;
      NEED(n->in[stage], &c[1]);
    }
    DONE(batch_norm_end(f, n, fr->x, got));
  case OP_RESHAPE: case OP_SQUEEZE: case OP_UNSQUEEZE: case OP_TRANSPOSE: case OP_SLICE: case OP_SPLIT:
  case OP_EXPAND:
    if (stage > 0) DONE(got);
    if (n->op == OP_TRANSPOSE) {
      const Attr *p = ir_attr(n, "perm");
      for (int j = 0; j < ot->rank; j++) {
        int from = p ? ir_norm_axis(p->ints[j], ot->rank) : ot->rank - 1 - j;
        fr->ic[from] = c[j];
      }
    } else if (n->op == OP_SLICE) {
      int axis = ir_norm_axis(ir_attr_int(n, "axis"), t0->rank);
      int64_t step = ir_attr_int(n, "step"), start, end, len;
      ir_slice_bounds(t0->dim[axis], ir_attr_int(n, "start"), ir_attr_int(n, "end"), step, &start, &end, &len);
      memcpy(fr->ic, c, sizeof(LLVMValueRef) * (size_t)ot->rank);
      LLVMValueRef st0 = cg_i64(m, start);
      if (t0->dyn[axis]) {
        /* along a ranged axis (step 1, codegen/ranges.c) a start counted
         * from the end moves with this run's extent; one from the front
         * stays (clamped to the extent, as ir_slice_bounds does) */
        int64_t s0 = ir_attr_int(n, "start");
        LLVMValueRef e = cg_extent(f, t0, axis);
        st0 = s0 < 0 ? cg_add(f, e, cg_i64(m, s0)) : cg_min(f, cg_i64(m, s0), e);
        st0 = LLVMBuildSelect(f->b, LLVMBuildICmp(f->b, LLVMIntSLT, st0, cg_i64(m, 0), ""), cg_i64(m, 0), st0, "");
      }
      fr->ic[axis] = cg_add(f, st0, cg_mulc(f, c[axis], step));
    } else if (n->op == OP_SPLIT) {
      int axis = ir_norm_axis(ir_attr_int(n, "axis"), t0->rank);
      int64_t off = 0;
      for (int k = 0; k < out; k++) off += g->val[n->out[k]].type.dim[axis];
      memcpy(fr->ic, c, sizeof(LLVMValueRef) * (size_t)ot->rank);
      fr->ic[axis] = cg_add(f, c[axis], cg_i64(m, off));
    } else if (n->op == OP_EXPAND) {
      cg_bcast_coords(f, t0, ot->rank, c, fr->ic);
    } else {
      reshape_coords(f, t0, ot, c, fr->ic);
    }
    NEED(n->in[0], fr->ic);
  case OP_CONCAT:
    if (stage == 0) fr->k = n->nin - 1;
    else concat_take(f, n, ot, fr, got);
    if (concat_next(f, n, ot, fr, need, res)) return true;
    return false;
  case OP_GATHER: {
    /* the index first, then the data at the coordinates it names */
    int axis = ir_norm_axis(ir_attr_int(n, "axis"), t0->rank);
    if (stage == 0) NEED(n->in[1], c + axis);
    if (stage == 1) {
      gather_coords(f, n, fr, got);
      NEED(n->in[0], fr->ic);
    }
    DONE(got);
  }
  case OP_ROPE:
    if (stage == 0) {
      rope_begin(f, n, ot, fr);
      NEED(n->in[0], c);
    }
    if (stage == 1) {
      fr->x[3] = got;
      NEED(n->in[0], fr->ic);
    }
    if (stage == 2) {
      fr->x[4] = got;
      NEED(n->in[1], c + ot->rank - 2);
    }
    DONE(rope_end(f, n, ot, fr, fr->x[3], fr->x[4], got));
  case OP_DEQUANTIZE: {
    /* q at c, then scales (and zeros) at c with the axis coordinate divided
     * by the group; (q - z) * s in the result's compute type, rounded to
     * its dtype as the reference stores it */
    int axis = ir_norm_axis(ir_attr_int(n, "axis"), t0->rank);
    int64_t group = ir_attr_int(n, "group");
    if (stage == 0) NEED(n->in[0], c);
    if (stage == 1) {
      fr->x[0] = got;
      memcpy(fr->ic, c, sizeof(LLVMValueRef) * (size_t)ot->rank);
      fr->ic[axis] = group ? LLVMBuildUDiv(f->b, c[axis], cg_i64(m, group), "") : cg_i64(m, 0);
      NEED(n->in[1], fr->ic);
    }
    if (stage == 2 && n->nin > 2) {
      fr->x[1] = got;
      NEED(n->in[2], fr->ic);
    }
    LLVMValueRef sc = n->nin > 2 ? fr->x[1] : got, zero = n->nin > 2 ? got : NULL;
    DType cdt = ot->dt == DT_F64 ? DT_F64 : DT_F32, sdt = g->val[n->in[1]].type.dt;
    LLVMValueRef y = cg_convert(m, fr->x[0], t0->dt, cdt);
    if (zero) y = LLVMBuildFSub(f->b, y, cg_convert(m, zero, g->val[n->in[2]].type.dt, cdt), "");
    y = LLVMBuildFMul(f->b, y, cg_convert(m, sc, sdt, cdt), "");
    DONE(cg_convert(m, y, cdt, ot->dt));
  }
  default:
    cg_fail(m, ST_UNSUPPORTED, "kernel %s: node '%s' (%s) cannot be computed element by element; a kernel holds one "
            "reduction, contraction or attention node, its anchor", f->k->name, ir_node_name(g, n), ir_op_name(n->op));
    DONE(LLVMGetUndef(cg_ctype(m, ot->dt)));
  }
#undef NEED
#undef DONE
}

/* Whether coordinates a and b name the same element of a tensor of type t.
 * An axis of extent 1 has one coordinate whatever value stands for it: a
 * broadcast passes the constant 0 where the loop passes its counter (the
 * [2,1] result of [2,5] @ [5,1] read back by an add with b[1]; a conv2d
 * whose output is 1 wide), and those are the same element.  (A ranged
 * axis whose extent at its max is 1 has only that coordinate too.) */
static bool same_coords(const TensorType *t, LLVMValueRef const *a, LLVMValueRef const *b) {
  for (int i = 0; i < t->rank; i++)
    if (a[i] != b[i] && t->dim[i] != 1) return false;
  return true;
}

static void memo_put(CgFn *f, int v, LLVMValueRef const *c, LLVMValueRef r) {
  int rank = f->g->val[v].type.rank;
  if (f->nmemo == CG_MEMO_CAP) f->nmemo = 0; /* a full memo only costs duplicate code */
  CgMemo *e = &f->memo[f->nmemo++];
  e->value = v;
  e->rank = rank;
  memcpy(e->coords, c, sizeof(LLVMValueRef) * (size_t)rank);
  e->result = r;
}

/* v[c] when it needs no operand: the anchor's override, a memoised value,
 * a constant, an argument, or an error.  False when v is a member's result
 * still to compute. */
static bool emit_leaf(CgFn *f, int v, LLVMValueRef const *c, LLVMValueRef *out) {
  CgMod *m = f->m;
  const Value *val = &f->g->val[v];
  LLVMTypeRef ct = cg_ctype(m, val->type.dt);
  *out = LLVMGetUndef(ct);
  if (m->err) return true;
  if (v == f->ov_value) {
    if (!same_coords(&val->type, c, f->ov_coords)) {
      cg_fail(m, ST_UNSUPPORTED,
              "kernel %s: the epilogue reads '%s' at other coordinates than it writes (a reshape, transpose or "
              "broadcast after the anchor); such a consumer cannot be fused",
              f->k->name, val->name);
      return true;
    }
    *out = f->ov_result;
    return true;
  }
  for (int i = f->nmemo - 1; i >= 0; i--)
    if (f->memo[i].value == v && same_coords(&val->type, f->memo[i].coords, c)) {
      *out = f->memo[i].result;
      return true;
    }
  if (val->kind == VK_CONST && ir_type_numel(&val->type) == 1 && val->data) {
    *out = const_scalar(m, val);
  } else if (f->arg_of[v] >= 0) {
    *out = cg_load_arg(f, f->arg_of[v], cg_linear(f, &val->type, c));
  } else if (val->kind == VK_NODE && f->member[val->node]) {
    if (val->node != f->anchor) return false;
    cg_fail(m, ST_UNSUPPORTED, "kernel %s: '%s' is read outside the epilogue of its kernel", f->k->name, val->name);
    return true;
  } else {
    cg_fail(m, ST_INTERNAL, "kernel %s: '%s' is neither an argument nor computed by the kernel", f->k->name, val->name);
    return true;
  }
  memo_put(f, v, c, *out);
  return true;
}

#define EMIT_LOCAL_FRAMES 16

LLVMValueRef cg_emit(CgFn *f, int v, LLVMValueRef const *c) {
  CgMod *m = f->m;
  LLVMValueRef r;
  if (emit_leaf(f, v, c, &r)) return r;
  EmitFrame local[EMIT_LOCAL_FRAMES], *st = local;
  size_t n = 0, cap = EMIT_LOCAL_FRAMES;
  int want_v = v;
  LLVMValueRef want_c[IR_MAX_RANK];
  memcpy(want_c, c, sizeof(LLVMValueRef) * (size_t)f->g->val[v].type.rank);
  LLVMValueRef got = NULL;
  for (;;) {
    /* push the member want_v at want_c */
    if (n == cap) {
      size_t ncap = cap * 2;
      EmitFrame *ns = st == local ? malloc(sizeof *ns * ncap) : realloc(st, sizeof *ns * ncap);
      if (!ns) {
        cg_fail(m, ST_NO_MEMORY, "kernel %s: out of memory for an expression %zu members deep", f->k->name, n);
        r = LLVMGetUndef(cg_ctype(m, f->g->val[v].type.dt));
        break;
      }
      if (st == local) memcpy(ns, local, sizeof local);
      st = ns;
      cap = ncap;
    }
    EmitFrame *fr = &st[n++];
    fr->v = want_v;
    memcpy(fr->c, want_c, sizeof(LLVMValueRef) * (size_t)f->g->val[want_v].type.rank);
    fr->stage = fr->k = 0;
    memset(fr->x, 0, sizeof fr->x);
    got = NULL;
    /* run frames until one needs a member that is not computed yet */
    bool pushed = false;
    while (!pushed) {
      EmitFrame *top = &st[n - 1];
      EmitNeed need;
      if (node_step(f, top, got, &need, &r)) {
        memo_put(f, top->v, top->c, r);
        got = r;
        if (--n == 0) break;
        continue;
      }
      if (m->err) {
        n = 0;
        r = LLVMGetUndef(cg_ctype(m, f->g->val[v].type.dt));
        break;
      }
      if (!emit_leaf(f, need.v, need.c, &got)) {
        want_v = need.v;
        memcpy(want_c, need.c, sizeof(LLVMValueRef) * (size_t)f->g->val[need.v].type.rank);
        pushed = true;
      }
    }
    if (n == 0) break;
  }
  if (st != local) free(st);
  return r;
}

/* ---- storing results ---- */

static int out_arg(CgFn *f, int v) {
  for (int i = f->nin; i < f->k->nargs; i++)
    if (f->k->args[i] == v) return i;
  return -1;
}

void cg_store_value(CgFn *f, int v, LLVMValueRef const *c) {
  int arg = out_arg(f, v);
  if (arg < 0) {
    cg_fail(f->m, ST_INTERNAL, "kernel %s: '%s' is not an output", f->k->name, f->g->val[v].name);
    return;
  }
  LLVMValueRef x = cg_emit(f, v, c);
  if (f->m->err) return;
  cg_store_arg(f, arg, cg_linear(f, &f->g->val[v].type, c), x);
}

const TensorType *cg_anchor_type(CgFn *f) { return &f->g->val[f->g->node[f->anchor].out[0]].type; }

void cg_store_epilogue(CgFn *f, LLVMValueRef const *c, LLVMValueRef anchor_value) {
  const TensorType *at = cg_anchor_type(f);
  int mark = f->nmemo;
  f->ov_value = f->g->node[f->anchor].out[0];
  f->ov_result = anchor_value;
  memcpy(f->ov_coords, c, sizeof(LLVMValueRef) * (size_t)at->rank);
  for (int i = 0; i < f->nepi; i++) cg_store_value(f, f->epi[i], c);
  f->ov_value = -1;
  /* what was computed from this anchor value must not be reused for the
   * next one at the same coordinates */
  f->nmemo = mark;
}

void cg_store_loops(CgFn *f, const int *vals, int n) {
  CgMod *m = f->m;
  Graph *g = f->g;
  bool done[256] = {false};
  if (n > 256) {
    cg_fail(m, ST_UNSUPPORTED, "kernel %s: more than 256 results", f->k->name);
    return;
  }
  for (int i = 0; i < n; i++) {
    if (done[i]) continue;
    /* results of the same shape share one loop nest (and their common
     * subexpressions) */
    const TensorType *t = &g->val[vals[i]].type;
    int same[256], ns = 0;
    for (int j = i; j < n; j++) {
      const TensorType *u = &g->val[vals[j]].type;
      if (done[j] || u->rank != t->rank || memcmp(u->dim, t->dim, sizeof(int64_t) * (size_t)t->rank) != 0) continue;
      same[ns++] = vals[j];
      done[j] = true;
    }
    CgSpace sp;
    cg_elemwise_space(t, &sp);
    int64_t total = sp.rows * sp.nchunks;
    if (total == 0) continue;
    if (!cg_same_task_rows(f->k, t)) {
      char ty[128];
      cg_fail(m, ST_UNSUPPORTED, "kernel %s: result '%s' %s is stored over tasks that do not follow its ranged dim; "
              "compile exact values of the dim instead", f->k->name, g->val[vals[i]].name, ir_type_str(t, ty, sizeof ty));
      return;
    }
    LLVMValueRef tb, te;
    cg_task_span(f, f->k->ntasks, total, &tb, &te);
    CgLoop lt;
    LLVMValueRef task = cg_loop_begin(f, &lt, tb, te, "task");
    LLVMValueRef c[IR_MAX_RANK];
    if (t->rank == 0) {
      for (int s = 0; s < ns; s++) cg_store_value(f, same[s], c);
    } else {
      LLVMValueRef row = task, j0 = cg_i64(m, 0), j1 = cg_i64(m, sp.inner);
      if (sp.nchunks > 1) {
        LLVMValueRef nch = cg_i64(m, sp.nchunks);
        row = LLVMBuildUDiv(f->b, task, nch, "");
        j0 = cg_mulc(f, LLVMBuildURem(f->b, task, nch, ""), sp.chunk);
        j1 = cg_min(f, cg_add(f, j0, cg_i64(m, sp.chunk)), cg_i64(m, sp.inner));
      }
      cg_delinearize(f, row, t->dim, t->rank - 1, c);
      CgLoop lj;
      /* in place, the output is the input element for element: the
       * iterations stay independent */
      c[t->rank - 1] = f->in_place && f->anchor < 0 ? cg_loop_begin_parallel(f, &lj, j0, j1, "j")
                                                    : cg_loop_begin(f, &lj, j0, j1, "j");
      for (int s = 0; s < ns; s++) cg_store_value(f, same[s], c);
      cg_loop_end(f, &lj, false);
    }
    cg_loop_end(f, &lt, false);
  }
}

smelt_status cg_llvm_emit_elemwise(CgFn *f) {
  cg_store_loops(f, f->side, f->nside);
  return NULL;
}
