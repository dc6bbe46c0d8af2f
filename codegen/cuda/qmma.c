/* The quantised decode matmul on the tensor cores: M <= 8 rows of f16 A
 * against a weight stored quantised [N, K] (int4/uint4 two per byte,
 * int8/uint8, fp8 e4m3/e5m2; a scale per group of G elements along K and,
 * for the integer codes, an optional integer zero point), the weight
 * widened to f16 in registers and multiplied by mma.sync.m16n8k16 with
 * f32 accumulation.
 *
 * Why: qgemv.c widens every element to f32 and takes one FFMA per element
 * and row (about 5 instructions per int4 element).  Here the widening is
 * a few integer ops per pair of elements and the multiply-add is the
 * tensor cores' (two mma per 8 int4 codes of 16 columns), as in Marlin
 * and TensorRT-LLM's weight-only kernels, and the weight streams through
 * a cp.async pipeline (below).  docs/perf.md has what each step bought on
 * the H200: the first version, with loads issued a few at a time as in
 * qgemv, was no faster than qgemv (both latency-bound, not bound by their
 * instructions).
 *
 * Mapping.  The weight is the mma's A (16 rows = 16 output columns
 * n0 .. n0+15 per block), A's M <= 8 rows are its B (8 columns; the ones
 * past M are zero).  Lane (g = lane / 4, t = lane % 4) owns output columns
 * n0 + g and n0 + g + 8 and, of every K block of 4E elements (E = 32 for
 * 4-bit codes, 16 for 8-bit: one 16-byte chunk), the chunk k = 4E b + E t:
 * one 16-byte load per column, no repacking of the quantize pass's [N, K]
 * layout.  Which logical k of an mma an element stands for is free as long
 * as the weight (A operand) and x (B operand) agree, so each lane feeds
 * its own chunk's elements in the order the widening produces them, and
 * builds x's pairs in the same order with byte permutes:
 *   int4  a 32-bit word holds 8 codes e0..e7 (nibble i is element i); with
 *         (w & 0x000f000f) | 0x64006400 the halves are 1024 + e0 and
 *         1024 + e4 as f16 (the mantissa trick), with 0x00f000f0 they are
 *         1024 + 16 e1, 1024 + 16 e5, and the same on w >> 8 gives e2, e6
 *         and e3, e7; one sub.f16x2 (or fma.f16x2 by 1/16) removes 1024 and
 *         the code's bias (8 for the signed codes, after w ^ 0x88888888)
 *         and the zero point, exactly.  A word is two mma k-steps:
 *         (e0,e4), (e1,e5) then (e2,e6), (e3,e7) against x's pairs
 *         (x0,x4), (x1,x5), (x2,x6), (x3,x7).
 *   int8  prmt(w, 0x64646464) makes (1024 + b0, 1024 + b2) and
 *         (1024 + b1, 1024 + b3); one k-step a word, x as (x0,x2), (x1,x3).
 *   fp8   cvt.rn.f16x2.e4m3x2 / .e5m2x2 (sm_89+) widens (e0,e1), (e2,e3)
 *         exactly; x's pairs are its own.
 * Scales: when a K block lies in one group (G a multiple of 4E) the
 * block's mma steps add into a zeroed tile that is then scaled in f32
 * (per output column) into the accumulators, so the products are exact
 * and the scale costs 4 FFMA per block; otherwise (G a multiple of E
 * only) each widened pair is multiplied by its column's scale in f16
 * before the mma (mul.f16x2), which is what dequantize to f16 rounds.
 * The block's 16 columns' scales (and zero points) are staged in shared
 * memory once, at the start.
 * Memory: at decode the kernel is a stream of the weight, so each warp
 * keeps S - 1 K blocks in flight through a cp.async pipeline of S stages:
 * every lane copies its two 16-byte chunks (and, for g < M, its chunk of
 * x's row g, so that no load is left on the critical path) into its own
 * slots and later reads back only those, so cp.async.wait_group orders
 * the pipeline without a barrier.  A weight whose base is not 16-byte
 * aligned is copied with plain loads (one uniform test).
 * Warps: W warps of a block take the K blocks b = warp, warp + W, ...,
 * then add their tiles through shared memory in a fixed order and the
 * block's threads run the epilogue for the 16 x M results; when the
 * epilogue takes the halves of an interleaved gated pair (merge-matmuls:
 * SwiGLU's silu(x Wg) * (x Wu)), a thread takes columns 2j and 2j + 1
 * together and stores only their product (pair mode, as the float GEMV).
 * Not taken (qgemv.c or the simple kernel computes these): A not f16,
 * A an rms_norm computed in the loads (qgemv's norm mode), M > 8, zero
 * points of another dtype than the codes (float ones), fp8 with zero
 * points, groups smaller than a chunk, groups smaller than a K block with
 * scales that are not f16, a [K, N] weight.
 * Split-K (",sk=N", N > 1; grid.y = slice): slice y takes the K blocks
 * [y NBS, (y + 1) NBS) with NBS = ceil(NB / N), each block stores its
 * partial sums in the workspace and the last slice's block of a column
 * block adds them and runs the epilogue (gemv.c's split-K tail).  For a
 * grid of few column blocks (a down projection: N = 2048 is 128 blocks).
 * Parameters (token "qmma:w=4,s=4[,sk=2]"): W warps per block, S stages,
 * N slices; the stages, the staged scales and the reduction fit 48 KiB of
 * static shared memory.
 */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_families.h"

typedef struct {
  int warps, stages, sk; /* sk: slices of K (split-K; 1: none) */
} QmParams;

typedef struct {
  const CuGemm *gm;
  const QmParams *p;
  CuQuantB q;
  int64_t NB, NBS; /* K blocks, and K blocks a slice (split-K; NB without) */
  const char *qal; /* the weight's base is 16-byte aligned: "true" or a run-time test */
  bool block_scaled; /* a K block lies in one group: scale the block's tile in f32 */
  bool tail;         /* K is not a whole number of K blocks: chunks past K are masked */
  int M;
  const char *z;
} Qm;

/* Bytes of the block's staged scales (f32, or the f16 pairs' bits when
 * pairs are scaled in f16) and zero points (a byte each): 16 columns of
 * K / G groups. */
