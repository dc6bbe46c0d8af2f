/* Shared inside the CUDA backend: the state of one kernel under generation
 * and the helpers every kernel emitter uses.
 *
 * "Emit at coordinates", as in the LLVM backend (codegen/llvm/cg_internal.h),
 * but producing C text: cu_emit(f, v, coords) appends the statements that
 * compute tensor v at a coordinate vector (C expressions, one per dim of v)
 * and returns the C expression of the result.  A value the kernel receives
 * as an argument is loaded; a value a member of the group computes is its op
 * applied to its inputs emitted at derived coordinates (the same ones for
 * elementwise ops, right-aligned with size-1 dims at 0 for broadcasting,
 * permuted for transpose, linearised and split again for reshape, ...).
 * The group's anchor (reduction, contraction, attention, pooling) is the one
 * value cu_emit cannot compute: the kernel computes it and installs it as an
 * override valid at exactly the coordinates it was computed for.
 *
 * Lanes: to use 16-byte loads and stores, one thread handles `lanes`
 * consecutive elements of the innermost dim.  Coordinates are then affine
 * in the lane: lane j's coordinate on dim d is c[d] + step[d] * j, and a
 * result is one expression per lane.  A load whose lanes are consecutive in
 * memory and aligned becomes one vector load; an op whose coordinate
 * transform does not stay affine (a reshape across the innermost dim, a
 * concat boundary inside a vector, rope, a gather of varying indices) is
 * emitted lane by lane with scalar coordinates instead.  Scalar code is the
 * lanes == 1 case of the same machinery.
 *
 * Results are memoised per (value, coordinates) in the C scope where their
 * statements were written; cu_scope_push/pop bracket every `{ ... }` the
 * emitters open, so a memoised name is never used outside its block.
 *
 * Errors are sticky (cu_fail keeps the first); emitters return a harmless
 * expression and go on, and the driver checks f->err at the end.
 */
#ifndef SMELT_CU_INTERNAL_H
#define SMELT_CU_INTERNAL_H

#include "codegen/cuda/cg_cuda.h"
#include "codegen/lower.h"
#include "ir/arena.h"

#define CU_MAX_LANES 8
/* Threads of an elementwise block, and the largest grid a grid-stride loop
 * gets (enough blocks to fill any GPU several times over). */
#define CU_EW_THREADS 256
#define CU_MAX_GRID 65535
/* Nesting of the C blocks the emitters open. */
#define CU_MAX_DEPTH 64

/* ---- text ---- */
typedef struct {
  char *s;
  size_t len, cap;
} CuBuf;

void cu_buf_printf(CuBuf *b, const char *fmt, ...) SMELT_PRINTF(2, 3);
void cu_buf_append(CuBuf *b, const char *s, size_t n);
void cu_buf_free(CuBuf *b);
/* Takes the text out of b (a malloc'd string; "" when empty) and resets b. */
char *cu_buf_take(CuBuf *b);

/* ---- coordinates and values ---- */
typedef struct {
  int rank, lanes;
  const char *c[IR_MAX_RANK]; /* lane 0's coordinate, a C expression */
  int64_t step[IR_MAX_RANK];  /* lane j adds step * j */
  bool aligned;               /* every c[d] with step[d] != 0 is a multiple of lanes */
  /* the same is true of the coordinates, but aligned is false because the
   * pointers may not be (no vector accesses): an emitter's column pairs
   * (2j, 2j + 1) without the alignment guarantee */
  bool whole_lanes;
} CuCoords;

typedef struct {
  const char *l[CU_MAX_LANES]; /* per lane: an expression of the value's compute type */
} CuVal;

typedef struct {
  int value;
  const char *key;
  CuVal val;
} CuMemo;

typedef struct {
  const Graph *g;
  const Kernel *k;
  const Group *grp;
  const CgCudaOptions *opt;
  Arena arena;       /* every string made while generating this kernel */
  CuBuf *out;        /* where statements go now */
  int indent;
  int tmp;           /* next temporary's number */
  const char *idx;   /* index type: "int", or "long long" when a tensor has >= 2^31 elements */
  int *arg_of;       /* per value: its argument index, -1 if none */
  bool *member;      /* per node: in this group */
  bool *dep;         /* per node: reads the anchor's result, directly or through members */
  int anchor;        /* node id, -1 for a group without one */
  int nin;           /* arguments [0, nin) are inputs, [nin, nargs) outputs */
  /* the override: value ov_value at coordinates ov_key is ov_val */
  int ov_value;
  const char *ov_key;
  CuVal ov_val;
  CuMemo *memo;
  int nmemo, cap_memo;
  int *vec_bytes;    /* per argument: widest vector access in the current vector path */
  bool vectorised;   /* the kernel has a vector path */
  int open_marks[CU_MAX_DEPTH]; /* per open block: the memo mark at its start */
  smelt_status err;  /* the first error */
  const char *force; /* the variant this kernel must use (CgCudaOptions.force), or NULL */
  int nanchors;      /* reduction/contraction/opaque nodes in the group (1 at most to generate) */
} CuFn;

