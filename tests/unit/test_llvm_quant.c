/* The CPU backend's quantised matmuls (codegen/llvm/qmatmul.c) against the
 * reference interpreter, which computes the same quantised arithmetic
 * exactly: dequantize in double (rounded to its `to` dtype), then the
 * matmul in double.
 *
 * Each case is one kernel: dequantize(q, s[, z]) and matmul (and an
 * epilogue: bias add and silu) in one contraction group, as the fuse pass
 * forms it for decode.  Cases cover both layouts ([K, N] weights with the
 * dequantize along axis 0, [N, K] with transpose_b along axis 1), every
 * weight dtype the fast path takes (i8, u8, i4, u4, f8e4m3, f8e5m2), zero
 * points of the qweight's dtype (u4 with u4 zeros: GPTQ, AWQ, ONNX
 * MatMulNBits; u8, i8, i4) and of the scales' float dtype (f32, f16, bf16),
 * among them rows of u4 zeros that start mid-byte (an odd K/G), groups of
 * 0 (per channel), 16, 32, 64 and 128 (the split 4-bit path needs a
 * multiple of 2 VL), f32/f16/bf16 activations and scales, one and three
 * rows and a batch dim, column counts with tails (37, 201, 200: the last
 * column block partial), FP8 special codes (NaN, e5m2 infinities,
 * subnormals), and some cases compiled for AVX2 and SSE2 CPUs (VL 8 and 4,
 * so a group of 16 takes the split path there and not with AVX-512).  The
 * ones left to the generic loop: an odd N for 4-bit [K, N], fp8 with zero
 * points, f16 scales and zeros without hardware conversion, zero points
 * with more than QMM_MAX_GROUPS groups.  The harness (test_llvm_harness.h)
 * checks every output (relative L2 1e-5 in f32, 2e-3 in f16, 6e-3 in bf16:
 * the reference rounds the dequantised weight to bf16, the kernel keeps it
 * in f32; NaN exactly where the reference has one), guard bytes and task
 * splits.  For
 * each case the unoptimised LLVM IR says whether the quantised GEMV took
 * the kernel ("xrow", its row buffer), and the test checks that it did
 * exactly where it should.
 */
#include <stdarg.h>

#include "tests/unit/test_llvm_harness.h"

#ifdef SMELT_HAVE_LLVM

static char label[256];

typedef struct {
  DType qdt, adt, sdt;
  bool tb, zeros, epilogue, special, batch;
  int64_t M, K, N, G;
  bool want_fast;
  DType zdt;       /* the zero points' dtype; DT_INVALID: u4 for u4 weights, else the scales' */
  const char *cpu; /* compile for this CPU (NULL: the host) */
  bool soft_f16;   /* f16 conversions in software (as without F16C) */
} QCase;

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* A constant of type t with element i = gen(i). */
static int const_of(TG *t, const char *name, TensorType ty, double (*gen)(DType, int64_t), bool raw_f8) {
  int v = ir_add_const(t->g, name, ty, NULL, here);
  void *d = t->g->val[v].data;
  for (int64_t i = 0; i < ir_type_numel(&ty); i++) {
    if (raw_f8) ((uint8_t *)d)[i] = (uint8_t)gen(ty.dt, i);
    else dt_store(ty.dt, d, (size_t)i, gen(ty.dt, i));
  }
  return v;
}

static double gen_q(DType dt, int64_t i) {
  (void)i;
  uint64_t r = next_rand();
  switch (dt) {
  case DT_I8: return (double)((int64_t)(r % 255) - 127);
  case DT_I4: return (double)((int64_t)(r % 16) - 8);
  case DT_U4: return (double)(r % 16);
  case DT_U8: return (double)(r % 256);
  case DT_F8E4M3: { /* codes of |v| below NaN (0x7f), either sign */
    unsigned c = (unsigned)(r % 0x7f);
    return (double)(c | ((r >> 8) & 1 ? 0x80u : 0));
  }
  default: { /* e5m2: exponents below 31 (no inf/NaN) */
    unsigned c = (unsigned)(r % 0x7c);
    return (double)(c | ((r >> 8) & 1 ? 0x80u : 0));
  }
  }
}

/* f8 special codes sprinkled in: NaN for e4m3, inf and NaN for e5m2,
 * subnormals for both. */
