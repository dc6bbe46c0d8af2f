/* Every operator of ops.def as small single-node cases, gathered into one
 * graph per dtype so that a whole suite is one CUDA module (one NVRTC
 * compile per unit and arch instead of hundreds).
 *
 * Shapes are chosen to reach every path of the CUDA generator: innermost
 * dims divisible by the vector width (vector loads) and not (scalar path),
 * short rows (a warp per row) and long ones (a block per row; rows too long
 * for registers), several GEMM tiles and the small-M tile, broadcasting on
 * every side, negative axes and steps, grouped-query and causal attention
 * with both kinds of mask.  Each input carries the range its values are
 * drawn from (positive for log/sqrt/pow, valid indices for gather).
 *
 * Used by tests/unit/test_cuda_codegen.c (generate + NVRTC compile) and
 * tests/gpu/test_cuda_ops.c (run on the GPU against the interpreter).
 */
#ifndef SMELT_TEST_OP_CASES_H
#define SMELT_TEST_OP_CASES_H

#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

#define OC_MAX_INPUTS 512

typedef struct {
  int value;
  double lo, hi; /* uniform in [lo, hi); integer types: integers in [lo, hi] */
} OcInput;

typedef struct {
  Graph *g;
  DType dt;
  OcInput in[OC_MAX_INPUTS];
  int nin;
  const char *prefix; /* the case being built: names are "prefix/name" */
  bool failed;
  char msg[512];
} OpSuite;

static const SrcLoc oc_loc = {"op_cases", 1, 1};

static inline const char *oc_name(OpSuite *s, const char *name) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s/%s", s->prefix, name);
  return ir_graph_strdup(s->g, buf);
}

static inline int oc_in(OpSuite *s, const char *name, DType dt, int rank, const int64_t *dims, double lo, double hi) {
  TensorType t = {.dt = dt, .rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  int v = ir_add_input(s->g, oc_name(s, name), t, oc_loc);
  if (s->nin < OC_MAX_INPUTS) s->in[s->nin++] = (OcInput){v, lo, hi};
  return v;
}

#define OC_DIMS(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__}
#define OC_X(s, name, ...) oc_in((s), (name), (s)->dt, OC_DIMS(__VA_ARGS__), -2.0, 2.0)
#define OC_POS(s, name, ...) oc_in((s), (name), (s)->dt, OC_DIMS(__VA_ARGS__), 0.5, 2.0)

/* A node with one result named "prefix/out"; returns the node id. */
static inline int oc_node(OpSuite *s, Op op, int nin, const int *in, const char *out) {
  const char *names[1] = {oc_name(s, out)};
  return ir_add_node(s->g, op, nin, in, 1, names, oc_loc);
}

static inline int oc_result(OpSuite *s, int node) { return s->g->node[node].out[0]; }

/* Infers the nodes added since `from` and makes their results outputs. */
static inline void oc_finish(OpSuite *s, int from) {
  for (int i = from; i < s->g->nnode && !s->failed; i++) {
    ir_fill_default_attrs(s->g, i);
    smelt_status st = ir_infer_node(s->g, i);
    if (st) {
      snprintf(s->msg, sizeof s->msg, "case %s: %s", s->prefix, st_message(st));
      st_free(st);
      s->failed = true;
      return;
    }
    for (int o = 0; o < s->g->node[i].nout; o++) ir_add_output(s->g, s->g->node[i].out[o]);
  }
}

#define OC_CASE(s, name) for (int oc_from_ = ((s)->prefix = (name), (s)->g->nnode), oc_once_ = 1; oc_once_; oc_once_ = 0, oc_finish((s), oc_from_))

static inline void oc_unary_cases(OpSuite *s) {
  static const Op ops[] = {OP_NEG, OP_ABS,  OP_EXP,  OP_TANH,  OP_SIGMOID, OP_RELU, OP_GELU, OP_SILU,
                           OP_ERF, OP_SIN,  OP_COS,  OP_FLOOR, OP_CEIL,    OP_ROUND, OP_SIGN};
  static const Op pos_ops[] = {OP_LOG, OP_SQRT, OP_RSQRT, OP_RECIPROCAL};
  char name[64];
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
    snprintf(name, sizeof name, "%s", ir_op_name(ops[i]));
    OC_CASE(s, ir_graph_strdup(s->g, name)) {
      int x = OC_X(s, "x", 3, 37); /* odd: the scalar path */
      oc_node(s, ops[i], 1, &x, "y");
      int x2 = OC_X(s, "xv", 4, 64); /* the vector path */
      oc_node(s, ops[i], 1, &x2, "yv");
    }
  }
  for (size_t i = 0; i < sizeof pos_ops / sizeof *pos_ops; i++) {
    snprintf(name, sizeof name, "%s", ir_op_name(pos_ops[i]));
    OC_CASE(s, ir_graph_strdup(s->g, name)) {
      int x = OC_POS(s, "x", 5, 16);
      oc_node(s, pos_ops[i], 1, &x, "y");
    }
  }
  OC_CASE(s, "gelu_tanh") {
    int x = OC_X(s, "x", 2, 40);
    int n = oc_node(s, OP_GELU, 1, &x, "y");
    ir_set_attr_enum(s->g, n, "approximate", "tanh");
  }
  OC_CASE(s, "cast") {
    int x = oc_in(s, "x", s->dt, OC_DIMS(4, 24), -300, 300);
    DType to[] = {DT_F32, DT_F16, DT_BF16, DT_I32, DT_I8, DT_U8, DT_BOOL, DT_F64};
    for (size_t i = 0; i < sizeof to / sizeof *to; i++) {
      if (to[i] == s->dt) continue;
      snprintf(name, sizeof name, "to_%s", dt_name(to[i]));
      int n = oc_node(s, OP_CAST, 1, &x, name);
      ir_set_attr_dtype(s->g, n, "to", to[i]);
    }
    int xi = oc_in(s, "xi", DT_I32, OC_DIMS(3, 8), -50, 50);
    int n = oc_node(s, OP_CAST, 1, &xi, "from_i32");
    ir_set_attr_dtype(s->g, n, "to", s->dt);
  }
  OC_CASE(s, "cast_roundtrip") {
    /* an explicit cast to f16 rounds, even fused with the cast back */
    int x = OC_X(s, "x", 2, 16);
    int n = oc_node(s, OP_CAST, 1, &x, "h");
    ir_set_attr_dtype(s->g, n, "to", DT_F16);
    int h = oc_result(s, n);
    n = oc_node(s, OP_CAST, 1, &h, "y");
    ir_set_attr_dtype(s->g, n, "to", s->dt);
  }
}

