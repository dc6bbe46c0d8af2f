/* ONNX operators onto smelt ops: one converter per ONNX op_type.
 *
 * Most ONNX ops have a smelt op of the same meaning (Add -> add, Conv ->
 * conv2d, LayerNormalization over the last axis -> layer_norm).  Those that
 * do not are written out in smelt ops, never as new IR ops:
 *   - operands that ONNX passes as tensors but smelt takes as attributes
 *     (Reshape's shape, Slice's starts, Unsqueeze's axes, Pad's pads) must
 *     be constant by the time the node is reached, which they are for the
 *     shape arithmetic exporters emit: onnx.c folds it as it goes;
 *   - index computations with constant indices become gathers with index
 *     tables computed here (Pad's edge/reflect modes, Resize, GatherElements,
 *     ScatterND), with a `where` for the positions an update covers;
 *   - the rest are short compositions: HardSwish = x * clip(x/6 + 1/2),
 *     ArgMax = min over where(x == max(x), iota, n), Tile = reshape ->
 *     expand -> reshape, Trilu = where(constant mask, x, 0), RotaryEmbedding
 *     from its cos/sin caches with slices, muls and a concat;
 *   - ConvTranspose is a stride-1 conv2d over the input with zeros spread
 *     between its pixels, its weight flipped here (so it must be constant);
 *     3-D Conv and ConvTranspose a sum of conv2d over the depth taps;
 *     Einsum one matmul between transposes and reshapes per pair of
 *     operands; ReduceProd halving slices multiplied together; integer Mod
 *     from the truncating integer div.
 * Ops that only exist to compute at import time (Shape, Size, Range,
 * ConstantOfShape, Constant) produce constants directly.
 *
 * The table at the end lists each op_type with the attributes its converter
 * understands; a node with any other attribute is refused by name, so an
 * attribute that would change the result is never silently ignored.
 */
#ifndef SMELT_HAVE_ONNX
typedef int onnx_ops_not_built; /* built without protobuf-c: onnx.c answers ST_UNSUPPORTED */
#else

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx_internal.h"

#define MAXV 64 /* constant int lists (shapes, axes, pads) */

static const char *out0(OnnxImporter *im) { return on_out_name(im, 0); }
static int rank_of(OnnxImporter *im, int v) { return on_type(im, v)->rank; }

static smelt_status norm_axis(OnnxImporter *im, int64_t axis, int rank, const char *what, int *out) {
  *out = ir_norm_axis(axis, rank);
  if (*out < 0) return on_err(im, "%s %lld is out of range for rank %d", what, (long long)axis, rank);
  return NULL;
}

static smelt_status bind0(OnnxImporter *im, int v) { return on_bind(im, 0, v); }

/* x of rank r reshaped so that axis `axis` has size n and every other axis 1:
 * the shape a per-axis table broadcasts in. */
static int axis_table(OnnxImporter *im, DType dt, int rank, int axis, const double *vals, int64_t n) {
  TensorType t = {.dt = dt, .rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = i == axis ? n : 1;
  int v = on_const(im, NULL, t, NULL);
  for (int64_t i = 0; i < n; i++) dt_store(dt, im->g->val[v].data, (size_t)i, vals[i]);
  return v;
}

static smelt_status idx_table(OnnxImporter *im, const int64_t *idx, int64_t n, int *out) {
  TensorType t = {.dt = DT_I64, .rank = 1, .dim = {n}};
  *out = on_const(im, NULL, t, idx);
  return NULL;
}

static smelt_status expand_to(OnnxImporter *im, int x, const int64_t *shape, int rank, const char *name, int *out) {
  int id = on_node(im, OP_EXPAND, 1, &x, name);
  ir_set_attr_ints(im->g, id, "shape", shape, rank);
  return on_done(im, id, out);
}

static smelt_status reduce(OnnxImporter *im, Op op, int x, const int64_t *axes, int naxes, bool keep,
                           const char *name, int *out) {
  int id = on_node(im, op, 1, &x, name);
  if (axes) ir_set_attr_ints(im->g, id, "axes", axes, naxes);
  ir_set_attr_bool(im->g, id, "keepdims", keep);
  return on_done(im, id, out);
}

/* ---- elementwise ---- */

static const struct {
  const char *onnx;
  Op op;
} unary_ops[] = {
    {"Neg", OP_NEG},   {"Abs", OP_ABS},   {"Exp", OP_EXP},         {"Log", OP_LOG},       {"Sqrt", OP_SQRT},
    {"Tanh", OP_TANH}, {"Relu", OP_RELU}, {"Sigmoid", OP_SIGMOID}, {"Erf", OP_ERF},       {"Sin", OP_SIN},
    {"Cos", OP_COS},   {"Reciprocal", OP_RECIPROCAL}, {"Floor", OP_FLOOR}, {"Ceil", OP_CEIL}, {"Round", OP_ROUND},
    {"Sign", OP_SIGN},
}, binary_ops[] = {
    {"Add", OP_ADD},     {"Sub", OP_SUB},   {"Mul", OP_MUL},         {"Div", OP_DIV}, {"Pow", OP_POW},
    {"Equal", OP_EQUAL}, {"Less", OP_LESS}, {"Greater", OP_GREATER},
};

static smelt_status cv_unary(OnnxImporter *im) {
  int x, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  for (size_t i = 0; i < sizeof unary_ops / sizeof unary_ops[0]; i++)
    if (!strcmp(unary_ops[i].onnx, im->node->op_type)) {
      RETURN_IF_ERROR(on_op1(im, unary_ops[i].op, x, out0(im), &y));
      return bind0(im, y);
    }
  return on_err(im, "internal: no unary op");
}

static smelt_status cv_binary(OnnxImporter *im) {
  int a, b, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &a));
  RETURN_IF_ERROR(on_in_req(im, 1, &b));
  bool pow = !strcmp(im->node->op_type, "Pow");
  /* Pow alone lets the exponent have its own type */
  if (pow && on_type(im, b)->dt != on_type(im, a)->dt) RETURN_IF_ERROR(on_cast(im, b, on_type(im, a)->dt, NULL, &b));
  for (size_t i = 0; i < sizeof binary_ops / sizeof binary_ops[0]; i++)
    if (!strcmp(binary_ops[i].onnx, im->node->op_type)) {
      RETURN_IF_ERROR(on_op2(im, binary_ops[i].op, a, b, out0(im), &y));
      return bind0(im, y);
    }
  return on_err(im, "internal: no binary op");
}

/* Max, Min, Sum, Mean: any number of operands, broadcasting. */
static smelt_status cv_variadic(OnnxImporter *im) {
  const char *t = im->node->op_type;
  Op op = !strcmp(t, "Max") ? OP_MAXIMUM : !strcmp(t, "Min") ? OP_MINIMUM : OP_ADD;
  bool mean = !strcmp(t, "Mean");
  int n = on_nin(im), acc;
  if (n < 1) return on_err(im, "needs at least one input");
  RETURN_IF_ERROR(on_in_req(im, 0, &acc));
  for (int i = 1; i < n; i++) {
    int b;
    RETURN_IF_ERROR(on_in_req(im, i, &b));
    RETURN_IF_ERROR(on_op2(im, op, acc, b, i == n - 1 && !mean ? out0(im) : NULL, &acc));
  }
  if (mean && n > 1) RETURN_IF_ERROR(on_op2(im, OP_DIV, acc, on_scalar(im, on_type(im, acc)->dt, n), out0(im), &acc));
  return bind0(im, acc);
}

static smelt_status cv_identity(OnnxImporter *im) {
  int x;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  return bind0(im, x);
}

static smelt_status cv_dropout(OnnxImporter *im) {
  int x, tm = on_in(im, 2);
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  if (tm >= 0) {
    double v;
    RETURN_IF_ERROR(on_const_scalar(im, tm, "training_mode", &v));
    if (v != 0) return on_unsupported(im, "training_mode must be false (smelt runs inference)");
  }
  RETURN_IF_ERROR(on_no_extra_outputs(im, 1));
  return bind0(im, x);
}

static smelt_status cast_to(OnnxImporter *im, int x, DType to) {
  int y;
  if (on_type(im, x)->dt == to) return bind0(im, x);
  RETURN_IF_ERROR(on_cast(im, x, to, out0(im), &y));
  return bind0(im, y);
}

static smelt_status cv_cast(OnnxImporter *im) {
  int x;
  int64_t to;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_int(im, "to", -1, &to));
  DType dt = onnx_dtype(im, to);
  if (dt == DT_INVALID) return on_unsupported(im, "cast to %s: smelt has no such dtype", onnx_dtype_name(to));
  if (dt_is_storage_only(dt))
    return on_unsupported(im, "cast to %s: smelt keeps that type for quantised weights (DequantizeLinear) only",
                          onnx_dtype_name(to));
  return cast_to(im, x, dt);
}

static smelt_status cv_castlike(OnnxImporter *im) {
  int x, like;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &like));
  return cast_to(im, x, on_type(im, like)->dt);
}

static smelt_status not_of(OnnxImporter *im, int x, const char *name, int *out) {
  return on_op2(im, OP_EQUAL, x, on_scalar(im, DT_BOOL, 0), name, out);
}

static smelt_status need_bool(OnnxImporter *im, int v) {
  if (on_type(im, v)->dt != DT_BOOL) return on_err(im, "operands must be bool, got %s", dt_name(on_type(im, v)->dt));
  return NULL;
}

/* Not, And, Or, Xor, LessOrEqual, GreaterOrEqual from where/equal/less/greater. */
static smelt_status cv_logic(OnnxImporter *im) {
  const char *t = im->node->op_type;
  int a, b = -1, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &a));
  if (strcmp(t, "Not") != 0) RETURN_IF_ERROR(on_in_req(im, 1, &b));
  if (!strcmp(t, "Not")) {
    RETURN_IF_ERROR(need_bool(im, a));
    RETURN_IF_ERROR(not_of(im, a, out0(im), &y));
  } else if (!strcmp(t, "And") || !strcmp(t, "Or")) {
    RETURN_IF_ERROR(need_bool(im, a));
    RETURN_IF_ERROR(need_bool(im, b));
    bool and_ = !strcmp(t, "And");
    int c = on_scalar(im, DT_BOOL, and_ ? 0 : 1);
    RETURN_IF_ERROR(on_op3(im, OP_WHERE, a, and_ ? b : c, and_ ? c : b, out0(im), &y));
  } else if (!strcmp(t, "Xor")) {
    RETURN_IF_ERROR(need_bool(im, a));
    RETURN_IF_ERROR(need_bool(im, b));
    RETURN_IF_ERROR(on_op2(im, OP_EQUAL, a, b, NULL, &y));
    RETURN_IF_ERROR(not_of(im, y, out0(im), &y));
  } else {
    /* a <= b is (a < b) or (a == b): false for a NaN operand, as ONNX says
     * (not (a > b) would be true) */
    int lt, eq;
    RETURN_IF_ERROR(on_op2(im, !strcmp(t, "LessOrEqual") ? OP_LESS : OP_GREATER, a, b, NULL, &lt));
    RETURN_IF_ERROR(on_op2(im, OP_EQUAL, a, b, NULL, &eq));
    RETURN_IF_ERROR(on_op3(im, OP_WHERE, lt, on_scalar(im, DT_BOOL, 1), eq, out0(im), &y));
  }
  return bind0(im, y);
}

/* IsNaN(x) is not (x == x); IsInf(x) is |x| == inf, narrowed to one sign
 * by detect_negative / detect_positive. */
static smelt_status cv_isnan_isinf(OnnxImporter *im) {
  int x, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  DType dt = on_type(im, x)->dt;
  if (!dt_is_float(dt)) return on_err(im, "operand must be a float tensor, got %s", dt_name(dt));
  if (!strcmp(im->node->op_type, "IsNaN")) {
    RETURN_IF_ERROR(on_op2(im, OP_EQUAL, x, x, NULL, &y));
    RETURN_IF_ERROR(not_of(im, y, out0(im), &y));
    return bind0(im, y);
  }
  int64_t neg, pos;
  RETURN_IF_ERROR(on_attr_int(im, "detect_negative", 1, &neg));
  RETURN_IF_ERROR(on_attr_int(im, "detect_positive", 1, &pos));
  if (neg && pos) {
    RETURN_IF_ERROR(on_op1(im, OP_ABS, x, NULL, &y));
    RETURN_IF_ERROR(on_op2(im, OP_EQUAL, y, on_scalar(im, dt, INFINITY), out0(im), &y));
  } else if (neg || pos) {
    RETURN_IF_ERROR(on_op2(im, OP_EQUAL, x, on_scalar(im, dt, pos ? INFINITY : -INFINITY), out0(im), &y));
  } else { /* detects nothing: all false, shaped as x */
    RETURN_IF_ERROR(on_op2(im, OP_EQUAL, x, x, NULL, &y));
    RETURN_IF_ERROR(on_op3(im, OP_WHERE, y, on_scalar(im, DT_BOOL, 0), on_scalar(im, DT_BOOL, 0), out0(im), &y));
  }
  return bind0(im, y);
}

/* A DequantizeLinear scale or zero point brought to the shape smelt's
 * dequantize takes for (axis, group): reshaped to `shaped` (rank of x) and
 * expanded to `want`. */
static smelt_status dq_operand(OnnxImporter *im, int v, const TensorType *shaped, const TensorType *want, int *out) {
  if (v < 0) return (*out = -1), NULL;
  if (ir_is_const(im->g, v)) { /* broadcast here: an INT4 zero point has no reshape or expand */
    TensorType t = *want;
    t.dt = on_type(im, v)->dt;
    int c = on_const(im, NULL, t, NULL);
    if (!im->g->val[c].data) return st_error(ST_NO_MEMORY, "out of memory");
    const void *src = im->g->val[v].data;
    int64_t n = ir_type_numel(&t);
    for (int64_t e = 0; e < n; e++) {
      int64_t rest = e, from = 0, stride = 1;
      for (int d = t.rank - 1; d >= 0; d--) {
        int64_t i = rest % t.dim[d];
        rest /= t.dim[d];
        if (shaped->dim[d] != 1) from += i * stride;
        stride *= shaped->dim[d];
      }
      dt_store(t.dt, im->g->val[c].data, (size_t)e, dt_load(t.dt, src, (size_t)from));
    }
    *out = c;
    return NULL;
  }
  RETURN_IF_ERROR(on_reshape(im, v, shaped->dim, shaped->rank, NULL, &v));
  if (memcmp(shaped->dim, want->dim, sizeof(int64_t) * (size_t)want->rank) != 0)
    RETURN_IF_ERROR(expand_to(im, v, want->dim, want->rank, NULL, &v));
  *out = v;
  return NULL;
}

/* DequantizeLinear(x, scale, zero_point?) = (x - zero_point) * scale, as
 * smelt's dequantize op, so that a constant x (a quantised weight) stays
 * quantised through const-fold and reaches the fused kernels: per tensor
 * (a scalar scale), per axis (scale [D] along `axis`), or blocked (opset
 * 21's block_size: the scale has x's shape with D / block_size along
 * axis).  smelt's form holds a scale for every element but along one axis
 * (group 0: one for the whole axis, else one per `group` elements), so the
 * first two are expanded to it.  Activation quantisation (QuantizeLinear)
 * has no smelt op. */
static smelt_status cv_dequantize_linear(OnnxImporter *im) {
  int x, s, z = on_in(im, 2), y;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &s));
  TensorType xt = *on_type(im, x), sc = *on_type(im, s);
  if (!(xt.dt == DT_I8 || xt.dt == DT_U8 || dt_is_storage_only(xt.dt)))
    return on_unsupported(im, "input of type %s (smelt dequantizes INT8, UINT8, INT4, UINT4, FLOAT8E4M3FN, FLOAT8E5M2)",
                          dt_name(xt.dt));
  if (xt.rank < 1) return on_unsupported(im, "a scalar input");
  if (!dt_is_float(sc.dt)) return on_err(im, "x_scale must be floating point, got %s", dt_name(sc.dt));
  if (z >= 0 && on_type(im, z)->dt != xt.dt)
    return on_err(im, "x_zero_point has type %s, x %s: they must match", dt_name(on_type(im, z)->dt), dt_name(xt.dt));
  if (z >= 0 && (on_type(im, z)->rank != sc.rank ||
                 memcmp(on_type(im, z)->dim, sc.dim, sizeof(int64_t) * (size_t)sc.rank) != 0))
    return on_err(im, "x_zero_point's shape differs from x_scale's");
  if (z >= 0 && dt_is_storage_only(xt.dt) && !ir_is_const(im->g, z))
    return on_unsupported(im, "a computed x_zero_point of type %s (give it as an initializer)", dt_name(xt.dt));
  int64_t axis, block;
  RETURN_IF_ERROR(on_attr_int(im, "axis", 1, &axis));
  RETURN_IF_ERROR(on_attr_int(im, "block_size", 0, &block));
  int r = xt.rank, a = ir_norm_axis(axis, r);
  int64_t sn = ir_type_numel(&sc);
  TensorType shaped = xt, want = xt; /* the operands' shape after the reshape, and smelt's */
  shaped.dt = want.dt = sc.dt;
  int sm_axis;
  int64_t group;
  if (block > 0) {
    if (a < 0) return on_err(im, "axis %lld is out of range for rank %d", (long long)axis, r);
    if (xt.dim[a] % block != 0)
      return on_unsupported(im, "block_size %lld does not divide the %lld elements along axis %d (smelt's groups must)",
                            (long long)block, (long long)xt.dim[a], a);
    want.dim[a] = xt.dim[a] / block;
    if (sc.rank != r || memcmp(sc.dim, want.dim, sizeof(int64_t) * (size_t)r) != 0)
      return on_err(im, "blocked x_scale must have x's shape with %lld along axis %d", (long long)want.dim[a], a);
    shaped = want;
    sm_axis = a, group = block;
  } else if (sn == 1 && sc.rank <= 1) { /* per tensor */
    for (int d = 0; d < r; d++) shaped.dim[d] = 1;
    want.dim[r - 1] = 1;
    sm_axis = r - 1, group = 0;
  } else if (sc.rank == 1) { /* per axis */
    if (a < 0) return on_err(im, "axis %lld is out of range for rank %d", (long long)axis, r);
    if (sc.dim[0] != xt.dim[a])
      return on_err(im, "per-axis x_scale has %lld elements, axis %d of x %lld", (long long)sc.dim[0], a,
                    (long long)xt.dim[a]);
    for (int d = 0; d < r; d++) shaped.dim[d] = d == a ? xt.dim[a] : 1;
    if (r == 1) {
      sm_axis = 0, group = 1;
    } else {
      sm_axis = a == r - 1 ? r - 2 : r - 1, group = 0;
      want.dim[sm_axis] = 1;
    }
  } else {
    return on_err(im, "x_scale of rank %d: DequantizeLinear takes a scalar, a 1-D (per axis) or, with block_size, "
                  "an x-shaped (blocked) scale", sc.rank);
  }
  int in[3];
  in[0] = x;
  RETURN_IF_ERROR(dq_operand(im, s, &shaped, &want, &in[1]));
  TensorType zshaped = shaped, zwant = want;
  zshaped.dt = zwant.dt = xt.dt;
  RETURN_IF_ERROR(dq_operand(im, z, &zshaped, &zwant, &in[2]));
  int id = on_node(im, OP_DEQUANTIZE, z >= 0 ? 3 : 2, in, out0(im));
  ir_set_attr_int(im->g, id, "axis", sm_axis);
  ir_set_attr_int(im->g, id, "group", group);
  RETURN_IF_ERROR(on_done(im, id, &y));
  return bind0(im, y);
}

/* QuantizeLinear(x, y_scale, y_zero_point?) = saturate(round(x / y_scale)
 * + y_zero_point): activation quantisation, as QDQ models carry it before
 * a DequantizeLinear.  Built from smelt's ops in x's float type: div,
 * round (ties to even, as ONNX asks), add of the zero point, clamp to the
 * integer range, cast (exact: the value is integral and in range).  The
 * scale is per tensor or per axis (1-D along `axis`); the result is INT8 or
 * UINT8 (the zero point's type, else output_dtype, else UINT8).  Blocked
 * scales (block_size) and the storage-only results (INT4, UINT4, FLOAT8,
 * which no smelt node makes) are refused. */
