/* Reference kernels: every operator of ops.def in plain C on doubles.
 *
 * These are the oracle every backend is tested against, so each one is the
 * most direct reading of the operator's definition (SPEC §3, following ONNX
 * and numpy where they overlap) rather than a fast one.  A kernel receives
 * its operands already converted to double in row-major order, together with
 * their types, and the output types that shape inference computed; the
 * interpreter (interp.c) converts to and from the storage dtypes.
 *
 * Broadcasting is done the numpy way with stride 0: an operand is read
 * through strides laid over the output's shape, right-aligned, where a
 * missing or size-1 dimension gets stride 0 (bcast_strides).  Axes in
 * attributes may be negative and are normalised with ir_norm_axis.
 *
 * Kernels trust inference for the output shape but re-check the facts they
 * index with (matching dims, broadcastability, sizes that must agree), so a
 * pass that leaves a graph inconsistent gets an internal error instead of an
 * out-of-bounds read.  Bad data that only shows at run time (a gather index
 * out of range) is a user error located at the node.
 *
 * Choices where the definitions are silent, written down once here:
 *   - integer `div` truncates toward zero (C and ONNX), so does cast from
 *     float to an integer type (numpy astype); integer division by zero
 *     saturates (the store clamps ±inf, and NaN becomes 0);
 *   - `maximum`/`minimum`/`max`/`min` propagate NaN like numpy;
 *   - attention: a bool mask means "may attend" (ONNX, PyTorch SDPA), any
 *     other mask is added to the scores; a query row whose keys are all
 *     masked (possible with causal S > T, or a mask of -inf) yields 0, not
 *     NaN;
 *   - pooling windows that lie wholly in the padding give 0 (avg) and -inf
 *     (max); avg_pool2d divides by the number of in-bounds elements
 *     (count_include_pad = false).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "interp.h"

/* ---- shared helpers ---- */

static smelt_status internal(const RefArgs *a, const char *what) {
  return st_error(ST_INTERNAL, "node '%s' (%s): reference kernel: %s", ir_node_name(a->g, a->n),
                  ir_op_name(a->n->op), what);
}

/* Product of dims [from, to) of t. */
static int64_t dims_prod(const TensorType *t, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= t->dim[i];
  return p;
}

/* Strides (in elements) that read `in` as if it were broadcast to the shape
 * `out`.  Returns false when `in` does not broadcast to `out`. */
static bool bcast_strides(const TensorType *in, const TensorType *out, int64_t *st) {
  if (in->rank > out->rank) return false;
  int64_t s = 1;
  for (int j = out->rank - 1, i = in->rank - 1; j >= 0; j--, i--) {
    if (i < 0) {
      st[j] = 0;
      continue;
    }
    if (in->dim[i] != 1 && in->dim[i] != out->dim[j]) return false;
    st[j] = in->dim[i] == 1 ? 0 : s;
    s *= in->dim[i];
  }
  return true;
}

/* Offset of the element at row-major linear index `lin` of shape `t`, read
 * through strides `st` (one per dim of t). */
static int64_t strided_offset(int64_t lin, const TensorType *t, const int64_t *st) {
  int64_t off = 0;
  for (int j = t->rank - 1; j >= 0; j--) {
    int64_t d = t->dim[j];
    off += (lin % d) * st[j];
    lin /= d;
  }
  return off;
}

static int attr_axis(const RefArgs *a, const char *name, int rank) {
  return ir_norm_axis(ir_attr_int(a->n, name), rank);
}

/* ---- elementwise ---- */

static double sigmoid(double x) {
  /* exp of a large positive argument would overflow; use the form whose
   * exponent is never positive. */
  if (x >= 0) return 1.0 / (1.0 + exp(-x));
  double e = exp(x);
  return e / (1.0 + e);
}

static double gelu(double x, bool tanh_approx) {
  if (tanh_approx) {
    const double k = 0.7978845608028654; /* sqrt(2/pi) */
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
  }
  return 0.5 * x * (1.0 + erf(x * 0.7071067811865476));
}

smelt_status ref_unary(const RefArgs *a) {
  Op op = a->n->op;
  DType to = a->out_type[0]->dt;
  bool tanh_approx = op == OP_GELU && strcmp(ir_attr_enum(a->n, "approximate"), "tanh") == 0;
  int64_t n = ir_type_numel(a->out_type[0]);
  if (n != ir_type_numel(a->in_type[0])) return internal(a, "input and output sizes differ");
  const double *x = a->in[0];
  double *y = a->out[0];
  for (int64_t i = 0; i < n; i++) {
    double v = x[i], r;
    switch (op) {
    case OP_NEG: r = -v; break;
    case OP_ABS: r = fabs(v); break;
    case OP_EXP: r = exp(v); break;
    case OP_LOG: r = log(v); break;
    case OP_SQRT: r = sqrt(v); break;
    case OP_RSQRT: r = 1.0 / sqrt(v); break;
    case OP_RECIPROCAL: r = 1.0 / v; break;
    case OP_TANH: r = tanh(v); break;
    case OP_SIGMOID: r = sigmoid(v); break;
    case OP_RELU: r = v < 0 ? 0.0 : v; break; /* keeps NaN, like numpy's maximum(x, 0) */
    case OP_GELU: r = gelu(v, tanh_approx); break;
    case OP_SILU: r = v * sigmoid(v); break;
    case OP_ERF: r = erf(v); break;
    case OP_SIN: r = sin(v); break;
    case OP_COS: r = cos(v); break;
    case OP_FLOOR: r = floor(v); break;
    case OP_CEIL: r = ceil(v); break;
    case OP_ROUND: r = nearbyint(v); break; /* the default rounding mode: ties to even */
    case OP_SIGN: r = v > 0 ? 1.0 : v < 0 ? -1.0 : v; break;
    case OP_CAST:
      /* The store rounds floats and saturates integers; truncation toward
       * zero is the one part of numpy's astype it must be told about. */
      if (to == DT_BOOL) r = v != 0;
      else if (dt_is_int(to)) r = trunc(v);
      else r = v;
      break;
    default: return internal(a, "not a unary operator");
    }
    y[i] = r;
  }
  return NULL;
}

