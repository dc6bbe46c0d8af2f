/* Contraction kernels: matmul (numpy semantics: batch broadcasting, 1-D
 * operands, transpose_a/b) and conv2d (NCHW/OIHW, strides, pads,
 * dilations, groups, bias) with their fused elementwise epilogue.
 *
 * Both are one shared-memory tiled GEMM, C[M,N] = A[M,K] B[K,N], over a
 * third grid dimension z:
 *   matmul   z = the broadcast batch, A and B the (transposed) operands;
 *   conv2d   z = the group, A[m,k] = w[g*Og + m, c, kh, kw] with
 *            k = (c, kh, kw), B[k,p] = x[n, g*Cg + c, ih, iw] with
 *            p = (n, oh, ow) (implicit GEMM: the im2col matrix is never
 *            built; padding reads as 0).
 * A block of 256 threads computes a TM x TN tile: per step of TK, it loads
 * an A and a B tile into shared memory (converted to the accumulation type:
 * float for f16/bf16/f32, double for f64, long long for integers), then
 * every thread accumulates its RM x RN outputs, spaced TM/RM rows and TN/RN
 * columns apart so that threads of a warp read neighbouring words.  A tile
 * element is computed with cu_emit, so whatever computes an operand inside
 * the group (a transpose, a cast) is fused into the load.
 *
 * This is the simple correct kernel ("simple"), for every dtype and
 * layout.  Faster variants take the matmuls they can; which one a kernel
 * gets is a forced token (smelt tune), else the tuning table's row for its
 * shape, else the heuristic: M <= 8 (decode) the bandwidth-bound GEMV
 * (gemv.c), f16/bf16 with K and N multiples of 8 the tensor-core kernel
 * (mma.c); wgmma.c (Hopper, sm_90a) is a candidate for the table.
 */
#include <string.h>

#include "codegen/cuda/cu_internal.h"

typedef struct {
  int TM, TN, TK, RM, RN;
} Tile;

typedef CuGemm Gemm;

/* ---- matmul ---- */

/* The batch coordinates of operand t (rank - 2 batch dims) for the result
 * batch index z: delinearised over the result's batch dims, broadcast. */
static void batch_coords(CuFn *f, const Gemm *gm, const char *z, const TensorType *t, CuCoords *out) {
  TensorType bt = {.dt = gm->yt->dt, .rank = gm->nbatch};
  for (int d = 0; d < gm->nbatch; d++) bt.dim[d] = gm->yt->dim[d];
  CuCoords zc;
  cu_delinearize(f, z, &bt, &zc);
  TensorType ob = {.dt = t->dt, .rank = t->rank - 2};
  for (int d = 0; d < ob.rank; d++) ob.dim[d] = t->dim[d];
  cu_bcast_coords(&ob, &zc, out);
  out->rank = t->rank;
}

static void mm_load_a(CuFn *f, const Gemm *gm, const char *z, const char *m, const char *k, CuVal *out) {
  CuCoords co;
  if (gm->a1) {
    cu_coords_scalar(&co, 1, &k);
  } else {
    batch_coords(f, gm, z, gm->at, &co);
    int r = gm->at->rank;
    co.c[r - 2] = gm->ta ? k : m;
    co.c[r - 1] = gm->ta ? m : k;
    co.step[r - 2] = co.step[r - 1] = 0;
  }
  cu_emit(f, gm->an->in[0], &co, out);
}

static void mm_load_b(CuFn *f, const Gemm *gm, const char *z, const char *k, const char *n, CuVal *out) {
  CuCoords co;
  if (gm->b1) {
    cu_coords_scalar(&co, 1, &k);
  } else {
    batch_coords(f, gm, z, gm->bt, &co);
    int r = gm->bt->rank;
    co.c[r - 2] = gm->tb ? n : k;
    co.c[r - 1] = gm->tb ? k : n;
    co.step[r - 2] = co.step[r - 1] = 0;
  }
  cu_emit(f, gm->an->in[1], &co, out);
}

static void mm_result(CuFn *f, const Gemm *gm, const char *z, const char *m, const char *n, const char *acc,
                      CuCoords *out_co, CuVal *out_val) {
  TensorType bt = {.dt = gm->yt->dt, .rank = gm->nbatch};
  for (int d = 0; d < gm->nbatch; d++) bt.dim[d] = gm->yt->dim[d];
  cu_delinearize(f, z, &bt, out_co);
  out_co->rank = gm->yt->rank;
  int d = gm->nbatch;
  if (!gm->a1) out_co->c[d++] = m;
  if (!gm->b1) out_co->c[d++] = n;
  for (int i = gm->nbatch; i < out_co->rank; i++) out_co->step[i] = 0;
  memset(out_val, 0, sizeof *out_val);
  out_val->l[0] = cu_normalise(f, gm->yt->dt, acc);
}

