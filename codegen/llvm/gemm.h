/* The register-blocked GEMM of the CPU backend (gemm.c): the fast path of
 * cg_llvm_emit_contraction for matmuls and conv2ds whose weight is a
 * constant. */
#ifndef SMELT_CG_GEMM_H
#define SMELT_CG_GEMM_H

#include "codegen/llvm/cg_internal.h"

/* Emits the kernel body of f (a matmul-anchored group) as a packed,
 * register-blocked GEMM when its shape allows, and sets *out_done; leaves
 * *out_done false (and emits nothing) when the generic loop nest must do
 * it.  The packed weight is a zero-initialised global of the module that
 * the kernel's NAME__prepack function (added here) fills at load time
 * (see gemm.c). */
smelt_status cg_gemm_try(CgFn *f, bool *out_done) SMELT_MUST_USE;

/* The same for a conv2d-anchored group with a constant f32/f16/bf16
 * weight: an implicit GEMM over im2col panels built on the fly, the weight
 * packed at load time as matmul's (see gemm.c). */
smelt_status cg_gemm_conv_try(CgFn *f, bool *out_done) SMELT_MUST_USE;

/* A matmul whose weight is built in the kernel, a panel at a time: fill
 * writes panel[(k - k0) * nr + j] = B[k][col0 + j] (the weight as a
 * [K, N] matrix, in f32) for k in [k0, k1) and j < nr, 0 where col0 + j is
 * N or more.  k0 is a multiple of the chunk, itself a multiple of 64 or
 * all of K.  (qmatmul.c: a quantised weight dequantised.)  Emits the
 * kernel body of f, a matmul-anchored group of K x N weight; see gemm.c. */
typedef struct CgPanelSource CgPanelSource;
struct CgPanelSource {
  void (*fill)(CgPanelSource *s, CgFn *f, LLVMValueRef panel, LLVMValueRef col0, LLVMValueRef k0, LLVMValueRef k1, int nr);
  int64_t K, N;
};
smelt_status cg_gemm_panels(CgFn *f, CgPanelSource *src) SMELT_MUST_USE;
#endif
