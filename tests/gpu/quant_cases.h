/* The quantised decode matmuls' cases (codegen/cuda/qgemv.c and
 * qmma.c), shared by unit/test_cuda_qgemv.c (NVRTC and the CPU emulation)
 * and gpu/test_cuda_quant.c (the GPU): both compare with the reference
 * interpreter, which computes the quantised arithmetic exactly
 * (dequantize in double, rounded to its `to` dtype, then the matmul in
 * double).
 *
 * One graph holds every case as an independent matmul y = silu(x @ W^T +
 * b) with W = dequantize(q, s) stored [N, K] (the quantize pass's layout),
 * grouped by the fuse pass for a CUDA target (the dequantize joins the
 * matmul's kernel for M <= 8): int4 with groups of 128, 32 and 16 (two
 * groups in one 16-byte chunk), int8 per channel and with groups of 64,
 * fp8 e4m3 and e5m2 per channel (special codes included: NaN, infinities,
 * subnormals); x in f32, f16 and bf16, scales in f32 and f16; M = 1, 3
 * and 8; N with columns past the last warp's (40, 130); x computed in the
 * kernel (a transpose prologue) for two cases.  Then W = dequantize(q, s,
 * z) with zero points: u4 codes with u4 zeros (GPTQ, AWQ, MatMulNBits)
 * with groups of 128, 64, 32, 16 and 8 (two and four groups in a chunk)
 * and per channel, f16 and f32 scales, M = 1, 3 and 8,
 * an odd number of groups per column (its u4 zeros start mid-byte); u8
 * with u8 zeros; i4 and i8 with zeros of their own dtype; u4 and i4 with
 * zeros in the scales' float dtype (f16, f32, bf16: the path through the
 * group sums of x); u4 and u8 without zeros.  Then cases for qmma (f16
 * x): K not a whole number of its K blocks of 4 chunks (int4 with K = 96,
 * u8 with zeros and K = 80), fp8 specials at M = 8, groups of 64 and 32
 * (pairs scaled in f16), and f32 scales with groups under a K block
 * (qgemv's).
 */
#ifndef SMELT_TEST_QUANT_CASES_H
#define SMELT_TEST_QUANT_CASES_H

#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/lower.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

static const SrcLoc qc_loc = {"quant_cases", 1, 1};

typedef struct {
  DType qdt, adt, sdt;
  int64_t M, K, N, G;
  bool special, prologue;
  DType zdt; /* the zero points' dtype; DT_INVALID: none */
} QCase;

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static inline uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static inline int add_const(Graph *g, const char *name, TensorType t) {
  return ir_add_const(g, ir_graph_strdup(g, name), t, NULL, qc_loc);
}

/* A zero point of dtype zdt for codes of dtype qdt, about where
 * quantisers put them: near the middle of the codes' range (floats in
 * steps of 0.1). */
static inline double gen_zero(DType zdt, DType qdt) {
  uint64_t r = next_rand();
  switch (zdt) {
  case DT_U4: return (double)(r % 16);
  case DT_I4: return (double)((int64_t)(r % 16) - 8);
  case DT_U8: return (double)(96 + r % 64);
  case DT_I8: return (double)((int64_t)(r % 11) - 5);
  default: return (double)(r % 160) / 10.0 - (qdt == DT_I4 ? 8 : 0);
  }
}

/* Case c's x (an input, or the transpose of one) and its weight
 * W = dequantize(q, s[, z]) ([N, K], the values returned). */
