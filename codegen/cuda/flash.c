/* The flash attention prefill kernel ("flash:bm=..,bn=..,w=..,st=..[,ks=..]"),
 * FlashAttention-2 style on mma.sync: attention.c's opening comment
 * describes the algorithm, the tiling and the key split; attention.c
 * checks the parameters and calls it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cu_attention.h"

/* ---- pieces of the kernel ---- */

/* Fills rows [row0, row0 + rows) x D of operand `v` (head `head`) into the
 * shared tile `dst` (row stride `stride` elements; rows >= nrows zero, or
 * rows >= nrun, this run's rows, when the operand's rows are ranged):
 * 16-byte chunks with cp.async when v is a kernel argument (global rows
 * start at `gbase`), else computed element by element with cu_emit. */
static void fill_tile(CuFn *f, const Att *a, int v, const char *gbase, const char *dst, const char *b, const char *head,
                      const char *row0, int64_t nrows, const char *nrun, int rows, int stride, int threads,
                      const char *aligned) {
  int D = (int)a->D, CD = D / 8, chunks = rows * CD;
  const char *lim = nrun ? nrun : cu_fmt(f, "%lldLL", (long long)nrows);
  if (gbase) {
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int it = 0; it < %d; it++)", cu_att_cdiv(chunks, threads) > 0 ? (int)cu_att_cdiv(chunks, threads) : 1);
    cu_line(f, "const int c = threadIdx.x + it * %d, r = c / %d, dc = (c %% %d) * 8;", threads, CD, CD);
    if (chunks % threads) cu_line(f, "if (c >= %d) break;", chunks);
    cu_line(f, "const long long gr = (long long)(%s) + r;", row0);
    cu_line(f, "const bool ok = gr < %s;", lim);
    cu_line(f, "const unsigned short *src = %s + (ok ? gr * %d + dc : 0LL);", gbase, D);
    cu_line(f, "unsigned short *dsts = %s + r * %d + dc;", dst, stride);
    cu_tc_cp_async16(f, "dsts", "src", "ok", aligned);
    cu_close(f);
    return;
  }
  const char *st = cu_stype(a->dt);
  cu_line(f, "// %s is computed in this kernel: element by element", f->g->val[v].name);
  cu_open(f, "for (int c = threadIdx.x; c < %d; c += %d)", chunks, threads);
  const char *r = cu_tmp(f), *dc = cu_tmp(f), *gr = cu_tmp(f);
  cu_line(f, "const int %s = c / %d, %s = (c %% %d) * 8;", r, CD, dc, CD);
  cu_line(f, "const %s %s = (%s)(%s) + %s;", f->idx, gr, f->idx, row0, r);
  cu_line(f, "%s *dsts = reinterpret_cast<%s *>(%s + %s * %d + %s);", st, st, dst, r, stride, dc);
  if (nrun) cu_open(f, "if (%s < %s)", gr, nrun);
  else cu_open(f, "if (%s < %lld)", gr, (long long)nrows);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < 8; e++)");
  const char *d = cu_tmp(f);
  cu_line(f, "const %s %s = %s + e;", f->idx, d, dc);
  const char *c[4] = {b, head, gr, d};
  CuCoords co;
  cu_coords_scalar(&co, 4, c);
  CuVal x;
  cu_emit(f, v, &co, &x);
  cu_line(f, "dsts[e] = %s;", cu_to_storage(f, a->dt, x.l[0]));
  cu_close(f);
  cu_close(f);
  cu_line(f, "else");
  cu_line(f, "  for (int e = 0; e < 8; e++) reinterpret_cast<unsigned short *>(dsts)[e] = 0;");
  cu_close(f);
}

/* ---- flash: the prefill kernel ---- */

