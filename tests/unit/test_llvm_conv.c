/* conv2d as an implicit GEMM (codegen/llvm/gemm.c, cg_gemm_conv_try)
 * against the reference interpreter.
 *
 * Shapes are chosen for the edges of the scheme: 1x1 convolutions (K is
 * just the channels), 3x3 with pad 1, strides 2 and 3, dilation 2, grouped
 * and depthwise (groups = C, one channel per group: the 1-row remainder
 * block), asymmetric pads (more padding than kernel on one side), batch 2,
 * odd images (7x9, 5x3, 1x1) whose pixel panels straddle output rows and
 * end ragged, 3 and 17 channels (remainders of the MR-channel blocks),
 * more than CONV_OC_ROWS channels (several channel chunks per pixel panel)
 * and K = C*KH*KW beyond one 32 KiB panel (several k chunks summed in the
 * partial tile).  Epilogues: conv's own bias, relu, and relu + residual
 * fused into the kernel, with the conv result also stored for a node of
 * another group, and a cast prologue fused in front.  f32 (relative L2 1e-5) and f16/bf16 (2e-3), the weight
 * widened when packed and x as the panel is built.  The harness checks
 * guard bytes around every buffer and runs each kernel as several uneven
 * task ranges.  One more check reads the module's LLVM IR: a constant
 * weight takes the packed path, a weight that is a graph input does not
 * (the generic kernel, which the same shapes then test too).
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

typedef struct {
  int64_t n, c, h, w, o, kh, kw;
  int64_t s[2], p[4], d[2], groups;
} Shape;

/* EPI_ROW_RESIDUAL: the residual is [N, O, OH, 1], broadcast along the
 * output rows (conv_rows may not address its pixels linearly) */
enum { EPI_NONE, EPI_RELU, EPI_RESIDUAL, EPI_ROW_RESIDUAL };

static int64_t out_dim(int64_t in, int64_t k, int64_t s, int64_t p0, int64_t p1, int64_t d) {
  return (in + p0 + p1 - d * (k - 1) - 1) / s + 1;
}

/* y = epi(conv2d(x, w [, b])); w a constant unless w_input. */
static void t_conv(DType dt, Shape sh, bool bias, int epi, bool w_input, const RunOpts *ro) {
  TG t;
  tg_init(&t,
          L("conv %s x[%lld,%lld,%lld,%lld] w[%lld,%lld,%lld,%lld] s%lld,%lld p%lld,%lld,%lld,%lld d%lld,%lld g%lld%s%s%s",
            dt_name(dt), (long long)sh.n, (long long)sh.c, (long long)sh.h, (long long)sh.w, (long long)sh.o,
            (long long)(sh.c / sh.groups), (long long)sh.kh, (long long)sh.kw, (long long)sh.s[0], (long long)sh.s[1],
            (long long)sh.p[0], (long long)sh.p[1], (long long)sh.p[2], (long long)sh.p[3], (long long)sh.d[0],
            (long long)sh.d[1], (long long)sh.groups, bias ? " bias" : "",
            epi == EPI_RELU               ? " relu"
            : epi == EPI_RESIDUAL         ? " relu+residual"
            : epi == EPI_ROW_RESIDUAL     ? " relu+residual[N,O,OH,1]"
                                          : "",
            w_input ? " (w input)" : ""),
          (uint64_t)(sh.c * 131 + sh.o * 17 + sh.h * 7 + sh.w + sh.kh));
  int x = tg_input(&t, "x", dt, 4, D(sh.n, sh.c, sh.h, sh.w), DOM_ANY, 0);
  const int64_t *wd = D(sh.o, sh.c / sh.groups, sh.kh, sh.kw);
  int w = w_input ? tg_input(&t, "w", dt, 4, wd, DOM_ANY, 0) : tg_const(&t, "w", dt, 4, wd, DOM_ANY);
  int in[3] = {x, w, bias ? tg_const(&t, "b", dt, 1, D(sh.o), DOM_ANY) : -1};
  int cv = tg_node(&t, OP_CONV2D, bias ? 3 : 2, in, "conv");
  ir_set_attr_ints(t.g, cv, "strides", sh.s, 2);
  ir_set_attr_ints(t.g, cv, "pads", sh.p, 4);
  ir_set_attr_ints(t.g, cv, "dilations", sh.d, 2);
  ir_set_attr_int(t.g, cv, "groups", sh.groups);
  if (epi != EPI_NONE) {
    int64_t oh = out_dim(sh.h, sh.kh, sh.s[0], sh.p[0], sh.p[2], sh.d[0]);
    int64_t ow = out_dim(sh.w, sh.kw, sh.s[1], sh.p[1], sh.p[3], sh.d[1]);
    int nodes[4] = {cv, tg_node(&t, OP_RELU, 1, (int[]){tg_val(&t, cv)}, "act")}, nn = 2;
    if (epi == EPI_RESIDUAL || epi == EPI_ROW_RESIDUAL) {
      int res = tg_input(&t, "res", dt, 4, D(sh.n, sh.o, oh, epi == EPI_RESIDUAL ? ow : 1), DOM_ANY, 0);
      nodes[nn] = tg_node(&t, OP_ADD, 2, (int[]){tg_val(&t, nodes[1]), res}, "y");
      nn++;
      /* the conv result is read outside the group too: stored as well */
      int out = tg_node(&t, OP_NEG, 1, (int[]){tg_val(&t, cv)}, "outside");
      tg_group(&t, GK_CONTRACTION, nodes, nn, cv);
      tg_group(&t, GK_ELEMWISE, &out, 1, out);
    } else {
      tg_group(&t, GK_CONTRACTION, nodes, nn, cv);
    }
  }
  RunOpts r = *ro;
  if (epi == EPI_RESIDUAL || epi == EPI_ROW_RESIDUAL) r.tol16 = 4e-3; /* the reference rounds after each op; the kernel after the last */
  tg_run(&t, &r);
}