static smelt_status cv_quantize_linear(OnnxImporter *im) {
  int x, s, z = on_in(im, 2), y;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &s));
  TensorType xt = *on_type(im, x), sc = *on_type(im, s);
  if (!dt_is_float(xt.dt)) return on_err(im, "x must be floating point, got %s", dt_name(xt.dt));
  if (!dt_is_float(sc.dt)) return on_err(im, "y_scale must be floating point, got %s", dt_name(sc.dt));
  int64_t axis, block, odt, sat;
  RETURN_IF_ERROR(on_attr_int(im, "axis", 1, &axis));
  RETURN_IF_ERROR(on_attr_int(im, "block_size", 0, &block));
  RETURN_IF_ERROR(on_attr_int(im, "output_dtype", 0, &odt));
  RETURN_IF_ERROR(on_attr_int(im, "saturate", 1, &sat)); /* float8 only */
  if (block > 0) return on_unsupported(im, "blocked scales (block_size %lld) for an activation", (long long)block);
  DType to = z >= 0 ? on_type(im, z)->dt : odt ? onnx_dtype(im, odt) : DT_U8;
  if (z >= 0 && odt && onnx_dtype(im, odt) != to)
    return on_err(im, "output_dtype %s differs from y_zero_point's type %s", onnx_dtype_name(odt), dt_name(to));
  if (to != DT_I8 && to != DT_U8)
    return on_unsupported(im, "a result of type %s (smelt quantises activations to INT8 and UINT8)",
                          odt && z < 0 ? onnx_dtype_name(odt) : dt_name(to));
  int r = xt.rank;
  int64_t bshape[IR_MAX_RANK];
  bool per_axis = ir_type_numel(&sc) != 1 || sc.rank > 1;
  if (per_axis) {
    int a = ir_norm_axis(axis, r);
    if (a < 0) return on_err(im, "axis %lld is out of range for rank %d", (long long)axis, r);
    if (sc.rank != 1 || sc.dim[0] != xt.dim[a])
      return on_err(im, "y_scale must be a scalar or 1-D with x's %lld elements along axis %d", (long long)xt.dim[a], a);
    for (int d = 0; d < r; d++) bshape[d] = d == a ? xt.dim[a] : 1;
  }
  if (z >= 0) {
    const TensorType *zt = on_type(im, z);
    if (zt->rank != sc.rank || memcmp(zt->dim, sc.dim, sizeof(int64_t) * (size_t)sc.rank) != 0)
      return on_err(im, "y_zero_point's shape differs from y_scale's");
  }
  if (per_axis) RETURN_IF_ERROR(on_reshape(im, s, bshape, r, NULL, &s));
  if (sc.dt != xt.dt) RETURN_IF_ERROR(on_cast(im, s, xt.dt, NULL, &s));
  RETURN_IF_ERROR(on_op2(im, OP_DIV, x, s, NULL, &y));
  RETURN_IF_ERROR(on_op1(im, OP_ROUND, y, NULL, &y));
  if (z >= 0) {
    int zf;
    if (per_axis) RETURN_IF_ERROR(on_reshape(im, z, bshape, r, NULL, &z));
    RETURN_IF_ERROR(on_cast(im, z, xt.dt, NULL, &zf));
    RETURN_IF_ERROR(on_op2(im, OP_ADD, y, zf, NULL, &y));
  }
  RETURN_IF_ERROR(on_op2(im, OP_MAXIMUM, y, on_scalar(im, xt.dt, to == DT_I8 ? -128 : 0), NULL, &y));
  RETURN_IF_ERROR(on_op2(im, OP_MINIMUM, y, on_scalar(im, xt.dt, to == DT_I8 ? 127 : 255), NULL, &y));
  RETURN_IF_ERROR(on_cast(im, y, to, out0(im), &y));
  return bind0(im, y);
}

/* com.microsoft MatMulNBits(A, B, scales, zero_points?, g_idx?, bias?):
 * ONNX Runtime's weight-only INT4/INT8 matmul, Y = A @ W^T with W [N, K]
 * dequantised per block of `block_size` elements along K:
 *   B            uint8 [N, K/block_size, block_size * bits / 8]: row n's
 *                codes in K order, two 4-bit codes a byte, low nibble first
 *                (which is smelt's packed u4 [N, K] byte for byte);
 *   scales       [N * K/block_size] or [N, K/block_size];
 *   zero_points  uint8, packed like B along each row (ceil(blocks * bits / 8)
 *                bytes a row), or of the scales' type; absent: 2^(bits-1).
 * It becomes matmul(A, dequantize(Wq, S[, Z]), transpose_b), the layout the
 * quantised kernels stream (passes/quantize.c).  Without zero points the
 * codes are stored signed (code - 2^(bits-1): i4 or i8, the bits' top bit
 * flipped), so the symmetric kernels take them; with uint8 zero points they
 * stay u4/u8 with u4/u8 zeros.  B and zero_points must be initializers; a
 * g_idx must be the trivial k / block_size (act-order would need K
 * permuted); K must be a multiple of block_size (ORT pads the last block;
 * smelt's groups are all full). */
static smelt_status cv_matmul_nbits(OnnxImporter *im) {
  int a, b, s, z = on_in(im, 3), gi = on_in(im, 4), bias = on_in(im, 5), y;
  RETURN_IF_ERROR(on_in_req(im, 0, &a));
  RETURN_IF_ERROR(on_in_req(im, 1, &b));
  RETURN_IF_ERROR(on_in_req(im, 2, &s));
  int64_t K, N, bits, block, acc;
  RETURN_IF_ERROR(on_attr_int(im, "K", -1, &K));
  RETURN_IF_ERROR(on_attr_int(im, "N", -1, &N));
  RETURN_IF_ERROR(on_attr_int(im, "bits", 4, &bits));
  RETURN_IF_ERROR(on_attr_int(im, "block_size", -1, &block));
  RETURN_IF_ERROR(on_attr_int(im, "accuracy_level", 0, &acc)); /* a precision hint: smelt accumulates in f32 */
  if (K < 1 || N < 1) return on_err(im, "attributes K and N are required and must be positive");
  if (bits != 4 && bits != 8) return on_unsupported(im, "bits=%lld (smelt imports 4 and 8)", (long long)bits);
  if (block < 16 || (block & (block - 1))) return on_err(im, "block_size %lld must be a power of 2 >= 16", (long long)block);
  if (K % block)
    return on_unsupported(im, "K=%lld is not a multiple of block_size %lld (smelt's groups must all be full)",
                          (long long)K, (long long)block);
  TensorType at = *on_type(im, a), bt = *on_type(im, b), st = *on_type(im, s);
  int64_t nb = K / block, blob = block * bits / 8;
  if (!dt_is_float(at.dt) || at.rank < 1 || at.dim[at.rank - 1] != K)
    return on_err(im, "A must be floating point with K=%lld elements along its last axis", (long long)K);
  if (bt.dt != DT_U8 || bt.rank != 3 || bt.dim[0] != N || bt.dim[1] != nb || bt.dim[2] != blob)
    return on_err(im, "B must be uint8 [N, K/block_size, block_size*bits/8] = [%lld, %lld, %lld]", (long long)N,
                  (long long)nb, (long long)blob);
  if (!on_is_const(im, b)) return on_unsupported(im, "a computed B (give the packed weight as an initializer)");
  if (!dt_is_float(st.dt) || ir_type_numel(&st) != N * nb || !(st.rank == 1 || (st.rank == 2 && st.dim[0] == N)))
    return on_err(im, "scales must be floating point [N * K/block_size] or [N, K/block_size] = %lld values",
                  (long long)(N * nb));
  bool zpacked = false;
  if (z >= 0) {
    TensorType zt = *on_type(im, z);
    int64_t rowb = (nb * bits + 7) / 8;
    if (zt.dt == DT_U8) {
      if (ir_type_numel(&zt) != N * rowb)
        return on_err(im, "uint8 zero_points must hold N * ceil(blocks * bits / 8) = %lld bytes, not %lld",
                      (long long)(N * rowb), (long long)ir_type_numel(&zt));
      if (!on_is_const(im, z)) return on_unsupported(im, "computed uint8 zero_points (give them as an initializer)");
      zpacked = true;
    } else if (zt.dt != st.dt || ir_type_numel(&zt) != N * nb) {
      return on_err(im, "zero_points must be uint8 (packed) or of the scales' type with N * K/block_size values");
    }
  }
  if (gi >= 0) { /* only the trivial order is a plain blocked layout */
    TensorType gt = *on_type(im, gi);
    if (!on_is_const(im, gi) || !dt_is_int(gt.dt) || ir_type_numel(&gt) != K)
      return on_unsupported(im, "g_idx must be a constant integer tensor of K elements");
    for (int64_t k = 0; k < K; k++)
      if ((int64_t)dt_load(gt.dt, im->g->val[gi].data, (size_t)k) != k / block)
        return on_unsupported(im, "g_idx with act-order (element %lld is in group %lld, not %lld): smelt's groups are "
                              "contiguous runs along K", (long long)k,
                              (long long)dt_load(gt.dt, im->g->val[gi].data, (size_t)k), (long long)(k / block));
  }
  /* the weight: B's bytes are [N, K] row-major codes already */
  DType qdt = bits == 4 ? (z >= 0 ? DT_U4 : DT_I4) : (z >= 0 ? DT_U8 : DT_I8);
  TensorType qt = {.dt = qdt, .rank = 2, .dim = {N, K}};
  int q = on_const(im, on_tmp_name(im, "w"), qt, NULL);
  if (!im->g->val[q].data) return st_error(ST_NO_MEMORY, "out of memory");
  const uint8_t *src = im->g->val[b].data;
  uint8_t *dst = im->g->val[q].data, flip = z >= 0 ? 0 : bits == 4 ? 0x88 : 0x80;
  for (int64_t i = 0; i < N * nb * blob; i++) dst[i] = src[i] ^ flip;
  int in[3] = {q, -1, -1};
  RETURN_IF_ERROR(on_reshape(im, s, (int64_t[]){N, nb}, 2, NULL, &in[1]));
  if (zpacked) { /* per row, ceil(blocks * bits / 8) bytes; smelt packs u4 over the whole tensor */
    TensorType zt = {.dt = bits == 4 ? DT_U4 : DT_U8, .rank = 2, .dim = {N, nb}};
    int zc = on_const(im, NULL, zt, NULL);
    if (!im->g->val[zc].data) return st_error(ST_NO_MEMORY, "out of memory");
    const uint8_t *zs = im->g->val[z].data;
    int64_t rowb = (nb * bits + 7) / 8;
    for (int64_t n = 0; n < N; n++)
      for (int64_t j = 0; j < nb; j++) {
        unsigned v = bits == 8 ? zs[n * rowb + j] : (zs[n * rowb + j / 2] >> (4 * (j & 1))) & 15u;
        dt_store(zt.dt, im->g->val[zc].data, (size_t)(n * nb + j), v);
      }
    in[2] = zc;
  } else if (z >= 0) {
    RETURN_IF_ERROR(on_reshape(im, z, (int64_t[]){N, nb}, 2, NULL, &in[2]));
  }
  int id = on_node(im, OP_DEQUANTIZE, z >= 0 ? 3 : 2, in, NULL);
  ir_set_attr_int(im->g, id, "axis", 1);
  ir_set_attr_int(im->g, id, "group", block);
  ir_set_attr_dtype(im->g, id, "to", at.dt);
  int w;
  RETURN_IF_ERROR(on_done(im, id, &w));
  id = on_node(im, OP_MATMUL, 2, (int[]){a, w}, bias >= 0 ? NULL : out0(im));
  ir_set_attr_bool(im->g, id, "transpose_b", true);
  RETURN_IF_ERROR(on_done(im, id, &y));
  if (bias >= 0) {
    if (ir_type_numel(on_type(im, bias)) != N) return on_err(im, "bias must hold N=%lld values", (long long)N);
    RETURN_IF_ERROR(on_op2(im, OP_ADD, y, bias, out0(im), &y));
  }
  return bind0(im, y);
}

static smelt_status cv_where(OnnxImporter *im) {
  int c, a, b, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &c));
  RETURN_IF_ERROR(on_in_req(im, 1, &a));
  RETURN_IF_ERROR(on_in_req(im, 2, &b));
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, c, a, b, out0(im), &y));
  return bind0(im, y);
}

static smelt_status cv_gelu(OnnxImporter *im) {
  int x, y;
  const char *ap;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_string(im, "approximate", "none", &ap));
  if (strcmp(ap, "none") && strcmp(ap, "tanh")) return on_unsupported(im, "approximate '%s' (supported: none, tanh)", ap);
  int id = on_node(im, OP_GELU, 1, &x, out0(im));
  ir_set_attr_enum(im->g, id, "approximate", ap);
  RETURN_IF_ERROR(on_done(im, id, &y));
  return bind0(im, y);
}

static smelt_status cv_leaky_relu(OnnxImporter *im) {
  int x, y, neg, scaled;
  double alpha;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_float(im, "alpha", 0.01, &alpha));
  DType dt = on_type(im, x)->dt;
  RETURN_IF_ERROR(on_op2(im, OP_LESS, x, on_scalar(im, dt, 0), NULL, &neg));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, x, on_scalar(im, dt, alpha), NULL, &scaled));
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, neg, scaled, x, out0(im), &y));
  return bind0(im, y);
}

static smelt_status cv_prelu(OnnxImporter *im) {
  int x, slope, y, neg, scaled;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &slope));
  RETURN_IF_ERROR(on_op2(im, OP_LESS, x, on_scalar(im, on_type(im, x)->dt, 0), NULL, &neg));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, x, slope, NULL, &scaled));
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, neg, scaled, x, out0(im), &y));
  return bind0(im, y);
}

/* max(min(alpha * x + beta, 1), 0) */
static smelt_status hard_sigmoid(OnnxImporter *im, int x, double alpha, double beta, const char *name, int *out) {
  DType dt = on_type(im, x)->dt;
  int t;
  RETURN_IF_ERROR(on_op2(im, OP_MUL, x, on_scalar(im, dt, alpha), NULL, &t));
  RETURN_IF_ERROR(on_op2(im, OP_ADD, t, on_scalar(im, dt, beta), NULL, &t));
  RETURN_IF_ERROR(on_op2(im, OP_MINIMUM, t, on_scalar(im, dt, 1), NULL, &t));
  return on_op2(im, OP_MAXIMUM, t, on_scalar(im, dt, 0), name, out);
}

static smelt_status cv_hard_sigmoid(OnnxImporter *im) {
  int x, y;
  double alpha, beta;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_float(im, "alpha", 0.2, &alpha));
  RETURN_IF_ERROR(on_attr_float(im, "beta", 0.5, &beta));
  RETURN_IF_ERROR(hard_sigmoid(im, x, alpha, beta, out0(im), &y));
  return bind0(im, y);
}

static smelt_status cv_hard_swish(OnnxImporter *im) {
  int x, h, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(hard_sigmoid(im, x, 1.0 / 6, 0.5, NULL, &h));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, x, h, out0(im), &y));
  return bind0(im, y);
}

/* log(1 + exp(x)) as max(x, 0) + log(1 + exp(-|x|)): exp never overflows
 * (Softplus(100) is 100, not inf) */
/* softplus(x) = max(x, 0) + log(1 + exp(-|x|)): no overflow for large |x|. */
static smelt_status softplus(OnnxImporter *im, int x, const char *name, int *out) {
  int y, pos;
  DType dt = on_type(im, x)->dt;
  RETURN_IF_ERROR(on_op1(im, OP_ABS, x, NULL, &y));
  RETURN_IF_ERROR(on_op1(im, OP_NEG, y, NULL, &y));
  RETURN_IF_ERROR(on_op1(im, OP_EXP, y, NULL, &y));
  RETURN_IF_ERROR(on_op2(im, OP_ADD, y, on_scalar(im, dt, 1), NULL, &y));
  RETURN_IF_ERROR(on_op1(im, OP_LOG, y, NULL, &y));
  RETURN_IF_ERROR(on_op2(im, OP_MAXIMUM, x, on_scalar(im, dt, 0), NULL, &pos));
  return on_op2(im, OP_ADD, pos, y, name, out);
}

static smelt_status cv_softplus(OnnxImporter *im) {
  int x, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(softplus(im, x, out0(im), &y));
  return bind0(im, y);
}

static smelt_status cv_clip(OnnxImporter *im) {
  int x, lo = on_in(im, 1), hi = on_in(im, 2), y;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  y = x;
  if (lo >= 0) RETURN_IF_ERROR(on_op2(im, OP_MAXIMUM, y, lo, hi >= 0 ? NULL : out0(im), &y));
  if (hi >= 0) RETURN_IF_ERROR(on_op2(im, OP_MINIMUM, y, hi, out0(im), &y));
  return bind0(im, y);
}

/* ---- reductions and norms ---- */

static smelt_status cv_softmax(OnnxImporter *im) {
  int x, y;
  int64_t axis;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_int(im, "axis", -1, &axis));
  int id = on_node(im, !strcmp(im->node->op_type, "Softmax") ? OP_SOFTMAX : OP_LOG_SOFTMAX, 1, &x, out0(im));
  ir_set_attr_int(im->g, id, "axis", axis);
  RETURN_IF_ERROR(on_done(im, id, &y));
  return bind0(im, y);
}

/* The axes of a Reduce* node: the attribute (older opsets) or input 2;
 * *n = -1 means all axes. */
static smelt_status reduce_axes(OnnxImporter *im, int64_t *axes, int *n, bool *identity) {
  int64_t noop;
  *identity = false;
  RETURN_IF_ERROR(on_attr_ints(im, "axes", axes, MAXV, n));
  RETURN_IF_ERROR(on_attr_int(im, "noop_with_empty_axes", 0, &noop));
  int av = on_in(im, 1);
  if (*n < 0 && av >= 0) RETURN_IF_ERROR(on_const_ints(im, av, "axes", axes, MAXV, n));
  if (*n <= 0) {
    *identity = noop != 0;
    *n = -1;
  }
  return NULL;
}

/* A Reduce node's data input, keepdims and axes (reduce_axes). */
static smelt_status reduce_operands(OnnxImporter *im, int *x, int64_t *axes, int *n, int64_t *keep, bool *identity) {
  RETURN_IF_ERROR(on_in_req(im, 0, x));
  RETURN_IF_ERROR(on_attr_int(im, "keepdims", 1, keep));
  return reduce_axes(im, axes, n, identity);
}

static smelt_status cv_reduce(OnnxImporter *im) {
  const char *t = im->node->op_type;
  int x, y, n;
  int64_t axes[MAXV], keep;
  bool identity;
  RETURN_IF_ERROR(reduce_operands(im, &x, axes, &n, &keep, &identity));
  if (identity) return bind0(im, x);
  bool sq = !strcmp(t, "ReduceSumSquare") || !strcmp(t, "ReduceL2");
  if (sq) RETURN_IF_ERROR(on_op2(im, OP_MUL, x, x, NULL, &x));
  Op op = !strcmp(t, "ReduceMean") ? OP_MEAN : !strcmp(t, "ReduceMax") ? OP_MAX : !strcmp(t, "ReduceMin") ? OP_MIN : OP_SUM;
  bool l2 = !strcmp(t, "ReduceL2");
  RETURN_IF_ERROR(reduce(im, op, x, n >= 0 ? axes : NULL, n, keep != 0, l2 ? NULL : out0(im), &y));
  if (l2) RETURN_IF_ERROR(on_op1(im, OP_SQRT, y, out0(im), &y));
  return bind0(im, y);
}

/* ArgMax/ArgMin: the first (or last) index where x equals its max (min). */
static smelt_status cv_argmax(OnnxImporter *im) {
  bool is_max = !strcmp(im->node->op_type, "ArgMax");
  int x, m, eq, y;
  int64_t axis, keep, last;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_int(im, "axis", 0, &axis));
  RETURN_IF_ERROR(on_attr_int(im, "keepdims", 1, &keep));
  RETURN_IF_ERROR(on_attr_int(im, "select_last_index", 0, &last));
  const TensorType *xt = on_type(im, x);
  int ax, r = xt->rank;
  RETURN_IF_ERROR(norm_axis(im, axis, r, "axis", &ax));
  int64_t len = xt->dim[ax], a64 = ax;
  RETURN_IF_ERROR(reduce(im, is_max ? OP_MAX : OP_MIN, x, &a64, 1, true, NULL, &m));
  RETURN_IF_ERROR(on_op2(im, OP_EQUAL, x, m, NULL, &eq));
  double *iota = malloc(sizeof(double) * (size_t)(len ? len : 1));
  if (!iota) return st_error(ST_NO_MEMORY, "out of memory");
  for (int64_t i = 0; i < len; i++) iota[i] = (double)i;
  int io = axis_table(im, DT_I64, r, ax, iota, len);
  free(iota);
  int other = on_scalar(im, DT_I64, last ? -1 : (double)len);
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, eq, io, other, NULL, &y));
  RETURN_IF_ERROR(reduce(im, last ? OP_MAX : OP_MIN, y, &a64, 1, keep != 0, out0(im), &y));
  return bind0(im, y);
}

/* layer_norm / rms_norm over axes [axis, rank): smelt's norms take one
 * axis, so more trailing axes are flattened into one first. */
static smelt_status norm_common(OnnxImporter *im, Op op, int x, int scale, int bias, int64_t axis, double eps) {
  const TensorType *xt = on_type(im, x);
  int r = xt->rank, ax, y;
  RETURN_IF_ERROR(norm_axis(im, axis, r, "axis", &ax));
  int64_t d = 1, flat[IR_MAX_RANK], orig[IR_MAX_RANK];
  for (int i = 0; i < r; i++) orig[i] = xt->dim[i];
  for (int i = ax; i < r; i++) d *= xt->dim[i];
  int xin = x;
  if (ax != r - 1) {
    for (int i = 0; i < ax; i++) flat[i] = xt->dim[i];
    flat[ax] = d;
    RETURN_IF_ERROR(on_reshape(im, x, flat, ax + 1, NULL, &xin));
  }
  int params[2] = {scale, bias};
  for (int k = 0; k < 2; k++) {
    int p = params[k];
    if (p < 0) continue;
    if (ir_type_numel(on_type(im, p)) != d) {
      /* a broadcasting scale ([1] or [1,D]): make it the normalized shape */
      RETURN_IF_ERROR(expand_to(im, p, orig + ax, r - ax, NULL, &p));
    }
    if (on_type(im, p)->rank != 1) RETURN_IF_ERROR(on_reshape(im, p, &d, 1, NULL, &p));
    params[k] = p;
  }
  int ins[3] = {xin, params[0], params[1]};
  int id = on_node(im, op, params[1] >= 0 ? 3 : 2, ins, ax != r - 1 ? NULL : out0(im));
  ir_set_attr_int(im->g, id, "axis", -1);
  ir_set_attr_float(im->g, id, "eps", eps);
  RETURN_IF_ERROR(on_done(im, id, &y));
  if (ax != r - 1) RETURN_IF_ERROR(on_reshape(im, y, orig, r, out0(im), &y));
  RETURN_IF_ERROR(on_no_extra_outputs(im, 1));
  return bind0(im, y);
}