static inline void oc_binary_cases(OpSuite *s) {
  static const Op ops[] = {OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAXIMUM, OP_MINIMUM, OP_LESS, OP_GREATER, OP_EQUAL};
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
    OC_CASE(s, ir_op_name(ops[i])) {
      int a = OC_X(s, "a", 2, 3, 16), b = OC_X(s, "b", 3, 1); /* both sides broadcast */
      int in[2] = {a, b};
      oc_node(s, ops[i], 2, in, "y");
      int c = OC_X(s, "c", 5, 32), d = OC_X(s, "d", 32); /* vector path, row broadcast */
      int in2[2] = {c, d};
      oc_node(s, ops[i], 2, in2, "yv");
    }
  }
  OC_CASE(s, "scalar") {
    int a = oc_in(s, "a", s->dt, 0, NULL, -2.0, 2.0), b = OC_X(s, "b", 4); /* a has rank 0 */
    oc_node(s, OP_MUL, 2, (int[]){a, b}, "y");
    oc_node(s, OP_EXP, 1, &a, "e");
  }
  OC_CASE(s, "pow") {
    int a = OC_POS(s, "a", 4, 9), b = OC_X(s, "b", 9);
    int in[2] = {a, b};
    oc_node(s, OP_POW, 2, in, "y");
  }
  OC_CASE(s, "where") {
    int a = OC_X(s, "a", 3, 8), b = OC_X(s, "b", 3, 8), z = OC_X(s, "z", 8);
    int in[2] = {a, b};
    int c = oc_result(s, oc_node(s, OP_LESS, 2, in, "c"));
    int w[3] = {c, a, z};
    oc_node(s, OP_WHERE, 3, w, "y");
  }
  OC_CASE(s, "batch_norm") {
    int x = OC_X(s, "x", 2, 3, 4, 5), sc = OC_X(s, "scale", 3), bi = OC_X(s, "bias", 3), mu = OC_X(s, "mean", 3);
    int var = OC_POS(s, "var", 3);
    int in[5] = {x, sc, bi, mu, var};
    oc_node(s, OP_BATCH_NORM, 5, in, "y");
  }
}

static inline void oc_reduction_cases(OpSuite *s) {
  int64_t ax1[] = {1}, ax02[] = {0, 2}, axm1[] = {-1};
  OC_CASE(s, "reduce") {
    int x = OC_X(s, "x", 4, 6, 32);
    int n = oc_node(s, OP_SUM, 1, &x, "sum1");
    ir_set_attr_ints(s->g, n, "axes", ax1, 1);
    n = oc_node(s, OP_MEAN, 1, &x, "mean02");
    ir_set_attr_ints(s->g, n, "axes", ax02, 2);
    ir_set_attr_bool(s->g, n, "keepdims", true);
    oc_node(s, OP_MAX, 1, &x, "maxall");
    n = oc_node(s, OP_MIN, 1, &x, "minlast");
    ir_set_attr_ints(s->g, n, "axes", axm1, 1);
    n = oc_node(s, OP_MAX, 1, &x, "maxlast");
    ir_set_attr_ints(s->g, n, "axes", axm1, 1);
    ir_set_attr_bool(s->g, n, "keepdims", true);
  }
  OC_CASE(s, "reduce_long") {
    int x = OC_X(s, "x", 2, 3000); /* a block per row, in registers */
    int n = oc_node(s, OP_SUM, 1, &x, "sum");
    ir_set_attr_ints(s->g, n, "axes", axm1, 1);
    int xl = OC_X(s, "xl", 1, 50000); /* too long for registers: computed again per pass */
    n = oc_node(s, OP_MEAN, 1, &xl, "mean");
    ir_set_attr_ints(s->g, n, "axes", axm1, 1);
    oc_node(s, OP_SOFTMAX, 1, &xl, "softmax");
  }
  OC_CASE(s, "softmax") {
    int x = OC_X(s, "x", 5, 100);
    oc_node(s, OP_SOFTMAX, 1, &x, "y");
    int x0 = OC_X(s, "x0", 7, 3);
    int n = oc_node(s, OP_SOFTMAX, 1, &x0, "y0");
    ir_set_attr_int(s->g, n, "axis", 0);
    int x2 = OC_X(s, "x2", 3, 4, 17);
    oc_node(s, OP_LOG_SOFTMAX, 1, &x2, "logy");
  }
  OC_CASE(s, "layer_norm") {
    int x = OC_X(s, "x", 6, 64), gm = OC_X(s, "g", 64), b = OC_X(s, "b", 64);
    int in[3] = {x, gm, b};
    oc_node(s, OP_LAYER_NORM, 3, in, "y");
    int x2 = OC_X(s, "x2", 3, 50), g2 = OC_X(s, "g2", 50);
    int in2[2] = {x2, g2};
    oc_node(s, OP_LAYER_NORM, 2, in2, "y2");
    int x3 = OC_X(s, "x3", 2, 4096), g3 = OC_X(s, "g3", 4096), b3 = OC_X(s, "b3", 4096);
    int in3[3] = {x3, g3, b3};
    oc_node(s, OP_LAYER_NORM, 3, in3, "y3");
  }
  OC_CASE(s, "rms_norm") {
    int x = OC_X(s, "x", 4, 128), gm = OC_X(s, "g", 128);
    int in[2] = {x, gm};
    oc_node(s, OP_RMS_NORM, 2, in, "y");
    int x0 = OC_X(s, "x0", 5, 3), g0 = OC_X(s, "g0", 5);
    int in0[2] = {x0, g0};
    int n = oc_node(s, OP_RMS_NORM, 2, in0, "y0");
    ir_set_attr_int(s->g, n, "axis", 0);
  }
  OC_CASE(s, "pool") {
    int x = OC_X(s, "x", 2, 3, 9, 9);
    int64_t k3[] = {3, 3}, s2[] = {2, 2}, p1[] = {1, 1, 1, 1}, k2[] = {2, 2};
    int n = oc_node(s, OP_MAX_POOL2D, 1, &x, "max");
    ir_set_attr_ints(s->g, n, "kernel", k3, 2);
    ir_set_attr_ints(s->g, n, "strides", s2, 2);
    ir_set_attr_ints(s->g, n, "pads", p1, 4);
    n = oc_node(s, OP_AVG_POOL2D, 1, &x, "avg");
    ir_set_attr_ints(s->g, n, "kernel", k3, 2);
    ir_set_attr_ints(s->g, n, "pads", p1, 4);
    n = oc_node(s, OP_AVG_POOL2D, 1, &x, "avg2");
    ir_set_attr_ints(s->g, n, "kernel", k2, 2);
    oc_node(s, OP_GLOBAL_AVG_POOL, 1, &x, "gap");
  }
}

