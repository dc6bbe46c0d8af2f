/* The GEMM kernel families (mma.c, tf32.c, gemv.c, wgmma.c): each parses
 * and prints its own variant tokens, says whether it can compute a GEMM,
 * lists its tuning candidates and emits its kernel.  contraction.c reaches
 * them only through their CuGemmFamily entries, in one table; the
 * parameter types and functions below are also what the unit tests use.
 * Above cu_tc.h; the families do not call each other. */
#ifndef SMELT_CU_FAMILIES_H
#define SMELT_CU_FAMILIES_H

#include "codegen/cuda/cu_tc.h"

/* A family of GEMM kernels, as contraction.c's table holds it. */
typedef struct {
  const char *name; /* the token's prefix: "mma" in "mma:bm=128,..." */
  /* Whether the family can compute gm for f's target and options (arch,
   * allow_tf32, args_aligned, the operands being arguments). */
  bool (*eligible)(const CuFn *f, const CuGemm *gm);
  /* The heuristic's parameters for gm (an eligible one), as a token. */
  void (*default_token)(const CuFn *f, const CuGemm *gm, char out[CG_VARIANT_LEN]);
  /* Tuning candidates for gm (an eligible one): at most max tokens. */
  int (*candidates)(const CuFn *f, const CuGemm *gm, char (*out)[CG_VARIANT_LEN], int max);
  /* Parses tok and emits its kernel for gm (an eligible one), storing the
   * epilogue values epi[0..nepi); false, with nothing emitted, when tok is
   * not of this family. */
  bool (*emit)(CuFn *f, const CuGemm *gm, const char *tok, const int *epi, int nepi, CuLaunch *l);
} CuGemmFamily;

extern const CuGemmFamily cu_family_gemv, cu_family_wgmma, cu_family_mma, cu_family_tf32;
/* qgemv.c: M <= 8 against a weight dequantize(q, s) computed in the kernel
 * (int4/uint4/int8/uint8/fp8 [N, K], a scale per group of K and, for the
 * integer codes, an optional zero point); token "qgemv:w=4,c=2,u=4". */
extern const CuGemmFamily cu_family_qgemv;
/* qmma.c: the same on the tensor cores (codes widened to f16 in
 * registers, mma.sync with f32 sums) when A is f16, the zero points (if
 * any) are of the codes' dtype and a group holds whole 16-byte chunks;
 * token "qmma:w=4,s=4". */
extern const CuGemmFamily cu_family_qmma;
/* The quantised B of a decode GEMM, as both quantised families read it
 * (qgemv.c): the dequantize the kernel computes, its operands' dtypes and
 * argument indices, the chunk and the group. */
typedef struct {
  const Node *dq;
  DType qdt, sdt, zdt;   /* zdt: DT_INVALID without zero points */
  int q0, s0, z0, a0;    /* argument indices of the codes, scales, zeros (-1: none) and A (-1: computed) */
  int E;                 /* codes per 16-byte chunk: 32 of 4 bits, 16 of 8 */
  int64_t G, ng, KC, row_bytes; /* group along K (K: per channel), groups, chunks and bytes of a column */
} CuQuantB;
/* Fills *out when gm is a decode GEMM (1 <= M <= 8, A not transposed, B
 * [N, K] and not a vector) whose B is a dequantize computed in the kernel
 * from kernel arguments: codes i4/u4/i8/u8/fp8 of rank 2 grouped along
 * axis 1, float scales other than f64; false otherwise (each family then
 * adds its own rules). */
bool cu_quant_b(const CuFn *f, const CuGemm *gm, CuQuantB *out);
/* gemv.c's transpose reduction of the P values acc[0..P) (a power of two)
 * over the lanes that share lane % lo (offsets 16 .. lo), emitted into f;
 * returns how many values each lane ends with (gemv.c says which). */
int cu_gemv_transpose_reduce(CuFn *f, int P, int lo);
/* Pair mode's reduction: every lane of the warp ends with all P sums
 * acc[0 .. P) (a butterfly of xor shuffles). */
void cu_gemv_allreduce(CuFn *f, int P);
/* Split-K's tail (gemv.c, qmma.c), after each thread stored its slice's
 * partial sums into `part` ([Z][sk][M][N] f32 in the workspace `ws`, after
 * the [Z][gx] u32 counters): the block counts its slice on column block
 * blockIdx.x, and the last of the sk blocks adds the slices in order,
 * clears them and the counter, and runs the epilogue (pairs: columns n,
 * n + 1) over columns nb0 .. nb0 + NBLK - 1 with `threads` threads. */
void cu_gemm_split_tail(CuFn *f, const CuGemm *gm, const char *z, int sk, int64_t gx, bool pairs, const char *nb0,
                        int NBLK, int threads, const int *epi, int nepi);
/* Split-K's workspace of gx column blocks and sk slices: the counters, then
 * the partial sums at *out_part_off; 0 bytes when sk <= 1. */
uint64_t cu_gemm_split_workspace(const CuGemm *gm, int64_t gx, int sk, uint64_t *out_part_off);

/* mma.c: matmul with f16/bf16 operands that are kernel arguments, A not
 * transposed, K and N multiples of 8 (16-byte rows), on sm_80+. */

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

bool cu_mma_eligible(const CuFn *f, const CuGemm *gm);
void cu_mma_default_params(const CuGemm *gm, CuMmaParams *out);
/* Emits the kernel body (mma.sync m16n8k16, ldmatrix, cp.async) storing
 * the epilogue values epi[0..nepi) from the f32 accumulators. */
void cu_emit_mma(CuFn *f, const CuGemm *gm, const CuMmaParams *p, const int *epi, int nepi, CuLaunch *l);
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
/* Whether gm's A is an rms_norm computed in its loads (fuse's norm
 * prologue of a decode GEMV): only the GEMV can compute such a kernel. */
bool cu_gemv_norm_mode(const CuFn *f, const CuGemm *gm);
/* That rms_norm node (fuse: norm_gemv_consumer), or NULL. */
const Node *cu_gemv_norm_node(const CuFn *f, const CuGemm *gm);
/* Whether norm node nm's input and weight are kernel arguments of a float
 * storage dtype (f32, f16, bf16), as norm mode reads them. */
bool cu_gemv_norm_args_ok(const CuFn *f, const Node *nm);
/* Norm mode's prologue (gemv.c, qgemv.c): declares Y and G, the rms_norm
 * node's input and weight, and rs[m] = 1 / rms of Y's row m for the M rows,
 * every lane of the warp taking part; vec_ok: a run-time test under which
 * Y's rows are read in packs of vec elements (NULL: always). */
void cu_gemv_norm_rows(CuFn *f, const CuGemm *gm, const char *z, const Node *norm, int M, int vec, const char *vec_ok);
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

#endif
