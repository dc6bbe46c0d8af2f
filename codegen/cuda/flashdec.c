/* The split-KV decode kernel ("flashdec:split=..,bn=..,w=..[,pf=..][,tr=..]"):
 * attention.c's opening comment describes the key groups, the register
 * prefetch, the transposed score reduction and the merge of the splits;
 * attention.c checks the parameters and calls it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cu_attention.h"

/* cache: the least K and V bytes a split takes of the valid keys (below
 * that, fewer splits run: the merge and a block's fixed costs would
 * dominate) */
#define DEC_MIN_SPLIT_BYTES (16 * 1024)

/* ---- flashdec: the split-KV decode kernel ---- */

/* Declares `regs` and loads into it (when v is an argument) U 16-byte
 * chunks of operand v for keys `step` + u * NG + grp (zeros past kend);
 * key indices are of type jt (int when every key offset fits).  A chunk
 * is 4 x 32 bits, two 16-bit features each (feature 2i in the low half):
 * whole registers, which copy between pipeline stages without 16-bit moves
 * (packs of unsigned short went partly through local memory). */
static void dec_fetch(CuFn *f, const Att *a, int v, const char *regs, const char *gbase, const char *aligned, int U,
                      int NG, const char *step, const char *jt, int64_t T0) {
  cu_line(f, "smelt_pack<unsigned, 4> %s[%d];  // %s, features 2i, 2i+1 in word i", regs, U, f->g->val[v].name);
  if (!gbase) return;
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "const %s j = %s + u * %d + grp;", jt, step, NG);
  cu_line(f, "const unsigned short *src = %s + (long long)j * %lld + c * 8;", gbase, (long long)a->D);
  if (T0 < a->T) {
    cu_line(f, "// only the keys of the cache (the concat's first input) are loaded");
    cu_open(f, "if (j < kend && j < %lld)", (long long)T0);
  } else cu_open(f, "if (j < kend)");
  if (strcmp(aligned, "true") == 0) {
    cu_line(f, "%s[u] = *reinterpret_cast<const smelt_pack<unsigned, 4> *>(src);", regs);
  } else {
    cu_line(f, "if (%s) %s[u] = *reinterpret_cast<const smelt_pack<unsigned, 4> *>(src);", aligned, regs);
    cu_line(f, "else");
    cu_line(f, "  for (int i = 0; i < 4; i++) %s[u].v[i] = (unsigned)src[2 * i] | (unsigned)src[2 * i + 1] << 16;", regs);
  }
  cu_close(f);
  cu_line(f, "else");
  cu_line(f, "  %s[u] = smelt_pack<unsigned, 4>{{0u, 0u, 0u, 0u}};", regs);
  cu_close(f);
}

/* The 8 features of key j (a C expression) as floats `out[8]`: converted
 * from the fetched chunk `regs[u]` (arg: the operand, or for keys below T0
 * the first input of its concat, was loaded), or computed with cu_emit when
 * the operand is computed in the kernel (0 past kend). */
static void dec_floats(CuFn *f, const Att *a, int v, const char *regs, bool arg, int64_t T0, const char *out) {
  cu_line(f, "float %s[8];", out);
  bool part = arg && T0 < a->T;
  if (part) {
    cu_line(f, "// keys below %lld: loaded from the cache; the others computed (the concat's later inputs)", (long long)T0);
    cu_open(f, "if (j < %lld)", (long long)T0);
  }
  if (arg) {
    cu_line(f, "#pragma unroll");
    if (a->dt == DT_BF16)
      cu_line(f, "for (int e = 0; e < 8; e++) %s[e] = __int_as_float((int)(e & 1 ? %s[u].v[e / 2] & 0xffff0000u : %s[u].v[e / 2] << 16));",
              out, regs, regs);
    else {
      cu_line(f, "for (int e = 0; e < 8; e++)");
      cu_line(f, "#ifdef __CUDA_ARCH__");
      cu_line(f, "  %s[e] = __half2float(__ushort_as_half((unsigned short)(%s[u].v[e / 2] >> (e & 1) * 16)));", out, regs);
      cu_line(f, "#else");
      cu_line(f, "  %s[e] = emu_cvt((unsigned short)(%s[u].v[e / 2] >> (e & 1) * 16), false);", out, regs);
      cu_line(f, "#endif");
    }
    if (!part) return;
    cu_close(f);
    cu_open(f, "else");
  }
  cu_line(f, "// %s is computed in this kernel", f->g->val[v].name);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < 8; e++)");
  cu_line(f, "%s[e] = 0.0f;", out);
  cu_open(f, "if (j < kend)");
  const char *jj = cu_tmp(f), *d = cu_tmp(f);
  cu_line(f, "const %s %s = (%s)j, %s = c * 8 + e;", f->idx, jj, f->idx, d);
  const char *co4[4] = {"b", "hk", jj, d};
  CuCoords co;
  cu_coords_scalar(&co, 4, co4);
  CuVal x;
  cu_emit(f, v, &co, &x);
  cu_line(f, "%s[e] = %s;", out, x.l[0]);
  cu_close(f);
  cu_close(f);
  if (part) cu_close(f);
}

