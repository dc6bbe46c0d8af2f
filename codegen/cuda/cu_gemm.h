/* One contraction (matmul or conv2d) as a batch of GEMMs (gemm.c): what
 * every GEMM kernel family, the simple kernel and the tensor-core helpers
 * read.  Above cu_emit.h. */
#ifndef SMELT_CU_GEMM_H
#define SMELT_CU_GEMM_H

#include "codegen/cuda/cu_emit.h"

/* One contraction as a batch of GEMMs C[M,N] = A[M,K] B[K,N] over z (the
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

/* Sets up the CuGemm of the kernel's matmul / conv2d anchor. */
void cu_gemm_setup(const CuFn *f, CuGemm *out);
/* The C expression of the element offset of batch z's matrix in operand t
 * (rank-2 batch dims broadcast against the result's), as a long long. */
const char *cu_gemm_batch_offset(CuFn *f, const CuGemm *gm, const char *z, const TensorType *t);
/* Ranged dims: this run's M and N (expressions; the literals M and N when
 * they do not follow a range) and the condition that batch z holds none
 * of this run's rows (NULL when no batch can).  A ranged matmul follows
 * its range along M or a batch dim (ranges.c refuses K and N); a conv2d
 * along its batch, which is part of N. */
const char *cu_gemm_run_m(CuFn *f, const CuGemm *gm);
const char *cu_gemm_run_n(CuFn *f, const CuGemm *gm);
const char *cu_gemm_batch_past(CuFn *f, const CuGemm *gm, const char *z);
/* Stores the anchor's value at (m, n) of batch z from the f32 sum `acc`
 * (gm->result) through the epilogue values epi[0..nepi); with ranged rows
 * only when m is one of this run's (the GEMVs compute every row). */
void cu_gemm_store_at(CuFn *f, const CuGemm *gm, const char *z, const char *m, const char *n, const char *acc,
                      const int *epi, int nepi);
/* The same for the anchor's values at (m, n) and (m, n + 1) (n even) from
 * the f32 sums acc0 and acc1, handed to the epilogue as one pair of lanes
 * (element accesses): the halves of an interleaved gated pair
 * (merge-matmuls) meet there, and only their product is stored. */
void cu_gemm_store_pair_at(CuFn *f, const CuGemm *gm, const char *z, const char *m, const char *n, const char *acc0,
                           const char *acc1, const int *epi, int nepi);
/* Whether the kernel's epilogue takes the anchor's result in step-2 slices
 * of its last axis (the halves of a gated pair): a kernel that computes
 * it must hand columns n and n + 1 over together (pair mode). */
bool cu_gemm_wants_pairs(const CuFn *f, const CuGemm *gm);
/* What a decode GEMV whose weight is a constant asks L2 for before it
 * waits for the kernel before it (programmatic dependent launch): the
 * first step of each warp's stream (the default), its whole slice of the
 * weight (one bulk prefetch a warp or block on sm_90), or nothing.  An
 * experiment's switch, SMELT_CUDA_PREFETCH=first|all|none at compile
 * time (docs/perf.md has what each measured). */
typedef enum { CU_PREFETCH_FIRST, CU_PREFETCH_ALL, CU_PREFETCH_NONE } CuPrefetch;
CuPrefetch cu_gemm_prefetch_mode(void);
/* Whether the contraction follows a range at all. */
bool cu_gemm_ranged(const CuGemm *gm);

#endif
