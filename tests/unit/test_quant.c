/* Quantised weights in the IR (issue 14, step 1): the storage dtypes, the
 * dequantize op's inference, reference and errors, const-fold keeping it,
 * and the serialisation of both.
 *
 * Oracles: hand-worked FP8 codes (OCP FP8 spec tables: E4M3 bias 7, max
 * 448 = 0x7e, NaN 0x7f; E5M2 bias 15, max 57344 = 0x7b, inf 0x7c), every
 * one of the 256 codes decoded by an independent formula here and encoded
 * back; nibble packing written out byte by byte; a dequantize worked by
 * hand.  The numpy oracle of the quantised matmuls is in
 * tests/cpu/test_quantize.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir/interp.h"
#include "ir/serialize.h"
#include "passes/passes.h"
#include "tests/unit/check.h"

static const SrcLoc loc = {"quant.yaml", 3, 5};

/* ---- dtypes ---- */

/* The value of an FP8 code from the definition, independently of dtype.c. */
static double f8_value(bool e5m2, unsigned code) {
  int E = e5m2 ? 5 : 4, M = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
  int s = code >> 7, e = (code >> M) & ((1 << E) - 1), m = code & ((1 << M) - 1);
  double v;
  if (e5m2 && e == 31) v = m ? NAN : INFINITY;
  else if (!e5m2 && e == 15 && m == 7) v = NAN;
  else if (e == 0) v = m * pow(2.0, 1 - bias - M);
  else v = (1.0 + m / (double)(1 << M)) * pow(2.0, e - bias);
  return s ? -v : v;
}