static void setup_matmul(const Graph *g, const Node *an, Gemm *gm) {
  gm->at = &g->val[an->in[0]].type;
  gm->bt = &g->val[an->in[1]].type;
  gm->yt = &g->val[an->out[0]].type;
  gm->ta = ir_attr_int(an, "transpose_a") != 0;
  gm->tb = ir_attr_int(an, "transpose_b") != 0;
  gm->a1 = gm->at->rank == 1;
  gm->b1 = gm->bt->rank == 1;
  int ra = gm->at->rank, rb = gm->bt->rank;
  gm->M = gm->a1 ? 1 : gm->at->dim[gm->ta ? ra - 1 : ra - 2];
  gm->K = gm->a1 ? gm->at->dim[0] : gm->at->dim[gm->ta ? ra - 2 : ra - 1];
  gm->N = gm->b1 ? 1 : gm->bt->dim[gm->tb ? rb - 2 : rb - 1];
  gm->nbatch = gm->yt->rank - (gm->a1 ? 0 : 1) - (gm->b1 ? 0 : 1);
  gm->Z = 1;
  for (int d = 0; d < gm->nbatch; d++) gm->Z *= gm->yt->dim[d];
  gm->a_m_fast = gm->ta;  /* A stored [.., K, M]: m is contiguous */
  gm->b_n_fast = !gm->tb; /* B stored [.., K, N]: n is contiguous */
  gm->load_a = mm_load_a;
  gm->load_b = mm_load_b;
  gm->result = mm_result;
}

/* ---- conv2d ---- */

static void cv_load_a(CuFn *f, const Gemm *gm, const char *z, const char *m, const char *k, CuVal *out) {
  const char *c[4];
  c[0] = cu_add(f, cu_mulk(f, z, gm->Og), m);
  TensorType kt = {.dt = gm->bt->dt, .rank = 3, .dim = {gm->Cg, gm->KH, gm->KW}};
  CuCoords kc;
  cu_delinearize(f, k, &kt, &kc);
  c[1] = kc.c[0], c[2] = kc.c[1], c[3] = kc.c[2];
  CuCoords co;
  cu_coords_scalar(&co, 4, c);
  cu_emit(f, gm->an->in[1], &co, out);
}

static void cv_load_b(CuFn *f, const Gemm *gm, const char *z, const char *k, const char *n, CuVal *out) {
  TensorType kt = {.dt = gm->at->dt, .rank = 3, .dim = {gm->Cg, gm->KH, gm->KW}};
  TensorType pt = {.dt = gm->at->dt, .rank = 3, .dim = {gm->yt->dim[0], gm->OH, gm->OW}};
  CuCoords kc, pc;
  cu_delinearize(f, k, &kt, &kc);
  cu_delinearize(f, n, &pt, &pc);
  const char *ih = cu_tmp(f), *iw = cu_tmp(f);
  cu_line(f, "const %s %s = %s;", f->idx, ih, cu_add(f, cu_addk(f, cu_mulk(f, pc.c[1], gm->sh), -gm->pt), cu_mulk(f, kc.c[1], gm->dh)));
  cu_line(f, "const %s %s = %s;", f->idx, iw, cu_add(f, cu_addk(f, cu_mulk(f, pc.c[2], gm->sw), -gm->pl), cu_mulk(f, kc.c[2], gm->dw)));
  DType dt = gm->at->dt;
  const char *r = cu_tmp(f);
  cu_line(f, "%s %s = %s;  // zero padding", cu_ctype(dt), r, cu_const(f, dt, 0));
  cu_open(f, "if (%s >= 0 && %s < %lld && %s >= 0 && %s < %lld)", ih, ih, (long long)gm->H, iw, iw, (long long)gm->W);
  const char *c[4] = {pc.c[0], cu_add(f, cu_mulk(f, z, gm->Cg), kc.c[0]), ih, iw};
  CuCoords co;
  cu_coords_scalar(&co, 4, c);
  CuVal x;
  cu_emit(f, gm->an->in[0], &co, &x);
  cu_line(f, "%s = %s;", r, x.l[0]);
  cu_close(f);
  memset(out, 0, sizeof *out);
  out->l[0] = r;
}

