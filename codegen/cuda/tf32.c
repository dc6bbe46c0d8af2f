/* The TF32 tensor-core matmul: f32 operands rounded to TF32 (10-bit
 * mantissa) in the tensor cores, f32 accumulation, sm_80+.  Used only when
 * the user allows it (CgCudaOptions.allow_tf32, `smelt compile
 * --allow-tf32`, like torch.backends.cuda.matmul.allow_tf32): the result
 * is then about as exact as a product of TF32 inputs (relative error
 * ~1e-3), not the f32 product the reference computes.
 *
 * The kernel follows mma.c's: a block computes a BM x BN tile of C = A B
 * (per batch z, grid.z) with (BM/WM) x (BN/WN) warps, each owning a WM x WN
 * sub-tile of f32 accumulators in m16n8 fragments.  Along K, tiles of A and
 * B go global -> shared with 16-byte cp.async (4 floats), `stages` buffers
 * deep, one __syncthreads per tile.  Fragments come from shared memory with
 * plain 4- and 8-byte ld.shared (ldmatrix moves 16-bit elements), each
 * value rounded with cvt.rna.tf32.f32 as it is loaded, and every k8 step
 * issues (WM/16) x (WN/8) mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32.
 * Registers: a 64 x 64 warp tile holds 128 accumulators, so the A
 * fragments of a step are loaded first and B's one n8 tile at a time, and
 * a thread's cp.async chunks of a tile share one 64-bit address plus
 * constant offsets (186 registers, no spills, at 128 x 256 on sm_90a).
 *
 * Fragments and the order of k: the MMA sums over the 8 k of a step, in
 * any order, as long as A and B agree on it.  Logical k = t and t + 4
 * (t = lane % 4; the fragment layout puts them in registers a0/a2 of A and
 * b0/b1 of B) are read from physical k = 2t and 2t + 1, so that an
 * operand stored k-contiguous (A [M, K], B [N, K]) gives both of a lane's
 * values with one 8-byte load.  Operands stored with k as rows (A given
 * [K, M], transpose_a; B given [K, N]) are read with 4-byte loads.
 *
 * Shared-memory rows are padded against bank conflicts: k-contiguous tiles
 * [rows][BK + 8] (BK a multiple of 16: the row stride is 8 or 24 banks
 * mod 32, so the 16 lanes of a half-warp's 8-byte loads, rows g = 0..3 at
 * columns 2t, 2t+1, cover 32 distinct banks); k-row tiles [BK][cols + 4]
 * (rows 2t, t = 0..3, are 8 banks apart and the 8 columns g fill them).
 *
 * Ragged edges: the contiguous dim of each operand must be a multiple of 4
 * floats (16-byte rows: K for A [M, K] and B [N, K], M for A [K, M], N for
 * B [K, N]; eligibility checks it), so a 16-byte chunk is wholly inside
 * the matrix or wholly outside; outside chunks are zero-filled (cp.async
 * with a source size of 0), so rows beyond M/N and k beyond K add nothing,
 * and stores are guarded.  Without the alignment guarantee
 * (CgCudaOptions.args_aligned) a uniform branch tests the operand pointers
 * once and copies with plain loads when they are not 16-byte aligned.
 * The epilogue is mma.c's: the group's elementwise consumers on each f32
 * accumulator through cu_store_epilogue (pairs of columns when the
 * arguments are aligned and N is even).
 *
 * The PTX is under #ifdef __CUDA_ARCH__; on the host (the CPU emulation of
 * tests/gpu/cuda_emu.hpp) the rounding is done with integer operations
 * (cvt.rna: round to nearest, ties away from zero, on the low 13 mantissa
 * bits) and the MMA assembles its rows and columns from the fragments
 * other lanes would hold (evaluating their addresses), after the PTX ISA's
 * layouts, so the indexing and the rounding are tested without a GPU.
 */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_families.h"

static bool is_arg_value(const CuFn *f, int v) {
  const Value *val = &f->g->val[v];
  if (f->arg_of[v] < 0) return false;
  return !(val->kind == VK_NODE && f->member[val->node]);
}