static double binary_op(Op op, double x, double y, bool int_result) {
  switch (op) {
  case OP_ADD: return x + y;
  case OP_SUB: return x - y;
  case OP_MUL: return x * y;
  case OP_DIV: return int_result ? trunc(x / y) : x / y;
  case OP_POW: return pow(x, y);
  case OP_MAXIMUM: return isnan(x) || isnan(y) ? NAN : x > y ? x : y;
  case OP_MINIMUM: return isnan(x) || isnan(y) ? NAN : x < y ? x : y;
  case OP_LESS: return x < y;
  case OP_GREATER: return x > y;
  case OP_EQUAL: return x == y;
  default: return NAN;
  }
}

smelt_status ref_binary(const RefArgs *a) {
  const TensorType *ot = a->out_type[0];
  int64_t sa[IR_MAX_RANK], sb[IR_MAX_RANK];
  if (!bcast_strides(a->in_type[0], ot, sa) || !bcast_strides(a->in_type[1], ot, sb))
    return internal(a, "operands do not broadcast to the output shape");
  bool int_result = dt_is_int(ot->dt);
  int64_t n = ir_type_numel(ot);
  for (int64_t i = 0; i < n; i++) {
    double x = a->in[0][strided_offset(i, ot, sa)];
    double y = a->in[1][strided_offset(i, ot, sb)];
    a->out[0][i] = binary_op(a->n->op, x, y, int_result);
  }
  return NULL;
}

smelt_status ref_where(const RefArgs *a) {
  const TensorType *ot = a->out_type[0];
  int64_t sc[IR_MAX_RANK], sa[IR_MAX_RANK], sb[IR_MAX_RANK];
  if (!bcast_strides(a->in_type[0], ot, sc) || !bcast_strides(a->in_type[1], ot, sa) ||
      !bcast_strides(a->in_type[2], ot, sb))
    return internal(a, "operands do not broadcast to the output shape");
  int64_t n = ir_type_numel(ot);
  for (int64_t i = 0; i < n; i++) {
    bool c = a->in[0][strided_offset(i, ot, sc)] != 0;
    a->out[0][i] = c ? a->in[1][strided_offset(i, ot, sa)] : a->in[2][strided_offset(i, ot, sb)];
  }
  return NULL;
}

/* ---- reductions ---- */

/* Marks the reduced axes of a rank-`rank` input: `axes` absent = all. */
static smelt_status reduced_axes(const RefArgs *a, int rank, bool *red) {
  const Attr *ax = ir_attr(a->n, "axes");
  for (int i = 0; i < rank; i++) red[i] = ax == NULL;
  if (!ax) return NULL;
  for (int k = 0; k < ax->n; k++) {
    int d = ir_norm_axis(ax->ints[k], rank);
    if (d < 0) return internal(a, "reduction axis out of range");
    red[d] = true;
  }
  return NULL;
}

smelt_status ref_reduce(const RefArgs *a) {
  const TensorType *it = a->in_type[0];
  bool red[IR_MAX_RANK];
  RETURN_IF_ERROR(reduced_axes(a, it->rank, red));
  /* The output, with or without keepdims, has the same row-major layout as
   * the input shape with reduced dims set to 1; index it through strides
   * that are 0 on the reduced axes. */
  int64_t st[IR_MAX_RANK], s = 1, count = 1;
  for (int j = it->rank - 1; j >= 0; j--) {
    st[j] = red[j] ? 0 : s;
    if (red[j]) count *= it->dim[j];
    else s *= it->dim[j];
  }
  int64_t nout = ir_type_numel(a->out_type[0]);
  if (s != nout) return internal(a, "output size does not match the reduced axes");
  Op op = a->n->op;
  double init = op == OP_MAX ? -INFINITY : op == OP_MIN ? INFINITY : 0.0;
  double *y = a->out[0];
  for (int64_t i = 0; i < nout; i++) y[i] = init;
  int64_t nin = ir_type_numel(it);
  for (int64_t i = 0; i < nin; i++) {
    double v = a->in[0][i];
    double *r = &y[strided_offset(i, it, st)];
    switch (op) {
    case OP_SUM:
    case OP_MEAN: *r += v; break;
    case OP_MAX: *r = isnan(*r) || isnan(v) ? NAN : v > *r ? v : *r; break;
    case OP_MIN: *r = isnan(*r) || isnan(v) ? NAN : v < *r ? v : *r; break;
    default: return internal(a, "not a reduction");
    }
  }
  if (op == OP_MEAN)
    for (int64_t i = 0; i < nout; i++) y[i] /= (double)count;
  return NULL;
}

/* Splits shape t around axis: outer * t->dim[axis] * inner == numel. */
static void around_axis(const TensorType *t, int axis, int64_t *outer, int64_t *len, int64_t *inner) {
  *outer = dims_prod(t, 0, axis);
  *len = t->dim[axis];
  *inner = dims_prod(t, axis + 1, t->rank);
}

