/* The tensor-core matmul: f16/bf16 operands, f32 accumulation, sm_80+.
 *
 * A block computes a BM x BN tile of C = A B (per batch z, grid.z) with
 * (BM/WM) x (BN/WN) warps, each owning a WM x WN sub-tile held in registers
 * as f32 accumulators of m16n8 fragments.  Along K, tiles of BM x BK of A
 * and BK x BN of B (or BN x BK when B is given as [N, K], transpose_b) go
 * global -> shared with 16-byte cp.async, `stages` buffers deep: while the
 * warps multiply tile kt, the loads of tiles kt+1 .. kt+stages-1 are in
 * flight, and one __syncthreads per tile orders reuse of a buffer.  Rows
 * are padded by 16 bytes so that the 8 row addresses of an ldmatrix fall
 * in distinct banks.  Operand fragments come from shared memory with
 * ldmatrix (.trans for B stored [K, N]: the MMA wants B "col"), and every
 * k16 step issues (WM/16) x (WN/8) mma.sync.m16n8k16.  A warp tile of
 * 64 x 64 issues 32 MMAs for 8 ldmatrix.x4: shared-memory bandwidth, not
 * the tensor cores, is what limits mma.sync on Hopper, so big warp tiles
 * matter most.
 *
 * Grid: grid.x walks the tiles in groups of 8 tile rows (all columns of a
 * group before the next group), so the blocks running at one time share
 * A rows and B columns in L2; grid.y is the split-K slice; grid.z the
 * batch.  Split-K (sk > 1, for shapes with fewer tiles than SMs and a long
 * K): slice s multiplies k-tiles [s KTS, (s+1) KTS), stores its f32 tile in
 * the workspace ([Z][sk][M][N], after a counter per tile [Z][tiles]), and
 * raises the tile's counter after a __threadfence; the block that raises
 * it to sk adds the sk partial tiles in slice order (the same sum whichever
 * block is last), clearing them as it reads them, puts the counter back to
 * 0 (the workspace is all zero when the kernel ends: other kernels keep
 * counters where this one keeps partial tiles) and runs the epilogue.
 *
 * Shared memory: stages x (BM + BN) x (BK + 8) halves.  A variant asking
 * for more than the target arch allows (opt->arch; without one, 99 KiB:
 * every sm_80+ GPU has that) runs with fewer stages; the token recorded in
 * the launch (l->variant) is the one used.
 *
 * Ragged edges: a 16-byte chunk (8 elements along a contiguous dim whose
 * length is a multiple of 8) is either wholly inside the matrix or wholly
 * outside; outside chunks are zero-filled (cp.async with a source size of
 * 0), so padding rows and k beyond K add nothing, and stores are guarded.
 * The epilogue applies the group's elementwise consumers to each f32
 * accumulator through cu_store_epilogue, like the simple kernel.
 *
 * conv2d (f16/bf16, implicit GEMM: gemm.c) runs on the same tensor cores:
 * A is the weight, [Og, Cg KH KW] per group with k contiguous, copied with
 * cp.async like a matmul's A when it is an argument and K % 8 == 0; B is
 * the im2col matrix of x, which is never built: every element of a B tile
 * (and of an A tile that cannot be copied) is computed in registers through
 * the group's loaders (padding, strides, dilation, fused producers), 8
 * consecutive n (or k) per thread and chunk.  The pipeline issues those
 * loads for tile kt+stages-1 before the MMAs of tile kt and stores them
 * into shared memory after (CuTcPipeline.store_stage), so that they are in
 * flight while the tensor cores work.  N (batch x OH x OW) need not be a
 * multiple of 8: B elements are guarded one by one.  A 1x1 conv of stride
 * 1 without padding whose x is an argument and OH x OW a multiple of 4
 * reads B straight from x (rows of x are rows of B) with cp.async, like a
 * matmul (8-byte copies when OH x OW is not a multiple of 8).  The default tile is the largest that gives every SM a block
 * (small K: few k-tiles to split), else the smallest, split along K.
 *
 * Without the alignment guarantee (CgCudaOptions.args_aligned), a uniform
 * branch tests the operand pointers once and copies with plain loads when
 * they are not 16-byte aligned.  The PTX is under #ifdef __CUDA_ARCH__; on
 * the host (the CPU emulation of tests/gpu/cuda_emu.hpp) the same
 * fragments are exchanged with warp shuffles by small functions that
 * follow the PTX ISA's fragment layouts, so the kernel's indexing is
 * tested without a GPU; the emulation runs blocks one after another, so
 * its split-K counter needs no atomics.
 */
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_families.h"

static bool is_arg_value(const CuFn *f, int v) {
  const Value *val = &f->g->val[v];
  if (f->arg_of[v] < 0) return false;
  return !(val->kind == VK_NODE && f->member[val->node]);
}

/* conv2d: f16/bf16 throughout, and enough output channels per group and
 * a long enough K for 16 x 16 MMAs (depthwise convs keep the simple
 * kernel). */
static bool conv_eligible(const CuGemm *gm) {
  DType dt = gm->yt->dt;
  if (dt != DT_F16 && dt != DT_BF16) return false;
  if (gm->at->dt != dt || gm->bt->dt != dt) return false;
  return gm->M >= 8 && gm->K >= 16 && gm->N >= 1 && gm->Z >= 1;
}

/* Whether a conv2d's A (the weight) is copied with cp.async. */
static bool conv_a_direct(const CuFn *f, const CuGemm *gm) { return is_arg_value(f, gm->an->in[1]) && gm->K % 8 == 0; }

/* Whether its B is too: a 1x1 conv of stride 1 without padding reads
 * B[k, n] = x[img, c, p] (n = img HW + p), so 8 consecutive n are one
 * 16-byte chunk of a row of x when HW is a multiple of 8, two 8-byte ones
 * when it is a multiple of 4 (ResNet's 14 x 14). */