static inline void oc_contraction_cases(OpSuite *s) {
  OC_CASE(s, "matmul") {
    int a = OC_X(s, "a", 5, 7), b = OC_X(s, "b", 7, 9);
    oc_node(s, OP_MATMUL, 2, (int[]){a, b}, "y");
    int ba = OC_X(s, "ba", 2, 3, 5, 7);
    oc_node(s, OP_MATMUL, 2, (int[]){ba, b}, "batched");
    int ca = OC_X(s, "ca", 2, 1, 5, 7), cb = OC_X(s, "cb", 3, 7, 4);
    oc_node(s, OP_MATMUL, 2, (int[]){ca, cb}, "bcast");
    int ta = OC_X(s, "ta", 7, 5);
    int n = oc_node(s, OP_MATMUL, 2, (int[]){ta, b}, "trans_a");
    ir_set_attr_bool(s->g, n, "transpose_a", true);
    int tb = OC_X(s, "tb", 9, 7);
    n = oc_node(s, OP_MATMUL, 2, (int[]){a, tb}, "trans_b");
    ir_set_attr_bool(s->g, n, "transpose_b", true);
    int v = OC_X(s, "v", 7);
    oc_node(s, OP_MATMUL, 2, (int[]){v, b}, "vec_left");
    oc_node(s, OP_MATMUL, 2, (int[]){a, v}, "vec_right");
    int la = OC_X(s, "la", 70, 130), lb = OC_X(s, "lb", 130, 66);
    oc_node(s, OP_MATMUL, 2, (int[]){la, lb}, "tiles");
    int ma = OC_X(s, "ma", 1, 300), mb = OC_X(s, "mb", 300, 500);
    oc_node(s, OP_MATMUL, 2, (int[]){ma, mb}, "gemv");
  }
  OC_CASE(s, "conv2d") {
    int x = OC_X(s, "x", 2, 4, 9, 9), w = OC_X(s, "w", 6, 4, 3, 3), b = OC_X(s, "b", 6);
    int64_t p1[] = {1, 1, 1, 1}, s2[] = {2, 2}, d2[] = {2, 2}, p2[] = {0, 1, 2, 1};
    int n = oc_node(s, OP_CONV2D, 3, (int[]){x, w, b}, "y");
    ir_set_attr_ints(s->g, n, "pads", p1, 4);
    n = oc_node(s, OP_CONV2D, 2, (int[]){x, w}, "strided");
    ir_set_attr_ints(s->g, n, "strides", s2, 2);
    ir_set_attr_ints(s->g, n, "dilations", d2, 2);
    ir_set_attr_ints(s->g, n, "pads", p2, 4);
    int wg = OC_X(s, "wg", 6, 2, 3, 3);
    n = oc_node(s, OP_CONV2D, 3, (int[]){x, wg, b}, "grouped");
    ir_set_attr_int(s->g, n, "groups", 2);
    ir_set_attr_ints(s->g, n, "pads", p1, 4);
  }
}