static smelt_status cv_layer_norm(OnnxImporter *im) {
  int x, scale;
  int64_t axis, stash;
  double eps;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &scale));
  RETURN_IF_ERROR(on_attr_int(im, "axis", -1, &axis));
  RETURN_IF_ERROR(on_attr_float(im, "epsilon", 1e-5, &eps));
  RETURN_IF_ERROR(on_attr_int(im, "stash_type", 1, &stash)); /* smelt's norms accumulate in f32 or wider */
  return norm_common(im, OP_LAYER_NORM, x, scale, on_in(im, 2), axis, eps);
}

static smelt_status cv_rms_norm(OnnxImporter *im) {
  int x, scale;
  int64_t axis, stash;
  double eps;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &scale));
  RETURN_IF_ERROR(on_attr_int(im, "axis", -1, &axis));
  RETURN_IF_ERROR(on_attr_float(im, "epsilon", 1e-5, &eps));
  RETURN_IF_ERROR(on_attr_int(im, "stash_type", 1, &stash));
  return norm_common(im, OP_RMS_NORM, x, scale, -1, axis, eps);
}

static smelt_status cv_batch_norm(OnnxImporter *im) {
  int in[5], y;
  double eps, mom;
  int64_t train;
  for (int i = 0; i < 5; i++) RETURN_IF_ERROR(on_in_req(im, i, &in[i]));
  RETURN_IF_ERROR(on_attr_float(im, "epsilon", 1e-5, &eps));
  RETURN_IF_ERROR(on_attr_float(im, "momentum", 0.9, &mom));
  RETURN_IF_ERROR(on_attr_int(im, "training_mode", 0, &train));
  if (train) return on_unsupported(im, "training_mode=1 (smelt runs inference)");
  RETURN_IF_ERROR(on_no_extra_outputs(im, 1));
  int id = on_node(im, OP_BATCH_NORM, 5, in, out0(im));
  ir_set_attr_float(im->g, id, "eps", eps);
  RETURN_IF_ERROR(on_done(im, id, &y));
  return bind0(im, y);
}

/* ---- contractions ---- */

static smelt_status cv_matmul(OnnxImporter *im) {
  int a, b, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &a));
  RETURN_IF_ERROR(on_in_req(im, 1, &b));
  RETURN_IF_ERROR(on_op2(im, OP_MATMUL, a, b, out0(im), &y));
  return bind0(im, y);
}

static smelt_status cv_gemm(OnnxImporter *im) {
  int a, b, c = on_in(im, 2), y;
  int64_t ta, tb;
  double alpha, beta;
  RETURN_IF_ERROR(on_in_req(im, 0, &a));
  RETURN_IF_ERROR(on_in_req(im, 1, &b));
  RETURN_IF_ERROR(on_attr_int(im, "transA", 0, &ta));
  RETURN_IF_ERROR(on_attr_int(im, "transB", 0, &tb));
  RETURN_IF_ERROR(on_attr_float(im, "alpha", 1, &alpha));
  RETURN_IF_ERROR(on_attr_float(im, "beta", 1, &beta));
  if (rank_of(im, a) != 2 || rank_of(im, b) != 2) return on_err(im, "A and B must be 2-D");
  bool last = c < 0 && alpha == 1;
  int id = on_node(im, OP_MATMUL, 2, (int[]){a, b}, last ? out0(im) : NULL);
  ir_set_attr_bool(im->g, id, "transpose_a", ta != 0);
  ir_set_attr_bool(im->g, id, "transpose_b", tb != 0);
  RETURN_IF_ERROR(on_done(im, id, &y));
  DType dt = on_type(im, y)->dt;
  if (alpha != 1) RETURN_IF_ERROR(on_op2(im, OP_MUL, y, on_scalar(im, dt, alpha), c < 0 ? out0(im) : NULL, &y));
  if (c >= 0) {
    if (beta != 1) RETURN_IF_ERROR(on_op2(im, OP_MUL, c, on_scalar(im, dt, beta), NULL, &c));
    RETURN_IF_ERROR(on_op2(im, OP_ADD, y, c, out0(im), &y));
  }
  return bind0(im, y);
}

/* Pads of a sliding window from auto_pad (SAME_UPPER, SAME_LOWER, VALID) or
 * the pads attribute: pads[0..n) begins, pads[n..2n) ends. */
static smelt_status window_pads(OnnxImporter *im, int n, const int64_t *in, const int64_t *k, const int64_t *s,
                                const int64_t *d, int64_t *pads) {
  const char *ap;
  int np;
  RETURN_IF_ERROR(on_attr_string(im, "auto_pad", "NOTSET", &ap));
  RETURN_IF_ERROR(on_attr_ints(im, "pads", pads, 2 * n, &np));
  if (np < 0) {
    for (int i = 0; i < 2 * n; i++) pads[i] = 0;
  } else if (np != 2 * n) {
    return on_err(im, "pads has %d values, expected %d", np, 2 * n);
  }
  for (int i = 0; i < 2 * n; i++)
    if (pads[i] < 0) return on_err(im, "pads must not be negative");
  if (!strcmp(ap, "NOTSET")) return NULL;
  if (!strcmp(ap, "VALID")) {
    for (int i = 0; i < 2 * n; i++) pads[i] = 0;
    return NULL;
  }
  bool upper = !strcmp(ap, "SAME_UPPER");
  if (!upper && strcmp(ap, "SAME_LOWER") != 0)
    return on_unsupported(im, "auto_pad '%s' (supported: NOTSET, VALID, SAME_UPPER, SAME_LOWER)", ap);
  for (int i = 0; i < n; i++) {
    int64_t out = (in[i] + s[i] - 1) / s[i];
    int64_t total = (out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - in[i];
    if (total < 0) total = 0;
    pads[i] = upper ? total / 2 : total - total / 2;
    pads[n + i] = total - pads[i];
  }
  return NULL;
}

/* Spatial attribute lists of length n (strides, dilations) with default 1. */
static smelt_status spatial_ints(OnnxImporter *im, const char *name, int n, int64_t *out) {
  int got;
  RETURN_IF_ERROR(on_attr_ints(im, name, out, n, &got));
  if (got < 0)
    for (int i = 0; i < n; i++) out[i] = 1;
  else if (got != n) return on_err(im, "%s has %d values, expected %d", name, got, n);
  for (int i = 0; i < n; i++)
    if (out[i] < 1) return on_err(im, "%s must be positive", name);
  return NULL;
}

/* The conv2d node of a Conv or ConvTranspose (x [N, C, H, W], weight w,
 * bias b or -1), its ONNX output bound; a 1-D one (n == 1, height 1 in
 * x) is reshaped back to [N, O, W]. */
static smelt_status conv_node(OnnxImporter *im, int x, int w, int b, const int64_t st[2], const int64_t dl[2],
                              const int64_t p4[4], int64_t grp, int n) {
  int ins[3] = {x, w, b}, y;
  int id = on_node(im, OP_CONV2D, b >= 0 ? 3 : 2, ins, n == 2 ? out0(im) : NULL);
  ir_set_attr_ints(im->g, id, "strides", st, 2);
  ir_set_attr_ints(im->g, id, "dilations", dl, 2);
  ir_set_attr_ints(im->g, id, "pads", p4, 4);
  ir_set_attr_int(im->g, id, "groups", grp);
  RETURN_IF_ERROR(on_done(im, id, &y));
  if (n == 1) {
    const TensorType *yt = on_type(im, y);
    int64_t ys[3] = {yt->dim[0], yt->dim[1], yt->dim[3]};
    RETURN_IF_ERROR(on_reshape(im, y, ys, 3, out0(im), &y));
  }
  return bind0(im, y);
}

/* A 3-D convolution as conv2d: x [N, C, D, H, W] with its depth padded
 * already, w [M, C/g, kD, kH, kW].  Output depth o reads x's depths
 * o*sd + t*dd for the taps t < kD, so tap t is one conv2d of w[:, :, t]
 * over the depths t*dd, t*dd + sd, ... taken as a batch [N*Do, C, H, W]
 * (x's depth moved next to N first); the taps' results are summed (the
 * bias goes to tap 0's) and put back as [N, M, Do, Ho, Wo]. */
static smelt_status conv3d_node(OnnxImporter *im, int x, int w, int b, int64_t sd, int64_t dd, const int64_t st[2],
                                const int64_t dl[2], const int64_t p4[4], int64_t grp) {
  TensorType xt = *on_type(im, x), wt = *on_type(im, w);
  int64_t N = xt.dim[0], D = xt.dim[2], kd = wt.dim[2], span = dd * (kd - 1) + 1;
  if (D < span) return on_err(im, "the output would have no pixels along the depth axis");
  int64_t Do = (D - span) / sd + 1;
  int xp, y = -1;
  RETURN_IF_ERROR(on_transpose(im, x, (const int64_t[]){0, 2, 1, 3, 4}, 5, NULL, &xp));
  for (int64_t t = 0; t < kd; t++) {
    int xs, ws, yt;
    RETURN_IF_ERROR(on_slice(im, xp, 1, t * dd, t * dd + sd * (Do - 1) + 1, sd, NULL, &xs));
    RETURN_IF_ERROR(on_reshape(im, xs, (const int64_t[]){N * Do, xt.dim[1], xt.dim[3], xt.dim[4]}, 4, NULL, &xs));
    RETURN_IF_ERROR(on_slice(im, w, 2, t, t + 1, 1, NULL, &ws));
    RETURN_IF_ERROR(on_reshape(im, ws, (const int64_t[]){wt.dim[0], wt.dim[1], wt.dim[3], wt.dim[4]}, 4, NULL, &ws));
    int ins[3] = {xs, ws, b};
    int id = on_node(im, OP_CONV2D, t == 0 && b >= 0 ? 3 : 2, ins, NULL);
    ir_set_attr_ints(im->g, id, "strides", st, 2);
    ir_set_attr_ints(im->g, id, "dilations", dl, 2);
    ir_set_attr_ints(im->g, id, "pads", p4, 4);
    ir_set_attr_int(im->g, id, "groups", grp);
    RETURN_IF_ERROR(on_done(im, id, &yt));
    if (y < 0) y = yt;
    else RETURN_IF_ERROR(on_op2(im, OP_ADD, y, yt, NULL, &y));
  }
  const TensorType *yt = on_type(im, y);
  RETURN_IF_ERROR(on_reshape(im, y, (const int64_t[]){N, Do, yt->dim[1], yt->dim[2], yt->dim[3]}, 5, NULL, &y));
  RETURN_IF_ERROR(on_transpose(im, y, (const int64_t[]){0, 2, 1, 3, 4}, 5, out0(im), &y));
  return bind0(im, y);
}

static smelt_status pad_axis(OnnxImporter *im, int x, int axis, int64_t before, int64_t after, const char *mode,
                             int cval, const char *name, int *out);

static smelt_status cv_conv(OnnxImporter *im) {
  int x, w, b = on_in(im, 2);
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &w));
  int r = rank_of(im, x);
  if (r < 3 || r > 5) return on_unsupported(im, "%d-D convolution (supported: 1-D, 2-D and 3-D)", r - 2);
  if (rank_of(im, w) != r) return on_err(im, "weight rank %d differs from input rank %d", rank_of(im, w), r);
  int n = r - 2;
  int64_t st[3], dl[3], k[3], in[3], pads[6], grp;
  int nk;
  RETURN_IF_ERROR(spatial_ints(im, "strides", n, st));
  RETURN_IF_ERROR(spatial_ints(im, "dilations", n, dl));
  RETURN_IF_ERROR(on_attr_int(im, "group", 1, &grp));
  RETURN_IF_ERROR(on_attr_ints(im, "kernel_shape", k, n, &nk));
  for (int i = 0; i < n; i++) {
    if (nk >= 0 && k[i] != on_type(im, w)->dim[2 + i]) return on_err(im, "kernel_shape differs from the weight's shape");
    k[i] = on_type(im, w)->dim[2 + i];
    in[i] = on_type(im, x)->dim[2 + i];
  }
  RETURN_IF_ERROR(window_pads(im, n, in, k, st, dl, pads));
  int64_t p4[4];
  if (n == 1) {
    /* 1-D as 2-D with height 1 */
    const TensorType *xt = on_type(im, x), *wt = on_type(im, w);
    int64_t xs[4] = {xt->dim[0], xt->dim[1], 1, xt->dim[2]}, ws[4] = {wt->dim[0], wt->dim[1], 1, wt->dim[2]};
    RETURN_IF_ERROR(on_reshape(im, x, xs, 4, NULL, &x));
    RETURN_IF_ERROR(on_reshape(im, w, ws, 4, NULL, &w));
    st[1] = st[0], st[0] = 1, dl[1] = dl[0], dl[0] = 1;
    p4[0] = 0, p4[1] = pads[0], p4[2] = 0, p4[3] = pads[1];
  } else if (n == 3) {
    /* 3-D: the depth padded here, height and width by the conv2d taps */
    int zero = on_scalar(im, on_type(im, x)->dt, 0);
    RETURN_IF_ERROR(pad_axis(im, x, 2, pads[0], pads[3], "constant", zero, NULL, &x));
    p4[0] = pads[1], p4[1] = pads[2], p4[2] = pads[4], p4[3] = pads[5];
    return conv3d_node(im, x, w, b, st[0], dl[0], st + 1, dl + 1, p4, grp);
  } else {
    memcpy(p4, pads, sizeof p4);
  }
  return conv_node(im, x, w, b, st, dl, p4, grp, n);
}

/* ConvTranspose's weight W [C, M/g, kH, kW] as conv2d's [M, C/g, kH, kW]
 * (1-D: kH = 1; 3-D: [M, C/g, kD, kH, kW]): flipped in every spatial axis
 * (the spatial index read backwards), input and output channels swapped
 * within each group.  Computed here, so W must be a constant. */
static smelt_status flipped_weight(OnnxImporter *im, int w, int64_t group, int *out) {
  if (!on_is_const(im, w))
    return on_unsupported(im, "W ('%s') must be a constant at import time (smelt turns it into a convolution's "
                              "weight as it imports); it is computed by a node",
                          im->g->val[w].name);
  TensorType wt = *on_type(im, w);
  if (!dt_is_float(wt.dt)) return on_err(im, "W must be floating point, got %s", dt_name(wt.dt));
  int64_t C = wt.dim[0], Mg = wt.dim[1], kd = wt.rank == 5 ? wt.dim[2] : 1;
  int64_t kh = wt.rank >= 4 ? wt.dim[wt.rank - 2] : 1, kw = wt.dim[wt.rank - 1], S = kd * kh * kw;
  int64_t Cg = C / group;
  TensorType ct = {.dt = wt.dt, .rank = 4, .dim = {Mg * group, Cg, kh, kw}};
  if (wt.rank == 5) ct = (TensorType){.dt = wt.dt, .rank = 5, .dim = {Mg * group, Cg, kd, kh, kw}};
  int v = on_const(im, on_tmp_name(im, "w"), ct, NULL);
  char *dst = im->g->val[v].data;
  const char *src = im->g->val[w].data;
  if (!dst || !src) return st_error(ST_NO_MEMORY, "out of memory");
  size_t es = dt_size(wt.dt);
  for (int64_t g = 0; g < group; g++)
    for (int64_t m = 0; m < Mg; m++)
      for (int64_t c = 0; c < Cg; c++)
        for (int64_t k = 0; k < S; k++) {
          int64_t from = ((g * Cg + c) * Mg + m) * S + (S - 1 - k);
          int64_t to = ((g * Mg + m) * Cg + c) * S + k;
          memcpy(dst + (size_t)to * es, src + (size_t)from * es, es);
        }
  *out = v;
  return NULL;
}

/* x with s - 1 zeros after every element along `axis` (length L -> L * s):
 * a unit axis after it, padded with zeros to s, merged back. */
static smelt_status spread_axis(OnnxImporter *im, int x, int axis, int64_t s, int *out) {
  TensorType xt = *on_type(im, x);
  int64_t shape[IR_MAX_RANK];
  int r = 0;
  for (int i = 0; i < xt.rank; i++) {
    shape[r++] = xt.dim[i];
    if (i == axis) shape[r++] = 1;
  }
  int zero = on_scalar(im, xt.dt, 0);
  RETURN_IF_ERROR(on_reshape(im, x, shape, r, NULL, &x));
  RETURN_IF_ERROR(pad_axis(im, x, axis + 1, 0, s - 1, "constant", zero, NULL, &x));
  xt.dim[axis] *= s;
  return on_reshape(im, x, xt.dim, xt.rank, NULL, out);
}

/* ConvTranspose (1-D, 2-D and 3-D) as a stride-1 conv2d: the input gets s - 1
 * zeros between its pixels and d*(k-1) - pad zeros around it (plus
 * output_padding at the end), the weight is flipped (flipped_weight).
 * The border zeros are conv2d's pads; where an ONNX pad exceeds d*(k-1)
 * the border is negative and a slice crops instead.  1-D is 2-D with height
 * 1; 3-D spreads and pads the depth here and is a stride-1 3-D convolution
 * (conv3d_node).  Padding from output_shape or auto_pad SAME_* is as ONNX states it
 * (and ONNX Runtime computes it): total = full size - wanted size (the
 * input's size times the stride for SAME_*), the odd pixel cut at the end
 * for SAME_UPPER and at the start otherwise. */
static smelt_status cv_conv_transpose(OnnxImporter *im) {
  int x, w, b = on_in(im, 2);
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &w));
  int r = rank_of(im, x);
  if (r < 3 || r > 5) return on_unsupported(im, "%d-D ConvTranspose (supported: 1-D, 2-D and 3-D)", r - 2);
  if (rank_of(im, w) != r) return on_err(im, "weight rank %d differs from input rank %d", rank_of(im, w), r);
  int n = r - 2;
  int64_t st[3], dl[3], kshape[3], opad[3], oshape[3], pads[6], grp;
  int nk, nop, nos, np;
  const char *ap;
  RETURN_IF_ERROR(spatial_ints(im, "strides", n, st));
  RETURN_IF_ERROR(spatial_ints(im, "dilations", n, dl));
  RETURN_IF_ERROR(on_attr_int(im, "group", 1, &grp));
  RETURN_IF_ERROR(on_attr_ints(im, "kernel_shape", kshape, n, &nk));
  RETURN_IF_ERROR(on_attr_ints(im, "output_padding", opad, n, &nop));
  RETURN_IF_ERROR(on_attr_ints(im, "output_shape", oshape, n, &nos));
  RETURN_IF_ERROR(on_attr_ints(im, "pads", pads, 2 * n, &np));
  RETURN_IF_ERROR(on_attr_string(im, "auto_pad", "NOTSET", &ap));
  bool upper = !strcmp(ap, "SAME_UPPER"), same = upper || !strcmp(ap, "SAME_LOWER");
  if (!same && strcmp(ap, "NOTSET") && strcmp(ap, "VALID"))
    return on_unsupported(im, "auto_pad '%s' (supported: NOTSET, VALID, SAME_UPPER, SAME_LOWER)", ap);
  if (nop >= 0 && nop != n) return on_err(im, "output_padding has %d values, expected %d", nop, n);
  if (np >= 0 && np != 2 * n) return on_err(im, "pads has %d values, expected %d", np, 2 * n);
  if (nos >= 0 && nos != n) return on_err(im, "output_shape has %d values, expected %d", nos, n);
  TensorType xt = *on_type(im, x), wt = *on_type(im, w);
  int64_t C = xt.dim[1];
  if (grp < 1 || C % grp) return on_err(im, "group %lld must divide the %lld input channels", (long long)grp, (long long)C);
  if (wt.dim[0] != C) return on_err(im, "W has %lld input channels, x has %lld", (long long)wt.dim[0], (long long)C);

  /* per spatial axis i of n: the zeros to put before and after the spread input */
  int64_t before[3], after[3], in[3], k[3];
  for (int i = 0; i < n; i++) {
    in[i] = xt.dim[2 + i];
    k[i] = wt.dim[2 + i];
    if (nk >= 0 && kshape[i] != k[i]) return on_err(im, "kernel_shape differs from the weight's shape");
    int64_t op = nop >= 0 ? opad[i] : 0;
    if (op < 0) return on_err(im, "output_padding must not be negative");
    int64_t full = (in[i] - 1) * st[i] + op + (k[i] - 1) * dl[i] + 1, head = 0, tail = 0;
    if (nos >= 0 || same) {
      int64_t want = nos >= 0 ? oshape[i] : in[i] * st[i];
      if (want > full)
        return on_unsupported(im, "output size %lld is larger than the %lld ConvTranspose computes (use output_padding)",
                              (long long)want, (long long)full);
      int64_t total = full - want;
      head = upper ? total / 2 : total - total / 2;
      tail = total - head;
    } else if (np >= 0 && strcmp(ap, "VALID")) {
      head = pads[i], tail = pads[n + i];
      if (head < 0 || tail < 0) return on_err(im, "pads must not be negative");
    }
    if (full - head - tail < 1) return on_err(im, "the output would have no pixels along spatial axis %d", i);
    before[i] = (k[i] - 1) * dl[i] - head;
    after[i] = (k[i] - 1) * dl[i] - tail + op;
  }

  int wc = -1;
  RETURN_IF_ERROR(flipped_weight(im, w, grp, &wc));
  if (n == 1) {
    int64_t xs[4] = {xt.dim[0], C, 1, in[0]};
    RETURN_IF_ERROR(on_reshape(im, x, xs, 4, NULL, &x));
    st[1] = st[0], dl[1] = dl[0], before[1] = before[0], after[1] = after[0];
    st[0] = dl[0] = 1, before[0] = after[0] = 0;
  }
  int64_t p4[4];
  int sp0 = n == 3; /* the first spatial axis (of st, dl, before, after) that conv2d pads */
  for (int i = 0; i < (n == 1 ? 2 : n); i++) {
    int axis = 2 + i;
    if (st[i] > 1) {
      RETURN_IF_ERROR(spread_axis(im, x, axis, st[i], &x));
      after[i] -= st[i] - 1; /* spread_axis leaves s - 1 zeros after the last pixel too */
    }
    bool conv_pads = i >= sp0;
    if (!conv_pads || before[i] < 0 || after[i] < 0) { /* crop what a pad larger than d*(k-1) takes away */
      int zero = on_scalar(im, xt.dt, 0);
      RETURN_IF_ERROR(pad_axis(im, x, axis, conv_pads && before[i] > 0 ? 0 : before[i],
                               conv_pads && after[i] > 0 ? 0 : after[i], "constant", zero, NULL, &x));
    }
    if (conv_pads) {
      p4[i - sp0] = before[i] > 0 ? before[i] : 0;
      p4[2 + i - sp0] = after[i] > 0 ? after[i] : 0;
    }
  }
  if (n == 3) return conv3d_node(im, x, wc, b, 1, dl[0], (const int64_t[]){1, 1}, dl + 1, p4, grp);
  return conv_node(im, x, wc, b, (int64_t[]){1, 1}, dl, p4, grp, n);
}