static bool conv_b_direct(const CuFn *f, const CuGemm *gm) {
  return is_arg_value(f, gm->an->in[0]) && gm->KH == 1 && gm->KW == 1 && gm->sh == 1 && gm->sw == 1 && gm->pt == 0 &&
         gm->pl == 0 && gm->OH == gm->H && gm->OW == gm->W && (gm->H * gm->W) % 4 == 0;
}

bool cu_mma_eligible(const CuFn *f, const CuGemm *gm) {
  const Node *an = gm->an;
  if (an->op == OP_CONV2D) return conv_eligible(gm);
  if (an->op != OP_MATMUL) return false;
  DType dt = gm->yt->dt;
  if (dt != DT_F16 && dt != DT_BF16) return false;
  if (gm->at->dt != dt || gm->bt->dt != dt) return false;
  if (gm->ta || gm->a1 || gm->b1) return false;
  if (gm->K % 8 != 0 || gm->N % 8 != 0) return false;
  if (gm->M < 1 || gm->N < 1) return false;
  /* the operands are read straight from memory with cp.async */
  return is_arg_value(f, an->in[0]) && is_arg_value(f, an->in[1]);
}

/* Blocks that fill the GPU once (132 SMs on an H200); split-K aims for it. */
#define MMA_TARGET_BLOCKS 132
/* The largest workspace a split-K variant may ask for. */
#define MMA_MAX_WORKSPACE ((uint64_t)512 << 20)

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int64_t tiles_of(const CuGemm *gm, int BM, int BN) {
  return ceil_div(gm->M, BM) * ceil_div(gm->N, BN) * (gm->Z < 1 ? 1 : gm->Z);
}

/* Doubles the slices while the grid is smaller than the GPU and every
 * slice keeps at least 4 k-tiles. */
static int pick_splitk(const CuGemm *gm, const CuMmaParams *p) {
  int64_t tiles = tiles_of(gm, p->BM, p->BN), KT = ceil_div(gm->K, p->BK);
  int sk = 1;
  while (sk < 16 && tiles * sk < MMA_TARGET_BLOCKS && KT >= 8 * sk) sk *= 2;
  return sk;
}

/* conv2d (ResNet's convs at batch 1: K from 64 to 4608, N from 49 to
 * 12544, a few hundred MFLOP each) is latency-bound: too few blocks leave
 * SMs with one block of 4 warps waiting on its loads.  The largest tile
 * that still gives every SM two blocks, else the smallest, then split-K
 * (down to 4 k-tiles a slice) towards two blocks per SM; 3 stages. */
#define CONV_TARGET_BLOCKS (2 * MMA_TARGET_BLOCKS)
static void conv_default_params(const CuGemm *gm, CuMmaParams *out) {
  static const CuMmaParams tiles[] = {
      {128, 128, 32, 64, 64, 3, 1}, {64, 128, 32, 32, 64, 3, 1}, {64, 64, 32, 32, 32, 3, 1}};
  int nt = (int)(sizeof tiles / sizeof *tiles);
  *out = gm->M <= 32 ? (CuMmaParams){32, 128, 32, 32, 32, 3, 1} : tiles[nt - 1];
  for (int i = 0; i < nt && gm->M > 32; i++) {
    if (tiles[i].BM > 64 && tiles[i].BM > gm->M) continue; /* mostly empty rows */
    if (tiles_of(gm, tiles[i].BM, tiles[i].BN) >= CONV_TARGET_BLOCKS) {
      *out = tiles[i];
      break;
    }
  }
  int64_t tiles_n = tiles_of(gm, out->BM, out->BN), KT = ceil_div(gm->K, out->BK);
  int sk = 1;
  while (sk < 32 && tiles_n * sk < CONV_TARGET_BLOCKS && KT >= 4 * 2 * sk) sk *= 2;
  out->splitk = sk;
}

void cu_mma_default_params(const CuGemm *gm, CuMmaParams *out) {
  if (gm->an && gm->an->op == OP_CONV2D) {
    conv_default_params(gm, out);
    return;
  }
  /* Few rows: a flat tile wastes less (B's bandwidth is what counts).
   * Otherwise 8 warps of 64 x 64 on a 128 x 256 tile when that gives the
   * GPU enough blocks, else 4 of them on 128 x 128 (and split-K when even
   * that leaves SMs idle).  4 stages of BK 32: 120 KiB at 128 x 256. */
  if (gm->M <= 32) *out = (CuMmaParams){32, 128, 64, 32, 32, 4, 1};
  else if (gm->M <= 64) *out = (CuMmaParams){64, 128, 32, 32, 64, 4, 1};
  else if (tiles_of(gm, 128, 256) >= MMA_TARGET_BLOCKS) *out = (CuMmaParams){128, 256, 32, 64, 64, 4, 1};
  else *out = (CuMmaParams){128, 128, 32, 64, 64, 4, 1};
  out->splitk = pick_splitk(gm, out);
}

bool cu_mma_parse(const char *tok, CuMmaParams *out) {
  CuMmaParams p;
  int used = 0;
  if (sscanf(tok, "mma:bm=%d,bn=%d,bk=%d,wm=%d,wn=%d,st=%d,sk=%d%n", &p.BM, &p.BN, &p.BK, &p.WM, &p.WN, &p.stages,
             &p.splitk, &used) != 7 || tok[used] != 0)
    return false;
  /* B fragments come in pairs of n8 tiles (one ldmatrix.x4): WN % 16 */
  if (p.WM < 16 || p.WM % 16 || p.WN < 16 || p.WN % 16 || p.BM < p.WM || p.BM % p.WM || p.BN < p.WN || p.BN % p.WN)
    return false;
  /* at most 128 f32 accumulators per thread (64 x 64 per warp) */
  if (p.WM * p.WN > 64 * 64 || p.BM > 256 || p.BN > 256) return false;
  if (p.BK < 16 || p.BK % 16 || p.BK > 128 || p.stages < 2 || p.stages > 8 || p.splitk < 1 || p.splitk > 64) return false;
  if (32 * (p.BM / p.WM) * (p.BN / p.WN) > 1024) return false;
  *out = p;
  return true;
}