static double gen_q_special(DType dt, int64_t i) {
  if (i == 5) return dt == DT_F8E4M3 ? 0x7f : 0x7c; /* NaN / +inf */
  if (i == 9) return dt == DT_F8E4M3 ? 0x81 : 0xfd;  /* -subnormal / NaN */
  if (i % 7 == 3) return (double)(i % 8);           /* subnormals */
  return gen_q(dt, i);
}

static double gen_scale(DType dt, int64_t i) {
  (void)dt;
  (void)i;
  return 0.01 + 0.09 * (double)(next_rand() >> 11) / 9007199254740992.0;
}

/* Zero points about where quantisers put them: the middle of the codes'
 * range, give or take (floats: [-10, 10) in steps of 0.1). */
static double gen_zero(DType dt, int64_t i) {
  (void)i;
  uint64_t r = next_rand();
  switch (dt) {
  case DT_U4: return (double)(r % 16);
  case DT_U8: return (double)(96 + r % 64);
  default: return dt_is_float(dt) ? (double)(r % 200) / 10.0 - 10 : (double)(r % 11) - 5;
  }
}

static DType zero_dtype(const QCase *c) {
  if (c->zdt != DT_INVALID) return c->zdt;
  return c->qdt == DT_U4 ? DT_U4 : c->sdt;
}

static double gen_bias(DType dt, int64_t i) {
  (void)dt;
  (void)i;
  return (double)(next_rand() % 200) / 100.0 - 1.0;
}

/* Builds the case into t; returns the matmul's node id. */
static void build(TG *t, const QCase *c) {
  int64_t ng = c->G ? c->K / c->G : 1;
  TensorType qt = {.dt = c->qdt, .rank = 2}, st = {.dt = c->sdt, .rank = 2};
  if (c->tb) {
    qt.dim[0] = c->N, qt.dim[1] = c->K;
    st.dim[0] = c->N, st.dim[1] = ng;
  } else {
    qt.dim[0] = c->K, qt.dim[1] = c->N;
    st.dim[0] = ng, st.dim[1] = c->N;
  }
  int x = c->batch ? tg_input(t, "x", c->adt, 3, (int64_t[]){2, c->M, c->K}, DOM_ANY, 0)
                   : tg_input(t, "x", c->adt, 2, (int64_t[]){c->M, c->K}, DOM_ANY, 0);
  bool f8 = dt_is_f8(c->qdt);
  int q = const_of(t, "q", qt, c->special ? gen_q_special : gen_q, f8);
  int s = const_of(t, "s", st, gen_scale, false);
  int in[3] = {q, s, -1}, nin = 2;
  if (c->zeros) {
    TensorType zt = st;
    zt.dt = zero_dtype(c);
    in[nin++] = const_of(t, "z", zt, gen_zero, false);
  }
  int dq = tg_node(t, OP_DEQUANTIZE, nin, in, "w");
  ir_set_attr_int(t->g, dq, "axis", c->tb ? 1 : 0);
  ir_set_attr_int(t->g, dq, "group", c->G);
  ir_set_attr_dtype(t->g, dq, "to", c->adt);
  int mm = tg_node(t, OP_MATMUL, 2, (int[]){x, tg_val(t, dq)}, "y0");
  if (c->tb) ir_set_attr_bool(t->g, mm, "transpose_b", true);
  int nodes[4] = {dq, mm}, nn = 2;
  if (c->epilogue) {
    int b = const_of(t, "b", (TensorType){.dt = c->adt, .rank = 1, .dim = {c->N}}, gen_bias, false);
    int ad = tg_node(t, OP_ADD, 2, (int[]){tg_val(t, mm), b}, "y1");
    int sl = tg_node(t, OP_SILU, 1, (int[]){tg_val(t, ad)}, "y");
    nodes[nn++] = ad;
    nodes[nn++] = sl;
  }
  tg_group(t, GK_CONTRACTION, nodes, nn, mm);
}

/* Which kernel the quantised matmul takes (qmatmul.c): the GEMV (its row
 * buffer "xrow" shows in the unoptimised IR), the panels of the weight
 * dequantised per block of rows (gemm.c's cg_gemm_panels: its "partial"
 * sums), or neither (the generic loop). */
enum { PATH_GENERIC, PATH_GEMV, PATH_PANELS };
static const char *const path_name[] = {"the generic loop", "the quantised GEMV", "the dequantised panels"};
/* output rows from which the panels take the kernel (QMM_PANEL_ROWS) */
enum { PANEL_ROWS = 5 };