static smelt_status cv_pool(OnnxImporter *im) {
  bool is_max = !strcmp(im->node->op_type, "MaxPool");
  int x, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  if (rank_of(im, x) != 4) return on_unsupported(im, "pooling over rank %d (supported: 2-D, NCHW)", rank_of(im, x));
  int64_t k[2], st[2], dl[2], in[2], pads[4], ceil_mode, cip = 0, order;
  int nk;
  RETURN_IF_ERROR(on_attr_ints(im, "kernel_shape", k, 2, &nk));
  if (nk != 2) return on_err(im, "kernel_shape must have 2 values");
  RETURN_IF_ERROR(spatial_ints(im, "strides", 2, st));
  RETURN_IF_ERROR(spatial_ints(im, "dilations", 2, dl));
  if (dl[0] != 1 || dl[1] != 1) return on_unsupported(im, "dilated pooling");
  RETURN_IF_ERROR(on_attr_int(im, "ceil_mode", 0, &ceil_mode));
  RETURN_IF_ERROR(on_attr_int(im, "storage_order", 0, &order));
  if (!is_max) RETURN_IF_ERROR(on_attr_int(im, "count_include_pad", 0, &cip));
  RETURN_IF_ERROR(on_no_extra_outputs(im, 1));
  for (int i = 0; i < 2; i++) in[i] = on_type(im, x)->dim[2 + i];
  RETURN_IF_ERROR(window_pads(im, 2, in, k, st, dl, pads));
  if (cip && (pads[0] || pads[1] || pads[2] || pads[3])) {
    /* padding counted in the average: pad with zeros explicitly */
    int zero = on_scalar(im, on_type(im, x)->dt, 0);
    for (int i = 0; i < 2; i++) {
      RETURN_IF_ERROR(pad_axis(im, x, 2 + i, pads[i], pads[2 + i], "constant", zero, NULL, &x));
      in[i] += pads[i] + pads[2 + i];
      pads[i] = pads[2 + i] = 0;
    }
  }
  int64_t p4[4] = {pads[0], pads[1], pads[2], pads[3]};
  if (ceil_mode) {
    /* ceil: extend the end padding so that floor gives the ceil size; the
     * last window must still start inside the input or its begin padding */
    for (int i = 0; i < 2; i++) {
      int64_t span = in[i] + pads[i] + pads[2 + i] - k[i];
      if (span < 0) return on_err(im, "kernel does not fit the padded input");
      int64_t out = (span + st[i] - 1) / st[i] + 1;
      if ((out - 1) * st[i] >= in[i] + pads[i]) out--;
      int64_t extra = (out - 1) * st[i] + k[i] - (in[i] + pads[i] + pads[2 + i]);
      if (extra > 0) p4[2 + i] += extra;
    }
  }
  int id = on_node(im, is_max ? OP_MAX_POOL2D : OP_AVG_POOL2D, 1, &x, out0(im));
  ir_set_attr_ints(im->g, id, "kernel", k, 2);
  ir_set_attr_ints(im->g, id, "strides", st, 2);
  ir_set_attr_ints(im->g, id, "pads", p4, 4);
  RETURN_IF_ERROR(on_done(im, id, &y));
  return bind0(im, y);
}

static smelt_status cv_global_pool(OnnxImporter *im) {
  int x, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  if (!strcmp(im->node->op_type, "GlobalAveragePool")) {
    RETURN_IF_ERROR(on_op1(im, OP_GLOBAL_AVG_POOL, x, out0(im), &y));
  } else {
    int r = rank_of(im, x);
    int64_t axes[IR_MAX_RANK];
    for (int i = 2; i < r; i++) axes[i - 2] = i;
    if (r < 3) return on_err(im, "input must be [N,C,spatial...]");
    RETURN_IF_ERROR(reduce(im, OP_MAX, x, axes, r - 2, true, out0(im), &y));
  }
  return bind0(im, y);
}

/* ---- data movement ---- */

static smelt_status cv_reshape(OnnxImporter *im) {
  int x, s, n, y;
  int64_t shape[MAXV], allowzero;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &s));
  RETURN_IF_ERROR(on_attr_int(im, "allowzero", 0, &allowzero));
  RETURN_IF_ERROR(on_const_ints(im, s, "shape", shape, MAXV, &n));
  if (n > IR_MAX_RANK) return on_unsupported(im, "rank %d (at most %d)", n, IR_MAX_RANK);
  const TensorType *xt = on_type(im, x);
  for (int i = 0; i < n; i++)
    if (shape[i] == 0 && !allowzero) {
      if (i >= xt->rank) return on_err(im, "shape[%d] = 0 copies a dim the input does not have", i);
      shape[i] = xt->dim[i];
    }
  RETURN_IF_ERROR(on_reshape(im, x, shape, n, out0(im), &y));
  return bind0(im, y);
}

static smelt_status cv_flatten(OnnxImporter *im) {
  int x, y, ax;
  int64_t axis;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_int(im, "axis", 1, &axis));
  const TensorType *xt = on_type(im, x);
  ax = axis < 0 ? (int)(axis + xt->rank) : (int)axis;
  if (axis < -xt->rank || axis > xt->rank) return on_err(im, "axis %lld out of range for rank %d", (long long)axis, xt->rank);
  int64_t s[2] = {1, 1};
  for (int i = 0; i < xt->rank; i++) s[i < ax ? 0 : 1] *= xt->dim[i];
  RETURN_IF_ERROR(on_reshape(im, x, s, 2, out0(im), &y));
  return bind0(im, y);
}

static smelt_status cv_transpose(OnnxImporter *im) {
  int x, y, n;
  int64_t perm[IR_MAX_RANK];
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_ints(im, "perm", perm, IR_MAX_RANK, &n));
  int r = rank_of(im, x);
  if (n < 0) {
    for (int i = 0; i < r; i++) perm[i] = r - 1 - i;
    n = r;
  }
  RETURN_IF_ERROR(on_transpose(im, x, perm, n, out0(im), &y));
  return bind0(im, y);
}

/* Axes from the attribute or from input 2 (opset 13 on). */
static smelt_status axes_of(OnnxImporter *im, int64_t *axes, int *n) {
  RETURN_IF_ERROR(on_attr_ints(im, "axes", axes, MAXV, n));
  int av = on_in(im, 1);
  if (*n < 0 && av >= 0) RETURN_IF_ERROR(on_const_ints(im, av, "axes", axes, MAXV, n));
  return NULL;
}

static smelt_status cv_squeeze(OnnxImporter *im) {
  int x, y, n;
  int64_t axes[MAXV];
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(axes_of(im, axes, &n));
  int id = on_node(im, OP_SQUEEZE, 1, &x, out0(im));
  if (n >= 0) ir_set_attr_ints(im->g, id, "axes", axes, n);
  RETURN_IF_ERROR(on_done(im, id, &y));
  return bind0(im, y);
}

static smelt_status cv_unsqueeze(OnnxImporter *im) {
  int x, y, n;
  int64_t axes[MAXV];
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(axes_of(im, axes, &n));
  if (n < 0) return on_err(im, "needs axes");
  int id = on_node(im, OP_UNSQUEEZE, 1, &x, out0(im));
  ir_set_attr_ints(im->g, id, "axes", axes, n);
  RETURN_IF_ERROR(on_done(im, id, &y));
  return bind0(im, y);
}

static smelt_status cv_concat(OnnxImporter *im) {
  int64_t axis;
  int xs[64], n = 0, y;
  RETURN_IF_ERROR(on_attr_int(im, "axis", 0, &axis));
  if (on_nin(im) > 64) return on_unsupported(im, "%d inputs (at most 64)", on_nin(im));
  for (int i = 0; i < on_nin(im); i++) {
    int v;
    RETURN_IF_ERROR(on_in_req(im, i, &v));
    /* exporters concatenate empty tensors (an empty shape list): drop them */
    if (ir_type_numel(on_type(im, v)) == 0 && on_nin(im) > 1) continue;
    xs[n++] = v;
  }
  if (!n) RETURN_IF_ERROR(on_in_req(im, 0, &xs[n++]));
  if (n == 1) return bind0(im, xs[0]);
  RETURN_IF_ERROR(on_concat(im, xs, n, (int)axis, out0(im), &y));
  return bind0(im, y);
}

static smelt_status cv_split(OnnxImporter *im) {
  int x, n = -1, ax;
  int64_t axis, sizes[64], num;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_int(im, "axis", 0, &axis));
  RETURN_IF_ERROR(on_attr_int(im, "num_outputs", 0, &num));
  RETURN_IF_ERROR(on_attr_ints(im, "split", sizes, 64, &n));
  int sv = on_in(im, 1);
  if (n < 0 && sv >= 0) RETURN_IF_ERROR(on_const_ints(im, sv, "split", sizes, 64, &n));
  const TensorType *xt = on_type(im, x);
  RETURN_IF_ERROR(norm_axis(im, axis, xt->rank, "axis", &ax));
  int nout = on_nout(im);
  if (nout < 1 || nout > 64) return on_unsupported(im, "%d outputs (1 to 64 supported)", nout);
  int64_t len = xt->dim[ax];
  if (n < 0) {
    /* equal parts; opset 18's num_outputs lets the last one be smaller */
    int64_t part = num > 0 ? (len + nout - 1) / nout : len / nout;
    if (num <= 0 && len % nout) return on_err(im, "axis of size %lld does not split into %d parts", (long long)len, nout);
    for (int i = 0; i < nout; i++) sizes[i] = i < nout - 1 ? part : len - part * (nout - 1);
    n = nout;
  }
  if (n != nout) return on_err(im, "%d split sizes for %d outputs", n, nout);
  const char *names[64];
  for (int i = 0; i < nout; i++) names[i] = on_out_name(im, i);
  int id = on_node_multi(im, OP_SPLIT, 1, &x, nout, names);
  ir_set_attr_int(im->g, id, "axis", ax);
  ir_set_attr_ints(im->g, id, "sizes", sizes, nout);
  RETURN_IF_ERROR(on_done(im, id, NULL));
  for (int i = 0; i < nout; i++) RETURN_IF_ERROR(on_bind(im, i, im->g->node[id].out[i]));
  return NULL;
}

static smelt_status cv_slice(OnnxImporter *im) {
  int x, sv, ev, n, ne, na = -1, nst = -1;
  int64_t starts[MAXV], ends[MAXV], axes[MAXV], steps[MAXV];
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &sv));
  RETURN_IF_ERROR(on_in_req(im, 2, &ev));
  RETURN_IF_ERROR(on_const_ints(im, sv, "starts", starts, MAXV, &n));
  RETURN_IF_ERROR(on_const_ints(im, ev, "ends", ends, MAXV, &ne));
  if (on_in(im, 3) >= 0) RETURN_IF_ERROR(on_const_ints(im, on_in(im, 3), "axes", axes, MAXV, &na));
  if (on_in(im, 4) >= 0) RETURN_IF_ERROR(on_const_ints(im, on_in(im, 4), "steps", steps, MAXV, &nst));
  if (ne != n || (na >= 0 && na != n) || (nst >= 0 && nst != n))
    return on_err(im, "starts, ends, axes and steps differ in length");
  int r = rank_of(im, x), y = x, last = -1;
  for (int i = 0; i < n; i++) {
    if (na < 0) axes[i] = i;
    if (nst < 0) steps[i] = 1;
    if (steps[i] == 0) return on_err(im, "step must not be 0");
  }
  /* the last slice that changes anything carries the output's name */
  for (int i = 0; i < n; i++) {
    int ax;
    RETURN_IF_ERROR(norm_axis(im, axes[i], r, "axis", &ax));
    int64_t s, e, len;
    ir_slice_bounds(on_type(im, x)->dim[ax], starts[i], ends[i], steps[i], &s, &e, &len);
    if (!(steps[i] == 1 && len == on_type(im, x)->dim[ax])) last = i;
  }
  for (int i = 0; i <= last; i++) {
    int ax = ir_norm_axis(axes[i], r);
    int64_t s, e, len;
    ir_slice_bounds(on_type(im, y)->dim[ax], starts[i], ends[i], steps[i], &s, &e, &len);
    if (steps[i] == 1 && len == on_type(im, y)->dim[ax]) continue;
    /* INT64_MAX is smelt's "to the end"; ONNX writes it too, or INT64_MIN for a negative step */
    int64_t end = ends[i] < -((int64_t)1 << 62) || ends[i] > ((int64_t)1 << 62) ? INT64_MAX : ends[i];
    RETURN_IF_ERROR(on_slice(im, y, ax, starts[i], end, steps[i], i == last ? out0(im) : NULL, &y));
  }
  return bind0(im, y);
}

static smelt_status cv_gather(OnnxImporter *im) {
  int x, idx, y;
  int64_t axis;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &idx));
  RETURN_IF_ERROR(on_attr_int(im, "axis", 0, &axis));
  RETURN_IF_ERROR(on_gather(im, x, idx, (int)axis, out0(im), &y));
  return bind0(im, y);
}

/* Row-major strides of a shape. */
static void strides_of(const TensorType *t, int64_t *st) {
  int64_t s = 1;
  for (int i = t->rank - 1; i >= 0; i--) st[i] = s, s *= t->dim[i];
}

/* GatherElements with constant indices: one gather from the flattened data
 * with the linear index of every element. */
static smelt_status cv_gather_elements(OnnxImporter *im) {
  int x, iv, y, n;
  int64_t axis;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &iv));
  RETURN_IF_ERROR(on_attr_int(im, "axis", 0, &axis));
  const TensorType *xt = on_type(im, x), *it = on_type(im, iv);
  int ax;
  RETURN_IF_ERROR(norm_axis(im, axis, xt->rank, "axis", &ax));
  if (it->rank != xt->rank) return on_err(im, "indices must have the rank of the data");
  int64_t cnt = ir_type_numel(it);
  if (cnt > ONNX_FOLD_MAX_INT) return on_unsupported(im, "more than %lld indices", (long long)ONNX_FOLD_MAX_INT);
  int64_t *idx = malloc(sizeof(int64_t) * (size_t)(cnt ? cnt : 1)), *lin = malloc(sizeof(int64_t) * (size_t)(cnt ? cnt : 1));
  if (!idx || !lin) {
    free(idx), free(lin);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  smelt_status st = on_const_ints(im, iv, "indices", idx, (int)cnt, &n);
  int64_t xs[IR_MAX_RANK], is[IR_MAX_RANK];
  strides_of(xt, xs);
  strides_of(it, is);
  for (int64_t e = 0; e < cnt && !st; e++) {
    int64_t rem = e, off = 0;
    for (int d = 0; d < it->rank; d++) {
      int64_t c = rem / is[d];
      rem %= is[d];
      if (d == ax) {
        c = idx[e] < 0 ? idx[e] + xt->dim[ax] : idx[e];
        if (c < 0 || c >= xt->dim[ax]) st = on_err(im, "index %lld out of range", (long long)idx[e]);
      } else if (c >= xt->dim[d]) {
        st = on_err(im, "indices are larger than the data on axis %d", d);
      }
      off += c * xs[d];
    }
    lin[e] = off;
  }
  int flat, li;
  int64_t total = ir_type_numel(xt);
  if (!st) st = on_reshape(im, x, &total, 1, NULL, &flat);
  if (!st) {
    li = on_const(im, NULL, (TensorType){.dt = DT_I64, .rank = it->rank, .dim = {0}}, NULL);
    TensorType *lt = &im->g->val[li].type;
    *lt = *it;
    lt->dt = DT_I64;
    im->g->val[li].data = ir_graph_alloc(im->g, ir_type_bytes(lt));
    memcpy(im->g->val[li].data, lin, sizeof(int64_t) * (size_t)cnt);
    st = on_gather(im, flat, li, 0, out0(im), &y);
  }
  free(idx);
  free(lin);
  RETURN_IF_ERROR(st);
  return bind0(im, y);
}

static smelt_status cv_expand(OnnxImporter *im) {
  int x, s, n, y;
  int64_t shape[MAXV];
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &s));
  RETURN_IF_ERROR(on_const_ints(im, s, "shape", shape, MAXV, &n));
  if (n > IR_MAX_RANK) return on_unsupported(im, "rank %d", n);
  RETURN_IF_ERROR(expand_to(im, x, shape, n, out0(im), &y));
  return bind0(im, y);
}

/* Tile: [d0, d1] -> reshape [1, d0, 1, d1] -> expand [r0, d0, r1, d1] ->
 * reshape [r0*d0, r1*d1], with the axes that repeat once left out. */
static smelt_status cv_tile(OnnxImporter *im) {
  int x, rv, n, y;
  int64_t rep[MAXV];
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &rv));
  RETURN_IF_ERROR(on_const_ints(im, rv, "repeats", rep, MAXV, &n));
  const TensorType *xt = on_type(im, x);
  int r = xt->rank;
  if (n != r) return on_err(im, "repeats has %d values for rank %d", n, r);
  int64_t s1[IR_MAX_RANK * 2], s2[IR_MAX_RANK * 2], s3[IR_MAX_RANK];
  int k = 0;
  for (int i = 0; i < r; i++) {
    if (rep[i] < 0) return on_err(im, "repeats must not be negative");
    /* the bound of every result (ir_infer_node: 2^50 bytes), checked before
     * the product below can overflow */
    if (xt->dim[i] && rep[i] > ((int64_t)1 << 50) / xt->dim[i])
      return on_err(im, "repeats[%d] = %lld makes axis %d of %lld too large", i, (long long)rep[i], i,
                    (long long)xt->dim[i]);
    if (rep[i] != 1) s1[k] = 1, s2[k++] = rep[i];
    s1[k] = xt->dim[i], s2[k++] = xt->dim[i];
    s3[i] = xt->dim[i] * rep[i];
  }
  if (k > IR_MAX_RANK) return on_unsupported(im, "tiling %d axes of a rank-%d tensor", k - r, r);
  if (k == r) return bind0(im, x);
  RETURN_IF_ERROR(on_reshape(im, x, s1, k, NULL, &y));
  RETURN_IF_ERROR(expand_to(im, y, s2, k, NULL, &y));
  RETURN_IF_ERROR(on_reshape(im, y, s3, r, out0(im), &y));
  return bind0(im, y);
}

static smelt_status cv_range(OnnxImporter *im) {
  int a, b, c;
  double start, limit, delta;
  RETURN_IF_ERROR(on_in_req(im, 0, &a));
  RETURN_IF_ERROR(on_in_req(im, 1, &b));
  RETURN_IF_ERROR(on_in_req(im, 2, &c));
  RETURN_IF_ERROR(on_const_scalar(im, a, "start", &start));
  RETURN_IF_ERROR(on_const_scalar(im, b, "limit", &limit));
  RETURN_IF_ERROR(on_const_scalar(im, c, "delta", &delta));
  if (delta == 0) return on_err(im, "delta must not be 0");
  double cnt = ceil((limit - start) / delta);
  if (!(cnt < (double)ONNX_FOLD_MAX_INT)) return on_unsupported(im, "a range of %.0f elements", cnt);
  int64_t n = cnt > 0 ? (int64_t)cnt : 0;
  DType dt = on_type(im, a)->dt;
  TensorType t = {.dt = dt, .rank = 1, .dim = {n}};
  int v = on_const(im, out0(im), t, NULL);
  for (int64_t i = 0; i < n; i++) dt_store(dt, im->g->val[v].data, (size_t)i, start + (double)i * delta);
  return bind0(im, v);
}

static smelt_status cv_constant_of_shape(OnnxImporter *im) {
  int s, n;
  int64_t shape[MAXV];
  RETURN_IF_ERROR(on_in_req(im, 0, &s));
  RETURN_IF_ERROR(on_const_ints(im, s, "shape", shape, MAXV, &n));
  if (n > IR_MAX_RANK) return on_unsupported(im, "rank %d", n);
  DType dt = DT_F32;
  double fill = 0;
  const Onnx__AttributeProto *a = on_attr(im, "value");
  if (a) {
    if (!a->t) return on_err(im, "attribute 'value' must be a tensor");
    int cv;
    RETURN_IF_ERROR(onnx_tensor_const(im, a->t, on_tmp_name(im, "value"), &cv));
    if (ir_type_numel(on_type(im, cv)) != 1) return on_err(im, "value must hold one element");
    dt = on_type(im, cv)->dt;
    fill = dt_load(dt, im->g->val[cv].data, 0);
  } else {
    dt = im->fdtype;
  }
  TensorType t = {.dt = dt, .rank = n};
  for (int i = 0; i < n; i++) {
    if (shape[i] < 0) return on_err(im, "negative size in shape");
    t.dim[i] = shape[i];
  }
  int64_t numel = ir_type_numel(&t);
  if (numel > ONNX_FOLD_MAX_INT * 16) return on_unsupported(im, "a constant of %lld elements", (long long)numel);
  int v = on_const(im, out0(im), t, NULL);
  if (fill != 0)
    for (int64_t i = 0; i < numel; i++) dt_store(dt, im->g->val[v].data, (size_t)i, fill);
  return bind0(im, v);
}

