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

#endif