smelt_status ref_softmax(const RefArgs *a) {
  const TensorType *t = a->in_type[0];
  int axis = attr_axis(a, "axis", t->rank);
  if (axis < 0) return internal(a, "axis out of range");
  int64_t outer, len, inner;
  around_axis(t, axis, &outer, &len, &inner);
  bool logsm = a->n->op == OP_LOG_SOFTMAX;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t in = 0; in < inner; in++) {
      const double *x = a->in[0] + o * len * inner + in;
      double *y = a->out[0] + o * len * inner + in;
      /* Subtracting the maximum keeps exp() from overflowing. */
      double m = -INFINITY, sum = 0;
      for (int64_t k = 0; k < len; k++) m = x[k * inner] > m || isnan(x[k * inner]) ? x[k * inner] : m;
      for (int64_t k = 0; k < len; k++) sum += exp(x[k * inner] - m);
      for (int64_t k = 0; k < len; k++)
        y[k * inner] = logsm ? x[k * inner] - m - log(sum) : exp(x[k * inner] - m) / sum;
    }
  return NULL;
}

/* ---- norms ---- */

/* Shared by layer_norm and rms_norm: normalises x over one axis; gamma and
 * beta (may be NULL) are indexed by the position along that axis. */
static smelt_status norm_over_axis(const RefArgs *a, bool rms) {
  const TensorType *t = a->in_type[0];
  int axis = attr_axis(a, "axis", t->rank);
  if (axis < 0) return internal(a, "axis out of range");
  int64_t outer, len, inner;
  around_axis(t, axis, &outer, &len, &inner);
  if (ir_type_numel(a->in_type[1]) != len || (a->nin > 2 && ir_type_numel(a->in_type[2]) != len))
    return internal(a, "gamma/beta size differs from the normalised axis");
  const double *gamma = a->in[1], *beta = a->nin > 2 ? a->in[2] : NULL;
  double eps = ir_attr_float(a->n, "eps");
  for (int64_t o = 0; o < outer; o++)
    for (int64_t in = 0; in < inner; in++) {
      const double *x = a->in[0] + o * len * inner + in;
      double *y = a->out[0] + o * len * inner + in;
      double mean = 0, var = 0;
      if (!rms) {
        for (int64_t k = 0; k < len; k++) mean += x[k * inner];
        mean /= (double)len;
      }
      /* Two passes (mean, then squared deviations): the textbook form, free
       * of the cancellation that E[x^2] - E[x]^2 suffers. */
      for (int64_t k = 0; k < len; k++) var += (x[k * inner] - mean) * (x[k * inner] - mean);
      var /= (double)len;
      double inv = 1.0 / sqrt(var + eps);
      for (int64_t k = 0; k < len; k++) {
        double v = (x[k * inner] - mean) * inv * gamma[k];
        y[k * inner] = beta ? v + beta[k] : v;
      }
    }
  return NULL;
}

smelt_status ref_layer_norm(const RefArgs *a) { return norm_over_axis(a, false); }
smelt_status ref_rms_norm(const RefArgs *a) { return norm_over_axis(a, true); }

smelt_status ref_batch_norm(const RefArgs *a) {
  const TensorType *t = a->in_type[0];
  if (t->rank < 2) return internal(a, "batch_norm needs a channel axis");
  int64_t outer, C, inner;
  around_axis(t, 1, &outer, &C, &inner);
  for (int i = 1; i < 5; i++)
    if (ir_type_numel(a->in_type[i]) != C) return internal(a, "parameter size differs from channels");
  double eps = ir_attr_float(a->n, "eps");
  const double *scale = a->in[1], *bias = a->in[2], *mean = a->in[3], *var = a->in[4];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t c = 0; c < C; c++) {
      double k = scale[c] / sqrt(var[c] + eps);
      const double *x = a->in[0] + (o * C + c) * inner;
      double *y = a->out[0] + (o * C + c) * inner;
      for (int64_t i = 0; i < inner; i++) y[i] = (x[i] - mean[c]) * k + bias[c];
    }
  return NULL;
}

/* ---- contractions ---- */

/* One matmul operand seen as a stack of matrices: its batch dims and, for
 * element (r, c) of the (possibly transposed) matrix, the offsets r*rs+c*cs. */
typedef struct {
  TensorType batch; /* batch dims only (dtype unused) */
  int64_t rows, cols, rs, cs;
} MatView;

/* A 1-D operand is a row vector on the left and a column vector on the
 * right (numpy); transposition swaps the last two dims of a stored matrix. */
static void mat_view(const TensorType *t, bool transpose, bool is_left, MatView *v) {
  memset(v, 0, sizeof *v);
  if (t->rank == 1) {
    v->rows = is_left ? 1 : t->dim[0];
    v->cols = is_left ? t->dim[0] : 1;
    v->rs = is_left ? 0 : 1;
    v->cs = is_left ? 1 : 0;
    return;
  }
  int r = t->rank;
  v->batch.rank = r - 2;
  for (int i = 0; i < r - 2; i++) v->batch.dim[i] = t->dim[i];
  int64_t R = t->dim[r - 2], C = t->dim[r - 1];
  v->rows = transpose ? C : R;
  v->cols = transpose ? R : C;
  v->rs = transpose ? 1 : C;
  v->cs = transpose ? C : 1;
}

