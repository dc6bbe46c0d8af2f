/* Unit tests of the IR core: dtype conversions against hand-worked bit
 * patterns, the op table's attribute schemas, shape inference rules and their
 * located errors, the printer, compaction and the verifier. */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "tests/unit/check.h"

static TensorType tt(DType dt, int rank, const int64_t *dims) {
  TensorType t = {.dt = dt, .rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  return t;
}

static void test_dtypes(void) {
  /* f16: 1.0 = 0x3c00, 65504 = 0x7bff, smallest subnormal 2^-24 = 0x0001, -2 = 0xc000 */
  CHECK(dt_f32_to_f16(1.0f) == 0x3c00);
  CHECK(dt_f32_to_f16(65504.0f) == 0x7bff);
  CHECK(dt_f32_to_f16(65520.0f) == 0x7c00); /* rounds up to infinity */
  CHECK(dt_f32_to_f16(5.9604644775390625e-8f) == 0x0001);
  CHECK(dt_f32_to_f16(-2.0f) == 0xc000);
  CHECK(dt_f16_to_f32(0x3555) == 0.333251953125f);
  CHECK(dt_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
  /* ties to even: 1 + 2^-11 is halfway between 1 and 1+2^-10 -> 1 */
  CHECK(dt_f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00);
  CHECK(dt_f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02);
  /* bf16: 1.0 = 0x3f80, pi = 0x4049 */
  CHECK(dt_f32_to_bf16(1.0f) == 0x3f80);
  CHECK(dt_f32_to_bf16(3.14159265f) == 0x4049);
  CHECK(dt_bf16_to_f32(0x4049) == 3.140625f);
  /* every f16 bit pattern survives f16 -> f32 -> f16 (NaNs stay NaN) */
  int bad = 0;
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = dt_f16_to_f32((uint16_t)h);
    uint16_t back = dt_f32_to_f16(f);
    if (f == f && back != h) bad++;
    if (f != f && (back & 0x7c00) != 0x7c00) bad++;
  }
  CHECK(bad == 0);
  CHECK(dt_from_name("bf16") == DT_BF16 && dt_from_name("f8") == DT_INVALID);
  CHECK(dt_size(DT_I64) == 8 && dt_size(DT_BOOL) == 1);
  uint8_t b[4];
  dt_store(DT_I8, b, 0, 300.0); /* saturates, never undefined */
  CHECK((int8_t)b[0] == 127);
  dt_store(DT_I32, b, 0, -2.7);
  CHECK(dt_load(DT_I32, b, 0) == -2.0);
}

static void test_op_table(void) {
  CHECK(ir_op_from_name("rms_norm") == OP_RMS_NORM);
  CHECK(ir_op_from_name("nope") == OP_COUNT);
  CHECK(strcmp(ir_op_name(OP_LOG_SOFTMAX), "log_softmax") == 0);
  CHECK(ir_op_attr_count(OP_CONV2D) == 4);
  AttrSpec s;
  ir_op_attr_spec(OP_GELU, 0, &s);
  CHECK(strcmp(s.name, "approximate") == 0 && s.type == AT_ENUM && strcmp(s.enum_words, "none|tanh") == 0);
  CHECK(s.has_default && strcmp(s.dflt, "none") == 0 && !s.required);
  ir_op_attr_spec(OP_CAST, 0, &s);
  CHECK(s.type == AT_DTYPE && s.required);
  ir_op_attr_spec(OP_SUM, 0, &s);
  CHECK(s.type == AT_INTS && !s.required && !s.has_default);
  ir_op_attr_spec(OP_CONV2D, 1, &s);
  CHECK(strcmp(s.name, "pads") == 0 && strcmp(s.dflt, "[0,0,0,0]") == 0);
  /* every op's schema parses and every default is well formed */
  for (int op = 0; op < OP_COUNT; op++) {
    int n = ir_op_attr_count((Op)op);
    for (int i = 0; i < n; i++) ir_op_attr_spec((Op)op, i, &s);
  }
}

static void test_infer(void) {
  Graph *g = ir_graph_create("t");
  SrcLoc loc = {"m.yaml", 3, 5};
  int a = ir_add_input(g, "a", tt(DT_F32, 2, (int64_t[]){128, 512}), loc);
  int b = ir_add_input(g, "b", tt(DT_F32, 1, (int64_t[]){256}), loc);
  int c = ir_add_input(g, "c", tt(DT_F32, 3, (int64_t[]){4, 1, 512}), loc);
  int h = ir_add_input(g, "h", tt(DT_F16, 1, (int64_t[]){512}), loc);

  int n = ir_add_node(g, OP_ADD, 2, (int[]){a, b}, 1, (const char *[]){"h2"}, (SrcLoc){"m.yaml", 14, 7});
  smelt_status st = ir_infer_node(g, n);
  CHECK(st && strcmp(st_message(st), "m.yaml:14:7: error: node 'h2' (add): shapes [128,512] and [256] do not broadcast") == 0);
  st_free(st);

  n = ir_add_node(g, OP_MUL, 2, (int[]){a, c}, 1, (const char *[]){"m"}, loc);
  CHECK_OK(ir_infer_node(g, n));
  TensorType want = tt(DT_F32, 3, (int64_t[]){4, 128, 512});
  CHECK(ir_type_equal(&g->val[g->node[n].out[0]].type, &want));

  n = ir_add_node(g, OP_ADD, 2, (int[]){a, h}, 1, (const char *[]){"mixed"}, loc);
  st = ir_infer_node(g, n);
  CHECK(st && strstr(st_message(st), "insert a cast"));
  st_free(st);

  /* matmul: batch broadcasting, transpose_b, 1-D operands */
  int q = ir_add_input(g, "q", tt(DT_F32, 4, (int64_t[]){2, 8, 16, 32}), loc);
  int k = ir_add_input(g, "k", tt(DT_F32, 3, (int64_t[]){8, 24, 32}), loc);
  n = ir_add_node(g, OP_MATMUL, 2, (int[]){q, k}, 1, (const char *[]){"s"}, loc);
  ir_set_attr_bool(g, n, "transpose_b", true);
  ir_fill_default_attrs(g, n);
  CHECK_OK(ir_infer_node(g, n));
  want = tt(DT_F32, 4, (int64_t[]){2, 8, 16, 24});
  CHECK(ir_type_equal(&g->val[g->node[n].out[0]].type, &want));
  n = ir_add_node(g, OP_MATMUL, 2, (int[]){a, b}, 1, (const char *[]){"bad_mm"}, loc);
  ir_fill_default_attrs(g, n);
  st = ir_infer_node(g, n);
  CHECK(st && strstr(st_message(st), "inner dimensions differ"));
  st_free(st);

  /* reductions with negative axes and keepdims; reshape with -1; slice */
  n = ir_add_node(g, OP_SUM, 1, (int[]){c}, 1, (const char *[]){"r"}, loc);
  ir_set_attr_ints(g, n, "axes", (int64_t[]){-1, 0}, 2);
  ir_set_attr_bool(g, n, "keepdims", true);
  CHECK_OK(ir_infer_node(g, n));
  want = tt(DT_F32, 3, (int64_t[]){1, 1, 1});
  CHECK(ir_type_equal(&g->val[g->node[n].out[0]].type, &want));
  n = ir_add_node(g, OP_RESHAPE, 1, (int[]){a}, 1, (const char *[]){"rs"}, loc);
  ir_set_attr_ints(g, n, "shape", (int64_t[]){-1, 64, 8}, 3);
  CHECK_OK(ir_infer_node(g, n));
  want = tt(DT_F32, 3, (int64_t[]){128, 64, 8});
  CHECK(ir_type_equal(&g->val[g->node[n].out[0]].type, &want));
  n = ir_add_node(g, OP_SLICE, 1, (int[]){a}, 1, (const char *[]){"sl"}, loc);
  ir_set_attr_int(g, n, "axis", -1);
  ir_set_attr_int(g, n, "start", -1);
  ir_set_attr_int(g, n, "step", -2);
  ir_fill_default_attrs(g, n);
  CHECK_OK(ir_infer_node(g, n));
  CHECK(g->val[g->node[n].out[0]].type.dim[1] == 256); /* x[:, ::-2] of 512 */

  /* attention: grouped-query, causal needs S <= T */
  int kk = ir_add_input(g, "kk", tt(DT_F32, 4, (int64_t[]){2, 2, 8, 32}), loc);
  n = ir_add_node(g, OP_ATTENTION, 3, (int[]){q, kk, kk}, 1, (const char *[]){"att"}, loc);
  ir_set_attr_bool(g, n, "causal", true);
  st = ir_infer_node(g, n);
  CHECK(st && strstr(st_message(st), "query length 16 <= key length 8"));
  st_free(st);
  ir_graph_destroy(g);
}

static void test_print_compact_verify(void) {
  Graph *g = ir_graph_create("p");
  SrcLoc loc = {0};
  int x = ir_add_input(g, "x", tt(DT_F32, 1, (int64_t[]){4}), loc);
  int one = ir_add_const(g, "one", tt(DT_F32, 1, (int64_t[]){1}), (float[]){1.0f}, loc);
  /* added out of order: y uses z which comes later */
  int nz = ir_add_node(g, OP_EXP, 1, (int[]){x}, 1, (const char *[]){"z"}, loc);
  int ny = ir_add_node(g, OP_ADD, 2, (int[]){g->node[nz].out[0], one}, 1, (const char *[]){"y"}, loc);
  CHECK_OK(ir_infer_node(g, nz));
  CHECK_OK(ir_infer_node(g, ny));
  ir_add_output(g, g->node[ny].out[0]);
  CHECK_OK(ir_verify(g));
  char *s = ir_print_str(g);
  CHECK(s && strcmp(s, "graph p {\n  input x: f32[4]\n  const one: f32[1] = [1]\n"
                       "  z: f32[4] = exp(x)\n  y: f32[4] = add(z, one)\n  output y\n}\n") == 0);
  free(s);
  /* swap the nodes: compaction restores the order */
  Node tmp = g->node[0];
  g->node[0] = g->node[1];
  g->node[1] = tmp;
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].kind == VK_NODE) g->val[v].node = 1 - g->val[v].node;
  smelt_status st = ir_verify(g);
  CHECK(st && strstr(st_message(st), "not defined before"));
  st_free(st);
  CHECK_OK(ir_graph_compact(g));
  CHECK_OK(ir_verify(g));
  CHECK(g->node[0].op == OP_EXP);
  /* a wrong result type is caught */
  g->val[g->node[1].out[0]].type.dim[0] = 5;
  st = ir_verify(g);
  CHECK(st && strstr(st_message(st), "differs from shape inference"));
  st_free(st);
  g->val[g->node[1].out[0]].type.dim[0] = 4;
  /* removing the add: its result becomes dead, the output is rewired */
  g->node[1].dead = true;
  ir_replace_all_uses(g, g->node[1].out[0], g->node[0].out[0]);
  CHECK_OK(ir_graph_compact(g));
  CHECK(g->nnode == 1 && ir_find_value(g, "y") < 0);
  CHECK_OK(ir_verify(g));
  Graph *c = ir_graph_clone(g);
  char *s1 = ir_print_str(g), *s2 = ir_print_str(c);
  CHECK(s1 && s2 && strcmp(s1, s2) == 0);
  free(s1), free(s2);
  ir_graph_destroy(c);
  ir_graph_destroy(g);
}

int main(void) {
  test_dtypes();
  test_op_table();
  test_infer();
  test_print_compact_verify();
  return check_done("test_ir");
}
