/* Every v1 operator on the CPU backend against the reference interpreter.
 *
 * Each case builds a graph of one op (one node per kernel, formed by
 * cg_single_node_groups), in f32, f16 and bf16 where the op is defined on
 * floats and in integer and bool dtypes where it is defined on those, with
 * shapes that exercise the paths that differ: broadcasting from both sides,
 * odd inner sizes (vector remainders), reductions over the last, a middle,
 * several and all axes, rows longer than the row buffer, matmul tiles wider
 * than one accumulator tile, transposed and 1-D operands, conv2d with
 * strides, asymmetric pads, dilations and groups, pooling windows partly in
 * the padding, grouped-query and causal attention with masks, and rope with
 * large positions.  The harness (test_llvm_harness.h) compares every
 * kernel output with the interpreter, checks guard bytes and runs each
 * kernel as several task ranges.
 */
#include <stdarg.h>

#include "tests/unit/test_llvm_harness.h"

#ifdef SMELT_HAVE_LLVM

static const DType FLOATS[] = {DT_F32, DT_F16, DT_BF16};
static const RunOpts R = {.tol32 = 1e-5, .tol16 = 2e-3};
static char label[256];

#define D(...) ((const int64_t[]){__VA_ARGS__})

static const char *L(const char *fmt, ...) SMELT_PRINTF(1, 2);
static const char *L(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(label, sizeof label, fmt, ap);
  va_end(ap);
  return label;
}

/* ---- elementwise ---- */

static void t_unary(Op op, DType dt, Domain dom, const char *approx, bool soft) {
  TG t;
  tg_init(&t, L("%s %s%s%s", ir_op_name(op), dt_name(dt), approx ? " " : "", approx ? approx : ""), 11);
  int x = tg_input(&t, "x", dt, 2, D(3, 37), dom, 0);
  int n = tg_node(&t, op, 1, &x, "y");
  if (approx) ir_set_attr_enum(t.g, n, "approximate", approx);
  RunOpts ro = R;
  ro.soft_f16 = soft;
  tg_run(&t, &ro);
}

static void test_unary(void) {
  struct {
    Op op;
    Domain dom;
  } ops[] = {{OP_NEG, DOM_ANY},       {OP_ABS, DOM_ANY},  {OP_EXP, DOM_ANY},        {OP_LOG, DOM_POS},
             {OP_SQRT, DOM_POS},      {OP_RSQRT, DOM_POS}, {OP_RECIPROCAL, DOM_NONZERO}, {OP_TANH, DOM_WIDE},
             {OP_SIGMOID, DOM_WIDE},  {OP_RELU, DOM_ANY}, {OP_GELU, DOM_WIDE},      {OP_SILU, DOM_WIDE},
             {OP_ERF, DOM_ANY},       {OP_SIN, DOM_WIDE}, {OP_COS, DOM_WIDE},       {OP_FLOOR, DOM_WIDE},
             {OP_CEIL, DOM_WIDE},     {OP_ROUND, DOM_WIDE}, {OP_SIGN, DOM_ANY}};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    for (int d = 0; d < 3; d++) t_unary(ops[i].op, FLOATS[d], ops[i].dom, NULL, false);
    t_unary(ops[i].op, DT_F64, ops[i].dom, NULL, false);
  }
  for (int d = 0; d < 3; d++) t_unary(OP_GELU, FLOATS[d], DOM_WIDE, "tanh", false);
  /* the inline polynomials on NaN, infinities, zeros, tiny and huge values */
  const Op poly[] = {OP_EXP, OP_TANH, OP_ERF, OP_SIGMOID, OP_SILU, OP_GELU};
  for (int i = 0; i < 6; i++)
    for (int d = 0; d < 3; d++) t_unary(poly[i], FLOATS[d], DOM_SPECIAL, NULL, false);
  for (int d = 0; d < 3; d++) t_unary(OP_GELU, FLOATS[d], DOM_SPECIAL, "tanh", false);
  /* and on [-2, 2], where tanh and erf switch formulas */
  t_unary(OP_TANH, DT_F32, DOM_ANY, NULL, false);
  /* f16 through integer bit manipulation instead of F16C */
  t_unary(OP_EXP, DT_F16, DOM_WIDE, NULL, true);
  t_unary(OP_GELU, DT_F16, DOM_WIDE, "tanh", true);
  /* neg, abs, relu and sign on integers and bool */
  const DType ints[] = {DT_I64, DT_I32, DT_I8, DT_U8, DT_BOOL};
  for (int d = 0; d < 5; d++) {
    t_unary(OP_NEG, ints[d], DOM_ANY, NULL, false);
    t_unary(OP_ABS, ints[d], DOM_ANY, NULL, false);
    t_unary(OP_RELU, ints[d], DOM_ANY, NULL, false);
    t_unary(OP_SIGN, ints[d], DOM_ANY, NULL, false);
  }
}