/* The result at element x (row x / D of the block, feature x % D) = A / L
 * (0 when no key was seen) through the epilogue, for rows that exist. */
static void dec_store(CuFn *f, const Att *a, const int *epi, int nepi, const char *x, const char *A, const char *L) {
  int64_t R, NRC;
  int RB, D = (int)a->D;
  cu_att_dec_rows(a, &R, &NRC, &RB);
  cu_open(f, "%s", "");
  cu_line(f, "const long long row = (long long)rc * %d + %s / %d;", RB, x, D);
  cu_open(f, "if (row < %lldLL)", (long long)R);
  const char *hh = cu_tmp(f), *ii = cu_tmp(f), *dd = cu_tmp(f);
  cu_line(f, "const %s %s = hk * %lld + (%s)(row / %lld), %s = (%s)(row %% %lld), %s = %s %% %d;", f->idx, hh, (long long)a->G,
          f->idx, (long long)a->S, ii, f->idx, (long long)a->S, dd, x, D);
  CuVal y = {{0}};
  y.l[0] = cu_tmp(f);
  cu_line(f, "const float %s = %s > 0.0f ? %s / %s : 0.0f;  // %s (attention)", y.l[0], L, A, L, f->g->val[a->an->out[0]].name);
  const char *c[4] = {"b", hh, ii, dd};
  CuCoords co;
  cu_coords_scalar(&co, 4, c);
  cu_store_epilogue(f, epi, nepi, &co, &y);
  cu_close(f);
  cu_close(f);
}

/* Where flashdec loads operand v (K or V) from: v itself when it is an
 * argument (*T0 = T); the first input of a concat along the keys when v
 * is one computed in this kernel whose first input is an argument of v's
 * dtype and layout [B, Hkv, T0, D] (a KV cache with the new keys appended:
 * keys below T0 are loaded, the others computed); else -1. */
static int dec_source(const CuFn *f, const Att *a, int v, int64_t *T0) {
  const Graph *g = f->g;
  *T0 = a->T;
  if (cu_att_is_arg_value(f, v)) return v;
  const Value *val = &g->val[v];
  if (val->kind != VK_NODE || !f->member[val->node]) return -1;
  const Node *n = &g->node[val->node];
  if (n->op != OP_CONCAT || n->nin < 2) return -1;
  int64_t axis = ir_attr_int(n, "axis");
  if (axis < 0) axis += 4;
  int c0 = n->in[0];
  const TensorType *t = &g->val[c0].type;
  if (axis != 2 || !cu_att_is_arg_value(f, c0) || t->dt != a->dt || t->rank != 4) return -1;
  if (t->dim[0] != a->B || t->dim[1] != a->Hkv || t->dim[3] != a->D || t->dim[2] < 1 || t->dim[2] >= a->T) return -1;
  *T0 = t->dim[2];
  return c0;
}