void cu_att_emit_flash(CuFn *f, const Att *a, const FlashParams *p, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = a->an;
  bool bf16 = a->dt == DT_BF16;
  int D = (int)a->D, W = p->W, BM = p->BM, BN = p->BN, ST = p->stages, MI = p->BM / (16 * p->W), KS = p->KS;
  /* KS key groups of W warps: warp (kg, rw) takes rows rw and keys kg * BNW .. of every tile */
  int BNW = BN / KS, NW = W * KS;
  int QS = D + 8, threads = 32 * NW, KD = D / 16, NJ = BNW / 8, OJ = D / 8, PK = BNW / 16;
  int64_t B = a->B, H = a->H, S = a->S, T = a->T, G = a->G;
  int64_t NQB = cu_att_cdiv(S, BM), NT = cu_att_cdiv(T, BN), BH = B * H;
  int64_t smem_elems = cu_att_flash_smem(a, p) / 2;
  double sl2 = a->scale * CU_ATT_LOG2E;
  /* Q's A fragments stay in registers when they take at most 32 per lane;
   * else (two m16 tiles of a 128-wide head) they are read again per k step */
  bool qregs = MI * KD * 4 <= 32;

  l->kind = "attention";
  l->block[0] = (unsigned)threads;
  l->grid[0] = (unsigned)(NQB * BH);
  l->smem = (unsigned)(smem_elems * 2);
  int qv = an->in[0], kv = an->in[1], vv = an->in[2];
  bool qa = cu_att_is_arg_value(f, qv), ka = cu_att_is_arg_value(f, kv), va = cu_att_is_arg_value(f, vv);

  cu_line(f, "// variant: flash (FlashAttention-2: mma.sync.m16n8k16.row.col.f32.%s, ldmatrix, cp.async, online softmax)",
          bf16 ? "bf16.bf16" : "f16.f16");
  cu_line(f, "// %s = attention(%s, %s, %s): B %lld, H %lld, Hkv %lld, S %lld, T %lld, D %d%s", g->val[an->out[0]].name,
          g->val[qv].name, g->val[kv].name, g->val[vv].name, (long long)B, (long long)H, (long long)a->Hkv, (long long)S,
          (long long)T, D, a->cache ? ", over a cache (query i sees keys j <= pos[i])" : a->causal ? ", causal (query i sees keys j <= T - S + i)" : "");
  cu_line(f, "// parameters: %d query rows per block (%d warps of %d), %d keys per tile, %d stages", BM, W, 16 * MI, BN, ST);
  if (KS > 1)
    cu_line(f, "// key split: %d groups of %d warps, group kg takes keys kg * %d .. +%d of every tile; merged at the end", KS, W, BNW,
            BNW - 1);
  cu_tc_emu_helpers(f);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "extern __shared__ __align__(16) unsigned short smelt_fa_smem[];");
  cu_line(f, "#else");
  cu_line(f, "__align__(16) __shared__ unsigned short smelt_fa_smem[%lld];", (long long)smem_elems);
  cu_line(f, "// P fragments, exchanged between the lanes of a warp");
  cu_line(f, "static unsigned emu_pf[%d][32][%d];", NW, MI * PK * 4);
  cu_line(f, "#endif");
  cu_line(f, "unsigned short *const Qs = smelt_fa_smem;  // [%d][%d] (rows padded by 8)", BM, QS);
  cu_line(f, "unsigned short *const Ks = smelt_fa_smem + %d;  // [%d stages][%d][%d]", BM * QS, ST, BN, QS);
  cu_line(f, "unsigned short *const Vs = smelt_fa_smem + %d;  // [%d stages][%d][%d]", BM * QS + ST * BN * QS, ST, BN, QS);
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  if (KS > 1) cu_line(f, "const int rw = warp %% %d, kg = warp / %d;  // row warp, key group", W, W);
  else cu_line(f, "const int rw = warp;  // row warp");
  cu_line(f, "// f32 pair -> f16x2 / bf16x2 (round to nearest even), lo in the low half");
  cu_line(f, "auto pack2 = [](float lo, float hi) -> unsigned {");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "  unsigned r;");
  cu_line(f, "  asm(\"cvt.rn.%s.f32 %%0, %%1, %%2;\\n\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo));", bf16 ? "bf16x2" : "f16x2");
  cu_line(f, "  return r;");
  cu_line(f, "#else");
  cu_line(f, "  return (unsigned)%s(lo).x | (unsigned)%s(hi).x << 16;", bf16 ? "__float2bfloat16_rn" : "__float2half_rn",
          bf16 ? "__float2bfloat16_rn" : "__float2half_rn");
  cu_line(f, "#endif");
  cu_line(f, "};");
  cu_att_fexp2(f);
  bool longest_first = a->causal || a->cache;
  if (longest_first)
    cu_line(f, "// block -> (query block, b, h); %s: the longest query blocks first", a->cache ? "cache (positions rising)" : "causal");
  else
    cu_line(f, "// block -> (query block, b, h)");
  cu_line(f, "const long long qb = %s(long long)(blockIdx.x / %lldu), bh = blockIdx.x %% %lldu;", longest_first ? cu_fmt(f, "%lldLL - 1 - ", (long long)NQB) : "",
          (long long)BH, (long long)BH);
  const char *b = "b", *h = "h", *hk = "hk";
  cu_line(f, "const %s b = (%s)(bh / %lld), h = (%s)(bh %% %lld), hk = h / %lld;", f->idx, f->idx, (long long)H, f->idx,
          (long long)H, (long long)G);
  cu_line(f, "const long long m0 = qb * %d;", BM);
  /* Ranged dims: this run's query rows Sr and keys Tr (the literals S and
   * T when fixed).  A block of query rows wholly past Sr leaves before its
   * first barrier (all its threads alike: m0 is the block's); the others
   * load and see keys up to Tr only, zero beyond (the rows past a run's
   * keys hold whatever an earlier run left there, possibly not finite,
   * and a masked score still multiplies V), and store rows up to Sr.
   * Ranged keys come only with causal self-attention over the same rows
   * (codegen/ranges.c), so T - S is the same for every run. */
  const TensorType *qt = &g->val[an->in[0]].type, *kt = &g->val[an->in[1]].type;
  const char *Sr = cu_extent(f, qt, 2), *Tr = cu_extent(f, kt, 2);
  bool qranged = qt->dyn[2] != 0, kranged = kt->dyn[2] != 0;
  if (qranged) cu_line(f, "if (m0 >= %s) return;  // ranged dims: no row of this run in this block", Sr);
  if (qa)
    cu_line(f, "const unsigned short *Qg = reinterpret_cast<const unsigned short *>(a%d) + ((long long)b * %lld + h) * %lldLL;  // %s",
            f->arg_of[qv], (long long)H, (long long)(S * D), g->val[qv].name);
  if (ka)
    cu_line(f, "const unsigned short *Kg = reinterpret_cast<const unsigned short *>(a%d) + ((long long)b * %lld + hk) * %lldLL;  // %s",
            f->arg_of[kv], (long long)a->Hkv, (long long)(T * D), g->val[kv].name);
  if (va)
    cu_line(f, "const unsigned short *Vg = reinterpret_cast<const unsigned short *>(a%d) + ((long long)b * %lld + hk) * %lldLL;  // %s",
            f->arg_of[vv], (long long)a->Hkv, (long long)(T * D), g->val[vv].name);
  const char *aligned = "true";
  if ((qa || ka || va) && !(f->opt && f->opt->args_aligned)) {
    aligned = "aligned16";
    cu_line(f, "const bool aligned16 = true%s%s%s;", qa ? cu_fmt(f, " && smelt_aligned(a%d, 16)", f->arg_of[qv]) : "",
            ka ? cu_fmt(f, " && smelt_aligned(a%d, 16)", f->arg_of[kv]) : "",
            va ? cu_fmt(f, " && smelt_aligned(a%d, 16)", f->arg_of[vv]) : "");
  }
  if (a->cache) {
    cu_line(f, "// cache: row i sees keys 0 .. pos[i] (read now: a CUDA graph replays this with new positions); -1: no row");
    cu_line(f, "__shared__ int spos[%d];", BM);
    cu_open(f, "for (int r = threadIdx.x; r < %d; r += %d)", BM, threads);
    cu_line(f, "long long pr = -1;");
    /* ranged rows: those past this run hold stale positions; they get -1 */
    if (qranged) cu_open(f, "if (m0 + r < %s)", Sr);
    else cu_open(f, "if (m0 + r < %lldLL)", (long long)S);
    const char *ri = cu_tmp(f);
    cu_line(f, "const %s %s = (%s)(m0 + r);", f->idx, ri, f->idx);
    cu_line(f, "pr = %s;", cu_att_pos(f, a, ri));
    cu_line(f, "if (pr < 0) pr = -1;");
    cu_line(f, "if (pr > %lldLL) pr = %lldLL;", (long long)(T - 1), (long long)(T - 1));
    cu_close(f);
    cu_line(f, "spos[r] = (int)pr;");
    cu_close(f);
    cu_line(f, "__syncthreads();");
    cu_line(f, "int bmax = -1;  // the block's last key");
    cu_line(f, "for (int r = 0; r < %d; r++) bmax = spos[r] > bmax ? spos[r] : bmax;", BM);
    cu_line(f, "const int ntiles = (bmax + %d) / %d;  // the tiles up to it: the cost follows the positions, not the capacity", BN, BN);
  } else if (a->causal) {
    cu_line(f, "// causal: the block's last row sees keys up to T - S + that row");
    if (qranged)
      cu_line(f, "const long long last_row = m0 + %d < %s ? m0 + %d : %s - 1;", BM - 1, Sr, BM - 1, Sr);
    else
      cu_line(f, "const long long last_row = m0 + %d < %lldLL ? m0 + %d : %lldLL;", BM - 1, (long long)S, BM - 1, (long long)(S - 1));
    cu_line(f, "const int ntiles = (int)((%lldLL + last_row) / %d + 1 < %lldLL ? (%lldLL + last_row) / %d + 1 : %lldLL);",
            (long long)(T - S), BN, (long long)NT, (long long)(T - S), BN, (long long)NT);
  } else {
    cu_line(f, "const int ntiles = %lld;", (long long)NT);
  }

  /* the prologue: Q, then KV tiles 0 .. ST-2, one commit group each */
  cu_line(f, "// Q tile (rows m0 .. m0+%d), then KV tiles 0 .. %d in flight", BM - 1, ST - 2);
  cu_open(f, "%s", "");
  fill_tile(f, a, qv, qa ? "Qg" : NULL, "Qs", b, h, "m0", S, qranged ? Sr : NULL, BM, QS, threads, aligned);
  cu_close(f);
  cu_tc_commit_group(f);
  /* one tile of K and V into buffer `stage` */
