/* Contraction kernels: matmul (numpy semantics: batch broadcasting, 1-D
 * operands, transpose_a/b) and conv2d (NCHW/OIHW, strides, pads,
 * dilations, groups, bias) with their fused elementwise epilogue, both as
 * a batch of GEMMs (gemm.c says how).
 *
 * The simple kernel ("simple"), for every dtype and layout: a block of 256
 * threads computes a TM x TN tile: per step of TK, it loads an A and a B
 * tile into shared memory (converted to the accumulation type: float for
 * f16/bf16/f32, double for f64, long long for integers), then every thread
 * accumulates its RM x RN outputs, spaced TM/RM rows and TN/RN columns
 * apart so that threads of a warp read neighbouring words.  A tile element
 * is computed with cu_emit, so whatever computes an operand inside the
 * group (a transpose, a cast) is fused into the load.
 *
 * Faster variants come from the GEMM families (cu_families.h), kept in one
 * table below: which one a kernel gets is a forced token (smelt tune),
 * else the tuning table's row for its shape, else the heuristic (the first
 * family of the table that can compute the matmul); the tuner's
 * candidates are the heuristic's token, then every applicable family's
 * candidates in table order, then "simple".
 */
#include <string.h>

#include "codegen/cuda/cu_families.h"
#include "codegen/cuda/cu_kernels.h"

typedef struct {
  int TM, TN, TK, RM, RN;
} Tile;

typedef CuGemm Gemm;

/* ---- the tiled GEMM ---- */

static void load_tile(CuFn *f, const Gemm *gm, bool is_a, const Tile *tl, const char *z, const char *m0,
                      const char *k0, const char *n0, const char *acct) {
  int rows = tl->TK, cols = is_a ? tl->TM : tl->TN; /* smem tile [TK][cols] */
  bool col_fast = is_a ? gm->a_m_fast : gm->b_n_fast;
  const char *e = cu_tmp(f);
  cu_open(f, "for (int %s = threadIdx.x; %s < %d; %s += %d)", e, e, rows * cols, e, 256);
  const char *kk = cu_tmp(f), *cc = cu_tmp(f);
  if (col_fast) {
    cu_line(f, "const int %s = %s / %d, %s = %s %% %d;", kk, e, cols, cc, e, cols);
  } else {
    cu_line(f, "const int %s = %s %% %d, %s = %s / %d;", kk, e, rows, cc, e, rows);
  }
  const char *k = cu_tmp(f), *c = cu_tmp(f);
  cu_line(f, "const %s %s = %s + %s, %s = %s + %s;", f->idx, k, k0, kk, c, is_a ? m0 : n0, cc);
  const char *v = cu_tmp(f);
  cu_line(f, "%s %s = 0;", acct, v);
  cu_open(f, "if (%s < %lld && %s < %lld)", k, (long long)gm->K, c, (long long)(is_a ? gm->M : gm->N));
  CuVal x;
  if (is_a) gm->load_a(f, gm, z, c, k, &x);
  else gm->load_b(f, gm, z, k, c, &x);
  cu_line(f, "%s = (%s)%s;", v, acct, x.l[0]);
  cu_close(f);
  cu_line(f, "%s[%s][%s] = %s;", is_a ? "As" : "Bs", kk, cc, v);
  cu_close(f);
}

/* The GEMM families, in the heuristic's order of preference: M <= 8
 * (decode) is bound by reading B once: when B is a dequantize of a
 * quantised weight in the kernel, the quantised GEMV on the tensor cores
 * for f16 A (qmma.c), else the one in f32 (qgemv.c); else the GEMV; on Hopper (sm_90a)
 * f16/bf16 with K-major operands: wgmma + TMA (686 TFLOP/s at 4096^3 on
 * the H200 against 223 for mma.sync); f16/bf16 with 16-byte rows: tensor
 * cores through mma.sync; f32 when the user allows TF32
 * (CgCudaOptions.allow_tf32) and the rows are 16 bytes: the TF32 tensor
 * cores (tf32.c; a table row naming tf32 does not change an f32 matmul's
 * numerics unasked: the family is not eligible then).  The families are
 * for matmuls, except mma, which also runs f16/bf16 conv2d as an implicit
 * GEMM on the tensor cores; other convs get the simple kernel. */
static const CuGemmFamily *const families[] = {&cu_family_qmma, &cu_family_qgemv, &cu_family_gemv, &cu_family_wgmma,
                                               &cu_family_mma,  &cu_family_tf32};
#define NFAMILIES ((int)(sizeof families / sizeof families[0]))

/* Each family's eligible() checks the op: mma takes f16/bf16 conv2d too. */
static bool family_applies(const CuFn *f, const Gemm *gm, const CuGemmFamily *fam) { return fam->eligible(f, gm); }

/* Emits the kernel of variant token tok when it names a family that can
 * compute this contraction; false (nothing emitted) otherwise. */
static bool emit_token(CuFn *f, const Gemm *gm, const char *tok, const int *epi, int nepi, CuLaunch *l) {
  for (int i = 0; i < NFAMILIES; i++)
    if (family_applies(f, gm, families[i]) && families[i]->emit(f, gm, tok, epi, nepi, l)) return true;
  return false;
}