bool cu_tf32_eligible(const CuFn *f, const CuGemm *gm) {
  const Node *an = gm->an;
  if (!f->opt || !f->opt->allow_tf32) return false;
  if (an->op != OP_MATMUL) return false;
  if (gm->yt->dt != DT_F32 || gm->at->dt != DT_F32 || gm->bt->dt != DT_F32) return false;
  if (gm->a1 || gm->b1) return false;
  if (gm->M < 1 || gm->N < 1) return false;
  /* 16-byte rows: the contiguous dim of each operand a multiple of 4 */
  if ((gm->ta ? gm->M : gm->K) % 4 != 0) return false;
  if ((gm->tb ? gm->K : gm->N) % 4 != 0) return false;
  /* the operands are read straight from memory with cp.async */
  return is_arg_value(f, an->in[0]) && is_arg_value(f, an->in[1]);
}

/* Blocks that fill the GPU once (132 SMs on an H200). */
#define TF32_TARGET_BLOCKS 132

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t tiles_of(const CuGemm *gm, int BM, int BN) {
  return ceil_div(gm->M, BM) * ceil_div(gm->N, BN) * (gm->Z < 1 ? 1 : gm->Z);
}

void cu_tf32_default_params(const CuGemm *gm, CuTf32Params *out) {
  /* As mma.c: a flat tile for few rows; 8 warps of 64 x 64 on 128 x 256
   * when that gives the GPU enough blocks (3 stages of BK 32: 180 KiB),
   * else 8 warps of 64 x 32 on 128 x 128. */
  if (gm->M <= 32) *out = (CuTf32Params){32, 128, 32, 32, 32, 4};
  else if (gm->M <= 64) *out = (CuTf32Params){64, 128, 32, 32, 64, 4};
  else if (tiles_of(gm, 128, 256) >= TF32_TARGET_BLOCKS) *out = (CuTf32Params){128, 256, 32, 64, 64, 3};
  else *out = (CuTf32Params){128, 128, 32, 64, 32, 3};
}

bool cu_tf32_parse(const char *tok, CuTf32Params *out) {
  CuTf32Params p;
  int used = 0;
  if (sscanf(tok, "tf32:bm=%d,bn=%d,bk=%d,wm=%d,wn=%d,st=%d%n", &p.BM, &p.BN, &p.BK, &p.WM, &p.WN, &p.stages, &used) != 6 ||
      tok[used] != 0)
    return false;
  if (p.WM < 16 || p.WM % 16 || p.WN < 8 || p.WN % 8 || p.BM < p.WM || p.BM % p.WM || p.BN < p.WN || p.BN % p.WN)
    return false;
  /* at most 128 f32 accumulators per thread (64 x 64 per warp) */
  if (p.WM * p.WN > 64 * 64 || p.BM > 256 || p.BN > 256) return false;
  /* BK a multiple of 16: the padded row stride (BK + 8) stays conflict-free */
  if (p.BK < 16 || p.BK % 16 || p.BK > 64 || p.stages < 2 || p.stages > 8) return false;
  if (32 * (p.BM / p.WM) * (p.BN / p.WN) > 1024) return false;
  *out = p;
  return true;
}

void cu_tf32_format(const CuTf32Params *p, char out[CG_VARIANT_LEN]) {
  snprintf(out, CG_VARIANT_LEN, "tf32:bm=%d,bn=%d,bk=%d,wm=%d,wn=%d,st=%d", p->BM, p->BN, p->BK, p->WM, p->WN,
           p->stages);
}