static int64_t staged_bytes(int64_t ng, bool block_scaled, bool zeros) {
  return 16 * ng * ((block_scaled ? 4 : 2) + (zeros ? 1 : 0));
}
#define QM_MAX_STAGED (16 * 1024)
/* Static shared memory a block may use (no opt-in needed). */
#define QM_MAX_SMEM (48 * 1024)

/* 16-byte packs of one warp's stage: a K block of both columns of each
 * lane (64), and x's chunks of the lanes g < M (E / 8 packs each). */
static int stage_packs(int M, int E) { return 64 + M * 4 * (E / 8); }

/* Shared memory of W warps with S stages, the staged scales and zeros,
 * and the warps' 16 x 8 tiles for the reduction. */
static int64_t smem_bytes(int W, int S, int M, int E, int64_t staged) {
  return (int64_t)W * S * stage_packs(M, E) * 16 + staged + (int64_t)W * 512;
}

static bool qm_eligible(const CuFn *f, const CuGemm *gm) {
  CuQuantB q;
  if (gm->at->dt != DT_F16 || !cu_quant_b(f, gm, &q)) return false;
  if (cu_gemv_norm_mode(f, gm)) return false; /* an rms_norm in the loads: qgemv's */
  if (cu_gemm_wants_pairs(f, gm) && gm->N % 2) return false; /* pair mode: columns 2j, 2j + 1 */
  /* integer zero points of the codes' own dtype only (folded into the exact subtraction) */
  if (q.z0 >= 0 && (dt_is_f8(q.qdt) || q.zdt != q.qdt)) return false;
  if (gm->K % q.E != 0 || gm->K % q.G != 0 || q.G % q.E != 0) return false;
  if (gm->K > (1 << 30)) return false; /* chunk and element indices are ints */
  /* pairs scaled in f16 (groups under a K block) round q s once, as
   * dequantize to f16 does, only with f16 scales: a scale rounded to f16
   * first would skew its whole group the same way */
  bool block_scaled = q.G % (4 * q.E) == 0;
  if (!block_scaled && q.sdt != DT_F16) return false;
  return staged_bytes(q.ng, block_scaled, q.z0 >= 0) <= QM_MAX_STAGED;
}

static bool qm_parse(const char *tok, QmParams *out) {
  int w, st, sk = 1, used = 0, used2 = 0;
  if (sscanf(tok, "qmma:w=%d,s=%d%n", &w, &st, &used) != 2) return false;
  if (tok[used] != 0 && (sscanf(tok + used, ",sk=%d%n", &sk, &used2) != 1 || tok[used + used2] != 0)) return false;
  if (w < 1 || w > 16 || st < 2 || st > 8 || sk < 2 * (tok[used] != 0) || sk > 16) return false;
  *out = (QmParams){w, st, sk};
  return true;
}

/* "qmma:w=4,s=4", with ",sk=N" for N > 1 slices of K */
static void qm_format(const QmParams *p, char out[CG_VARIANT_LEN]) {
  if (p->sk > 1) snprintf(out, CG_VARIANT_LEN, "qmma:w=%d,s=%d,sk=%d", p->warps, p->stages, p->sk);
  else snprintf(out, CG_VARIANT_LEN, "qmma:w=%d,s=%d", p->warps, p->stages);
}

/* K blocks (4 chunks of E elements) of the weight. */
static int64_t k_blocks(const CuGemm *gm, int E) { return (gm->K / E + 3) / 4; }

/* The staged bytes of q's kernel (see staged_bytes). */
static int64_t q_staged(const CuQuantB *q) { return staged_bytes(q->ng, q->G % (4 * q->E) == 0, q->z0 >= 0); }

/* Enough warps to fill the GPU (about 32 an SM on a 132-SM H200: 4096 in
 * all), but no more warps a block than K blocks: the smallest power of
 * two up to 8 that gets there; 4 stages (3 K blocks in flight a warp).
 * 4096 rather than 2048: `smelt tune --quantize` of W2 M=1 on an H100
 * (docs/perf.md, 2026-12-07) timed gate/up's merged N = 22016 (1376 tiles)
 * at w=2 34.7 us, w=4 29.3, w=8 30.3 (int4) and 37.3, 37.3, 34.5 (int8). */
static void qm_default(const CuFn *f, const CuGemm *gm, char out[CG_VARIANT_LEN]) {
  CuQuantB q;
  cu_quant_b(f, gm, &q); /* true: qm_eligible */
  int E = q.E;
  int64_t tiles = (gm->N + 15) / 16, nb = k_blocks(gm, E);
  int w = 1;
  while (w < 8 && tiles * w < 4096 && 2 * w <= nb) w *= 2;
  QmParams p = {w, 4, 1};
  /* M = 8 with 4-bit codes takes 3 KiB a stage and warp: fewer stages, then warps */
  int64_t staged = q_staged(&q);
  while (p.stages > 2 && smem_bytes(p.warps, p.stages, (int)gm->M, E, staged) > QM_MAX_SMEM) p.stages--;
  while (p.warps > 1 && smem_bytes(p.warps, p.stages, (int)gm->M, E, staged) > QM_MAX_SMEM) p.warps /= 2;
  qm_format(&p, out);
}

static int qm_candidates(const CuFn *f, const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max) {
  /* split-K (sk) for grids of few column blocks (a down projection: W5's
   * 128, W2's 256 blocks on 132 SMs), untimed when added: tuner only */
  static const QmParams alt[] = {{4, 4, 1}, {8, 4, 1}, {4, 6, 1}, {8, 3, 1}, {4, 3, 1}, {16, 2, 1}, {2, 8, 1},
                                 {8, 6, 1}, {4, 8, 1}, {8, 2, 1}, {8, 4, 2}, {4, 4, 2}, {8, 4, 4}, {4, 4, 4}};
  int n = 0;
  char d[CG_VARIANT_LEN];
  qm_default(f, gm, d);
  if (n < max) memcpy(out[n++], d, CG_VARIANT_LEN);
  CuQuantB q;
  cu_quant_b(f, gm, &q);
  int64_t staged = q_staged(&q);
  int E = q.E;
  for (size_t i = 0; i < sizeof alt / sizeof *alt && n < max; i++) {
    char tok[CG_VARIANT_LEN];
    qm_format(&alt[i], tok);
    /* a slice of K gives each warp two K blocks at least */
    if (alt[i].sk > 1 && k_blocks(gm, E) < 2LL * alt[i].sk * alt[i].warps) continue;
    if (strcmp(tok, d) != 0 && smem_bytes(alt[i].warps, alt[i].stages, (int)gm->M, E, staged) <= QM_MAX_SMEM)
      memcpy(out[n++], tok, CG_VARIANT_LEN);
  }
  return n;
}