smelt_status ref_matmul(const RefArgs *a) {
  MatView A, B;
  mat_view(a->in_type[0], ir_attr_int(a->n, "transpose_a") != 0, true, &A);
  mat_view(a->in_type[1], ir_attr_int(a->n, "transpose_b") != 0, false, &B);
  if (A.cols != B.rows) return internal(a, "inner dimensions differ");
  /* The broadcast batch shape, numpy style. */
  TensorType bt = {.rank = A.batch.rank > B.batch.rank ? A.batch.rank : B.batch.rank};
  for (int j = 0; j < bt.rank; j++) {
    int ia = j - (bt.rank - A.batch.rank), ib = j - (bt.rank - B.batch.rank);
    int64_t da = ia >= 0 ? A.batch.dim[ia] : 1, db = ib >= 0 ? B.batch.dim[ib] : 1;
    bt.dim[j] = da == 1 ? db : da;
  }
  int64_t sa[IR_MAX_RANK], sb[IR_MAX_RANK];
  if (!bcast_strides(&A.batch, &bt, sa) || !bcast_strides(&B.batch, &bt, sb))
    return internal(a, "batch dimensions do not broadcast");
  int64_t M = A.rows, K = A.cols, N = B.cols, nb = ir_type_numel(&bt);
  if (nb * M * N != ir_type_numel(a->out_type[0])) return internal(a, "output size mismatch");
  /* Batch strides above are in matrices; scale them to elements. */
  int64_t amat = A.rows * A.cols, bmat = B.rows * B.cols;
  for (int64_t b = 0; b < nb; b++) {
    const double *pa = a->in[0] + strided_offset(b, &bt, sa) * amat;
    const double *pb = a->in[1] + strided_offset(b, &bt, sb) * bmat;
    double *pc = a->out[0] + b * M * N;
    for (int64_t i = 0; i < M * N; i++) pc[i] = 0;
    /* i-k-j order: the innermost loop walks a row of B and of C, which is
     * contiguous in the common untransposed case. */
    for (int64_t m = 0; m < M; m++)
      for (int64_t k = 0; k < K; k++) {
        double x = pa[m * A.rs + k * A.cs];
        for (int64_t n = 0; n < N; n++) pc[m * N + n] += x * pb[k * B.rs + n * B.cs];
      }
  }
  return NULL;
}

smelt_status ref_conv2d(const RefArgs *a) {
  const TensorType *xt = a->in_type[0], *wt = a->in_type[1], *yt = a->out_type[0];
  if (xt->rank != 4 || wt->rank != 4 || yt->rank != 4) return internal(a, "conv2d needs rank-4 operands");
  const Attr *strides = ir_attr(a->n, "strides"), *pads = ir_attr(a->n, "pads");
  const Attr *dil = ir_attr(a->n, "dilations");
  int64_t G = ir_attr_int(a->n, "groups");
  if (!strides || strides->n != 2 || !pads || pads->n != 4 || !dil || dil->n != 2 || G < 1)
    return internal(a, "bad strides/pads/dilations/groups");
  int64_t N = xt->dim[0], C = xt->dim[1], H = xt->dim[2], W = xt->dim[3];
  int64_t O = wt->dim[0], Cg = wt->dim[1], KH = wt->dim[2], KW = wt->dim[3];
  int64_t OH = yt->dim[2], OW = yt->dim[3];
  if (Cg * G != C || O % G != 0 || yt->dim[0] != N || yt->dim[1] != O)
    return internal(a, "channel counts do not agree with groups");
  if (a->nin > 2 && ir_type_numel(a->in_type[2]) != O) return internal(a, "bias size differs from O");
  int64_t sh = strides->ints[0], sw = strides->ints[1], pt = pads->ints[0], pl = pads->ints[1];
  int64_t dh = dil->ints[0], dw = dil->ints[1], Og = O / G;
  const double *x = a->in[0], *w = a->in[1], *bias = a->nin > 2 ? a->in[2] : NULL;
  for (int64_t n = 0; n < N; n++)
    for (int64_t o = 0; o < O; o++) {
      int64_t c0 = (o / Og) * Cg; /* first input channel of o's group */
      for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
          double acc = bias ? bias[o] : 0;
          for (int64_t c = 0; c < Cg; c++)
            for (int64_t kh = 0; kh < KH; kh++) {
              int64_t ih = oh * sh - pt + kh * dh;
              if (ih < 0 || ih >= H) continue;
              for (int64_t kw = 0; kw < KW; kw++) {
                int64_t iw = ow * sw - pl + kw * dw;
                if (iw < 0 || iw >= W) continue;
                acc += x[((n * C + c0 + c) * H + ih) * W + iw] * w[((o * Cg + c) * KH + kh) * KW + kw];
              }
            }
          a->out[0][((n * O + o) * OH + oh) * OW + ow] = acc;
        }
    }
  return NULL;
}

/* ---- pooling ---- */