int cu_tf32_candidates(const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max) {
  CuTf32Params d;
  cu_tf32_default_params(gm, &d);
  CuTf32Params list[16];
  int n = 0;
  list[n++] = d;
  static const CuTf32Params alt[] = {
      {128, 256, 32, 64, 64, 3}, {256, 128, 32, 64, 64, 3}, {128, 256, 16, 64, 64, 4}, {128, 128, 32, 64, 32, 3},
      {128, 128, 16, 64, 32, 4}, {128, 128, 32, 64, 64, 4}, {64, 128, 32, 32, 64, 4},  {64, 64, 32, 32, 32, 4},
      {32, 128, 32, 32, 32, 4},
  };
  for (size_t i = 0; i < sizeof alt / sizeof *alt; i++) {
    /* a tile much taller than the matrix only wastes work */
    if (alt[i].BM > 2 * gm->M && alt[i].BM > 32) continue;
    list[n++] = alt[i];
  }
  int got = 0;
  for (int i = 0; i < n && got < max; i++) {
    char tok[CG_VARIANT_LEN];
    cu_tf32_format(&list[i], tok);
    bool dup = false;
    for (int j = 0; j < got && !dup; j++) dup = strcmp(out[j], tok) == 0;
    if (!dup) memcpy(out[got++], tok, CG_VARIANT_LEN);
  }
  return got;
}

/* Padded row strides (floats) of the shared tiles: k-contiguous rows get
 * BK + 8, k-rows get cols + 4 (the file comment says why). */
static int a_stride(const CuGemm *gm, const CuTf32Params *p) { return gm->ta ? p->BM + 4 : p->BK + 8; }
static int b_stride(const CuGemm *gm, const CuTf32Params *p) { return gm->tb ? p->BK + 8 : p->BN + 4; }
static int a_stage(const CuGemm *gm, const CuTf32Params *p) { return (gm->ta ? p->BK : p->BM) * a_stride(gm, p); }
static int b_stage(const CuGemm *gm, const CuTf32Params *p) { return (gm->tb ? p->BN : p->BK) * b_stride(gm, p); }

static int64_t stage_bytes(const CuGemm *gm, const CuTf32Params *p) { return (int64_t)(a_stage(gm, p) + b_stage(gm, p)) * 4; }

/* One operand's tile of one stage: `rows` rows of `cpr` 16-byte chunks,
 * row r at global row grow + r (of row_lim), chunk c at global column
 * gcol + 4c (of col_lim), the matrix `src` with leading dimension ld,
 * into `dst` with row stride `stride`.  tile_rows / tile_cols: the tile's
 * extent along the dims of row_lim and col_lim (BM, BN or BK): a limit
 * they divide needs no test.  When the block's threads cover whole rows
 * (threads a multiple of cpr), a thread's chunks are one column, rows
 * threads / cpr apart: one 64-bit address per tile plus constant offsets,
 * instead of an address per chunk (registers). */
static void load_operand(CuFn *f, int threads, const char *what, const char *src, const char *dst, int rows, int cpr,
                         int stride, const char *grow, int64_t row_lim, int tile_rows, const char *gcol,
                         int64_t col_lim, int tile_cols, int64_t ld, const char *aligned) {
  int chunks = rows * cpr;
  bool row_test = row_lim % tile_rows != 0, col_test = col_lim % tile_cols != 0;
  cu_line(f, "// %s: %d rows of %d chunks", what, rows, cpr);
  cu_open(f, "%s", "");
  if (threads % cpr == 0) {
    int step = threads / cpr;
    cu_line(f, "// this thread's chunks: column lc%d, rows lr%d + %d i", cpr, cpr, step);
    cu_line(f, "const long long gr0 = %s + lr%d, gc = %s + lc%d;", grow, cpr, gcol, cpr);
    cu_line(f, "const float *src0 = %s + gr0 * %lldLL + gc;", src, (long long)ld);
    cu_line(f, "float *dst0 = %s + lr%d * %d + lc%d;", dst, cpr, stride, cpr);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", (rows + step - 1) / step);
    if (rows % step) cu_line(f, "if (lr%d + i * %d >= %d) break;", cpr, step, rows);
    cu_line(f, "const bool ok = %s%s%s;", row_test ? cu_fmt(f, "gr0 + i * %d < %lldLL", step, (long long)row_lim) : "",
            row_test && col_test ? " && " : "", col_test ? cu_fmt(f, "gc < %lldLL", (long long)col_lim) : row_test ? "" : "true");
    cu_line(f, "const float *src = %ssrc0 + i * %lldLL;", row_test || col_test ? cu_fmt(f, "!ok ? %s : ", src) : "",
            (long long)step * ld);
    cu_line(f, "float *dst = dst0 + i * %d;", step * stride);
  } else {
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", (chunks + threads - 1) / threads);
    cu_line(f, "const int c = threadIdx.x + i * %d, r = c / %d, cc = (c %% %d) * 4;", threads, cpr, cpr);
    if (chunks % threads) cu_line(f, "if (c >= %d) break;", chunks);
    cu_line(f, "const long long gr = %s + r, gc = %s + cc;", grow, gcol);
    cu_line(f, "const bool ok = %s%s%s;", row_test ? cu_fmt(f, "gr < %lldLL", (long long)row_lim) : "",
            row_test && col_test ? " && " : "", col_test ? cu_fmt(f, "gc < %lldLL", (long long)col_lim) : row_test ? "" : "true");
    cu_line(f, "const float *src = %s + (ok ? gr * %lldLL + gc : 0LL);", src, (long long)ld);
    cu_line(f, "float *dst = %s + r * %d + cc;", dst, stride);
  }
  cu_tc_cp_async16_f32(f, "dst", "src", "ok", aligned);
  cu_close(f);
  cu_close(f);
}