static inline void oc_movement_cases(OpSuite *s) {
  OC_CASE(s, "reshape") {
    int x = OC_X(s, "x", 4, 6, 8);
    int64_t sh[] = {6, 32}, sh2[] = {2, 2, 64}, sh3[] = {1, 4, 1, 48};
    int n = oc_node(s, OP_RESHAPE, 1, &x, "y");
    ir_set_attr_ints(s->g, n, "shape", sh, 2);
    int xv = OC_X(s, "xv", 4, 64);
    n = oc_node(s, OP_RESHAPE, 1, &xv, "yv");
    ir_set_attr_ints(s->g, n, "shape", sh2, 3);
    n = oc_node(s, OP_RESHAPE, 1, &x, "y1");
    ir_set_attr_ints(s->g, n, "shape", sh3, 4);
    /* a reshape inside a fused chain: mul by a [32] row after it */
    int r = OC_X(s, "row", 32);
    int y = oc_result(s, s->g->nnode - 3);
    oc_node(s, OP_MUL, 2, (int[]){y, r}, "scaled");
  }
  OC_CASE(s, "transpose") {
    int x = OC_X(s, "x", 3, 4, 5);
    int64_t p[] = {2, 0, 1};
    int n = oc_node(s, OP_TRANSPOSE, 1, &x, "y");
    ir_set_attr_ints(s->g, n, "perm", p, 3);
    oc_node(s, OP_TRANSPOSE, 1, &x, "rev");
  }
  OC_CASE(s, "concat") {
    int a = OC_X(s, "a", 2, 3, 8), b = OC_X(s, "b", 2, 5, 8);
    int n = oc_node(s, OP_CONCAT, 2, (int[]){a, b}, "y");
    ir_set_attr_int(s->g, n, "axis", 1);
    int c = OC_X(s, "c", 4, 8), d = OC_X(s, "d", 4, 16), e = OC_X(s, "e", 4, 3);
    n = oc_node(s, OP_CONCAT, 2, (int[]){c, d}, "last");
    ir_set_attr_int(s->g, n, "axis", -1);
    n = oc_node(s, OP_CONCAT, 3, (int[]){c, e, d}, "uneven");
    ir_set_attr_int(s->g, n, "axis", 1);
  }
  OC_CASE(s, "slice") {
    int x = OC_X(s, "x", 3, 10, 8);
    int n = oc_node(s, OP_SLICE, 1, &x, "y");
    ir_set_attr_int(s->g, n, "axis", 1);
    ir_set_attr_int(s->g, n, "start", 1);
    ir_set_attr_int(s->g, n, "end", 7);
    ir_set_attr_int(s->g, n, "step", 2);
    n = oc_node(s, OP_SLICE, 1, &x, "neg");
    ir_set_attr_int(s->g, n, "axis", -1);
    ir_set_attr_int(s->g, n, "start", -1);
    ir_set_attr_int(s->g, n, "step", -3);
    n = oc_node(s, OP_SLICE, 1, &x, "rows");
    ir_set_attr_int(s->g, n, "axis", 0);
    ir_set_attr_int(s->g, n, "start", 1);
  }
  OC_CASE(s, "split") {
    int x = OC_X(s, "x", 2, 7, 4);
    const char *names[2] = {oc_name(s, "p"), oc_name(s, "q")};
    int n = ir_add_node(s->g, OP_SPLIT, 1, &x, 2, names, oc_loc);
    int64_t sz[] = {2, 5};
    ir_set_attr_int(s->g, n, "axis", 1);
    ir_set_attr_ints(s->g, n, "sizes", sz, 2);
  }
  OC_CASE(s, "gather") {
    int t = OC_X(s, "table", 10, 16);
    int i = oc_in(s, "idx", DT_I32, OC_DIMS(3, 4), -10, 9);
    oc_node(s, OP_GATHER, 2, (int[]){t, i}, "y");
    int i1 = oc_in(s, "idx1", DT_I64, OC_DIMS(5), 0, 15);
    int n = oc_node(s, OP_GATHER, 2, (int[]){t, i1}, "cols");
    ir_set_attr_int(s->g, n, "axis", 1);
  }
  OC_CASE(s, "expand") {
    int x = OC_X(s, "x", 3, 1);
    int64_t sh[] = {2, 3, 4};
    int n = oc_node(s, OP_EXPAND, 1, &x, "y");
    ir_set_attr_ints(s->g, n, "shape", sh, 3);
  }
  OC_CASE(s, "squeeze") {
    int x = OC_X(s, "x", 1, 5, 1, 4);
    int64_t ax[] = {0, 2}, ax0[] = {0};
    int n = oc_node(s, OP_SQUEEZE, 1, &x, "y");
    ir_set_attr_ints(s->g, n, "axes", ax, 2);
    n = oc_node(s, OP_UNSQUEEZE, 1, &x, "u");
    ir_set_attr_ints(s->g, n, "axes", ax0, 1);
  }
}