void cu_mma_format(const CuMmaParams *p, char out[CG_VARIANT_LEN]) {
  snprintf(out, CG_VARIANT_LEN, "mma:bm=%d,bn=%d,bk=%d,wm=%d,wn=%d,st=%d,sk=%d", p->BM, p->BN, p->BK, p->WM, p->WN,
           p->stages, p->splitk);
}

static uint64_t workspace_bytes(const CuGemm *gm, const CuMmaParams *p, uint64_t *out_part_off) {
  *out_part_off = 0;
  if (p->splitk <= 1) return 0;
  uint64_t counters = ((uint64_t)tiles_of(gm, p->BM, p->BN) * 4 + 255) / 256 * 256;
  *out_part_off = counters;
  return counters + (uint64_t)(gm->Z < 1 ? 1 : gm->Z) * (uint64_t)p->splitk * (uint64_t)gm->M * (uint64_t)gm->N * 4;
}

/* conv2d's candidates for the tuner: the default, then each tile of the
 * heuristic's list (and a 32-row one) with 1 to 16 slices, while the grid
 * stays between half a wave and 8 blocks per SM and every slice keeps 2
 * k-tiles; at most 16. */
static int conv_candidates(const CuGemm *gm, CuMmaParams *list, int max) {
  static const CuMmaParams tiles[] = {{128, 128, 32, 64, 64, 3, 1},
                                      {64, 128, 32, 32, 64, 3, 1},
                                      {64, 64, 32, 32, 32, 3, 1},
                                      {32, 128, 32, 32, 32, 3, 1}};
  int n = 0;
  conv_default_params(gm, &list[n++]);
  for (size_t i = 0; i < sizeof tiles / sizeof *tiles; i++)
    for (int sk = 1; sk <= 16 && n < max; sk *= 2) {
      int64_t blocks = tiles_of(gm, tiles[i].BM, tiles[i].BN) * sk, KT = ceil_div(gm->K, tiles[i].BK);
      if (tiles[i].BM > 2 * gm->M && tiles[i].BM > 32) break;
      if (KT < 2 * sk || blocks > 8 * MMA_TARGET_BLOCKS) break;
      if (blocks < MMA_TARGET_BLOCKS / 2 && sk < 16 && KT >= 4 * sk) continue; /* more slices would fill it */
      list[n] = tiles[i];
      list[n++].splitk = sk;
    }
  return n;
}

/* A matmul's: the default, the other tiles with their split-K, and the
 * default with twice the slices. */
static int matmul_candidates(const CuGemm *gm, CuMmaParams *list) {
  CuMmaParams d;
  cu_mma_default_params(gm, &d);
  int n = 0;
  list[n++] = d;
  static const CuMmaParams alt[] = {
      {128, 256, 32, 64, 64, 4, 1}, {256, 128, 32, 64, 64, 4, 1}, {128, 128, 32, 64, 64, 4, 1},
      {128, 256, 64, 64, 64, 3, 1}, {128, 128, 64, 64, 64, 3, 1}, {128, 128, 32, 64, 32, 3, 1},
      {64, 128, 32, 32, 64, 4, 1},  {64, 64, 32, 32, 32, 4, 1},
  };
  for (size_t i = 0; i < sizeof alt / sizeof *alt; i++) {
    /* a tile much taller or wider than the matrix only wastes work */
    if (alt[i].BM > 2 * gm->M && alt[i].BM > 32) continue;
    list[n] = alt[i];
    list[n].splitk = pick_splitk(gm, &list[n]);
    n++;
  }
  /* split-K itself: the default with twice the slices, if K allows */
  if (ceil_div(gm->K, d.BK) >= 8 * d.splitk && d.splitk < 16) list[n] = d, list[n++].splitk = d.splitk * 2;
  return n;
}

int cu_mma_candidates(const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max) {
  CuMmaParams list[20];
  int n = gm->an && gm->an->op == OP_CONV2D ? conv_candidates(gm, list, 20) : matmul_candidates(gm, list);
  int got = 0;
  for (int i = 0; i < n && got < max; i++) {
    uint64_t off;
    if (workspace_bytes(gm, &list[i], &off) > MMA_MAX_WORKSPACE) continue;
    char tok[CG_VARIANT_LEN];
    cu_mma_format(&list[i], tok);
    bool dup = false;
    for (int j = 0; j < got && !dup; j++) dup = strcmp(out[j], tok) == 0;
    if (!dup) memcpy(out[got++], tok, CG_VARIANT_LEN);
  }
  return got;
}


/* What the pipeline's hooks need of the kernel. */
typedef struct {
  const CuGemm *gm;
  const CuMmaParams *p;
  int threads, MI, NI;
  bool bf16;
  const char *aligned;
  const char *z;       /* the batch (matmul) or group (conv2d) index */
  bool conv, a_direct, b_direct; /* conv2d; its A, its B copied with cp.async */
} MmaCtx;

/* The cp.async copies of A's tile at k0 (rows m0.., [M, K] with k
 * contiguous, through pointer A) into `as`: a matmul's A, a conv2d's
 * weight. */