smelt_status ref_pool2d(const RefArgs *a) {
  const TensorType *xt = a->in_type[0], *yt = a->out_type[0];
  if (xt->rank != 4 || yt->rank != 4) return internal(a, "pooling needs NCHW operands");
  const Attr *kernel = ir_attr(a->n, "kernel"), *strides = ir_attr(a->n, "strides");
  const Attr *pads = ir_attr(a->n, "pads");
  if (!kernel || kernel->n != 2 || (strides && strides->n != 2) || !pads || pads->n != 4)
    return internal(a, "bad kernel/strides/pads");
  /* strides absent = the kernel size: non-overlapping windows. */
  const Attr *s = strides ? strides : kernel;
  bool is_max = a->n->op == OP_MAX_POOL2D;
  int64_t NC = xt->dim[0] * xt->dim[1], H = xt->dim[2], W = xt->dim[3];
  int64_t OH = yt->dim[2], OW = yt->dim[3];
  if (yt->dim[0] * yt->dim[1] != NC) return internal(a, "output channels differ from input");
  int64_t KH = kernel->ints[0], KW = kernel->ints[1], sh = s->ints[0], sw = s->ints[1];
  int64_t pt = pads->ints[0], pl = pads->ints[1];
  for (int64_t nc = 0; nc < NC; nc++) {
    const double *x = a->in[0] + nc * H * W;
    for (int64_t oh = 0; oh < OH; oh++)
      for (int64_t ow = 0; ow < OW; ow++) {
        double acc = is_max ? -INFINITY : 0;
        int64_t count = 0;
        for (int64_t kh = 0; kh < KH; kh++) {
          int64_t ih = oh * sh - pt + kh;
          if (ih < 0 || ih >= H) continue;
          for (int64_t kw = 0; kw < KW; kw++) {
            int64_t iw = ow * sw - pl + kw;
            if (iw < 0 || iw >= W) continue;
            double v = x[ih * W + iw];
            if (is_max) acc = isnan(acc) || isnan(v) ? NAN : v > acc ? v : acc;
            else acc += v;
            count++;
          }
        }
        if (!is_max) acc = count ? acc / (double)count : 0;
        a->out[0][(nc * OH + oh) * OW + ow] = acc;
      }
  }
  return NULL;
}

smelt_status ref_global_avg_pool(const RefArgs *a) {
  const TensorType *xt = a->in_type[0];
  if (xt->rank < 2) return internal(a, "global_avg_pool needs [N,C,...]");
  int64_t NC = xt->dim[0] * xt->dim[1], HW = dims_prod(xt, 2, xt->rank);
  if (ir_type_numel(a->out_type[0]) != NC) return internal(a, "output size differs from N*C");
  for (int64_t nc = 0; nc < NC; nc++) {
    double sum = 0;
    for (int64_t i = 0; i < HW; i++) sum += a->in[0][nc * HW + i];
    a->out[0][nc] = HW ? sum / (double)HW : 0;
  }
  return NULL;
}

/* ---- data movement ---- */

/* reshape, squeeze, unsqueeze: the row-major data does not move. */
smelt_status ref_copy(const RefArgs *a) {
  int64_t n = ir_type_numel(a->out_type[0]);
  if (n != ir_type_numel(a->in_type[0])) return internal(a, "input and output sizes differ");
  if (n > 0) memcpy(a->out[0], a->in[0], (size_t)n * sizeof(double));
  return NULL;
}

smelt_status ref_transpose(const RefArgs *a) {
  const TensorType *it = a->in_type[0], *ot = a->out_type[0];
  int r = it->rank;
  if (ot->rank != r) return internal(a, "output rank differs from input");
  int perm[IR_MAX_RANK];
  const Attr *p = ir_attr(a->n, "perm");
  if (p && p->n != r) return internal(a, "perm length differs from rank");
  for (int j = 0; j < r; j++) {
    perm[j] = p ? ir_norm_axis(p->ints[j], r) : r - 1 - j; /* absent: reverse the dims */
    if (perm[j] < 0 || ot->dim[j] != it->dim[perm[j]]) return internal(a, "bad perm");
  }
  /* Output dim j walks input dim perm[j]. */
  int64_t in_st[IR_MAX_RANK], st[IR_MAX_RANK], s = 1;
  for (int i = r - 1; i >= 0; i--) {
    in_st[i] = s;
    s *= it->dim[i];
  }
  for (int j = 0; j < r; j++) st[j] = in_st[perm[j]];
  int64_t n = ir_type_numel(ot);
  for (int64_t i = 0; i < n; i++) a->out[0][i] = a->in[0][strided_offset(i, ot, st)];
  return NULL;
}

smelt_status ref_concat(const RefArgs *a) {
  const TensorType *ot = a->out_type[0];
  int axis = attr_axis(a, "axis", ot->rank);
  if (axis < 0) return internal(a, "axis out of range");
  int64_t outer, len, inner;
  around_axis(ot, axis, &outer, &len, &inner);
  int64_t total = 0;
  for (int k = 0; k < a->nin; k++) {
    if (a->in_type[k]->rank != ot->rank) return internal(a, "operand ranks differ");
    total += a->in_type[k]->dim[axis];
  }
  if (total != len) return internal(a, "operand sizes do not add up to the output");
  /* Each outer slice of the output is the inputs' slices side by side. */
  double *y = a->out[0];
  for (int64_t o = 0; o < outer; o++)
    for (int k = 0; k < a->nin; k++) {
      int64_t chunk = a->in_type[k]->dim[axis] * inner;
      if (chunk > 0) memcpy(y, a->in[k] + o * chunk, (size_t)chunk * sizeof(double));
      y += chunk;
    }
  return NULL;
}

smelt_status ref_slice(const RefArgs *a) {
  const TensorType *it = a->in_type[0], *ot = a->out_type[0];
  int axis = attr_axis(a, "axis", it->rank);
  int64_t step = ir_attr_int(a->n, "step");
  if (axis < 0 || step == 0) return internal(a, "bad axis or step");
  int64_t start = ir_attr_int(a->n, "start"), end = ir_attr_int(a->n, "end");
  int64_t outer, len, inner;
  around_axis(it, axis, &outer, &len, &inner);
  /* ir_slice_bounds clamps a huge step itself; then count <= 1, so k * step
   * below is only ever 0 and cannot overflow. */
  int64_t count;
  ir_slice_bounds(len, start, end, step, &start, &end, &count);
  if (ot->rank != it->rank || ot->dim[axis] != count) return internal(a, "output size differs from the slice");
  double *y = a->out[0];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < count; k++) {
      const double *x = a->in[0] + (o * len + start + k * step) * inner;
      for (int64_t i = 0; i < inner; i++) *y++ = x[i];
    }
  return NULL;
}