void cu_att_emit_flashdec(CuFn *f, const Att *a, const DecParams *p, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = a->an;
  int D = (int)a->D, W = p->W, LPK = D / 8, GPW = 32 / LPK, NG = W * GPW, U = p->BN / NG, SPLIT = p->split;
  int threads = 32 * W;
  int64_t R, NRC;
  int RB;
  cu_att_dec_rows(a, &R, &NRC, &RB);
  int64_t S = a->S, T = a->T, G = a->G, Hkv = a->Hkv, B = a->B;
  int64_t CHUNK = cu_att_cdiv(T, SPLIT);
  int64_t units = B * Hkv * NRC;
  double sl2 = a->scale * CU_ATT_LOG2E;
  /* key indices in 32 bits when every key's offset (up to 4 steps past T) fits: fewer registers */
  bool j32 = (T + 4 * (int64_t)p->BN) * D < 0x7fffffffLL;
  const char *jt = j32 ? "int" : "long long", *ll = j32 ? "" : "LL";
  /* workspace: counters (one per unit), then (m, l) and acc[D] per unit, split and row */
  uint64_t cnt_bytes = (uint64_t)cu_att_cdiv(units * 4, 16) * 16;
  uint64_t ml_floats = (uint64_t)units * SPLIT * RB * 2, acc_floats = (uint64_t)units * SPLIT * RB * D;
  uint64_t acc_off = cnt_bytes + (uint64_t)cu_att_cdiv((int64_t)ml_floats * 4, 16) * 16; /* 16-byte aligned: read as float4 */

  l->kind = "attention";
  l->block[0] = (unsigned)threads;
  l->grid[0] = (unsigned)(SPLIT * units); /* one dimension: side outputs' grid-stride loops use every block */
  l->workspace = SPLIT > 1 ? acc_off + 4 * acc_floats : 0;
  int qv = an->in[0], kv = an->in[1], vv = an->in[2];
  /* K and V come from memory with 16-byte loads when they are arguments,
   * or for the keys of a concat's first input when they are a concat
   * along the keys of an argument (a KV cache) and what follows it (the
   * new keys, computed element by element) */
  int64_t k0, v0;
  int kin = dec_source(f, a, kv, &k0), vin = dec_source(f, a, vv, &v0);
  bool ka = kin >= 0, va = vin >= 0;

  cu_line(f, "// variant: flashdec (split-KV decode: K and V read once with 16-byte loads, online softmax per key group)");
  cu_line(f, "// %s = attention(%s, %s, %s): B %lld, H %lld, Hkv %lld, S %lld, T %lld, D %d%s", g->val[an->out[0]].name,
          g->val[qv].name, g->val[kv].name, g->val[vv].name, (long long)B, (long long)a->H, (long long)Hkv, (long long)S,
          (long long)T, D, a->cache ? ", over a cache (query i sees keys j <= pos[i])" : a->causal ? ", causal (query i sees keys j <= T - S + i)" : "");
  cu_line(f, "// parameters: %lld query rows per kv head in %lld chunk(s) of %d; %d warps, key groups of %d lanes (%d groups),",
          (long long)R, (long long)NRC, RB, W, LPK, NG);
  cu_line(f, "// %d keys per group and step (%d per block), %d split(s) of %lld keys%s", U, p->BN, SPLIT, (long long)CHUNK,
          p->pf == 2 ? ", loads two steps ahead" : p->pf ? ", loads one step ahead" : "");
  cu_line(f, "#ifndef __CUDA_ARCH__");
  cu_line(f, "auto emu_cvt = [](unsigned short h, bool bf16) -> float {");
  cu_line(f, "  if (bf16) { unsigned u = (unsigned)h << 16; float v; memcpy(&v, &u, 4); return v; }");
  cu_line(f, "  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;");
  cu_line(f, "  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);");
  cu_line(f, "  return s ? -v : v;");
  cu_line(f, "};");
  cu_line(f, "#endif");
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  cu_att_fexp2(f);
  cu_line(f, "const int grp = warp * %d + lane / %d;  // this lane's key group", GPW, LPK);
  cu_line(f, "const int c = lane %% %d;  // its features: 8c .. 8c+7", LPK);
  cu_line(f, "// block -> (b, kv head, row chunk, split); the splits of one unit are neighbours");
  cu_line(f, "const int sp = (int)(blockIdx.x %% %du);  // this block's slice of the keys", SPLIT);
  cu_line(f, "const long long unit = blockIdx.x / %du;  // (b, kv head, row chunk)", SPLIT);
  cu_line(f, "const int rc = (int)(unit %% %lld);  // row chunk", (long long)NRC);
  cu_line(f, "const %s hk = (%s)(unit / %lld %% %lld), b = (%s)(unit / %lld);", f->idx, f->idx, (long long)NRC, (long long)Hkv,
          f->idx, (long long)(NRC * Hkv));
  if (a->cache) {
    /* the keys any row of the block sees: 0 .. max(pos) (clamped to the
     * cache); the splits share them out, each at least DEC_MIN_SPLIT_BYTES of K and V,
     * and the splits past them leave at once (the merge counts only the
     * others), so the cost follows the valid length, not the capacity */
    int64_t minc = DEC_MIN_SPLIT_BYTES / (4 * a->D);
    if (minc < p->BN) minc = p->BN;
    cu_line(f, "// cache: the valid keys are 0 .. max(pos), read now (a CUDA graph replays this with new positions)");
    cu_line(f, "long long vend = 0;  // one past the last key a row sees");
    const char *si = cu_tmp(f);
    cu_open(f, "for (%s %s = 0; %s < %lld; %s++)", f->idx, si, si, (long long)S, si);
    const char *pv = cu_tmp(f);
    cu_line(f, "const long long %s = %s;", pv, cu_att_pos(f, a, si));
    cu_line(f, "if (%s + 1 > vend) vend = %s + 1;", pv, pv);
    cu_close(f);
    cu_line(f, "if (vend > %lldLL) vend = %lldLL;", (long long)T, (long long)T);
    cu_line(f, "long long chunk = (vend + %d) / %d;  // keys per split", SPLIT - 1, SPLIT);
    cu_line(f, "if (chunk < %lldLL) chunk = %lldLL;", (long long)minc, (long long)minc);
    cu_line(f, "const int nsp = vend > 0 ? (int)((vend + chunk - 1) / chunk) : 1;  // splits with keys (at least one: rows of no key give 0)");
    cu_line(f, "if (sp >= nsp) return;  // past the valid keys: nothing to do, not counted by the merge");
    cu_line(f, "const %s kbeg = (%s)(sp * chunk);", jt, jt);
    cu_line(f, "const %s kend = (%s)(kbeg + chunk < vend ? kbeg + chunk : vend);  // this split's keys [kbeg, kend)", jt, jt);
  } else {
    cu_line(f, "const int nsp = %d;  // splits", SPLIT);
    cu_line(f, "const %s kbeg = (%s)sp * %lld;", jt, jt, (long long)CHUNK);
    cu_line(f, "const %s kend = kbeg + %lld < %lld%s ? kbeg + %lld : %lld%s;  // this split's keys [kbeg, kend)", jt, (long long)CHUNK,
            (long long)T, ll, (long long)CHUNK, (long long)T, ll);
  }
  if (ka)
    cu_line(f, "const unsigned short *Kg = reinterpret_cast<const unsigned short *>(a%d) + ((long long)b * %lld + hk) * %lldLL;  // %s",
            f->arg_of[kin], (long long)Hkv, (long long)(k0 * D), g->val[kin].name);
  if (va)
    cu_line(f, "const unsigned short *Vg = reinterpret_cast<const unsigned short *>(a%d) + ((long long)b * %lld + hk) * %lldLL;  // %s",
            f->arg_of[vin], (long long)Hkv, (long long)(v0 * D), g->val[vin].name);
  const char *aligned = "true";
  if ((ka || va) && !(f->opt && f->opt->args_aligned)) {
    aligned = "aligned16";
    cu_line(f, "const bool aligned16 = true%s%s;", ka ? cu_fmt(f, " && smelt_aligned(a%d, 16)", f->arg_of[kin]) : "",
            va ? cu_fmt(f, " && smelt_aligned(a%d, 16)", f->arg_of[vin]) : "");
  }

  /* pf: a software pipeline pf steps deep: the loads of step base + pf * BN
   * are issued before the math of step base, so that every lane keeps
   * (pf + 1) U chunks of K and of V in flight while it computes (the
   * latency of a step's loads is no longer exposed once per step).  The
   * first steps' loads are issued before the query prologue, whose own
   * loads and __syncthreads they overlap. */
  bool pf = p->pf && (ka || va);
  if (pf) {
    cu_line(f, "// software pipeline: this step's K and V chunks (keys base + u * %d + grp) were loaded %d step(s) ahead;", NG, p->pf);
    cu_line(f, "// the first step(s)' loads are issued here, in flight during the query prologue");
    dec_fetch(f, a, kv, "kr", ka ? "Kg" : NULL, aligned, U, NG, "kbeg", jt, k0);
    dec_fetch(f, a, vv, "vr", va ? "Vg" : NULL, aligned, U, NG, "kbeg", jt, v0);
    if (p->pf == 2) {
      if (ka) dec_fetch(f, a, kv, "kn", "Kg", aligned, U, NG, cu_fmt(f, "(kbeg + %d)", p->BN), jt, k0);
      if (va) dec_fetch(f, a, vv, "vn", "Vg", aligned, U, NG, cu_fmt(f, "(kbeg + %d)", p->BN), jt, v0);
    }
  }

  /* the rows: r -> row rc * RB + r of this kv head: query head hk * G + row / S, position row % S */
  cu_line(f, "// this block's query rows: row -> query head hk * %lld + row / %lld, position row %% %lld", (long long)G,
          (long long)S, (long long)S);
  cu_line(f, "// the query rows, times scale * log2(e), computed once per block (in parallel) into shared memory");
  cu_line(f, "__align__(16) __shared__ float sq[%d][%d];", RB, D);
  cu_open(f, "for (int x = threadIdx.x; x < %d; x += %d)", RB * D, threads);
  cu_line(f, "const int r = x / %d;", D);
  cu_line(f, "const long long row = (long long)rc * %d + r;", RB);
  cu_line(f, "float qx = 0.0f;");
  cu_open(f, "if (row < %lldLL)", (long long)R);
  const char *h = cu_tmp(f), *i = cu_tmp(f), *d = cu_tmp(f);
  cu_line(f, "const %s %s = hk * %lld + (%s)(row / %lld), %s = (%s)(row %% %lld), %s = x %% %d;", f->idx, h, (long long)G,
          f->idx, (long long)S, i, f->idx, (long long)S, d, D);
  {
    const char *c[4] = {"b", h, i, d};
    CuCoords co;
    cu_coords_scalar(&co, 4, c);
    CuVal x;
    cu_emit(f, qv, &co, &x);
    cu_line(f, "qx = %s * %s;", x.l[0], cu_const(f, DT_F32, sl2));
  }
  cu_close(f);
  cu_line(f, "sq[r][x %% %d] = qx;", D);
  cu_close(f);
  /* causal with several positions: a row's last key; else every row sees
   * every key of the split (rows past R -- zero queries, finite scores --
   * are computed but never stored): no per-row limit, no registers for it */
  bool needlim = (a->causal || a->cache) && S > 1;
  const char *mask = needlim ? "j < kend && j <= lim[r]" : "j < kend";
  if (needlim) {
    cu_line(f, "%s lim[%d];  // the last key each row sees (-1: not a row)", jt, RB);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int r = 0; r < %d; r++)", RB);
    cu_line(f, "const long long row = (long long)rc * %d + r;", RB);
    if (a->cache) {
      const char *ri = cu_tmp(f);
      cu_line(f, "const %s %s = (%s)(row %% %lld);", f->idx, ri, f->idx, (long long)S);
      cu_line(f, "lim[r] = row < %lldLL ? (%s)%s : -1;  // cache: query i sees keys 0 .. pos[i]", (long long)R, jt, cu_att_pos(f, a, ri));
    } else
      cu_line(f, "lim[r] = row < %lldLL ? %lld%s + (%s)(row %% %lld) : -1;", (long long)R, (long long)(T - S), ll, jt, (long long)S);
    cu_close(f);
  } else cu_line(f, "// every row sees every key of the split (S = 1 or not causal): only the split's end masks");
  cu_line(f, "__syncthreads();");
  /* one or two rows: this lane's features in registers; more: read from
   * shared memory per key (registers go to the accumulators) */
  const char *qe = "sq[r][c * 8 + e]";
  if (RB <= 2) {
    qe = "q[r][e]";
    cu_line(f, "float q[%d][8];  // this lane's features 8c .. 8c+7", RB);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int r = 0; r < %d; r++)", RB);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int e = 0; e < 8; e++) q[r][e] = sq[r][c * 8 + e];");
  }

  cu_line(f, "float m[%d], lsum[%d], acc[%d][8];  // per row: running max (log2 units), sum, output features", RB, RB, RB);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", RB);
  cu_line(f, "m[r] = -SMELT_INF_F, lsum[r] = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 8; e++) acc[r][e] = 0.0f;");
  cu_close(f);

  cu_open(f, "for (%s base = kbeg; base < kend; base += %d)", jt, p->BN);
  if (pf) {
    /* pf = 1: kn is step base + BN; pf = 2: kn (loaded a step ago) is base + BN, kn2 base + 2 BN */
    const char *nk = p->pf == 2 ? "kn2" : "kn", *nv = p->pf == 2 ? "vn2" : "vn";
    cu_line(f, "// the chunks of step base + %d, in flight during this step's math (zeros past kend)", p->pf * p->BN);
    if (ka) dec_fetch(f, a, kv, nk, "Kg", aligned, U, NG, cu_fmt(f, "(base + %d)", p->pf * p->BN), jt, k0);
    if (va) dec_fetch(f, a, vv, nv, "Vg", aligned, U, NG, cu_fmt(f, "(base + %d)", p->pf * p->BN), jt, v0);
  } else {
    cu_line(f, "// %d keys per group in flight: key base + u * %d + grp", U, NG);
    dec_fetch(f, a, kv, "kr", ka ? "Kg" : NULL, aligned, U, NG, "base", jt, k0);
    dec_fetch(f, a, vv, "vr", va ? "Vg" : NULL, aligned, U, NG, "base", jt, v0);
  }
  cu_line(f, "float sc[%d][%d];  // scores (log2 units)", U, RB);
  bool tr = p->tr && LPK > 1;
  int NP = 1, LV = 0, TL = 0; /* tr: values padded to NP (a power of 2); LV levels over the group, TL of them halving */
  if (tr) {
    while (NP < U * RB) NP *= 2;
    while ((1 << LV) < LPK) LV++;
    while ((1 << TL) < NP && TL < LV) TL++;
    cu_line(f, "float part[%d];  // per key u and row r (index u * %d + r): this lane's part of the dot product", NP, RB);
    if (NP > U * RB) {
      cu_line(f, "#pragma unroll");
      cu_line(f, "for (int i = %d; i < %d; i++) part[i] = 0.0f;  // padding to a power of 2", U * RB, NP);
    }
  }
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "const %s j = base + u * %d + grp;", jt, NG);
  dec_floats(f, a, kv, "kr", ka, k0, "kf");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", RB);
  cu_line(f, "float x = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 8; e++) x += %s * kf[e];", qe);
  if (tr) cu_line(f, "part[u * %d + r] = x;", RB);
  else {
    if (LPK > 1) {
      cu_line(f, "#pragma unroll");
      cu_line(f, "for (int o = %d; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);  // over the group", LPK / 2);
    }
    cu_line(f, "sc[u][r] = %s ? x : -SMELT_INF_F;", mask);
  }
  cu_close(f);
  cu_close(f);
  if (tr) {
    /* a transposed reduction: at each of the first TL levels a lane sends
     * half of its values and keeps the other half (the lower lane of the
     * pair keeps the lower half), so the NP sums take NP - 1 + ... shuffles
     * instead of NP * LV; the remaining levels sum what is left; then the
     * same levels backwards hand every lane all the sums again */
    cu_line(f, "// the sums over the group of all %d values at once: each shuffle level halves the values a lane keeps", NP);
    for (int k = 0; k < TL; k++) {
      int o = LPK >> (k + 1), hv = NP >> (k + 1);
      cu_open(f, "%s", "");
      cu_line(f, "const bool up = (lane & %d) != 0;  // keeps values %d.. of the %d", o, hv, 2 * hv);
      cu_line(f, "#pragma unroll");
      cu_open(f, "for (int i = 0; i < %d; i++)", hv);
      cu_line(f, "const float snd = up ? part[i] : part[i + %d], kept = up ? part[i + %d] : part[i];", hv, hv);
      cu_line(f, "part[i] = kept + __shfl_xor_sync(0xffffffffu, snd, %d);", o);
      cu_close(f);
      cu_close(f);
    }
    if (TL < LV) {
      cu_line(f, "// the levels left: plain sums of the %d value(s) each lane keeps", NP >> TL);
      for (int k = TL; k < LV; k++) {
        cu_line(f, "#pragma unroll");
        cu_line(f, "for (int i = 0; i < %d; i++) part[i] += __shfl_xor_sync(0xffffffffu, part[i], %d);", NP >> TL, LPK >> (k + 1));
      }
    }
    cu_line(f, "// back up the levels: every lane gets all the sums");
    for (int k = TL - 1; k >= 0; k--) {
      int o = LPK >> (k + 1), hv = NP >> (k + 1);
      cu_open(f, "%s", "");
      cu_line(f, "const bool up = (lane & %d) != 0;", o);
      cu_line(f, "#pragma unroll");
      cu_open(f, "for (int i = 0; i < %d; i++)", hv);
      cu_line(f, "const float other = __shfl_xor_sync(0xffffffffu, part[i], %d), mine = part[i];", o);
      cu_line(f, "part[i] = up ? other : mine, part[i + %d] = up ? mine : other;", hv);
      cu_close(f);
      cu_close(f);
    }
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int u = 0; u < %d; u++)", U);
    cu_line(f, "const %s j = base + u * %d + grp;", jt, NG);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int r = 0; r < %d; r++) sc[u][r] = %s ? part[u * %d + r] : -SMELT_INF_F;", RB, mask, RB);
    cu_close(f);
  }
  cu_line(f, "// rescale by the new maximum, then add the keys");
  cu_line(f, "float mb[%d];", RB);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", RB);
  cu_line(f, "float mx = m[r];");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int u = 0; u < %d; u++) mx = fmaxf(mx, sc[u][r]);", U);
  cu_line(f, "mb[r] = mx == -SMELT_INF_F ? 0.0f : mx;  // no key seen yet: no inf - inf");
  cu_line(f, "const float corr = fexp2(m[r] - mb[r]);");
  cu_line(f, "m[r] = mx;");
  cu_line(f, "lsum[r] *= corr;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 8; e++) acc[r][e] *= corr;");
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "const %s j = base + u * %d + grp;", jt, NG);
  dec_floats(f, a, vv, "vr", va, v0, "vf");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", RB);
  cu_line(f, "const float pr = fexp2(sc[u][r] - mb[r]);");
  cu_line(f, "lsum[r] += pr;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 8; e++) acc[r][e] += pr * vf[e];");
  cu_close(f);
  cu_close(f);
  if (pf) {
    cu_line(f, "// the next step's chunks become this step's");
    cu_line(f, "#pragma unroll");
    if (p->pf == 2)
      cu_line(f, "for (int u = 0; u < %d; u++) {%s%s }", U, ka ? " kr[u] = kn[u]; kn[u] = kn2[u];" : "",
              va ? " vr[u] = vn[u]; vn[u] = vn2[u];" : "");
    else cu_line(f, "for (int u = 0; u < %d; u++) {%s%s }", U, ka ? " kr[u] = kn[u];" : "", va ? " vr[u] = vn[u];" : "");
  }
  cu_close(f); /* base */

  /* merge the groups: within the warp by shuffles, then the warps in shared memory */
  cu_line(f, "// merge two online-softmax states: (m, l, acc) and (mo, lo, acco)");
  if (GPW > 1) {
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int off = %d; off < 32; off <<= 1)", LPK);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int r = 0; r < %d; r++)", RB);
    cu_line(f, "const float mo = __shfl_xor_sync(0xffffffffu, m[r], off), lo = __shfl_xor_sync(0xffffffffu, lsum[r], off);");
    cu_line(f, "const float mx = fmaxf(m[r], mo), mbase = mx == -SMELT_INF_F ? 0.0f : mx;");
    cu_line(f, "const float fa = fexp2(m[r] - mbase), fo = fexp2(mo - mbase);");
    cu_line(f, "m[r] = mx;");
    cu_line(f, "lsum[r] = lsum[r] * fa + lo * fo;");
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int e = 0; e < 8; e++) acc[r][e] = acc[r][e] * fa + __shfl_xor_sync(0xffffffffu, acc[r][e], off) * fo;");
    cu_close(f);
    cu_close(f);
  }
  cu_line(f, "__shared__ float sm_m[%d][%d], sm_l[%d][%d], sm_acc[%d][%d][%d];", W, RB, W, RB, W, RB, D);
  cu_open(f, "if (lane < %d)", LPK);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", RB);
  cu_line(f, "if (c == 0) sm_m[warp][r] = m[r], sm_l[warp][r] = lsum[r];");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 8; e++) sm_acc[warp][r][c * 8 + e] = acc[r][e];");
  cu_close(f);
  cu_close(f);
  cu_line(f, "__syncthreads();");

  if (SPLIT == 1) {
    cu_line(f, "// one split: the block's result is final");
    cu_line(f, "(void)nsp;");
    cu_open(f, "for (int x = threadIdx.x; x < %d; x += %d)", RB * D, threads);
    cu_line(f, "const int r = x / %d;", D);
    cu_line(f, "const long long row = (long long)rc * %d + r;", RB);
    cu_line(f, "if (row >= %lldLL) continue;", (long long)R);
    cu_line(f, "float mx = -SMELT_INF_F, L = 0.0f, A = 0.0f;");
    cu_line(f, "for (int w = 0; w < %d; w++) mx = fmaxf(mx, sm_m[w][r]);", W);
    cu_open(f, "for (int w = 0; w < %d; w++)", W);
    cu_line(f, "const float fw = sm_m[w][r] == -SMELT_INF_F ? 0.0f : fexp2(sm_m[w][r] - mx);");
    cu_line(f, "L += sm_l[w][r] * fw, A += sm_acc[w][r][x %% %d] * fw;", D);
    cu_close(f);
    dec_store(f, a, epi, nepi, "x", "A", "L");
    cu_close(f);
    return;
  }
  cu_line(f, "// this block's partial (m, l, acc) per row into the workspace: unit (b, hk, rc), split sp");
  cu_line(f, "unsigned *const cnt = reinterpret_cast<unsigned *>(ws) + unit;");
  cu_line(f, "float *const wml = reinterpret_cast<float *>(ws + %llu) + unit * %d;  // [split][row][m, l]",
          (unsigned long long)cnt_bytes, SPLIT * RB * 2);
  cu_line(f, "float *const wacc = reinterpret_cast<float *>(ws + %llu) + unit * %d;  // [split][row][D]",
          (unsigned long long)acc_off, SPLIT * RB * D);
  cu_open(f, "for (int x = threadIdx.x; x < %d; x += %d)", RB * D, threads);
  cu_line(f, "const int r = x / %d;", D);
  cu_line(f, "float mx = -SMELT_INF_F, L = 0.0f, A = 0.0f;");
  cu_line(f, "for (int w = 0; w < %d; w++) mx = fmaxf(mx, sm_m[w][r]);", W);
  cu_open(f, "for (int w = 0; w < %d; w++)", W);
  cu_line(f, "const float fw = sm_m[w][r] == -SMELT_INF_F ? 0.0f : fexp2(sm_m[w][r] - mx);");
  cu_line(f, "L += sm_l[w][r] * fw, A += sm_acc[w][r][x %% %d] * fw;", D);
  cu_close(f);
  cu_line(f, "wacc[(long long)sp * %d + x] = A;", RB * D);
  cu_line(f, "if (x %% %d == 0) wml[((long long)sp * %d + r) * 2] = mx, wml[((long long)sp * %d + r) * 2 + 1] = L;", D, RB, RB);
  cu_close(f);
  cu_line(f, "// the last block of this unit to finish merges the partials");
  cu_line(f, "__shared__ int is_last;");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__threadfence();  // this thread's part of the partial is visible before the count says so");
  cu_line(f, "#endif");
  cu_line(f, "__syncthreads();");
  cu_open(f, "if (threadIdx.x == 0)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "is_last = atomicAdd(cnt, 1u) == (unsigned)(nsp - 1);");
  cu_line(f, "#else");
  cu_line(f, "is_last = (*cnt)++ == (unsigned)(nsp - 1);  // the emulation runs blocks one after another");
  cu_line(f, "#endif");
  cu_close(f);
  cu_line(f, "__syncthreads();");
  cu_line(f, "if (!is_last) return;");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__threadfence();");
  cu_line(f, "auto ld = [](const float *p) { return __ldcg(p); };  // past L1: written by other SMs");
  cu_line(f, "auto ld4 = [](const float *p) {");
  cu_line(f, "  const float4 t = __ldcg(reinterpret_cast<const float4 *>(p));");
  cu_line(f, "  return smelt_pack<float, 4>{{t.x, t.y, t.z, t.w}};");
  cu_line(f, "};");
  cu_line(f, "#else");
  cu_line(f, "auto ld = [](const float *p) { return *p; };");
  cu_line(f, "auto ld4 = [](const float *p) { return *reinterpret_cast<const smelt_pack<float, 4> *>(p); };");
  cu_line(f, "#endif");
  /* the sums' layout: 4 features per thread (16-byte loads), the splits
   * cut into NSG groups when there are fewer 4-feature chunks than threads */
  int NX4 = RB * D / 4, NSG = NX4 >= threads ? 1 : threads / NX4;
  if (NSG > SPLIT) NSG = SPLIT;
  /* one pass: when every thread has at most one 4-feature chunk, its first
   * NPRE partials are loaded before the weights (in flight together with
   * the (m, l) loads: one round trip to memory instead of two) */
  int NPRE = NSG * NX4 <= threads ? (int)cu_att_cdiv(SPLIT, NSG) : 0;
  if (NPRE > 4) NPRE = 4; /* 16 registers: more spilled with 8 rows' accumulators live */
  if (NPRE) {
    cu_line(f, "// this thread's first %d partial(s) (splits sg + k * %d, 4 features), loaded now: in flight with the (m, l) loads", NPRE,
            NSG);
    cu_line(f, "const int px4 = threadIdx.x %% %d, psg = threadIdx.x / %d;", NX4, NX4);
    cu_line(f, "smelt_pack<float, 4> pre[%d];", NPRE);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int k = 0; k < %d; k++)", NPRE);
    cu_line(f, "const int s = psg + k * %d;", NSG);
    cu_line(f, "pre[k] = smelt_pack<float, 4>{{0.0f, 0.0f, 0.0f, 0.0f}};  // (not a ?: of two packs: that goes through local memory)");
    cu_line(f, "if (psg < %d && s < nsp) pre[k] = ld4(&wacc[(long long)s * %d + px4 * 4]);", NSG, RB * D);
    cu_close(f);
  }
  /* the weights: one warp per row, lanes over the splits, every load in flight at once */
  int NS = (int)cu_att_cdiv(SPLIT, 32);
  cu_line(f, "// the weights exp2(m_s - max) of every split's partial: a warp per row, lanes over the splits");
  cu_line(f, "__shared__ float cw[%d][%d], cl[%d];  // [split][row] weights; per row the merged sum", SPLIT, RB, RB);
  cu_open(f, "for (int r = warp; r < %d; r += %d)", RB, W);
  cu_line(f, "float ms[%d], ls[%d], mx = -SMELT_INF_F, L = 0.0f;", NS, NS);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int k = 0; k < %d; k++)", NS);
  cu_line(f, "const int s = lane + 32 * k;");
  cu_line(f, "ms[k] = s < nsp ? ld(&wml[(s * %d + r) * 2]) : -SMELT_INF_F;", RB);
  cu_line(f, "ls[k] = s < nsp ? ld(&wml[(s * %d + r) * 2 + 1]) : 0.0f;", RB);
  cu_line(f, "mx = fmaxf(mx, ms[k]);");
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int k = 0; k < %d; k++)", NS);
  cu_line(f, "const int s = lane + 32 * k;");
  cu_line(f, "const float w = ms[k] == -SMELT_INF_F ? 0.0f : fexp2(ms[k] - mx);");
  cu_line(f, "L += ls[k] * w;");
  cu_open(f, "if (s < nsp)");
  cu_line(f, "cw[s][r] = w;");
  cu_line(f, "wml[(s * %d + r) * 2] = wml[(s * %d + r) * 2 + 1] = 0.0f;  // read: leave the workspace zero", RB, RB);
  cu_close(f);
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);");
  cu_line(f, "if (lane == 0) cl[r] = L;");
  cu_close(f);
  cu_line(f, "__syncthreads();");
  cu_line(f, "// sum of weight * partial over the splits: 4 features per thread (16-byte loads, all independent)%s",
          NSG > 1 ? cu_fmt(f, ", the splits in %d groups", NSG) : "");
  if (NSG > 1) cu_line(f, "__shared__ smelt_pack<float, 4> cred[%d][%d];  // per split group", NSG, NX4);
  cu_open(f, "for (int t = threadIdx.x; t < %d; t += %d)", NSG * NX4, threads);
  cu_line(f, "const int x4 = t %% %d, sg = t / %d, r = x4 * 4 / %d;", NX4, NX4, D);
  cu_line(f, "smelt_pack<float, 4> A = {{0.0f, 0.0f, 0.0f, 0.0f}};");
  if (NPRE) {
    cu_line(f, "// the partials loaded before the weights (t is this thread's index: one chunk per thread)");
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int k = 0; k < %d; k++)", NPRE);
    cu_line(f, "const int s = sg + k * %d;", NSG);
    cu_line(f, "const float w = s < nsp ? cw[s][r] : 0.0f;");
    cu_line(f, "A.v[0] += w * pre[k].v[0], A.v[1] += w * pre[k].v[1], A.v[2] += w * pre[k].v[2], A.v[3] += w * pre[k].v[3];");
    cu_close(f);
  }
  cu_line(f, "#pragma unroll 16");
  cu_open(f, "for (int s = sg + %d; s < nsp; s += %d)", NPRE * NSG, NSG);
  cu_line(f, "const float w = cw[s][r];");
  cu_line(f, "const smelt_pack<float, 4> pt = ld4(&wacc[(long long)s * %d + x4 * 4]);", RB * D);
  cu_line(f, "A.v[0] += w * pt.v[0], A.v[1] += w * pt.v[1], A.v[2] += w * pt.v[2], A.v[3] += w * pt.v[3];");
  cu_close(f);
  cu_line(f, "// read: leave the workspace zero");
  cu_line(f, "for (int s = sg; s < nsp; s += %d) *reinterpret_cast<smelt_pack<float, 4> *>(&wacc[(long long)s * %d + x4 * 4]) = smelt_pack<float, 4>{{0.0f, 0.0f, 0.0f, 0.0f}};",
          NSG, RB * D);
  if (NSG > 1) {
    cu_line(f, "cred[sg][x4] = A;");
    cu_close(f);
    cu_line(f, "__syncthreads();");
    cu_open(f, "for (int x4 = threadIdx.x; x4 < %d; x4 += %d)", NX4, threads);
    cu_line(f, "smelt_pack<float, 4> A = cred[0][x4];");
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int s = 1; s < %d; s++) A.v[0] += cred[s][x4].v[0], A.v[1] += cred[s][x4].v[1], A.v[2] += cred[s][x4].v[2], A.v[3] += cred[s][x4].v[3];",
            NSG);
  }
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < 4; e++)");
  cu_line(f, "const int x = x4 * 4 + e;");
  dec_store(f, a, epi, nepi, "x", "A.v[e]", cu_fmt(f, "cl[x / %d]", D));
  cu_close(f);
  cu_close(f);
  cu_line(f, "if (threadIdx.x == 0) *cnt = 0u;  // ready for the next launch");
}