/* Generation state of kernel k (module.c); cu_fn_fini releases it, also
 * after a failed init. */
smelt_status cu_fn_init(CuFn *f, const Graph *g, const Kernel *k, const CgCudaOptions *opt, const char *force) SMELT_MUST_USE;
void cu_fn_fini(CuFn *f);

void cu_fail(CuFn *f, StatusCode code, const char *fmt, ...) SMELT_PRINTF(3, 4);
/* Appends one line of code at the current indentation. */
void cu_line(CuFn *f, const char *fmt, ...) SMELT_PRINTF(2, 3);
/* A fresh temporary name "tN". */
const char *cu_tmp(CuFn *f);
const char *cu_fmt(CuFn *f, const char *fmt, ...) SMELT_PRINTF(2, 3);
/* Opens / closes a C block ("{" / "}") with its memo scope. */
void cu_open(CuFn *f, const char *fmt, ...) SMELT_PRINTF(2, 3);
void cu_close(CuFn *f);
int cu_scope_push(CuFn *f);
void cu_scope_pop(CuFn *f, int mark);

/* Index arithmetic on expressions, folding literals ("0", "1"). */
const char *cu_mulk(CuFn *f, const char *e, int64_t k);
const char *cu_addk(CuFn *f, const char *e, int64_t k);
const char *cu_add(CuFn *f, const char *a, const char *b);
bool cu_is_lit(const char *e, int64_t *out);

/* Coordinates of every element of shape t at linear index `lin` (an
 * expression), as variables declared at the current point; dims of size 1
 * get "0". */
void cu_delinearize(CuFn *f, const char *lin, const TensorType *t, CuCoords *out);
/* Scalar coordinates (lanes 1) from expressions. */
void cu_coords_scalar(CuCoords *co, int rank, const char *const *c);
/* Lane j's coordinate on dim d. */
const char *cu_lane_coord(CuFn *f, const CuCoords *co, int j, int d);
/* Coordinates of operand type `in` broadcast (numpy, right-aligned) to the
 * coordinates co of a result of rank co->rank. */
void cu_bcast_coords(const TensorType *in, const CuCoords *co, CuCoords *out);

/* ---- types and scalar operations (scalar.c) ---- */
const char *cu_ctype(DType dt);  /* compute type: float for f16/bf16/f32 */
const char *cu_stype(DType dt);  /* storage element type */
/* A literal of dt's compute type. */
const char *cu_const(CuFn *f, DType dt, double v);
/* Storage -> compute and compute -> storage of one element expression. */
const char *cu_from_storage(CuFn *f, DType dt, const char *raw);
const char *cu_to_storage(CuFn *f, DType dt, const char *v);
/* `cast` from one compute value to another, with the reference's rules:
 * floats to ints truncate and saturate (NaN to 0), ints saturate, to bool is
 * != 0, to f16/bf16 rounds once (so that a later cast back sees the
 * rounded value). */
const char *cu_convert(CuFn *f, const char *v, DType from, DType to);
/* An integer result brought into its dtype's range (what the reference's
 * store does after every node); floats are returned unchanged. */
const char *cu_normalise(CuFn *f, DType dt, const char *v);
/* Unary / binary op expressions on compute values of dtype dt. */
const char *cu_unary(CuFn *f, const Node *n, DType dt, const char *x);
const char *cu_binary(CuFn *f, Op op, DType dt, const char *a, const char *b);
/* Reduction helpers for accumulators of compute type: sum, max, min with
 * numpy's NaN propagation. */
const char *cu_max_nan(CuFn *f, DType dt, const char *a, const char *b);
const char *cu_min_nan(CuFn *f, DType dt, const char *a, const char *b);

/* ---- emission (emit.c) ---- */
/* v at coordinates co (co->rank == rank of v). */
void cu_emit(CuFn *f, int v, const CuCoords *co, CuVal *out);
/* Records that v at co is val (in the current scope): a value the kernel
 * already holds, e.g. a row kept in registers, is then not computed again. */