/* What 1024 + code exceeds the value by, beyond 1024: the xor of the
 * signed codes adds 8 (int4) or 128 (int8). */
static int code_bias(DType qdt) { return qdt == DT_I4 ? 8 : qdt == DT_I8 ? 128 : 0; }

/* The lambdas the kernel calls: the f16x2 arithmetic, byte permutes, the
 * fp8 widening and mma.sync, as PTX on the device and, for the CPU
 * emulation, in float with round-to-nearest-even to f16 (every operation
 * here is exact or rounds once, as the PTX does) and mma through lane
 * shuffles after the PTX ISA's fragment layouts. */
static void helpers(CuFn *f, const Qm *v) {
  cu_line(f, "#ifndef __CUDA_ARCH__");
  cu_line(f, "auto emu_h = [](unsigned bits) -> float { __half h; h.x = (unsigned short)(bits & 0xffffu); return __half2float(h); };");
  cu_line(f, "auto emu_h2 = [](float lo, float hi) -> unsigned {");
  cu_line(f, "  return __half_as_ushort(__float2half_rn(lo)) | (unsigned)__half_as_ushort(__float2half_rn(hi)) << 16;");
  cu_line(f, "};");
  cu_line(f, "#endif");
  cu_line(f, "// a - b, a * b + c and a * b on f16 pairs");
  cu_open(f, "auto h2_sub = [&](unsigned a, unsigned b) -> unsigned");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "unsigned r;");
  cu_line(f, "asm(\"sub.f16x2 %%0, %%1, %%2;\" : \"=r\"(r) : \"r\"(a), \"r\"(b));");
  cu_line(f, "return r;");
  cu_line(f, "#else");
  cu_line(f, "return emu_h2(emu_h(a) - emu_h(b), emu_h(a >> 16) - emu_h(b >> 16));");
  cu_line(f, "#endif");
  f->indent--;
  cu_line(f, "};");
  cu_open(f, "auto h2_fma = [&](unsigned a, unsigned b, unsigned c) -> unsigned");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "unsigned r;");
  cu_line(f, "asm(\"fma.rn.f16x2 %%0, %%1, %%2, %%3;\" : \"=r\"(r) : \"r\"(a), \"r\"(b), \"r\"(c));");
  cu_line(f, "return r;");
  cu_line(f, "#else");
  cu_line(f, "return emu_h2(fmaf(emu_h(a), emu_h(b), emu_h(c)), fmaf(emu_h(a >> 16), emu_h(b >> 16), emu_h(c >> 16)));");
  cu_line(f, "#endif");
  f->indent--;
  cu_line(f, "};");
  cu_open(f, "auto h2_mul = [&](unsigned a, unsigned b) -> unsigned");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "unsigned r;");
  cu_line(f, "asm(\"mul.f16x2 %%0, %%1, %%2;\" : \"=r\"(r) : \"r\"(a), \"r\"(b));");
  cu_line(f, "return r;");
  cu_line(f, "#else");
  cu_line(f, "return emu_h2(emu_h(a) * emu_h(b), emu_h(a >> 16) * emu_h(b >> 16));");
  cu_line(f, "#endif");
  f->indent--;
  cu_line(f, "};");
  cu_line(f, "// bytes of (b:a) picked by the selector's nibbles (PRMT)");
  cu_open(f, "auto prmt = [](unsigned a, unsigned b, unsigned s) -> unsigned");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "return __byte_perm(a, b, s);");
  cu_line(f, "#else");
  cu_line(f, "const unsigned long long ab = (unsigned long long)b << 32 | a;");
  cu_line(f, "unsigned r = 0;");
  cu_line(f, "for (int i = 0; i < 4; i++) r |= (unsigned)(ab >> (8 * ((s >> (4 * i)) & 7u)) & 255u) << (8 * i);");
  cu_line(f, "return r;");
  cu_line(f, "#endif");
  f->indent--;
  cu_line(f, "};");
  if (dt_is_f8(v->q.qdt)) {
    const char *fmt = v->q.qdt == DT_F8E4M3 ? "e4m3" : "e5m2";
    cu_line(f, "// two fp8 codes (low byte first) to an f16 pair, exactly");
    cu_open(f, "auto f8x2 = [&](unsigned pair) -> unsigned");
    cu_line(f, "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890");
    cu_line(f, "unsigned r;");
    cu_line(f, "asm(\"cvt.rn.f16x2.%sx2 %%0, %%1;\" : \"=r\"(r) : \"h\"((unsigned short)pair));", fmt);
    cu_line(f, "return r;");
    cu_line(f, "#else");
    cu_line(f, "return __half_as_ushort(__float2half_rn(smelt_f8%s(pair & 255u))) |", fmt);
    cu_line(f, "       (unsigned)__half_as_ushort(__float2half_rn(smelt_f8%s((pair >> 8) & 255u))) << 16;", fmt);
    cu_line(f, "#endif");
    f->indent--;
    cu_line(f, "};");
  }
  cu_line(f, "// c += a b: mma.sync.m16n8k16, A row-major f16 (this lane: a[0] row g k 2t..2t+1, a[1] row g+8, a[2]");
  cu_line(f, "// row g k 2t+8.., a[3] row g+8 k 2t+8..), B col-major (b[0]: k 2t.. of column g, b[1]: k 2t+8..), f32 C");
  cu_line(f, "// (c[0], c[1]: row g, columns 2t, 2t+1; c[2], c[3]: row g+8)");
  cu_open(f, "auto mma = [&](float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2])");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_tc_mma_16816(f, false, "c", "a", "b[0]", "b[1]");
  cu_line(f, "#else");
  cu_line(f, "const int l = threadIdx.x %% 32, gg = l / 4, tt = l %% 4;");
  cu_line(f, "float A[2][16], B[2][16];  // rows gg, gg + 8 of A; columns 2tt, 2tt + 1 of B");
  cu_open(f, "for (int s = 0; s < 4; s++)");
  cu_line(f, "const unsigned long long a01 = __shfl_sync(0xffffffffu, (unsigned long long)a[1] << 32 | a[0], 4 * gg + s);");
  cu_line(f, "const unsigned long long a23 = __shfl_sync(0xffffffffu, (unsigned long long)a[3] << 32 | a[2], 4 * gg + s);");
  cu_line(f, "const unsigned long long b0 = __shfl_sync(0xffffffffu, (unsigned long long)b[1] << 32 | b[0], 4 * (2 * tt) + s);");
  cu_line(f, "const unsigned long long b1 = __shfl_sync(0xffffffffu, (unsigned long long)b[1] << 32 | b[0], 4 * (2 * tt + 1) + s);");
  cu_line(f, "const unsigned ra[4] = {(unsigned)a01, (unsigned)(a01 >> 32), (unsigned)a23, (unsigned)(a23 >> 32)};");
  cu_line(f, "const unsigned rb[2][2] = {{(unsigned)b0, (unsigned)(b0 >> 32)}, {(unsigned)b1, (unsigned)(b1 >> 32)}};");
  cu_open(f, "for (int h = 0; h < 2; h++)");
  cu_line(f, "A[h][2 * s] = emu_h(ra[h]), A[h][2 * s + 1] = emu_h(ra[h] >> 16);");
  cu_line(f, "A[h][2 * s + 8] = emu_h(ra[h + 2]), A[h][2 * s + 9] = emu_h(ra[h + 2] >> 16);");
  cu_line(f, "B[h][2 * s] = emu_h(rb[h][0]), B[h][2 * s + 1] = emu_h(rb[h][0] >> 16);");
  cu_line(f, "B[h][2 * s + 8] = emu_h(rb[h][1]), B[h][2 * s + 9] = emu_h(rb[h][1] >> 16);");
  cu_close(f);
  cu_close(f);
  cu_line(f, "for (int e = 0; e < 4; e++)");
  cu_line(f, "  for (int k = 0; k < 16; k++) c[e] += A[e / 2][k] * B[e %% 2][k];");
  cu_line(f, "#endif");
  f->indent--;
  cu_line(f, "};");
}

