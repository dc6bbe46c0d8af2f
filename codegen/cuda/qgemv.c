/* The quantised decode matmul: M <= 8 rows of A against a weight stored
 * quantised (int4/uint4 two per byte, int8/uint8, fp8 e4m3/e5m2) with a
 * scale per group of G elements along K, and for the integer codes
 * optionally a zero point per group (asymmetric int4 as GPTQ, AWQ and ONNX
 * MatMulNBits make it: u4 codes, u4 zeros), dequantised in registers, f32
 * accumulation.
 *
 * At decode a matmul is bound by the bytes of its weight: int4 with
 * groups of 128 reads ~3.9x fewer than f16.  The quantize pass stores
 * every quantised weight [N, K] (passes/quantize.c): each output column's
 * K values, and its K/G scales, are contiguous, which is the prepacked
 * layout this kernel streams (no repacking at load).  Mapping, as the f16
 * GEMV's [N, K] path (gemv.c): warp w of block b owns the C columns
 * n0 = (b * W + w) * C ...; its lanes read 16-byte chunks along k (a warp
 * step is 512 contiguous bytes per column: 1024 int4 weights), U chunks
 * per column issued together before any is used, streamed past L1 with
 * ld.global.nc.L1::no_allocate (the weight is read once).  A chunk holds
 * E = 32 (int4) or 16 (int8, fp8) consecutive k's and lies inside one
 * group (G a multiple of E) or holds whole groups of whole 32-bit words
 * (4-bit with G = 16 or 8), so per chunk, group and column the kernel sums
 * x[k] * q[k] and multiplies that by the group's one scale: (x . q) s,
 * the reference's x . (q s) reassociated.  Widening:
 *   int4  nibble i of a little-endian 32-bit word is element i (ir/dtype.h);
 *         with the word xor 0x88888888 a nibble is its value + 8, and
 *         float(0x4B000000 | nibble) - (2^23 + 8) is exactly the value
 *         (the mantissa trick: one LOP3, one FADD, no conversion);
 *   uint4 the same without the xor, less 2^23;
 *   int8  the same with byte ^ 0x80 and 2^23 + 128; uint8 without the xor,
 *         less 2^23;
 *   fp8   on sm_89+ two at a time by cvt.rn.f16x2.e4m3x2 / .e5m2x2 and
 *         cvt.f32.f16; elsewhere (and in the CPU emulation) with the
 *         prelude's exact integer decoders (smelt_f8e4m3, smelt_f8e5m2).
 * Zero points cost the inner loop nothing when they are integers (of the
 * qweight's dtype): the constant subtracted above becomes 2^23 + 8 + z
 * (int4; + 128 + z for int8, + z unsigned), one float per group and column
 * loaded with the scale, and the difference is still exactly q - z.  Zero
 * points in the scales' float dtype (which dequantize allows) are not
 * integers, so there the chunk's dot product is taken with the codes and
 * the group's sum of x (once per row, shared by the C columns) times z is
 * subtracted: (x . q - z sum x) s.  u4 zeros are read element by element,
 * so a column's K/G zeros may start mid-byte.
 * A's chunk of E elements is read per row (16-byte packs when A is a plain
 * argument and aligned, else element loads, or through cu_emit when a
 * prologue computes it); it stays in L1 (every warp reads the same row).
 * At the end the lanes' C x M partial sums are added with gemv.c's
 * transpose reduction (cu_gemv_transpose_reduce) and each result goes
 * through the group's epilogue.
 * Norm mode (fuse: norm_gemv_consumer): when A is rms_norm(Y, gamma),
 * computed in this kernel, every warp first takes the mean square of its
 * M rows of Y (gemv.c's cu_gemv_norm_rows) and A's chunk is Y's chunk
 * times 1/rms times gamma's, rounded to A's dtype as the norm's own kernel
 * would store it: the norm's kernel goes (two a decoder layer).
 * When the epilogue takes the halves of an interleaved gated pair
 * (merge-matmuls: SwiGLU's silu(x Wg) * (x Wu)), every lane gets every
 * sum and one lane stores each pair's product (pair mode, as gemv.c's).
 * Half mode (",h=1"; f16 A, 4- and 8-bit codes with integer zeros or
 * none, e4m3): the float widening above costs ~5 instructions an element
 * (a shift, a LOP3, an FADD, an FFMA and A's conversion), which on Hopper
 * leaves the int4 GEMV bound by issue, not by memory (it reaches the same
 * bytes a second on an H100 as on an H200).  Half mode widens two codes
 * at once into an f16 pair: (word >> 4 s) & 0x000f000f | 0x64006400 holds
 * 2^10 + nibble s and 2^10 + nibble s + 4, one f16x2 subtraction of
 * 2^10 + bias (+ z) makes the values exact, one f16x2 FMA multiplies them
 * by A's matching pair (A is read as f16 pairs and permuted once per
 * chunk, shared by the C columns) and adds to the word's f16 pair of sums,
 * which goes to the f32 sum (bytes likewise with 0x00ff00ff; e4m3 by
 * cvt.rn.f16x2.e4m3x2): ~2.5 instructions an element.  A word adds 4
 * products a half (4-bit) or 2 (8-bit, e4m3); A is taken times 2^-shift
 * (half_shift) so that those f16 sums cannot overflow whatever A holds,
 * and the f32 sums are taken times 2^shift at the end.  Each product is
 * rounded to f16, which costs about what the f16 rounding of the
 * matmul's own result does.
 * Parameters (token "qgemv:w=4,c=2,u=4"): W warps per block, C columns per
 * warp (1, 2, 4 or 8; in pair mode 1 runs as 2), U chunks per column in
 * flight; ",h=1" asks for half mode, ",p=P" for P column groups a warp
 * (one after another, the grid P times smaller: the warps drift out of
 * step, so that some load while others compute), ",sk=N" for split-K.
 * Not taken (the simple kernel dequantises element by element instead):
 * a [K, N] weight, zero points of fp8 weights, scales or zero points
 * that are not kernel arguments, groups that split a 32-bit word, A
 * transposed.
 */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_families.h"