static int kernel_path(const QCase *c) {
  TG t;
  tg_init(&t, "probe", 1);
  build(&t, c);
  Graph *g = t.g;
  int path = PATH_GENERIC;
  smelt_status st = NULL;
  for (int i = 0; i < g->nnode && !st; i++) {
    ir_fill_default_attrs(g, i);
    st = ir_infer_node(g, i);
  }
  ir_add_output(g, g->node[g->nnode - 1].out[0]);
  Kernel *ks = NULL;
  int nk = 0;
  char *ir = NULL;
  if (!st) st = cg_lower(g, &ks, &nk);
  CgLlvmOptions opt = {.cpu = c->cpu, .soft_f16 = c->soft_f16};
  if (!st) st = cg_llvm_ir_text(g, ks, nk, &opt, false, &ir);
  if (st) {
    fprintf(stderr, "%s: probe: %s\n", label, st_message(st));
    st_free(st);
    check_failures++;
  } else {
    path = strstr(ir, "%xrow") ? PATH_GEMV : strstr(ir, "%partial") ? PATH_PANELS : PATH_GENERIC;
  }
  free(ir);
  cg_kernels_free(ks, nk);
  ir_graph_destroy(g);
  return path;
}

static int ncases, nfast, npanels;

static void run_case(QCase c) {
  snprintf(label, sizeof label, "quant %s %s x %s scales %s [%s%s] M=%lld K=%lld N=%lld G=%lld%s%s%s%s%s%s%s",
           dt_name(c.qdt), c.tb ? "[N,K]" : "[K,N]", dt_name(c.adt), dt_name(c.sdt), c.zeros ? "zeros " : "",
           c.zeros ? dt_name(zero_dtype(&c)) : "", (long long)c.M, (long long)c.K, (long long)c.N, (long long)c.G,
           c.epilogue ? " +bias,silu" : "", c.special ? " special" : "", c.batch ? " batch" : "", c.cpu ? " cpu " : "",
           c.cpu ? c.cpu : "", c.soft_f16 ? " soft f16" : "", c.want_fast ? "" : " (generic)");
  int path = kernel_path(&c);
  int want = !c.want_fast ? PATH_GENERIC : c.M * (c.batch ? 2 : 1) >= PANEL_ROWS ? PATH_PANELS : PATH_GEMV;
  if (path != want) {
    fprintf(stderr, "%s: %s took the kernel, not %s\n", label, path_name[path], path_name[want]);
    check_failures++;
  }
  TG t;
  tg_init(&t, label, (uint64_t)ncases + 3);
  build(&t, &c);
  /* bf16: the reference rounds the dequantised weight to bf16 (its `to`),
   * the kernel keeps it in f32 (qmatmul.c); 2^-9 per weight shows as up to
   * ~1.5 bf16 steps of the output */
  RunOpts ro = {.tol32 = 1e-5, .tol16 = c.adt == DT_BF16 ? 6e-3 : 2e-3, .cpu = c.cpu, .soft_f16 = c.soft_f16};
  tg_run(&t, &ro);
  ncases++;
  nfast += path == PATH_GEMV;
  npanels += path == PATH_PANELS;
}