#define FILL_KV(stage, tile)                                                                                                 \
  do {                                                                                                                       \
    cu_open(f, "%s", "");                                                                                                    \
    cu_line(f, "const long long n0 = (long long)(%s) * %d;", tile, BN);                                                     \
    cu_line(f, "unsigned short *ks = Ks + (%s) * %d, *vs = Vs + (%s) * %d;", stage, BN * QS, stage, BN * QS);              \
    fill_tile(f, a, kv, ka ? "Kg" : NULL, "ks", b, hk, "n0", T, kranged ? Tr : NULL, BN, QS, threads, aligned);            \
    fill_tile(f, a, vv, va ? "Vg" : NULL, "vs", b, hk, "n0", T, kranged ? Tr : NULL, BN, QS, threads, aligned);            \
    cu_close(f);                                                                                                             \
  } while (0)
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int s = 0; s < %d; s++)", ST - 1);
  cu_open(f, "if (s < ntiles)");
  FILL_KV("s", "s");
  cu_close(f);
  cu_tc_commit_group(f);
  cu_close(f);

  cu_line(f, "float o[%d][%d][4];  // O accumulators: m16n8 fragments of this warp's %d rows x %d", MI, OJ, 16 * MI, D);
  cu_line(f, "float mrow[%d][2], lrow[%d][2];  // per fragment row (g, g + 8): running max (unscaled), this lane's sum", MI, MI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "mrow[i][0] = mrow[i][1] = -SMELT_INF_F, lrow[i][0] = lrow[i][1] = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++) o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.0f;", OJ);
  cu_close(f);
  cu_line(f, "const int wr = rw * %d;  // this warp's first row in the block", 16 * MI);
  cu_line(f, "const long long r0 = m0 + wr;");
  if (a->cache) {
    cu_line(f, "int wmin = 0x7fffffff, wmax = -1;  // the first and last key limits of this warp's rows");
    cu_open(f, "for (int r = 0; r < %d; r++)", 16 * MI);
    cu_line(f, "const int pr = spos[wr + r];");
    cu_line(f, "wmin = pr < wmin ? pr : wmin, wmax = pr > wmax ? pr : wmax;");
    cu_close(f);
  }
  const char *pq = cu_fmt(f, "Qs + (wr + i * 16 + (lane & 15)) * %d + kd * 16 + (lane >> 4) * 8", QS);
  const char *kgo = KS > 1 ? cu_fmt(f, "kg * %d + ", BNW) : "";
  const char *pk = cu_fmt(f, "ks + (%sj * 8 + (lane & 7) + ((lane >> 4) << 3)) * %d + kd * 16 + ((lane >> 3) & 1) * 8", kgo, QS);
  const char *pv = cu_fmt(f, "vs + (%skk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * %d + j * 8 + (lane >> 4) * 8", kgo, QS);
  cu_tc_wait_group(f, ST - 1);
  cu_line(f, "__syncthreads();");
  if (qregs) {
    cu_line(f, "// the Q tile has landed (the oldest group): this warp's A fragments into registers");
    cu_line(f, "#ifdef __CUDA_ARCH__");
    cu_line(f, "unsigned qf[%d][%d][4];", MI, KD);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int i = 0; i < %d; i++)", MI);
    cu_line(f, "  #pragma unroll");
    cu_open(f, "  for (int kd = 0; kd < %d; kd++)", KD);
    cu_line(f, "const unsigned short *pq = %s;", pq);
    cu_tc_ldmatrix_x4(f, "qf[i][kd]", "pq", false);
    cu_close(f);
    cu_line(f, "#endif");
  } else {
    cu_line(f, "// the Q tile has landed (the oldest group); its fragments are read per k step (%d rows x %d would take %d registers)",
            16 * MI, D, MI * KD * 4);
  }

  cu_open(f, "for (int kt = 0; kt < ntiles; kt++)");
  cu_line(f, "// tile kt has landed (at most %d newer groups pending); everyone is done with tile kt-1", ST - 2);
  cu_tc_wait_group(f, ST - 2);
  cu_line(f, "__syncthreads();");
  cu_open(f, "%s", "");
  cu_line(f, "const int next = kt + %d;  // into the buffer tile kt-1 used", ST - 1);
  cu_open(f, "if (next < ntiles)");
  FILL_KV(cu_fmt(f, "(next %% %d)", ST), "next");
  cu_close(f);
  cu_tc_commit_group(f);
  cu_close(f);