/* One input of each dtype, cast to every dtype. */
static void test_cast(void) {
  const DType all[] = {DT_F32, DT_F16, DT_BF16, DT_F64, DT_I64, DT_I32, DT_I8, DT_U8, DT_BOOL};
  for (int s = 0; s < 9; s++)
    for (int soft = 0; soft < 2; soft++) {
      TG t;
      tg_init(&t, L("cast from %s%s", dt_name(all[s]), soft ? " (soft f16)" : ""), 12);
      int x = tg_input(&t, "x", all[s], 2, D(4, 19), DOM_HUGE, 0);
      for (int d = 0; d < 9; d++) {
        char name[16];
        snprintf(name, sizeof name, "y%d", d);
        int n = tg_node(&t, OP_CAST, 1, &x, name);
        ir_set_attr_dtype(t.g, n, "to", all[d]);
      }
      RunOpts ro = R;
      ro.soft_f16 = soft;
      tg_run(&t, &ro);
    }
}

static void t_binary(Op op, DType dt, Domain da, Domain db) {
  TG t;
  tg_init(&t, L("%s %s", ir_op_name(op), dt_name(dt)), 13);
  /* [4,1,33] with [5,1]: both operands broadcast */
  int a = tg_input(&t, "a", dt, 3, D(4, 1, 33), da, 0);
  int b = tg_input(&t, "b", dt, 2, D(5, 1), db, 0);
  tg_node(&t, op, 2, (int[]){a, b}, "y");
  /* and a scalar operand on the left */
  int c = tg_input(&t, "c", dt, 0, D(0), da, 0);
  tg_node(&t, op, 2, (int[]){c, a}, "z");
  tg_run(&t, &R);
}

static void test_binary(void) {
  const Op arith[] = {OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAXIMUM, OP_MINIMUM, OP_LESS, OP_GREATER, OP_EQUAL};
  const DType all[] = {DT_F32, DT_F16, DT_BF16, DT_F64, DT_I64, DT_I32, DT_I8, DT_U8, DT_BOOL};
  for (int i = 0; i < 9; i++)
    for (int d = 0; d < 9; d++) {
      /* integer division by zero saturates; the reference's i64 limits
       * are those of a double (2^63 - 1024), so i64 divides by non-zero */
      Domain db = arith[i] != OP_DIV ? DOM_ANY : all[d] == DT_I64 ? DOM_POS : DOM_NONZERO;
      t_binary(arith[i], all[d], all[d] == DT_I64 ? db : DOM_ANY, db);
    }
  for (int d = 0; d < 3; d++) t_binary(OP_POW, FLOATS[d], DOM_POS, DOM_ANY);
  t_binary(OP_POW, DT_F64, DOM_POS, DOM_ANY);
  /* integer overflow saturates like the reference's clamped store */
  t_binary(OP_MUL, DT_I8, DOM_HUGE, DOM_HUGE);
  t_binary(OP_ADD, DT_U8, DOM_HUGE, DOM_HUGE);
  t_binary(OP_SUB, DT_I8, DOM_HUGE, DOM_HUGE);
}