static void test_dtypes(void) {
  CHECK(dt_from_name("i4") == DT_I4 && dt_from_name("u4") == DT_U4);
  CHECK(dt_from_name("f8e4m3") == DT_F8E4M3 && dt_from_name("f8e5m2") == DT_F8E5M2);
  CHECK(dt_bits(DT_I4) == 4 && dt_bits(DT_U4) == 4 && dt_bits(DT_F8E4M3) == 8 && dt_bits(DT_F32) == 32);
  CHECK(dt_is_storage_only(DT_I4) && dt_is_storage_only(DT_F8E5M2) && !dt_is_storage_only(DT_I8));
  CHECK(!dt_is_float(DT_F8E4M3) && !dt_is_int(DT_I4));
  TensorType t = {.dt = DT_I4, .rank = 2, .dim = {3, 5}};
  CHECK(ir_type_bytes(&t) == 8); /* 15 nibbles: 7.5 bytes */
  t.dt = DT_U4, t.dim[1] = 4;
  CHECK(ir_type_bytes(&t) == 6);

  /* nibbles: element 2i low, 2i+1 high */
  uint8_t b[3] = {0};
  dt_store(DT_I4, b, 0, -1);
  dt_store(DT_I4, b, 1, 3);
  dt_store(DT_I4, b, 2, -8);
  dt_store(DT_I4, b, 3, 100); /* saturates at 7 */
  dt_store(DT_I4, b, 4, -2.7); /* truncates toward zero, as every int store */
  CHECK(b[0] == 0x3f && b[1] == 0x78 && b[2] == 0x0e);
  CHECK(dt_load(DT_I4, b, 0) == -1 && dt_load(DT_I4, b, 1) == 3 && dt_load(DT_I4, b, 2) == -8);
  CHECK(dt_load(DT_I4, b, 3) == 7 && dt_load(DT_I4, b, 4) == -2);
  CHECK(dt_load(DT_U4, b, 0) == 15 && dt_load(DT_U4, b, 3) == 7);
  dt_store(DT_U4, b, 0, -3); /* saturates at 0 */
  CHECK(b[0] == 0x30);

  /* FP8: codes from the OCP tables */
  CHECK(dt_f32_to_f8(DT_F8E4M3, 1.0f) == 0x38);
  CHECK(dt_f32_to_f8(DT_F8E4M3, -2.0f) == 0xc0);
  CHECK(dt_f32_to_f8(DT_F8E4M3, 448.0f) == 0x7e);
  CHECK(dt_f32_to_f8(DT_F8E4M3, 1e6f) == 0x7e);     /* saturates */
  CHECK(dt_f32_to_f8(DT_F8E4M3, -INFINITY) == 0xfe); /* saturates */
  CHECK((dt_f32_to_f8(DT_F8E4M3, NAN) & 0x7f) == 0x7f);
  CHECK(dt_f32_to_f8(DT_F8E4M3, 0x1p-9f) == 0x01);   /* smallest subnormal */
  CHECK(dt_f32_to_f8(DT_F8E4M3, 0x1p-11f) == 0x00);  /* a quarter of it rounds to 0 */
  CHECK(dt_f32_to_f8(DT_F8E4M3, 0x1.8p-10f) == 0x01); /* 0.75 of it rounds up */
  CHECK(dt_f32_to_f8(DT_F8E4M3, 1.0625f) == 0x38);   /* tie between 1 and 1.125: even */
  CHECK(dt_f32_to_f8(DT_F8E4M3, 1.1875f) == 0x3a);   /* tie between 1.125 and 1.25: even */
  CHECK(dt_f32_to_f8(DT_F8E4M3, 0x1.fp-7f) == 0x08); /* rounds up into the smallest normal */
  CHECK(dt_f32_to_f8(DT_F8E5M2, 1.0f) == 0x3c);
  CHECK(dt_f32_to_f8(DT_F8E5M2, 57344.0f) == 0x7b);
  CHECK(dt_f32_to_f8(DT_F8E5M2, INFINITY) == 0x7b);
  CHECK(dt_f32_to_f8(DT_F8E5M2, 0x1p-16f) == 0x01);
  CHECK(dt_f8_to_f32(DT_F8E5M2, 0x7c) == INFINITY);
  CHECK(isnan(dt_f8_to_f32(DT_F8E4M3, 0x7f)) && isnan(dt_f8_to_f32(DT_F8E5M2, 0x7d)));
  for (int fmt = 0; fmt < 2; fmt++) {
    DType dt = fmt ? DT_F8E5M2 : DT_F8E4M3;
    int mism = 0;
    for (unsigned c = 0; c < 256; c++) {
      double want = f8_value(fmt == 1, c);
      float got = dt_f8_to_f32(dt, (uint8_t)c);
      if (isnan(want)) {
        if (!isnan(got)) mism++;
        continue;
      }
      if ((double)got != want) mism++;
      if (isinf(want)) continue; /* encodes to the largest finite value */
      uint8_t back = dt_f32_to_f8(dt, got);
      if (back != c && !(want == 0 && (back & 0x7f) == 0)) mism++;
      /* the midpoint to the next code up rounds to the even one of the two */
      if (c < 0x7f && want >= 0) {
        double next = f8_value(fmt == 1, c + 1);
        if (isnan(next) || isinf(next)) continue;
        uint8_t mid = dt_f32_to_f8(dt, (float)((want + next) / 2));
        if (mid != ((c & 1) ? c + 1 : c)) mism++;
      }
    }
    if (mism) fprintf(stderr, "%s: %d codes decode, encode or round wrongly\n", dt_name(dt), mism);
    CHECK(mism == 0);
  }
}

/* ---- dequantize ---- */