#undef FILL_KV
  cu_line(f, "const unsigned short *ks = Ks + (kt %% %d) * %d, *vs = Vs + (kt %% %d) * %d;", ST, BN * QS, ST, BN * QS);
  if (KS > 1) cu_line(f, "const long long n0 = (long long)kt * %d + kg * %d;  // this warp's first key", BN, BNW);
  else cu_line(f, "const long long n0 = (long long)kt * %d;", BN);
  if (a->cache) {
    cu_line(f, "// cache: this warp's rows see no key of %s", KS > 1 ? "its part of this tile" : "this tile");
    cu_line(f, "if (n0 > wmax) continue;");
  } else if (a->causal) {
    cu_line(f, "// causal: this warp's rows see no key of %s", KS > 1 ? "its part of this tile" : "this tile");
    cu_line(f, "if (n0 > %lldLL + r0 + %d) continue;", (long long)(T - S), 16 * MI - 1);
  }

  cu_line(f, "// S = Q K^T: %d x %d scores of this warp, f32", 16 * MI, BNW);
  cu_line(f, "float s[%d][%d][4];", MI, NJ);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int j = 0; j < %d; j++) s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.0f;", NJ);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kd = 0; kd < %d; kd++)", KD);
  const char *qfrag = "qf[i][kd]";
  if (!qregs) {
    qfrag = "qk[i]";
    cu_line(f, "unsigned qk[%d][4];  // this k step's Q fragments", MI);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", MI);
    cu_line(f, "const unsigned short *pq = %s;", pq);
    cu_tc_ldmatrix_x4(f, "qk[i]", "pq", false);
    cu_close(f);
  }
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j += 2)", NJ);
  cu_line(f, "// K rows are keys: matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15)");
  cu_line(f, "unsigned r[4];");
  cu_line(f, "const unsigned short *pk = %s;", pk);
  cu_tc_ldmatrix_x4(f, "r", "pk", false);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_tc_mma_16816(f, bf16, "s[i][j]", qfrag, "r[0]", "r[1]");
  cu_tc_mma_16816(f, bf16, "s[i][j + 1]", qfrag, "r[2]", "r[3]");
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_line(f, "#else");
  cu_line(f, "for (int kd = 0; kd < %d; kd++)", KD);
  cu_line(f, "  for (int i = 0; i < %d; i++)", MI);
  cu_open(f, "    for (int j = 0; j < %d; j++)", NJ);
  cu_line(f, "auto a_of = [&](int l, unsigned x[4]) { emu_ldsm_x4(x, [&](int lane) { return %s; }, false, l); };", pq);
  cu_line(f, "auto b_of = [&](int l, unsigned y[2]) {");
  cu_line(f, "  unsigned r[4];");
  cu_line(f, "  const int j0 = j & ~1;");
  cu_line(f, "  emu_ldsm_x4(r, [&](int lane) { const int j = j0; return %s; }, false, l);", pk);
  cu_line(f, "  y[0] = r[(j & 1) * 2], y[1] = r[(j & 1) * 2 + 1];");
  cu_line(f, "};");
  cu_line(f, "emu_mma(s[i][j], a_of, b_of, %s);", bf16 ? "true" : "false");
  cu_close(f);
  cu_line(f, "#endif");

  /* masks: keys past T, and keys past the causal limit of each row */
  const char *edge = a->cache ? cu_fmt(f, "n0 + %d > %lldLL || n0 + %d > wmin", BNW, (long long)T, BNW - 1)
                     : a->causal ? cu_fmt(f, "n0 + %d > %lldLL || n0 + %d > %lldLL + r0", BNW, (long long)T, BNW - 1, (long long)(T - S))
                               : cu_fmt(f, "n0 + %d > %lldLL", BNW, (long long)T);
  bool any_edge = a->causal || a->cache || T % BNW != 0;
  if (any_edge) {
    cu_line(f, "// the tile crosses %s: mask", a->cache ? "the end of the keys or a row's position" : a->causal ? "the end of the keys or the causal diagonal" : "the end of the keys");
    cu_open(f, "if (%s)", edge);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int i = 0; i < %d; i++)", MI);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int j = 0; j < %d; j++)", NJ);
    cu_line(f, "    #pragma unroll");
    cu_open(f, "    for (int e = 0; e < 4; e++)");
    cu_line(f, "const long long key = n0 + j * 8 + (lane & 3) * 2 + (e & 1);");
    if (a->cache) {
      cu_line(f, "const int lim = spos[wr + i * 16 + (lane >> 2) + (e >> 1) * 8];");
      cu_line(f, "if (key >= %lldLL || key > lim) s[i][j][e] = -SMELT_INF_F;", (long long)T);
    } else if (a->causal) {
      cu_line(f, "const long long row = r0 + i * 16 + (lane >> 2) + (e >> 1) * 8;");
      cu_line(f, "if (key >= %lldLL || key > %lldLL + row) s[i][j][e] = -SMELT_INF_F;", (long long)T, (long long)(T - S));
    } else {
      cu_line(f, "if (key >= %lldLL) s[i][j][e] = -SMELT_INF_F;", (long long)T);
    }
    cu_close(f);
    cu_close(f);
  }

  cu_line(f, "// online softmax per fragment row: the row's 4 lanes (a quad) share its maximum");
  cu_line(f, "unsigned pf[%d][%d][4];  // P as the A fragments of P V", MI, PK);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int hr = 0; hr < 2; hr++)");
  cu_line(f, "float mx = mrow[i][hr];");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++) mx = fmaxf(mx, fmaxf(s[i][j][2 * hr], s[i][j][2 * hr + 1]));", NJ);
  cu_line(f, "mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));");
  cu_line(f, "mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));");
  cu_line(f, "// exp2 of scaled scores; a row that has seen no key yet keeps 0 (no inf - inf)");
  cu_line(f, "const float base = mx == -SMELT_INF_F ? 0.0f : mx * %s;", cu_const(f, DT_F32, sl2));
  cu_line(f, "const float corr = fexp2(mrow[i][hr] * %s - base);", cu_const(f, DT_F32, sl2));
  cu_line(f, "mrow[i][hr] = mx;");
  cu_line(f, "float sum = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", NJ);
  cu_line(f, "s[i][j][2 * hr] = fexp2(s[i][j][2 * hr] * %s - base);", cu_const(f, DT_F32, sl2));
  cu_line(f, "s[i][j][2 * hr + 1] = fexp2(s[i][j][2 * hr + 1] * %s - base);", cu_const(f, DT_F32, sl2));
  cu_line(f, "sum += s[i][j][2 * hr] + s[i][j][2 * hr + 1];");
  cu_close(f);
  cu_line(f, "lrow[i][hr] = lrow[i][hr] * corr + sum;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++) o[i][j][2 * hr] *= corr, o[i][j][2 * hr + 1] *= corr;", OJ);
  cu_close(f);
  cu_line(f, "// accumulator tiles 2kk, 2kk+1 (keys 16kk ..) are the m16k16 A fragment kk");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kk = 0; kk < %d; kk++)", PK);
  cu_line(f, "pf[i][kk][0] = pack2(s[i][2 * kk][0], s[i][2 * kk][1]);");
  cu_line(f, "pf[i][kk][1] = pack2(s[i][2 * kk][2], s[i][2 * kk][3]);");
  cu_line(f, "pf[i][kk][2] = pack2(s[i][2 * kk + 1][0], s[i][2 * kk + 1][1]);");
  cu_line(f, "pf[i][kk][3] = pack2(s[i][2 * kk + 1][2], s[i][2 * kk + 1][3]);");
  cu_close(f);
  cu_close(f);

  cu_line(f, "// O += P V (V rows are keys: ldmatrix.trans gives the B fragments)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kk = 0; kk < %d; kk++)", PK);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j += 2)", OJ);
  cu_line(f, "unsigned r[4];");
  cu_line(f, "const unsigned short *pv = %s;", pv);
  cu_tc_ldmatrix_x4(f, "r", "pv", true);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_tc_mma_16816(f, bf16, "o[i][j]", "pf[i][kk]", "r[0]", "r[1]");
  cu_tc_mma_16816(f, bf16, "o[i][j + 1]", "pf[i][kk]", "r[2]", "r[3]");
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_line(f, "#else");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "  for (int kk = 0; kk < %d; kk++)", PK);
  cu_line(f, "    for (int q = 0; q < 4; q++) emu_pf[warp][lane][(i * %d + kk) * 4 + q] = pf[i][kk][q];", PK);
  cu_line(f, "smelt_emu_warp_sync();");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "  for (int kk = 0; kk < %d; kk++)", PK);
  cu_open(f, "    for (int j = 0; j < %d; j++)", OJ);
  cu_line(f, "auto a_of = [&](int l, unsigned x[4]) { for (int q = 0; q < 4; q++) x[q] = emu_pf[warp][l][(i * %d + kk) * 4 + q]; };",
          PK);
  cu_line(f, "auto b_of = [&](int l, unsigned y[2]) {");
  cu_line(f, "  unsigned r[4];");
  cu_line(f, "  const int j0 = j & ~1;");
  cu_line(f, "  emu_ldsm_x4(r, [&](int lane) { const int j = j0; return %s; }, true, l);", pv);
  cu_line(f, "  y[0] = r[(j & 1) * 2], y[1] = r[(j & 1) * 2 + 1];");
  cu_line(f, "};");
  cu_line(f, "emu_mma(o[i][j], a_of, b_of, %s);", bf16 ? "true" : "false");
  cu_close(f);
  cu_line(f, "smelt_emu_warp_sync();  // the exchange array is rewritten by the next tile");
  cu_line(f, "#endif");
  cu_close(f); /* kt */
  cu_tc_wait_group(f, 0);

  if (KS > 1) {
    /* per lane, fragment by fragment: the lanes of warps (kg, rw) hold the
     * same rows and columns for every kg, so the merge needs no exchange
     * within a warp; [..][lane] keeps the accesses free of bank conflicts */
    int FR = MI * (OJ * 4 + 4);
    cu_line(f, "// key split: groups 1 .. %d leave their (o, m, l) in shared memory (no tile is read any more);", KS - 1);
    cu_line(f, "// group 0 merges them into its own, as two online-softmax states are merged");
    cu_line(f, "__syncthreads();");
    cu_line(f, "float *const mg = reinterpret_cast<float *>(smelt_fa_smem);  // [group - 1][row warp][%d values][32 lanes]", FR);
    cu_open(f, "if (kg > 0)");
    cu_line(f, "float *const dst = mg + ((kg - 1) * %d + rw) * %d + lane;", W, FR * 32);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", MI);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int j = 0; j < %d; j++)", OJ);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int e = 0; e < 4; e++) dst[((i * %d + j) * 4 + e) * 32] = o[i][j][e];", OJ);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int hr = 0; hr < 2; hr++)");
    cu_line(f, "  dst[(%d + i * 4 + hr) * 32] = mrow[i][hr], dst[(%d + i * 4 + 2 + hr) * 32] = lrow[i][hr];", MI * OJ * 4,
            MI * OJ * 4);
    cu_close(f);
    cu_close(f);
    cu_line(f, "__syncthreads();");
    cu_line(f, "if (kg > 0) return;");
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int g = 1; g < %d; g++)", KS);
    cu_line(f, "const float *const src = mg + ((g - 1) * %d + rw) * %d + lane;", W, FR * 32);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", MI);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int hr = 0; hr < 2; hr++)");
    cu_line(f, "const float mo = src[(%d + i * 4 + hr) * 32], lo = src[(%d + i * 4 + 2 + hr) * 32];", MI * OJ * 4, MI * OJ * 4);
    cu_line(f, "const float mx = fmaxf(mrow[i][hr], mo);");
    cu_line(f, "// weights in log2 units; a state that has seen no key weighs 0");
    cu_line(f, "const float fa = mrow[i][hr] == -SMELT_INF_F ? 0.0f : fexp2((mrow[i][hr] - mx) * %s);", cu_const(f, DT_F32, sl2));
    cu_line(f, "const float fo = mo == -SMELT_INF_F ? 0.0f : fexp2((mo - mx) * %s);", cu_const(f, DT_F32, sl2));
    cu_line(f, "mrow[i][hr] = mx;");
    cu_line(f, "lrow[i][hr] = lrow[i][hr] * fa + lo * fo;");
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int j = 0; j < %d; j++)", OJ);
    cu_line(f, "o[i][j][2 * hr] = o[i][j][2 * hr] * fa + src[((i * %d + j) * 4 + 2 * hr) * 32] * fo;", OJ);
    cu_line(f, "o[i][j][2 * hr + 1] = o[i][j][2 * hr + 1] * fa + src[((i * %d + j) * 4 + 2 * hr + 1) * 32] * fo;", OJ);
    cu_close(f);
    cu_close(f);
    cu_close(f);
    cu_close(f);
  }

  cu_line(f, "// O / l through the epilogue: fragment element e of tile (i, j) is row g (+8 for e >= 2), column 2t (+1 for odd e)");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "float inv[2];");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int hr = 0; hr < 2; hr++)");
  cu_line(f, "float sum = lrow[i][hr];");
  cu_line(f, "sum += __shfl_xor_sync(0xffffffffu, sum, 1);");
  cu_line(f, "sum += __shfl_xor_sync(0xffffffffu, sum, 2);");
  cu_line(f, "inv[hr] = sum > 0.0f ? 1.0f / sum : 0.0f;");
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", OJ);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < 4; e++)");
  const char *row = cu_tmp(f), *d = cu_tmp(f);
  cu_line(f, "const %s %s = (%s)(r0 + i * 16 + (lane >> 2) + (e >> 1) * 8);", f->idx, row, f->idx);
  cu_line(f, "const %s %s = j * 8 + (lane & 3) * 2 + (e & 1);", f->idx, d);
  if (qranged) cu_open(f, "if (%s < %s)", row, Sr); /* tails masked */
  else cu_open(f, "if (%s < %lld)", row, (long long)S);
  CuVal y = {{0}};
  y.l[0] = cu_tmp(f);
  cu_line(f, "const float %s = o[i][j][e] * inv[e >> 1];  // %s (attention)", y.l[0], g->val[an->out[0]].name);
  const char *c[4] = {b, h, row, d};
  CuCoords co;
  cu_coords_scalar(&co, 4, c);
  cu_store_epilogue(f, epi, nepi, &co, &y);
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_close(f);
}