typedef struct {
  int warps, cols, unroll;
  bool half; /* half mode: f16 pair arithmetic (see the top) */
  int per;   /* column groups a warp takes one after another (1: one) */
  int sk;    /* slices of K (split-K; 1: none) */
} QgParams;

typedef struct {
  const CuGemm *gm;
  const QgParams *p;
  const int *epi;
  int nepi;
  CuQuantB q;
  DType adt;
  int M;
  const char *z;
  const Node *norm; /* A = rms_norm(Y, G) computed in the loads (norm mode), else NULL */
  DType ydt, gdt;
  int shift; /* half mode: A is taken times 2^-shift (half_shift) */
} Qg;

bool cu_quant_b(const CuFn *f, const CuGemm *gm, CuQuantB *out) {
  if (gm->an->op != OP_MATMUL || gm->M < 1 || gm->M > 8 || gm->b1 || gm->ta || !gm->tb || gm->N < 1 || gm->K < 1)
    return false;
  const Graph *g = f->g;
  const Value *b = &g->val[gm->an->in[1]];
  if (b->kind != VK_NODE || !f->member[b->node]) return false;
  const Node *dq = &g->node[b->node];
  if (dq->op != OP_DEQUANTIZE || dq->nin < 2 || dq->nin > 3) return false;
  int qv = dq->in[0], sv = dq->in[1], zv = dq->nin > 2 ? dq->in[2] : -1;
  if (f->arg_of[qv] < 0 || f->arg_of[sv] < 0 || (zv >= 0 && f->arg_of[zv] < 0)) return false;
  const TensorType *qt = &g->val[qv].type;
  CuQuantB q = {.dq = dq, .qdt = qt->dt, .sdt = g->val[sv].type.dt, .zdt = zv >= 0 ? g->val[zv].type.dt : DT_INVALID};
  if (q.qdt != DT_I4 && q.qdt != DT_U4 && q.qdt != DT_I8 && q.qdt != DT_U8 && !dt_is_f8(q.qdt)) return false;
  if (!dt_is_float(q.sdt) || q.sdt == DT_F64) return false;
  if (qt->rank != 2 || ir_norm_axis(ir_attr_int(dq, "axis"), 2) != 1) return false;
  q.q0 = f->arg_of[qv], q.s0 = f->arg_of[sv], q.z0 = zv >= 0 ? f->arg_of[zv] : -1;
  const Value *av = &g->val[gm->an->in[0]];
  q.a0 = av->kind == VK_NODE && f->member[av->node] ? -1 : f->arg_of[gm->an->in[0]];
  q.E = dt_is_packed(q.qdt) ? 32 : 16;
  q.G = ir_attr_int(dq, "group");
  if (q.G <= 0) q.G = gm->K;
  q.ng = gm->K / q.G;
  q.KC = gm->K / q.E;
  q.row_bytes = gm->K * dt_bits(q.qdt) / 8;
  *out = q;
  return true;
}

static bool qg_eligible(const CuFn *f, const CuGemm *gm) {
  CuQuantB q;
  if (!cu_quant_b(f, gm, &q)) return false;
  /* zeros of the qweight's dtype or the scales' (ir/infer.c); fp8 takes none */
  if (q.z0 >= 0 && (dt_is_f8(q.qdt) || (q.zdt != q.qdt && q.zdt != q.sdt))) return false;
  DType adt = gm->at->dt;
  if (adt != DT_F32 && adt != DT_F16 && adt != DT_BF16) return false;
  int epw = dt_is_packed(q.qdt) ? 8 : 4;
  if (cu_gemm_wants_pairs(f, gm) && gm->N % 2) return false; /* pair mode: columns 2j, 2j + 1 */
  const Node *nm = cu_gemv_norm_node(f, gm);
  if (nm && !cu_gemv_norm_args_ok(f, nm)) return false; /* norm mode: Y and G from memory */
  /* a chunk inside one group, or whole groups of whole 32-bit words */
  return gm->K % q.E == 0 && gm->K % q.G == 0 && (q.G % q.E == 0 || (q.E % q.G == 0 && q.G % epw == 0));
}

/* "qgemv:w=W,c=C,u=U", then ",h=1" (half mode), ",p=P" (P > 1 column
 * groups a warp) and ",sk=N" (N > 1 slices of K; not with P), each
 * optional, in that order */
static bool qg_parse(const char *tok, QgParams *out) {
  int w, c, u, h = 0, per = 1, sk = 1, used = 0, more = 0;
  if (sscanf(tok, "qgemv:w=%d,c=%d,u=%d%n", &w, &c, &u, &used) != 3) return false;
  if (!strncmp(tok + used, ",h=", 3)) {
    if (sscanf(tok + used, ",h=%d%n", &h, &more) != 1 || h != 1) return false;
    used += more;
  }
  if (!strncmp(tok + used, ",p=", 3)) {
    if (sscanf(tok + used, ",p=%d%n", &per, &more) != 1 || per < 2 || per > 64) return false;
    used += more;
  }
  if (!strncmp(tok + used, ",sk=", 4)) {
    if (per > 1) return false;
    if (sscanf(tok + used, ",sk=%d%n", &sk, &more) != 1 || sk < 2 || sk > 16) return false;
    used += more;
  }
  if (tok[used] != 0) return false;
  /* C a power of two: the lanes' transpose reduction adds C x M' sums, M' a power of two */
  if (w < 1 || w > 32 || c < 1 || c > 8 || (c & (c - 1)) || u < 1 || u > 8) return false;
  *out = (QgParams){w, c, u, h == 1, per, sk};
  return true;
}

