/* Attention: y = softmax(scale * q k^T + mask) v over [B,H,S,D] queries and
 * [B,Hkv,T,D] keys/values (grouped-query: query head h reads kv head
 * h / (H / Hkv)), causal with the last query aligned to the last key
 * (query i sees keys j <= T - S + i), with an optional mask broadcast to
 * [B,H,S,T] (bool: may attend; otherwise added to the scores).
 *
 * One warp per query row (b, h, i), four rows per block.  Lane l holds the
 * query features l, l+32, ... (scaled) and the output features l, l+32, ...
 * The keys are visited once with the online softmax: for key j the warp
 * computes the score (partial dot products, then a shuffle reduction),
 * raises the running maximum m if needed, rescales the running sum l and
 * the accumulator by exp(m_old - m_new), and adds exp(s - m) v_j.  A key
 * masked out (score -inf) is skipped; a row with no visible key yields 0,
 * like the reference.  Accumulation is in float (double for f64).
 *
 * This is the simple correct kernel; a tiled tensor-core version (several
 * queries per block, K/V tiles in shared memory) replaces it behind the
 * same entry point.
 */
#include <math.h>
#include <string.h>

#include "codegen/cuda/cu_internal.h"

#define CU_ATT_ROWS_PER_BLOCK 4

void cu_emit_attention(CuFn *f, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = &g->node[f->anchor];
  const TensorType *qt = &g->val[an->in[0]].type, *kt = &g->val[an->in[1]].type, *vt = &g->val[an->in[2]].type;
  int64_t B = qt->dim[0], H = qt->dim[1], S = qt->dim[2], D = qt->dim[3];
  int64_t Hkv = kt->dim[1], T = kt->dim[2], Dv = vt->dim[3];
  int64_t group = Hkv ? H / Hkv : 1;
  const Attr *sa = ir_attr(an, "scale");
  double scale = sa ? sa->f : 1.0 / sqrt((double)D);
  bool causal = ir_attr_int(an, "causal") != 0;
  bool has_mask = an->nin > 3;
  DType dt = qt->dt;
  const char *ct = cu_ctype(dt);
  const char *sfx = dt == DT_F64 ? "" : "f";
  int DQ = (int)((D + 31) / 32), DV = (int)((Dv + 31) / 32);

  int *epi, nepi, *side, nside;
  cu_split_outputs(f, &epi, &nepi, &side, &nside);
  if (nside) cu_store_loops(f, side, nside);

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
    cu_line(f, "q[dd] = %s * %s;", x.l[0], cu_const(f, dt, scale));
  }
  cu_close(f);
  cu_close(f);

  cu_line(f, "%s acc[%d];", ct, DV);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int dd = 0; dd < %d; dd++) acc[dd] = 0;", DV);
  const char *m = cu_tmp(f), *sum = cu_tmp(f), *jend = cu_tmp(f);
  cu_line(f, "%s %s = %s, %s = 0;  // running maximum and sum of exp(s - m)", ct, m, cu_const(f, dt, -INFINITY), sum);
  if (causal)
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
  if (has_mask) {
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