static void copy_a_tile(CuFn *f, const MmaCtx *x) {
  const CuGemm *gm = x->gm;
  const CuMmaParams *p = x->p;
  int CK = p->BK / 8, AS = p->BK + 8, a_chunks = p->BM * CK, threads = x->threads;
  cu_line(f, "// A tile: %d rows of %d chunks", p->BM, CK);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", (a_chunks + threads - 1) / threads);
  cu_line(f, "const int c = threadIdx.x + i * %d, r = c / %d, kc = (c %% %d) * 8;", threads, CK, CK);
  if (a_chunks % threads) cu_line(f, "if (c >= %d) break;", a_chunks);
  cu_line(f, "const long long gm = m0 + r, gk = k0 + kc;");
  cu_line(f, "const bool ok = gm < %lldLL && gk < %lldLL;", (long long)gm->M, (long long)gm->K);
  cu_line(f, "const unsigned short *src = A + (ok ? gm * %lldLL + gk : 0LL);", (long long)gm->K);
  cu_line(f, "unsigned short *dst = as + r * %d + kc;", AS);
  cu_tc_cp_async16(f, "dst", "src", "ok", x->aligned);
  cu_close(f);
}

/* Issues the loads of K tile `kt` into buffer `stage` (CuTcPipeline.load_stage). */
static void load_stage(CuFn *f, const void *ctx, const char *stage, const char *kt) {
  const MmaCtx *x = ctx;
  const CuGemm *gm = x->gm;
  const CuMmaParams *p = x->p;
  int threads = x->threads;
  const char *aligned = x->aligned;
  int CK = p->BK / 8;                /* 16-byte chunks per row of BK */
  int CN = p->BN / 8;                /* chunks per row of BN (B stored [K, N]) */
  int AS = p->BK + 8, BS = gm->tb ? p->BK + 8 : p->BN + 8;
  int b_chunks = p->BN * CK;
  cu_open(f, "%s", "");
  cu_line(f, "const long long k0 = (long long)(%s) * %d;", kt, p->BK);
  cu_line(f, "unsigned short *as = As + (%s) * %d, *bs = Bs + (%s) * %d;", stage, p->BM * AS, stage,
          gm->tb ? p->BN * BS : p->BK * BS);
  copy_a_tile(f, x);
  if (gm->tb) {
    cu_line(f, "// B tile, stored [N, K]: %d rows (n) of %d chunks", p->BN, CK);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", (b_chunks + threads - 1) / threads);
    cu_line(f, "const int c = threadIdx.x + i * %d, r = c / %d, kc = (c %% %d) * 8;", threads, CK, CK);
    if (b_chunks % threads) cu_line(f, "if (c >= %d) break;", b_chunks);
    cu_line(f, "const long long gn = n0 + r, gk = k0 + kc;");
    cu_line(f, "const bool ok = gn < %lldLL && gk < %lldLL;", (long long)gm->N, (long long)gm->K);
    cu_line(f, "const unsigned short *src = B + (ok ? gn * %lldLL + gk : 0LL);", (long long)gm->K);
    cu_line(f, "unsigned short *dst = bs + r * %d + kc;", BS);
  } else {
    cu_line(f, "// B tile, stored [K, N]: %d rows (k) of %d chunks", p->BK, CN);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", (b_chunks + threads - 1) / threads);
    cu_line(f, "const int c = threadIdx.x + i * %d, r = c / %d, nc = (c %% %d) * 8;", threads, CN, CN);
    if (b_chunks % threads) cu_line(f, "if (c >= %d) break;", b_chunks);
    cu_line(f, "const long long gk = k0 + r, gn = n0 + nc;");
    cu_line(f, "const bool ok = gk < %lldLL && gn < %lldLL;", (long long)gm->K, (long long)gm->N);
    cu_line(f, "const unsigned short *src = B + (ok ? gk * %lldLL + gn : 0LL);", (long long)gm->N);
    cu_line(f, "unsigned short *dst = bs + r * %d + nc;", BS);
  }
  cu_tc_cp_async16(f, "dst", "src", "ok", aligned);
  cu_close(f);
  cu_close(f);
}

/* ---- conv2d: operand tiles computed in registers ---- */

/* The register chunks (8 elements each) a thread holds for one tile of
 * an operand: A (BM rows of BK) or B (BK rows of BN).  A chunk is always
 * 8 consecutive k of one row m (A) or one column n (B): the column's
 * coordinates (image, oh, ow) are then the same for the whole chunk and
 * for every k-tile, so they are computed once, and neighbouring threads
 * take neighbouring n (coalesced reads of x). */
static int conv_chunks(const MmaCtx *x, bool is_a) {
  const CuMmaParams *p = x->p;
  int chunks = (is_a ? p->BM : p->BN) * (p->BK / 8);
  return (chunks + x->threads - 1) / x->threads;
}

/* The 16-bit pattern of float v in the operand dtype. */
static const char *conv_bits(CuFn *f, bool bf16, const char *v) {
  return bf16 ? cu_fmt(f, "__bfloat16_as_ushort(__float2bfloat16_rn(%s))", v)
              : cu_fmt(f, "__half_as_ushort(__float2half_rn(%s))", v);
}

/* Chunk i of the thread: o (the row m of A, the column n of B, within the
 * tile) and g (its group of 8 k within the tile). */
static void conv_chunk_of(CuFn *f, const MmaCtx *x, bool is_a) {
  const CuMmaParams *p = x->p;
  int CK = p->BK / 8, outer = is_a ? p->BM : p->BN, total = outer * CK;
  cu_line(f, "const int c = threadIdx.x + i * %d;", x->threads);
  if (total % x->threads) cu_line(f, "if (c >= %d) break;", total);
  if (is_a) cu_line(f, "const int o = c / %d, g = c %% %d;  // row m, k group", CK, CK);
  else cu_line(f, "const int o = c %% %d, g = c / %d;  // column n, k group", outer, outer);
}