static smelt_status cv_constant(OnnxImporter *im) {
  const Onnx__AttributeProto *a = im->node->n_attribute == 1 ? im->node->attribute[0] : NULL;
  if (!a) return on_err(im, "needs exactly one attribute");
  const char *name = a->name ? a->name : "";
  int v;
  if (!strcmp(name, "value")) {
    if (!a->t) return on_err(im, "attribute 'value' must be a tensor");
    RETURN_IF_ERROR(onnx_tensor_const(im, a->t, out0(im), &v));
  } else if (!strcmp(name, "value_float") || !strcmp(name, "value_int")) {
    bool f = name[6] == 'f';
    TensorType t = {.dt = f ? im->fdtype : DT_I64, .rank = 0};
    v = on_const(im, out0(im), t, NULL);
    dt_store(t.dt, im->g->val[v].data, 0, f ? (double)a->f : (double)a->i);
    if (!f) memcpy(im->g->val[v].data, &a->i, 8);
  } else if (!strcmp(name, "value_floats") || !strcmp(name, "value_ints")) {
    bool f = name[6] == 'f';
    size_t n = f ? a->n_floats : a->n_ints;
    TensorType t = {.dt = f ? im->fdtype : DT_I64, .rank = 1, .dim = {(int64_t)n}};
    v = on_const(im, out0(im), t, f ? NULL : a->ints);
    for (size_t i = 0; f && i < n; i++) dt_store(t.dt, im->g->val[v].data, i, a->floats[i]);
  } else {
    return on_unsupported(im, "attribute '%s' (supported: value, value_float(s), value_int(s))", name);
  }
  return bind0(im, v);
}

static smelt_status cv_shape(OnnxImporter *im) {
  int x;
  int64_t start, end;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_int(im, "start", 0, &start));
  RETURN_IF_ERROR(on_attr_int(im, "end", INT64_MAX, &end));
  const TensorType *xt = on_type(im, x);
  int64_t r = xt->rank;
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = start < 0 ? 0 : start > r ? r : start;
  end = end < 0 ? 0 : end > r ? r : end;
  int64_t n = end > start ? end - start : 0;
  TensorType t = {.dt = DT_I64, .rank = 1, .dim = {n}};
  /* copied out first: xt points into g->val, which adding the constant moves */
  int64_t dims[IR_MAX_RANK];
  memcpy(dims, xt->dim + start, sizeof(int64_t) * (size_t)n);
  int v = on_const(im, out0(im), t, dims);
  return bind0(im, v);
}

static smelt_status cv_size(OnnxImporter *im) {
  int x;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  int64_t n = ir_type_numel(on_type(im, x));
  TensorType t = {.dt = DT_I64, .rank = 0};
  int v = on_const(im, out0(im), t, &n);
  return bind0(im, v);
}

/* One axis of Pad. constant: concat with blocks of cval; edge, reflect and
 * wrap: a gather with the source index of every output position.  Negative
 * amounts crop. */
static smelt_status pad_axis(OnnxImporter *im, int x, int axis, int64_t before, int64_t after, const char *mode,
                             int cval, const char *name, int *out) {
  TensorType xt = *on_type(im, x); /* a copy: every node added may move the types */
  int64_t len = xt.dim[axis];
  if (before < 0 || after < 0) {
    int64_t s = before < 0 ? -before : 0, e = after < 0 ? len + after : len;
    if (e < s) return on_err(im, "pads crop more than the axis holds");
    RETURN_IF_ERROR(on_slice(im, x, axis, s, e, 1, before >= 0 && after >= 0 ? name : NULL, &x));
    before = before < 0 ? 0 : before;
    after = after < 0 ? 0 : after;
    xt = *on_type(im, x);
    len = xt.dim[axis];
  }
  if (!before && !after) {
    *out = x;
    return NULL;
  }
  if (!strcmp(mode, "constant")) {
    int parts[3], k = 0;
    int64_t amount[2] = {before, after};
    for (int side = 0; side < 2; side++) {
      if (side == 1) parts[k++] = x;
      if (!amount[side]) continue;
      TensorType bt = xt;
      bt.dim[axis] = amount[side];
      RETURN_IF_ERROR(expand_to(im, cval, bt.dim, bt.rank, NULL, &parts[k]));
      k++;
    }
    return on_concat(im, parts, k, axis, name, out);
  }
  if (len == 0) return on_err(im, "cannot pad an empty axis in mode '%s'", mode);
  int64_t n = before + len + after;
  if (n > ONNX_FOLD_MAX_INT) return on_unsupported(im, "padding to %lld elements", (long long)n);
  int64_t *idx = malloc(sizeof(int64_t) * (size_t)n);
  if (!idx) return st_error(ST_NO_MEMORY, "out of memory");
  for (int64_t i = 0; i < n; i++) {
    int64_t j = i - before;
    if (!strcmp(mode, "edge")) {
      j = j < 0 ? 0 : j >= len ? len - 1 : j;
    } else if (!strcmp(mode, "wrap")) {
      j = ((j % len) + len) % len;
    } else { /* reflect: ... 2 1 | 0 1 2 3 | 2 1 ... */
      int64_t p = len > 1 ? 2 * (len - 1) : 1;
      j = ((j % p) + p) % p;
      if (j >= len) j = p - j;
    }
    idx[i] = j;
  }
  int iv;
  smelt_status st = idx_table(im, idx, n, &iv);
  free(idx);
  RETURN_IF_ERROR(st);
  return on_gather(im, x, iv, axis, name, out);
}

static smelt_status cv_pad(OnnxImporter *im) {
  int x, pv, np, na = -1, y;
  int64_t pads[MAXV], axes[MAXV];
  const char *mode;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_string(im, "mode", "constant", &mode));
  if (strcmp(mode, "constant") && strcmp(mode, "reflect") && strcmp(mode, "edge") && strcmp(mode, "wrap"))
    return on_unsupported(im, "mode '%s' (supported: constant, reflect, edge, wrap)", mode);
  RETURN_IF_ERROR(on_in_req(im, 1, &pv));
  RETURN_IF_ERROR(on_const_ints(im, pv, "pads", pads, MAXV, &np));
  int r = rank_of(im, x);
  if (on_in(im, 3) >= 0) RETURN_IF_ERROR(on_const_ints(im, on_in(im, 3), "axes", axes, MAXV, &na));
  if (na < 0) {
    na = r;
    for (int i = 0; i < r; i++) axes[i] = i;
  }
  if (np != 2 * na) return on_err(im, "pads has %d values for %d axes", np, na);
  DType dt = on_type(im, x)->dt;
  int cval = on_in(im, 2);
  if (cval >= 0) {
    double c;
    RETURN_IF_ERROR(on_const_scalar(im, cval, "constant_value", &c));
    cval = on_scalar(im, dt, c);
  } else {
    cval = on_scalar(im, dt, 0);
  }
  int last = -1;
  for (int i = 0; i < na; i++)
    if (pads[i] || pads[na + i]) last = i;
  y = x;
  for (int i = 0; i <= last; i++) {
    int ax;
    RETURN_IF_ERROR(norm_axis(im, axes[i], r, "axis", &ax));
    if (!pads[i] && !pads[na + i]) continue;
    RETURN_IF_ERROR(pad_axis(im, y, ax, pads[i], pads[na + i], mode, cval, i == last ? out0(im) : NULL, &y));
  }
  return bind0(im, y);
}

static smelt_status cv_trilu(OnnxImporter *im) {
  int x, y;
  int64_t upper, k = 0;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_int(im, "upper", 1, &upper));
  if (on_in(im, 1) >= 0) {
    double kd;
    RETURN_IF_ERROR(on_const_scalar(im, on_in(im, 1), "k", &kd));
    k = (int64_t)kd;
  }
  const TensorType xtype = *on_type(im, x), *xt = &xtype; /* a copy: see on_type */
  if (xt->rank < 2) return on_err(im, "input must have rank >= 2");
  int64_t m = xt->dim[xt->rank - 2], n = xt->dim[xt->rank - 1];
  if (m * n > ONNX_FOLD_MAX_INT) return on_unsupported(im, "a %lldx%lld mask", (long long)m, (long long)n);
  TensorType mt = {.dt = DT_BOOL, .rank = 2, .dim = {m, n}};
  int mask = on_const(im, NULL, mt, NULL);
  unsigned char *p = im->g->val[mask].data;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) p[i * n + j] = upper ? j - i >= k : j - i <= k;
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, mask, x, on_scalar(im, xt->dt, 0), out0(im), &y));
  return bind0(im, y);
}

/* ScatterND with constant indices: out = where(covered, gather(updates,
 * source), data), both tables computed here. */
static smelt_status cv_scatter_nd(OnnxImporter *im) {
  int x, iv, u, y, n;
  const char *red;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &iv));
  RETURN_IF_ERROR(on_in_req(im, 2, &u));
  RETURN_IF_ERROR(on_attr_string(im, "reduction", "none", &red));
  if (strcmp(red, "none")) return on_unsupported(im, "reduction '%s' (supported: none)", red);
  const TensorType xtype = *on_type(im, x), itype = *on_type(im, iv), *xt = &xtype, *it = &itype; /* see on_type */
  if (it->rank < 1) return on_err(im, "indices must have rank >= 1");
  int q = (int)it->dim[it->rank - 1];
  if (q < 1 || q > xt->rank) return on_err(im, "the last axis of indices must be in [1, %d]", xt->rank);
  int64_t nidx = ir_type_numel(it), total = ir_type_numel(xt);
  if (nidx > ONNX_FOLD_MAX_INT || total > ONNX_FOLD_MAX_INT) return on_unsupported(im, "a scatter this large");
  int64_t *idx = malloc(sizeof(int64_t) * (size_t)(nidx ? nidx : 1)), *src = malloc(sizeof(int64_t) * (size_t)(total ? total : 1));
  if (!idx || !src) {
    free(idx), free(src);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  smelt_status st = on_const_ints(im, iv, "indices", idx, (int)nidx, &n);
  int64_t xs[IR_MAX_RANK], slice = 1;
  strides_of(xt, xs);
  for (int d = q; d < xt->rank; d++) slice *= xt->dim[d];
  for (int64_t e = 0; e < total; e++) src[e] = -1;
  int64_t nupd = q ? nidx / q : 0;
  for (int64_t j = 0; j < nupd && !st; j++) {
    int64_t off = 0;
    for (int d = 0; d < q; d++) {
      int64_t c = idx[j * q + d];
      if (c < 0) c += xt->dim[d];
      if (c < 0 || c >= xt->dim[d]) st = on_err(im, "index %lld out of range", (long long)idx[j * q + d]);
      off += c * xs[d];
    }
    for (int64_t s = 0; s < slice && !st; s++) src[off + s] = j * slice + s;
  }
  free(idx);
  if (st) {
    free(src);
    return st;
  }
  TensorType bt = *xt, lt = *xt;
  bt.dt = DT_BOOL;
  lt.dt = DT_I64;
  int cover = on_const(im, NULL, bt, NULL), lin = on_const(im, NULL, lt, NULL);
  for (int64_t e = 0; e < total; e++) {
    ((unsigned char *)im->g->val[cover].data)[e] = src[e] >= 0;
    ((int64_t *)im->g->val[lin].data)[e] = src[e] >= 0 ? src[e] : 0;
  }
  free(src);
  int64_t ut = ir_type_numel(on_type(im, u));
  if (ut != nupd * slice) return on_err(im, "updates hold %lld elements, expected %lld", (long long)ut, (long long)(nupd * slice));
  int flat, g;
  RETURN_IF_ERROR(on_reshape(im, u, &ut, 1, NULL, &flat));
  RETURN_IF_ERROR(on_gather(im, flat, lin, 0, NULL, &g));
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, cover, g, x, out0(im), &y));
  return bind0(im, y);
}

/* Resize, nearest and linear, one axis at a time with gathers: linear in
 * several axes is separable, so this is exactly bilinear. */
static smelt_status cv_resize(OnnxImporter *im) {
  int x, y, ns = -1, nz = -1, na = -1;
  const char *mode, *ctm, *nearest, *kar;
  int64_t antialias, excl, sizes[MAXV], axes[MAXV];
  double scales[MAXV], cubic, extrap;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_string(im, "mode", "nearest", &mode));
  RETURN_IF_ERROR(on_attr_string(im, "coordinate_transformation_mode", "half_pixel", &ctm));
  RETURN_IF_ERROR(on_attr_string(im, "nearest_mode", "round_prefer_floor", &nearest));
  RETURN_IF_ERROR(on_attr_string(im, "keep_aspect_ratio_policy", "stretch", &kar));
  RETURN_IF_ERROR(on_attr_int(im, "antialias", 0, &antialias));
  RETURN_IF_ERROR(on_attr_int(im, "exclude_outside", 0, &excl));
  RETURN_IF_ERROR(on_attr_float(im, "cubic_coeff_a", -0.75, &cubic));
  RETURN_IF_ERROR(on_attr_float(im, "extrapolation_value", 0, &extrap));
  RETURN_IF_ERROR(on_attr_ints(im, "axes", axes, MAXV, &na));
  bool linear = !strcmp(mode, "linear");
  if (!linear && strcmp(mode, "nearest")) return on_unsupported(im, "mode '%s' (supported: nearest, linear)", mode);
  if (antialias) return on_unsupported(im, "antialias=1");
  if (strcmp(kar, "stretch")) return on_unsupported(im, "keep_aspect_ratio_policy '%s' (supported: stretch)", kar);
  static const char *const ctms[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                                     "asymmetric", NULL};
  bool ok = false;
  for (int i = 0; ctms[i]; i++) ok |= !strcmp(ctm, ctms[i]);
  if (!ok) return on_unsupported(im, "coordinate_transformation_mode '%s' (supported: half_pixel, half_pixel_symmetric, "
                                 "pytorch_half_pixel, align_corners, asymmetric)", ctm);
  if (!linear && strcmp(nearest, "round_prefer_floor") && strcmp(nearest, "round_prefer_ceil") &&
      strcmp(nearest, "floor") && strcmp(nearest, "ceil"))
    return on_unsupported(im, "nearest_mode '%s'", nearest);
  const TensorType *xt = on_type(im, x);
  int r = xt->rank;
  int sv = on_in(im, 2), zv = on_in(im, 3);
  if (sv >= 0 && ir_type_numel(on_type(im, sv)) > 0) {
    const Value *v = &im->g->val[sv];
    if (v->kind != VK_CONST) return on_unsupported(im, "scales must be constant at import time");
    ns = (int)ir_type_numel(&v->type);
    if (ns > MAXV) return on_err(im, "too many scales");
    for (int i = 0; i < ns; i++) scales[i] = dt_load(v->type.dt, v->data, (size_t)i);
  }
  if (zv >= 0 && ir_type_numel(on_type(im, zv)) > 0) RETURN_IF_ERROR(on_const_ints(im, zv, "sizes", sizes, MAXV, &nz));
  if ((ns >= 0) == (nz >= 0)) return on_err(im, "needs exactly one of scales and sizes");
  int cnt = ns >= 0 ? ns : nz;
  if (na < 0) {
    na = r;
    for (int i = 0; i < r; i++) axes[i] = i;
  }
  if (cnt != na) return on_err(im, "%d scales/sizes for %d axes", cnt, na);
  int order[MAXV], nchg = 0;
  double sc[IR_MAX_RANK];
  int64_t osz[IR_MAX_RANK];
  for (int i = 0; i < r; i++) sc[i] = 1, osz[i] = xt->dim[i];
  for (int i = 0; i < na; i++) {
    int ax;
    RETURN_IF_ERROR(norm_axis(im, axes[i], r, "axis", &ax));
    if (ns >= 0) {
      if (!(scales[i] > 0)) return on_err(im, "scales must be positive");
      sc[ax] = scales[i];
      osz[ax] = (int64_t)floor((double)xt->dim[ax] * scales[i]);
    } else {
      if (sizes[i] <= 0) return on_err(im, "sizes must be positive");
      osz[ax] = sizes[i];
      sc[ax] = (double)sizes[i] / (double)xt->dim[ax];
    }
    if (osz[ax] < 1) return on_err(im, "output size of axis %d is 0", ax);
    if (osz[ax] != xt->dim[ax] || sc[ax] != 1) order[nchg++] = ax;
  }
  y = x;
  for (int c = 0; c < nchg; c++) {
    int ax = order[c];
    int64_t in = xt->dim[ax], out = osz[ax];
    if (out > ONNX_FOLD_MAX_INT) return on_unsupported(im, "output size %lld", (long long)out);
    int64_t *i0 = malloc(sizeof(int64_t) * (size_t)out * 2);
    double *w = malloc(sizeof(double) * (size_t)out);
    if (!i0 || !w) {
      free(i0), free(w);
      return st_error(ST_NO_MEMORY, "out of memory");
    }
    int64_t *i1 = i0 + out;
    double s = sc[ax];
    for (int64_t o = 0; o < out; o++) {
      double xo;
      if (!strcmp(ctm, "half_pixel")) xo = ((double)o + 0.5) / s - 0.5;
      else if (!strcmp(ctm, "pytorch_half_pixel")) xo = out > 1 ? ((double)o + 0.5) / s - 0.5 : 0;
      else if (!strcmp(ctm, "align_corners")) xo = out == 1 ? 0 : (double)o * (double)(in - 1) / (double)(out - 1);
      else if (!strcmp(ctm, "asymmetric")) xo = (double)o / s;
      else {
        double adj = (double)out / (s * (double)in), center = (double)in / 2;
        xo = center * (1 - adj) + ((double)o + 0.5) / s - 0.5;
      }
      if (linear) {
        xo = xo < 0 ? 0 : xo > (double)(in - 1) ? (double)(in - 1) : xo;
        double f = floor(xo);
        i0[o] = (int64_t)f;
        i1[o] = i0[o] + 1 < in ? i0[o] + 1 : in - 1;
        w[o] = xo - f;
      } else {
        double f;
        if (!strcmp(nearest, "floor")) f = floor(xo);
        else if (!strcmp(nearest, "ceil")) f = ceil(xo);
        else if (xo - floor(xo) == 0.5) f = !strcmp(nearest, "round_prefer_ceil") ? ceil(xo) : floor(xo);
        else f = round(xo);
        int64_t k = (int64_t)f;
        i0[o] = k < 0 ? 0 : k >= in ? in - 1 : k;
      }
    }
    bool last = c == nchg - 1;
    int g0, g1, t0, t1, d;
    smelt_status st = idx_table(im, i0, out, &t0);
    if (!st) st = on_gather(im, y, t0, ax, linear || !last ? NULL : out0(im), &g0);
    if (!st && linear) {
      int wt = axis_table(im, on_type(im, y)->dt, r, ax, w, out);
      st = idx_table(im, i1, out, &t1);
      if (!st) st = on_gather(im, y, t1, ax, NULL, &g1);
      if (!st) st = on_op2(im, OP_SUB, g1, g0, NULL, &d);
      if (!st) st = on_op2(im, OP_MUL, d, wt, NULL, &d);
      if (!st) st = on_op2(im, OP_ADD, g0, d, last ? out0(im) : NULL, &g0);
    }
    free(i0);
    free(w);
    RETURN_IF_ERROR(st);
    y = g0;
  }
  return bind0(im, y);
}

/* ---- attention (opset 23) ---- */

/* [B, S, H*D] -> [B, H, S, D] */
static smelt_status heads_first(OnnxImporter *im, int x, int64_t heads, int *out) {
  const TensorType *t = on_type(im, x);
  if (t->rank != 3 || heads <= 0 || t->dim[2] % heads)
    return on_err(im, "3-D inputs need q_num_heads/kv_num_heads that divide the hidden size");
  int64_t s[4] = {t->dim[0], t->dim[1], heads, t->dim[2] / heads}, perm[4] = {0, 2, 1, 3};
  RETURN_IF_ERROR(on_reshape(im, x, s, 4, NULL, &x));
  return on_transpose(im, x, perm, 4, NULL, out);
}

