/* The attention kernels as the rest of the backend sees them (cu_kernels.h):
 * cu_attention_candidates, the variants the tuner may try, and
 * cu_emit_attention, the kernel's variant (forced, tuned, else the
 * heuristic's: attention.c) and its emission: flash.c, flashdec.c, or the
 * simple kernel below, which computes every attention (a mask,
 * f32/f64, any head dim): attention.c's opening comment describes it.
 * The top of the attention files: nothing below calls into it.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_attention.h"
#include "codegen/cuda/cu_kernels.h"

#define CU_ATT_ROWS_PER_BLOCK 4

/* ---- the tuner's candidates ---- */

int cu_attention_candidates(CuFn *f, char (*out)[CG_VARIANT_LEN], int max) {
  Att a;
  cu_att_shape(f, &a);
  AttVariant all[64];
  int n = 0;
  cu_att_heuristic(f, &a, &all[n++]);
  const char *why;
  int64_t R, nrc;
  int rb;
  cu_att_dec_rows(&a, &R, &nrc, &rb);
  if (cu_att_flash_eligible(&a, &why) && a.S < 16) {
    /* a few query rows: one 64-row tile, for comparison with flashdec */
    all[n++] = (AttVariant){ATT_FLASH, {64, 64, 4, 2, 1}, {0}};
  } else if (cu_att_flash_eligible(&a, &why)) {
    /* the tiles that came within ~15% of the best on the H200 (W3 and W4
     * prefill), double buffered, and one triple-buffered; 32 rows of a head
     * above 64 wide with more than 64 keys per tile do not fit in registers
     * (O and the scores alone take 256; with a key split, 64 keys per warp
     * spill too) */
    static const FlashParams fps[] = {{128, 32, 4, 2, 1}, {128, 32, 4, 3, 1}, {128, 64, 4, 2, 1}, {128, 64, 8, 2, 1},
                                      {128, 128, 8, 2, 1}, {64, 32, 4, 2, 1},  {64, 64, 4, 2, 1},  {64, 128, 4, 2, 1},
                                      {64, 32, 2, 2, 1},
                                      /* key splits: more warps on the same rows (the longest causal blocks
                                       * finish sooner), 8 warps at most */
                                      {64, 128, 4, 2, 2},  {64, 64, 4, 2, 2},  {64, 128, 4, 3, 2},  {64, 128, 2, 2, 4},
                                      {32, 128, 2, 2, 4},  {128, 64, 4, 2, 2}, {128, 128, 4, 2, 2}};
    for (size_t i = 0; i < sizeof fps / sizeof *fps; i++) {
      bool two = fps[i].BM == 32 * fps[i].W;
      if (two && a.D > 64 && (fps[i].BN > 64 || fps[i].BN / fps[i].KS > 32)) continue;
      all[n++] = (AttVariant){ATT_FLASH, fps[i], {0}};
    }
  }
  /* flashdec reads K and V once per row chunk: only for a few rows */
  if (cu_att_dec_eligible(&a, &why) && R <= 4 * CU_ATT_DEC_MAX_ROWS) {
    /* around the default: half, twice and four times the splits (2 to 16
     * blocks per SM of W3 decode); per split 4 and 8 warps, 1, 2 and 4 keys
     * per group and step, loads one and two steps ahead */
    DecParams d;
    cu_att_dec_default(&a, &d);
    int gpw = 32 / (int)(a.D / 8);
    /* {warps, keys per group and step, pf, tr} */
    static const int wup[][4] = {{4, 2, 1, 1}, {4, 2, 2, 1}, {4, 1, 2, 1}, {4, 4, 1, 1}, {8, 2, 1, 1}, {8, 1, 2, 1}, {8, 2, 2, 1}};
    int splits[] = {d.split, d.split / 2, d.split * 2, d.split * 4}, tr = a.D >= 16;
    for (int i = 0; i < 4; i++)
      for (size_t k = 0; k < sizeof wup / sizeof *wup && n < 58; k++) {
        /* more than two rows: 4 warps only with 2 keys one step ahead (the
         * others spill with 8 rows' accumulators at sm_90's register split) */
        if (rb > 2 && wup[k][0] == 4 && (wup[k][1] != 2 || wup[k][2] != 1)) continue;
        if (splits[i] >= 1)
          all[n++] = (AttVariant){ATT_FLASHDEC, {0}, {splits[i], wup[k][1] * wup[k][0] * gpw, wup[k][0], wup[k][2], wup[k][3] && tr}};
      }
    /* the default and the old best of W3 decode with a shuffle chain per score;
     * without the prefetch */
    all[n++] = (AttVariant){ATT_FLASHDEC, {0}, {d.split, d.BN, d.W, d.pf, 0}};
    all[n++] = (AttVariant){ATT_FLASHDEC, {0}, {d.split, 2 * 4 * gpw, 4, 1, 0}};
    all[n++] = (AttVariant){ATT_FLASHDEC, {0}, {d.split, 2 * 8 * gpw, 8, 0, 0}};
    all[n++] = (AttVariant){ATT_FLASHDEC, {0}, {d.split, 2 * 4 * gpw, 4, 0, 0}};
  }
  all[n++] = (AttVariant){ATT_SIMPLE, {0}, {0}};
  int got = 0;
  for (int i = 0; i < n && got < max; i++) {
    if (!cu_att_variant_valid(f, &a, &all[i], &why)) continue;
    char tok[CG_VARIANT_LEN];
    cu_att_format_variant(&all[i], tok);
    bool dup = false;
    for (int j = 0; j < got && !dup; j++) dup = strcmp(out[j], tok) == 0;
    if (!dup) memcpy(out[got++], tok, CG_VARIANT_LEN);
  }
  return got;
}