smelt_status ref_split(const RefArgs *a) {
  const TensorType *it = a->in_type[0];
  int axis = attr_axis(a, "axis", it->rank);
  if (axis < 0) return internal(a, "axis out of range");
  int64_t outer, len, inner;
  around_axis(it, axis, &outer, &len, &inner);
  /* Inference already turned `sizes` (or the equal split) into the output
   * shapes; the kernel reads the part sizes from there. */
  int64_t total = 0;
  for (int k = 0; k < a->nout; k++) {
    if (a->out_type[k]->rank != it->rank) return internal(a, "output ranks differ from input");
    total += a->out_type[k]->dim[axis];
  }
  if (total != len) return internal(a, "parts do not add up to the input");
  for (int64_t o = 0; o < outer; o++) {
    const double *x = a->in[0] + o * len * inner;
    for (int k = 0; k < a->nout; k++) {
      int64_t chunk = a->out_type[k]->dim[axis] * inner;
      if (chunk > 0) memcpy(a->out[k] + o * chunk, x, (size_t)chunk * sizeof(double));
      x += chunk;
    }
  }
  return NULL;
}

smelt_status ref_gather(const RefArgs *a) {
  const TensorType *dt = a->in_type[0];
  int axis = attr_axis(a, "axis", dt->rank);
  if (axis < 0) return internal(a, "axis out of range");
  int64_t outer, len, inner;
  around_axis(dt, axis, &outer, &len, &inner);
  int64_t nidx = ir_type_numel(a->in_type[1]);
  if (outer * nidx * inner != ir_type_numel(a->out_type[0])) return internal(a, "output size mismatch");
  /* Like numpy take: out[o, i, in] = data[o, idx[i], in]. */
  for (int64_t i = 0; i < nidx; i++) {
    double v = a->in[1][i];
    /* Range-checked in double first: converting an out-of-range double to
     * int64_t would be undefined. */
    if (!(v >= -(double)len && v < (double)len))
      return st_at(a->n->loc, "node '%s' (gather): index %.0f is out of range for axis %d of size %lld",
                   ir_node_name(a->g, a->n), v, axis, (long long)len);
    int64_t k = (int64_t)v;
    if (k < 0) k += len; /* negative indices count from the end */
    for (int64_t o = 0; o < outer; o++) {
      const double *x = a->in[0] + (o * len + k) * inner;
      double *y = a->out[0] + (o * nidx + i) * inner;
      for (int64_t j = 0; j < inner; j++) y[j] = x[j];
    }
  }
  return NULL;
}

smelt_status ref_expand(const RefArgs *a) {
  const TensorType *ot = a->out_type[0];
  int64_t st[IR_MAX_RANK];
  if (!bcast_strides(a->in_type[0], ot, st)) return internal(a, "input does not broadcast to the output");
  int64_t n = ir_type_numel(ot);
  for (int64_t i = 0; i < n; i++) a->out[0][i] = a->in[0][strided_offset(i, ot, st)];
  return NULL;
}

/* ---- transformer ---- */

smelt_status ref_attention(const RefArgs *a) {
  const TensorType *qt = a->in_type[0], *kt = a->in_type[1], *vt = a->in_type[2];
  if (qt->rank != 4 || kt->rank != 4 || vt->rank != 4) return internal(a, "attention needs rank-4 q, k, v");
  int64_t B = qt->dim[0], H = qt->dim[1], S = qt->dim[2], D = qt->dim[3];
  int64_t Hkv = kt->dim[1], T = kt->dim[2], Dv = vt->dim[3];
  if (kt->dim[0] != B || kt->dim[3] != D || vt->dim[0] != B || vt->dim[1] != Hkv || vt->dim[2] != T ||
      Hkv < 1 || H % Hkv != 0)
    return internal(a, "q, k, v shapes do not agree");
  if (ir_type_numel(a->out_type[0]) != B * H * S * Dv) return internal(a, "output size mismatch");
  const Attr *sa = ir_attr(a->n, "scale");
  double scale = sa ? sa->f : 1.0 / sqrt((double)D);
  bool causal = ir_attr_int(a->n, "causal") != 0;
  /* cache: the 4th input is the queries' positions; query i sees slots 0..pos[i] */
  bool cache = ir_attr_int(a->n, "cache") != 0;
  const double *qpos = cache ? a->in[3] : NULL;
  if (cache)
    for (int64_t i = 0; i < S; i++)
      if (!(qpos[i] >= 0 && qpos[i] < (double)T))
        return st_at(a->n->loc, "node '%s' (attention): position %.0f is outside the cache of %lld", ir_node_name(a->g, a->n),
                     qpos[i], (long long)T);
  /* The mask is read as if broadcast to [B,H,S,T]. */
  const double *mask = a->nin > 3 && !cache ? a->in[3] : NULL;
  bool bool_mask = mask && a->in_type[3]->dt == DT_BOOL;
  TensorType st4 = {.rank = 4, .dim = {B, H, S, T}};
  int64_t ms[IR_MAX_RANK];
  if (mask && !bcast_strides(a->in_type[3], &st4, ms)) return internal(a, "mask does not broadcast");
  int64_t group = H / Hkv;
  double *p = malloc((size_t)(T > 0 ? T : 1) * sizeof(double));
  if (!p) return st_error(ST_NO_MEMORY, "out of memory in attention");
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      int64_t hk = h / group; /* grouped-query: consecutive heads share a KV head */
      const double *K = a->in[1] + (b * Hkv + hk) * T * D;
      const double *V = a->in[2] + (b * Hkv + hk) * T * Dv;
      for (int64_t i = 0; i < S; i++) {
        const double *q = a->in[0] + ((b * H + h) * S + i) * D;
        double *y = a->out[0] + ((b * H + h) * S + i) * Dv;
        double m = -INFINITY;
        for (int64_t j = 0; j < T; j++) {
          double s = -INFINITY;
          /* causal: the last query lines up with the last key */
          if (cache ? j <= (int64_t)qpos[i] : !causal || j <= T - S + i) {
            s = 0;
            for (int64_t d = 0; d < D; d++) s += q[d] * K[j * D + d];
            s *= scale;
            if (mask) {
              int64_t lin = ((b * H + h) * S + i) * T + j;
              double mv = mask[strided_offset(lin, &st4, ms)];
              s = bool_mask ? (mv != 0 ? s : -INFINITY) : s + mv;
            }
          }
          p[j] = s;
          if (s > m || isnan(s)) m = s;
        }
        for (int64_t d = 0; d < Dv; d++) y[d] = 0;
        if (m == -INFINITY) continue; /* every key masked: output 0 */
        double sum = 0;
        for (int64_t j = 0; j < T; j++) {
          p[j] = exp(p[j] - m);
          sum += p[j];
        }
        for (int64_t j = 0; j < T; j++)
          for (int64_t d = 0; d < Dv; d++) y[d] += p[j] / sum * V[j * Dv + d];
      }
    }
  free(p);
  return NULL;
}