static smelt_status cv_attention(OnnxImporter *im) {
  int q, k, v, mask = on_in(im, 3), pk = on_in(im, 4), pv = on_in(im, 5), y;
  int64_t causal, hq, hkv, qkmode, prec;
  double scale, softcap;
  RETURN_IF_ERROR(on_in_req(im, 0, &q));
  RETURN_IF_ERROR(on_in_req(im, 1, &k));
  RETURN_IF_ERROR(on_in_req(im, 2, &v));
  RETURN_IF_ERROR(on_attr_int(im, "is_causal", 0, &causal));
  RETURN_IF_ERROR(on_attr_int(im, "q_num_heads", 0, &hq));
  RETURN_IF_ERROR(on_attr_int(im, "kv_num_heads", 0, &hkv));
  RETURN_IF_ERROR(on_attr_int(im, "qk_matmul_output_mode", 0, &qkmode));
  RETURN_IF_ERROR(on_attr_int(im, "softmax_precision", 0, &prec));
  RETURN_IF_ERROR(on_attr_float(im, "scale", NAN, &scale));
  RETURN_IF_ERROR(on_attr_float(im, "softcap", 0, &softcap));
  if (softcap != 0) return on_unsupported(im, "softcap");
  if (on_in(im, 6) >= 0) return on_unsupported(im, "nonpad_kv_seqlen");
  if (on_out_used(im, 3)) RETURN_IF_ERROR(on_no_extra_outputs(im, 3));
  bool three = rank_of(im, q) == 3;
  if (three) {
    RETURN_IF_ERROR(heads_first(im, q, hq, &q));
    RETURN_IF_ERROR(heads_first(im, k, hkv, &k));
    RETURN_IF_ERROR(heads_first(im, v, hkv, &v));
  }
  if ((pk >= 0) != (pv >= 0)) return on_err(im, "past_key and past_value come together");
  if (pk >= 0) {
    RETURN_IF_ERROR(on_concat(im, (int[]){pk, k}, 2, 2, on_out_used(im, 1) ? on_out_name(im, 1) : NULL, &k));
    RETURN_IF_ERROR(on_concat(im, (int[]){pv, v}, 2, 2, on_out_used(im, 2) ? on_out_name(im, 2) : NULL, &v));
    RETURN_IF_ERROR(on_bind(im, 1, k));
    RETURN_IF_ERROR(on_bind(im, 2, v));
  } else if (on_out_used(im, 1) || on_out_used(im, 2)) {
    RETURN_IF_ERROR(on_bind(im, 1, k));
    RETURN_IF_ERROR(on_bind(im, 2, v));
  }
  if (causal && pk < 0 && on_type(im, q)->dim[2] != on_type(im, k)->dim[2])
    return on_unsupported(im, "is_causal with query length %lld != key length %lld and no past_key",
                          (long long)on_type(im, q)->dim[2], (long long)on_type(im, k)->dim[2]);
  int ins[4] = {q, k, v, mask};
  int id = on_node(im, OP_ATTENTION, mask >= 0 ? 4 : 3, ins, three ? NULL : out0(im));
  if (!isnan(scale)) ir_set_attr_float(im->g, id, "scale", scale);
  ir_set_attr_bool(im->g, id, "causal", causal != 0);
  RETURN_IF_ERROR(on_done(im, id, &y));
  if (three) {
    const TensorType *t = on_type(im, y);
    int64_t perm[4] = {0, 2, 1, 3}, s[3] = {t->dim[0], t->dim[2], t->dim[1] * t->dim[3]};
    RETURN_IF_ERROR(on_transpose(im, y, perm, 4, NULL, &y));
    RETURN_IF_ERROR(on_reshape(im, y, s, 3, out0(im), &y));
  }
  return bind0(im, y);
}

static smelt_status cv_rotary(OnnxImporter *im) {
  int x, cosv, sinv, pos = on_in(im, 3), y;
  int64_t inter, heads, rd;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &cosv));
  RETURN_IF_ERROR(on_in_req(im, 2, &sinv));
  RETURN_IF_ERROR(on_attr_int(im, "interleaved", 0, &inter));
  RETURN_IF_ERROR(on_attr_int(im, "num_heads", 0, &heads));
  RETURN_IF_ERROR(on_attr_int(im, "rotary_embedding_dim", 0, &rd));
  const TensorType *xt = on_type(im, x);
  int r = xt->rank;
  int64_t orig[4];
  for (int i = 0; i < r; i++) orig[i] = xt->dim[i];
  if (r == 3) {
    RETURN_IF_ERROR(heads_first(im, x, heads, &x));
  } else if (r != 4) {
    return on_err(im, "input must be 3-D or 4-D");
  }
  const TensorType xtype = *on_type(im, x); /* [B, H, S, D]; a copy: see on_type */
  xt = &xtype;
  int64_t D = xt->dim[3];
  if (rd == 0) rd = D;
  if (rd % 2 || rd > D) return on_err(im, "rotary_embedding_dim %lld must be even and at most %lld", (long long)rd, (long long)D);
  if (pos >= 0) {
    RETURN_IF_ERROR(on_gather(im, cosv, pos, 0, NULL, &cosv));
    RETURN_IF_ERROR(on_gather(im, sinv, pos, 0, NULL, &sinv));
  }
  /* caches [B, S, rd/2] -> [B, 1, S, rd/2] to broadcast over heads */
  int64_t one = 1;
  int id = on_node(im, OP_UNSQUEEZE, 1, &cosv, NULL);
  ir_set_attr_ints(im->g, id, "axes", &one, 1);
  RETURN_IF_ERROR(on_done(im, id, &cosv));
  id = on_node(im, OP_UNSQUEEZE, 1, &sinv, NULL);
  ir_set_attr_ints(im->g, id, "axes", &one, 1);
  RETURN_IF_ERROR(on_done(im, id, &sinv));
  int x1, x2, rest = -1, a, b, re, imv;
  if (inter) {
    RETURN_IF_ERROR(on_slice(im, x, 3, 0, rd, 2, NULL, &x1));
    RETURN_IF_ERROR(on_slice(im, x, 3, 1, rd, 2, NULL, &x2));
  } else {
    RETURN_IF_ERROR(on_slice(im, x, 3, 0, rd / 2, 1, NULL, &x1));
    RETURN_IF_ERROR(on_slice(im, x, 3, rd / 2, rd, 1, NULL, &x2));
  }
  if (rd < D) RETURN_IF_ERROR(on_slice(im, x, 3, rd, D, 1, NULL, &rest));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, x1, cosv, NULL, &a));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, x2, sinv, NULL, &b));
  RETURN_IF_ERROR(on_op2(im, OP_SUB, a, b, NULL, &re));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, x1, sinv, NULL, &a));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, x2, cosv, NULL, &b));
  RETURN_IF_ERROR(on_op2(im, OP_ADD, a, b, NULL, &imv));
  bool final4 = r == 4 && rest < 0;
  if (inter) {
    int64_t m1 = -1, s4[4] = {xt->dim[0], xt->dim[1], xt->dim[2], rd};
    id = on_node(im, OP_UNSQUEEZE, 1, &re, NULL);
    ir_set_attr_ints(im->g, id, "axes", &m1, 1);
    RETURN_IF_ERROR(on_done(im, id, &re));
    id = on_node(im, OP_UNSQUEEZE, 1, &imv, NULL);
    ir_set_attr_ints(im->g, id, "axes", &m1, 1);
    RETURN_IF_ERROR(on_done(im, id, &imv));
    RETURN_IF_ERROR(on_concat(im, (int[]){re, imv}, 2, 4, NULL, &y));
    RETURN_IF_ERROR(on_reshape(im, y, s4, 4, final4 ? out0(im) : NULL, &y));
  } else {
    RETURN_IF_ERROR(on_concat(im, (int[]){re, imv}, 2, 3, final4 ? out0(im) : NULL, &y));
  }
  if (rest >= 0) RETURN_IF_ERROR(on_concat(im, (int[]){y, rest}, 2, 3, r == 4 ? out0(im) : NULL, &y));
  if (r == 3) {
    int64_t perm[4] = {0, 2, 1, 3};
    RETURN_IF_ERROR(on_transpose(im, y, perm, 4, NULL, &y));
    RETURN_IF_ERROR(on_reshape(im, y, orig, 3, out0(im), &y));
  }
  return bind0(im, y);
}

/* CumSum: evaluated here when x is constant (position ids from a mask of
 * ones); for a float x, a matmul with a triangular matrix of ones on the
 * last axis (the axis moved there and back). */
static smelt_status cv_cumsum(OnnxImporter *im) {
  int x, av, y, n;
  int64_t excl, rev, axis;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &av));
  RETURN_IF_ERROR(on_attr_int(im, "exclusive", 0, &excl));
  RETURN_IF_ERROR(on_attr_int(im, "reverse", 0, &rev));
  RETURN_IF_ERROR(on_const_ints(im, av, "axis", &axis, 1, &n));
  if (n != 1) return on_err(im, "axis must hold one value");
  const TensorType xtype = *on_type(im, x), *xt = &xtype; /* a copy: see on_type */
  int r = xt->rank, ax;
  RETURN_IF_ERROR(norm_axis(im, axis, r, "axis", &ax));
  int64_t outer, len = xt->dim[ax], inner = 1;
  for (int i = ax + 1; i < r; i++) inner *= xt->dim[i];
  outer = len && inner ? ir_type_numel(xt) / (len * inner) : 0;
  if (on_is_const(im, x)) {
    int v = on_const(im, out0(im), *xt, NULL);
    const void *src = im->g->val[x].data;
    void *dst = im->g->val[v].data;
    for (int64_t o = 0; o < outer; o++)
      for (int64_t i = 0; i < inner; i++) {
        double acc = 0;
        for (int64_t k = 0; k < len; k++) {
          int64_t j = rev ? len - 1 - k : k;
          size_t at = (size_t)((o * len + j) * inner + i);
          double xv = dt_load(xt->dt, src, at);
          if (!excl) acc += xv;
          dt_store(xt->dt, dst, at, acc);
          if (excl) acc += xv;
        }
      }
    return bind0(im, v);
  }
  if (!dt_is_float(xt->dt)) return on_unsupported(im, "CumSum of a non-constant %s tensor", dt_name(xt->dt));
  if (len > 4096) return on_unsupported(im, "CumSum over %lld elements", (long long)len);
  int64_t perm[IR_MAX_RANK];
  for (int i = 0; i < r; i++) perm[i] = i;
  perm[ax] = r - 1, perm[r - 1] = ax;
  if (ax != r - 1) RETURN_IF_ERROR(on_transpose(im, x, perm, r, NULL, &x));
  TensorType tt = {.dt = xt->dt, .rank = 2, .dim = {len, len}};
  int tri = on_const(im, NULL, tt, NULL);
  for (int64_t j = 0; j < len; j++) /* y[i] = sum_j x[j] * T[j][i] */
    for (int64_t i = 0; i < len; i++) {
      bool on = rev ? (excl ? j > i : j >= i) : (excl ? j < i : j <= i);
      dt_store(xt->dt, im->g->val[tri].data, (size_t)(j * len + i), on ? 1 : 0);
    }
  RETURN_IF_ERROR(on_op2(im, OP_MATMUL, x, tri, ax != r - 1 ? NULL : out0(im), &y));
  if (ax != r - 1) RETURN_IF_ERROR(on_transpose(im, y, perm, r, out0(im), &y));
  return bind0(im, y);
}

/* GatherND with constant indices: one gather of slices from the data
 * flattened over its first q axes. */
static smelt_status cv_gather_nd(OnnxImporter *im) {
  int x, iv, y, n;
  int64_t bd;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &iv));
  RETURN_IF_ERROR(on_attr_int(im, "batch_dims", 0, &bd));
  if (bd != 0) return on_unsupported(im, "batch_dims=%lld (supported: 0)", (long long)bd);
  const TensorType xtype = *on_type(im, x), itype = *on_type(im, iv), *xt = &xtype, *it = &itype; /* see on_type */
  if (it->rank < 1) return on_err(im, "indices must have rank >= 1");
  int q = (int)it->dim[it->rank - 1];
  if (q < 1 || q > xt->rank) return on_err(im, "the last axis of indices must be in [1, %d]", xt->rank);
  if (it->rank - 1 + xt->rank - q > IR_MAX_RANK) return on_unsupported(im, "result rank above %d", IR_MAX_RANK);
  int64_t nidx = ir_type_numel(it);
  if (nidx > ONNX_FOLD_MAX_INT) return on_unsupported(im, "more than %lld indices", (long long)ONNX_FOLD_MAX_INT);
  int64_t *idx = malloc(sizeof(int64_t) * (size_t)(nidx ? nidx : 1));
  if (!idx) return st_error(ST_NO_MEMORY, "out of memory");
  smelt_status st = on_const_ints(im, iv, "indices", idx, (int)nidx, &n);
  int64_t rows = 1, nsel = q ? nidx / q : 0;
  for (int d = 0; d < q; d++) rows *= xt->dim[d];
  TensorType lt = {.dt = DT_I64, .rank = it->rank - 1};
  for (int d = 0; d < it->rank - 1; d++) lt.dim[d] = it->dim[d];
  int lin = st ? -1 : on_const(im, NULL, lt, NULL);
  for (int64_t j = 0; j < nsel && !st; j++) {
    int64_t off = 0;
    for (int d = 0; d < q; d++) {
      int64_t c = idx[j * q + d];
      if (c < 0) c += xt->dim[d];
      if (c < 0 || c >= xt->dim[d]) st = on_err(im, "index %lld out of range", (long long)idx[j * q + d]);
      off = off * xt->dim[d] + c;
    }
    ((int64_t *)im->g->val[lin].data)[j] = off;
  }
  free(idx);
  RETURN_IF_ERROR(st);
  int64_t fs[IR_MAX_RANK];
  int fr = 0;
  fs[fr++] = rows;
  for (int d = q; d < xt->rank; d++) fs[fr++] = xt->dim[d];
  RETURN_IF_ERROR(on_reshape(im, x, fs, fr, NULL, &x));
  RETURN_IF_ERROR(on_gather(im, x, lin, 0, out0(im), &y));
  return bind0(im, y);
}

/* ---- composites: ops ONNX has and smelt builds from its own ---- */

/* alpha * (exp(x) - 1), the negative branch of Elu, Selu and Celu. */
static smelt_status expm1_scaled(OnnxImporter *im, int x, double alpha, int *out) {
  DType dt = on_type(im, x)->dt;
  int e;
  RETURN_IF_ERROR(on_op1(im, OP_EXP, x, NULL, &e));
  RETURN_IF_ERROR(on_op2(im, OP_SUB, e, on_scalar(im, dt, 1), NULL, &e));
  return on_op2(im, OP_MUL, e, on_scalar(im, dt, alpha), NULL, out);
}

/* Elu: x < 0 ? alpha (e^x - 1) : x.  Selu: gamma (x <= 0 ? alpha (e^x - 1)
 * : x).  Celu: max(0, x) + min(0, alpha (e^(x/alpha) - 1)).
 * ThresholdedRelu: x > alpha ? x : 0. */
static smelt_status cv_elu_family(OnnxImporter *im) {
  const char *t = im->node->op_type;
  bool selu = !strcmp(t, "Selu"), celu = !strcmp(t, "Celu"), thr = !strcmp(t, "ThresholdedRelu");
  int x, y, c, n;
  double alpha, gamma;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  DType dt = on_type(im, x)->dt;
  if (!dt_is_float(dt)) return on_err(im, "x must be floating point, got %s", dt_name(dt));
  RETURN_IF_ERROR(on_attr_float(im, "alpha", selu ? 1.67326319217681884765625 : 1.0, &alpha));
  RETURN_IF_ERROR(on_attr_float(im, "gamma", 1.05070102214813232421875, &gamma));
  if (celu && alpha == 0) return on_err(im, "alpha must not be 0");
  int zero = on_scalar(im, dt, 0);
  if (thr) {
    RETURN_IF_ERROR(on_op2(im, OP_GREATER, x, on_scalar(im, dt, alpha), NULL, &c));
    RETURN_IF_ERROR(on_op3(im, OP_WHERE, c, x, zero, out0(im), &y));
    return bind0(im, y);
  }
  if (celu) {
    int xs, pos;
    RETURN_IF_ERROR(on_op2(im, OP_DIV, x, on_scalar(im, dt, alpha), NULL, &xs));
    RETURN_IF_ERROR(expm1_scaled(im, xs, alpha, &n));
    RETURN_IF_ERROR(on_op2(im, OP_MINIMUM, n, zero, NULL, &n));
    RETURN_IF_ERROR(on_op2(im, OP_MAXIMUM, x, zero, NULL, &pos));
    RETURN_IF_ERROR(on_op2(im, OP_ADD, pos, n, out0(im), &y));
    return bind0(im, y);
  }
  RETURN_IF_ERROR(expm1_scaled(im, x, alpha, &n));
  RETURN_IF_ERROR(on_op2(im, selu ? OP_GREATER : OP_LESS, x, zero, NULL, &c));
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, c, selu ? x : n, selu ? n : x, selu ? NULL : out0(im), &y));
  if (selu) RETURN_IF_ERROR(on_op2(im, OP_MUL, y, on_scalar(im, dt, gamma), out0(im), &y));
  return bind0(im, y);
}

/* Mish: x tanh(softplus(x)). */
static smelt_status cv_mish(OnnxImporter *im) {
  int x, y;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  DType dt = on_type(im, x)->dt;
  if (!dt_is_float(dt)) return on_err(im, "x must be floating point, got %s", dt_name(dt));
  RETURN_IF_ERROR(softplus(im, x, NULL, &y));
  RETURN_IF_ERROR(on_op1(im, OP_TANH, y, NULL, &y));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, x, y, out0(im), &y));
  return bind0(im, y);
}

/* Shrink: x < -lambd ? x + bias : x > lambd ? x - bias : 0. */
static smelt_status cv_shrink(OnnxImporter *im) {
  int x, y, lo, hi, c;
  double lambd, bias;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  DType dt = on_type(im, x)->dt;
  if (!dt_is_float(dt)) return on_unsupported(im, "x of type %s (smelt shrinks floats)", dt_name(dt));
  RETURN_IF_ERROR(on_attr_float(im, "lambd", 0.5, &lambd));
  RETURN_IF_ERROR(on_attr_float(im, "bias", 0, &bias));
  RETURN_IF_ERROR(on_op2(im, OP_ADD, x, on_scalar(im, dt, bias), NULL, &lo));
  RETURN_IF_ERROR(on_op2(im, OP_SUB, x, on_scalar(im, dt, bias), NULL, &hi));
  RETURN_IF_ERROR(on_op2(im, OP_GREATER, x, on_scalar(im, dt, lambd), NULL, &c));
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, c, hi, on_scalar(im, dt, 0), NULL, &y));
  RETURN_IF_ERROR(on_op2(im, OP_LESS, x, on_scalar(im, dt, -lambd), NULL, &c));
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, c, lo, y, out0(im), &y));
  return bind0(im, y);
}

/* Mod.  Floating point (fmod=1, C's fmod, the sign of the dividend):
 * a - b trunc(a / b), trunc(v) = sign(v) floor(|v|).  Integers: smelt's
 * integer div truncates toward zero, so r = a - b (a / b) is C's remainder
 * (fmod=1), with r = 0 where b = -1 (a / b saturates for the most negative
 * a); fmod=0 takes the divisor's sign, as Python's %: b is added where r
 * is nonzero and its sign differs from b's.  An unsigned r is both. */
static smelt_status cv_mod(OnnxImporter *im) {
  int a, b, q, t, y;
  int64_t fmod;
  RETURN_IF_ERROR(on_in_req(im, 0, &a));
  RETURN_IF_ERROR(on_in_req(im, 1, &b));
  RETURN_IF_ERROR(on_attr_int(im, "fmod", 0, &fmod));
  DType dt = on_type(im, a)->dt;
  if (on_type(im, b)->dt != dt)
    return on_err(im, "A is %s and B is %s (Mod needs one type)", dt_name(dt), dt_name(on_type(im, b)->dt));
  if (!dt_is_float(dt)) {
    if (!dt_is_int(dt)) return on_err(im, "Mod of %s (needs numbers)", dt_name(dt));
    bool sign = dt != DT_U8;
    RETURN_IF_ERROR(on_op2(im, OP_DIV, a, b, NULL, &q));
    RETURN_IF_ERROR(on_op2(im, OP_MUL, q, b, NULL, &t));
    RETURN_IF_ERROR(on_op2(im, OP_SUB, a, t, sign ? NULL : out0(im), &y));
    if (!sign) return bind0(im, y);
    int zero = on_scalar(im, dt, 0), c;
    RETURN_IF_ERROR(on_op2(im, OP_EQUAL, b, on_scalar(im, dt, -1), NULL, &c));
    RETURN_IF_ERROR(on_op3(im, OP_WHERE, c, zero, y, fmod ? out0(im) : NULL, &y));
    if (fmod) return bind0(im, y);
    int sr, sb;
    RETURN_IF_ERROR(on_op1(im, OP_SIGN, y, NULL, &sr));
    RETURN_IF_ERROR(on_op1(im, OP_SIGN, b, NULL, &sb));
    RETURN_IF_ERROR(on_op2(im, OP_MUL, sr, sb, NULL, &c));
    RETURN_IF_ERROR(on_op2(im, OP_LESS, c, zero, NULL, &c));
    RETURN_IF_ERROR(on_op3(im, OP_WHERE, c, b, zero, NULL, &t));
    RETURN_IF_ERROR(on_op2(im, OP_ADD, y, t, out0(im), &y));
    return bind0(im, y);
  }
  if (!fmod) return on_err(im, "floating-point Mod needs fmod=1");
  RETURN_IF_ERROR(on_op2(im, OP_DIV, a, b, NULL, &q));
  RETURN_IF_ERROR(on_op1(im, OP_ABS, q, NULL, &t));
  RETURN_IF_ERROR(on_op1(im, OP_FLOOR, t, NULL, &t));
  RETURN_IF_ERROR(on_op1(im, OP_SIGN, q, NULL, &q));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, q, t, NULL, &t));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, t, b, NULL, &t));
  RETURN_IF_ERROR(on_op2(im, OP_SUB, a, t, out0(im), &y));
  return bind0(im, y);
}

/* InstanceNormalization(x, scale[C], B[C]) and GroupNormalization(x,
 * scale, bias, num_groups): x [N, C, ...] viewed as [N, G, C/G * spatial]
 * (G = C for instance norm), layer_norm over the last axis with unit gain,
 * back to x's shape, then the per-channel affine.  GroupNormalization's
 * scale and bias are per channel ([C], opset 21) or, before opset 21, per
 * group ([G], spread to the group's channels here). */