static void qg_format(const QgParams *p, char out[CG_VARIANT_LEN]) {
  char per[16] = "", sk[16] = "";
  if (p->per > 1) snprintf(per, sizeof per, ",p=%d", p->per);
  if (p->sk > 1) snprintf(sk, sizeof sk, ",sk=%d", p->sk);
  snprintf(out, CG_VARIANT_LEN, "qgemv:w=%d,c=%d,u=%d%s%s%s", p->warps, p->cols, p->unroll, p->half ? ",h=1" : "", per, sk);
}

/* Half mode takes f16 A, codes of 4 or 8 bits or e4m3 (e5m2's 57344
 * leaves no room in an f16 sum), and integer zero points or none. */
static bool half_ok(const CuFn *f, const CuGemm *gm) {
  CuQuantB q;
  if (gm->at->dt != DT_F16 || !cu_quant_b(f, gm, &q)) return false;
  if (q.z0 >= 0 && dt_is_float(q.zdt)) return false;
  return q.qdt == DT_I4 || q.qdt == DT_U4 || q.qdt == DT_I8 || q.qdt == DT_U8 || q.qdt == DT_F8E4M3;
}

/* 4 warps of 2 columns with 4 chunks per column in flight (128 bytes per
 * lane, like the f16 GEMV's default); 2 chunks at M > 4, where every chunk
 * holds more partial sums in registers.  Half mode where it applies: on an
 * H100 (2026-12-07) it was the faster at every W2 shape it was timed on
 * (int4 gate/up 24.4 against 26.8 us, down 17.0 against 18.7; int8 and
 * e4m3 gate/up at 87-89% of the copy bandwidth). */
static void qg_default(const CuFn *f, const CuGemm *gm, char out[CG_VARIANT_LEN]) {
  QgParams p = {4, 2, gm->M > 4 ? 2 : 4, half_ok(f, gm), 1, 1};
  qg_format(&p, out);
}

static int qg_candidates(const CuFn *f, const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max) {
  static const QgParams alt[] = {
      {4, 2, 4, false, 1, 1}, {4, 2, 2, false, 1, 1}, {4, 4, 2, false, 1, 1}, {8, 2, 4, false, 1, 1},
      {4, 1, 8, false, 1, 1}, {2, 2, 4, false, 1, 1}, {4, 2, 8, false, 1, 1}, {4, 2, 4, true, 1, 1},
      {4, 2, 2, true, 1, 1},  {8, 2, 4, true, 1, 1},  {4, 4, 4, true, 1, 1},  {4, 2, 8, true, 1, 1},
      {2, 2, 4, true, 1, 1},
      /* split-K, for grids of few warps (a down projection) */
      {4, 2, 4, false, 1, 2}, {4, 2, 2, false, 1, 4}, {4, 2, 4, true, 1, 2}, {4, 2, 2, true, 1, 4}, {4, 2, 2, true, 1, 8},
      /* column groups one after another, for grids of many (gate/up) */
      {2, 2, 4, true, 2, 1}, {2, 2, 4, true, 4, 1}, {4, 2, 4, true, 4, 1}, {2, 2, 4, false, 4, 1}};
  bool half = half_ok(f, gm);
  CuQuantB q;
  cu_quant_b(f, gm, &q); /* true: qg_eligible */
  /* pair mode runs an odd column count as the next even one: not a candidate of its own */
  bool pairs = cu_gemm_wants_pairs(f, gm);
  int n = 0;
  char d[CG_VARIANT_LEN];
  qg_default(f, gm, d);
  if (n < max) memcpy(out[n++], d, CG_VARIANT_LEN);
  for (size_t i = 0; i < sizeof alt / sizeof *alt && n < max; i++) {
    char tok[CG_VARIANT_LEN];
    if ((pairs && alt[i].cols % 2) || alt[i].half != half) continue;
    /* split-K where the warps are few (under 4096) and each lane still
     * gets two chunks a column in each slice */
    int64_t warps = (gm->N + 2 * alt[i].warps - 1) / (2 * alt[i].warps) * alt[i].warps;
    if (alt[i].sk > 1 && (warps >= 4096 || q.KC < 64LL * alt[i].sk)) continue;
    if (alt[i].per > 1 && warps < 4096LL * alt[i].per / 2) continue;
    qg_format(&alt[i], tok);
    if (strcmp(tok, d) != 0) memcpy(out[n++], tok, CG_VARIANT_LEN);
  }
  return n;
}

static int pow2_at_least(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

/* xs[0..E) = A[m][k .. k + E) as floats.  In norm mode A[m][k] =
 * Y[m][k] rs[m] G[k] rounded to A's dtype, as the norm's own kernel would
 * have stored it (gemv.c's a_rounded). */
static void load_x(CuFn *f, const Qg *v, bool packs) {
  const CuGemm *gm = v->gm;
  int E = v->q.E;
  if (v->norm) {
    int per = 16 / (int)dt_size(v->ydt), gper = 16 / (int)dt_size(v->gdt);
    const char *y = packs ? cu_fmt(f, "yp[e / %d].v[e %% %d]", per, per) : cu_fmt(f, "Y[m * %lldLL + k + e]", (long long)gm->K);
    const char *gv = packs ? cu_fmt(f, "gp[e / %d].v[e %% %d]", gper, gper) : "G[k + e]";
    if (packs) {
      const char *yt = cu_fmt(f, "smelt_pack<%s, %d>", cu_stype(v->ydt), per), *gt = cu_fmt(f, "smelt_pack<%s, %d>", cu_stype(v->gdt), gper);
      cu_line(f, "%s yp[%d];", yt, E / per);
      cu_line(f, "%s gp[%d];", gt, E / gper);
      cu_line(f, "#pragma unroll");
      cu_line(f, "for (int p = 0; p < %d; p++) yp[p] = *reinterpret_cast<const %s *>(Y + m * %lldLL + k + p * %d);", E / per,
              yt, (long long)gm->K, per);
      cu_line(f, "#pragma unroll");
      cu_line(f, "for (int p = 0; p < %d; p++) gp[p] = *reinterpret_cast<const %s *>(G + k + p * %d);", E / gper, gt, gper);
    }
    const char *x = cu_fmt(f, "%s * rs[m] * %s", cu_from_storage(f, v->ydt, y), cu_from_storage(f, v->gdt, gv));
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int e = 0; e < %d; e++) xs[e] = %s;", E, cu_from_storage(f, v->adt, cu_to_storage(f, v->adt, x)));
    return;
  }
  if (v->q.a0 >= 0 && packs) {
    int per = 16 / (int)dt_size(v->adt);
    const char *sa = cu_stype(v->adt);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int p = 0; p < %d; p++)", E / per);
    cu_line(f, "const smelt_pack<%s, %d> xp = *reinterpret_cast<const smelt_pack<%s, %d> *>(X + m * %lldLL + k + p * %d);",
            sa, per, sa, per, (long long)gm->K, per);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int e = 0; e < %d; e++) xs[p * %d + e] = %s;", per, per, cu_from_storage(f, v->adt, "xp.v[e]"));
    cu_close(f);
    return;
  }
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < %d; e++)", E);
  if (v->q.a0 >= 0) {
    cu_line(f, "xs[e] = %s;", cu_from_storage(f, v->adt, cu_fmt(f, "X[m * %lldLL + k + e]", (long long)gm->K)));
  } else {
    CuVal x;
    gm->load_a(f, gm, v->z, "m", "(k + e)", &x);
    cu_line(f, "xs[e] = (float)%s;", x.l[0]);
  }
  cu_close(f);
}