/* What the pipeline's hooks need of the kernel. */
typedef struct {
  const CuGemm *gm;
  const CuTf32Params *p;
  int threads, MI, NI;
  const char *aligned;
} Tf32Ctx;

/* Issues the loads of K tile `kt` into buffer `stage` (CuTcPipeline.load_stage). */
static void load_stage(CuFn *f, const void *ctx, const char *stage, const char *kt) {
  const Tf32Ctx *x = ctx;
  const CuGemm *gm = x->gm;
  const CuTf32Params *p = x->p;
  int threads = x->threads;
  const char *aligned = x->aligned;
  int AS = a_stride(gm, p), BS = b_stride(gm, p);
  cu_open(f, "%s", "");
  cu_line(f, "const long long k0 = (long long)(%s) * %d;", kt, p->BK);
  cu_line(f, "float *as = As + (%s) * %d, *bs = Bs + (%s) * %d;", stage, a_stage(gm, p), stage, b_stage(gm, p));
  if (gm->ta)
    load_operand(f, threads, "A tile, stored [K, M]", "A", "as", p->BK, p->BM / 4, AS, "k0", gm->K, p->BK, "m0", gm->M,
                 p->BM, gm->M, aligned);
  else
    load_operand(f, threads, "A tile, stored [M, K]", "A", "as", p->BM, p->BK / 4, AS, "m0", gm->M, p->BM, "k0", gm->K,
                 p->BK, gm->K, aligned);
  if (gm->tb)
    load_operand(f, threads, "B tile, stored [N, K]", "B", "bs", p->BN, p->BK / 4, BS, "n0", gm->N, p->BN, "k0", gm->K,
                 p->BK, gm->K, aligned);
  else
    load_operand(f, threads, "B tile, stored [K, N]", "B", "bs", p->BK, p->BN / 4, BS, "k0", gm->K, p->BK, "n0", gm->N,
                 p->BN, gm->N, aligned);
  cu_close(f);
}

/* The statements that fill regs (unsigned[4]) with lane `lane`'s A
 * fragment of m16 tile i at k step kk: a0 = A[g][k 2t], a1 = A[g+8][2t],
 * a2 = A[g][2t+1], a3 = A[g+8][2t+1] (g = lane / 4, t = lane % 4), each
 * rounded to TF32. */
static void frag_a(CuFn *f, const CuGemm *gm, const CuTf32Params *p, const char *lane, const char *regs) {
  int AS = a_stride(gm, p);
  if (!gm->ta) {
    cu_line(f, "const float *fp = as + (wm * %d + i * 16 + (%s >> 2)) * %d + kk + (%s & 3) * 2;", p->WM, lane, AS, lane);
    cu_line(f, "const smelt_pack<float, 2> lo = *reinterpret_cast<const smelt_pack<float, 2> *>(fp);");
    cu_line(f, "const smelt_pack<float, 2> hi = *reinterpret_cast<const smelt_pack<float, 2> *>(fp + %d);", 8 * AS);
    cu_line(f, "%s[0] = to_tf32(lo.v[0]), %s[1] = to_tf32(hi.v[0]), %s[2] = to_tf32(lo.v[1]), %s[3] = to_tf32(hi.v[1]);",
            regs, regs, regs, regs);
  } else {
    cu_line(f, "const float *fp = as + (kk + (%s & 3) * 2) * %d + wm * %d + i * 16 + (%s >> 2);", lane, AS, p->WM, lane);
    cu_line(f, "%s[0] = to_tf32(fp[0]), %s[1] = to_tf32(fp[8]), %s[2] = to_tf32(fp[%d]), %s[3] = to_tf32(fp[%d]);", regs,
            regs, regs, AS, regs, AS + 8);
  }
}

