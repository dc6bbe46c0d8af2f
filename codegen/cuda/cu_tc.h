/* Tensor-core helpers (tc.c) shared by the GEMM families mma and tf32 and
 * by the flash attention kernels: mma.sync fragments, cp.async copies and
 * the block-tiled, cp.async-pipelined GEMM skeleton.  Above cu_gemm.h and
 * cu_fn.h; below the kernel families. */
#ifndef SMELT_CU_TC_H
#define SMELT_CU_TC_H

#include "codegen/cuda/cu_fn.h"
#include "codegen/cuda/cu_gemm.h"

/* Tensor-core pieces the mma.sync kernels share (mma.c,
 * flash.c, flashdec.c): the host emulation of ldmatrix/mma.sync (emitted once per
 * kernel, under #ifndef __CUDA_ARCH__), a 16-byte global -> shared copy
 * (cp.async when `aligned`, zero-filled when !ok), ldmatrix .x4 [.trans]
 * into regs[4], and c[4] += a[4] * (b0, b1) with mma.sync m16n8k16. */
void cu_tc_emu_helpers(CuFn *f);
void cu_tc_cp_async16(CuFn *f, const char *dst, const char *src, const char *ok, const char *aligned);
/* The same for 8 bytes (4 halves). */
void cu_tc_cp_async8(CuFn *f, const char *dst, const char *src, const char *ok, const char *aligned);
void cu_tc_ldmatrix_x4(CuFn *f, const char *regs, const char *ptr, bool trans);
void cu_tc_mma_16816(CuFn *f, bool bf16, const char *c, const char *a, const char *b0, const char *b1);

/* The block-tiled, cp.async-pipelined GEMM skeleton that the
 * mma.sync matmuls share (mma.c, tf32.c): the shared memory a block may
 * use on f->opt->arch; cu_tc_cp_async16 for 4 floats; the launch (block of
 * `threads`, grid.x the BM x BN tiles, grid.y `slices`, grid.z the batch;
 * false after cu_fail); the shared array `name` of `elems` elements of
 * `elem`; the warp's sub-tile (wm, wn) and the block's tile origin (m0, n0)
 * in raster groups of 8 tile rows; the alignment flag and the batch loop
 * (returns z; *aligned: "true" or "aligned16"); the pipeline (below); the
 * row m / column n of accumulator pair h of tile (i, j); and the epilogue
 * (the group's elementwise consumers on acc, stored). */
int64_t cu_tc_smem_limit(const CuFn *f);
/* The stages (at least 2, at most `stages`) whose buffers (per_stage
 * bytes each) fit that limit; then whether `stages` of them do (false
 * after cu_fail, naming the launch's variant). */
int cu_tc_fit_stages(const CuFn *f, int stages, int64_t per_stage);
bool cu_tc_smem_fits(CuFn *f, const CuLaunch *l, int stages, int64_t per_stage);
void cu_tc_cp_async16_f32(CuFn *f, const char *dst, const char *src, const char *ok, const char *aligned);
bool cu_tc_launch(CuFn *f, const CuGemm *gm, int BM, int BN, int threads, int slices, CuLaunch *l);
void cu_tc_smem_decl(CuFn *f, const char *elem, const char *name, int elems);
void cu_tc_block_tile(CuFn *f, const CuGemm *gm, int BM, int BN, int WM, int WN);
const char *cu_tc_batch_loop(CuFn *f, const CuGemm *gm, const char **aligned);
/* Commits the cp.async copies issued since the last commit as one group
 * (the pipeline and flash attention share these). */
void cu_tc_commit_group(CuFn *f);
/* Waits until at most n of this thread's cp.async groups are pending. */
void cu_tc_wait_group(CuFn *f, int n);

/* acc[MI][NI][4] zeroed, then tiles kt0 .. kt0 + nt - 1 (k-tiles; `nt` and,
 * when kt0 is not NULL, `kt0` are in scope) through `stages` shared
 * buffers: load_stage(f, ctx, buf, tile) emits the loads of k-tile `tile`
 * into buffer `buf` (cp.async; the pipeline commits them as one group);
 * k_tile(f, ctx) the MMAs over the tile in `as` / `bs` (of type elem, one
 * stage a_stage / b_stage elements of As / Bs).  Ends after the last tile
 * with every copy landed and the block synchronised.
 * With store_stage (not NULL), load_stage may also load elements into
 * registers (declared by the caller before the pipeline) and
 * store_stage(f, ctx, buf) writes them into buffer `buf`: the pipeline
 * issues tile kt+stages-1's loads before the MMAs of tile kt and stores
 * them after, so the loads are in flight while the tensor cores work. */
typedef struct {
  int stages, MI, NI;
  const char *kt0;
  const char *elem;
  int a_stage, b_stage;
  void (*load_stage)(CuFn *f, const void *ctx, const char *buf, const char *tile);
  void (*k_tile)(CuFn *f, const void *ctx);
  const void *ctx;
  void (*store_stage)(CuFn *f, const void *ctx, const char *buf);
} CuTcPipeline;
void cu_tc_pipeline(CuFn *f, const CuTcPipeline *pl);
void cu_tc_frag_coords(CuFn *f, int WM, int WN, const char *m, const char *n);
void cu_tc_epilogue(CuFn *f, const CuGemm *gm, int WM, int WN, int MI, int NI, const char *z, const int *epi, int nepi);
/* Whether the epilogue hands accumulators over in pairs of columns n, n+1
 * (neighbours in the result: an even N; for conv2d an even OW, so that a
 * pair never straddles two rows of the image). */
bool cu_tc_pairs(const CuGemm *gm);

#endif