static void cv_result(CuFn *f, const Gemm *gm, const char *z, const char *m, const char *n, const char *acc,
                      CuCoords *out_co, CuVal *out_val) {
  TensorType pt = {.dt = gm->yt->dt, .rank = 3, .dim = {gm->yt->dim[0], gm->OH, gm->OW}};
  CuCoords pc;
  cu_delinearize(f, n, &pt, &pc);
  const char *o = cu_tmp(f);
  cu_line(f, "const %s %s = %s;", f->idx, o, cu_add(f, cu_mulk(f, z, gm->Og), m));
  const char *c[4] = {pc.c[0], o, pc.c[1], pc.c[2]};
  cu_coords_scalar(out_co, 4, c);
  memset(out_val, 0, sizeof *out_val);
  const char *v = acc;
  if (gm->an->nin > 2) {
    CuCoords bc;
    cu_coords_scalar(&bc, 1, &o);
    CuVal b;
    cu_emit(f, gm->an->in[2], &bc, &b);
    v = cu_fmt(f, "(%s + %s)", acc, b.l[0]);
  }
  out_val->l[0] = cu_normalise(f, gm->yt->dt, v);
}

static void setup_conv(const Graph *g, const Node *an, Gemm *gm) {
  gm->at = &g->val[an->in[0]].type; /* x */
  gm->bt = &g->val[an->in[1]].type; /* w */
  gm->yt = &g->val[an->out[0]].type;
  const Attr *st = ir_attr(an, "strides"), *pd = ir_attr(an, "pads"), *dl = ir_attr(an, "dilations");
  int64_t G = ir_attr_int(an, "groups");
  gm->C = gm->at->dim[1], gm->H = gm->at->dim[2], gm->W = gm->at->dim[3];
  gm->O = gm->bt->dim[0], gm->Cg = gm->bt->dim[1], gm->KH = gm->bt->dim[2], gm->KW = gm->bt->dim[3];
  gm->OH = gm->yt->dim[2], gm->OW = gm->yt->dim[3];
  gm->Og = gm->O / (G ? G : 1);
  gm->sh = st->ints[0], gm->sw = st->ints[1], gm->pt = pd->ints[0], gm->pl = pd->ints[1];
  gm->dh = dl->ints[0], gm->dw = dl->ints[1];
  gm->M = gm->Og;
  gm->N = gm->yt->dim[0] * gm->OH * gm->OW;
  gm->K = gm->Cg * gm->KH * gm->KW;
  gm->Z = G;
  gm->a_m_fast = false; /* w[o, c, kh, kw]: k is contiguous */
  gm->b_n_fast = true;  /* x[n, c, ih, iw]: neighbouring outputs read neighbouring iw */
  gm->load_a = cv_load_a;
  gm->load_b = cv_load_b;
  gm->result = cv_result;
}

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

void cu_gemm_setup(const CuFn *f, CuGemm *gm) {
  const Node *an = &f->g->node[f->anchor];
  memset(gm, 0, sizeof *gm);
  gm->an = an;
  if (an->op == OP_MATMUL) setup_matmul(f->g, an, gm);
  else setup_conv(f->g, an, gm);
}

/* Emits the kernel of variant token tok when it names a family that can
 * compute this contraction; false (nothing emitted) otherwise. */
static bool emit_token(CuFn *f, const Gemm *gm, const char *tok, const int *epi, int nepi, CuLaunch *l) {
  bool mm = gm->an->op == OP_MATMUL;
  CuGemvParams gp;
  CuMmaParams mp;
  CuWgmmaParams wp;
  CuTf32Params tp;
  if (mm && cu_gemv_parse(tok, &gp) && cu_gemv_eligible(f, gm)) {
    cu_emit_gemv(f, gm, &gp, epi, nepi, l);
    return true;
  }
  if (mm && cu_wgmma_parse(tok, &wp) && cu_hopper(f) && cu_wgmma_eligible(f, gm)) {
    cu_emit_wgmma(f, gm, &wp, epi, nepi, l);
    return true;
  }
  if (mm && cu_mma_parse(tok, &mp) && cu_mma_eligible(f, gm)) {
    cu_emit_mma(f, gm, &mp, epi, nepi, l);
    return true;
  }
  /* only with allow_tf32 (cu_tf32_eligible checks it): a table row naming
   * tf32 does not change an f32 matmul's numerics unasked */
  if (mm && cu_tf32_parse(tok, &tp) && cu_tf32_eligible(f, gm)) {
    cu_emit_tf32(f, gm, &tp, epi, nepi, l);
    return true;
  }
  return false;
}