static inline void add_operands(Graph *g, int i, const QCase *c, int *xv, int *wv) {
  char nm[64];
  int64_t ng = c->G ? c->K / c->G : 1;
  snprintf(nm, sizeof nm, "c%d/x", i);
  int x;
  if (c->prologue) {
    /* x^T given: the kernel reads x through a transpose it computes */
    x = ir_add_input(g, ir_graph_strdup(g, nm), (TensorType){.dt = c->adt, .rank = 2, .dim = {c->K, c->M}}, qc_loc);
    snprintf(nm, sizeof nm, "c%d/xt", i);
    const char *n1 = ir_graph_strdup(g, nm);
    int t = ir_add_node(g, OP_TRANSPOSE, 1, &x, 1, &n1, qc_loc);
    ir_fill_default_attrs(g, t);
    CHECK_OK(ir_infer_node(g, t));
    x = g->node[t].out[0];
  } else {
    x = ir_add_input(g, ir_graph_strdup(g, nm), (TensorType){.dt = c->adt, .rank = 2, .dim = {c->M, c->K}}, qc_loc);
  }
  snprintf(nm, sizeof nm, "c%d/q", i);
  int q = add_const(g, nm, (TensorType){.dt = c->qdt, .rank = 2, .dim = {c->N, c->K}});
  uint8_t *qd = g->val[q].data;
  int64_t nq = c->N * c->K;
  for (int64_t e = 0; e < nq; e++) {
    uint64_t r = next_rand();
    switch (c->qdt) {
    case DT_I4: dt_store(DT_I4, qd, (size_t)e, (double)((int64_t)(r % 16) - 8)); break;
    case DT_U4: dt_store(DT_U4, qd, (size_t)e, (double)(r % 16)); break;
    case DT_I8: case DT_U8: qd[e] = (uint8_t)r; break;
    case DT_F8E4M3: qd[e] = (uint8_t)((r % 0x7f) | ((r >> 9) & 1 ? 0x80 : 0)); break;
    default: qd[e] = (uint8_t)((r % 0x5c) | ((r >> 9) & 1 ? 0x80 : 0)); break; /* e5m2 up to 224, as e4m3's 448 */
    }
  }
  if (c->special) {
    /* a NaN in column 1, an infinity (e5m2) or the largest value in column 2, subnormals in column 3 */
    qd[1 * c->K + 5] = c->qdt == DT_F8E4M3 ? 0x7f : 0xfe;
    qd[2 * c->K + 7] = c->qdt == DT_F8E4M3 ? 0x7e : 0x7c;
    for (int64_t k = 0; k < c->K; k++) qd[3 * c->K + k] = (uint8_t)(k % 8 | (k % 3 ? 0 : 0x80));
  }
  snprintf(nm, sizeof nm, "c%d/s", i);
  int s = add_const(g, nm, (TensorType){.dt = c->sdt, .rank = 2, .dim = {c->N, ng}});
  /* weights of magnitude ~0.1, as quantised weights are (fp8 codes reach
   * 448): with larger ones the f16 rounding of the reference's dequantised
   * weight and of its matmul result (which the kernel keeps in f32) would
   * dominate the comparison after the bias and silu */
  double smax = dt_is_f8(c->qdt) ? 0.0005 : 0.02;
  for (int64_t e = 0; e < c->N * ng; e++)
    dt_store(c->sdt, g->val[s].data, (size_t)e, smax * (0.1 + 0.9 * (double)(next_rand() >> 11) / 9007199254740992.0));
  int in[3] = {q, s, -1}, nin = 2;
  if (c->zdt != DT_INVALID) {
    snprintf(nm, sizeof nm, "c%d/z", i);
    int z = add_const(g, nm, (TensorType){.dt = c->zdt, .rank = 2, .dim = {c->N, ng}});
    for (int64_t e = 0; e < c->N * ng; e++) dt_store(c->zdt, g->val[z].data, (size_t)e, gen_zero(c->zdt, c->qdt));
    in[nin++] = z;
  }
  snprintf(nm, sizeof nm, "c%d/w", i);
  const char *wn = ir_graph_strdup(g, nm);
  int dq = ir_add_node(g, OP_DEQUANTIZE, nin, in, 1, &wn, qc_loc);
  ir_set_attr_int(g, dq, "axis", 1);
  ir_set_attr_int(g, dq, "group", c->G);
  ir_set_attr_dtype(g, dq, "to", c->adt);
  CHECK_OK(ir_infer_node(g, dq));
  *xv = x;
  *wv = g->node[dq].out[0];
}

/* x @ W^T, named cI/y0. */
static inline int add_matmul(Graph *g, int i, int x, int w) {
  char nm[64];
  snprintf(nm, sizeof nm, "c%d/y0", i);
  const char *y0 = ir_graph_strdup(g, nm);
  int mm = ir_add_node(g, OP_MATMUL, 2, (int[]){x, w}, 1, &y0, qc_loc);
  ir_set_attr_bool(g, mm, "transpose_b", true);
  ir_fill_default_attrs(g, mm);
  CHECK_OK(ir_infer_node(g, mm));
  return mm;
}

/* Adds case c (its inputs, constants and nodes, result an output). */
static inline void add_case(Graph *g, int i, const QCase *c) {
  char nm[64];
  int x, w;
  add_operands(g, i, c, &x, &w);
  int mm = add_matmul(g, i, x, w);
  snprintf(nm, sizeof nm, "c%d/b", i);
  int b = add_const(g, nm, (TensorType){.dt = c->adt, .rank = 1, .dim = {c->N}});
  for (int64_t e = 0; e < c->N; e++) dt_store(c->adt, g->val[b].data, (size_t)e, (double)(next_rand() % 200) / 100 - 1);
  snprintf(nm, sizeof nm, "c%d/y1", i);
  const char *y1 = ir_graph_strdup(g, nm);
  int ad = ir_add_node(g, OP_ADD, 2, (int[]){g->node[mm].out[0], b}, 1, &y1, qc_loc);
  CHECK_OK(ir_infer_node(g, ad));
  snprintf(nm, sizeof nm, "c%d/y", i);
  const char *yn = ir_graph_strdup(g, nm);
  int sl = ir_add_node(g, OP_SILU, 1, (int[]){g->node[ad].out[0]}, 1, &yn, qc_loc);
  CHECK_OK(ir_infer_node(g, sl));
  ir_add_output(g, g->node[sl].out[0]);
}