/* The same for B's n8 tile j: b0 = B[k 2t][n g], b1 = B[2t+1][g]. */
static void frag_b(CuFn *f, const CuGemm *gm, const CuTf32Params *p, const char *lane, const char *regs) {
  int BS = b_stride(gm, p);
  if (gm->tb) {
    cu_line(f, "const float *fp = bs + (wn * %d + j * 8 + (%s >> 2)) * %d + kk + (%s & 3) * 2;", p->WN, lane, BS, lane);
    cu_line(f, "const smelt_pack<float, 2> lo = *reinterpret_cast<const smelt_pack<float, 2> *>(fp);");
    cu_line(f, "%s[0] = to_tf32(lo.v[0]), %s[1] = to_tf32(lo.v[1]);", regs, regs);
  } else {
    cu_line(f, "const float *fp = bs + (kk + (%s & 3) * 2) * %d + wn * %d + j * 8 + (%s >> 2);", lane, BS, p->WN, lane);
    cu_line(f, "%s[0] = to_tf32(fp[0]), %s[1] = to_tf32(fp[%d]);", regs, regs, BS);
  }
}

/* f32 -> TF32 and the host stand-in for mma.sync m16n8k8 .tf32 (emitted
 * once per kernel). */
static const char tf32_helpers[] =
    "  // f32 -> TF32 (10-bit mantissa, low 13 bits zero): round to nearest, ties away from zero\n"
    "  auto to_tf32 = [](float x) -> unsigned {\n"
    "#ifdef __CUDA_ARCH__\n"
    "    unsigned u;\n"
    "    asm(\"cvt.rna.tf32.f32 %0, %1;\\n\" : \"=r\"(u) : \"f\"(x));\n"
    "    return u;\n"
    "#else\n"
    "    // what cvt.rna does: half a TF32 ulp added to the magnitude, then truncated (Inf stays Inf)\n"
    "    unsigned u;\n"
    "    memcpy(&u, &x, 4);\n"
    "    if (x != x) return 0x7fffffffu;\n"
    "    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;\n"
    "    return u & 0xffffe000u;\n"
    "#endif\n"
    "  };\n"
    "#ifndef __CUDA_ARCH__\n"
    "  // Host emulation of mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32 after the PTX ISA's fragment\n"
    "  // layouts (g = lane / 4, t = lane % 4):\n"
    "  // A (16x8, row): lane 4g+t holds a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4];\n"
    "  // B (8x8, col): lane 4n+t holds b0 = B[t][n], b1 = B[t+4][n];\n"
    "  // C: c0, c1 = C[g][2t], C[g][2t+1]; c2, c3 = C[g+8][2t], C[g+8][2t+1].\n"
    "  // a_of(l, regs) / b_of(l, regs) give lane l's fragments.\n"
    "  auto emu_f32 = [](unsigned u) -> float { float v; memcpy(&v, &u, 4); return v; };\n"
    "  auto emu_mma_tf32 = [&](float c[4], auto a_of, auto b_of) {\n"
    "    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;\n"
    "    float A[2][8], B[2][8];  // rows g, g+8 of A; columns 2t, 2t+1 of B\n"
    "    for (int s = 0; s < 4; s++) {\n"
    "      unsigned x[4], y[2];\n"
    "      a_of(4 * g + s, x);\n"
    "      A[0][s] = emu_f32(x[0]), A[1][s] = emu_f32(x[1]), A[0][s + 4] = emu_f32(x[2]), A[1][s + 4] = emu_f32(x[3]);\n"
    "      for (int n = 0; n < 2; n++) {\n"
    "        b_of(4 * (2 * t + n) + s, y);\n"
    "        B[n][s] = emu_f32(y[0]), B[n][s + 4] = emu_f32(y[1]);\n"
    "      }\n"
    "    }\n"
    "    for (int e = 0; e < 4; e++)\n"
    "      for (int k = 0; k < 8; k++) c[e] += A[e / 2][k] * B[e % 2][k];\n"
    "  };\n"
    "#endif\n";