static void test_where(void) {
  const DType all[] = {DT_F32, DT_F16, DT_BF16, DT_I32, DT_BOOL};
  for (int d = 0; d < 5; d++) {
    TG t;
    tg_init(&t, L("where %s", dt_name(all[d])), 14);
    int c = tg_input(&t, "c", DT_BOOL, 3, D(3, 1, 17), DOM_ANY, 0);
    int a = tg_input(&t, "a", all[d], 2, D(4, 17), DOM_ANY, 0);
    int b = tg_input(&t, "b", all[d], 1, D(1), DOM_ANY, 0);
    tg_node(&t, OP_WHERE, 3, (int[]){c, a, b}, "y");
    tg_run(&t, &R);
  }
}

/* ---- reductions and norms ---- */

static void t_reduce(Op op, DType dt, const int64_t *axes, int naxes, bool keep) {
  TG t;
  tg_init(&t, L("%s %s axes=%d%s keepdims=%d", ir_op_name(op), dt_name(dt), naxes ? (int)axes[0] : -99,
                naxes > 1 ? "+" : "", keep),
          15);
  int x = tg_input(&t, "x", dt, 3, D(4, 6, 19), DOM_ANY, 0);
  int n = tg_node(&t, op, 1, &x, "y");
  if (naxes) ir_set_attr_ints(t.g, n, "axes", axes, naxes);
  ir_set_attr_bool(t.g, n, "keepdims", keep);
  tg_run(&t, &R);
}

static void test_reduce(void) {
  const Op ops[] = {OP_SUM, OP_MEAN, OP_MAX, OP_MIN};
  for (int o = 0; o < 4; o++)
    for (int d = 0; d < 3; d++) {
      t_reduce(ops[o], FLOATS[d], D(-1), 1, false);
      t_reduce(ops[o], FLOATS[d], D(1), 1, true);
      t_reduce(ops[o], FLOATS[d], D(0, 2), 2, false);
      t_reduce(ops[o], FLOATS[d], NULL, 0, false);
      t_reduce(ops[o], FLOATS[d], NULL, 0, true);
    }
  const DType ints[] = {DT_I32, DT_I64, DT_U8, DT_BOOL};
  for (int d = 0; d < 4; d++) {
    t_reduce(OP_SUM, ints[d], D(-1), 1, false);
    t_reduce(OP_MAX, ints[d], D(0, 1), 2, true);
    t_reduce(OP_MIN, ints[d], D(1), 1, false);
  }
}

static void t_softmax(Op op, DType dt, int rank, const int64_t *dims, int axis) {
  TG t;
  tg_init(&t, L("%s %s axis=%d", ir_op_name(op), dt_name(dt), axis), 16);
  int x = tg_input(&t, "x", dt, rank, dims, DOM_WIDE, 0);
  int n = tg_node(&t, op, 1, &x, "y");
  ir_set_attr_int(t.g, n, "axis", axis);
  tg_run(&t, &R);
}

static void t_norm(Op op, DType dt, int rank, const int64_t *dims, int axis, bool beta) {
  TG t;
  tg_init(&t, L("%s %s axis=%d%s", ir_op_name(op), dt_name(dt), axis, beta ? " beta" : ""), 17);
  int x = tg_input(&t, "x", dt, rank, dims, DOM_ANY, 0);
  int ax = ir_norm_axis(axis, rank);
  int gamma = tg_input(&t, "gamma", dt, 1, &dims[ax], DOM_ANY, 0);
  int in[3] = {x, gamma, beta ? tg_input(&t, "beta", dt, 1, &dims[ax], DOM_ANY, 0) : 0};
  int n = tg_node(&t, op, beta ? 3 : 2, in, "y");
  ir_set_attr_int(t.g, n, "axis", axis);
  tg_run(&t, &R);
}

/* NaN, infinities and signed zeros through the reductions: max/min keep
 * NaN (numpy), softmax rows with NaN or inf are NaN as in the reference. */