void cu_memo_put(CuFn *f, int v, const CuCoords *co, const CuVal *val);
/* Stores lanes val of value v (an output argument) at coordinates co. */
void cu_store(CuFn *f, int v, const CuCoords *co, const CuVal *val);
/* Installs / clears the anchor override. */
void cu_set_override(CuFn *f, int v, const CuCoords *co, const CuVal *val);
void cu_clear_override(CuFn *f);
/* Whether value v is stored by this kernel (an output argument). */
bool cu_is_output(const CuFn *f, int v);
/* The widest vector a loop over shape t with elements of the group's
 * types can use: 16 bytes of the smallest stored element type. */
int cu_pick_lanes(const CuFn *f, const TensorType *t, const int *vals, int n);

/* Grid-stride loops that compute and store values vals[0..n) over their
 * shapes (one loop per distinct shape; all threads of all blocks take
 * part), vectorised where the innermost dim allows. */
void cu_store_loops(CuFn *f, const int *vals, int n);
/* The alignment test of the pointers a vector path used, "" when none. */
const char *cu_vec_condition(CuFn *f);

/* ---- kernels ---- */
typedef struct {
  unsigned grid[3], block[3], smem;
  const char *kind;
  /* matmul / attention: the variant token (FmtCudaLaunch.variant) */
  char variant[CG_VARIANT_LEN];
  uint64_t workspace;    /* > 0: the kernel has a `ws` parameter (FmtCudaLaunch.workspace) */
  int ntmaps;            /* TMA descriptors: parameters tm0, tm1, ... */
  FmtCudaTmap tmaps[FMT_MAX_TMAPS];
  int min_blocks;        /* > 0: __launch_bounds__(threads, min_blocks) */
} CuLaunch;

/* The variant this kernel must use (CgCudaOptions.force), or NULL. */
const char *cu_forced_variant(const CuFn *f);
/* Reports a table miss through CgCudaOptions.log. */
void cu_log(CuFn *f, const char *fmt, ...) SMELT_PRINTF(2, 3);

void cu_emit_elemwise(CuFn *f, CuLaunch *l);
void cu_emit_reduction(CuFn *f, CuLaunch *l);
void cu_emit_contraction(CuFn *f, CuLaunch *l);
void cu_emit_attention(CuFn *f, CuLaunch *l);
void cu_emit_pool(CuFn *f, CuLaunch *l);

/* Stored values split by dependence on the anchor: epi[] depend on it (and
 * must have the anchor result's shape), side[] do not.  Arrays in f->arena. */
void cu_split_outputs(CuFn *f, int **out_epi, int *out_nepi, int **out_side, int *out_nside);
/* Emits and stores every epilogue value at anchor-result coordinates co,
 * the anchor's result there being val. */
void cu_store_epilogue(CuFn *f, const int *epi, int nepi, const CuCoords *co, const CuVal *val);
/* Ops that only move data (transpose, reshape, squeeze, unsqueeze): on the
 * CUDA target they may follow the anchor in an epilogue (fuse.c), which
 * then stores each element where they move it. */
bool cu_moves_data(Op op);
/* A grid of n blocks, capped for grid-stride loops. */
unsigned cu_grid_for(int64_t items, int threads);

/* ---- the compilation cache (cache.c) ---- */
/* The cache key: SHA-256 over source, options, arch and NVRTC version. */
void cu_cache_key(const char *source, const char *const *opts, int nopts, const char *arch, const char *version,
                  char out[65]);
/* True (and out's cubin/ptx filled) when dir holds a valid entry for key. */
bool cu_cache_read(const char *dir, const char *key, CgCudaBinary *out);
/* Best effort: a failure to write only costs a later recompilation. */
void cu_cache_write(const char *dir, const char *key, const CgCudaBinary *b);

/* ---- contractions (contraction.c, mma.c, gemv.c) ----
 * One contraction as a batch of GEMMs C[M,N] = A[M,K] B[K,N] over z (the
 * broadcast batch for matmul, the group for conv2d).  load_a / load_b emit
 * an operand element through cu_emit (so fused producers are computed in
 * the load); result gives the anchor's coordinates and value for C[m,n]. */