static void mma_16808(CuFn *f, const char *c, const char *a, const char *b) {
  cu_line(f,
          "asm volatile(\"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%%0, %%1, %%2, %%3}, {%%4, %%5, %%6, %%7}, "
          "{%%8, %%9}, {%%0, %%1, %%2, %%3};\\n\" : \"+f\"(%s[0]), \"+f\"(%s[1]), \"+f\"(%s[2]), \"+f\"(%s[3]) : "
          "\"r\"(%s[0]), \"r\"(%s[1]), \"r\"(%s[2]), \"r\"(%s[3]), \"r\"(%s[0]), \"r\"(%s[1]));",
          c, c, c, c, a, a, a, a, b, b);
}

/* The MMAs over the k-tile in as / bs (CuTcPipeline.k_tile). */
static void k_tile(CuFn *f, const void *ctx) {
  const Tf32Ctx *x = ctx;
  const CuGemm *gm = x->gm;
  const CuTf32Params *p = x->p;
  int MI = x->MI, NI = x->NI;
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kk = 0; kk < %d; kk += 8)", p->BK);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "// this lane's A fragments of the k8 step, rounded to TF32; then B's, one n8 tile at a time");
  cu_line(f, "// (fewer live registers beside the %d accumulators)", MI * NI * 4);
  cu_line(f, "unsigned af[%d][4];", MI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  frag_a(f, gm, p, "lane", "af[i]");
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", NI);
  cu_line(f, "unsigned bf[2];");
  cu_open(f, "%s", "");
  frag_b(f, gm, p, "lane", "bf");
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  mma_16808(f, "acc[i][j]", "af[i]", "bf");
  cu_close(f);
  cu_close(f);
  cu_line(f, "#else");
  cu_line(f, "// the same fragments, each lane's computed from its addresses");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_open(f, "  for (int j = 0; j < %d; j++)", NI);
  cu_line(f, "auto a_of = [&](int l, unsigned a[4]) {");
  f->indent++;
  frag_a(f, gm, p, "l", "a");
  f->indent--;
  cu_line(f, "};");
  cu_line(f, "auto b_of = [&](int l, unsigned b[2]) {");
  f->indent++;
  frag_b(f, gm, p, "l", "b");
  f->indent--;
  cu_line(f, "};");
  cu_line(f, "emu_mma_tf32(acc[i][j], a_of, b_of);");
  cu_close(f);
  cu_line(f, "#endif");
  cu_close(f); /* kk */
}