/* Groups in one chunk: 1, or E / G when the groups are smaller. */
static int subgroups(const Qg *v) { return v->q.G >= v->q.E ? 1 : (int)(v->q.E / v->q.G); }

/* Zero points of the qweight's dtype (integers): folded into the constant
 * the mantissa trick subtracts (see the top). */
static bool int_zeros(const Qg *v) { return v->q.z0 >= 0 && !dt_is_float(v->q.zdt); }
static bool float_zeros(const Qg *v) { return v->q.z0 >= 0 && dt_is_float(v->q.zdt); }

/* What the mantissa trick's 2^23 + code exceeds the value by: the xor of
 * the signed codes adds 8 (int4) or 128 (int8). */
static int code_bias(DType qdt) { return qdt == DT_I4 ? 8 : qdt == DT_I8 ? 128 : 0; }

/* Half mode: A is taken times 2^-shift so that no f16 sum of a word's
 * products can overflow, whatever A holds: a word holds 4 products a
 * half of |q - z| <= 8 (int4 without zeros) or 15 (4 bits), 2 of <= 128
 * (int8 without zeros), 255 (8 bits) or 448 (e4m3).  The f32 sums are
 * taken times 2^shift at the end (exact). */
static int half_shift(const Qg *v) {
  int bound, n = dt_is_packed(v->q.qdt) ? 4 : 2;
  switch (v->q.qdt) {
  case DT_I4: bound = v->q.z0 >= 0 ? 15 : 8; break;
  case DT_U4: bound = 15; break;
  case DT_I8: bound = v->q.z0 >= 0 ? 255 : 128; break;
  case DT_U8: bound = 255; break;
  default: bound = 448; break;
  }
  int p = 0;
  while ((1 << p) < n * bound) p++;
  return p;
}

/* xh[0..E/2) = A[m][k .. k + E) as f16 pairs times 2^-shift: 16-byte
 * packs of A scaled in pairs, or load_x's floats paired. */
static void load_xh(CuFn *f, const Qg *v, bool packs) {
  int E = v->q.E;
  unsigned scale = (unsigned)(15 - v->shift) << 10; /* 2^-shift in f16 */
  cu_line(f, "unsigned xh[%d];  // A[m][k .. k+%d] in f16 pairs, times 2^-%d", E / 2, E - 1, v->shift);
  if (v->q.a0 >= 0 && packs && !v->norm) {
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int p = 0; p < %d; p++)", E / 8);
    cu_line(f, "const smelt_pack<unsigned, 4> xp = *reinterpret_cast<const smelt_pack<unsigned, 4> *>(X + m * %lldLL + k + p * 8);",
            (long long)v->gm->K);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int e = 0; e < 4; e++) xh[p * 4 + e] = smelt_h2_mul(xp.v[e], 0x%04x%04xu);", scale, scale);
    cu_close(f);
    return;
  }
  cu_open(f, "%s", "");
  cu_line(f, "float xs[%d];", E);
  load_x(f, v, packs);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < %d; e++) xh[e] = smelt_h2_pack(xs[2 * e] * 0x1p-%df, xs[2 * e + 1] * 0x1p-%df);", E / 2,
          v->shift, v->shift);
  cu_close(f);
}

/* chunk_dot in half mode: per 32-bit word of codes, pairs of f16 codes
 * (2^10 + code in a half: the or of 0x6400), less 2^10 + bias (+ z) by
 * one f16 subtraction (exact), times A's pair and summed in f16x2 (the
 * word's 2 or 4 products a half), then in f32. */