smelt_status ref_rope(const RefArgs *a) {
  const TensorType *xt = a->in_type[0];
  if (xt->rank < 2) return internal(a, "rope needs x of rank >= 2");
  int64_t S = xt->dim[xt->rank - 2], D = xt->dim[xt->rank - 1];
  if (ir_type_numel(a->in_type[1]) != S) return internal(a, "pos size differs from S");
  const Attr *rda = ir_attr(a->n, "rotary_dim");
  int64_t rd = rda ? rda->i : D;
  if (rd < 0 || rd > D || rd % 2 != 0) return internal(a, "rotary_dim must be even and <= D");
  double base = ir_attr_float(a->n, "base");
  bool half = strcmp(ir_attr_enum(a->n, "style"), "half") == 0;
  int64_t rows = S > 0 && D > 0 ? ir_type_numel(xt) / (S * D) * S : 0;
  for (int64_t r = 0; r < rows; r++) {
    double pos = a->in[1][r % S];
    const double *x = a->in[0] + r * D;
    double *y = a->out[0] + r * D;
    for (int64_t d = rd; d < D; d++) y[d] = x[d]; /* features past rotary_dim pass through */
    for (int64_t p = 0; p < rd / 2; p++) {
      double theta = pos * pow(base, -2.0 * (double)p / (double)rd);
      double c = cos(theta), s = sin(theta);
      /* half (LLaMA/NeoX) pairs p with p + rd/2; interleaved (GPT-J) pairs 2p with 2p+1 */
      int64_t ia = half ? p : 2 * p, ib = half ? p + rd / 2 : 2 * p + 1;
      double xa = x[ia], xb = x[ib];
      y[ia] = xa * c - xb * s;
      y[ib] = xb * c + xa * s;
    }
  }
  return NULL;
}

/* out = dst; out[o, idx[i], in] = src[o, i, in].  An index outside the
 * destination is an error (the compiled kernels skip such rows). */
smelt_status ref_scatter(const RefArgs *a) {
  const TensorType *dt = a->in_type[0];
  int axis = attr_axis(a, "axis", dt->rank);
  if (axis < 0) return internal(a, "axis out of range");
  int64_t outer, len, inner;
  around_axis(dt, axis, &outer, &len, &inner);
  int64_t nidx = ir_type_numel(a->in_type[1]);
  if (outer * nidx * inner != ir_type_numel(a->in_type[2])) return internal(a, "values size mismatch");
  int64_t total = ir_type_numel(dt);
  for (int64_t e = 0; e < total; e++) a->out[0][e] = a->in[0][e];
  for (int64_t i = 0; i < nidx; i++) {
    double v = a->in[1][i];
    if (!(v >= 0 && v < (double)len))
      return st_at(a->n->loc, "node '%s' (scatter): index %.0f is outside axis %d of size %lld", ir_node_name(a->g, a->n),
                   v, axis, (long long)len);
    int64_t k = (int64_t)v;
    for (int64_t o = 0; o < outer; o++) {
      const double *x = a->in[2] + (o * nidx + i) * inner;
      double *y = a->out[0] + (o * len + k) * inner;
      for (int64_t j = 0; j < inner; j++) y[j] = x[j];
    }
  }
  return NULL;
}

/* The first index of the largest element along axis (NaN counts as the
 * largest, as in numpy). */