/* Loads the thread's chunks of operand tile (is_a: A, else B) at k-tile
 * origin k0 into regs[i][0..3] (pairs of 16-bit elements), zero outside
 * the matrix. */
static void conv_load_regs(CuFn *f, const MmaCtx *x, bool is_a, const char *regs) {
  const CuGemm *gm = x->gm;
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", conv_chunks(x, is_a));
  conv_chunk_of(f, x, is_a);
  const char *mn = cu_tmp(f);
  cu_line(f, "const %s %s = (%s)(%s + o);", f->idx, mn, f->idx, is_a ? "m0" : "n0");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < 8; e++)");
  const char *k = cu_tmp(f);
  cu_line(f, "const %s %s = (%s)(k0 + g * 8 + e);", f->idx, k, f->idx);
  const char *v = cu_tmp(f);
  cu_line(f, "float %s = 0.0f;", v);
  cu_open(f, "if (%s < %lld && %s < %lld)", mn, (long long)(is_a ? gm->M : gm->N), k, (long long)gm->K);
  CuVal val;
  if (is_a) gm->load_a(f, gm, x->z, mn, k, &val);
  else gm->load_b(f, gm, x->z, k, mn, &val);
  cu_line(f, "%s = %s;", v, val.l[0]);
  cu_close(f);
  cu_line(f, "const unsigned bits = %s;", conv_bits(f, x->bf16, v));
  cu_line(f, "if (e & 1) %s[i][e >> 1] |= bits << 16; else %s[i][e >> 1] = bits;", regs, regs);
  cu_close(f);
  cu_close(f);
}

/* Stores regs (conv_load_regs) into the operand's tile `dst`: A rows of
 * `stride` elements hold a chunk as 16 contiguous bytes; B rows are k, so
 * a chunk is 8 elements of one column. */
static void conv_store_regs(CuFn *f, const MmaCtx *x, bool is_a, const char *regs, const char *dst, int stride) {
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", conv_chunks(x, is_a));
  conv_chunk_of(f, x, is_a);
  if (is_a) {
    cu_line(f, "unsigned *const d = reinterpret_cast<unsigned *>(%s + o * %d + g * 8);", dst, stride);
    cu_line(f, "#ifdef __CUDA_ARCH__");
    cu_line(f, "*reinterpret_cast<uint4 *>(d) = make_uint4(%s[i][0], %s[i][1], %s[i][2], %s[i][3]);", regs, regs, regs,
            regs);
    cu_line(f, "#else");
    cu_line(f, "d[0] = %s[i][0], d[1] = %s[i][1], d[2] = %s[i][2], d[3] = %s[i][3];", regs, regs, regs, regs);
    cu_line(f, "#endif");
  } else {
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int e = 0; e < 8; e++) %s[(g * 8 + e) * %d + o] = (unsigned short)(%s[i][e >> 1] >> ((e & 1) * 16));",
            dst, stride, regs);
  }
  cu_close(f);
}

/* CuTcPipeline.load_stage for conv2d: A with cp.async (a_direct) or into
 * registers ra, B into registers rb. */
static void conv_load_stage(CuFn *f, const void *ctx, const char *stage, const char *kt) {
  const MmaCtx *x = ctx;
  const CuGemm *gm = x->gm;
  const CuMmaParams *p = x->p;
  int AS = p->BK + 8;
  cu_open(f, "%s", "");
  cu_line(f, "const long long k0 = (long long)(%s) * %d;", kt, p->BK);
  if (x->a_direct) {
    cu_line(f, "unsigned short *as = As + (%s) * %d;", stage, p->BM * AS);
    copy_a_tile(f, x);
  } else {
    cu_line(f, "// A tile (the weight), computed into registers");
    conv_load_regs(f, x, true, "ra");
  }
  if (x->b_direct) {
    int CN = p->BN / 8, BS = p->BN + 8, b_chunks = p->BK * CN;
    long long HW = (long long)(gm->H * gm->W);
    cu_line(f, "unsigned short *bs = Bs + (%s) * %d;", stage, p->BK * BS);
    cu_line(f, "// B tile (x itself: a 1x1 conv), %d rows (k) of %d chunks", p->BK, CN);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", (b_chunks + x->threads - 1) / x->threads);
    cu_line(f, "const int c = threadIdx.x + i * %d, r = c / %d, nc = (c %% %d) * 8;", x->threads, CN, CN);
    if (b_chunks % x->threads) cu_line(f, "if (c >= %d) break;", b_chunks);
    cu_line(f, "const long long gk = k0 + r;");
    bool halves = HW % 8 != 0; /* two 8-byte copies, each inside one image */
    if (halves) {
      cu_line(f, "#pragma unroll");
      cu_open(f, "for (int hh = 0; hh < 8; hh += 4)");
    }
    cu_line(f, "const long long gn = n0 + nc%s;", halves ? " + hh" : "");
    cu_line(f, "const bool ok = gk < %lldLL && gn < %lldLL;", (long long)gm->K, (long long)gm->N);
    cu_line(f, "const unsigned short *src = X + (ok ? (gn / %lldLL) * %lldLL + gk * %lldLL + gn %% %lldLL : 0LL);", HW,
            (long long)gm->C * HW, HW, HW);
    cu_line(f, "unsigned short *dst = bs + r * %d + nc%s;", BS, halves ? " + hh" : "");
    if (halves) {
      cu_tc_cp_async8(f, "dst", "src", "ok", x->aligned);
      cu_close(f);
    } else {
      cu_tc_cp_async16(f, "dst", "src", "ok", x->aligned);
    }
    cu_close(f);
  } else {
    cu_line(f, "// B tile (im2col of %s, never stored), computed into registers", f->g->val[gm->an->in[0]].name);
    conv_load_regs(f, x, false, "rb");
  }
  cu_close(f);
}

