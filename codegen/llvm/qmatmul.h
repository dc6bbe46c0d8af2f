/* Quantised matmuls on the CPU (qmatmul.c): the fast path of
 * cg_llvm_emit_contraction for a matmul whose weight is dequantize(qweight,
 * scales[, zeros]) computed in the same kernel (the fuse pass puts it there
 * at any row count for the CPU, passes/fuse.c). */
#ifndef SMELT_CG_QMATMUL_H
#define SMELT_CG_QMATMUL_H

#include "codegen/llvm/cg_internal.h"

/* Emits the kernel body of f (a matmul-anchored group whose right operand
 * is a member dequantize of two or three kernel arguments: the qweight, its
 * scales and optionally its zero points) as a GEMV that reads the packed
 * weight (few rows) or a GEMM over dequantised panels (many), and sets
 * *out_done; leaves *out_done false (and emits nothing) when the shape or
 * dtypes are not ones it takes, for the generic loop nest, which
 * dequantises element by element. */
smelt_status cg_qmatmul_try(CgFn *f, bool *out_done) SMELT_MUST_USE;

#endif
