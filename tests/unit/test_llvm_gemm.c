/* The register-blocked GEMM (codegen/llvm/gemm.c) against the reference
 * interpreter.
 *
 * Shapes are chosen for the edges of the blocking: M, N and K each run over
 * {1, 2, 3, 7, 16, 17, 31, 64, 65, 100, 129} with the other two fixed at
 * ragged sizes, so that row blocks (MR = 8 or 6, then remainders of 4, 2
 * and 1 rows; MR = 12 with AVX-512 from 192 rows, a few shapes of those),
 * column panels (NR = 32 or 16, the last one padded) and the k loop are
 * each cut every way; M = 1 is the decoding case; a long K with a wide N
 * makes several panel chunks, and a K of 2048 or more with 128 rows or more
 * is blocked along K too.  Then batch dims of A (broadcast
 * against a 2-D or [1,K,N] weight), a 1-D A, transpose_a and transpose_b,
 * f16 and bf16 (the weight widened when packed, A converted as read), an
 * epilogue (bias, gelu, residual, a product with another tensor) fused
 * into the kernel, a cast prologue on A, one weight shared by two kernels,
 * and the unoptimised build.  The harness checks every result (relative L2
 * error 1e-5 in f32, 2e-3 in f16/bf16), guard bytes around every buffer,
 * and runs each kernel as several uneven task ranges.  One more check reads
 * the module's LLVM IR: a constant weight must take the packed path (its
 * packed global is there), a weight that is a graph input must not.
 */
#include <stdarg.h>

#include "tests/unit/test_llvm_harness.h"

#ifdef SMELT_HAVE_LLVM

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

/* y = a @ w with w a constant; a is [M,K] (or [K,M] with ta), w [K,N] (or
 * [N,K] with tb). */
static void t_mm(DType dt, int64_t M, int64_t N, int64_t K, bool ta, bool tb, const RunOpts *ro) {
  TG t;
  tg_init(&t, L("gemm %s M=%lld N=%lld K=%lld ta=%d tb=%d", dt_name(dt), (long long)M, (long long)N, (long long)K, ta, tb),
          (uint64_t)(M * 131 + N * 17 + K));
  int a = ta ? tg_input(&t, "a", dt, 2, D(K, M), DOM_ANY, 0) : tg_input(&t, "a", dt, 2, D(M, K), DOM_ANY, 0);
  int w = tb ? tg_const(&t, "w", dt, 2, D(N, K), DOM_ANY) : tg_const(&t, "w", dt, 2, D(K, N), DOM_ANY);
  int n = tg_node(&t, OP_MATMUL, 2, (int[]){a, w}, "y");
  ir_set_attr_bool(t.g, n, "transpose_a", ta);
  ir_set_attr_bool(t.g, n, "transpose_b", tb);
  tg_run(&t, ro);
}

static void test_shapes(void) {
  static const int64_t sizes[] = {1, 2, 3, 7, 16, 17, 31, 64, 65, 100, 129};
  for (int i = 0; i < 11; i++) {
    int64_t s = sizes[i];
    t_mm(DT_F32, s, 33, 19, false, false, &R);
    t_mm(DT_F32, 9, s, 23, false, false, &R);
    t_mm(DT_F32, 13, 47, s, false, false, &R);
  }
  /* the product of a few ragged sizes, in every layout */
  static const int64_t few[] = {1, 7, 17, 65};
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++)
      for (int l = 0; l < 4; l++) t_mm(DT_F32, few[i], few[j], few[l], (i + j) % 2, (j + l) % 2, &R);
  t_mm(DT_F32, 129, 129, 129, false, false, &R);
  t_mm(DT_F32, 100, 129, 65, true, true, &R);
  /* decoding: one row, a wide weight */
  t_mm(DT_F32, 1, 1000, 256, false, false, &R);
  t_mm(DT_F32, 1, 1000, 256, false, true, &R);
  /* K * NR large enough that the panels are walked in several chunks */
  t_mm(DT_F32, 11, 300, 1024, false, false, &R);
  /* 192 rows or more: blocks of 12 rows with AVX-512 (GEMM_MR12_ROWS),
   * remainders of 8, 4, 2 and 1 in the uneven task ranges */
  t_mm(DT_F32, 267, 45, 37, false, false, &R);
  t_mm(DT_F32, 300, 70, 130, true, true, &R);
  /* K of 2048 or more with 128 rows or more: K blocked too (gemm_long_k),
   * units of an even split of the rows, K past a whole number of chunks,
   * a partial last panel */
  t_mm(DT_F32, 197, 70, 2100, false, false, &R);
  t_mm(DT_F32, 130, 33, 2048, true, true, &R);
  t_mm(DT_F32, 300, 40, 2304, false, true, &(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .cpu = "x86-64-v3"});
}