static Shape S(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o, int64_t k, int64_t s, int64_t p, int64_t d,
               int64_t groups) {
  return (Shape){n, c, h, w, o, k, k, {s, s}, {p, p, p, p}, {d, d}, groups};
}

static void test_shapes(DType dt, bool w_input) {
  /* 1x1 */
  t_conv(dt, S(1, 16, 8, 8, 32, 1, 1, 0, 1, 1), false, EPI_NONE, w_input, &R);
  t_conv(dt, S(2, 17, 7, 9, 3, 1, 1, 0, 1, 1), true, EPI_NONE, w_input, &R);
  t_conv(dt, S(1, 3, 5, 3, 17, 1, 2, 0, 1, 1), true, EPI_RELU, w_input, &R);
  /* 3x3 pad 1 */
  t_conv(dt, S(1, 3, 7, 9, 17, 3, 1, 1, 1, 1), true, EPI_RELU, w_input, &R);
  t_conv(dt, S(2, 17, 9, 7, 16, 3, 1, 1, 1, 1), false, EPI_RESIDUAL, w_input, &R);
  t_conv(dt, S(1, 8, 1, 1, 9, 3, 1, 1, 1, 1), true, EPI_NONE, w_input, &R);
  /* strided, dilated */
  t_conv(dt, S(2, 5, 11, 13, 19, 3, 2, 1, 1, 1), true, EPI_NONE, w_input, &R);
  t_conv(dt, S(1, 4, 12, 10, 7, 3, 3, 0, 1, 1), false, EPI_RELU, w_input, &R);
  t_conv(dt, S(1, 6, 10, 11, 12, 3, 1, 2, 2, 1), true, EPI_NONE, w_input, &R);
  t_conv(dt, S(1, 3, 15, 14, 8, 5, 2, 2, 2, 1), true, EPI_RESIDUAL, w_input, &R);
  /* grouped and depthwise */
  t_conv(dt, S(1, 16, 9, 7, 24, 3, 1, 1, 1, 2), true, EPI_NONE, w_input, &R);
  t_conv(dt, S(2, 12, 7, 9, 12, 3, 2, 1, 1, 3), false, EPI_RELU, w_input, &R);
  t_conv(dt, S(1, 17, 7, 9, 17, 3, 1, 1, 1, 17), true, EPI_RESIDUAL, w_input, &R);
  t_conv(dt, S(2, 8, 10, 6, 16, 3, 2, 1, 1, 8), true, EPI_NONE, w_input, &R); /* depth multiplier 2 */
  /* asymmetric pads, rectangular kernel, unequal strides and dilations */
  t_conv(dt, (Shape){1, 5, 7, 9, 11, 2, 3, {1, 2}, {0, 2, 3, 1}, {1, 1}, 1}, true, EPI_NONE, w_input, &R);
  t_conv(dt, (Shape){2, 6, 9, 7, 10, 3, 2, {2, 1}, {4, 0, 1, 3}, {2, 1}, 2}, false, EPI_RELU, w_input, &R);
  /* the whole window in the padding for some outputs */
  t_conv(dt, (Shape){1, 2, 3, 3, 5, 3, 3, {1, 1}, {4, 4, 4, 4}, {1, 1}, 1}, true, EPI_NONE, w_input, &R);
}