/* The constants subtracted from the widened codes of column j (the
 * chunk's group; with zero points those of the group, staged in zz):
 * off = 1024 + bias + z for the codes at 1024 + e, off16 = -(64 + bias +
 * z) for those at 1024 + 16 e (int4, after the multiply by 1/16). */
static void offsets(CuFn *f, const Qm *v) {
  if (dt_is_f8(v->q.qdt)) return;
  int bias = code_bias(v->q.qdt);
  bool int4 = dt_is_packed(v->q.qdt);
  if (v->q.z0 < 0) {
    cu_line(f, "const unsigned off = 0x%04x%04xu;  // (1024 + %d) twice", 0x6400 + bias, 0x6400 + bias, bias);
    if (int4) cu_line(f, "const unsigned off16[2] = {0x%04x%04xu, 0x%04x%04xu};  // -(64 + %d) twice", 0xd400 + bias * 16,
                      0xd400 + bias * 16, 0xd400 + bias * 16, 0xd400 + bias * 16, bias);
    return;
  }
  cu_line(f, "unsigned offz[2]%s;  // per column: 1024 + %d + z%s", int4 ? ", off16[2]" : "", bias,
          int4 ? "; -(64 + bias + z)" : "");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < 2; j++)");
  cu_line(f, "const float zf = (float)(%szz[(g + 8 * j) * %lld + k / %lld]);", v->q.qdt == DT_I8 || v->q.qdt == DT_I4 ? "(signed char)" : "",
          (long long)v->q.ng, (long long)v->q.G);
  cu_line(f, "const unsigned short o = __half_as_ushort(__float2half_rn(%d.0f + zf));", 1024 + bias);
  cu_line(f, "offz[j] = (unsigned)o | (unsigned)o << 16;");
  if (int4) {
    cu_line(f, "const unsigned short o16 = __half_as_ushort(__float2half_rn(-(%d.0f + zf)));", 64 + bias);
    cu_line(f, "off16[j] = (unsigned)o16 | (unsigned)o16 << 16;");
  }
  cu_close(f);
}

/* The widened pairs of word j of the chunk for column i into wp[i][...]:
 * 4 pairs (int4) or 2 (8-bit), in the order the mma steps take them. */
static void widen(CuFn *f, const Qm *v, bool scale_pairs) {
  const char *off = v->q.z0 >= 0 ? "offz[i]" : "off";
  const char *off16 = "off16[i]";
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < 2; i++)");
  switch (v->q.qdt) {
  case DT_I4:
  case DT_U4:
  {
    /* (w & mask) op magic in one LOP3: ptxas splits the C expression into
     * two (a LOP3 takes one immediate); op is ^ for the signed codes, whose
     * xor with 8 then happens inside the magic (the nibble's bits and
     * 0x6400's do not meet) */
    bool sgn = v->q.qdt == DT_I4;
    const char *lut = sgn ? "0x6a" : "0xea", *op = sgn ? "^" : "|";
    unsigned lo_magic = sgn ? 0x64086408u : 0x64006400u, hi_magic = sgn ? 0x64806480u : 0x64006400u;
    cu_line(f, "const unsigned w = wq[i].v[j], hi = w >> 8;");
    cu_line(f, "unsigned p[4];  // 1024 + code, 1024 + 16 code%s", sgn ? " (codes + 8: xor 8)" : "");
    cu_line(f, "#ifdef __CUDA_ARCH__");
    static const char *const src[4] = {"w", "w", "hi", "hi"};
    for (int q = 0; q < 4; q++)
      cu_line(f, "asm(\"lop3.b32 %%0, %%1, 0x%08x, 0x%08x, %s;\" : \"=r\"(p[%d]) : \"r\"(%s));", q % 2 ? 0x00f000f0u : 0x000f000fu,
              q % 2 ? hi_magic : lo_magic, lut, q, src[q]);
    cu_line(f, "#else");
    for (int q = 0; q < 4; q++)
      cu_line(f, "p[%d] = (%s & 0x%08xu) %s 0x%08xu;", q, src[q], q % 2 ? 0x00f000f0u : 0x000f000fu, op, q % 2 ? hi_magic : lo_magic);
    cu_line(f, "#endif");
    cu_line(f, "wp[i][0] = h2_sub(p[0], %s);                 // (e0, e4)", off);
    cu_line(f, "wp[i][1] = h2_fma(p[1], 0x2c002c00u, %s);  // (e1, e5): x 1/16", off16);
    cu_line(f, "wp[i][2] = h2_sub(p[2], %s);                 // (e2, e6)", off);
    cu_line(f, "wp[i][3] = h2_fma(p[3], 0x2c002c00u, %s);  // (e3, e7)", off16);
  }
    break;
  case DT_I8:
  case DT_U8:
    cu_line(f, "const unsigned w = wq[i].v[j]%s;", v->q.qdt == DT_I8 ? " ^ 0x80808080u" : "");
    cu_line(f, "wp[i][0] = h2_sub(prmt(w, 0x64646464u, 0x4240u), %s);  // (b0, b2)", off);
    cu_line(f, "wp[i][1] = h2_sub(prmt(w, 0x64646464u, 0x4341u), %s);  // (b1, b3)", off);
    break;
  default:
    cu_line(f, "const unsigned w = wq[i].v[j];");
    cu_line(f, "wp[i][0] = f8x2(w & 0xffffu);  // (e0, e1)");
    cu_line(f, "wp[i][1] = f8x2(w >> 16);      // (e2, e3)");
  }
  int np = dt_is_packed(v->q.qdt) ? 4 : 2;
  if (scale_pairs) {
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int p = 0; p < %d; p++) wp[i][p] = h2_mul(wp[i][p], sc2[i]);", np);
  }
  if (v->tail) {
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int p = 0; p < %d; p++) wp[i][p] = ok ? wp[i][p] : 0u;  // a chunk past K", np);
  }
  cu_close(f);
}