static void test_reduce_special(void) {
  const Op ops[] = {OP_SUM, OP_MEAN, OP_MAX, OP_MIN, OP_SOFTMAX, OP_LOG_SOFTMAX};
  for (int o = 0; o < 6; o++)
    for (int d = 0; d < 3; d++) {
      TG t;
      tg_init(&t, L("%s %s special values", ir_op_name(ops[o]), dt_name(FLOATS[d])), 27);
      int x = tg_input(&t, "x", FLOATS[d], 2, D(5, 7), DOM_SPECIAL, 0);
      int n = tg_node(&t, ops[o], 1, &x, "y");
      if (o < 4) ir_set_attr_ints(t.g, n, "axes", D(1), 1);
      tg_run(&t, &R);
    }
}

static void test_softmax_norms(void) {
  for (int d = 0; d < 3; d++) {
    DType dt = FLOATS[d];
    for (int op = 0; op < 2; op++) {
      Op o = op ? OP_LOG_SOFTMAX : OP_SOFTMAX;
      t_softmax(o, dt, 3, D(4, 6, 19), -1);
      t_softmax(o, dt, 3, D(4, 6, 19), 1);
      t_softmax(o, dt, 3, D(4, 6, 19), 0);
      t_softmax(o, dt, 2, D(2, 20000), -1); /* longer than the row buffer */
    }
    t_norm(OP_LAYER_NORM, dt, 3, D(4, 6, 19), -1, true);
    t_norm(OP_LAYER_NORM, dt, 3, D(4, 6, 19), -1, false);
    t_norm(OP_LAYER_NORM, dt, 3, D(4, 6, 19), 1, true);
    t_norm(OP_LAYER_NORM, dt, 2, D(2, 17000), -1, true);
    t_norm(OP_RMS_NORM, dt, 3, D(4, 6, 19), -1, false);
    t_norm(OP_RMS_NORM, dt, 3, D(4, 6, 19), 0, false);
    t_norm(OP_RMS_NORM, dt, 2, D(3, 17000), -1, false);
  }
  t_norm(OP_LAYER_NORM, DT_F64, 2, D(5, 33), -1, true);
  t_softmax(OP_SOFTMAX, DT_F64, 2, D(5, 33), -1);
  for (int d = 0; d < 3; d++) {
    TG t;
    tg_init(&t, L("batch_norm %s", dt_name(FLOATS[d])), 18);
    int in[5];
    in[0] = tg_input(&t, "x", FLOATS[d], 4, D(2, 3, 5, 7), DOM_ANY, 0);
    in[1] = tg_input(&t, "scale", FLOATS[d], 1, D(3), DOM_ANY, 0);
    in[2] = tg_input(&t, "bias", FLOATS[d], 1, D(3), DOM_ANY, 0);
    in[3] = tg_input(&t, "mean", FLOATS[d], 1, D(3), DOM_ANY, 0);
    in[4] = tg_input(&t, "var", FLOATS[d], 1, D(3), DOM_POS, 0);
    tg_node(&t, OP_BATCH_NORM, 5, in, "y");
    tg_run(&t, &R);
  }
}

/* ---- contractions ---- */

static void t_matmul(DType dt, int ra, const int64_t *da, int rb, const int64_t *db, bool ta, bool tb,
                     bool b_const) {
  TG t;
  tg_init(&t, L("matmul %s rank %d@%d ta=%d tb=%d%s", dt_name(dt), ra, rb, ta, tb, b_const ? " const" : ""), 19);
  int a = tg_input(&t, "a", dt, ra, da, DOM_ANY, 0);
  int b = b_const ? tg_const(&t, "w", dt, rb, db, DOM_ANY) : tg_input(&t, "b", dt, rb, db, DOM_ANY, 0);
  int n = tg_node(&t, OP_MATMUL, 2, (int[]){a, b}, "y");
  ir_set_attr_bool(t.g, n, "transpose_a", ta);
  ir_set_attr_bool(t.g, n, "transpose_b", tb);
  tg_run(&t, &R);
}