/* Beyond one channel chunk (128 rows) and one k chunk (256 or 512 k's). */
static void test_large(void) {
  t_conv(DT_F32, S(1, 64, 9, 9, 150, 3, 1, 1, 1, 1), true, EPI_RELU, false, &R);
  t_conv(DT_F32, S(1, 600, 5, 7, 20, 1, 1, 0, 1, 1), false, EPI_NONE, false, &R);
  t_conv(DT_F32, S(2, 64, 14, 14, 64, 3, 1, 1, 1, 1), true, EPI_RESIDUAL, false, &R);
  t_conv(DT_BF16, S(1, 96, 6, 6, 140, 3, 1, 1, 1, 1), true, EPI_NONE, false, &R);
}

/* 1x1 convolutions of 256 input channels or more, computed by pixel rows
 * (conv_rows): the transposed tile (a power-of-two block of 8 rows and the
 * 4, 2, 1 remainders with AVX-512; 6 rows, transposed element by element,
 * with AVX2 and SSE), pixels addressed linearly in the epilogue and not
 * (a residual broadcast along the rows), blocks of 8 pixels straddling two
 * images (batch 2, 7x9 = 63 pixels), strides 1 and 2, a ragged last panel
 * of channels, and the columns split into blocks when the pixels are few
 * (3x3 = 9 rows, 300 channels).  Then 1x1 convolutions of fewer channels
 * at stride 1, whose image the channel-row scheme takes as one row of H*W
 * pixels when the epilogue allows it (a residual) and not (a residual
 * broadcast along the rows), batch 2. */
static void test_rows(void) {
  const DType fl[] = {DT_F32, DT_F16, DT_BF16};
  for (int d = 0; d < 3; d++) {
    t_conv(fl[d], S(2, 256, 7, 9, 40, 1, 1, 0, 1, 1), true, EPI_RESIDUAL, false, &R);
    t_conv(fl[d], S(1, 256, 13, 11, 70, 1, 2, 0, 1, 1), false, EPI_NONE, false, &R);
  }
  t_conv(DT_F32, S(1, 260, 3, 3, 300, 1, 1, 0, 1, 1), true, EPI_RELU, false, &R);
  t_conv(DT_F32, S(2, 288, 5, 7, 33, 1, 1, 0, 1, 1), true, EPI_ROW_RESIDUAL, false, &R);
  t_conv(DT_F32, S(2, 256, 5, 7, 20, 1, 1, 0, 1, 1), true, EPI_RESIDUAL, false,
         &(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .cpu = "x86-64-v3"});
  t_conv(DT_F32, S(1, 272, 6, 5, 50, 1, 2, 0, 1, 1), true, EPI_ROW_RESIDUAL, false,
         &(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .cpu = "x86-64"});
  for (int d = 0; d < 3; d++) t_conv(fl[d], S(2, 64, 7, 9, 40, 1, 1, 0, 1, 1), true, EPI_RESIDUAL, false, &R);
  t_conv(DT_F32, S(2, 48, 9, 7, 140, 1, 1, 0, 1, 1), false, EPI_ROW_RESIDUAL, false, &R);
}

/* Convolutions with a spatial kernel or padding on small images with 256
 * output channels or more, computed by pixel rows with an im2col block
 * (conv_pixels): one unit's rows for the whole image (7x7: 7 blocks, the
 * last with 1 pixel) and two blocks a unit (9x11 = 99 pixels, batch 2),
 * several k chunks (K = 576), a ragged last panel and a second column
 * unit (260 channels), stride 2 (the element-by-element im2col), a 1x1
 * kernel with padding, dilation 2, the residual read linearly and not,
 * and the AVX2 and SSE targets (6-pixel blocks, 6-lane im2col rows). */
static void test_pixels(void) {
  const DType fl[] = {DT_F32, DT_F16, DT_BF16};
  for (int d = 0; d < 3; d++) t_conv(fl[d], S(1, 16, 7, 7, 256, 3, 1, 1, 1, 1), true, EPI_RESIDUAL, false, &R);
  t_conv(DT_F32, S(2, 8, 9, 11, 260, 3, 1, 1, 1, 1), true, EPI_RELU, false, &R);
  t_conv(DT_F32, S(1, 64, 7, 7, 256, 3, 1, 1, 1, 1), false, EPI_NONE, false, &R);
  t_conv(DT_F32, S(1, 12, 13, 13, 256, 3, 2, 1, 1, 1), true, EPI_ROW_RESIDUAL, false, &R);
  t_conv(DT_F32, S(1, 20, 5, 5, 256, 1, 1, 1, 1, 1), true, EPI_NONE, false, &R);
  t_conv(DT_F32, S(1, 8, 10, 10, 256, 3, 1, 2, 2, 1), true, EPI_RESIDUAL, false, &R);
  t_conv(DT_F32, S(2, 8, 7, 5, 256, 3, 1, 1, 1, 1), true, EPI_RESIDUAL, false,
         &(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .cpu = "x86-64-v3"});
  t_conv(DT_F32, S(1, 8, 6, 7, 256, 3, 1, 1, 1, 1), true, EPI_ROW_RESIDUAL, false,
         &(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .cpu = "x86-64"});
}