/* The heuristic's token: the first family that applies, with its default
 * parameters; else the simple kernel. */
static void heuristic(CuFn *f, const Gemm *gm, char out[CG_VARIANT_LEN]) {
  for (int i = 0; i < NFAMILIES; i++)
    if (family_applies(f, gm, families[i])) {
      families[i]->default_token(f, gm, out);
      return;
    }
  snprintf(out, CG_VARIANT_LEN, "simple");
}

int cu_contraction_candidates(CuFn *f, char (*out)[CG_VARIANT_LEN], int max) {
  Gemm gm;
  cu_gemm_setup(f, &gm);
  char h[CG_VARIANT_LEN];
  heuristic(f, &gm, h);
  char all[64][CG_VARIANT_LEN];
  int n = 0;
  snprintf(all[n++], CG_VARIANT_LEN, "%s", h);
  for (int i = 0; i < NFAMILIES; i++)
    if (family_applies(f, &gm, families[i])) n += families[i]->candidates(f, &gm, all + n, 64 - n);
  /* the simple kernel cannot compute a norm in its loads */
  if (n < 64 && !cu_gemv_norm_mode(f, &gm)) snprintf(all[n++], CG_VARIANT_LEN, "simple");
  int got = 0;
  for (int i = 0; i < n && got < max; i++) {
    bool dup = false;
    for (int j = 0; j < got && !dup; j++) dup = strcmp(out[j], all[i]) == 0;
    if (!dup) memcpy(out[got++], all[i], CG_VARIANT_LEN);
  }
  return got;
}