/* The mma steps of word j of the chunk into `c`: x's pairs built from xw
 * in the widening's order. */
static void word_steps(CuFn *f, const Qm *v, const char *c) {
  cu_line(f, "unsigned wp[2][4];");
  widen(f, v, !v->block_scaled);
  switch (v->q.qdt) {
  case DT_I4:
  case DT_U4:
    cu_line(f, "const unsigned *xj = &xw[4 * j];  // x[8j .. 8j+7] as 4 pairs");
    cu_line(f, "const unsigned xb[4] = {prmt(xj[0], xj[2], 0x5410u), prmt(xj[0], xj[2], 0x7632u), prmt(xj[1], xj[3], 0x5410u), "
               "prmt(xj[1], xj[3], 0x7632u)};  // (x0,x4) (x1,x5) (x2,x6) (x3,x7)");
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int h = 0; h < 2; h++)");
    cu_line(f, "const unsigned a[4] = {wp[0][2 * h], wp[1][2 * h], wp[0][2 * h + 1], wp[1][2 * h + 1]};");
    cu_line(f, "const unsigned b[2] = {xb[2 * h], xb[2 * h + 1]};");
    cu_line(f, "mma(%s[h], a, b);  // two chains of sums: half the dependent mma", c);
    cu_close(f);
    break;
  case DT_I8:
  case DT_U8:
    cu_line(f, "const unsigned *xj = &xw[2 * j];  // x[4j .. 4j+3] as 2 pairs");
    cu_open(f, "%s", "");
    cu_line(f, "const unsigned a[4] = {wp[0][0], wp[1][0], wp[0][1], wp[1][1]};");
    cu_line(f, "const unsigned b[2] = {prmt(xj[0], xj[1], 0x5410u), prmt(xj[0], xj[1], 0x7632u)};  // (x0,x2) (x1,x3)");
    cu_line(f, "mma(%s[j & 1], a, b);  // two chains of sums: half the dependent mma", c);
    cu_close(f);
    break;
  default:
    cu_open(f, "%s", "");
    cu_line(f, "const unsigned a[4] = {wp[0][0], wp[1][0], wp[0][1], wp[1][1]};");
    cu_line(f, "const unsigned b[2] = {xw[2 * j], xw[2 * j + 1]};  // (x0,x1) (x2,x3)");
    cu_line(f, "mma(%s[j & 1], a, b);  // two chains of sums: half the dependent mma", c);
    cu_close(f);
  }
}

/* xw[0 .. E/2): A[g][k .. k + E) as f16 pairs (zeros for g >= M and for a
 * chunk past K), through L1 (every warp of the SM reads the same x). */
static void load_x(CuFn *f, const Qm *v, bool packs) {
  const CuGemm *gm = v->gm;
  int E = v->q.E;
  cu_line(f, "unsigned xw[%d];", E / 2);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < %d; e++) xw[e] = 0u;", E / 2);
  cu_open(f, "if (g < %d%s)", v->M, v->tail ? " && ok" : "");
  if (packs) {
    cu_line(f, "const smelt_pack<unsigned, 4> *xp = &stage[64 + (g * 4 + t) * %d];  // copied with the weights", E / 8);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int p = 0; p < %d; p++)", E / 8);
    cu_line(f, "const smelt_pack<unsigned, 4> q = xp[p];");
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int e = 0; e < 4; e++) xw[4 * p + e] = q.v[e];");
    cu_close(f);
  } else {
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int e = 0; e < %d; e++)", E);
    if (v->q.a0 >= 0) {
      cu_line(f, "const unsigned short h = __half_as_ushort(X[g * %lldLL + k + e]);", (long long)gm->K);
    } else {
      CuVal x;
      gm->load_a(f, gm, v->z, "g", "(k + e)", &x);
      cu_line(f, "const unsigned short h = __half_as_ushort(__float2half_rn((float)%s));", x.l[0]);
    }
    cu_line(f, "xw[e / 2] |= (unsigned)h << (16 * (e %% 2));");
    cu_close(f);
  }
  cu_close(f);
}

/* The copies of this lane's chunk of K block warp + W * (it) (when `ok`)
 * for both its columns into stage `slot`, as one cp.async group. */