static void test_half(void) {
  static const DType half[] = {DT_F16, DT_BF16};
  for (int d = 0; d < 2; d++) {
    t_mm(half[d], 17, 65, 31, false, false, &R);
    t_mm(half[d], 1, 100, 64, false, true, &R);
    t_mm(half[d], 65, 7, 129, true, false, &R);
    t_mm(half[d], 64, 64, 64, true, true, &R);
    t_mm(half[d], 259, 33, 40, false, true, &R);
    t_mm(half[d], 140, 50, 2080, false, false, &R);
  }
}

/* A with batch dims against a 2-D weight, or one with leading 1s; a 1-D A. */
static void test_batched(void) {
  for (int tb = 0; tb < 2; tb++) {
    TG t;
    tg_init(&t, L("gemm batch [2,3,5,19] @ [19,40] tb=%d", tb), 71);
    int a = tg_input(&t, "a", DT_F32, 4, D(2, 3, 5, 19), DOM_ANY, 0);
    int w = tb ? tg_const(&t, "w", DT_F32, 2, D(40, 19), DOM_ANY) : tg_const(&t, "w", DT_F32, 2, D(19, 40), DOM_ANY);
    int n = tg_node(&t, OP_MATMUL, 2, (int[]){a, w}, "y");
    ir_set_attr_bool(t.g, n, "transpose_b", tb);
    tg_run(&t, &R);
  }
  {
    TG t;
    tg_init(&t, "gemm batch [4,9,33] @ [1,33,20] ta", 72);
    int a = tg_input(&t, "a", DT_F32, 3, D(4, 33, 9), DOM_ANY, 0);
    int w = tg_const(&t, "w", DT_F32, 3, D(1, 33, 20), DOM_ANY);
    int n = tg_node(&t, OP_MATMUL, 2, (int[]){a, w}, "y");
    ir_set_attr_bool(t.g, n, "transpose_a", true);
    tg_run(&t, &R);
  }
  {
    TG t;
    tg_init(&t, "gemm 1-D a [37] @ [37,70]", 73);
    int a = tg_input(&t, "a", DT_F32, 1, D(37), DOM_ANY, 0);
    int w = tg_const(&t, "w", DT_F32, 2, D(37, 70), DOM_ANY);
    tg_node(&t, OP_MATMUL, 2, (int[]){a, w}, "y");
    tg_run(&t, &R);
  }
}

/* y = (gelu(cast(x) @ w + b) + res) * gate, one kernel; the matmul's own
 * result is stored too, for a node of another group. */