static void test_matmul(void) {
  for (int d = 0; d < 3; d++) {
    DType dt = FLOATS[d];
    t_matmul(dt, 2, D(5, 7), 2, D(7, 9), false, false, false);
    t_matmul(dt, 2, D(7, 5), 2, D(7, 9), true, false, false);
    t_matmul(dt, 2, D(5, 7), 2, D(9, 7), false, true, true);
    t_matmul(dt, 2, D(7, 5), 2, D(9, 7), true, true, false);
    t_matmul(dt, 3, D(2, 5, 7), 3, D(2, 7, 9), false, false, false);
    t_matmul(dt, 4, D(3, 1, 5, 7), 3, D(4, 7, 9), false, false, false);
    t_matmul(dt, 3, D(2, 5, 7), 2, D(7, 9), false, false, true);
    t_matmul(dt, 1, D(7), 2, D(7, 9), false, false, false);
    t_matmul(dt, 2, D(5, 7), 1, D(7), false, false, false);
    t_matmul(dt, 1, D(7), 1, D(7), false, false, false);
    t_matmul(dt, 3, D(2, 5, 7), 1, D(7), false, false, false);
    t_matmul(dt, 1, D(7), 3, D(2, 7, 9), false, false, false);
    t_matmul(dt, 2, D(3, 20), 2, D(20, 300), false, false, true); /* two column tiles */
    t_matmul(dt, 2, D(3, 20), 2, D(300, 20), false, true, true);
  }
  t_matmul(DT_F64, 2, D(5, 7), 2, D(7, 9), false, false, false);
  t_matmul(DT_I32, 2, D(5, 7), 2, D(9, 7), false, true, false);
  t_matmul(DT_I8, 2, D(5, 40), 2, D(40, 9), false, false, false); /* saturates */
}

typedef struct {
  int64_t x[4], w[4];
  int64_t strides[2], pads[4], dil[2], groups;
  bool bias;
} ConvCase;

static void t_conv(DType dt, const ConvCase *c) {
  TG t;
  tg_init(&t, L("conv2d %s x[%lld,%lld,%lld,%lld] w[%lld,%lld,%lld,%lld] s%lld p%lld%lld%lld%lld d%lld g%lld%s",
                dt_name(dt), (long long)c->x[0], (long long)c->x[1], (long long)c->x[2], (long long)c->x[3],
                (long long)c->w[0], (long long)c->w[1], (long long)c->w[2], (long long)c->w[3],
                (long long)c->strides[0], (long long)c->pads[0], (long long)c->pads[1], (long long)c->pads[2],
                (long long)c->pads[3], (long long)c->dil[0], (long long)c->groups, c->bias ? " bias" : ""),
          20);
  int x = tg_input(&t, "x", dt, 4, c->x, DOM_ANY, 0);
  int w = tg_const(&t, "w", dt, 4, c->w, DOM_ANY);
  int in[3] = {x, w, c->bias ? tg_const(&t, "b", dt, 1, c->w, DOM_ANY) : 0};
  int n = tg_node(&t, OP_CONV2D, c->bias ? 3 : 2, in, "y");
  ir_set_attr_ints(t.g, n, "strides", c->strides, 2);
  ir_set_attr_ints(t.g, n, "pads", c->pads, 4);
  ir_set_attr_ints(t.g, n, "dilations", c->dil, 2);
  ir_set_attr_int(t.g, n, "groups", c->groups);
  tg_run(&t, &R);
}