static const QCase cases[] = {
    {DT_I4, DT_F32, DT_F32, 1, 512, 130, 128, false, false, DT_INVALID},
    {DT_I4, DT_F16, DT_F16, 3, 256, 40, 32, false, false, DT_INVALID},
    {DT_I4, DT_BF16, DT_F32, 8, 256, 40, 16, false, false, DT_INVALID},
    {DT_I4, DT_F16, DT_F16, 1, 256, 40, 128, false, true, DT_INVALID},
    {DT_I8, DT_F32, DT_F32, 1, 256, 130, 0, false, false, DT_INVALID},
    {DT_I8, DT_F16, DT_F16, 8, 128, 40, 64, false, false, DT_INVALID},
    {DT_F8E4M3, DT_F32, DT_F32, 1, 128, 40, 0, true, false, DT_INVALID},
    {DT_F8E4M3, DT_F16, DT_F32, 3, 256, 40, 0, false, false, DT_INVALID},
    {DT_F8E5M2, DT_F32, DT_F32, 1, 128, 40, 0, true, false, DT_INVALID},
    {DT_F8E5M2, DT_BF16, DT_F32, 3, 128, 40, 32, false, false, DT_INVALID},
    /* zero points (10: u4 with u4 zeros, 11: u4 with f16 zeros; both also in check_forced) */
    {DT_U4, DT_F16, DT_F16, 1, 512, 130, 128, false, false, DT_U4},
    {DT_U4, DT_F16, DT_F16, 3, 256, 40, 32, false, false, DT_F16},
    {DT_U4, DT_F32, DT_F32, 1, 256, 130, 64, false, false, DT_U4},
    {DT_U4, DT_F32, DT_F32, 3, 256, 40, 32, false, false, DT_U4},
    {DT_U4, DT_F16, DT_F16, 8, 256, 40, 16, false, false, DT_U4},
    {DT_U4, DT_BF16, DT_F32, 3, 192, 40, 64, false, false, DT_U4}, /* 3 groups: zeros of odd columns start mid-byte */
    {DT_U4, DT_F32, DT_F16, 1, 96, 33, 32, false, false, DT_U4},   /* 3 groups */
    {DT_U4, DT_F16, DT_F16, 1, 256, 40, 128, false, true, DT_U4},  /* x through a prologue */
    {DT_U4, DT_F32, DT_F32, 1, 256, 40, 16, false, false, DT_F32}, /* float zeros, two groups a chunk */
    {DT_U4, DT_BF16, DT_BF16, 8, 128, 40, 0, false, false, DT_BF16},
    {DT_U4, DT_F32, DT_F32, 3, 128, 40, 8, false, false, DT_U4},   /* four groups a chunk */
    {DT_U4, DT_F16, DT_F16, 1, 128, 40, 8, false, false, DT_F16},
    {DT_U8, DT_F32, DT_F32, 1, 256, 130, 64, false, false, DT_U8},
    {DT_U8, DT_F16, DT_F16, 3, 128, 40, 0, false, false, DT_U8},
    {DT_I4, DT_F32, DT_F32, 3, 256, 40, 16, false, false, DT_I4},
    {DT_I4, DT_F16, DT_F16, 1, 256, 40, 32, false, false, DT_F16},
    {DT_I8, DT_F32, DT_F32, 1, 128, 40, 0, false, false, DT_I8},
    {DT_U4, DT_F32, DT_F32, 1, 256, 40, 32, false, false, DT_INVALID},
    {DT_U8, DT_F32, DT_F32, 3, 128, 40, 0, false, false, DT_INVALID},
    /* qmma's (f16 x): K not a whole number of its K blocks (29, 30), fp8 specials, groups of 64 and 32 */
    {DT_I4, DT_F16, DT_F16, 1, 96, 40, 32, false, false, DT_INVALID},
    {DT_U8, DT_F16, DT_F16, 3, 80, 130, 0, false, false, DT_U8},
    {DT_F8E5M2, DT_F16, DT_F16, 8, 192, 40, 0, true, false, DT_INVALID},
    {DT_I8, DT_F16, DT_F16, 1, 512, 130, 0, false, false, DT_INVALID},
    {DT_I4, DT_F16, DT_F16, 8, 512, 40, 64, false, false, DT_I4},
    {DT_F8E4M3, DT_F16, DT_F16, 1, 256, 40, 32, false, false, DT_INVALID},
    {DT_I4, DT_F16, DT_F32, 1, 256, 40, 32, false, false, DT_INVALID}, /* f32 scales, groups under a K block: qgemv's */
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* Gated pairs (SwiGLU's silu(x Wg) * (x Wu) after merge-matmuls, which
 * interleaves the two weights' rows): y = silu(h[:, 0::2]) * h[:, 1::2]
 * with h = x @ dequantize(q, s[, z])^T, q [2N, K].  The fuse pass takes
 * both slices, the silu and the product into the matmul's epilogue (pair
 * mode: qmma for f16 x, qgemv otherwise); the case's shapes are the
 * QCase's with N the pair count. */
static inline void add_pair_case(Graph *g, int i, const QCase *c) {
  QCase w2 = *c;
  w2.N = 2 * c->N;
  char nm[64];
  int x, w;
  add_operands(g, i, &w2, &x, &w);
  int mm = add_matmul(g, i, x, w); /* (g->node moves when a node is added) */
  int h = g->node[mm].out[0];
  int sl[2];
  for (int j = 0; j < 2; j++) {
    snprintf(nm, sizeof nm, j ? "c%d/up" : "c%d/gate", i);
    const char *n = ir_graph_strdup(g, nm);
    sl[j] = ir_add_node(g, OP_SLICE, 1, &h, 1, &n, qc_loc);
    ir_set_attr_int(g, sl[j], "axis", 1);
    ir_set_attr_int(g, sl[j], "start", j);
    ir_set_attr_int(g, sl[j], "end", w2.N);
    ir_set_attr_int(g, sl[j], "step", 2);
    CHECK_OK(ir_infer_node(g, sl[j]));
  }
  snprintf(nm, sizeof nm, "c%d/act", i);
  const char *sn = ir_graph_strdup(g, nm);
  int si = ir_add_node(g, OP_SILU, 1, (int[]){g->node[sl[0]].out[0]}, 1, &sn, qc_loc);
  CHECK_OK(ir_infer_node(g, si));
  snprintf(nm, sizeof nm, "c%d/pair", i);
  const char *yn = ir_graph_strdup(g, nm);
  int mu = ir_add_node(g, OP_MUL, 2, (int[]){g->node[si].out[0], g->node[sl[1]].out[0]}, 1, &yn, qc_loc);
  CHECK_OK(ir_infer_node(g, mu));
  ir_add_output(g, g->node[mu].out[0]);
}

/* The gated-pair cases: int4 g128 and u4 with u4 zeros at M = 1 and 3 on
 * f16 x (qmma), int4 and int8 on f32 x and u4 on bf16 x (qgemv), N pairs
 * spanning more than one block.  (int8 per channel on bf16 x is left out:
 * its weights reach 2.5, and the reference's bf16 rounding of the matmul
 * result, which the kernel keeps in f32, then dominates the product.) */
static const QCase pair_cases[] = {
    {DT_I4, DT_F16, DT_F16, 1, 256, 24, 128, false, false, DT_INVALID},
    {DT_U4, DT_F16, DT_F16, 3, 256, 20, 64, false, false, DT_U4},
    {DT_I4, DT_F32, DT_F32, 1, 256, 21, 32, false, false, DT_INVALID},
    {DT_I8, DT_F32, DT_F32, 3, 128, 20, 0, false, false, DT_INVALID},
    {DT_U4, DT_BF16, DT_F32, 3, 256, 20, 64, false, false, DT_U4},
};
#define NPAIRS ((int)(sizeof pair_cases / sizeof pair_cases[0]))

/* The graph of the gated-pair cases, fused for a CUDA target; their
 * products are the outputs. */
static inline Graph *pairs_graph(void) {
  Graph *g = ir_graph_create("qgemv-pairs");
  g->file = "quant_cases";
  for (int i = 0; i < NPAIRS; i++) add_pair_case(g, i, &pair_cases[i]);
  CHECK_OK(ir_verify(g));
  PassCtx ctx = {.target = "cuda", .arch = "sm_90a"};
  CHECK_OK(pass_run_pipeline(g, &ctx, "fuse", NULL, NULL));
  pass_ctx_free(&ctx);
  return g;
}

/* The graph of cases which[0..n) (all when which is NULL), fused for a
 * CUDA target. */
static inline Graph *cases_graph(const int *which, int n) {
  Graph *g = ir_graph_create("qgemv");
  g->file = "quant_cases";
  if (!which) n = NCASES;
  for (int i = 0; i < n; i++) add_case(g, i, &cases[which ? which[i] : i]);
  CHECK_OK(ir_verify(g));
  PassCtx ctx = {.target = "cuda", .arch = "sm_90a"};
  CHECK_OK(pass_run_pipeline(g, &ctx, "fuse", NULL, NULL));
  pass_ctx_free(&ctx);
  return g;
}

static inline int is_matmul_kernel(const Graph *g, const Kernel *k) {
  const Group *gr = &g->groups[k->group];
  return g->node[gr->anchor].op == OP_MATMUL;
}

/* Whether case c is qmma's (qmma.c's eligibility, worked out by hand):
 * f16 x, zero points (if any) of the codes' dtype and not with fp8, a
 * group of whole 16-byte chunks (32 codes of 4 bits, 16 of 8). */
static inline bool takes_qmma(const QCase *c) {
  int64_t E = dt_is_packed(c->qdt) ? 32 : 16, G = c->G ? c->G : c->K;
  if (c->adt != DT_F16 || c->K % E || G % E) return false;
  if (G % (4 * E) && c->sdt != DT_F16) return false; /* f16 pairs scaled by a rounded scale */
  return c->zdt == DT_INVALID || (c->zdt == c->qdt && !dt_is_f8(c->qdt));
}

/* Every matmul kernel of c forced to tok: the force list for
 * CgCudaOptions (calloc'd, one entry a kernel as cg_lower makes them). */
static inline const char **force_matmuls(Graph *c, const char *tok) {
  Kernel *kk = NULL;
  int n = 0;
  CHECK_OK(cg_lower(c, &kk, &n));
  const char **fc = calloc((size_t)n + 1, sizeof *fc);
  for (int i = 0; i < n; i++)
    if (is_matmul_kernel(c, &kk[i])) fc[i] = tok;
  cg_kernels_free(kk, n);
  return fc;
}

/* qgemv's tokens: cases 0 (int4), 4 (int8), 10 (u4 with u4 zeros) and 11
 * (u4 with f16 zeros); qmma's: cases 1 (int4, f16 scales), 10, 29 (int4,
 * a partial K block) and 30 (u8 zeros, a partial K block); every matmul
 * forced to tok, run by e for arch. */
static inline void check_forced(Exec *e, const char *tok, const char *arch, HStats *stats) {
  bool qmma = !strncmp(tok, "qmma:", 5);
  Graph *c = cases_graph(qmma ? (const int[]){1, 10, 29, 30} : (const int[]){0, 4, 10, 11}, 4);
  const char **fc = force_matmuls(c, tok);
  CgCudaOptions opt = {.max_units = 1, .arch = arch, .force = fc};
  char what[96];
  snprintf(what, sizeof what, "qgemv cases forced to %s", tok);
  CHECK(h_check_graph(e, c, NULL, &opt, 0, false, what, stats) == 0);
  free(fc);
  ir_graph_destroy(c);
}

/* The gated-pair cases (pairs_graph): one kernel each (the slices, the
 * silu and the product in the matmul's epilogue), qmma's for f16 x and
 * qgemv's otherwise, run by e and compared with the interpreter with the
 * heuristic's variants, then with every kernel forced to a qgemv token
 * of an odd column count (run as the next even one) and of two, and the
 * f16 cases to another qmma token and to qgemv's half mode. */
static inline void check_pairs(Exec *e, const char *arch, HStats *stats) {
  Graph *g = pairs_graph();
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  CHECK(nk == NPAIRS);
  const char **fc = calloc((size_t)nk + 1, sizeof *fc);
  bool *f16 = calloc((size_t)nk + 1, sizeof *f16);
  for (int i = 0; i < nk; i++) {
    int ci = -1;
    CHECK(sscanf(g->val[g->node[g->groups[k[i].group].anchor].out[0]].name, "c%d/", &ci) == 1 && ci >= 0 && ci < NPAIRS);
    if (ci < 0 || ci >= NPAIRS) continue;
    f16[i] = pair_cases[ci].adt == DT_F16;
    char got[16][CG_VARIANT_LEN];
    int n = cg_cuda_variants(g, &k[i], arch, got, 16);
    const char *want = f16[i] ? "qmma:" : "qgemv:";
    if (n < 1 || strncmp(got[0], want, strlen(want)) != 0) {
      fprintf(stderr, "pair case %d: heuristic %s, not %s\n", ci, n ? got[0] : "(none)", want);
      check_failures++;
    }
  }
  char what[96];
  snprintf(what, sizeof what, "gated-pair cases (%s)", arch);
  CgCudaOptions opt = {.max_units = 1, .arch = arch};
  Graph *c = ir_graph_clone(g);
  CHECK(h_check_graph(e, c, NULL, &opt, 0, false, what, stats) == 0);
  ir_graph_destroy(c);
  static const char *const forced[] = {"qgemv:w=4,c=1,u=8", "qgemv:w=2,c=2,u=4", "qmma:w=2,s=3", "qgemv:w=4,c=2,u=4,h=1",
                                       "qgemv:w=2,c=2,u=2,p=3"};
  for (int t = 0; t < 5; t++) {
    bool f16_only = !strncmp(forced[t], "qmma:", 5) || strstr(forced[t], ",h=1");
    for (int i = 0; i < nk; i++) fc[i] = !f16_only || f16[i] ? forced[t] : NULL;
    CgCudaOptions fo = {.max_units = 1, .arch = arch, .force = fc};
    snprintf(what, sizeof what, "gated-pair cases forced to %s", forced[t]);
    c = ir_graph_clone(g);
    CHECK(h_check_graph(e, c, NULL, &fo, 8, false, what, stats) == 0);
    ir_graph_destroy(c);
  }
  free(fc);
  free(f16);
  cg_kernels_free(k, nk);
  ir_graph_destroy(g);
}

/* Norm prologues (a decoder layer's rms_norm before its quantised
 * projections): y = rms_norm(r, gamma) @ dequantize(q, s[, z])^T + b with
 * r an input [M, K].  The fuse pass computes the norm in the quantised
 * GEMV's loads (norm mode: one kernel, qgemv's; qmma declines it). */
static inline void add_norm_case(Graph *g, int i, const QCase *c) {
  char nm[64];
  int x, w;
  add_operands(g, i, c, &x, &w); /* x [M, K] becomes the norm's input r */
  snprintf(nm, sizeof nm, "c%d/gamma", i);
  int gm = add_const(g, nm, (TensorType){.dt = c->adt, .rank = 1, .dim = {c->K}});
  for (int64_t e = 0; e < c->K; e++) dt_store(c->adt, g->val[gm].data, (size_t)e, 0.5 + (double)(next_rand() % 100) / 100);
  snprintf(nm, sizeof nm, "c%d/h", i);
  const char *hn = ir_graph_strdup(g, nm);
  int rn = ir_add_node(g, OP_RMS_NORM, 2, (int[]){x, gm}, 1, &hn, qc_loc);
  ir_fill_default_attrs(g, rn);
  ir_set_attr_float(g, rn, "eps", 1e-5);
  CHECK_OK(ir_infer_node(g, rn));
  int mm = add_matmul(g, i, g->node[rn].out[0], w);
  snprintf(nm, sizeof nm, "c%d/b", i);
  int b = add_const(g, nm, (TensorType){.dt = c->adt, .rank = 1, .dim = {c->N}});
  for (int64_t e = 0; e < c->N; e++) dt_store(c->adt, g->val[b].data, (size_t)e, (double)(next_rand() % 200) / 100 - 1);
  snprintf(nm, sizeof nm, "c%d/y", i);
  const char *yn = ir_graph_strdup(g, nm);
  int ad = ir_add_node(g, OP_ADD, 2, (int[]){g->node[mm].out[0], b}, 1, &yn, qc_loc);
  CHECK_OK(ir_infer_node(g, ad));
  ir_add_output(g, g->node[ad].out[0]);
}

/* The norm cases: int4 g128 on f16 x (which qmma would take without the
 * norm), u4 with u4 zeros at M = 3 on f16, int8 per channel on f32 x,
 * fp8 e4m3 on bf16 x, int4 g32 on f32 x at M = 8. */
static const QCase norm_cases[] = {
    {DT_I4, DT_F16, DT_F16, 1, 512, 40, 128, false, false, DT_INVALID},
    {DT_U4, DT_F16, DT_F16, 3, 256, 33, 64, false, false, DT_U4},
    {DT_I8, DT_F32, DT_F32, 2, 256, 37, 0, false, false, DT_INVALID},
    {DT_F8E4M3, DT_BF16, DT_F32, 1, 128, 24, 0, false, false, DT_INVALID},
    {DT_I4, DT_F32, DT_F32, 8, 256, 20, 32, false, false, DT_INVALID},
};
#define NNORMS ((int)(sizeof norm_cases / sizeof norm_cases[0]))

/* The norm cases (add_norm_case): one kernel each, qgemv's (the heuristic
 * and every qgemv candidate forced), checked by e against the interpreter,
 * at two buffer offsets (the 16-byte and the element loads of r and
 * gamma). */
static inline void check_norms(Exec *e, const char *arch, HStats *stats) {
  Graph *g = ir_graph_create("qgemv-norms");
  g->file = "quant_cases";
  for (int i = 0; i < NNORMS; i++) add_norm_case(g, i, &norm_cases[i]);
  CHECK_OK(ir_verify(g));
  PassCtx ctx = {.target = "cuda", .arch = "sm_90a"};
  CHECK_OK(pass_run_pipeline(g, &ctx, "fuse", NULL, NULL));
  pass_ctx_free(&ctx);
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  CHECK(nk == NNORMS); /* the norm is in the matmul's kernel */
  char toks[16][CG_VARIANT_LEN];
  int ntok = nk > 0 ? cg_cuda_variants(g, &k[0], arch, toks, 16) : 0;
  for (int i = 0; i < nk; i++) {
    char got[16][CG_VARIANT_LEN];
    int n = cg_cuda_variants(g, &k[i], arch, got, 16);
    if (n < 1 || strncmp(got[0], "qgemv:", 6) != 0) {
      fprintf(stderr, "norm kernel %d: heuristic %s, not qgemv\n", i, n ? got[0] : "(none)");
      check_failures++;
    }
    for (int j = 0; j < n; j++)
      if (strncmp(got[j], "qgemv:", 6) != 0) {
        fprintf(stderr, "norm kernel %d: candidate %s is not qgemv's\n", i, got[j]);
        check_failures++;
      }
  }
  char what[64 + CG_VARIANT_LEN];
  for (size_t off = 0; off <= 8; off += 8) {
    CgCudaOptions opt = {.max_units = 1, .arch = arch};
    snprintf(what, sizeof what, "norm cases (%s), offset %zu", arch, off);
    Graph *c = ir_graph_clone(g);
    CHECK(h_check_graph(e, c, NULL, &opt, off, false, what, stats) == 0);
    ir_graph_destroy(c);
  }
  const char **fc = calloc((size_t)nk + 1, sizeof *fc);
  for (int t = 1; t < ntok; t++) {
    for (int i = 0; i < nk; i++) fc[i] = toks[t];
    CgCudaOptions fo = {.max_units = 1, .arch = arch, .force = fc};
    snprintf(what, sizeof what, "norm cases forced to %s", toks[t]);
    Graph *c = ir_graph_clone(g);
    CHECK(h_check_graph(e, c, NULL, &fo, 0, false, what, stats) == 0);
    ir_graph_destroy(c);
  }
  free(fc);
  cg_kernels_free(k, nk);
  ir_graph_destroy(g);
}

/* Half mode (qgemv's h=1: f16 pair arithmetic, f16 x only): every f16
 * case it takes (int4, u4 and int8 with integer zeros or none, e4m3;
 * groups of 16 to per channel, M = 1, 3 and 8, x through a prologue)
 * forced to four h=1 tokens (C = 2 and 1, split-K in 4 slices, 3
 * column groups a warp), each
 * kernel checked to have run the token, element by element; then,
 * compared as whole tensors
 * (largest error against the largest value, cosine: h_compare_tensor),
 * an int8 and a u4 case with x in [-600, 600), where a word's f16 sums
 * would overflow without the shift of x (half_shift), and case 32 (int8
 * per channel, K = 512: sums near 10, where the rounding of each f16
 * product, as large as the f16 rounding of the matmul's own result, is
 * more than the element tolerance leaves after the reference's).  The
 * f16 gated pairs and norm cases run h=1 in check_pairs (forced) and
 * check_norms (every candidate). */
static inline void check_half(Exec *e, const char *arch, HStats *stats) {
  static const int which[] = {1, 3, 5, 7, 10, 14, 17, 23, 29, 30, 33, 34, 35};
  static const char *const toks[] = {"qgemv:w=4,c=2,u=4,h=1", "qgemv:w=2,c=1,u=8,h=1", "qgemv:w=4,c=2,u=2,h=1,sk=4",
                                     "qgemv:w=2,c=2,u=2,h=1,p=3"};
  static const QCase big[] = {
      {DT_I8, DT_F16, DT_F16, 1, 128, 40, 0, false, false, DT_INVALID},
      {DT_U4, DT_F16, DT_F16, 3, 256, 40, 128, false, false, DT_U4},
      {DT_I8, DT_F16, DT_F16, 1, 512, 130, 0, false, false, DT_INVALID}, /* case 32 */
  };
  char what[96];
  for (int t = 0; t < 5; t++) {
    Graph *c;
    static OpSuite wide;
    const OpSuite *ranges = NULL;
    const char *tok = toks[t % 4];
    if (t < 4) {
      c = cases_graph(which, (int)(sizeof which / sizeof *which));
    } else {
      c = ir_graph_create("qgemv-half-wide");
      c->file = "quant_cases";
      for (int i = 0; i < 3; i++) add_case(c, i, &big[i]);
      CHECK_OK(ir_verify(c));
      PassCtx ctx = {.target = "cuda", .arch = "sm_90a"};
      CHECK_OK(pass_run_pipeline(c, &ctx, "fuse", NULL, NULL));
      pass_ctx_free(&ctx);
      wide.nin = c->ninputs;
      for (int i = 0; i < c->ninputs; i++) wide.in[i] = (OcInput){c->inputs[i], i < 2 ? -600 : -1, i < 2 ? 600 : 1};
      ranges = &wide;
    }
    const char **fc = force_matmuls(c, tok);
    CgCudaOptions opt = {.max_units = 1, .arch = arch, .force = fc};
    Kernel *kk = NULL;
    int n = 0;
    CHECK_OK(cg_lower(c, &kk, &n));
    FmtCudaModule *m = NULL;
    CHECK_OK(cg_cuda_generate(c, kk, n, &opt, &m));
    for (int i = 0; m && i < m->nkernels && i < n; i++)
      if (fc[i] && strcmp(m->kernels[i].variant, tok) != 0) {
        fprintf(stderr, "half mode: kernel %s forced to %s ran %s\n", m->kernels[i].name, tok, m->kernels[i].variant);
        check_failures++;
      }
    fmt_cuda_module_free(m);
    cg_kernels_free(kk, n);
    snprintf(what, sizeof what, "%s forced to %s", t < 4 ? "f16 cases" : "f16 cases with x in [-600, 600)", tok);
    CHECK(h_check_graph(e, c, ranges, &opt, t == 1 ? 8 : 0, t == 4, what, stats) == 0);
    free(fc);
    ir_graph_destroy(c);
  }
}

/* The candidates of the first kernel of each family in g (0: qgemv, 1:
 * qmma; the heuristic's token first) into toks[fam][0 .. ntok[fam]). */
static inline void family_tokens(Graph *g, const char *arch, char (*toks)[16][CG_VARIANT_LEN], int *ntok) {
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  ntok[0] = ntok[1] = 0;
  for (int i = 0; i < nk; i++) {
    if (!is_matmul_kernel(g, &k[i])) continue;
    char got[16][CG_VARIANT_LEN];
    int n = cg_cuda_variants(g, &k[i], arch, got, 16), fam = n > 0 && !strncmp(got[0], "qmma:", 5);
    if (n > 0 && !ntok[fam]) memcpy(toks[fam], got, sizeof got), ntok[fam] = n;
  }
  cg_kernels_free(k, nk);
}

/* Runs each candidate of toks (but the defaults: toks[fam][0]) of its
 * family forced on four cases (check_forced). */
static inline void check_all_forced(Exec *e, const char *arch, char (*toks)[16][CG_VARIANT_LEN], const int *ntok,
                                    HStats *stats) {
  for (int fam = 0; fam < 2; fam++)
    for (int j = 1; j < ntok[fam]; j++)
      if (!strncmp(toks[fam][j], fam ? "qmma:" : "qgemv:", fam ? 5 : 6)) check_forced(e, toks[fam][j], arch, stats);
  /* split-K (the tuner offers it only where K holds two blocks a warp and
   * slice, more than these cases have: forced here, slices of one K block
   * and empty ones included) */
  check_forced(e, "qmma:w=2,s=3,sk=2", arch, stats);
  check_forced(e, "qmma:w=1,s=4,sk=3", arch, stats);
  check_forced(e, "qmma:w=4,s=4,sk=16", arch, stats);
  check_forced(e, "qgemv:w=2,c=2,u=2,sk=2", arch, stats);
  check_forced(e, "qgemv:w=4,c=1,u=1,sk=3", arch, stats);
  check_forced(e, "qgemv:w=2,c=2,u=1,sk=16", arch, stats);
  check_forced(e, "qgemv:w=2,c=2,u=1,p=3", arch, stats); /* warps that take 3 column groups, some none */
}

/* The gated-pair cases with qmma (f16 x) and then qgemv (all, half mode
 * where it applies) forced to split-K (the tail adds the two columns of a
 * pair). */
static inline void check_pairs_split(Exec *e, const char *arch, HStats *stats) {
  Graph *g = pairs_graph();
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  const char **fc = calloc((size_t)nk + 1, sizeof *fc);
  for (int i = 0; i < nk; i++) {
    int ci = -1;
    if (sscanf(g->val[g->node[g->groups[k[i].group].anchor].out[0]].name, "c%d/", &ci) == 1 && ci >= 0 && ci < NPAIRS &&
        pair_cases[ci].adt == DT_F16)
      fc[i] = "qmma:w=2,s=3,sk=2";
  }
  CgCudaOptions fo = {.max_units = 1, .arch = arch, .force = fc};
  Graph *c = ir_graph_clone(g);
  CHECK(h_check_graph(e, c, NULL, &fo, 8, false, "gated-pair cases, qmma split-K", stats) == 0);
  ir_graph_destroy(c);
  for (int i = 0; i < nk; i++) fc[i] = "qgemv:w=2,c=2,u=1,h=1,sk=3";
  c = ir_graph_clone(g);
  CHECK(h_check_graph(e, c, NULL, &fo, 0, false, "gated-pair cases, qgemv split-K", stats) == 0);
  ir_graph_destroy(c);
  free(fc);
  cg_kernels_free(k, nk);
  ir_graph_destroy(g);
}

#endif