static inline void oc_transformer_cases(OpSuite *s) {
  OC_CASE(s, "attention") {
    int q = OC_X(s, "q", 1, 2, 5, 16), k = OC_X(s, "k", 1, 2, 7, 16), v = OC_X(s, "v", 1, 2, 7, 16);
    oc_node(s, OP_ATTENTION, 3, (int[]){q, k, v}, "y");
    int mk = OC_X(s, "mask", 1, 1, 5, 7);
    int n = oc_node(s, OP_ATTENTION, 4, (int[]){q, k, v, mk}, "masked");
    ir_set_attr_float(s->g, n, "scale", 0.3);
    int a = OC_X(s, "ma", 5, 7), b = OC_X(s, "mb", 5, 7);
    int bm = oc_result(s, oc_node(s, OP_LESS, 2, (int[]){a, b}, "boolmask"));
    oc_node(s, OP_ATTENTION, 4, (int[]){q, k, v, bm}, "boolmasked");
  }
  OC_CASE(s, "attention_gqa") {
    int q = OC_X(s, "q", 2, 4, 3, 8), k = OC_X(s, "k", 2, 2, 3, 8), v = OC_X(s, "v", 2, 2, 3, 8);
    int n = oc_node(s, OP_ATTENTION, 3, (int[]){q, k, v}, "y");
    ir_set_attr_bool(s->g, n, "causal", true);
    int q2 = OC_X(s, "q2", 1, 2, 3, 40), k2 = OC_X(s, "k2", 1, 1, 6, 40), v2 = OC_X(s, "v2", 1, 1, 6, 24);
    n = oc_node(s, OP_ATTENTION, 3, (int[]){q2, k2, v2}, "decode");
    ir_set_attr_bool(s->g, n, "causal", true);
  }
  OC_CASE(s, "rope") {
    int x = OC_X(s, "x", 1, 2, 6, 16);
    int p = oc_in(s, "pos", DT_I32, OC_DIMS(6), 0, 100);
    oc_node(s, OP_ROPE, 2, (int[]){x, p}, "half");
    int n = oc_node(s, OP_ROPE, 2, (int[]){x, p}, "inter");
    ir_set_attr_enum(s->g, n, "style", "interleaved");
    n = oc_node(s, OP_ROPE, 2, (int[]){x, p}, "partial");
    ir_set_attr_int(s->g, n, "rotary_dim", 8);
    ir_set_attr_float(s->g, n, "base", 500.0);
  }
  OC_CASE(s, "attention_cache") {
    /* k and v are caches of 10 slots; query i sees slots 0 .. pos[i] */
    int q = OC_X(s, "q", 1, 4, 3, 16), k = OC_X(s, "k", 1, 2, 10, 16), v = OC_X(s, "v", 1, 2, 10, 16);
    int p = oc_in(s, "pos", DT_I32, OC_DIMS(3), 0, 9);
    int n = oc_node(s, OP_ATTENTION, 4, (int[]){q, k, v, p}, "y");
    ir_set_attr_bool(s->g, n, "cache", true);
    int q1 = OC_X(s, "q1", 1, 2, 1, 40), p1 = oc_in(s, "pos1", DT_I64, OC_DIMS(1), 0, 9);
    int k1 = OC_X(s, "k1", 1, 1, 10, 40);
    n = oc_node(s, OP_ATTENTION, 4, (int[]){q1, k1, k1, p1}, "decode");
    ir_set_attr_bool(s->g, n, "cache", true);
  }
  /* scatter into destinations that are not states (a new tensor; the
   * in-place state case is tests/unit/test_cuda_state_ops.c's); indices
   * may repeat (the later one wins) */
  OC_CASE(s, "scatter") {
    int d = OC_X(s, "dst", 1, 2, 6, 16), i = oc_in(s, "idx", DT_I32, OC_DIMS(3), 0, 5), x = OC_X(s, "src", 1, 2, 3, 16);
    int n = oc_node(s, OP_SCATTER, 3, (int[]){d, i, x}, "y");
    ir_set_attr_int(s->g, n, "axis", 2);
    int d2 = OC_X(s, "dst2", 5, 3), i2 = oc_in(s, "idx2", DT_I64, OC_DIMS(2), 0, 4), x2 = OC_X(s, "src2", 2, 3);
    oc_node(s, OP_SCATTER, 3, (int[]){d2, i2, x2}, "rows");
    int d3 = OC_X(s, "dst3", 4, 7), i3 = oc_in(s, "idx3", DT_I32, OC_DIMS(3), 0, 6), x3 = OC_X(s, "src3", 4, 3);
    n = oc_node(s, OP_SCATTER, 3, (int[]){d3, i3, x3}, "last");
    ir_set_attr_int(s->g, n, "axis", -1);
  }
  OC_CASE(s, "argmax") {
    int x = OC_X(s, "x", 3, 1000), x2 = OC_X(s, "x2", 4, 5, 6), x3 = OC_X(s, "x3", 2, 37);
    oc_node(s, OP_ARGMAX, 1, &x, "row");
    int n = oc_node(s, OP_ARGMAX, 1, &x2, "mid");
    ir_set_attr_int(s->g, n, "axis", 1);
    ir_set_attr_bool(s->g, n, "keepdims", true);
    oc_node(s, OP_ARGMAX, 1, &x3, "odd");
  }
  /* a vocabulary-like row (k of sampling), an axis that is not innermost
   * (strided, smallest first), k = the whole axis (a sort) */
  OC_CASE(s, "topk") {
    int x = OC_X(s, "x", 3, 1000), x2 = OC_X(s, "x2", 4, 5, 6), x3 = OC_X(s, "x3", 2, 37);
    const char *n1[2] = {oc_name(s, "v"), oc_name(s, "i")};
    int n = ir_add_node(s->g, OP_TOPK, 1, &x, 2, n1, oc_loc);
    ir_set_attr_int(s->g, n, "k", 50);
    const char *n2[2] = {oc_name(s, "v_mid"), oc_name(s, "i_mid")};
    n = ir_add_node(s->g, OP_TOPK, 1, &x2, 2, n2, oc_loc);
    ir_set_attr_int(s->g, n, "axis", 1);
    ir_set_attr_int(s->g, n, "k", 2);
    ir_set_attr_bool(s->g, n, "largest", false);
    const char *n3[2] = {oc_name(s, "v_all"), oc_name(s, "i_all")};
    n = ir_add_node(s->g, OP_TOPK, 1, &x3, 2, n3, oc_loc);
    ir_set_attr_int(s->g, n, "k", 37);
  }
  OC_CASE(s, "arange") {
    int a = oc_in(s, "start", DT_I32, OC_DIMS(1), 0, 100), b = oc_in(s, "start64", DT_I64, OC_DIMS(1), -50, 50);
    int n = oc_node(s, OP_ARANGE, 1, &a, "y");
    ir_set_attr_int(s->g, n, "size", 10);
    n = oc_node(s, OP_ARANGE, 1, &b, "y64");
    ir_set_attr_int(s->g, n, "size", 300);
  }
}

/* dequantize of every quantised storage type (inputs here, so that every
 * dtype's loads run on random data; as constants they are what the
 * quantised matmuls read): groups along axis 0 ([K, N] weights) and 1
 * ([N, K]), per channel, with and without zeros; odd sizes for the nibble
 * at the end of a byte. */