static void test_conv(void) {
  const ConvCase cases[] = {
      {{2, 4, 9, 11}, {6, 4, 3, 3}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, false},
      {{2, 4, 9, 11}, {6, 4, 3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1, true},
      {{1, 4, 10, 12}, {4, 2, 3, 2}, {1, 2}, {0, 1, 2, 0}, {2, 1}, 2, true},
      {{2, 6, 7, 7}, {6, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 6, false}, /* depthwise */
      {{1, 3, 8, 8}, {5, 3, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true},  /* pointwise */
      {{1, 1, 3, 300}, {2, 1, 1, 3}, {1, 1}, {0, 1, 0, 1}, {1, 1}, 1, false}, /* OW over one tile */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int d = 0; d < 3; d++) t_conv(FLOATS[d], &cases[i]);
}

/* ---- pooling ---- */

static void test_pool(void) {
  for (int d = 0; d < 3; d++)
    for (int op = 0; op < 2; op++) {
      Op o = op ? OP_AVG_POOL2D : OP_MAX_POOL2D;
      TG t;
      tg_init(&t, L("%s %s", ir_op_name(o), dt_name(FLOATS[d])), 21);
      int x = tg_input(&t, "x", FLOATS[d], 4, D(2, 3, 9, 11), DOM_ANY, 0);
      int n = tg_node(&t, o, 1, &x, "y");
      ir_set_attr_ints(t.g, n, "kernel", D(3, 3), 2);
      ir_set_attr_ints(t.g, n, "strides", D(2, 2), 2);
      ir_set_attr_ints(t.g, n, "pads", D(1, 1, 2, 2), 4);
      int n2 = tg_node(&t, o, 1, &x, "z"); /* strides default to the kernel */
      ir_set_attr_ints(t.g, n2, "kernel", D(2, 3), 2);
      tg_run(&t, &R);
    }
  for (int d = 0; d < 3; d++) {
    TG t;
    tg_init(&t, L("global_avg_pool %s", dt_name(FLOATS[d])), 22);
    int x = tg_input(&t, "x", FLOATS[d], 4, D(2, 3, 5, 7), DOM_ANY, 0);
    tg_node(&t, OP_GLOBAL_AVG_POOL, 1, &x, "y");
    int x3 = tg_input(&t, "x3", FLOATS[d], 3, D(2, 3, 10), DOM_ANY, 0);
    tg_node(&t, OP_GLOBAL_AVG_POOL, 1, &x3, "y3");
    tg_run(&t, &R);
  }
}

/* ---- data movement ---- */

static void test_movement(DType dt) {
  TG t;
  tg_init(&t, L("data movement %s", dt_name(dt)), 23);
  int x = tg_input(&t, "x", dt, 3, D(4, 6, 5), DOM_ANY, 0);
  int n;
  n = tg_node(&t, OP_RESHAPE, 1, &x, "r1");
  ir_set_attr_ints(t.g, n, "shape", D(24, 5), 2);
  n = tg_node(&t, OP_RESHAPE, 1, &x, "r2");
  ir_set_attr_ints(t.g, n, "shape", D(4, 30), 2);
  n = tg_node(&t, OP_RESHAPE, 1, &x, "r3");
  ir_set_attr_ints(t.g, n, "shape", D(2, 2, 3, 10), 4);
  n = tg_node(&t, OP_RESHAPE, 1, &x, "r4");
  ir_set_attr_ints(t.g, n, "shape", D(-1), 1);
  n = tg_node(&t, OP_TRANSPOSE, 1, &x, "t1");
  ir_set_attr_ints(t.g, n, "perm", D(2, 0, 1), 3);
  tg_node(&t, OP_TRANSPOSE, 1, &x, "t2"); /* reversed */
  int y = tg_input(&t, "y", dt, 3, D(4, 2, 5), DOM_ANY, 0);
  int z = tg_input(&t, "z", dt, 3, D(4, 1, 5), DOM_ANY, 0);
  n = tg_node(&t, OP_CONCAT, 3, (int[]){x, y, z}, "cat");
  ir_set_attr_int(t.g, n, "axis", 1);
  n = tg_node(&t, OP_CONCAT, 2, (int[]){x, x}, "cat2");
  ir_set_attr_int(t.g, n, "axis", -1);
  n = tg_node(&t, OP_SLICE, 1, &x, "s1");
  ir_set_attr_int(t.g, n, "axis", 1);
  ir_set_attr_int(t.g, n, "start", 1);
  ir_set_attr_int(t.g, n, "end", -1);
  ir_set_attr_int(t.g, n, "step", 2);
  n = tg_node(&t, OP_SLICE, 1, &x, "s2");
  ir_set_attr_int(t.g, n, "axis", 2);
  ir_set_attr_int(t.g, n, "start", -1);
  ir_set_attr_int(t.g, n, "step", -2);
  const char *parts[3] = {"p0", "p1", "p2"};
  n = ir_add_node(t.g, OP_SPLIT, 1, &x, 3, parts, here);
  ir_set_attr_int(t.g, n, "axis", 1);
  ir_set_attr_ints(t.g, n, "sizes", D(1, 3, 2), 3);
  int e = tg_input(&t, "e", dt, 2, D(6, 1), DOM_ANY, 0);
  n = tg_node(&t, OP_EXPAND, 1, &e, "ex");
  ir_set_attr_ints(t.g, n, "shape", D(3, 6, 4), 3);
  int q = tg_input(&t, "q", dt, 4, D(3, 1, 4, 1), DOM_ANY, 0);
  n = tg_node(&t, OP_SQUEEZE, 1, &q, "sq1");
  ir_set_attr_ints(t.g, n, "axes", D(1), 1);
  tg_node(&t, OP_SQUEEZE, 1, &q, "sq2");
  n = tg_node(&t, OP_UNSQUEEZE, 1, &x, "un");
  ir_set_attr_ints(t.g, n, "axes", D(0, 3), 2);
  tg_run(&t, &R);
}

static void test_gather(DType dt, DType it) {
  TG t;
  tg_init(&t, L("gather %s by %s", dt_name(dt), dt_name(it)), 24);
  int table = tg_const(&t, "table", dt, 2, D(10, 16), DOM_ANY);
  int ids = tg_input(&t, "ids", it, 1, D(7), DOM_INDEX, 10);
  tg_node(&t, OP_GATHER, 2, (int[]){table, ids}, "emb");
  int x = tg_input(&t, "x", dt, 3, D(3, 5, 4), DOM_ANY, 0);
  int i2 = tg_input(&t, "i2", it, 2, D(2, 3), DOM_INDEX, 5);
  int n = tg_node(&t, OP_GATHER, 2, (int[]){x, i2}, "g1");
  ir_set_attr_int(t.g, n, "axis", 1);
  tg_run(&t, &R);
}

/* ---- transformer ---- */

typedef struct {
  int64_t B, H, Hkv, S, T, D, Dv;
  bool causal, scale;
  int mask; /* 0 none, 1 float [S,T], 2 bool [B,1,S,T] */
} AttnCase;

static void t_attention(DType dt, const AttnCase *c) {
  TG t;
  tg_init(&t, L("attention %s B%lld H%lld/%lld S%lld T%lld D%lld/%lld causal=%d mask=%d", dt_name(dt), (long long)c->B,
                (long long)c->H, (long long)c->Hkv, (long long)c->S, (long long)c->T, (long long)c->D,
                (long long)c->Dv, c->causal, c->mask),
          25);
  int in[4];
  in[0] = tg_input(&t, "q", dt, 4, D(c->B, c->H, c->S, c->D), DOM_ANY, 0);
  in[1] = tg_input(&t, "k", dt, 4, D(c->B, c->Hkv, c->T, c->D), DOM_ANY, 0);
  in[2] = tg_input(&t, "v", dt, 4, D(c->B, c->Hkv, c->T, c->Dv), DOM_ANY, 0);
  if (c->mask == 1) in[3] = tg_input(&t, "mask", dt, 2, D(c->S, c->T), DOM_ANY, 0);
  if (c->mask == 2) in[3] = tg_input(&t, "mask", DT_BOOL, 4, D(c->B, 1, c->S, c->T), DOM_ANY, 0);
  int n = tg_node(&t, OP_ATTENTION, c->mask ? 4 : 3, in, "y");
  ir_set_attr_bool(t.g, n, "causal", c->causal);
  if (c->scale) ir_set_attr_float(t.g, n, "scale", 0.3);
  tg_run(&t, &R);
}

static void test_attention(void) {
  const AttnCase cases[] = {
      {2, 4, 2, 5, 7, 8, 8, false, false, 0}, {2, 4, 2, 5, 7, 8, 8, true, false, 0},
      {1, 2, 2, 6, 6, 16, 16, true, true, 0}, {1, 4, 1, 1, 9, 8, 8, false, false, 0},
      {2, 2, 2, 5, 7, 8, 6, false, false, 1}, {2, 2, 1, 5, 7, 8, 8, true, false, 2},
      /* head dims of whole f32 vectors and a rest (the vector dot and update) */
      {1, 4, 2, 5, 9, 64, 64, false, true, 0}, {1, 2, 2, 4, 6, 40, 24, true, false, 1}, {1, 2, 1, 3, 5, 20, 36, false, false, 2},
      /* f32 blocks of queries (opaque.c's emit_attention_blocked, head dims of
       * whole vectors and S > 1): keys over several blocks and a partial
       * last one, S not a multiple of the block, masks, GQA, Dv of 128
       * (two queries a block) */
      {1, 4, 2, 37, 37, 64, 64, true, false, 0}, {2, 2, 1, 7, 40, 32, 32, false, true, 1},
      {1, 2, 2, 5, 20, 16, 128, true, false, 2}, {1, 3, 3, 67, 67, 64, 64, false, false, 0},
      {1, 2, 1, 9, 33, 48, 16, true, false, 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int d = 0; d < 3; d++) t_attention(FLOATS[d], &cases[i]);
}

static void t_rope(DType dt, const char *style, int64_t rotary, DType pt, int64_t maxpos) {
  TG t;
  tg_init(&t, L("rope %s %s rotary=%lld pos<%lld", dt_name(dt), style, (long long)rotary, (long long)maxpos), 26);
  int x = tg_input(&t, "x", dt, 4, D(2, 3, 6, 8), DOM_ANY, 0);
  int pos = tg_input(&t, "pos", pt, 1, D(6), DOM_SMALLPOS, maxpos);
  int n = tg_node(&t, OP_ROPE, 2, (int[]){x, pos}, "y");
  ir_set_attr_enum(t.g, n, "style", style);
  if (rotary) ir_set_attr_int(t.g, n, "rotary_dim", rotary);
  tg_run(&t, &R);
}

static void test_rope(void) {
  for (int d = 0; d < 3; d++) {
    t_rope(FLOATS[d], "half", 0, DT_I32, 64);
    t_rope(FLOATS[d], "interleaved", 0, DT_I64, 64);
    t_rope(FLOATS[d], "half", 4, DT_I32, 64);
    t_rope(FLOATS[d], "interleaved", 6, DT_I32, 64);
    t_rope(FLOATS[d], "half", 0, DT_I32, 4096);
  }
}

int main(void) {
  test_unary();
  test_cast();
  test_binary();
  test_where();
  test_reduce();
  test_reduce_special();
  test_softmax_norms();
  test_matmul();
  test_conv();
  test_pool();
  const DType mv[] = {DT_F32, DT_F16, DT_BF16, DT_I64, DT_I8, DT_BOOL};
  for (int d = 0; d < 6; d++) test_movement(mv[d]);
  for (int d = 0; d < 3; d++) test_gather(FLOATS[d], d == 1 ? DT_I64 : DT_I32);
  test_gather(DT_I32, DT_I64);
  test_attention();
  test_rope();
  printf("test_llvm_ops: %d kernels run\n", tg_kernels_run);
  return check_done("test_llvm_ops");
}

#else

int main(void) {
  printf("test_llvm_ops: skipped (built without SMELT_LLVM)\n");
  return 0;
}

#endif