void cu_emit_contraction(CuFn *f, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = &g->node[f->anchor];
  Gemm gm;
  cu_gemm_setup(f, &gm);
  int *epi, nepi, *side, nside;
  cu_split_outputs(f, &epi, &nepi, &side, &nside);
  if (nside) cu_store_loops(f, side, nside);
  /* the variant: forced, else the tuning table's, else the heuristic's */
  bool from_table = false;
  const char *tok = cu_pick_variant(f, &from_table);
  if (tok && strcmp(tok, "simple") == 0 && cu_gemv_norm_mode(f, &gm)) {
    if (!from_table) {
      cu_fail(f, ST_INVALID_INPUT, "variant 'simple' cannot compute this matmul: its rms_norm is computed in the GEMV's loads");
      return;
    }
    cu_log(f, "%s: tuned variant 'simple' does not apply (a norm in the GEMV's loads); using the heuristic", f->k->name);
    tok = NULL;
  }
  if (tok && strcmp(tok, "simple") != 0) {
    if (emit_token(f, &gm, tok, epi, nepi, l)) return;
    if (!from_table) {
      cu_fail(f, ST_INVALID_INPUT, "variant '%s' cannot compute this %s (%lld x %lld x %lld)", tok, ir_op_name(an->op),
              (long long)gm.M, (long long)gm.N, (long long)gm.K);
      return;
    }
    cu_log(f, "%s: tuned variant '%s' does not apply; using the heuristic", f->k->name, tok);
    tok = NULL;
  }
  if (!tok) {
    char h[CG_VARIANT_LEN];
    heuristic(f, &gm, h);
    cu_note_heuristic(f, h);
    if (strcmp(h, "simple") != 0 && emit_token(f, &gm, h, epi, nepi, l)) return;
  }
  snprintf(l->variant, sizeof l->variant, "simple");
  cu_line(f, "// variant: simple shared-memory tiled GEMM (CUDA cores)");
  /* small M (decode, GEMV): a flat tile wastes less of each block */
  Tile tl = gm.M <= 16 ? (Tile){16, 256, 16, 1, 16} : (Tile){64, 64, 16, 4, 4};
  int SR = tl.TM / tl.RM, SC = tl.TN / tl.RN; /* thread rows and columns; SR * SC == 256 */
  DType dt = g->val[an->out[0]].type.dt;
  const char *acct = cu_ctype(dt);

  l->kind = an->op == OP_MATMUL ? "matmul" : "conv2d";
  l->block[0] = 256;
  int64_t gx = (gm.N + tl.TN - 1) / tl.TN, gy = (gm.M + tl.TM - 1) / tl.TM;
  if (gy > 65535 || gx > 0x7fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "a %lld x %lld result exceeds the grid", (long long)gm.M, (long long)gm.N);
    return;
  }
  l->grid[0] = (unsigned)(gx < 1 ? 1 : gx);
  l->grid[1] = (unsigned)(gy < 1 ? 1 : gy);
  l->grid[2] = (unsigned)(gm.Z < 1 ? 1 : gm.Z > 65535 ? 65535 : gm.Z);
  if (gm.M == 0 || gm.N == 0 || gm.Z == 0) return;

  cu_line(f, "__shared__ %s As[%d][%d];  // A tile, k-major", acct, tl.TK, tl.TM + 1);
  cu_line(f, "__shared__ %s Bs[%d][%d];  // B tile, k-major", acct, tl.TK, tl.TN);
  const char *ty = cu_tmp(f), *tx = cu_tmp(f), *m0 = cu_tmp(f), *n0 = cu_tmp(f), *z = cu_tmp(f);
  cu_line(f, "const int %s = threadIdx.x / %d, %s = threadIdx.x %% %d;", ty, SC, tx, SC);
  cu_line(f, "const %s %s = (%s)blockIdx.y * %d, %s = (%s)blockIdx.x * %d;", f->idx, m0, f->idx, tl.TM, n0, f->idx, tl.TN);
  cu_open(f, "for (%s %s = blockIdx.z; %s < %lld; %s += gridDim.z)", f->idx, z, z, (long long)gm.Z, z);
  bool ranged = cu_gemm_ranged(&gm);
  if (ranged) {
    /* ranged dims: a tile past this run's rows leaves before its first
     * barrier, the whole block alike (as in cu_tc_batch_loop) */
    const char *past = cu_gemm_batch_past(f, &gm, z);
    cu_line(f, "if (%s >= %s || %s >= %s%s%s) continue;  // ranged dims: nothing of this run here", m0, cu_gemm_run_m(f, &gm),
            n0, cu_gemm_run_n(f, &gm), past ? " || " : "", past ? past : "");
  }
  const char *acc = cu_tmp(f);
  cu_line(f, "%s %s[%d][%d];", acct, acc, tl.RM, tl.RN);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++)", tl.RM);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int j = 0; j < %d; j++) %s[i][j] = 0;", tl.RN, acc);
  const char *k0 = cu_tmp(f);
  cu_open(f, "for (%s %s = 0; %s < %lld; %s += %d)", f->idx, k0, k0, (long long)gm.K, k0, tl.TK);
  load_tile(f, &gm, true, &tl, z, m0, k0, n0, acct);
  load_tile(f, &gm, false, &tl, z, m0, k0, n0, acct);
  cu_line(f, "__syncthreads();");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kk = 0; kk < %d; kk++)", tl.TK);
  cu_line(f, "%s a[%d], b[%d];", acct, tl.RM, tl.RN);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++) a[i] = As[kk][%s + i * %d];", tl.RM, ty, SR);
  /* Matmuls with an even N: a thread's columns come in adjacent pairs
   * (2 tx + j%%2 + (j/2) 2 SC), so the epilogue sees columns n and n + 1
   * together, as in the tensor-core kernels (a gated pair's halves need
   * both: merge-matmuls); otherwise tx + j SC. */
  bool pairs = an->op == OP_MATMUL && gm.N % 2 == 0 && tl.RN % 2 == 0;
  const char *bcol = pairs ? cu_fmt(f, "2 * %s + (j & 1) + (j >> 1) * %d", tx, 2 * SC) : cu_fmt(f, "%s + j * %d", tx, SC);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++) b[j] = Bs[kk][%s];", tl.RN, bcol);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++)", tl.RM);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int j = 0; j < %d; j++) %s[i][j] += a[i] * b[j];", tl.RN, acc);
  cu_close(f);
  cu_line(f, "__syncthreads();");
  cu_close(f);
  /* epilogue: each result through the fused elementwise ops, stored */
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", tl.RM);
  cu_line(f, "#pragma unroll");
  cu_open(f, pairs ? "for (int j = 0; j < %d; j += 2)" : "for (int j = 0; j < %d; j++)", tl.RN);
  const char *m = cu_tmp(f), *n = cu_tmp(f);
  cu_line(f, "const %s %s = %s + %s + i * %d, %s = %s + %s;", f->idx, m, m0, ty, SR, n, n0, bcol);
  if (ranged) cu_open(f, "if (%s < %s && %s < %s)", m, cu_gemm_run_m(f, &gm), n, cu_gemm_run_n(f, &gm));
  else cu_open(f, "if (%s < %lld && %s < %lld)", m, (long long)gm.M, n, (long long)gm.N);
  CuCoords co;
  CuVal val;
  gm.result(f, &gm, z, m, n, cu_fmt(f, "%s[i][j]", acc), &co, &val);
  const Value *av = &g->val[an->out[0]];
  const char *r = cu_tmp(f);
  cu_line(f, "const %s %s = %s;  // %s (%s)", cu_ctype(av->type.dt), r, val.l[0], av->name, ir_op_name(an->op));
  val.l[0] = r;
  if (pairs) {
    /* n is even and N too: column n + 1 exists; element accesses (no
     * alignment is known here), the pair handed over whole */
    const char *r1 = cu_tmp(f);
    cu_line(f, "const %s %s = %s;  // column n + 1", cu_ctype(av->type.dt), r1,
            cu_normalise(f, av->type.dt, cu_fmt(f, "%s[i][j + 1]", acc)));
    co.lanes = 2;
    co.step[co.rank - 1] = 1;
    co.aligned = false;
    co.whole_lanes = true;
    val.l[1] = r1;
  }
  cu_store_epilogue(f, epi, nepi, &co, &val);
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_close(f);
}