static void test_epilogue(DType dt, bool tb) {
  TG t;
  tg_init(&t, L("gemm %s cast+matmul+bias+gelu+residual*gate tb=%d", dt_name(dt), tb), 81);
  int x16 = tg_input(&t, "x16", DT_F16, 3, D(3, 11, 37), DOM_ANY, 0);
  int cx = tg_node(&t, OP_CAST, 1, &x16, "x");
  ir_set_attr_dtype(t.g, cx, "to", dt);
  int w = tb ? tg_const(&t, "w", dt, 2, D(70, 37), DOM_ANY) : tg_const(&t, "w", dt, 2, D(37, 70), DOM_ANY);
  int b = tg_const(&t, "b", dt, 1, D(70), DOM_ANY);
  int res = tg_input(&t, "res", dt, 3, D(3, 11, 70), DOM_ANY, 0);
  int gate = tg_input(&t, "gate", dt, 2, D(11, 1), DOM_ANY, 0);
  int mm = tg_node(&t, OP_MATMUL, 2, (int[]){tg_val(&t, cx), w}, "mm");
  ir_set_attr_bool(t.g, mm, "transpose_b", tb);
  int ad = tg_node(&t, OP_ADD, 2, (int[]){tg_val(&t, mm), b}, "h");
  int gl = tg_node(&t, OP_GELU, 1, (int[]){tg_val(&t, ad)}, "act");
  int rs = tg_node(&t, OP_ADD, 2, (int[]){tg_val(&t, gl), res}, "r");
  int y = tg_node(&t, OP_MUL, 2, (int[]){tg_val(&t, rs), gate}, "y");
  int out = tg_node(&t, OP_NEG, 1, (int[]){tg_val(&t, mm)}, "outside");
  tg_group(&t, GK_CONTRACTION, (int[]){cx, mm, ad, gl, rs, y}, 6, mm);
  tg_group(&t, GK_ELEMWISE, &out, 1, out);
  RunOpts ro = R;
  ro.tol16 = 4e-3; /* the reference rounds after each op */
  tg_run(&t, &ro);
}

/* Two matmuls over one weight (one packed copy), in the unoptimised build
 * too, and for a CPU without AVX-512 (the vector width of the host's, which
 * LLVM then legalises). */
static void test_shared_weight(const RunOpts *ro) {
  TG t;
  tg_init(&t, "gemm two matmuls, one weight", 91);
  int a = tg_input(&t, "a", DT_F32, 2, D(21, 45), DOM_ANY, 0);
  int c = tg_input(&t, "c", DT_F32, 2, D(6, 45), DOM_ANY, 0);
  int w = tg_const(&t, "w", DT_F32, 2, D(45, 50), DOM_ANY);
  tg_node(&t, OP_MATMUL, 2, (int[]){a, w}, "y1");
  tg_node(&t, OP_MATMUL, 2, (int[]){c, w}, "y2");
  tg_run(&t, ro);
}

/* Whether the optimised module of y = a @ b contains a packed weight. */
static bool uses_packed(bool b_const) {
  Graph *g = ir_graph_create("packed?");
  g->file = "test_llvm_gemm";
  int a = ir_add_input(g, "a", tt(DT_F32, 2, D(8, 16)), here);
  TensorType bt = tt(DT_F32, 2, D(16, 40));
  int b = b_const ? ir_add_const(g, "w", bt, NULL, here) : ir_add_input(g, "w", bt, here);
  const char *names[1] = {"y"};
  int n = ir_add_node(g, OP_MATMUL, 2, (int[]){a, b}, 1, names, here);
  ir_fill_default_attrs(g, n);
  bool found = false;
  Kernel *ks = NULL;
  int nk = 0;
  char *text = NULL;
  CHECK_OK(ir_infer_node(g, n));
  ir_add_output(g, g->node[n].out[0]);
  CHECK_OK(cg_single_node_groups(g));
  CHECK_OK(cg_lower(g, &ks, &nk));
  CHECK_OK(cg_llvm_ir_text(g, ks, nk, NULL, false, &text));
  found = text && strstr(text, "w.packed") != NULL;
  free(text);
  cg_kernels_free(ks, nk);
  ir_graph_destroy(g);
  return found;
}

int main(void) {
  test_shapes();
  test_half();
  test_batched();
  const DType fl[] = {DT_F32, DT_F16, DT_BF16};
  for (int d = 0; d < 3; d++) {
    test_epilogue(fl[d], false);
    test_epilogue(fl[d], true);
  }
  test_shared_weight(&R);
  test_shared_weight(&(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .no_opt = true});
  test_shared_weight(&(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .cpu = "x86-64"});
  t_mm(DT_F32, 19, 45, 33, false, false, &(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .cpu = "x86-64-v3"});
  CHECK(uses_packed(true));
  CHECK(!uses_packed(false));
  printf("test_llvm_gemm: %d kernels run\n", tg_kernels_run);
  return check_done("test_llvm_gemm");
}

#else

int main(void) {
  printf("test_llvm_gemm: skipped (built without SMELT_LLVM)\n");
  return 0;
}

#endif