static void test_cases(void) {
  const DType qdts[] = {DT_I8, DT_I4, DT_F8E4M3, DT_F8E5M2};
  const int64_t groups[] = {0, 16, 32, 64, 128};
  for (size_t qi = 0; qi < sizeof qdts / sizeof *qdts; qi++)
    for (int tb = 0; tb < 2; tb++)
      for (size_t gi = 0; gi < sizeof groups / sizeof *groups; gi++) {
        QCase c = {.qdt = qdts[qi], .adt = DT_F32, .sdt = DT_F32, .tb = tb, .M = 1, .K = 256, .N = 200,
                   .G = groups[gi], .want_fast = true};
        run_case(c);
      }
  /* rows, batch, epilogues, dtypes */
  run_case((QCase){.qdt = DT_I4, .adt = DT_F32, .sdt = DT_F32, .tb = true, .M = 3, .K = 128, .N = 37, .G = 32,
                   .epilogue = true, .want_fast = true});
  run_case((QCase){.qdt = DT_I4, .adt = DT_F32, .sdt = DT_F32, .tb = false, .M = 3, .K = 128, .N = 48, .G = 32,
                   .epilogue = true, .want_fast = true});
  run_case((QCase){.qdt = DT_I8, .adt = DT_F32, .sdt = DT_F32, .tb = true, .M = 2, .K = 64, .N = 40, .G = 0,
                   .batch = true, .want_fast = true});
  const DType adts[] = {DT_F16, DT_BF16};
  for (size_t ai = 0; ai < 2; ai++)
    for (int tb = 0; tb < 2; tb++) {
      run_case((QCase){.qdt = DT_I4, .adt = adts[ai], .sdt = adts[ai], .tb = tb, .M = 1, .K = 256, .N = 72, .G = 128,
                       .epilogue = true, .want_fast = true});
      run_case((QCase){.qdt = DT_F8E4M3, .adt = adts[ai], .sdt = DT_F32, .tb = tb, .M = 2, .K = 64, .N = 33, .G = 0,
                       .want_fast = true});
    }
  /* FP8 special codes */
  for (int tb = 0; tb < 2; tb++) {
    run_case((QCase){.qdt = DT_F8E4M3, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .M = 1, .K = 64, .N = 32, .G = 0,
                     .special = true, .want_fast = true});
    run_case((QCase){.qdt = DT_F8E5M2, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .M = 1, .K = 64, .N = 32, .G = 0,
                     .special = true, .want_fast = true});
  }
  /* zero points and unsigned weights (test_zero_points) */
  run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = true, .zeros = true, .M = 1, .K = 128, .N = 24,
                   .G = 32, .want_fast = true});
  run_case((QCase){.qdt = DT_I8, .adt = DT_F32, .sdt = DT_F32, .tb = false, .zeros = true, .M = 2, .K = 64, .N = 24,
                   .G = 0, .want_fast = true});
  /* the generic loop: int4 [K, N] with an odd N */
  run_case((QCase){.qdt = DT_I4, .adt = DT_F32, .sdt = DT_F32, .tb = false, .M = 1, .K = 64, .N = 37, .G = 16,
                   .want_fast = false});
}

/* Asymmetric quantisation: u4 codes with u4 zeros per group (GPTQ, AWQ,
 * MatMulNBits), u8 with u8 zeros, i4/i8 with zeros of their own dtype or
 * of the scales', unsigned codes without zeros; then the cases still left
 * to the generic loop. */