static void issue(CuFn *f, const Qm *v, const char *it, const char *slot, const char *ok, bool packs) {
  int W = v->p->warps, SP = stage_packs(v->M, v->q.E), XP = v->q.E / 8;
  cu_open(f, "%s", "");
  cu_line(f, "const int c = (kb0 + warp + %d * (%s)) * 4 + t;", W, it);
  cu_line(f, "const int cc = c < %lld ? c : %lld;  // past K: a valid address, zero-filled or unused", (long long)v->q.KC,
          (long long)v->q.KC - 1);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < 2; i++)");
  cu_line(f, "smelt_pack<unsigned, 4> *dst = &mine[(%s) * %d + i * 32];", slot, SP);
  cu_tc_cp_async16(f, "reinterpret_cast<unsigned short *>(dst)", "reinterpret_cast<const unsigned short *>(qrow[i] + cc * 16)",
                   ok, v->qal);
  cu_close(f);
  if (packs) {
    cu_line(f, "// x[g][k .. k + %d) for the lanes g < M, in the same group", v->q.E);
    cu_open(f, "if (g < %d)", v->M);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int p = 0; p < %d; p++)", XP);
    cu_line(f, "smelt_pack<unsigned, 4> *dst = &mine[(%s) * %d + 64 - lane + (g * 4 + t) * %d + p];", slot, SP, XP);
    cu_tc_cp_async16(f, "reinterpret_cast<unsigned short *>(dst)",
                     cu_fmt(f, "reinterpret_cast<const unsigned short *>(X + g * %lldLL + cc * %d + p * 8)", (long long)v->gm->K, v->q.E),
                     ok, "true");
    cu_close(f);
    cu_close(f);
  }
  cu_close(f);
  cu_tc_commit_group(f);
}

/* ss[r * ng + h] (and zz): the scales (zero points) of the block's 16
 * columns n0 + r (past N: the last one), loaded once by the block.  Each
 * thread issues up to QM_STAGE_BATCH loads before it stores any: a loop
 * of load-then-store would wait for memory once per element (at decode,
 * several microseconds of a kernel that moves its weight in ten). */
#define QM_STAGE_BATCH 8
static void stage_scales(CuFn *f, const Qm *v) {
  int64_t n = 16 * v->q.ng;
  int T = 32 * v->p->warps, B = QM_STAGE_BATCH;
  bool zeros = v->q.z0 >= 0;
  cu_open(f, "for (int e0 = threadIdx.x; e0 < %lld; e0 += %d)", (long long)n, B * T);
  cu_line(f, "%s sv[%d];", v->block_scaled ? "float" : "unsigned short", B);
  if (zeros) cu_line(f, "unsigned char zv[%d];", B);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", B);
  cu_line(f, "const int e = e0 + r * %d;", T);
  cu_line(f, "const long long col = n0 + e / %lld < %lldLL ? n0 + e / %lld : %lldLL, i = col * %lld + (e < %lld ? e : 0) %% %lld;",
          (long long)v->q.ng, (long long)v->gm->N, (long long)v->q.ng, (long long)v->gm->N - 1, (long long)v->q.ng,
          (long long)n, (long long)v->q.ng);
  const char *sv = cu_from_storage(f, v->q.sdt, "S[i]");
  if (v->block_scaled) cu_line(f, "sv[r] = %s;", sv);
  else cu_line(f, "sv[r] = __half_as_ushort(S[i]);  // f16 scales (qm_eligible)");
  if (zeros) {
    const char *z = dt_is_packed(v->q.qdt) ? cu_fmt(f, "%s(Z, i)", v->q.qdt == DT_I4 ? "smelt_i4" : "smelt_u4") : "Z[i]";
    cu_line(f, "zv[r] = (unsigned char)%s;", z);
  }
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", B);
  cu_line(f, "const int e = e0 + r * %d;", T);
  cu_open(f, "if (e < %lld)", (long long)n);
  cu_line(f, "ss[e] = sv[r];");
  if (zeros) cu_line(f, "zz[e] = zv[r];");
  cu_close(f);
  cu_close(f);
  cu_close(f);
}

/* The warp's stream over its K blocks into acc: a cp.async pipeline of S
 * stages per warp (each lane copies and later reads only its own chunks,
 * so cp.async.wait_group orders it without a barrier). */
static void stream(CuFn *f, const Qm *v, bool packs) {
  int W = v->p->warps, S = v->p->stages, E = v->q.E;
  cu_line(f, "const int nit = warp < kbn ? (kbn - warp + %d) / %d : 0;  // this warp's K blocks of the slice", W - 1, W);
  cu_line(f, "smelt_pack<unsigned, 4> *mine = &qs[warp * %d + lane];  // this lane's slot of the warp's first stage", S * stage_packs(v->M, E));
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int s = 0; s < %d; s++)", S - 1);
  issue(f, v, "s", "s", "s < nit", packs);
  cu_close(f);
  cu_line(f, "// the block's scales, while the first K blocks are in flight");
  stage_scales(f, v);
  cu_line(f, "__syncthreads();  // the staged scales");
  cu_line(f, "int rd = 0, wr = %d;  // the stage read this step, the one refilled", S - 1);
  cu_open(f, "for (int it = 0; it < nit; it++)");
  cu_tc_wait_group(f, S - 2);
  cu_line(f, "// K block it has landed (this lane's copies); its stage's buffer was read in the last step, so refill");
  cu_line(f, "// the one of the step before with block it + %d", S - 1);
  issue(f, v, cu_fmt(f, "it + %d", S - 1), "wr", cu_fmt(f, "it + %d < nit", S - 1), packs);
  cu_line(f, "const int b = kb0 + warp + %d * it, c = b * 4 + t;  // the K block, this lane's chunk", W);
  if (v->tail) cu_line(f, "const bool ok = c < %lld;", (long long)v->q.KC);
  cu_line(f, "const int k = (c < %lld ? c : %lld) * %d;", (long long)v->q.KC, (long long)v->q.KC - 1, E);
  cu_line(f, "const smelt_pack<unsigned, 4> *stage = mine + rd * %d - lane;", stage_packs(v->M, E));
  cu_line(f, "rd = rd == %d ? 0 : rd + 1, wr = wr == %d ? 0 : wr + 1;", S - 1, S - 1);
  cu_line(f, "smelt_pack<unsigned, 4> wq[2];");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < 2; i++) wq[i] = stage[i * 32 + lane];");
  load_x(f, v, packs);
  if (v->block_scaled) {
    cu_line(f, "const float sc[2] = {ss[g * %lld + b * %d / %lld], ss[(g + 8) * %lld + b * %d / %lld]};  // the block's group's",
            (long long)v->q.ng, 4 * E, (long long)v->q.G, (long long)v->q.ng, 4 * E, (long long)v->q.G);
  } else {
    cu_line(f, "const unsigned sc2[2] = {ss[g * %lld + k / %lld] * 0x10001u, ss[(g + 8) * %lld + k / %lld] * 0x10001u};  // f16 pairs",
            (long long)v->q.ng, (long long)v->q.G, (long long)v->q.ng, (long long)v->q.G);
  }
  offsets(f, v);
  const char *c = "acc";
  if (v->block_scaled) {
    cu_line(f, "float tile[2][4] = {};  // the block's sums (two chains), scaled below");
    c = "tile";
  }
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < 4; j++)");
  word_steps(f, v, c);
  cu_close(f);
  if (v->block_scaled) {
    cu_line(f, "acc[0][0] += (tile[0][0] + tile[1][0]) * sc[0], acc[0][1] += (tile[0][1] + tile[1][1]) * sc[0];");
    cu_line(f, "acc[0][2] += (tile[0][2] + tile[1][2]) * sc[1], acc[0][3] += (tile[0][3] + tile[1][3]) * sc[1];");
  }
  cu_close(f);
  cu_tc_wait_group(f, 0);
}