/* CuTcPipeline.store_stage for conv2d. */
static void conv_store_stage(CuFn *f, const void *ctx, const char *stage) {
  const MmaCtx *x = ctx;
  const CuMmaParams *p = x->p;
  int AS = p->BK + 8, BS = p->BN + 8;
  cu_open(f, "%s", "");
  if (!x->a_direct) {
    cu_line(f, "unsigned short *as = As + (%s) * %d;", stage, p->BM * AS);
    conv_store_regs(f, x, true, "ra", "as", AS);
  }
  if (!x->b_direct) {
    cu_line(f, "unsigned short *bs = Bs + (%s) * %d;", stage, p->BK * BS);
    conv_store_regs(f, x, false, "rb", "bs", BS);
  }
  cu_close(f);
}

/* The shared memory of one stage of p for gm, in bytes. */
static int64_t stage_bytes(const CuGemm *gm, const CuMmaParams *p) {
  int64_t AS = p->BK + 8, BS = gm->tb ? p->BK + 8 : p->BN + 8;
  return (p->BM * AS + (gm->tb ? p->BN * BS : p->BK * BS)) * 2;
}

/* Opens the loops over the thread's accumulator pairs (i, j, h) with the
 * row m and column n of each, and the test that it is in the matrix: four
 * blocks for the caller to close. */
static void open_pairs(CuFn *f, const CuGemm *gm, const CuMmaParams *p, int MI, int NI) {
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", NI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int h = 0; h < 2; h++)");
  cu_tc_frag_coords(f, p->WM, p->WN, "m", "n");
  cu_open(f, "if (m < %lld && n < %lld)", (long long)gm->M, (long long)gm->N);
}

/* Split-K, after the main loop: publish this slice's f32 tile, count it,
 * and leave only the block of the last slice (with the sum of all slices
 * in acc) to run the epilogue; the others go on to the next batch. */
static void split_k(CuFn *f, const CuGemm *gm, const CuMmaParams *p, const char *z, int MI, int NI, int threads,
                    uint64_t part_off) {
  int sk = p->splitk;
  long long MN = (long long)(gm->M * gm->N);
  cu_line(f, "// split-K: this slice's f32 tile into the workspace; the block of the last slice adds all %d", sk);
  cu_open(f, "%s", "");
  cu_line(f, "float *const part = reinterpret_cast<float *>(ws + %lluULL);  // [Z][%d][M][N]", (unsigned long long)part_off, sk);
  open_pairs(f, gm, p, MI, NI);
  cu_line(f, "float *const pp = part + ((%s * %d + blockIdx.y) * %lldLL + m) * %lldLL + n;", z, sk, (long long)gm->M,
          (long long)gm->N);
  if (gm->N % 2 == 0) cu_line(f, "pp[0] = acc[i][j][2 * h], pp[1] = acc[i][j][2 * h + 1];  // n + 1 < N: N is even");
  else cu_line(f, "pp[0] = acc[i][j][2 * h];  if (n + 1 < %lld) pp[1] = acc[i][j][2 * h + 1];", (long long)gm->N);
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__threadfence();  // the tile is visible before it is counted");
  cu_line(f, "#endif");
  cu_line(f, "__syncthreads();");
  cu_line(f, "__shared__ int last_slice;");
  cu_open(f, "if (threadIdx.x == 0)");
  cu_line(f, "unsigned *const count = reinterpret_cast<unsigned *>(ws) + (%s * %lldLL + blockIdx.x);", z,
          (long long)(tiles_of(gm, p->BM, p->BN) / (gm->Z < 1 ? 1 : gm->Z)));
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "const unsigned done = atomicAdd(count, 1u);");
  cu_line(f, "#else");
  cu_line(f, "const unsigned done = (*count)++;  // emulation: blocks run one after another");
  cu_line(f, "#endif");
  cu_line(f, "last_slice = done == %du;", sk - 1);
  cu_line(f, "if (last_slice) *count = 0u;  // the workspace is left zero for the next kernel");
  cu_close(f);
  cu_line(f, "__syncthreads();");
  cu_line(f, "if (!last_slice) continue;");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__threadfence();");
  cu_line(f, "#endif");
  /* Loads first, every element's slices, then the clearing stores: a
   * store between two loads through `part` (offsets the compiler cannot
   * tell apart) would keep the loads from overlapping, and each element's
   * sum would wait for its own round trip to L2 (20 us for a 64 x 64 tile
   * of 8 slices, measured on the H200). */
  /* with an odd N (a conv2d's batch x OH x OW), column n + 1 of the last column is not there */
  const char *two = gm->N % 2 == 0 ? "true" : cu_fmt(f, "(n + 1 < %lld)", (long long)gm->N);
  cu_line(f, "// the sum of the slices in slice order, whichever block came last (L2: written by other SMs)");
  for (int pass = 0; pass < 2; pass++) {
    if (pass) cu_line(f, "// then every slice cleared for the next kernel");
    open_pairs(f, gm, p, MI, NI);
    cu_line(f, "float *const pp = part + (%s * %d * %lldLL + m) * %lldLL + n;", z, sk, (long long)gm->M, (long long)gm->N);
    if (!pass) {
      cu_line(f, "float s0 = 0.0f, s1 = 0.0f;");
      cu_line(f, "#pragma unroll");
      cu_open(f, "for (int q = 0; q < %d; q++)", sk);
      cu_line(f, "#ifdef __CUDA_ARCH__");
      cu_line(f, "s0 += __ldcg(pp + q * %lldLL);  if (%s) s1 += __ldcg(pp + q * %lldLL + 1);", MN, two, MN);
      cu_line(f, "#else");
      cu_line(f, "s0 += pp[q * %lldLL];  if (%s) s1 += pp[q * %lldLL + 1];", MN, two, MN);
      cu_line(f, "#endif");
      cu_close(f);
      cu_line(f, "acc[i][j][2 * h] = s0, acc[i][j][2 * h + 1] = s1;");
    } else {
      cu_line(f, "#pragma unroll");
      cu_line(f, "for (int q = 0; q < %d; q++) { pp[q * %lldLL] = 0.0f;  if (%s) pp[q * %lldLL + 1] = 0.0f; }", sk, MN, two,
              MN);
    }
    cu_close(f);
    cu_close(f);
    cu_close(f);
    cu_close(f);
  }
  cu_close(f);
  (void)threads;
}