static void chunk_dot_half(CuFn *f, const Qg *v) {
  int SUB = subgroups(v), WPS = 4 / SUB, MP = pow2_at_least(v->M);
  unsigned base = 0x6400u + (unsigned)code_bias(v->q.qdt); /* 2^10 + bias in f16: the mantissa's low bits */
  const char *off = int_zeros(v) ? "zh[j][h]" : cu_fmt(f, "0x%04x%04xu", base, base);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int h = 0; h < %d; h++)", SUB);
  cu_line(f, "float part = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = h * %d; e < (h + 1) * %d; e++)", WPS, WPS);
  if (!dt_is_f8(v->q.qdt)) {
    /* NP pairs a word: codes s and s + NP of the word (elements W e + s
     * and W e + s + NP, W = 2 NP codes a word), A's pair to match */
    bool four = dt_is_packed(v->q.qdt);
    int NP = four ? 4 : 2, bits = four ? 4 : 8;
    const char *name = four ? "nibble" : "byte";
    if (v->q.qdt == DT_I4 || v->q.qdt == DT_I8)
      cu_line(f, "const unsigned wd = w.v[e] ^ 0x%su;  // each %s: its value + %d", four ? "88888888" : "80808080", name,
              code_bias(v->q.qdt));
    else
      cu_line(f, "const unsigned wd = w.v[e];");
    cu_line(f, "unsigned hs = 0u;");
    cu_line(f, "// %ss s and s + %d (elements %d e + s and %d e + s + %d) in a pair; A's pair to match", name, NP, 2 * NP,
            2 * NP, NP);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int s = 0; s < %d; s++)", NP);
    cu_line(f, "const unsigned c2 = smelt_h2_sub(((wd >> (%d * s)) & 0x%su) | 0x64006400u, %s);", bits,
            four ? "000f000f" : "00ff00ff", off);
    cu_line(f, "const unsigned lo = xh[%d * e + s / 2], hi = xh[%d * e + %d + s / 2];", NP, NP, NP / 2);
    cu_line(f, "hs = smelt_h2_fma(c2, s & 1 ? (lo >> 16) | (hi & 0xffff0000u) : (lo & 0xffffu) | (hi << 16), hs);");
    cu_close(f);
    cu_line(f, "part += smelt_h2_sum(hs);");
  } else {
    /* e4m3 */
    cu_line(f, "const unsigned wd = w.v[e];");
    cu_line(f, "unsigned hs = 0u;");
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int s = 0; s < 2; s++)");
    cu_line(f, "unsigned c2;  // elements 4 e + 2 s and the next, as A's pair xh[2 e + s]");
    cu_line(f, "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890");
    cu_line(f, "asm(\"cvt.rn.f16x2.e4m3x2 %%0, %%1;\" : \"=r\"(c2) : \"h\"((unsigned short)(wd >> (16 * s))));");
    cu_line(f, "#else");
    cu_line(f, "c2 = smelt_h2_pack(smelt_f8e4m3((wd >> (16 * s)) & 255u), smelt_f8e4m3((wd >> (16 * s + 8)) & 255u));");
    cu_line(f, "#endif");
    cu_line(f, "hs = smelt_h2_fma(c2, xh[2 * e + s], hs);");
    cu_close(f);
    cu_line(f, "part += smelt_h2_sum(hs);");
  }
  cu_close(f);
  cu_line(f, "acc[j * %d + m] += part * sc[j][h];", MP);
  cu_close(f);
}

/* acc[j * MP + m] += the chunk's dot product with A's row, group by group:
 * part = sum of xs[e] * (q[e] - z) over a group's words of w (four 32-bit
 * words; with float zeros sum of xs[e] q[e] less z xsum[h]), times the
 * group's scale sc[j][h]. */
static void chunk_dot(CuFn *f, const Qg *v) {
  int SUB = subgroups(v), WPS = 4 / SUB, MP = pow2_at_least(v->M);
  /* what 2^23 + code is less: 2^23 + the code's bias, plus z with integer
   * zeros (zo, per group and column); `less` says it in the generated comment */
  const char *off = int_zeros(v) ? "zo[j][h]" : cu_fmt(f, "%.1ff", 8388608.0 + code_bias(v->q.qdt));
  const char *less = cu_fmt(f, "2^23%s%s", code_bias(v->q.qdt) == 8 ? " + 8" : code_bias(v->q.qdt) ? " + 128" : "",
                            int_zeros(v) ? " + z" : "");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int h = 0; h < %d; h++)", SUB);
  cu_line(f, "float part = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = h * %d; e < (h + 1) * %d; e++)", WPS, WPS);
  switch (v->q.qdt) {
  case DT_I4:
  case DT_U4:
    if (v->q.qdt == DT_I4) cu_line(f, "const unsigned wd = w.v[e] ^ 0x88888888u;  // each nibble: its i4 value + 8");
    else cu_line(f, "const unsigned wd = w.v[e];  // each nibble: its u4 value");
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int s = 0; s < 8; s++)  // nibble s is element 8 e + s; 2^23 + %s, less %s",
            v->q.qdt == DT_I4 ? "(value + 8)" : "value", less);
    cu_line(f, "  part += xs[e * 8 + s] * (__int_as_float(0x4B000000 | ((wd >> (4 * s)) & 15u)) - %s);", off);
    break;
  case DT_I8:
  case DT_U8:
    cu_line(f, "const unsigned wd = w.v[e];");
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int s = 0; s < 4; s++)  // byte s is element 4 e + s; 2^23 + %s, less %s",
            v->q.qdt == DT_I8 ? "(byte + 128)" : "byte", less);
    cu_line(f, "  part += xs[e * 4 + s] * (__int_as_float(0x4B000000 | (((wd >> (8 * s)) & 255u)%s)) - %s);",
            v->q.qdt == DT_I8 ? " ^ 128u" : "", off);
    break;
  default: {
    const char *fmt = v->q.qdt == DT_F8E4M3 ? "e4m3" : "e5m2";
    cu_line(f, "const unsigned wd = w.v[e];");
    cu_line(f, "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890");
    cu_line(f, "#pragma unroll");
    cu_line(f, "// two fp8 a conversion to f16x2, then to f32");
    cu_open(f, "for (int s = 0; s < 2; s++)");
    cu_line(f, "const unsigned short pair = (unsigned short)(wd >> (16 * s));");
    cu_line(f, "unsigned short h0, h1;");
    cu_line(f, "asm(\"{.reg .b32 t; cvt.rn.f16x2.%sx2 t, %%2; mov.b32 {%%0, %%1}, t;}\" : \"=h\"(h0), \"=h\"(h1) : \"h\"(pair));", fmt);
    cu_line(f, "float f0, f1;");
    cu_line(f, "asm(\"cvt.f32.f16 %%0, %%1;\" : \"=f\"(f0) : \"h\"(h0));");
    cu_line(f, "asm(\"cvt.f32.f16 %%0, %%1;\" : \"=f\"(f1) : \"h\"(h1));");
    cu_line(f, "part += xs[e * 4 + 2 * s] * f0 + xs[e * 4 + 2 * s + 1] * f1;");
    cu_close(f);
    cu_line(f, "#else");
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int s = 0; s < 4; s++) part += xs[e * 4 + s] * smelt_f8%s((wd >> (8 * s)) & 255u);", fmt);
    cu_line(f, "#endif");
  }
  }
  cu_close(f);
  if (float_zeros(v)) cu_line(f, "acc[j * %d + m] += (part - zf[j][h] * xsum[h]) * sc[j][h];", MP);
  else cu_line(f, "acc[j * %d + m] += part * sc[j][h];", MP);
  cu_close(f);
}