static smelt_status cv_group_norm(OnnxImporter *im) {
  bool inst = !strcmp(im->node->op_type, "InstanceNormalization");
  int x, sc, bi, y;
  double eps;
  int64_t groups = 0, stash;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &sc));
  RETURN_IF_ERROR(on_in_req(im, 2, &bi));
  RETURN_IF_ERROR(on_attr_float(im, "epsilon", 1e-5, &eps));
  if (!inst) {
    RETURN_IF_ERROR(on_attr_int(im, "num_groups", 0, &groups));
    RETURN_IF_ERROR(on_attr_int(im, "stash_type", 1, &stash)); /* smelt's norms accumulate in f32 or wider */
  }
  TensorType xt = *on_type(im, x);
  if (!dt_is_float(xt.dt) || xt.rank < 2) return on_err(im, "x must be floating point [N, C, ...]");
  int64_t C = xt.dim[1], G = inst ? C : groups, rest = 1;
  if (G < 1 || C % G) return on_err(im, "num_groups %lld must divide the %lld channels", (long long)G, (long long)C);
  for (int d = 2; d < xt.rank; d++) rest *= xt.dim[d];
  int64_t per = ir_type_numel(on_type(im, sc)), perb = ir_type_numel(on_type(im, bi));
  bool by_group = !inst && per == G && G != C && im->opset < 21;
  if ((per != C && !by_group) || perb != per)
    return on_err(im, "scale and bias must hold one value per channel (%lld)%s", (long long)C,
                  inst || im->opset >= 21 ? "" : " or per group");
  if (by_group) { /* per group -> per channel */
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)C);
    if (!idx) return st_error(ST_NO_MEMORY, "out of memory");
    for (int64_t c = 0; c < C; c++) idx[c] = c / (C / G);
    int iv;
    smelt_status st = idx_table(im, idx, C, &iv);
    free(idx);
    RETURN_IF_ERROR(st);
    RETURN_IF_ERROR(on_reshape(im, sc, &G, 1, NULL, &sc));
    RETURN_IF_ERROR(on_reshape(im, bi, &G, 1, NULL, &bi));
    RETURN_IF_ERROR(on_gather(im, sc, iv, 0, NULL, &sc));
    RETURN_IF_ERROR(on_gather(im, bi, iv, 0, NULL, &bi));
  }
  int64_t len = C / G * rest;
  TensorType gt = {.dt = xt.dt, .rank = 1, .dim = {len}};
  int gain = on_const(im, NULL, gt, NULL);
  if (!im->g->val[gain].data) return st_error(ST_NO_MEMORY, "out of memory");
  for (int64_t i = 0; i < len; i++) dt_store(xt.dt, im->g->val[gain].data, (size_t)i, 1.0);
  RETURN_IF_ERROR(on_reshape(im, x, (int64_t[]){xt.dim[0], G, len}, 3, NULL, &y));
  int id = on_node(im, OP_LAYER_NORM, 2, (int[]){y, gain}, NULL);
  ir_set_attr_int(im->g, id, "axis", -1);
  ir_set_attr_float(im->g, id, "eps", eps);
  RETURN_IF_ERROR(on_done(im, id, &y));
  RETURN_IF_ERROR(on_reshape(im, y, xt.dim, xt.rank, NULL, &y));
  int64_t cs[IR_MAX_RANK];
  for (int d = 0; d < xt.rank - 1; d++) cs[d] = d == 0 ? C : 1;
  RETURN_IF_ERROR(on_reshape(im, sc, cs, xt.rank - 1, NULL, &sc));
  RETURN_IF_ERROR(on_reshape(im, bi, cs, xt.rank - 1, NULL, &bi));
  RETURN_IF_ERROR(on_op2(im, OP_MUL, y, sc, NULL, &y));
  RETURN_IF_ERROR(on_op2(im, OP_ADD, y, bi, out0(im), &y));
  return bind0(im, y);
}

/* DepthToSpace (DCR or CRD) and SpaceToDepth on [N, C, H, W]: a reshape to
 * six dims, a transpose, a reshape back, as the ONNX definitions state. */
static smelt_status cv_depth_space(OnnxImporter *im) {
  bool d2s = !strcmp(im->node->op_type, "DepthToSpace");
  int x, y;
  int64_t b;
  const char *mode = "DCR";
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_int(im, "blocksize", 0, &b));
  if (d2s) RETURN_IF_ERROR(on_attr_string(im, "mode", "DCR", &mode));
  bool crd = !strcmp(mode, "CRD");
  if (!crd && strcmp(mode, "DCR")) return on_err(im, "mode '%s' (DCR or CRD)", mode);
  TensorType xt = *on_type(im, x);
  if (xt.rank != 4) return on_err(im, "x must be 4-D [N, C, H, W]");
  if (b < 1) return on_err(im, "blocksize must be positive");
  int64_t N = xt.dim[0], C = xt.dim[1], H = xt.dim[2], W = xt.dim[3];
  int64_t six[6], perm[6], out[4];
  if (d2s) {
    if (C % (b * b)) return on_err(im, "blocksize^2 = %lld does not divide the %lld channels", (long long)(b * b), (long long)C);
    int64_t c = C / (b * b);
    if (crd) {
      memcpy(six, (int64_t[]){N, c, b, b, H, W}, sizeof six);
      memcpy(perm, (int64_t[]){0, 1, 4, 2, 5, 3}, sizeof perm);
    } else {
      memcpy(six, (int64_t[]){N, b, b, c, H, W}, sizeof six);
      memcpy(perm, (int64_t[]){0, 3, 4, 1, 5, 2}, sizeof perm);
    }
    memcpy(out, (int64_t[]){N, c, H * b, W * b}, sizeof out);
  } else {
    if (H % b || W % b) return on_err(im, "blocksize %lld must divide H=%lld and W=%lld", (long long)b, (long long)H, (long long)W);
    memcpy(six, (int64_t[]){N, C, H / b, b, W / b, b}, sizeof six);
    memcpy(perm, (int64_t[]){0, 3, 5, 1, 2, 4}, sizeof perm);
    memcpy(out, (int64_t[]){N, C * b * b, H / b, W / b}, sizeof out);
  }
  RETURN_IF_ERROR(on_reshape(im, x, six, 6, NULL, &y));
  RETURN_IF_ERROR(on_transpose(im, y, perm, 6, NULL, &y));
  RETURN_IF_ERROR(on_reshape(im, y, out, 4, out0(im), &y));
  return bind0(im, y);
}

/* ---- Einsum ---- */

/* Einsum's labels as small numbers: a letter is its character code; the
 * dims an ellipsis covers are 1..EIN_ELL_MAX, right-aligned (the last dim
 * of every operand's ellipsis is label E), so ellipsis dims broadcast as
 * numpy's do.  Implicit output order (ONNX, numpy): the ellipsis dims,
 * then the labels used once, sorted by character code. */
#define EIN_LABELS 128
#define EIN_MAX_OPERANDS 16

typedef struct {
  int n;               /* labels, after the ellipsis is expanded */
  int lab[IR_MAX_RANK];
  int64_t size[IR_MAX_RANK];
} EinTerm;

/* One term of the equation from *p up to ',', '-' or the end: letters and
 * at most one "..." that covers rank - (letters) dims (a rank of -1: the
 * output, whose ellipsis covers `ell` dims). */
static smelt_status ein_term(OnnxImporter *im, const char **p, int rank, int ell, const char *what, EinTerm *t,
                             int *out_ell) {
  int letters[IR_MAX_RANK + 1], nl = 0, at = -1;
  const char *s = *p;
  for (; *s && *s != ',' && *s != '-'; s++) {
    if (*s == ' ') continue;
    if (*s == '.') {
      if (s[1] != '.' || s[2] != '.' || at >= 0) return on_err(im, "equation: a stray '.' in %s", what);
      at = nl;
      s += 2;
      continue;
    }
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
      return on_err(im, "equation: character '%c' in %s (labels are letters)", *s, what);
    if (nl == IR_MAX_RANK) return on_unsupported(im, "equation: %s has more than %d labels", what, IR_MAX_RANK);
    letters[nl++] = *s;
  }
  *p = s;
  int ne = 0;
  if (rank >= 0) {
    if (at < 0 && nl != rank) return on_err(im, "equation: %s has %d labels, the operand has rank %d", what, nl, rank);
    if (at >= 0 && nl > rank)
      return on_err(im, "equation: %s has %d labels besides '...', the operand has rank %d", what, nl, rank);
    ne = at >= 0 ? rank - nl : 0;
  } else {
    ne = at >= 0 ? ell : 0;
    if (nl + ne > IR_MAX_RANK) return on_unsupported(im, "equation: the output has rank %d", nl + ne);
  }
  t->n = 0;
  for (int i = 0; i <= nl; i++) {
    if (i == at)
      for (int j = 0; j < ne; j++) t->lab[t->n++] = (rank >= 0 ? ell - ne : 0) + j + 1;
    if (i < nl) t->lab[t->n++] = letters[i];
  }
  if (out_ell) *out_ell = ne;
  for (int i = 0; i < t->n; i++)
    for (int j = 0; j < i; j++)
      if (t->lab[i] == t->lab[j]) {
        if (t->lab[i] <= IR_MAX_RANK) return on_err(im, "equation: '...' twice in %s", what);
        return on_unsupported(im, "equation: label '%c' appears twice in %s (diagonals are not supported)",
                              t->lab[i], what);
      }
  return NULL;
}

static int ein_find(const EinTerm *t, int lab) {
  for (int i = 0; i < t->n; i++)
    if (t->lab[i] == lab) return i;
  return -1;
}

/* Sums x over the axes whose labels `keep` does not want, dropping them
 * from t. */
static smelt_status ein_sum_out(OnnxImporter *im, int x, EinTerm *t, const bool *keep, int *out) {
  int64_t axes[IR_MAX_RANK];
  int na = 0, n = 0;
  for (int i = 0; i < t->n; i++) {
    if (!keep[t->lab[i]]) {
      axes[na++] = i;
      continue;
    }
    t->lab[n] = t->lab[i], t->size[n] = t->size[i];
    n++;
  }
  t->n = n;
  *out = x;
  if (!na) return NULL;
  return reduce(im, OP_SUM, x, axes, na, false, NULL, out);
}

/* x (labels t) transposed to the label order `want` (a permutation of t);
 * nothing when it is that order already. */
static smelt_status ein_order(OnnxImporter *im, int x, EinTerm *t, const int *want, const char *name, int *out) {
  int64_t perm[IR_MAX_RANK];
  bool moved = false;
  EinTerm to = *t;
  for (int i = 0; i < t->n; i++) {
    perm[i] = ein_find(t, want[i]);
    to.lab[i] = want[i], to.size[i] = t->size[perm[i]];
    moved |= perm[i] != i;
  }
  *t = to;
  *out = x;
  return moved ? on_transpose(im, x, perm, t->n, name, out) : NULL;
}

static bool same_shape(const TensorType *t, const int64_t *shape, int rank) {
  if (t->rank != rank) return false;
  for (int i = 0; i < rank; i++)
    if (t->dim[i] != shape[i]) return false;
  return true;
}

static smelt_status reshape_if(OnnxImporter *im, int x, const int64_t *shape, int rank, const char *name, int *out) {
  *out = x;
  return same_shape(on_type(im, x), shape, rank) ? NULL : on_reshape(im, x, shape, rank, name, out);
}

/* Two operands: one matmul [batch..., M, K] x [batch..., K, N].  Labels in
 * both operands and `keep` (the output's labels and, between operands of a
 * longer Einsum, those of the operands still to come) are batch dims, in
 * both but not `keep` contracted (K), in one free (M or N); labels in one
 * operand only and not `keep` were summed before.  An operand already in the
 * order [batch, K, M] (or [batch, N, K]) is read through transpose_a
 * (transpose_b) instead of a transpose, which keeps "bhid,bhjd->bhij" one
 * matmul as attention exporters write it. */
static smelt_status ein_matmul(OnnxImporter *im, int a, EinTerm *ta, int b, EinTerm *tb, const bool *keep, int *out) {
  int batch[IR_MAX_RANK], contr[IR_MAX_RANK], af[IR_MAX_RANK], bf[IR_MAX_RANK];
  int nb = 0, nc = 0, naf = 0, nbf = 0;
  int64_t K = 1, M = 1, N = 1;
  for (int i = 0; i < ta->n; i++) {
    int l = ta->lab[i];
    bool in_b = ein_find(tb, l) >= 0, in_out = keep[l];
    if (in_b && in_out) batch[nb++] = l;
    else if (in_b) contr[nc++] = l, K *= ta->size[i];
    else af[naf++] = l, M *= ta->size[i];
  }
  for (int i = 0; i < tb->n; i++)
    if (ein_find(ta, tb->lab[i]) < 0) bf[nbf++] = tb->lab[i], N *= tb->size[i];
  if (nb + 2 > IR_MAX_RANK || nb + naf + nbf > IR_MAX_RANK)
    return on_unsupported(im, "Einsum: a product of two operands with %d batch and %d free labels needs rank %d "
                              "(smelt's tensors have at most %d dims)",
                          nb, naf + nbf, nb + 2 > nb + naf + nbf ? nb + 2 : nb + naf + nbf, IR_MAX_RANK);
  /* A as [batch, free, contracted] or, read transposed, [batch, contracted, free] */
  int want[IR_MAX_RANK], wantt[IR_MAX_RANK], k = 0;
  for (int i = 0; i < nb; i++) want[k] = wantt[k] = batch[i], k++;
  for (int i = 0; i < naf; i++) want[k + i] = af[i], wantt[k + nc + i] = af[i];
  for (int i = 0; i < nc; i++) want[k + naf + i] = contr[i], wantt[k + i] = contr[i];
  bool trans_a = naf && nc && !memcmp(ta->lab, wantt, sizeof(int) * (size_t)ta->n) &&
                 memcmp(ta->lab, want, sizeof(int) * (size_t)ta->n);
  RETURN_IF_ERROR(ein_order(im, a, ta, trans_a ? wantt : want, NULL, &a));
  for (int i = 0; i < nc; i++) want[k + i] = contr[i], wantt[k + nbf + i] = contr[i];
  for (int i = 0; i < nbf; i++) want[k + nc + i] = bf[i], wantt[k + i] = bf[i];
  bool trans_b = nbf && nc && !memcmp(tb->lab, wantt, sizeof(int) * (size_t)tb->n) &&
                 memcmp(tb->lab, want, sizeof(int) * (size_t)tb->n);
  RETURN_IF_ERROR(ein_order(im, b, tb, trans_b ? wantt : want, NULL, &b));
  int64_t shape[IR_MAX_RANK];
  for (int i = 0; i < nb; i++) shape[i] = ta->size[i];
  shape[nb] = trans_a ? K : M, shape[nb + 1] = trans_a ? M : K;
  RETURN_IF_ERROR(reshape_if(im, a, shape, nb + 2, NULL, &a));
  shape[nb] = trans_b ? N : K, shape[nb + 1] = trans_b ? K : N;
  RETURN_IF_ERROR(reshape_if(im, b, shape, nb + 2, NULL, &b));
  int id = on_node(im, OP_MATMUL, 2, (int[]){a, b}, NULL);
  ir_set_attr_bool(im->g, id, "transpose_a", trans_a);
  ir_set_attr_bool(im->g, id, "transpose_b", trans_b);
  RETURN_IF_ERROR(on_done(im, id, out));
  /* the result's labels: batch, A's free, B's free */
  EinTerm tr = {.n = nb + naf + nbf};
  for (int i = 0; i < nb; i++) tr.lab[i] = batch[i], tr.size[i] = ta->size[i];
  for (int i = 0; i < naf; i++) tr.lab[nb + i] = af[i], tr.size[nb + i] = ta->size[ein_find(ta, af[i])];
  for (int i = 0; i < nbf; i++) tr.lab[nb + naf + i] = bf[i], tr.size[nb + naf + i] = tb->size[ein_find(tb, bf[i])];
  *ta = tr;
  return NULL;
}

/* The operand whose free labels come first in the output is the matmul's
 * A, so that "bhjd,bhid->bhij" needs no transpose of the result. */
static void ein_first(int *a, EinTerm *ta, int *b, EinTerm *tb, const EinTerm *to) {
  int first = 0;
  for (int j = 0; j < to->n && !first; j++)
    if ((ein_find(ta, to->lab[j]) < 0) != (ein_find(tb, to->lab[j]) < 0))
      first = ein_find(ta, to->lab[j]) >= 0 ? 1 : 2;
  if (first == 2) {
    EinTerm tt = *ta;
    *ta = *tb, *tb = tt;
    int v = *a;
    *a = *b, *b = v;
  }
}

/* Einsum of one operand (sums and a transpose), two (ein_matmul) or more:
 * contracted pairwise from the left, each product keeping the labels that
 * the output or an operand still to come has.  Repeated labels in one term
 * (diagonals, "ii->i") are refused. */
static smelt_status cv_einsum(OnnxImporter *im) {
  const char *eq;
  RETURN_IF_ERROR(on_attr_string(im, "equation", NULL, &eq));
  if (!eq) return on_err(im, "the equation attribute is required");
  int nin = on_nin(im), x[EIN_MAX_OPERANDS];
  if (nin < 1) return on_err(im, "Einsum needs at least one operand");
  if (nin > EIN_MAX_OPERANDS)
    return on_unsupported(im, "Einsum of %d operands (supported: 1 to %d)", nin, EIN_MAX_OPERANDS);
  /* the ellipsis's rank is the largest any operand gives it: the first pass
   * finds it, the second numbers the labels with it */
  EinTerm t[EIN_MAX_OPERANDS], to;
  int ell = IR_MAX_RANK, most = 0;
  for (int pass = 0; pass < 2; pass++) {
    const char *p = eq;
    for (int i = 0; i < nin; i++) {
      char what[32];
      snprintf(what, sizeof what, "operand %d", i + 1);
      RETURN_IF_ERROR(on_in_req(im, i, &x[i]));
      int e;
      RETURN_IF_ERROR(ein_term(im, &p, rank_of(im, x[i]), ell, what, &t[i], &e));
      if (e > most) most = e;
      if (i + 1 < nin && *p++ != ',') return on_err(im, "equation '%s' has %d terms for %d operands", eq, i + 1, nin);
    }
    if (*p == ',') return on_err(im, "equation '%s' has more terms than the %d operands", eq, nin);
    if (pass == 0) {
      ell = most;
      continue;
    }
    if (*p == '-') {
      if (p[1] != '>') return on_err(im, "equation '%s': '-' without '>'", eq);
      p += 2;
      int e;
      RETURN_IF_ERROR(ein_term(im, &p, -1, ell, "the output", &to, &e));
      if (*p) return on_err(im, "equation '%s': '%c' after the output", eq, *p);
      if (ell && !e) /* numpy refuses it too */
        return on_err(im, "equation '%s': the operands' '...' covers %d dims, but the output has no '...'", eq, ell);
    } else { /* implicit output */
      int uses[EIN_LABELS] = {0};
      for (int i = 0; i < nin; i++)
        for (int j = 0; j < t[i].n; j++) uses[t[i].lab[j]]++;
      to.n = 0;
      for (int l = 1; l < EIN_LABELS; l++)
        if ((l <= ell && uses[l]) || (l > IR_MAX_RANK && uses[l] == 1)) to.lab[to.n++] = l;
    }
  }
  /* sizes; a label of size 1 in one operand broadcasts to the other's size */
  int64_t size[EIN_LABELS];
  bool seen[EIN_LABELS] = {false};
  for (int i = 0; i < nin; i++)
    for (int j = 0; j < t[i].n; j++) {
      int l = t[i].lab[j];
      t[i].size[j] = on_type(im, x[i])->dim[j];
      if (seen[l] && size[l] != 1 && t[i].size[j] != 1 && size[l] != t[i].size[j]) {
        if (l <= IR_MAX_RANK)
          return on_err(im, "the operands' '...' dims have sizes %lld and %lld", (long long)size[l],
                        (long long)t[i].size[j]);
        return on_err(im, "label '%c' has size %lld and %lld", l, (long long)size[l], (long long)t[i].size[j]);
      }
      if (!seen[l] || size[l] == 1) size[l] = t[i].size[j];
      seen[l] = true;
    }
  for (int j = 0; j < to.n; j++) {
    if (!seen[to.lab[j]]) return on_err(im, "equation: output label '%c' is in no operand", to.lab[j]);
    to.size[j] = size[to.lab[j]];
  }
  for (int i = 0; i < nin; i++) { /* broadcast the size-1 labels that the other operand has bigger */
    bool grow = false;
    int64_t shape[IR_MAX_RANK];
    for (int j = 0; j < t[i].n; j++) {
      shape[j] = size[t[i].lab[j]];
      grow |= shape[j] != t[i].size[j];
      t[i].size[j] = shape[j];
    }
    if (grow) RETURN_IF_ERROR(expand_to(im, x[i], shape, t[i].n, NULL, &x[i]));
  }
  /* labels neither in the output nor in another operand are summed first */
  for (int i = 0; i < nin; i++) {
    bool keep[EIN_LABELS] = {false};
    for (int j = 0; j < to.n; j++) keep[to.lab[j]] = true;
    for (int k = 0; k < nin; k++)
      for (int j = 0; j < t[k].n && k != i; j++) keep[t[k].lab[j]] = true;
    RETURN_IF_ERROR(ein_sum_out(im, x[i], &t[i], keep, &x[i]));
  }
  int y = x[0];
  for (int i = 1; i < nin; i++) {
    /* what this product keeps: the output's labels and those of operands to come */
    bool keep[EIN_LABELS] = {false}, keep_a[EIN_LABELS], keep_b[EIN_LABELS];
    for (int j = 0; j < to.n; j++) keep[to.lab[j]] = true;
    for (int k = i + 1; k < nin; k++)
      for (int j = 0; j < t[k].n; j++) keep[t[k].lab[j]] = true;
    /* a label only one side has and nothing later wants is summed first */
    memcpy(keep_a, keep, sizeof keep);
    memcpy(keep_b, keep, sizeof keep);
    for (int j = 0; j < t[i].n; j++) keep_a[t[i].lab[j]] = true;
    for (int j = 0; j < t[0].n; j++) keep_b[t[0].lab[j]] = true;
    RETURN_IF_ERROR(ein_sum_out(im, y, &t[0], keep_a, &y));
    RETURN_IF_ERROR(ein_sum_out(im, x[i], &t[i], keep_b, &x[i]));
    if (i == nin - 1) ein_first(&y, &t[0], &x[i], &t[i], &to);
    RETURN_IF_ERROR(ein_matmul(im, y, &t[0], x[i], &t[i], keep, &y));
    if (i < nin - 1) /* the matmul's merged dims back to one per label */
      RETURN_IF_ERROR(reshape_if(im, y, t[0].size, t[0].n, NULL, &y));
  }
  /* to the output's order: a reshape when the matmul merged dims, a transpose */
  int64_t shape[IR_MAX_RANK];
  for (int j = 0; j < t[0].n; j++) shape[j] = t[0].size[j];
  bool ordered = !memcmp(t[0].lab, to.lab, sizeof(int) * (size_t)to.n);
  RETURN_IF_ERROR(reshape_if(im, y, shape, t[0].n, ordered ? out0(im) : NULL, &y));
  RETURN_IF_ERROR(ein_order(im, y, &t[0], to.lab, out0(im), &y));
  return bind0(im, y);
}