/* The MMAs over the k-tile in as / bs (CuTcPipeline.k_tile). */
static void k_tile(CuFn *f, const void *ctx) {
  const MmaCtx *x = ctx;
  const CuGemm *gm = x->gm;
  const CuMmaParams *p = x->p;
  int MI = x->MI, NI = x->NI, AS = p->BK + 8, BS = gm->tb ? p->BK + 8 : p->BN + 8;
  bool bf16 = x->bf16;
  /* lane's row addresses for ldmatrix: A tile i, B tiles j, j+1 */
  const char *pa = cu_fmt(f, "as + (wm * %d + i * 16 + (lane & 15)) * %d + kk + (lane >> 4) * 8", p->WM, AS);
  const char *pb = gm->tb ? cu_fmt(f, "bs + (wn * %d + j * 8 + (lane & 7) + ((lane >> 4) << 3)) * %d + kk + ((lane >> 3) & 1) * 8",
                                   p->WN, BS)
                          : cu_fmt(f, "bs + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * %d + wn * %d + j * 8 + (lane >> 4) * 8",
                                   BS, p->WN);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kk = 0; kk < %d; kk += 16)", p->BK);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "unsigned af[%d][4], bf[%d][2];", MI, NI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "const unsigned short *pa = %s;", pa);
  cu_tc_ldmatrix_x4(f, "af[i]", "pa", false);
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j += 2)", NI);
  cu_line(f, "unsigned r[4];");
  if (gm->tb) cu_line(f, "// B rows are n: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)");
  else cu_line(f, "// B rows are k: transposed matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)");
  cu_line(f, "const unsigned short *pb = %s;", pb);
  cu_tc_ldmatrix_x4(f, "r", "pb", !gm->tb);
  cu_line(f, "bf[j][0] = r[0], bf[j][1] = r[1], bf[j + 1][0] = r[2], bf[j + 1][1] = r[3];");
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "  #pragma unroll");
  cu_open(f, "  for (int j = 0; j < %d; j++)", NI);
  cu_tc_mma_16816(f, bf16, "acc[i][j]", "af[i]", "bf[j][0]", "bf[j][1]");
  cu_close(f);
  cu_line(f, "#else");
  cu_line(f, "// the same fragments, each lane's computed from its row addresses");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_open(f, "  for (int j = 0; j < %d; j++)", NI);
  cu_line(f, "auto a_of = [&](int l, unsigned a[4]) { emu_ldsm_x4(a, [&](int lane) { return %s; }, false, l); };", pa);
  cu_line(f, "auto b_of = [&](int l, unsigned b[2]) {");
  cu_line(f, "  unsigned r[4];");
  cu_line(f, "  const int j0 = j & ~1;");
  cu_line(f, "  emu_ldsm_x4(r, [&](int lane) { const int j = j0; return %s; }, %s, l);", pb, gm->tb ? "false" : "true");
  cu_line(f, "  b[0] = r[(j & 1) * 2], b[1] = r[(j & 1) * 2 + 1];");
  cu_line(f, "};");
  cu_line(f, "emu_mma(acc[i][j], a_of, b_of, %s);", bf16 ? "true" : "false");
  cu_close(f);
  cu_line(f, "#endif");
  cu_close(f); /* kk */
}