static inline void oc_quant_cases(OpSuite *s) {
  OC_CASE(s, "dequantize") {
    int q = oc_in(s, "q", DT_I4, OC_DIMS(64, 24), -8, 8), sc = oc_in(s, "s", s->dt, OC_DIMS(2, 24), 0.01, 0.1);
    int n = oc_node(s, OP_DEQUANTIZE, 2, (int[]){q, sc}, "g32");
    ir_set_attr_int(s->g, n, "group", 32);
    int qu = oc_in(s, "qu", DT_U4, OC_DIMS(5, 33), 0, 16), su = oc_in(s, "su", s->dt, OC_DIMS(5, 11), -0.5, 0.5);
    int zu = oc_in(s, "zu", DT_U4, OC_DIMS(5, 11), 0, 16);
    n = oc_node(s, OP_DEQUANTIZE, 3, (int[]){qu, su, zu}, "u4_axis1");
    ir_set_attr_int(s->g, n, "axis", -1);
    ir_set_attr_int(s->g, n, "group", 3);
    int q8 = oc_in(s, "q8", DT_I8, OC_DIMS(6, 40), -127, 127), s8 = oc_in(s, "s8", s->dt, OC_DIMS(6, 1), 0.001, 0.01);
    int z8 = oc_in(s, "z8", s->dt, OC_DIMS(6, 1), -3, 3);
    n = oc_node(s, OP_DEQUANTIZE, 3, (int[]){q8, s8, z8}, "i8_channel");
    ir_set_attr_int(s->g, n, "axis", 1);
    int qf = oc_in(s, "qf", DT_F8E4M3, OC_DIMS(16, 8), -448, 448), sf = oc_in(s, "sf", s->dt, OC_DIMS(1, 8), 0.5, 2);
    n = oc_node(s, OP_DEQUANTIZE, 2, (int[]){qf, sf}, "e4m3");
    int qg = oc_in(s, "qg", DT_F8E5M2, OC_DIMS(4, 10), -1000, 1000), sg = oc_in(s, "sg", s->dt, OC_DIMS(1, 10), 0.5, 2);
    n = oc_node(s, OP_DEQUANTIZE, 2, (int[]){qg, sg}, "e5m2");
    ir_set_attr_dtype(s->g, n, "to", s->dt == DT_F64 ? DT_F64 : DT_F16);
  }
}

/* Integer and bool cases (added to the f32 suite only). */
static inline void oc_integer_cases(OpSuite *s) {
  OC_CASE(s, "int") {
    int a = oc_in(s, "a", DT_I32, OC_DIMS(3, 8), -20, 20), b = oc_in(s, "b", DT_I32, OC_DIMS(8), -5, 5);
    oc_node(s, OP_ADD, 2, (int[]){a, b}, "add");
    oc_node(s, OP_MUL, 2, (int[]){a, b}, "mul");
    oc_node(s, OP_DIV, 2, (int[]){a, b}, "div"); /* b may be 0: saturates */
    oc_node(s, OP_NEG, 1, &a, "neg");
    oc_node(s, OP_ABS, 1, &a, "abs");
    oc_node(s, OP_RELU, 1, &a, "relu");
    oc_node(s, OP_MAXIMUM, 2, (int[]){a, b}, "maximum");
    int64_t ax[] = {1};
    int n = oc_node(s, OP_SUM, 1, &a, "sum");
    ir_set_attr_ints(s->g, n, "axes", ax, 1);
    n = oc_node(s, OP_MIN, 1, &a, "min");
    ir_set_attr_ints(s->g, n, "axes", ax, 1);
    int c = oc_in(s, "c", DT_I8, OC_DIMS(16), -128, 127), d = oc_in(s, "d", DT_I8, OC_DIMS(16), -128, 127);
    oc_node(s, OP_ADD, 2, (int[]){c, d}, "i8_add"); /* saturates */
    int u = oc_in(s, "u", DT_U8, OC_DIMS(16), 0, 255);
    oc_node(s, OP_NEG, 1, &u, "u8_neg");
    int e = oc_in(s, "e", DT_I64, OC_DIMS(4, 4), -1000, 1000);
    oc_node(s, OP_SUB, 2, (int[]){e, e}, "i64_sub");
    int l = oc_result(s, oc_node(s, OP_LESS, 2, (int[]){a, b}, "less"));
    oc_node(s, OP_WHERE, 3, (int[]){l, a, b}, "where");
    oc_node(s, OP_EQUAL, 2, (int[]){l, l}, "bool_eq");
    int t = oc_in(s, "t", DT_I32, OC_DIMS(6, 5), -9, 9), i = oc_in(s, "i", DT_I32, OC_DIMS(4), 0, 5);
    oc_node(s, OP_GATHER, 2, (int[]){t, i}, "gather");
    const char *tk[2] = {oc_name(s, "topk_v"), oc_name(s, "topk_i")}; /* small integers: ties */
    int n2 = ir_add_node(s->g, OP_TOPK, 1, &t, 2, tk, oc_loc);
    ir_set_attr_int(s->g, n2, "k", 3);
  }
}

/* The whole suite for dtype dt; NULL (and s->msg) when a case fails to infer. */
static inline Graph *oc_suite(DType dt, OpSuite *s) {
  memset(s, 0, sizeof *s);
  s->g = ir_graph_create(dt_name(dt));
  s->dt = dt;
  oc_unary_cases(s);
  oc_binary_cases(s);
  oc_reduction_cases(s);
  oc_contraction_cases(s);
  oc_movement_cases(s);
  oc_transformer_cases(s);
  oc_quant_cases(s);
  if (dt == DT_F32) oc_integer_cases(s);
  if (s->failed) {
    ir_graph_destroy(s->g);
    s->g = NULL;
  }
  return s->g;
}