/* ReduceLogSumExp: m + log(sum(exp(x - m))) with m the max (kept dims,
 * so that large values do not overflow); ReduceLogSum: log(sum(x));
 * ReduceL1: sum(|x|). */
static smelt_status cv_reduce_log(OnnxImporter *im) {
  const char *t = im->node->op_type;
  int x, y, m = -1, n;
  int64_t axes[MAXV], keep;
  bool identity;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_int(im, "keepdims", 1, &keep));
  RETURN_IF_ERROR(reduce_axes(im, axes, &n, &identity));
  if (!strcmp(t, "ReduceL1")) {
    RETURN_IF_ERROR(on_op1(im, OP_ABS, x, NULL, &x));
    if (identity) return bind0(im, x);
    RETURN_IF_ERROR(reduce(im, OP_SUM, x, n >= 0 ? axes : NULL, n, keep != 0, out0(im), &y));
    return bind0(im, y);
  }
  if (!dt_is_float(on_type(im, x)->dt)) return on_err(im, "x must be floating point");
  bool lse = !strcmp(t, "ReduceLogSumExp");
  if (identity) { /* log(exp(x)) and log(x) over no axes */
    if (lse) return bind0(im, x);
    RETURN_IF_ERROR(on_op1(im, OP_LOG, x, out0(im), &y));
    return bind0(im, y);
  }
  if (lse) {
    RETURN_IF_ERROR(reduce(im, OP_MAX, x, n >= 0 ? axes : NULL, n, true, NULL, &m));
    RETURN_IF_ERROR(on_op2(im, OP_SUB, x, m, NULL, &x));
    RETURN_IF_ERROR(on_op1(im, OP_EXP, x, NULL, &x));
  }
  RETURN_IF_ERROR(reduce(im, OP_SUM, x, n >= 0 ? axes : NULL, n, true, NULL, &y));
  RETURN_IF_ERROR(on_op1(im, OP_LOG, y, NULL, &y));
  if (lse) RETURN_IF_ERROR(on_op2(im, OP_ADD, y, m, NULL, &y));
  TensorType yt = *on_type(im, y), want = yt;
  if (!keep) { /* drop the reduced (now 1) axes */
    int64_t all[IR_MAX_RANK];
    int na = n >= 0 ? n : yt.rank;
    for (int i = 0; i < na; i++) all[i] = n >= 0 ? (axes[i] < 0 ? axes[i] + yt.rank : axes[i]) : i;
    want.rank = 0;
    for (int d = 0; d < yt.rank; d++) {
      bool red = false;
      for (int i = 0; i < na; i++) red |= all[i] == d;
      if (!red) want.dim[want.rank++] = yt.dim[d];
    }
  }
  RETURN_IF_ERROR(on_reshape(im, y, want.dim, want.rank, out0(im), &y));
  return bind0(im, y);
}

/* ReduceProd: smelt has no product reduction, so each reduced axis is
 * halved in turn: its first half times its second half, an odd last
 * element carried along by a concat, until the axis has size 1 (about
 * log2(n) slices and muls; exact for integers up to smelt's saturating
 * multiply, and for floats a product taken in another order). */
static smelt_status cv_reduce_prod(OnnxImporter *im) {
  int x, y, n;
  int64_t axes[MAXV], keep;
  bool identity;
  RETURN_IF_ERROR(reduce_operands(im, &x, axes, &n, &keep, &identity));
  if (identity) return bind0(im, x);
  TensorType xt = *on_type(im, x);
  if (xt.dt == DT_BOOL) return on_err(im, "x must be a number, got bool");
  bool red[IR_MAX_RANK] = {false};
  if (n < 0) {
    for (int d = 0; d < xt.rank; d++) red[d] = true;
  } else {
    for (int i = 0; i < n; i++) {
      int ax;
      RETURN_IF_ERROR(norm_axis(im, axes[i], xt.rank, "axis", &ax));
      if (red[ax]) return on_err(im, "axis %lld is named twice", (long long)axes[i]);
      red[ax] = true;
    }
  }
  y = x;
  for (int d = 0; d < xt.rank; d++) {
    if (!red[d]) continue;
    if (xt.dim[d] == 0) return on_unsupported(im, "ReduceProd over axis %d of size 0", d);
    for (int64_t len = xt.dim[d]; len > 1;) {
      int64_t h = len / 2;
      int lo, hi;
      RETURN_IF_ERROR(on_slice(im, y, d, 0, h, 1, NULL, &lo));
      RETURN_IF_ERROR(on_slice(im, y, d, h, 2 * h, 1, NULL, &hi));
      int odd = -1;
      if (len % 2) RETURN_IF_ERROR(on_slice(im, y, d, 2 * h, len, 1, NULL, &odd));
      RETURN_IF_ERROR(on_op2(im, OP_MUL, lo, hi, NULL, &y));
      if (odd >= 0) RETURN_IF_ERROR(on_concat(im, (int[]){y, odd}, 2, d, NULL, &y));
      len = h + (len % 2);
    }
  }
  TensorType want = *on_type(im, y);
  if (!keep) { /* drop the reduced (now 1) axes */
    want.rank = 0;
    for (int d = 0; d < xt.rank; d++)
      if (!red[d]) want.dim[want.rank++] = xt.dim[d];
  }
  RETURN_IF_ERROR(reshape_if(im, y, want.dim, want.rank, out0(im), &y));
  return bind0(im, y);
}

/* LpNormalization: x / ||x||_p along axis, p 1 or 2 (ONNX divides by the
 * norm as it is: a zero norm gives NaN or infinity there too). */
static smelt_status cv_lp_norm(OnnxImporter *im) {
  int x, y, nrm;
  int64_t axis, p;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_attr_int(im, "axis", -1, &axis));
  RETURN_IF_ERROR(on_attr_int(im, "p", 2, &p));
  if (p != 1 && p != 2) return on_err(im, "p must be 1 or 2, got %lld", (long long)p);
  int ax;
  RETURN_IF_ERROR(norm_axis(im, axis, on_type(im, x)->rank, "axis", &ax));
  int64_t a64 = ax;
  if (p == 1) RETURN_IF_ERROR(on_op1(im, OP_ABS, x, NULL, &nrm));
  else RETURN_IF_ERROR(on_op2(im, OP_MUL, x, x, NULL, &nrm));
  RETURN_IF_ERROR(reduce(im, OP_SUM, nrm, &a64, 1, true, NULL, &nrm));
  if (p == 2) RETURN_IF_ERROR(on_op1(im, OP_SQRT, nrm, NULL, &nrm));
  RETURN_IF_ERROR(on_op2(im, OP_DIV, x, nrm, out0(im), &y));
  return bind0(im, y);
}

/* TopK(x, K): smelt's topk (values and int64 indices, sorted; ONNX lets
 * sorted=0 return any order, so sorted output is valid for both).  K must
 * be a constant. */
static smelt_status cv_topk(OnnxImporter *im) {
  int x, kv;
  int64_t axis, largest, sorted, k[1];
  int nk;
  RETURN_IF_ERROR(on_in_req(im, 0, &x));
  RETURN_IF_ERROR(on_in_req(im, 1, &kv));
  RETURN_IF_ERROR(on_attr_int(im, "axis", -1, &axis));
  RETURN_IF_ERROR(on_attr_int(im, "largest", 1, &largest));
  RETURN_IF_ERROR(on_attr_int(im, "sorted", 1, &sorted));
  RETURN_IF_ERROR(on_const_ints(im, kv, "K", k, 1, &nk));
  if (nk != 1) return on_err(im, "K must hold one value");
  const TensorType *xt = on_type(im, x);
  int ax;
  RETURN_IF_ERROR(norm_axis(im, axis, xt->rank, "axis", &ax));
  if (k[0] < 0 || k[0] > xt->dim[ax])
    return on_err(im, "K=%lld is outside [0, %lld]", (long long)k[0], (long long)xt->dim[ax]);
  if (k[0] == 0) return on_unsupported(im, "K=0 (an empty result)");
  const char *names[2] = {on_out_used(im, 0) ? on_out_name(im, 0) : on_tmp_name(im, "values"),
                          on_out_used(im, 1) ? on_out_name(im, 1) : on_tmp_name(im, "indices")};
  int id = on_node_multi(im, OP_TOPK, 1, &x, 2, names);
  ir_set_attr_int(im->g, id, "axis", ax);
  ir_set_attr_int(im->g, id, "k", k[0]);
  ir_set_attr_bool(im->g, id, "largest", largest != 0);
  int v;
  RETURN_IF_ERROR(on_done(im, id, &v));
  RETURN_IF_ERROR(on_bind(im, 0, im->g->node[id].out[0]));
  return on_bind(im, 1, im->g->node[id].out[1]);
}

/* OneHot(indices, depth, values[off, on]): where(indices == iota, on, off)
 * with the new axis at `axis`; negative indices count from depth (ONNX).
 * depth must be a constant. */
static smelt_status cv_one_hot(OnnxImporter *im) {
  int idx, dv, vals, y, eq, neg;
  int64_t axis;
  double depth;
  RETURN_IF_ERROR(on_in_req(im, 0, &idx));
  RETURN_IF_ERROR(on_in_req(im, 1, &dv));
  RETURN_IF_ERROR(on_in_req(im, 2, &vals));
  RETURN_IF_ERROR(on_attr_int(im, "axis", -1, &axis));
  RETURN_IF_ERROR(on_const_scalar(im, dv, "depth", &depth));
  TensorType it = *on_type(im, idx), vt = *on_type(im, vals);
  if (!(depth >= 1 && depth <= 1 << 24)) return on_err(im, "depth %g must be in [1, 2^24]", depth);
  if (ir_type_numel(&vt) != 2) return on_err(im, "values must hold two elements: [off, on]");
  int r = it.rank + 1, ax;
  RETURN_IF_ERROR(norm_axis(im, axis, r, "axis", &ax));
  int64_t D = (int64_t)depth;
  if (it.dt != DT_I64) RETURN_IF_ERROR(on_cast(im, idx, DT_I64, NULL, &idx));
  RETURN_IF_ERROR(on_op2(im, OP_LESS, idx, on_scalar(im, DT_I64, 0), NULL, &neg));
  int wrapped;
  RETURN_IF_ERROR(on_op2(im, OP_ADD, idx, on_scalar(im, DT_I64, (double)D), NULL, &wrapped));
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, neg, wrapped, idx, NULL, &idx));
  int un = on_node(im, OP_UNSQUEEZE, 1, &idx, NULL);
  int64_t a64 = ax;
  ir_set_attr_ints(im->g, un, "axes", &a64, 1);
  RETURN_IF_ERROR(on_done(im, un, &idx));
  double *iota = malloc(sizeof(double) * (size_t)D);
  if (!iota) return st_error(ST_NO_MEMORY, "out of memory");
  for (int64_t i = 0; i < D; i++) iota[i] = (double)i;
  int io = axis_table(im, DT_I64, r, ax, iota, D);
  free(iota);
  RETURN_IF_ERROR(on_op2(im, OP_EQUAL, idx, io, NULL, &eq));
  int off, on;
  RETURN_IF_ERROR(on_reshape(im, vals, (int64_t[]){2}, 1, NULL, &vals));
  RETURN_IF_ERROR(on_slice(im, vals, 0, 0, 1, 1, NULL, &off));
  RETURN_IF_ERROR(on_slice(im, vals, 0, 1, 2, 1, NULL, &on));
  RETURN_IF_ERROR(on_reshape(im, off, NULL, 0, NULL, &off));
  RETURN_IF_ERROR(on_reshape(im, on, NULL, 0, NULL, &on));
  RETURN_IF_ERROR(on_op3(im, OP_WHERE, eq, on, off, out0(im), &y));
  return bind0(im, y);
}

/* ---- the table ---- */

static const OnnxOpDef ops[] = {
    {"Abs", cv_unary, ""},
    {"Add", cv_binary, ""},
    {"And", cv_logic, ""},
    {"ArgMax", cv_argmax, "axis keepdims select_last_index"},
    {"ArgMin", cv_argmax, "axis keepdims select_last_index"},
    {"Attention", cv_attention, "is_causal kv_num_heads q_num_heads qk_matmul_output_mode scale softcap softmax_precision"},
    {"AveragePool", cv_pool, "auto_pad ceil_mode count_include_pad dilations kernel_shape pads strides"},
    {"BatchNormalization", cv_batch_norm, "epsilon momentum training_mode"},
    {"Cast", cv_cast, "to saturate"},
    {"CastLike", cv_castlike, "saturate"},
    {"Celu", cv_elu_family, "alpha"},
    {"Clip", cv_clip, ""},
    {"Concat", cv_concat, "axis"},
    {"Constant", cv_constant, "value value_float value_floats value_int value_ints"},
    {"ConstantOfShape", cv_constant_of_shape, "value"},
    {"Conv", cv_conv, "auto_pad dilations group kernel_shape pads strides"},
    {"ConvTranspose", cv_conv_transpose, "auto_pad dilations group kernel_shape output_padding output_shape pads strides"},
    {"Ceil", cv_unary, ""},
    {"Cos", cv_unary, ""},
    {"CumSum", cv_cumsum, "exclusive reverse"},
    {"DepthToSpace", cv_depth_space, "blocksize mode"},
    {"DequantizeLinear", cv_dequantize_linear, "axis block_size"},
    {"Div", cv_binary, ""},
    {"Dropout", cv_dropout, "seed"},
    {"Einsum", cv_einsum, "equation"},
    {"Elu", cv_elu_family, "alpha"},
    {"Equal", cv_binary, ""},
    {"Erf", cv_unary, ""},
    {"Exp", cv_unary, ""},
    {"Expand", cv_expand, ""},
    {"Flatten", cv_flatten, "axis"},
    {"Floor", cv_unary, ""},
    {"Gather", cv_gather, "axis"},
    {"GatherElements", cv_gather_elements, "axis"},
    {"GatherND", cv_gather_nd, "batch_dims"},
    {"Gelu", cv_gelu, "approximate"},
    {"Gemm", cv_gemm, "alpha beta transA transB"},
    {"GlobalAveragePool", cv_global_pool, ""},
    {"GlobalMaxPool", cv_global_pool, ""},
    {"Greater", cv_binary, ""},
    {"GreaterOrEqual", cv_logic, ""},
    {"GroupNormalization", cv_group_norm, "epsilon num_groups stash_type"},
    {"HardSigmoid", cv_hard_sigmoid, "alpha beta"},
    {"HardSwish", cv_hard_swish, ""},
    {"Identity", cv_identity, ""},
    {"InstanceNormalization", cv_group_norm, "epsilon"},
    {"IsInf", cv_isnan_isinf, "detect_negative detect_positive"},
    {"IsNaN", cv_isnan_isinf, ""},
    {"LayerNormalization", cv_layer_norm, "axis epsilon stash_type"},
    {"LeakyRelu", cv_leaky_relu, "alpha"},
    {"Less", cv_binary, ""},
    {"LessOrEqual", cv_logic, ""},
    {"Log", cv_unary, ""},
    {"LogSoftmax", cv_softmax, "axis"},
    {"LpNormalization", cv_lp_norm, "axis p"},
    {"MatMul", cv_matmul, ""},
    {"Max", cv_variadic, ""},
    {"MaxPool", cv_pool, "auto_pad ceil_mode dilations kernel_shape pads storage_order strides"},
    {"Mean", cv_variadic, ""},
    {"Min", cv_variadic, ""},
    {"Mish", cv_mish, ""},
    {"Mod", cv_mod, "fmod"},
    {"Mul", cv_binary, ""},
    {"Neg", cv_unary, ""},
    {"Not", cv_logic, ""},
    {"OneHot", cv_one_hot, "axis"},
    {"Or", cv_logic, ""},
    {"Pad", cv_pad, "mode"},
    {"Pow", cv_binary, ""},
    {"PRelu", cv_prelu, ""},
    {"QuantizeLinear", cv_quantize_linear, "axis block_size output_dtype saturate"},
    {"RMSNormalization", cv_rms_norm, "axis epsilon stash_type"},
    {"Range", cv_range, ""},
    {"Reciprocal", cv_unary, ""},
    {"ReduceL1", cv_reduce_log, "axes keepdims noop_with_empty_axes"},
    {"ReduceL2", cv_reduce, "axes keepdims noop_with_empty_axes"},
    {"ReduceLogSum", cv_reduce_log, "axes keepdims noop_with_empty_axes"},
    {"ReduceLogSumExp", cv_reduce_log, "axes keepdims noop_with_empty_axes"},
    {"ReduceMax", cv_reduce, "axes keepdims noop_with_empty_axes"},
    {"ReduceMean", cv_reduce, "axes keepdims noop_with_empty_axes"},
    {"ReduceMin", cv_reduce, "axes keepdims noop_with_empty_axes"},
    {"ReduceProd", cv_reduce_prod, "axes keepdims noop_with_empty_axes"},
    {"ReduceSum", cv_reduce, "axes keepdims noop_with_empty_axes"},
    {"ReduceSumSquare", cv_reduce, "axes keepdims noop_with_empty_axes"},
    {"Relu", cv_unary, ""},
    {"Reshape", cv_reshape, "allowzero"},
    {"Resize", cv_resize, "antialias axes coordinate_transformation_mode cubic_coeff_a exclude_outside "
                          "extrapolation_value keep_aspect_ratio_policy mode nearest_mode"},
    {"RotaryEmbedding", cv_rotary, "interleaved num_heads rotary_embedding_dim"},
    {"Round", cv_unary, ""},
    {"ScatterND", cv_scatter_nd, "reduction"},
    {"Selu", cv_elu_family, "alpha gamma"},
    {"Shape", cv_shape, "end start"},
    {"Shrink", cv_shrink, "bias lambd"},
    {"Sigmoid", cv_unary, ""},
    {"Sign", cv_unary, ""},
    {"Sin", cv_unary, ""},
    {"Size", cv_size, ""},
    {"Slice", cv_slice, ""},
    {"Softmax", cv_softmax, "axis"},
    {"Softplus", cv_softplus, ""},
    {"SpaceToDepth", cv_depth_space, "blocksize"},
    {"Split", cv_split, "axis num_outputs split"},
    {"Sqrt", cv_unary, ""},
    {"Squeeze", cv_squeeze, "axes"},
    {"Sub", cv_binary, ""},
    {"Sum", cv_variadic, ""},
    {"Tanh", cv_unary, ""},
    {"ThresholdedRelu", cv_elu_family, "alpha"},
    {"Tile", cv_tile, ""},
    {"TopK", cv_topk, "axis largest sorted"},
    {"Transpose", cv_transpose, "perm"},
    {"Trilu", cv_trilu, "upper"},
    {"Unsqueeze", cv_unsqueeze, "axes"},
    {"Where", cv_where, ""},
    {"Xor", cv_logic, ""},
};

/* com.microsoft: ONNX Runtime's contrib operators that quantisation tools
 * emit (onnxruntime.quantization's MatMulNBitsQuantizer, Olive, the model
 * builder of onnxruntime-genai). */
static const OnnxOpDef ms_ops[] = {
    {"MatMulNBits", cv_matmul_nbits, "K N accuracy_level bits block_size"},
};

static bool ms_domain(const char *domain) { return domain && !strcmp(domain, ONNX_MS_DOMAIN); }

const OnnxOpDef *onnx_find_op(const char *domain, const char *op_type) {
  const OnnxOpDef *t = ms_domain(domain) ? ms_ops : ops;
  size_t n = ms_domain(domain) ? sizeof ms_ops / sizeof ms_ops[0] : sizeof ops / sizeof ops[0];
  for (size_t i = 0; i < n; i++)
    if (!strcmp(t[i].op_type, op_type)) return &t[i];
  return NULL;
}

void onnx_supported_ops(const char *domain, char *buf, size_t cap) {
  const OnnxOpDef *t = ms_domain(domain) ? ms_ops : ops;
  size_t n = ms_domain(domain) ? sizeof ms_ops / sizeof ms_ops[0] : sizeof ops / sizeof ops[0], k = 0;
  buf[0] = 0;
  for (size_t i = 0; i < n && k + 40 < cap; i++)
    k += (size_t)snprintf(buf + k, cap - k, "%s%s", i ? " " : "", t[i].op_type);
}

#endif