void cu_emit_mma(CuFn *f, const CuGemm *gm, const CuMmaParams *params, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = gm->an;
  bool bf16 = gm->yt->dt == DT_BF16;
  /* fewer stages when the arch has less shared memory than asked for */
  CuMmaParams q = *params;
  q.stages = cu_tc_fit_stages(f, q.stages, stage_bytes(gm, &q));
  const CuMmaParams *p = &q;
  cu_mma_format(p, l->variant);
  bool conv = an->op == OP_CONV2D;
  l->kind = conv ? "conv2d" : "matmul";
  if (!cu_tc_smem_fits(f, l, p->stages, stage_bytes(gm, p))) return;
  int warps_m = p->BM / p->WM, warps_n = p->BN / p->WN, threads = 32 * warps_m * warps_n;
  int MI = p->WM / 16, NI = p->WN / 8;
  int AS = p->BK + 8, BS = gm->tb ? p->BK + 8 : p->BN + 8;
  int a_stage = p->BM * AS, b_stage = gm->tb ? p->BN * BS : p->BK * BS;
  int smem_elems = p->stages * (a_stage + b_stage);
  int64_t KT = ceil_div(gm->K, p->BK);
  int64_t KTS = ceil_div(KT, p->splitk);
  uint64_t part_off = 0, ws = workspace_bytes(gm, p, &part_off);

  if (!cu_tc_launch(f, gm, p->BM, p->BN, threads, p->splitk, l)) return;
  if (ws > MMA_MAX_WORKSPACE) {
    cu_fail(f, ST_UNSUPPORTED, "variant %s needs a workspace of %llu bytes", l->variant, (unsigned long long)ws);
    return;
  }
  l->smem = (unsigned)(smem_elems * 2);
  l->workspace = ws;
  if (gm->Z == 0) return;

  if (conv)
    cu_line(f, "// variant: tensor cores (mma.sync.m16n8k16.row.col.f32.%s, ldmatrix), conv2d as an implicit GEMM: weight %s x im2col(%s)",
            bf16 ? "bf16.bf16" : "f16.f16", g->val[an->in[1]].name, g->val[an->in[0]].name);
  else
    cu_line(f, "// variant: tensor cores (mma.sync.m16n8k16.row.col.f32.%s, ldmatrix, cp.async), %s x %s%s",
            bf16 ? "bf16.bf16" : "f16.f16", g->val[an->in[0]].name, g->val[an->in[1]].name,
            gm->tb ? " (B given as [N, K])" : "");
  cu_line(f, "// parameters: BM %d, BN %d, BK %d, warps %d x %d of %d x %d, %d stages, %d K slices; M %lld, N %lld, K %lld, batch %lld",
          p->BM, p->BN, p->BK, warps_m, warps_n, p->WM, p->WN, p->stages, p->splitk, (long long)gm->M, (long long)gm->N,
          (long long)gm->K, (long long)gm->Z);
  cu_tc_emu_helpers(f);
  cu_tc_smem_decl(f, "unsigned short", "smelt_mma_smem", smem_elems);
  cu_line(f, "unsigned short *const As = smelt_mma_smem;  // [%d stages][%d][%d] (rows padded by 8)", p->stages, p->BM, AS);
  cu_line(f, "unsigned short *const Bs = smelt_mma_smem + %d;  // [%d stages][%d][%d]", p->stages * a_stage, p->stages,
          gm->tb ? p->BN : p->BK, BS);
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  cu_tc_block_tile(f, gm, p->BM, p->BN, p->WM, p->WN);
  if (p->splitk > 1)
    cu_line(f, "const int kt0 = (int)blockIdx.y * %lld, nt = kt0 + %lld <= %lld ? %lld : %lld - kt0;  // this slice's k-tiles",
            (long long)KTS, (long long)KTS, (long long)KT, (long long)KTS, (long long)KT);
  else cu_line(f, "const int kt0 = 0, nt = %lld;  // k-tiles", (long long)KT);
  const char *aligned;
  if (conv) {
    bool a_direct = conv_a_direct(f, gm);
    const char *z = cu_tc_batch_loop(f, gm, &aligned);
    if (a_direct)
      cu_line(f, "const unsigned short *A = reinterpret_cast<const unsigned short *>(a%d) + %s * %lldLL;  // %s, group %s",
              f->arg_of[an->in[1]], z, (long long)(gm->M * gm->K), g->val[an->in[1]].name, z);
    bool b_direct = conv_b_direct(f, gm);
    if (b_direct)
      cu_line(f, "const unsigned short *X = reinterpret_cast<const unsigned short *>(a%d) + %s * %lldLL;  // %s, group %s",
              f->arg_of[an->in[0]], z, (long long)(gm->Cg * gm->H * gm->W), g->val[an->in[0]].name, z);
    MmaCtx x = {gm, p, threads, MI, NI, bf16, aligned, z, true, a_direct, b_direct};
    if (!b_direct) cu_line(f, "unsigned rb[%d][4];  // this thread's chunks of the next B tile", conv_chunks(&x, false));
    if (!a_direct) cu_line(f, "unsigned ra[%d][4];  // and of the next A tile", conv_chunks(&x, true));
    bool staged = !a_direct || !b_direct;
    cu_tc_pipeline(f, &(CuTcPipeline){p->stages, MI, NI, "kt0", "unsigned short", a_stage, b_stage, conv_load_stage, k_tile,
                                      &x, staged ? conv_store_stage : NULL});
    if (p->splitk > 1) split_k(f, gm, p, z, MI, NI, threads, part_off);
    cu_tc_epilogue(f, gm, p->WM, p->WN, MI, NI, z, epi, nepi);
    cu_close(f); /* z */
    return;
  }
  int a0 = f->arg_of[an->in[0]], b0 = f->arg_of[an->in[1]];
  const char *z = cu_tc_batch_loop(f, gm, &aligned);
  cu_line(f, "const unsigned short *A = reinterpret_cast<const unsigned short *>(a%d) + %s;  // %s", a0,
          cu_gemm_batch_offset(f, gm, z, gm->at), g->val[an->in[0]].name);
  cu_line(f, "const unsigned short *B = reinterpret_cast<const unsigned short *>(a%d) + %s;  // %s", b0,
          cu_gemm_batch_offset(f, gm, z, gm->bt), g->val[an->in[1]].name);
  MmaCtx x = {gm, p, threads, MI, NI, bf16, aligned, z, false, true, true};
  cu_tc_pipeline(f, &(CuTcPipeline){p->stages, MI, NI, "kt0", "unsigned short", a_stage, b_stage, load_stage, k_tile, &x, NULL});
  if (p->splitk > 1) split_k(f, gm, p, z, MI, NI, threads, part_off);
  cu_tc_epilogue(f, gm, p->WM, p->WN, MI, NI, z, epi, nepi);
  cu_close(f); /* z */
}

/* ---- the family's entry (cu_families.h) ---- */

static void family_default(const CuFn *f, const CuGemm *gm, char out[CG_VARIANT_LEN]) {
  CuMmaParams p;
  cu_mma_default_params(gm, &p);
  cu_mma_format(&p, out);
  (void)f;
}

static int family_candidates(const CuFn *f, const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max) {
  (void)f;
  return cu_mma_candidates(gm, out, max);
}

static bool family_emit(CuFn *f, const CuGemm *gm, const char *tok, const int *epi, int nepi, CuLaunch *l) {
  CuMmaParams p;
  if (!cu_mma_parse(tok, &p)) return false;
  cu_emit_mma(f, gm, &p, epi, nepi, l);
  return true;
}

const CuGemmFamily cu_family_mma = {"mma", cu_mma_eligible, family_default, family_candidates, family_emit};