/* Before the kernel waits for its predecessor (CuLaunch.pre_wait): when
 * the weight is a constant, each lane asks L2 for its first chunk of its
 * two columns. */
static const char *qm_prefetch(CuFn *f, const Qm *v) {
  const CuGemm *gm = v->gm;
  CuPrefetch mode = cu_gemm_prefetch_mode();
  if (gm->Z != 1 || f->g->val[v->q.dq->in[0]].kind != VK_CONST || mode == CU_PREFETCH_NONE) return NULL;
  if (mode == CU_PREFETCH_ALL && v->q.row_bytes % 16 == 0 && 16 * v->q.row_bytes < (1LL << 31))
    return cu_fmt(f,
                  "  {  // the weight is a constant: before the wait, the block's 16 columns (contiguous rows) toward L2\n"
                  "    const long long n0 = (long long)blockIdx.x * 16;\n"
                  "    if (threadIdx.x == 0 && smelt_aligned(a%d, 16))\n"
                  "      smelt_prefetch_l2_bulk(reinterpret_cast<const unsigned char *>(a%d) + n0 * %lldLL,\n"
                  "                             (unsigned)((%lldLL - n0 < 16 ? %lldLL - n0 : 16) * %lldLL));\n"
                  "  }\n",
                  v->q.q0, v->q.q0, (long long)v->q.row_bytes, (long long)gm->N, (long long)gm->N, (long long)v->q.row_bytes);
  return cu_fmt(f,
                "  {  // the weight is a constant: before the wait, this lane's first chunk of its two columns toward L2\n"
                "    const long long c = ((long long)blockIdx.y * %lldLL + threadIdx.x / 32) * 4 + threadIdx.x %% 4;\n"
                "    #pragma unroll\n"
                "    for (int j = 0; j < 2; j++) {\n"
                "      const long long n = (long long)blockIdx.x * 16 + (threadIdx.x %% 32) / 4 + 8 * j;\n"
                "      if (n < %lldLL && c < %lldLL) smelt_prefetch_l2(reinterpret_cast<const unsigned char *>(a%d) + n * %lldLL + c * 16);\n"
                "    }\n"
                "  }\n",
                (long long)v->NBS, (long long)gm->N, (long long)v->q.KC, v->q.q0, (long long)v->q.row_bytes);
}