static void test_zero_points(void) {
  const int64_t groups[] = {32, 64, 128};
  const DType sdts[] = {DT_F32, DT_F16};
  for (size_t si = 0; si < 2; si++)
    for (size_t gi = 0; gi < 3; gi++)
      for (int64_t M = 1; M <= 3; M += 2) {
        /* N = 201: four-column passes and a tail of one, in two tasks' blocks */
        run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = sdts[si], .tb = true, .zeros = true, .M = M, .K = 256,
                         .N = 201, .G = groups[gi], .want_fast = true});
      }
  /* f16 activations and scales (the `to` dtype f16); an epilogue; a batch */
  run_case((QCase){.qdt = DT_U4, .adt = DT_F16, .sdt = DT_F16, .tb = true, .zeros = true, .M = 1, .K = 512, .N = 72,
                   .G = 128, .epilogue = true, .want_fast = true});
  run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = true, .zeros = true, .M = 3, .K = 128, .N = 37,
                   .G = 32, .epilogue = true, .want_fast = true});
  run_case((QCase){.qdt = DT_U4, .adt = DT_BF16, .sdt = DT_BF16, .tb = true, .zeros = true, .M = 2, .K = 256, .N = 40,
                   .G = 64, .batch = true, .want_fast = true});
  /* an odd number of groups per row: row n's u4 zeros start mid-byte for
   * odd n; G = 16 is the unsplit 4-bit path with AVX-512 (VL 16) */
  run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = true, .zeros = true, .M = 1, .K = 96, .N = 37,
                   .G = 32, .want_fast = true});
  run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F16, .tb = true, .zeros = true, .M = 3, .K = 80, .N = 21,
                   .G = 16, .want_fast = true});
  run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = true, .zeros = true, .M = 1, .K = 256, .N = 40,
                   .G = 0, .want_fast = true});
  /* u4 [K, N] with u4 zeros [K/G, N] */
  run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = false, .zeros = true, .M = 1, .K = 256, .N = 200,
                   .G = 64, .want_fast = true});
  run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F16, .tb = false, .zeros = true, .M = 3, .K = 128, .N = 38,
                   .G = 32, .epilogue = true, .want_fast = true});
  /* u8 with u8 zeros, both layouts */
  for (int tb = 0; tb < 2; tb++) {
    run_case((QCase){.qdt = DT_U8, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .zeros = true, .zdt = DT_U8, .M = 1,
                     .K = 256, .N = 201, .G = 64, .want_fast = true});
    run_case((QCase){.qdt = DT_U8, .adt = DT_F32, .sdt = DT_F16, .tb = tb, .zeros = true, .zdt = DT_U8, .M = 3,
                     .K = 128, .N = 37, .G = 0, .epilogue = true, .want_fast = true});
  }
  /* i4 with float zeros (the scales' dtype) and with i4 zeros; i8 with i8 zeros */
  for (int tb = 0; tb < 2; tb++) {
    run_case((QCase){.qdt = DT_I4, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .zeros = true, .zdt = DT_F32, .M = 1,
                     .K = 256, .N = 200, .G = 32, .want_fast = true});
    run_case((QCase){.qdt = DT_I4, .adt = DT_F16, .sdt = DT_F16, .tb = tb, .zeros = true, .zdt = DT_F16, .M = 3,
                     .K = 256, .N = 38, .G = 128, .epilogue = true, .want_fast = true});
    run_case((QCase){.qdt = DT_I4, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .zeros = true, .zdt = DT_I4, .M = 1,
                     .K = 96, .N = 38, .G = 32, .want_fast = true});
    run_case((QCase){.qdt = DT_I8, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .zeros = true, .zdt = DT_I8, .M = 1,
                     .K = 128, .N = 37, .G = 32, .want_fast = true});
  }
  run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = true, .zeros = true, .zdt = DT_F32, .M = 1,
                   .K = 256, .N = 37, .G = 128, .want_fast = true});
  run_case((QCase){.qdt = DT_U4, .adt = DT_BF16, .sdt = DT_BF16, .tb = true, .zeros = true, .zdt = DT_BF16, .M = 1,
                   .K = 256, .N = 37, .G = 64, .want_fast = true});
  /* unsigned codes without zero points */
  for (int tb = 0; tb < 2; tb++) {
    run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .M = 1, .K = 256, .N = 200, .G = 32,
                     .want_fast = true});
    run_case((QCase){.qdt = DT_U8, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .M = 3, .K = 128, .N = 37, .G = 0,
                     .want_fast = true});
  }
  /* other vector widths: AVX2 (VL 8: G = 16 splits) and SSE2 (VL 4, no
   * F16C: f32 scales) */
  const char *cpus[] = {"x86-64-v3", "x86-64"};
  for (int ci = 0; ci < 2; ci++) {
    run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = true, .zeros = true, .M = 1, .K = 80, .N = 37,
                     .G = 16, .cpu = cpus[ci], .want_fast = true});
    run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = true, .zeros = true, .M = 3, .K = 256,
                     .N = 201, .G = 128, .epilogue = true, .cpu = cpus[ci], .want_fast = true});
    run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = false, .zeros = true, .M = 1, .K = 128,
                     .N = 38, .G = 32, .cpu = cpus[ci], .want_fast = true});
    run_case((QCase){.qdt = DT_I4, .adt = DT_F32, .sdt = DT_F32, .tb = true, .zeros = true, .zdt = DT_F32, .M = 1,
                     .K = 64, .N = 24, .G = 8, .cpu = cpus[ci], .want_fast = true});
    run_case((QCase){.qdt = DT_U8, .adt = DT_F32, .sdt = DT_F32, .tb = true, .zeros = true, .zdt = DT_U8, .M = 1,
                     .K = 64, .N = 24, .G = 16, .cpu = cpus[ci], .want_fast = true});
  }
  /* still the generic loop: 4-bit [K, N] with an odd N; fp8 with zero
   * points; f16 scales and zeros without F16C; zero points in more than
   * QMM_MAX_GROUPS (2048) groups */
  run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = false, .zeros = true, .M = 1, .K = 64, .N = 37,
                   .G = 32, .want_fast = false});
  run_case((QCase){.qdt = DT_F8E4M3, .adt = DT_F32, .sdt = DT_F32, .tb = true, .zeros = true, .zdt = DT_F32, .M = 1,
                   .K = 64, .N = 24, .G = 32, .want_fast = false});
  run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F16, .tb = true, .zeros = true, .M = 1, .K = 128, .N = 24,
                   .G = 32, .soft_f16 = true, .want_fast = false});
  run_case((QCase){.qdt = DT_I8, .adt = DT_F32, .sdt = DT_F32, .tb = false, .zeros = true, .zdt = DT_I8, .M = 1,
                   .K = 16384, .N = 6, .G = 4, .want_fast = false});
  run_case((QCase){.qdt = DT_I8, .adt = DT_F32, .sdt = DT_F32, .tb = false, .zeros = true, .zdt = DT_I8, .M = 1,
                   .K = 16384, .N = 6, .G = 8, .want_fast = true});
}