/* A cast prologue fused into the kernel: x is computed, not read, so the
 * panel is built element by element through the group's members. */
static void test_prologue(void) {
  TG t;
  tg_init(&t, "conv cast(x16) prologue + bias + relu", 61);
  int x16 = tg_input(&t, "x16", DT_F16, 4, D(2, 6, 7, 9), DOM_ANY, 0);
  int cx = tg_node(&t, OP_CAST, 1, &x16, "x");
  ir_set_attr_dtype(t.g, cx, "to", DT_F32);
  int w = tg_const(&t, "w", DT_F32, 4, D(10, 6, 3, 3), DOM_ANY);
  int b = tg_const(&t, "b", DT_F32, 1, D(10), DOM_ANY);
  int cv = tg_node(&t, OP_CONV2D, 3, (int[]){tg_val(&t, cx), w, b}, "conv");
  ir_set_attr_ints(t.g, cv, "pads", D(1, 1, 1, 1), 4);
  int r = tg_node(&t, OP_RELU, 1, (int[]){tg_val(&t, cv)}, "y");
  tg_group(&t, GK_CONTRACTION, (int[]){cx, cv, r}, 3, cv);
  tg_run(&t, &R);
}

/* Whether the module of y = conv2d(x [1, c, 6, 6], w [o, c, k, k]) holds the
 * packed weight named "w<suffix>". */
static bool uses_packed_as(bool w_const, int64_t c, int64_t k, int64_t o, const char *suffix) {
  Graph *g = ir_graph_create("packed?");
  g->file = "test_llvm_conv";
  int x = ir_add_input(g, "x", tt(DT_F32, 4, D(1, c, 6, 6)), here);
  TensorType wt = tt(DT_F32, 4, D(o, c, k, k));
  int w = w_const ? ir_add_const(g, "w", wt, NULL, here) : ir_add_input(g, "w", wt, here);
  const char *names[1] = {"y"};
  int n = ir_add_node(g, OP_CONV2D, 2, (int[]){x, w}, 1, names, here);
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
  char name[64];
  snprintf(name, sizeof name, "w%s", suffix);
  found = text && strstr(text, name) != NULL;
  free(text);
  cg_kernels_free(ks, nk);
  ir_graph_destroy(g);
  return found;
}

int main(void) {
  const DType fl[] = {DT_F32, DT_F16, DT_BF16};
  for (int d = 0; d < 3; d++) test_shapes(fl[d], false);
  test_shapes(DT_F32, true); /* the generic kernel on the same shapes */
  test_large();
  test_rows();
  test_pixels();
  test_prologue();
  t_conv(DT_F32, S(1, 5, 7, 9, 11, 3, 1, 1, 1, 1), true, EPI_RESIDUAL, false,
         &(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .no_opt = true});
  t_conv(DT_F32, S(2, 6, 7, 9, 14, 3, 2, 1, 1, 2), true, EPI_RELU, false,
         &(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .cpu = "x86-64"});
  t_conv(DT_F32, S(1, 9, 8, 7, 14, 3, 1, 1, 1, 1), true, EPI_RELU, false,
         &(RunOpts){.tol32 = 1e-5, .tol16 = 2e-3, .cpu = "x86-64-v3"});
  CHECK(uses_packed_as(true, 8, 3, 16, ".convpacked"));
  CHECK(!uses_packed_as(false, 8, 3, 16, ".convpacked"));
  /* a 1x1 conv of 256 channels or more goes by pixel rows, its weight
   * packed as a transposed matmul weight; of fewer, by channel rows */
  CHECK(uses_packed_as(true, 256, 1, 16, ".packedt"));
  CHECK(!uses_packed_as(true, 256, 1, 16, ".convpacked"));
  CHECK(uses_packed_as(true, 128, 1, 16, ".convpacked"));
  /* a 3x3 conv to 256 channels on a small image: by pixel rows too */
  CHECK(uses_packed_as(true, 8, 3, 256, ".packedt"));
  CHECK(!uses_packed_as(true, 8, 3, 255, ".packedt"));
  printf("test_llvm_conv: %d kernels run\n", tg_kernels_run);
  return check_done("test_llvm_conv");
}

#else

int main(void) {
  printf("test_llvm_conv: skipped (built without SMELT_LLVM)\n");
  return 0;
}

#endif