/* The zero points of the chunk's groups for the C columns, next to their
 * scales: zo = 2^23 + bias + z for integer ones (exact: |z| < 2^8), zf = z
 * for float ones. */
static void load_zeros(CuFn *f, const Qg *v) {
  if (v->q.z0 < 0) return;
  int C = v->p->cols, SUB = subgroups(v);
  const char *idx = cu_fmt(f, "nc[j] * %lldLL + g + h", (long long)v->q.ng);
  const char *z;
  if (dt_is_packed(v->q.zdt)) z = cu_fmt(f, "%s(Z, %s)", v->q.zdt == DT_I4 ? "smelt_i4" : "smelt_u4", idx);
  else z = cu_from_storage(f, v->q.zdt, cu_fmt(f, "Z[%s]", idx));
  if (v->p->half) {
    /* 2^10 + bias + z as an f16 pair (exact: 1016 <= it <= 1279) */
    cu_line(f, "unsigned zh[%d][%d];  // 2^10 + %d + z, twice", C, SUB, code_bias(v->q.qdt));
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int j = 0; j < %d; j++)", C);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int h = 0; h < %d; h++) zh[j][h] = smelt_h2_pack(%d.0f + (float)%s, %d.0f + (float)%s);", SUB,
            1024 + code_bias(v->q.qdt), z, 1024 + code_bias(v->q.qdt), z);
    return;
  }
  if (float_zeros(v)) {
    cu_line(f, "float zf[%d][%d];", C, SUB);
  } else {
    cu_line(f, "float zo[%d][%d];  // 2^23 + %d + z", C, SUB, code_bias(v->q.qdt));
    z = cu_fmt(f, "%.1ff + (float)%s", 8388608.0 + code_bias(v->q.qdt), z);
  }
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++)", C);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int h = 0; h < %d; h++) %s[j][h] = %s;", SUB, float_zeros(v) ? "zf" : "zo", z);
}

/* xsum[h]: the sum of xs over group h of the chunk (float zeros only). */
static void x_sums(CuFn *f, const Qg *v) {
  if (!float_zeros(v)) return;
  int SUB = subgroups(v), EPS = v->q.E / SUB;
  cu_line(f, "float xsum[%d];", SUB);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int h = 0; h < %d; h++)", SUB);
  cu_line(f, "xsum[h] = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = h * %d; e < (h + 1) * %d; e++) xsum[h] += xs[e];", EPS, EPS);
  cu_close(f);
}

/* The lanes' stream over the K/E chunks of the warp's columns. */
static void stream(CuFn *f, const Qg *v, bool packs) {
  int U = v->p->unroll, C = v->p->cols;
  /* the chunks [lo, hi): all, or with split-K slice blockIdx.y's */
  bool split = v->p->sk > 1;
  const char *hi = split ? "c_hi" : cu_fmt(f, "%lld", (long long)v->q.KC);
  cu_open(f, "for (int c = %slane; c < %s; c += %d)", split ? "c_lo + " : "", hi, 32 * U);
  cu_line(f, "smelt_pack<unsigned, 4> wq[%d][%d];  // U x C chunks issued before any is used", U, C);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int j = 0; j < %d; j++) wq[u][j] = load_q(qr[j] + (c + 32 * u < %s ? c + 32 * u : %s - 1));", C, hi, hi);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "if (c + 32 * u >= %s) break;", hi);
  cu_line(f, "const %s k = (%s)(c + 32 * u) * %d;", f->idx, f->idx, v->q.E);
  int SUB = subgroups(v);
  cu_line(f, "const %s g = k / %lld;  // the chunk's (first) group", f->idx, (long long)v->q.G);
  cu_line(f, "float sc[%d][%d];", C, SUB);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++)", C);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int h = 0; h < %d; h++) sc[j][h] = %s;", SUB,
          cu_from_storage(f, v->q.sdt, cu_fmt(f, "S[nc[j] * %lldLL + g + h]", (long long)v->q.ng)));
  load_zeros(f, v);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int m = 0; m < %d; m++)", v->M);
  if (v->p->half) {
    load_xh(f, v, packs);
  } else {
    cu_line(f, "float xs[%d];  // A[m][k .. k+%d]", v->q.E, v->q.E - 1);
    load_x(f, v, packs);
    x_sums(f, v);
  }
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", C);
  cu_line(f, "const smelt_pack<unsigned, 4> w = wq[u][j];");
  if (v->p->half) chunk_dot_half(f, v);
  else chunk_dot(f, v);
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_close(f);
}

/* Split-K: "part[(...) * N + n" (the caller closes the bracket), slice
 * blockIdx.y's sum of row m, column n in the workspace. */
static const char *split_part(CuFn *f, const Qg *v, const char *m, const char *n) {
  return cu_fmt(f, "part[((%s * %dLL + blockIdx.y) * %lldLL + %s) * %lldLL + %s", v->z, v->p->sk, (long long)v->gm->M, m,
                (long long)v->gm->N, n);
}

/* Split-K: the last slice's block adds the slices' sums of the block's
 * W x C columns and runs the epilogue (gemv.c's tail). */