typedef struct CuGemm CuGemm;
struct CuGemm {
  int64_t M, N, K, Z;
  bool a_m_fast, b_n_fast; /* which tile index runs fastest when loading (coalescing) */
  void (*load_a)(CuFn *f, const CuGemm *gm, const char *z, const char *m, const char *k, CuVal *out);
  void (*load_b)(CuFn *f, const CuGemm *gm, const char *z, const char *k, const char *n, CuVal *out);
  void (*result)(CuFn *f, const CuGemm *gm, const char *z, const char *m, const char *n, const char *acc,
                 CuCoords *out_co, CuVal *out_val);
  const Node *an;
  const TensorType *at, *bt, *yt;
  /* matmul */
  bool ta, tb, a1, b1;
  int nbatch;              /* batch dims of the result */
  /* conv2d */
  int64_t C, H, W, O, Cg, KH, KW, OH, OW, Og, sh, sw, pt, pl, dh, dw;
};

/* ---- variant selection (variants.c) ----
 * The variant token this kernel should use: the forced one, else the
 * tuning table's row for its shape (*out_from_table set), else NULL: the
 * emitter then uses its heuristic and calls cu_note_heuristic, which logs
 * the table miss.  Each emitter copies the token it used into l->variant. */
const char *cu_pick_variant(CuFn *f, bool *out_from_table);
void cu_note_heuristic(CuFn *f, const char *variant);
/* Whether Hopper-only variants (wgmma, TMA) may be used: opt->arch is an
 * 'a' arch of compute capability 9.0. */
bool cu_hopper(const CuFn *f);

/* The tensor-core kernel's compile-time parameters (a tuner may vary
 * them): a BM x BN block tile stepping BK along K, warps of WM x WN
 * (BM/WM * BN/WN warps), `stages` shared-memory buffers in flight,
 * split into `splitk` slices of K (1: none) whose partial tiles are added
 * in the workspace by the last block to finish. */
typedef struct {
  int BM, BN, BK, WM, WN, stages, splitk;
} CuMmaParams;
/* Token syntax "mma:bm=128,bn=128,bk=32,wm=64,wn=32,st=3,sk=1". */
bool cu_mma_parse(const char *tok, CuMmaParams *out);
void cu_mma_format(const CuMmaParams *p, char out[CG_VARIANT_LEN]);
/* Candidates for the tuner (valid for gm; the default first). */
int cu_mma_candidates(const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max);

/* Tensor-core pieces (mma.c) the mma.sync kernels share (mma.c,
 * attention.c): the host emulation of ldmatrix/mma.sync (emitted once per
 * kernel, under #ifndef __CUDA_ARCH__), a 16-byte global -> shared copy
 * (cp.async when `aligned`, zero-filled when !ok), ldmatrix .x4 [.trans]
 * into regs[4], and c[4] += a[4] * (b0, b1) with mma.sync m16n8k16. */
void cu_tc_emu_helpers(CuFn *f);
void cu_tc_cp_async16(CuFn *f, const char *dst, const char *src, const char *ok, const char *aligned);
void cu_tc_ldmatrix_x4(CuFn *f, const char *regs, const char *ptr, bool trans);
void cu_tc_mma_16816(CuFn *f, bool bf16, const char *c, const char *a, const char *b0, const char *b1);

/* The block-tiled, cp.async-pipelined GEMM skeleton (mma.c) that the
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
/* acc[MI][NI][4] zeroed, then tiles kt0 .. kt0 + nt - 1 (k-tiles; `nt` and,
 * when kt0 is not NULL, `kt0` are in scope) through `stages` shared
 * buffers: load_stage(f, ctx, buf, tile) emits the loads of k-tile `tile`
 * into buffer `buf` (cp.async; the pipeline commits them as one group);
 * k_tile(f, ctx) the MMAs over the tile in `as` / `bs` (of type elem, one
 * stage a_stage / b_stage elements of As / Bs).  Ends after the last tile
 * with every copy landed and the block synchronised. */
typedef struct {
  int stages, MI, NI;
  const char *kt0;
  const char *elem;
  int a_stage, b_stage;
  void (*load_stage)(CuFn *f, const void *ctx, const char *buf, const char *tile);
  void (*k_tile)(CuFn *f, const void *ctx);
  const void *ctx;
} CuTcPipeline;
void cu_tc_pipeline(CuFn *f, const CuTcPipeline *pl);
void cu_tc_frag_coords(CuFn *f, int WM, int WN, const char *m, const char *n);
void cu_tc_epilogue(CuFn *f, const CuGemm *gm, int WM, int WN, int MI, int NI, const char *z, const int *epi, int nepi);

/* mma.c: matmul with f16/bf16 operands that are kernel arguments, A not
 * transposed, K and N multiples of 8 (16-byte rows), on sm_80+. */