/* ---- the simple kernel ---- */

static void emit_simple(CuFn *f, const Att *a, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = a->an;
  int64_t B = a->B, H = a->H, S = a->S, D = a->D, T = a->T, Dv = a->Dv, group = a->G;
  DType dt = a->dt;
  const char *ct = cu_ctype(dt);
  const char *sfx = dt == DT_F64 ? "" : "f";
  int DQ = (int)((D + 31) / 32), DV = (int)((Dv + 31) / 32);

  int64_t rows = B * H * S;
  l->kind = "attention";
  l->block[0] = 32 * CU_ATT_ROWS_PER_BLOCK;
  int64_t blocks = (rows + CU_ATT_ROWS_PER_BLOCK - 1) / CU_ATT_ROWS_PER_BLOCK;
  if (blocks > 0x7fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "%lld query rows exceed the grid", (long long)rows);
    return;
  }
  l->grid[0] = (unsigned)(blocks < 1 ? 1 : blocks);
  if (rows == 0) return;
  cu_line(f, "// variant: simple (one warp per query row, online softmax)");

  const char *lane = cu_tmp(f), *row = cu_tmp(f);
  cu_line(f, "const int %s = threadIdx.x %% 32;", lane);
  cu_line(f, "const %s %s = (%s)blockIdx.x * %d + threadIdx.x / 32;", f->idx, row, f->idx, CU_ATT_ROWS_PER_BLOCK);
  /* ranged dims: a warp whose query row lies past this run's leaves it
   * alone (its keys, if ranged, follow the rows: causal, codegen/ranges.c) */
  const TensorType *qt = &g->val[an->in[0]].type;
  if (qt->dyn[2])
    cu_open(f, "if (%s < %lld && %s %% %lld < %s)", row, (long long)rows, row, (long long)S, cu_extent(f, qt, 2));
  else
    cu_open(f, "if (%s < %lld)", row, (long long)rows);
  TensorType rt = {.dt = dt, .rank = 3, .dim = {B, H, S}};
  CuCoords rc;
  cu_delinearize(f, row, &rt, &rc);
  const char *b = rc.c[0], *h = rc.c[1], *i = rc.c[2];
  const char *hk = cu_tmp(f);
  cu_line(f, "const %s %s = %s;  // grouped-query: %lld query heads per kv head", f->idx, hk,
          group == 1 ? h : cu_fmt(f, "%s / %lld", h, (long long)group), (long long)group);

  /* this lane's query features, scaled */
  cu_line(f, "%s q[%d];", ct, DQ);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int dd = 0; dd < %d; dd++)", DQ);
  const char *d = cu_tmp(f);
  cu_line(f, "const %s %s = %s + dd * 32;", f->idx, d, lane);
  cu_line(f, "q[dd] = 0;");
  cu_open(f, "if (%s < %lld)", d, (long long)D);
  {
    const char *c[4] = {b, h, i, d};
    CuCoords co;
    cu_coords_scalar(&co, 4, c);
    CuVal x;
    cu_emit(f, an->in[0], &co, &x);
    cu_line(f, "q[dd] = %s * %s;", x.l[0], cu_const(f, dt, a->scale));
  }
  cu_close(f);
  cu_close(f);

  cu_line(f, "%s acc[%d];", ct, DV);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int dd = 0; dd < %d; dd++) acc[dd] = 0;", DV);
  const char *m = cu_tmp(f), *sum = cu_tmp(f), *jend = cu_tmp(f);
  cu_line(f, "%s %s = %s, %s = 0;  // running maximum and sum of exp(s - m)", ct, m, cu_const(f, dt, -INFINITY), sum);
  if (a->cache) {
    const char *pi = cu_tmp(f);
    cu_line(f, "const long long %s = %s;  // this query's position: it sees cache slots 0 .. %s", pi, cu_att_pos(f, a, i), pi);
    cu_line(f, "const %s %s = (%s)(%s < 0 ? 0LL : %s < %lldLL ? %s + 1 : %lldLL);", f->idx, jend, f->idx, pi, pi, (long long)T, pi,
            (long long)T);
  } else if (a->causal)
    cu_line(f, "const %s %s = %s + %lld < %lld ? %s + %lld : %lld;  // causal: keys j <= T - S + i", f->idx, jend, i,
            (long long)(T - S + 1), (long long)T, i, (long long)(T - S + 1), (long long)T);
  else
    cu_line(f, "const %s %s = %lld;", f->idx, jend, (long long)T);
  const char *j = cu_tmp(f);
  cu_open(f, "for (%s %s = 0; %s < %s; %s++)", f->idx, j, j, jend, j);
  const char *s = cu_tmp(f);
  cu_line(f, "%s %s = 0;", ct, s);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int dd = 0; dd < %d; dd++)", DQ);
  d = cu_tmp(f);
  cu_line(f, "const %s %s = %s + dd * 32;", f->idx, d, lane);
  cu_open(f, "if (%s < %lld)", d, (long long)D);
  {
    const char *c[4] = {b, hk, j, d};
    CuCoords co;
    cu_coords_scalar(&co, 4, c);
    CuVal x;
    cu_emit(f, an->in[1], &co, &x);
    cu_line(f, "%s += q[dd] * %s;", s, x.l[0]);
  }
  cu_close(f);
  cu_close(f);
  cu_line(f, "%s = smelt_warp_reduce(%s, smelt_sum_op());", s, s);
  if (a->mask) {
    const TensorType *mt = &g->val[an->in[3]].type;
    const char *c4[4] = {b, h, i, j};
    CuCoords full, co;
    cu_coords_scalar(&full, 4, c4);
    cu_bcast_coords(mt, &full, &co);
    CuVal mk;
    cu_emit(f, an->in[3], &co, &mk);
    if (mt->dt == DT_BOOL) cu_line(f, "if (!%s) %s = %s;  // may not attend", mk.l[0], s, cu_const(f, dt, -INFINITY));
    else cu_line(f, "%s += %s;", s, mk.l[0]);
  }
  cu_line(f, "if (%s == %s) continue;  // masked out", s, cu_const(f, dt, -INFINITY));
  const char *mn = cu_tmp(f), *corr = cu_tmp(f), *p = cu_tmp(f);
  cu_line(f, "const %s %s = %s > %s ? %s : %s;", ct, mn, s, m, s, m);
  cu_line(f, "const %s %s = exp%s(%s - %s), %s = exp%s(%s - %s);", ct, corr, sfx, m, mn, p, sfx, s, mn);
  cu_line(f, "%s = %s * %s + %s;", sum, sum, corr, p);
  cu_line(f, "%s = %s;", m, mn);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int dd = 0; dd < %d; dd++)", DV);
  d = cu_tmp(f);
  cu_line(f, "const %s %s = %s + dd * 32;", f->idx, d, lane);
  cu_open(f, "if (%s < %lld)", d, (long long)Dv);
  {
    const char *c[4] = {b, hk, j, d};
    CuCoords co;
    cu_coords_scalar(&co, 4, c);
    CuVal x;
    cu_emit(f, an->in[2], &co, &x);
    cu_line(f, "acc[dd] = acc[dd] * %s + %s * %s;", corr, p, x.l[0]);
  }
  cu_close(f);
  cu_close(f);
  cu_close(f);

  /* results and the epilogue */
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int dd = 0; dd < %d; dd++)", DV);
  d = cu_tmp(f);
  cu_line(f, "const %s %s = %s + dd * 32;", f->idx, d, lane);
  cu_open(f, "if (%s < %lld)", d, (long long)Dv);
  {
    const Value *av = &g->val[an->out[0]];
    CuVal y = {{0}};
    y.l[0] = cu_tmp(f);
    cu_line(f, "const %s %s = %s > 0 ? acc[dd] / %s : %s;  // %s (attention); no visible key: 0", ct, y.l[0], sum, sum,
            cu_const(f, dt, 0), av->name);
    const char *c[4] = {b, h, i, d};
    CuCoords co;
    cu_coords_scalar(&co, 4, c);
    cu_store_epilogue(f, epi, nepi, &co, &y);
  }
  cu_close(f);
  cu_close(f);
  cu_close(f);
}