static int add_const(Graph *g, const char *name, DType dt, int rank, const int64_t *dims, const double *vals) {
  TensorType t = {.dt = dt, .rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  int v = ir_add_const(g, name, t, NULL, loc);
  g->val[v].init = "value";
  for (int64_t i = 0; i < ir_type_numel(&t); i++) dt_store(dt, g->val[v].data, (size_t)i, vals[i]);
  return v;
}

static int add_dequant(Graph *g, int nin, const int *in, int axis, int group) {
  const char *name = "w";
  int n = ir_add_node(g, OP_DEQUANTIZE, nin, in, 1, &name, loc);
  ir_set_attr_int(g, n, "axis", axis);
  ir_set_attr_int(g, n, "group", group);
  ir_fill_default_attrs(g, n);
  return n;
}

/* The message of inferring node n, "" when it infers. */
static char *infer_msg(Graph *g, int n) {
  static char buf[1024];
  smelt_status st = ir_infer_node(g, n);
  snprintf(buf, sizeof buf, "%s", st ? st_message(st) : "");
  st_free(st);
  return buf;
}

static void test_dequantize_errors(void) {
  Graph *g = ir_graph_create("q");
  double z[64] = {0};
  int q = add_const(g, "qw", DT_I4, 2, (int64_t[]){8, 4}, z);
  int s = add_const(g, "s", DT_F32, 2, (int64_t[]){2, 4}, z);
  int s_bad = add_const(g, "s3", DT_F32, 2, (int64_t[]){3, 4}, z);
  int zi = add_const(g, "z", DT_I32, 2, (int64_t[]){2, 4}, z);
  int f = add_const(g, "f", DT_F32, 2, (int64_t[]){8, 4}, z);

  int n = add_dequant(g, 2, (int[]){q, s}, 0, 4);
  CHECK(strcmp(infer_msg(g, n), "") == 0);
  CHECK(g->val[g->node[n].out[0]].type.dt == DT_F32 && g->val[g->node[n].out[0]].type.dim[0] == 8);
  n = add_dequant(g, 2, (int[]){q, s}, 0, 4);
  ir_set_attr_dtype(g, n, "to", DT_F16);
  CHECK(strcmp(infer_msg(g, n), "") == 0 && g->val[g->node[n].out[0]].type.dt == DT_F16);

  const char *m = infer_msg(g, add_dequant(g, 1, &q, 0, 4));
  CHECK(strstr(m, "quant.yaml:3:5: error: node 'w' (dequantize)") && strstr(m, "needs the scales of 'qw'"));
  m = infer_msg(g, add_dequant(g, 2, (int[]){q, s}, 0, 3));
  CHECK(strstr(m, "quant.yaml:3:5") && strstr(m, "group 3 does not divide the 8 elements of qweight 'qw' along axis 0"));
  m = infer_msg(g, add_dequant(g, 2, (int[]){q, s_bad}, 0, 4));
  CHECK(strstr(m, "scales 's3' has shape [3,4]; qweight [8,4] with group 4 along axis 0 needs [2,4]"));
  m = infer_msg(g, add_dequant(g, 2, (int[]){q, s}, 0, 0));
  CHECK(strstr(m, "needs [1,4]"));
  m = infer_msg(g, add_dequant(g, 3, (int[]){q, s, zi}, 0, 4));
  CHECK(strstr(m, "zeros 'z' has dtype i32"));
  m = infer_msg(g, add_dequant(g, 2, (int[]){f, s}, 0, 4));
  CHECK(strstr(m, "qweight 'f' has dtype f32"));
  m = infer_msg(g, add_dequant(g, 2, (int[]){q, q}, 0, 4));
  CHECK(strstr(m, "scales 'qw' must be floating point"));
  m = infer_msg(g, add_dequant(g, 2, (int[]){q, s}, 2, 4));
  CHECK(strstr(m, "axis 2 is out of range"));
  /* an i4 value anywhere else */
  const char *yn = "y";
  n = ir_add_node(g, OP_NEG, 1, &q, 1, &yn, loc);
  m = infer_msg(g, n);
  CHECK(strstr(m, "input 'qw' has the quantised storage type i4, which only dequantize and cast read"));
  n = ir_add_node(g, OP_CAST, 1, &f, 1, &yn, loc);
  ir_set_attr_dtype(g, n, "to", DT_I4);
  m = infer_msg(g, n);
  CHECK(strstr(m, "result 'y' would have the quantised storage type i4"));
  ir_graph_destroy(g);
}

/* y = (q - z) * s, groups of 2 along axis 1 (the [N, K] layout) and along
 * axis 0 (the [K, N] layout), worked by hand. */
static void test_dequantize_reference(void) {
  Graph *g = ir_graph_create("q");
  /* q [2, 4] u4 along axis 1 in groups of 2: scales/zeros [2, 2] */
  int q = add_const(g, "qw", DT_U4, 2, (int64_t[]){2, 4}, (double[]){0, 15, 8, 9, 1, 2, 3, 4});
  int s = add_const(g, "s", DT_F16, 2, (int64_t[]){2, 2}, (double[]){0.5, 2, -1, 0.25});
  int z = add_const(g, "z", DT_U4, 2, (int64_t[]){2, 2}, (double[]){8, 8, 1, 0});
  int n = add_dequant(g, 3, (int[]){q, s, z}, 1, 2);
  ir_set_attr_dtype(g, n, "to", DT_F32);
  CHECK_OK(ir_infer_node(g, n));
  float y[8];
  const void *in[3] = {g->val[q].data, g->val[s].data, g->val[z].data};
  void *out[1] = {y};
  CHECK_OK(ir_eval_node(g, &g->node[n], in, out));
  const float want[8] = {-4, 3.5, 0, 2, 0, -1, 0.75, 1};
  for (int i = 0; i < 8; i++) CHECK(y[i] == want[i]);

  /* f8e4m3 [4, 2] along axis 0 per channel (group 0): scales [1, 2] */
  int q8 = add_const(g, "q8", DT_F8E4M3, 2, (int64_t[]){4, 2}, (double[]){1, -2, 0.5, 448, 3, 0.125, -1, 0});
  int s8 = add_const(g, "s8", DT_F32, 2, (int64_t[]){1, 2}, (double[]){0.5, 4});
  n = add_dequant(g, 2, (int[]){q8, s8}, 0, 0);
  ir_set_attr_dtype(g, n, "to", DT_F16);
  CHECK_OK(ir_infer_node(g, n));
  uint16_t h[8];
  const void *in8[2] = {g->val[q8].data, g->val[s8].data};
  void *out8[1] = {h};
  CHECK_OK(ir_eval_node(g, &g->node[n], in8, out8));
  const float want8[8] = {0.5, -8, 0.25, 1792, 1.5, 0.5, -0.5, 0};
  for (int i = 0; i < 8; i++) CHECK(dt_f16_to_f32(h[i]) == want8[i]);
  ir_graph_destroy(g);
}

/* A dequantize of constants stays; its matmul's result is unchanged. */
static void test_const_fold_keeps(void) {
  Graph *g = ir_graph_create("q");
  int64_t K = 8, N = 4;
  double qv[32], sv[8];
  for (int i = 0; i < 32; i++) qv[i] = (i * 5) % 16 - 8;
  for (int i = 0; i < 8; i++) sv[i] = 0.125 * (i + 1);
  int x = ir_add_input(g, "x", (TensorType){.dt = DT_F32, .rank = 2, .dim = {2, K}}, loc);
  int q = add_const(g, "qw", DT_I4, 2, (int64_t[]){K, N}, qv);
  int s = add_const(g, "s", DT_F32, 2, (int64_t[]){2, N}, sv);
  int dq = add_dequant(g, 2, (int[]){q, s}, 0, 4);
  CHECK_OK(ir_infer_node(g, dq));
  const char *yn = "y";
  int mm = ir_add_node(g, OP_MATMUL, 2, (int[]){x, g->node[dq].out[0]}, 1, &yn, loc);
  ir_fill_default_attrs(g, mm);
  CHECK_OK(ir_infer_node(g, mm));
  ir_add_output(g, g->node[mm].out[0]);
  CHECK_OK(ir_verify(g));
  PassCtx ctx = {0};
  CHECK_OK(pass_run_pipeline(g, &ctx, "canonicalize,const-fold,simplify,cse,dce", NULL, NULL));
  CHECK(ctx.log && strstr(ctx.log, "const-fold: kept 'w' (dequantize): its weights stay quantised"));
  pass_ctx_free(&ctx);
  int live = 0;
  for (int i = 0; i < g->nnode; i++)
    if (!g->node[i].dead && g->node[i].op == OP_DEQUANTIZE) {
      live++;
      CHECK(g->val[g->node[i].in[0]].type.dt == DT_I4);
    }
  CHECK(live == 1);

  /* the result, through the interpreter, against the sum worked here */
  Interp *it;
  CHECK_OK(ir_interp_create(g, &it));
  float xv[16];
  for (int i = 0; i < 16; i++) xv[i] = (float)(i % 5) - 2;
  CHECK_OK(ir_interp_set_input(it, ir_find_value(g, "x"), xv));
  CHECK_OK(ir_interp_run(it));
  const float *y = ir_interp_value(it, g->outputs[0]);
  for (int m = 0; m < 2; m++)
    for (int n = 0; n < N; n++) {
      double acc = 0;
      for (int k = 0; k < K; k++) acc += xv[m * K + k] * qv[k * N + n] * sv[(k / 4) * N + n];
      CHECK_NEAR(y[m * N + n], acc, 1e-5);
    }
  ir_interp_destroy(it);
  ir_graph_destroy(g);
}

/* ---- serialisation ---- */

static _Alignas(64) unsigned char blob[4096];
static size_t blob_len;

static smelt_status blob_put(void *ctx, const Graph *g, int v, IrConstRef *out) {
  (void)ctx;
  size_t n = ir_type_bytes(&g->val[v].type), off = (blob_len + 63) / 64 * 64;
  if (off + n > sizeof blob) return st_error(ST_INTERNAL, "test blob full");
  memcpy(blob + off, g->val[v].data, n);
  blob_len = off + n;
  *out = (IrConstRef){IR_CONST_BLOB, off};
  return NULL;
}

static void test_serialize(void) {
  Graph *g = ir_graph_create("q");
  double qv[15] = {-8, -1, 0, 1, 7, 3, -3, 2, 5, -5, 6, -6, 4, -4, 1};
  int q = add_const(g, "qw", DT_I4, 2, (int64_t[]){3, 5}, qv); /* odd: a half byte at the end */
  int s = add_const(g, "s", DT_F16, 2, (int64_t[]){3, 1}, (double[]){0.5, 1, 2});
  int f8 = add_const(g, "f8", DT_F8E5M2, 1, (int64_t[]){3}, (double[]){1, -0.5, 3});
  int dq = add_dequant(g, 2, (int[]){q, s}, 1, 0);
  CHECK_OK(ir_infer_node(g, dq));
  ir_add_output(g, g->node[dq].out[0]);
  const char *cn = "c";
  int c = ir_add_node(g, OP_CAST, 1, &f8, 1, &cn, loc);
  ir_set_attr_dtype(g, c, "to", DT_F32);
  CHECK_OK(ir_infer_node(g, c));
  ir_add_output(g, g->node[c].out[0]);
  CHECK_OK(ir_verify(g));
  void *buf = NULL;
  size_t len = 0;
  IrConstSink sink = {.put = blob_put};
  CHECK_OK(ir_graph_serialize(g, &sink, &buf, &len));
  Graph *h = NULL;
  IrConstSpace cs = {.blob = blob, .blob_len = blob_len};
  CHECK_OK(ir_graph_deserialize(buf, len, &cs, &h));
  if (h) {
    char *a = ir_print_str(g), *b = ir_print_str(h);
    CHECK(strcmp(a, b) == 0);
    CHECK(strstr(a, "i4[3,5]") && strstr(a, "f8e5m2[3]") && strstr(a, "dequantize"));
    int hq = ir_find_value(h, "qw");
    CHECK(hq >= 0 && h->val[hq].type.dt == DT_I4 && memcmp(h->val[hq].data, g->val[q].data, 8) == 0);
    free(a);
    free(b);
    ir_graph_destroy(h);
  }
  free(buf);
  ir_graph_destroy(g);
}

int main(void) {
  test_dtypes();
  test_dequantize_errors();
  test_dequantize_reference();
  test_const_fold_keeps();
  test_serialize();
  return check_done("test_quant");
}