/* ---- fused groups, formed by hand ----
 * Until the fuse pass forms them, these are what exercises the fused paths
 * of a code generator: prologues, epilogues, values that escape a group. */

/* Puts nodes [from, g->nnode) into one group of kind k. */
static inline void oc_group(OpSuite *s, GroupKind k, int from) {
  int gi = ir_add_group(s->g, k);
  Group *gr = &s->g->groups[gi];
  gr->nnodes = s->g->nnode - from;
  gr->nodes = ir_graph_alloc(s->g, sizeof(int) * (size_t)gr->nnodes);
  for (int i = 0; i < gr->nnodes; i++) {
    gr->nodes[i] = from + i;
    s->g->node[from + i].group = gi;
  }
  gr->anchor = s->g->nnode - 1;
  for (int i = 0; i < gr->nnodes; i++)
    if (ir_op_info(s->g->node[from + i].op)->fclass >= FC_REDUCTION) gr->anchor = from + i;
}

/* Infers nodes from `from` on (no outputs added). */
static inline void oc_infer(OpSuite *s, int from) {
  for (int i = from; i < s->g->nnode && !s->failed; i++) {
    ir_fill_default_attrs(s->g, i);
    smelt_status st = ir_infer_node(s->g, i);
    if (st) {
      snprintf(s->msg, sizeof s->msg, "case %s: %s", s->prefix, st_message(st));
      st_free(st);
      s->failed = true;
    }
  }
}