/* ---- entry ---- */

void cu_emit_attention(CuFn *f, CuLaunch *l) {
  Att a;
  cu_att_shape(f, &a);
  int *epi, nepi, *side, nside;
  cu_split_outputs(f, &epi, &nepi, &side, &nside);
  if (nside) cu_store_loops(f, side, nside);

  /* the variant: forced, else the tuning table's, else the heuristic's */
  AttVariant v;
  bool from_table = false;
  const char *tok = cu_pick_variant(f, &from_table);
  const char *why = "";
  if (tok) {
    bool ok = cu_att_parse_variant(tok, &v);
    if (!ok) why = "is not an attention variant (flash:bm=..,bn=..,w=..,st=..[,ks=..], flashdec:split=..,bn=..,w=..[,pf=..][,tr=..], simple)";
    else ok = cu_att_variant_valid(f, &a, &v, &why);
    if (!ok && !from_table) {
      cu_fail(f, ST_INVALID_INPUT, "variant '%s' %s for attention '%s' (%s B %lld H %lld Hkv %lld S %lld T %lld D %lld%s%s)",
              tok, why, f->g->val[a.an->out[0]].name, dt_name(a.dt), (long long)a.B, (long long)a.H, (long long)a.Hkv,
              (long long)a.S, (long long)a.T, (long long)a.D, a.cache ? " cache" : a.causal ? " causal" : "", a.mask ? " masked" : "");
      return;
    }
    if (!ok) {
      cu_log(f, "%s: tuned variant '%s' %s; using the heuristic", f->k->name, tok, why);
      cu_att_heuristic(f, &a, &v);
    }
  } else {
    cu_att_heuristic(f, &a, &v);
    char h[CG_VARIANT_LEN];
    cu_att_format_variant(&v, h);
    cu_note_heuristic(f, h);
  }
  cu_att_format_variant(&v, l->variant);
  switch (v.fam) {
  case ATT_FLASH: cu_att_emit_flash(f, &a, &v.fp, epi, nepi, l); break;
  case ATT_FLASHDEC: cu_att_emit_flashdec(f, &a, &v.dp, epi, nepi, l); break;
  default: emit_simple(f, &a, epi, nepi, l); break;
  }
}