static void qm_emit_kernel(CuFn *f, const CuGemm *gm, const QmParams *p, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  Qm v = {.gm = gm, .p = p, .M = (int)gm->M};
  cu_quant_b(f, gm, &v.q); /* true: qm_eligible */
  const Node *dq = v.q.dq;
  const Value *av = &g->val[gm->an->in[0]];
  v.NB = k_blocks(gm, v.q.E);
  v.NBS = (v.NB + p->sk - 1) / p->sk;
  v.tail = v.q.KC % 4 != 0;
  v.block_scaled = v.q.G % (4 * v.q.E) == 0;
  v.qal = f->opt && f->opt->args_aligned ? "true" : "qal";
  int W = p->warps, S = p->stages;
  qm_format(p, l->variant);
  l->kind = "matmul";
  int64_t gx = (gm->N + 15) / 16, staged = staged_bytes(v.q.ng, v.block_scaled, v.q.z0 >= 0);
  if (gx > 0x7fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "a %lld x %lld weight exceeds the quantised GEMV's grid", (long long)gm->N, (long long)gm->K);
    return;
  }
  if (smem_bytes(W, S, v.M, v.q.E, staged) > QM_MAX_SMEM) {
    cu_fail(f, ST_UNSUPPORTED, "%s needs %lld bytes of shared memory (at most %d)", l->variant,
            (long long)smem_bytes(W, S, v.M, v.q.E, staged), QM_MAX_SMEM);
    return;
  }
  l->block[0] = (unsigned)(32 * W);
  l->grid[0] = (unsigned)gx;
  l->grid[1] = (unsigned)p->sk;
  l->grid[2] = (unsigned)(gm->Z < 1 ? 1 : gm->Z > 65535 ? 65535 : gm->Z);
  uint64_t part_off;
  l->workspace = cu_gemm_split_workspace(gm, gx, p->sk, &part_off);
  l->pre_wait = qm_prefetch(f, &v);
  if (gm->Z == 0) return;
  cu_line(f, "// variant: quantised GEMV on the tensor cores for M = %d (decode): %s (%s [N, K], a scale%s per %lld of K)", v.M,
          g->val[dq->in[0]].name, dt_name(v.q.qdt), v.q.z0 >= 0 ? " and a zero point" : "", (long long)v.q.G);
  cu_line(f, "// widened to f16 in registers, mma.sync.m16n8k16 with f32 sums; block b owns columns 16 b .. 16 b + 15,");
  cu_line(f, "// its %d warps the K blocks of %d elements warp, warp + %d, ... through %d cp.async stages (%s)", W, 4 * v.q.E, W, S,
          v.block_scaled ? "each block's tile scaled in f32" : "pairs scaled in f16");
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32, g = lane / 4, t = lane %% 4;");
  helpers(f, &v);
  int SP = stage_packs(v.M, v.q.E);
  cu_line(f, "__shared__ smelt_pack<unsigned, 4> qs[%d];  // [warp][stage]: [column 0/1][lane] chunks, then x's [g][t][%d]",
          W * S * SP, v.q.E / 8);
  cu_line(f, "__shared__ float red[%d];  // each warp's 16 x 8 tile", W * 128);
  cu_line(f, "__shared__ %s ss[%lld];  // the block's scales [16][K / G]", v.block_scaled ? "float" : "unsigned short",
          (long long)(16 * v.q.ng));
  if (v.q.z0 >= 0) cu_line(f, "__shared__ unsigned char zz[%lld];  // and zero points", (long long)(16 * v.q.ng));
  if (p->sk > 1)
    cu_line(f, "float *const part = reinterpret_cast<float *>(ws + %lluULL);  // split-K partial sums [Z][%d][M][N]",
            (unsigned long long)part_off, p->sk);
  cu_line(f, "const int kb0 = blockIdx.y * %lld, kbn = %lld - kb0 < %lld ? %lld - kb0 : %lld;  // this slice's K blocks",
          (long long)v.NBS, (long long)v.NB, (long long)v.NBS, (long long)v.NB, (long long)v.NBS);
  v.z = cu_tmp(f);
  cu_open(f, "for (%s %s = blockIdx.z; %s < %lld; %s += gridDim.z)", f->idx, v.z, v.z, (long long)gm->Z, v.z);
  /* ranged dims: a batch past this run's rows is skipped by the whole
   * block (before any barrier); ranged rows (M <= 8) are all computed (the
   * weight's bytes are the cost) and only this run's are stored */
  const char *past = cu_gemm_batch_past(f, gm, v.z);
  if (past) cu_line(f, "if (%s) continue;  // ranged dims: this batch holds none of this run's rows", past);
  if (v.q.a0 >= 0)
    cu_line(f, "const __half *X = a%d + %s;  // %s", v.q.a0, cu_gemm_batch_offset(f, gm, v.z, gm->at), av->name);
  cu_line(f, "const %s *S = a%d;  // %s", cu_stype(v.q.sdt), v.q.s0, g->val[dq->in[1]].name);
  if (v.q.z0 >= 0) cu_line(f, "const %s *Z = a%d;  // %s", cu_stype(g->val[dq->in[2]].type.dt), v.q.z0, g->val[dq->in[2]].name);
  cu_line(f, "const long long n0 = (long long)blockIdx.x * 16;");
  if (strcmp(v.qal, "true") != 0) cu_line(f, "const bool qal = smelt_aligned(a%d, 16);  // else plain loads", v.q.q0);
  cu_line(f, "const unsigned char *qrow[2];  // this lane's columns (past N: the last one, its sums unused)");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < 2; j++) qrow[j] = reinterpret_cast<const unsigned char *>(a%d) + "
             "(n0 + g + 8 * j < %lldLL ? n0 + g + 8 * j : %lldLL) * %lldLL;",
          v.q.q0, (long long)gm->N, (long long)gm->N - 1, (long long)v.q.row_bytes);
  cu_line(f, "float acc[2][4] = {};  // two chains of sums (pairs scaled in f16), else acc[0]");
  if (v.q.a0 >= 0) {
    cu_open(f, "if (smelt_aligned(X, 16))");
    stream(f, &v, true);
    cu_close(f);
    cu_open(f, "else");
    stream(f, &v, false);
    cu_close(f);
  } else {
    stream(f, &v, false);
  }
  cu_line(f, "// the warps' tiles, added in warp order; row r of a tile is column n0 + r, column m is A's row m");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 4; e++) acc[0][e] += acc[1][e];");
  cu_line(f, "red[warp * 128 + g * 8 + 2 * t] = acc[0][0], red[warp * 128 + g * 8 + 2 * t + 1] = acc[0][1];");
  cu_line(f, "red[warp * 128 + (g + 8) * 8 + 2 * t] = acc[0][2], red[warp * 128 + (g + 8) * 8 + 2 * t + 1] = acc[0][3];");
  cu_line(f, "__syncthreads();");
  /* pair mode (the halves of a gated pair in the epilogue): a thread
   * takes columns r and r + 1 (N is even, n0 a multiple of 16) */
  bool pairs = cu_gemm_wants_pairs(f, gm);
  int E = pairs ? 2 : 1;
  cu_open(f, "for (int i = threadIdx.x; i < %d; i += %d)", 16 / E * v.M, 32 * W);
  const char *m = cu_tmp(f), *n = cu_tmp(f);
  cu_line(f, "const int r = i / %d%s;", v.M, pairs ? " * 2" : "");
  cu_line(f, "const %s %s = i %% %d, %s = (%s)(n0 + r);", f->idx, m, v.M, n, f->idx);
  cu_line(f, "float s = 0.0f%s;", pairs ? ", s1 = 0.0f" : "");
  cu_line(f, "for (int w = 0; w < %d; w++) s += red[w * 128 + r * 8 + %s]%s;", W, m,
          pairs ? cu_fmt(f, ", s1 += red[w * 128 + (r + 1) * 8 + %s]", m) : "");
  cu_open(f, "if (%s < %lld)", n, (long long)gm->N);
  if (p->sk > 1) {
    /* this slice's sums; the last slice's block adds them (cu_gemm_split_tail) */
    const char *at = cu_fmt(f, "part[((%s * %dLL + blockIdx.y) * %lldLL + %s) * %lldLL + %s", v.z, p->sk, (long long)gm->M, m,
                            (long long)gm->N, n);
    cu_line(f, "%s] = s;", at);
    if (pairs) cu_line(f, "%s + 1] = s1;", at);
  } else if (pairs) {
    cu_gemm_store_pair_at(f, gm, v.z, m, n, "s", "s1", epi, nepi);
  } else {
    cu_gemm_store_at(f, gm, v.z, m, n, "s", epi, nepi);
  }
  cu_close(f);
  cu_close(f);
  if (p->sk > 1) cu_gemm_split_tail(f, gm, v.z, p->sk, gx, pairs, "n0", 16, 32 * W, epi, nepi);
  cu_line(f, "__syncthreads();  // red, ss and qs are reused by the next matrix");
  cu_close(f); /* z */
}

/* ---- the family's entry (cu_families.h) ---- */

static bool qm_emit(CuFn *f, const CuGemm *gm, const char *tok, const int *epi, int nepi, CuLaunch *l) {
  QmParams p;
  if (!qm_parse(tok, &p)) return false;
  qm_emit_kernel(f, gm, &p, epi, nepi, l);
  return true;
}

const CuGemmFamily cu_family_qmma = {"qmma", qm_eligible, qm_default, qm_candidates, qm_emit};