static void split_tail(CuFn *f, const Qg *v, int64_t gx, bool pairs) {
  if (v->p->sk <= 1) return;
  int NBLK = v->p->warps * v->p->cols;
  cu_line(f, "const long long nb0 = (long long)blockIdx.x * %d;  // the block's first column", NBLK);
  cu_gemm_split_tail(f, v->gm, v->z, v->p->sk, gx, pairs, "nb0", NBLK, 32 * v->p->warps, v->epi, v->nepi);
}

static void qg_emit_kernel(CuFn *f, const CuGemm *gm, const QgParams *tp, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  /* pair mode (the halves of a gated pair in the epilogue): both columns
   * of a pair in one warp, so an odd column count runs as the next even one */
  bool pairs = cu_gemm_wants_pairs(f, gm);
  QgParams pp = *tp;
  if (pairs && pp.cols % 2) pp.cols++;
  if (pp.half && !half_ok(f, gm)) pp.half = false; /* a forced token on a kernel half mode does not take */
  const QgParams *p = &pp;
  Qg v = {.gm = gm, .p = p, .epi = epi, .nepi = nepi, .adt = gm->at->dt, .M = (int)gm->M, .norm = cu_gemv_norm_node(f, gm)};
  cu_quant_b(f, gm, &v.q); /* true: qg_eligible */
  v.shift = p->half ? half_shift(&v) : 0;
  if (v.norm) {
    v.ydt = g->val[v.norm->in[0]].type.dt;
    v.gdt = g->val[v.norm->in[1]].type.dt;
  }
  const Node *dq = v.q.dq;
  const Value *av = &g->val[gm->an->in[0]];
  int W = p->warps, C = p->cols, MP = pow2_at_least(v.M), P = C * MP;
  QgParams ran = *tp;
  ran.half = p->half;
  qg_format(&ran, l->variant);
  l->kind = "matmul";
  int64_t gx = (gm->N + (int64_t)W * C - 1) / ((int64_t)W * C);
  if (gx > 0x7fffffffLL || v.q.KC > 0x3fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "a %lld x %lld weight exceeds the quantised GEMV's grid", (long long)gm->N, (long long)gm->K);
    return;
  }
  int sk = p->sk;
  uint64_t part_off = 0;
  l->block[0] = (unsigned)(32 * W);
  l->grid[0] = (unsigned)((gx + p->per - 1) / p->per);
  l->grid[1] = (unsigned)sk;
  l->grid[2] = (unsigned)(gm->Z < 1 ? 1 : gm->Z > 65535 ? 65535 : gm->Z);
  l->workspace = cu_gemm_split_workspace(gm, gx, sk, &part_off);
  if (gm->Z == 0) return;
  cu_line(f, "// variant: quantised GEMV for M = %d (decode): %s (%s [N, K], a scale%s per %lld of K) read once with", v.M,
          g->val[dq->in[0]].name, dt_name(v.q.qdt), v.q.z0 >= 0 ? " and a zero point" : "", (long long)v.q.G);
  cu_line(f, "// 16-byte loads and dequantised in registers, f32 accumulation; warp w of block b owns columns (b * %d + w) * %d ..", W, C);
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  /* every chunk is at a multiple of 16 bytes from the weight's base:
   * one uniform test of the base picks 16-byte or byte loads */
  bool al = f->opt && f->opt->args_aligned;
  if (!al) cu_line(f, "const bool qal = smelt_aligned(a%d, 16);", v.q.q0);
  cu_line(f, "// 16-byte loads of the weight that bypass L1: it is read once (byte loads if its base is not aligned)");
  cu_open(f, "auto load_q = [&](const smelt_pack<unsigned, 4> *p)");
  cu_line(f, "smelt_pack<unsigned, 4> r;");
  cu_open(f, "if (%s)", al ? "true" : "qal");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"ld.global.nc.L1::no_allocate.v4.u32 {%%0, %%1, %%2, %%3}, [%%4];\\n\" : \"=r\"(r.v[0]), \"=r\"(r.v[1]), "
             "\"=r\"(r.v[2]), \"=r\"(r.v[3]) : \"l\"(p));");
  cu_line(f, "#else");
  cu_line(f, "if ((unsigned long long)p & 15u) __builtin_trap();  // the device's 16-byte load would fault");
  cu_line(f, "r = *p;");
  cu_line(f, "#endif");
  cu_line(f, "return r;");
  cu_close(f);
  cu_line(f, "const unsigned char *b = reinterpret_cast<const unsigned char *>(p);");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < 4; i++) r.v[i] = b[4 * i] | (unsigned)b[4 * i + 1] << 8 | (unsigned)b[4 * i + 2] << 16 | (unsigned)b[4 * i + 3] << 24;");
  cu_line(f, "return r;");
  f->indent--;
  cu_line(f, "};");
  v.z = cu_tmp(f);
  cu_open(f, "for (%s %s = blockIdx.z; %s < %lld; %s += gridDim.z)", f->idx, v.z, v.z, (long long)gm->Z, v.z);
  /* ranged dims: a batch past this run's rows is skipped (the block has no
   * barrier); ranged rows (M <= 8) are all computed and only this run's
   * stored (cu_gemm_store_at) */
  const char *past = cu_gemm_batch_past(f, gm, v.z);
  if (past) cu_line(f, "if (%s) continue;  // ranged dims: this batch holds none of this run's rows", past);
  if (v.q.a0 >= 0)
    cu_line(f, "const %s *X = a%d + %s;  // %s", cu_stype(v.adt), v.q.a0, cu_gemm_batch_offset(f, gm, v.z, gm->at), av->name);
  if (v.norm) cu_gemv_norm_rows(f, gm, v.z, v.norm, v.M, 16 / (int)dt_size(v.ydt), cu_fmt(f, "smelt_aligned(a%d, 16)", f->arg_of[v.norm->in[0]]));
  cu_line(f, "const %s *S = a%d;  // %s", cu_stype(v.q.sdt), v.q.s0, g->val[dq->in[1]].name);
  if (v.q.z0 >= 0) cu_line(f, "const %s *Z = a%d;  // %s", cu_stype(v.q.zdt), v.q.z0, g->val[dq->in[2]].name);
  if (p->per > 1)
    cu_open(f, "for (long long n0 = ((long long)blockIdx.x * %d + warp) * %d; n0 < %lldLL; n0 += (long long)gridDim.x * %d)",
            W, C, (long long)gm->N, W * C);
  else
    cu_line(f, "const long long n0 = ((long long)blockIdx.x * %d + warp) * %d;  // this warp's first column", W, C);
  if (sk > 1) {
    int64_t KCS = (v.q.KC + sk - 1) / sk;
    cu_line(f, "// split-K: slice blockIdx.y takes chunks [c_lo, c_hi) of each column; its sums go to part");
    cu_line(f, "const int c_lo = (int)blockIdx.y * %lld, c_hi = c_lo + %lld < %lld ? c_lo + %lld : %lld;", (long long)KCS,
            (long long)KCS, (long long)v.q.KC, (long long)KCS, (long long)v.q.KC);
    cu_line(f, "float *const part = reinterpret_cast<float *>(ws + %lluULL);  // [Z][%d][M][N]", (unsigned long long)part_off, sk);
  }
  cu_line(f, "float acc[%d];  // acc[j * %d + m]: column n0 + j, row m", P, MP);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++) acc[i] = 0.0f;", P);
  cu_open(f, "if (n0 < %lldLL)", (long long)gm->N);
  cu_line(f, "long long nc[%d];  // the columns (past N: the last one, its sums unused)", C);
  cu_line(f, "const smelt_pack<unsigned, 4> *qr[%d];", C);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", C);
  cu_line(f, "nc[j] = n0 + j < %lldLL ? n0 + j : %lldLL;", (long long)gm->N, (long long)gm->N - 1);
  cu_line(f, "qr[j] = reinterpret_cast<const smelt_pack<unsigned, 4> *>(reinterpret_cast<const unsigned char *>(a%d) + nc[j] * %lldLL);",
          v.q.q0, (long long)v.q.row_bytes);
  cu_close(f);
  /* 16-byte packs of A (in norm mode of Y and G) need their bases aligned
   * to 16 (a uniform test) */
  bool x_packs = v.q.a0 >= 0 || v.norm;
  if (x_packs) {
    cu_open(f, "if (%s)", v.norm ? "smelt_aligned(Y, 16) && smelt_aligned(G, 16)" : "smelt_aligned(X, 16)");
    stream(f, &v, true);
    cu_close(f);
    cu_open(f, "else");
    stream(f, &v, false);
    cu_close(f);
  } else {
    stream(f, &v, false);
  }
  if (p->half) {
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int i = 0; i < %d; i++) acc[i] *= 0x1p%df;  // A was taken times 2^-%d", P, v.shift, v.shift);
  }
  cu_close(f);
  if (pairs) {
    /* every lane gets every sum (P <= 64), and lane q runs the epilogue
     * of column pair q / M (columns n0 + 2 (q / M) and the next), row q % M */
    cu_gemv_allreduce(f, P);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int q = 0; q < %d; q++)", C / 2 * v.M);
    const char *m = cu_tmp(f), *n = cu_tmp(f);
    cu_line(f, "const %s %s = q %% %d, %s = (%s)(n0 + 2 * (q / %d));", f->idx, m, v.M, n, f->idx, v.M);
    cu_open(f, "if (lane == q && %s < %lld)", n, (long long)gm->N);
    const char *s0 = cu_fmt(f, "acc[2 * (q / %d) * %d + q %% %d]", v.M, MP, v.M);
    const char *s1 = cu_fmt(f, "acc[(2 * (q / %d) + 1) * %d + q %% %d]", v.M, MP, v.M);
    if (sk > 1) {
      const char *at = split_part(f, &v, m, n);
      cu_line(f, "%s] = %s;", at, s0);
      cu_line(f, "%s + 1] = %s;", at, s1);
    } else {
      cu_gemm_store_pair_at(f, gm, v.z, m, n, s0, s1, v.epi, v.nepi);
    }
    cu_close(f);
    cu_close(f);
    if (p->per > 1) cu_close(f); /* the column groups */
    split_tail(f, &v, gx, pairs);
    cu_close(f); /* z */
    return;
  }
  int R = cu_gemv_transpose_reduce(f, P, 1);
  for (int r = 0; r < R; r++) {
    if (P >= 32) {
      cu_open(f, "%s", "");
      cu_line(f, "const int i = lane * %d + %d;", R, r);
      cu_line(f, "const float s = acc[%d];", r);
    } else {
      cu_open(f, "if (lane %% %d == 0)", 32 / P);
      cu_line(f, "const int i = lane / %d;  // the same sum in %d lanes", 32 / P, 32 / P);
      cu_line(f, "const float s = acc[0];");
    }
    const char *m = cu_tmp(f), *n = cu_tmp(f);
    cu_line(f, "const %s %s = i %% %d, %s = (%s)(n0 + i / %d);", f->idx, m, MP, n, f->idx, MP);
    cu_open(f, "if (%s < %d && %s < %lld)", m, v.M, n, (long long)gm->N);
    if (sk > 1) cu_line(f, "%s] = s;", split_part(f, &v, m, n));
    else cu_gemm_store_at(f, gm, v.z, m, n, "s", v.epi, v.nepi);
    cu_close(f);
    cu_close(f);
  }
  if (p->per > 1) cu_close(f); /* the column groups */
  split_tail(f, &v, gx, pairs);
  cu_close(f); /* z */
}

/* ---- the family's entry (cu_families.h) ---- */

static bool qg_emit(CuFn *f, const CuGemm *gm, const char *tok, const int *epi, int nepi, CuLaunch *l) {
  QgParams p;
  if (!qg_parse(tok, &p)) return false;
  qg_emit_kernel(f, gm, &p, epi, nepi, l);
  return true;
}

const CuGemmFamily cu_family_qgemv = {"qgemv", qg_eligible, qg_default, qg_candidates, qg_emit};