void cu_emit_tf32(CuFn *f, const CuGemm *gm, const CuTf32Params *params, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = gm->an;
  /* fewer stages when the arch has less shared memory than asked for */
  CuTf32Params q = *params;
  q.stages = cu_tc_fit_stages(f, q.stages, stage_bytes(gm, &q));
  const CuTf32Params *p = &q;
  cu_tf32_format(p, l->variant);
  l->kind = "matmul";
  if (!cu_tc_smem_fits(f, l, p->stages, stage_bytes(gm, p))) return;
  int warps_m = p->BM / p->WM, warps_n = p->BN / p->WN, threads = 32 * warps_m * warps_n;
  int MI = p->WM / 16, NI = p->WN / 8;
  int AS = a_stride(gm, p), BS = b_stride(gm, p);
  int smem_elems = p->stages * (a_stage(gm, p) + b_stage(gm, p));
  int64_t KT = ceil_div(gm->K, p->BK);

  if (!cu_tc_launch(f, gm, p->BM, p->BN, threads, 1, l)) return;
  l->smem = (unsigned)(smem_elems * 4);
  if (gm->Z == 0) return;

  cu_line(f, "// variant: TF32 tensor cores (mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32, cvt.rna.tf32.f32, cp.async), %s%s x %s%s",
          g->val[an->in[0]].name, gm->ta ? " (A given as [K, M])" : "", g->val[an->in[1]].name,
          gm->tb ? " (B given as [N, K])" : "");
  cu_line(f, "// f32 operands rounded to TF32 (allow_tf32), f32 accumulation");
  cu_line(f, "// parameters: BM %d, BN %d, BK %d, warps %d x %d of %d x %d, %d stages; M %lld, N %lld, K %lld, batch %lld",
          p->BM, p->BN, p->BK, warps_m, warps_n, p->WM, p->WN, p->stages, (long long)gm->M, (long long)gm->N,
          (long long)gm->K, (long long)gm->Z);
  cu_buf_append(f->out, tf32_helpers, sizeof tf32_helpers - 1);
  cu_tc_smem_decl(f, "float", "smelt_tf32_smem", smem_elems);
  cu_line(f, "float *const As = smelt_tf32_smem;  // [%d stages][%d][%d] (rows padded by %d)", p->stages,
          gm->ta ? p->BK : p->BM, AS, gm->ta ? 4 : 8);
  cu_line(f, "float *const Bs = smelt_tf32_smem + %d;  // [%d stages][%d][%d] (rows padded by %d)",
          p->stages * a_stage(gm, p), p->stages, gm->tb ? p->BN : p->BK, BS, gm->tb ? 8 : 4);
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  int cprs[2] = {gm->ta ? p->BM / 4 : p->BK / 4, gm->tb ? p->BK / 4 : p->BN / 4};
  for (int o = 0; o < 2; o++)
    if (threads % cprs[o] == 0 && (o == 0 || cprs[1] != cprs[0]))
      cu_line(f, "const int lr%d = threadIdx.x / %d, lc%d = (threadIdx.x %% %d) * 4;  // first row, column in rows of %d chunks",
              cprs[o], cprs[o], cprs[o], cprs[o], cprs[o]);
  cu_tc_block_tile(f, gm, p->BM, p->BN, p->WM, p->WN);
  cu_line(f, "const int nt = %lld;  // k-tiles", (long long)KT);
  int a0 = f->arg_of[an->in[0]], b0 = f->arg_of[an->in[1]];
  const char *aligned;
  const char *z = cu_tc_batch_loop(f, gm, &aligned);
  cu_line(f, "const float *A = a%d + %s;  // %s", a0, cu_gemm_batch_offset(f, gm, z, gm->at), g->val[an->in[0]].name);
  cu_line(f, "const float *B = a%d + %s;  // %s", b0, cu_gemm_batch_offset(f, gm, z, gm->bt), g->val[an->in[1]].name);
  Tf32Ctx x = {gm, p, threads, MI, NI, aligned};
  cu_tc_pipeline(f, &(CuTcPipeline){p->stages, MI, NI, NULL, "float", a_stage(gm, p), b_stage(gm, p), load_stage, k_tile, &x, NULL});
  cu_tc_epilogue(f, gm, p->WM, p->WN, MI, NI, z, epi, nepi);
  cu_close(f); /* z */
}

/* ---- the family's entry (cu_families.h) ---- */

static void family_default(const CuFn *f, const CuGemm *gm, char out[CG_VARIANT_LEN]) {
  CuTf32Params p;
  cu_tf32_default_params(gm, &p);
  cu_tf32_format(&p, out);
  (void)f;
}

static int family_candidates(const CuFn *f, const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max) {
  (void)f;
  return cu_tf32_candidates(gm, out, max);
}

static bool family_emit(CuFn *f, const CuGemm *gm, const char *tok, const int *epi, int nepi, CuLaunch *l) {
  CuTf32Params p;
  if (!cu_tf32_parse(tok, &p)) return false;
  cu_emit_tf32(f, gm, &p, epi, nepi, l);
  return true;
}

const CuGemmFamily cu_family_tf32 = {"tf32", cu_tf32_eligible, family_default, family_candidates, family_emit};