smelt_status ref_argmax(const RefArgs *a) {
  const TensorType *xt = a->in_type[0];
  int axis = attr_axis(a, "axis", xt->rank);
  if (axis < 0) return internal(a, "axis out of range");
  int64_t outer, len, inner;
  around_axis(xt, axis, &outer, &len, &inner);
  if (outer * inner != ir_type_numel(a->out_type[0])) return internal(a, "output size mismatch");
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      const double *x = a->in[0] + o * len * inner + j;
      int64_t best = 0;
      for (int64_t k = 1; k < len && !isnan(x[best * inner]); k++)
        if (x[k * inner] > x[best * inner] || isnan(x[k * inner])) best = k;
      a->out[0][o * inner + j] = (double)best;
    }
  return NULL;
}

/* topk: the row's (value, index) pairs sorted best first and the first k
 * kept.  The order is total (NaN above every number, equal values by
 * index), so the result does not depend on the sort's stability. */
typedef struct {
  double v;
  int64_t i;
} TopkPair;

static int topk_by_index(const TopkPair *p, const TopkPair *q) { return (p->i > q->i) - (p->i < q->i); }

static int topk_largest_first(const void *a, const void *b) {
  const TopkPair *p = a, *q = b;
  bool np = isnan(p->v), nq = isnan(q->v);
  if (np || nq) return np && nq ? topk_by_index(p, q) : np ? -1 : 1;
  if (p->v != q->v) return p->v > q->v ? -1 : 1;
  return topk_by_index(p, q);
}

static int topk_smallest_first(const void *a, const void *b) {
  const TopkPair *p = a, *q = b;
  bool np = isnan(p->v), nq = isnan(q->v);
  if (np || nq) return np && nq ? topk_by_index(p, q) : np ? 1 : -1;
  if (p->v != q->v) return p->v < q->v ? -1 : 1;
  return topk_by_index(p, q);
}

smelt_status ref_topk(const RefArgs *a) {
  const TensorType *xt = a->in_type[0];
  int axis = attr_axis(a, "axis", xt->rank);
  if (axis < 0) return internal(a, "axis out of range");
  int64_t outer, len, inner, k = ir_attr_int(a->n, "k");
  around_axis(xt, axis, &outer, &len, &inner);
  if (k <= 0 || k > len || outer * k * inner != ir_type_numel(a->out_type[0])) return internal(a, "output size mismatch");
  bool largest = ir_attr_int(a->n, "largest") != 0;
  TopkPair *row = malloc(sizeof *row * (size_t)len);
  if (!row) return st_error(ST_NO_MEMORY, "node '%s' (topk): out of memory", ir_node_name(a->g, a->n));
  for (int64_t o = 0; o < outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      const double *x = a->in[0] + o * len * inner + j;
      for (int64_t e = 0; e < len; e++) row[e] = (TopkPair){x[e * inner], e};
      qsort(row, (size_t)len, sizeof *row, largest ? topk_largest_first : topk_smallest_first);
      for (int64_t e = 0; e < k; e++) {
        a->out[0][(o * k + e) * inner + j] = row[e].v;
        a->out[1][(o * k + e) * inner + j] = (double)row[e].i;
      }
    }
  free(row);
  return NULL;
}

smelt_status ref_arange(const RefArgs *a) {
  int64_t n = ir_type_numel(a->out_type[0]);
  for (int64_t i = 0; i < n; i++) a->out[0][i] = a->in[0][0] + (double)i;
  return NULL;
}

/* dequantize: out[i] = (q[i] - z[s(i)]) * s[s(i)], where s(i) is i with its
 * coordinate along the axis divided by the group (0 when group is 0),
 * computed in double and rounded once into the result's dtype. */
smelt_status ref_dequantize(const RefArgs *a) {
  const TensorType *qt = a->in_type[0];
  if (a->nin < 2) return internal(a, "no scales");
  int axis = attr_axis(a, "axis", qt->rank);
  int64_t group = ir_attr_int(a->n, "group");
  if (axis < 0 || group < 0 || (group > 0 && qt->dim[axis] % group != 0)) return internal(a, "bad axis or group");
  int64_t outer = dims_prod(qt, 0, axis), K = qt->dim[axis], inner = dims_prod(qt, axis + 1, qt->rank);
  int64_t ng = group ? K / group : 1;
  if (ir_type_numel(a->in_type[1]) != outer * ng * inner || (a->nin > 2 && ir_type_numel(a->in_type[2]) != outer * ng * inner))
    return internal(a, "scales or zeros of the wrong size");
  const double *q = a->in[0], *s = a->in[1], *z = a->nin > 2 ? a->in[2] : NULL;
  double *y = a->out[0];
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < K; k++) {
      int64_t gk = group ? k / group : 0;
      for (int64_t i = 0; i < inner; i++) {
        int64_t si = (o * ng + gk) * inner + i, qi = (o * K + k) * inner + i;
        y[qi] = (q[qi] - (z ? z[si] : 0.0)) * s[si];
      }
    }
  return NULL;
}

/* all_reduce and all_gather over one rank are the identity; over several,
 * the reference runs each rank's graph alone and cannot see the others
 * (runtime/comm.c runs them, and tests compare a sharded bundle's results
 * with the unsharded model's). */
smelt_status ref_collective(const RefArgs *a) {
  if (ir_attr_int(a->n, "ranks") != 1)
    return st_at(a->n->loc, "node '%s' (%s): the reference interpreter runs one rank's graph and cannot run a "
                 "collective over %lld ranks; run the bundle on its ranks (smelt run --device cpu), or compare "
                 "with the unsharded model",
                 ir_node_name(a->g, a->n), ir_op_name(a->n->op), (long long)ir_attr_int(a->n, "ranks"));
  int64_t n = ir_type_numel(a->out_type[0]);
  for (int64_t i = 0; i < n; i++) a->out[0][i] = a->in[0][i];
  return NULL;
}