/* The heuristic's token: M <= 8 (decode) is bound by reading B once: the
 * GEMV; on Hopper (sm_90a) f16/bf16 with K-major operands: wgmma + TMA
 * (686 TFLOP/s at 4096^3 on the H200 against 223 for mma.sync);
 * f16/bf16 with 16-byte rows: tensor cores through mma.sync; f32 when
 * the user allows TF32 (CgCudaOptions.allow_tf32) and the rows are 16
 * bytes: the TF32 tensor cores (tf32.c); else the simple kernel. */
static void heuristic(CuFn *f, const Gemm *gm, char out[CG_VARIANT_LEN]) {
  bool mm = gm->an->op == OP_MATMUL;
  if (mm && cu_gemv_eligible(f, gm)) {
    CuGemvParams p;
    cu_gemv_default_params(f, gm, &p);
    cu_gemv_format(&p, out);
  } else if (mm && cu_hopper(f) && cu_wgmma_eligible(f, gm)) {
    CuWgmmaParams p;
    cu_wgmma_default_params(gm, &p);
    cu_wgmma_format(&p, out);
  } else if (mm && cu_mma_eligible(f, gm)) {
    CuMmaParams p;
    cu_mma_default_params(gm, &p);
    cu_mma_format(&p, out);
  } else if (mm && cu_tf32_eligible(f, gm)) {
    CuTf32Params p;
    cu_tf32_default_params(gm, &p);
    cu_tf32_format(&p, out);
  } else {
    snprintf(out, CG_VARIANT_LEN, "simple");
  }
}

int cu_contraction_candidates(CuFn *f, char (*out)[CG_VARIANT_LEN], int max) {
  Gemm gm;
  cu_gemm_setup(f, &gm);
  char h[CG_VARIANT_LEN];
  heuristic(f, &gm, h);
  char all[64][CG_VARIANT_LEN];
  int n = 0;
  snprintf(all[n++], CG_VARIANT_LEN, "%s", h);
  bool mm = gm.an->op == OP_MATMUL;
  if (mm && cu_gemv_eligible(f, &gm)) n += cu_gemv_candidates(f, &gm, all + n, 64 - n);
  if (mm && cu_hopper(f) && cu_wgmma_eligible(f, &gm)) n += cu_wgmma_candidates(&gm, all + n, 64 - n);
  if (mm && cu_mma_eligible(f, &gm)) n += cu_mma_candidates(&gm, all + n, 64 - n);
  if (mm && cu_tf32_eligible(f, &gm)) n += cu_tf32_candidates(&gm, all + n, 64 - n);
  if (n < 64) snprintf(all[n++], CG_VARIANT_LEN, "simple");
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
  cu_open(f, "if (%s < %lld && %s < %lld)", m, (long long)gm.M, n, (long long)gm.N);
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

/* Operand t of a matmul has rank-2 batch dims, right-aligned against the
 * result's nbatch dims and broadcast where they are 1: the element offset
 * of batch z's matrix is a sum over the result's batch coordinates. */
const char *cu_gemm_batch_offset(CuFn *f, const CuGemm *gm, const char *z, const TensorType *t) {
  int nb = t->rank - 2;
  if (nb <= 0 || gm->Z <= 1) return "0LL";
  CuBuf b = {0};
  int64_t matrix = t->dim[t->rank - 2] * t->dim[t->rank - 1], stride = matrix, below = 1;
  /* innermost result batch dim first: coordinate = (z / below) % dim */
  for (int d = gm->nbatch - 1, od = nb - 1; d >= 0; d--, od--) {
    int64_t rd = gm->yt->dim[d];
    if (od >= 0 && t->dim[od] != 1 && rd > 1)
      cu_buf_printf(&b, "%s(((long long)%s / %lldLL) %% %lldLL) * %lldLL", b.len ? " + " : "", z, (long long)below,
                    (long long)rd, (long long)stride);
    if (od >= 0) stride *= t->dim[od];
    below *= rd;
  }
  const char *e = cu_fmt(f, "%s", b.len ? b.s : "0LL");
  cu_buf_free(&b);
  return e;
}
