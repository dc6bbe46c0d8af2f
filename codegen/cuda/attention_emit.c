/* cu_emit_attention: the attention kernel's variant (forced, tuned, else
 * the heuristic's: attention.c) and its emission: flash.c, flashdec.c, or
 * the simple kernel below, which computes every attention (a mask,
 * f32/f64, any head dim): attention.c's opening comment describes it.
 * The top of the attention files: nothing below calls into it.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_attention.h"
#include "codegen/cuda/cu_kernels.h"

#define CU_ATT_ROWS_PER_BLOCK 4

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
  if (a->causal)
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
              (long long)a.S, (long long)a.T, (long long)a.D, a.causal ? " causal" : "", a.mask ? " masked" : "");
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