static inline Graph *oc_fused_suite(DType dt, OpSuite *s) {
  memset(s, 0, sizeof *s);
  s->g = ir_graph_create("fused");
  s->dt = dt;
  Graph *g = s->g;
  int from;

  /* elementwise chain with broadcasting, two results escape */
  s->prefix = "ew";
  {
    int x = OC_X(s, "x", 8, 64), b = OC_X(s, "b", 64), r = OC_X(s, "r", 8, 64);
    from = g->nnode;
    int h = oc_result(s, oc_node(s, OP_ADD, 2, (int[]){x, b}, "h"));
    int a = oc_result(s, oc_node(s, OP_GELU, 1, &h, "a"));
    int y = oc_result(s, oc_node(s, OP_MUL, 2, (int[]){a, r}, "y"));
    oc_infer(s, from);
    oc_group(s, GK_ELEMWISE, from);
    ir_add_output(g, y);
    ir_add_output(g, h);
  }
  /* injective chain: reshape + transpose + slice feeding an add */
  s->prefix = "inj";
  {
    int x = OC_X(s, "x", 6, 32), z = OC_X(s, "z", 4, 6, 4);
    from = g->nnode;
    int n = oc_node(s, OP_RESHAPE, 1, &x, "r");
    ir_set_attr_ints(g, n, "shape", (int64_t[]){6, 4, 8}, 3);
    int rr = oc_result(s, n);
    n = oc_node(s, OP_TRANSPOSE, 1, &rr, "t");
    ir_set_attr_ints(g, n, "perm", (int64_t[]){1, 0, 2}, 3);
    int t = oc_result(s, n);
    n = oc_node(s, OP_SLICE, 1, &t, "s");
    ir_set_attr_int(g, n, "axis", 2);
    ir_set_attr_int(g, n, "start", 2);
    ir_set_attr_int(g, n, "end", 6);
    int sl = oc_result(s, n);
    int y = oc_result(s, oc_node(s, OP_ADD, 2, (int[]){sl, z}, "y"));
    oc_infer(s, from);
    oc_group(s, GK_ELEMWISE, from);
    ir_add_output(g, y);
  }
  /* residual add + rms_norm + scale: the residual sum escapes (W1's shape of work) */
  s->prefix = "resnorm";
  {
    int x = OC_X(s, "x", 16, 256), r = OC_X(s, "r", 16, 256), gm = OC_X(s, "g", 256), sc = OC_X(s, "sc", 256);
    int b = OC_X(s, "b", 256);
    from = g->nnode;
    int xb = oc_result(s, oc_node(s, OP_ADD, 2, (int[]){x, b}, "xb"));
    int n = oc_node(s, OP_GELU, 1, &xb, "act");
    ir_set_attr_enum(g, n, "approximate", "tanh");
    int a = oc_result(s, n);
    int h = oc_result(s, oc_node(s, OP_ADD, 2, (int[]){a, r}, "h"));
    int y = oc_result(s, oc_node(s, OP_RMS_NORM, 2, (int[]){h, gm}, "norm"));
    int z = oc_result(s, oc_node(s, OP_MUL, 2, (int[]){y, sc}, "z"));
    oc_infer(s, from);
    oc_group(s, GK_REDUCTION, from);
    ir_add_output(g, z);
    ir_add_output(g, h);
  }
  /* scaled, masked softmax: prologue on the input, cast epilogue */
  s->prefix = "smx";
  {
    int x = OC_X(s, "x", 2, 4, 8, 8), m = OC_X(s, "mask", 8, 8), k = OC_X(s, "k", 1);
    from = g->nnode;
    int xs = oc_result(s, oc_node(s, OP_MUL, 2, (int[]){x, k}, "xs"));
    int xm = oc_result(s, oc_node(s, OP_ADD, 2, (int[]){xs, m}, "xm"));
    int p = oc_result(s, oc_node(s, OP_SOFTMAX, 1, &xm, "p"));
    int n = oc_node(s, OP_CAST, 1, &p, "p32");
    ir_set_attr_dtype(g, n, "to", DT_F32);
    oc_infer(s, from);
    oc_group(s, GK_REDUCTION, from);
    ir_add_output(g, oc_result(s, n));
  }
  /* layer_norm with a side result of another shape and a long row */
  s->prefix = "ln";
  {
    int x = OC_X(s, "x", 3, 2048), gm = OC_X(s, "g", 2048), b = OC_X(s, "b", 2048), w = OC_X(s, "w", 5);
    from = g->nnode;
    int x2 = oc_result(s, oc_node(s, OP_NEG, 1, &x, "nx"));
    int y = oc_result(s, oc_node(s, OP_LAYER_NORM, 3, (int[]){x2, gm, b}, "y"));
    int w2 = oc_result(s, oc_node(s, OP_EXP, 1, &w, "w2"));
    oc_infer(s, from);
    oc_group(s, GK_REDUCTION, from);
    ir_add_output(g, y);
    ir_add_output(g, w2);
  }
  /* mean over a row, then an epilogue on the reduced shape */
  s->prefix = "meanepi";
  {
    int x = OC_POS(s, "x", 6, 40), c = OC_X(s, "c", 6, 1);
    from = g->nnode;
    int sq = oc_result(s, oc_node(s, OP_MUL, 2, (int[]){x, x}, "sq"));
    int n = oc_node(s, OP_MEAN, 1, &sq, "ms");
    ir_set_attr_ints(g, n, "axes", (int64_t[]){1}, 1);
    ir_set_attr_bool(g, n, "keepdims", true);
    int ms = oc_result(s, n);
    int rt = oc_result(s, oc_node(s, OP_SQRT, 1, &ms, "rms"));
    int y = oc_result(s, oc_node(s, OP_ADD, 2, (int[]){rt, c}, "y"));
    oc_infer(s, from);
    oc_group(s, GK_REDUCTION, from);
    ir_add_output(g, y);
  }
  /* centring: the row mean broadcast back over the row, in the same kernel */
  s->prefix = "centre";
  {
    int x = OC_X(s, "x", 5, 48);
    from = g->nnode;
    int n = oc_node(s, OP_MEAN, 1, &x, "m");
    ir_set_attr_ints(g, n, "axes", (int64_t[]){-1}, 1);
    ir_set_attr_bool(g, n, "keepdims", true);
    int mu = oc_result(s, n);
    int c = oc_result(s, oc_node(s, OP_SUB, 2, (int[]){x, mu}, "c"));
    int y = oc_result(s, oc_node(s, OP_MUL, 2, (int[]){c, c}, "y"));
    oc_infer(s, from);
    oc_group(s, GK_REDUCTION, from);
    ir_add_output(g, y);
    ir_add_output(g, mu);
  }
  /* matmul + bias + gelu + residual, with a transposed operand computed in the group */
  s->prefix = "mm";
  {
    int a = OC_X(s, "a", 33, 40), wt = OC_X(s, "wt", 24, 40), b = OC_X(s, "b", 24), r = OC_X(s, "r", 33, 24);
    from = g->nnode;
    int n = oc_node(s, OP_TRANSPOSE, 1, &wt, "w");
    int w = oc_result(s, n);
    int y0 = oc_result(s, oc_node(s, OP_MATMUL, 2, (int[]){a, w}, "y0"));
    int y1 = oc_result(s, oc_node(s, OP_ADD, 2, (int[]){y0, b}, "y1"));
    int y2 = oc_result(s, oc_node(s, OP_GELU, 1, &y1, "y2"));
    int y = oc_result(s, oc_node(s, OP_ADD, 2, (int[]){y2, r}, "y"));
    oc_infer(s, from);
    oc_group(s, GK_CONTRACTION, from);
    ir_add_output(g, y);
    ir_add_output(g, y1);
  }
  /* conv2d + relu, then max_pool2d + scale */
  s->prefix = "cnn";
  {
    int x = OC_X(s, "x", 1, 3, 12, 12), w = OC_X(s, "w", 8, 3, 3, 3), b = OC_X(s, "b", 8), k = OC_X(s, "k", 8, 1, 1);
    from = g->nnode;
    int n = oc_node(s, OP_CONV2D, 3, (int[]){x, w, b}, "c");
    ir_set_attr_ints(g, n, "pads", (int64_t[]){1, 1, 1, 1}, 4);
    int c = oc_result(s, n);
    int rl = oc_result(s, oc_node(s, OP_RELU, 1, &c, "r"));
    oc_infer(s, from);
    oc_group(s, GK_CONTRACTION, from);
    from = g->nnode;
    n = oc_node(s, OP_MAX_POOL2D, 1, &rl, "p");
    ir_set_attr_ints(g, n, "kernel", (int64_t[]){2, 2}, 2);
    int p = oc_result(s, n);
    int y = oc_result(s, oc_node(s, OP_MUL, 2, (int[]){p, k}, "y"));
    oc_infer(s, from);
    oc_group(s, GK_REDUCTION, from);
    ir_add_output(g, y);
  }
  /* attention with a fused output cast */
  s->prefix = "att";
  {
    int q = OC_X(s, "q", 1, 4, 6, 32), k = OC_X(s, "k", 1, 2, 10, 32), v = OC_X(s, "v", 1, 2, 10, 32);
    from = g->nnode;
    int n = oc_node(s, OP_ATTENTION, 3, (int[]){q, k, v}, "o");
    ir_set_attr_bool(g, n, "causal", true);
    int o = oc_result(s, n);
    int y = oc_result(s, oc_node(s, OP_MUL, 2, (int[]){o, o}, "y"));
    oc_infer(s, from);
    oc_group(s, GK_OPAQUE, from);
    ir_add_output(g, y);
  }
  if (s->failed) {
    ir_graph_destroy(s->g);
    s->g = NULL;
  }
  return s->g;
}

#endif