/* Many rows: the weight dequantised a panel at a time (gemm.c's
 * cg_gemm_panels).  Rows past one block of MR and past one unit of 192
 * (two row chunks, blocks of 12 with AVX-512), K past one chunk of the
 * panel (256 k's with AVX-512, so K = 320 is a full and a partial chunk),
 * N with a partial last panel (the scalar fill), every weight dtype, zero
 * points of each kind, f16/bf16 activations and scales, a batch dim, an
 * epilogue, FP8 special codes, and the AVX2 and SSE2 blockings. */
static void test_panels(void) {
  const DType qdts[] = {DT_I8, DT_U8, DT_I4, DT_U4, DT_F8E4M3, DT_F8E5M2};
  for (size_t qi = 0; qi < sizeof qdts / sizeof *qdts; qi++)
    for (int tb = 0; tb < 2; tb++) {
      run_case((QCase){.qdt = qdts[qi], .adt = DT_F32, .sdt = DT_F32, .tb = tb, .M = 5, .K = 320, .N = 72, .G = 64,
                       .want_fast = true});
      run_case((QCase){.qdt = qdts[qi], .adt = DT_F32, .sdt = DT_F32, .tb = tb, .M = 29, .K = 128, .N = 38 - tb,
                       .G = 0, .epilogue = true, .special = dt_is_f8(qdts[qi]), .want_fast = true});
    }
  for (int tb = 0; tb < 2; tb++) {
    run_case((QCase){.qdt = DT_I4, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .M = 200, .K = 320, .N = 200, .G = 32,
                     .want_fast = true});
    run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .zeros = true, .M = 13, .K = 256, .N = 64,
                     .G = 128, .batch = true, .epilogue = true, .want_fast = true});
    run_case((QCase){.qdt = DT_U4, .adt = DT_F16, .sdt = DT_F16, .tb = tb, .zeros = true, .M = 7, .K = 192, .N = 40,
                     .G = 64, .want_fast = true});
    run_case((QCase){.qdt = DT_I4, .adt = DT_BF16, .sdt = DT_BF16, .tb = tb, .zeros = true, .zdt = DT_BF16, .M = 9,
                     .K = 128, .N = 34 - tb, .G = 32, .want_fast = true});
    run_case((QCase){.qdt = DT_U8, .adt = DT_F32, .sdt = DT_F16, .tb = tb, .zeros = true, .zdt = DT_U8, .M = 17,
                     .K = 96, .N = 48, .G = 32, .want_fast = true});
    run_case((QCase){.qdt = DT_F8E4M3, .adt = DT_F16, .sdt = DT_F32, .tb = tb, .M = 6, .K = 64, .N = 33, .G = 0,
                     .want_fast = true});
    const char *cpus[] = {"x86-64-v3", "x86-64"};
    for (int ci = 0; ci < 2; ci++)
      run_case((QCase){.qdt = DT_U4, .adt = DT_F32, .sdt = DT_F32, .tb = tb, .zeros = true, .M = 11, .K = 576,
                       .N = 50, .G = 64, .epilogue = true, .cpu = cpus[ci], .want_fast = true});
  }
}

int main(void) {
  (void)tg_const; /* the harness's; these weights are made here */
  test_cases();
  test_zero_points();
  test_panels();
  printf("test_llvm_quant: %d cases (%d through the quantised GEMV, %d through dequantised panels), %d kernels run\n",
         ncases, nfast, npanels, tg_kernels_run);
  return check_done("test_llvm_quant");
}

#else
int main(void) {
  printf("SKIP: built without LLVM\n");
  return CHECK_SKIPPED;
}
#endif