bool cu_mma_eligible(const CuFn *f, const CuGemm *gm);
void cu_mma_default_params(const CuGemm *gm, CuMmaParams *out);
/* Emits the kernel body (mma.sync m16n8k16, ldmatrix, cp.async) storing
 * the epilogue values epi[0..nepi) from the f32 accumulators. */
void cu_emit_mma(CuFn *f, const CuGemm *gm, const CuMmaParams *p, const int *epi, int nepi, CuLaunch *l);
/* The C expression of the element offset of batch z's matrix in operand t
 * (rank-2 batch dims broadcast against the result's), as a long long. */
const char *cu_gemm_batch_offset(CuFn *f, const CuGemm *gm, const char *z, const TensorType *t);

/* tf32.c: f32 matmul on the tensor cores with operands rounded to TF32
 * (mma.sync m16n8k8 .tf32, cvt.rna.tf32.f32, cp.async), only when
 * CgCudaOptions.allow_tf32: A [M, K] or [K, M] (transpose_a), B [K, N] or
 * [N, K] (transpose_b), kernel arguments with 16-byte rows (their
 * contiguous dim a multiple of 4), batched, on sm_80+.  The parameters
 * are CuMmaParams' without split-K; token
 * "tf32:bm=128,bn=256,bk=32,wm=64,wn=64,st=3". */
typedef struct {
  int BM, BN, BK, WM, WN, stages;
} CuTf32Params;
bool cu_tf32_eligible(const CuFn *f, const CuGemm *gm);
bool cu_tf32_parse(const char *tok, CuTf32Params *out);
void cu_tf32_format(const CuTf32Params *p, char out[CG_VARIANT_LEN]);
void cu_tf32_default_params(const CuGemm *gm, CuTf32Params *out);
int cu_tf32_candidates(const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max);
void cu_emit_tf32(CuFn *f, const CuGemm *gm, const CuTf32Params *p, const int *epi, int nepi, CuLaunch *l);

/* gemv.c: M <= 8 (decode), B a kernel argument with 16-byte rows.
 * Parameters: see gemv.c (CuGemvParams); token "gemv:...". */
typedef struct {
  int warps;    /* warps per block */
  int cols;     /* output columns per warp */
  int unroll;   /* 16-byte loads in flight per lane */
  int splitk;   /* slices of K added in the workspace (1: none) */
} CuGemvParams;
bool cu_gemv_eligible(const CuFn *f, const CuGemm *gm);
bool cu_gemv_parse(const char *tok, CuGemvParams *out);
void cu_gemv_format(const CuGemvParams *p, char out[CG_VARIANT_LEN]);
void cu_gemv_default_params(const CuFn *f, const CuGemm *gm, CuGemvParams *out);
int cu_gemv_candidates(const CuFn *f, const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max);
void cu_emit_gemv(CuFn *f, const CuGemm *gm, const CuGemvParams *p, const int *epi, int nepi, CuLaunch *l);

/* wgmma.c: Hopper (sm_90a) matmul: TMA loads into 128-byte-swizzled
 * shared memory, wgmma from shared memory, producer/consumer warpgroups.
 * f16/bf16, A [M,K] and B [N,K] (transpose_b) kernel arguments, K a
 * multiple of 8; token "wgmma:bm=128,bn=256,bk=64,st=4". */
typedef struct {
  int BM, BN, BK, stages, consumers;
  int splitk; /* slices of K per tile, added by the last to finish (1: none); token ",sk=N", omitted when 1 */
} CuWgmmaParams;
bool cu_wgmma_eligible(const CuFn *f, const CuGemm *gm);
bool cu_wgmma_parse(const char *tok, CuWgmmaParams *out);
void cu_wgmma_format(const CuWgmmaParams *p, char out[CG_VARIANT_LEN]);
void cu_wgmma_default_params(const CuGemm *gm, CuWgmmaParams *out);
int cu_wgmma_candidates(const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max);
void cu_emit_wgmma(CuFn *f, const CuGemm *gm, const CuWgmmaParams *p, const int *epi, int nepi, CuLaunch *l);

/* contraction.c: sets up the CuGemm of the kernel's matmul / conv2d
 * anchor; the variants it can generate, the heuristic's first. */
void cu_gemm_setup(const CuFn *f, CuGemm *out);
int cu_contraction_candidates(CuFn *f, char (*out)[CG_VARIANT_LEN], int max);

/* attention.c: the attention variants ("flash:...", "flashdec:...",
 * "simple") for the tuner. */
int cu_attention_candidates(CuFn *f, char (*out)[CG_VARIANT_LEN], int max);

#endif
