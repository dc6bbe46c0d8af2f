/* The kernel emitters, one per kind of anchor (elemwise.c, reduction.c,
 * pool.c, contraction.c, attention_emit.c, state_ops.c), that the driver (module.c) and the
 * variant lists (variants.c) call.  Each fills in the kernel's body through
 * f and its launch through l; an error is left in f->err. */
#ifndef SMELT_CU_KERNELS_H
#define SMELT_CU_KERNELS_H

#include "codegen/cuda/cu_fn.h"

void cu_emit_elemwise(CuFn *f, CuLaunch *l);
void cu_emit_reduction(CuFn *f, CuLaunch *l);
void cu_emit_contraction(CuFn *f, CuLaunch *l);
void cu_emit_attention(CuFn *f, CuLaunch *l);
void cu_emit_pool(CuFn *f, CuLaunch *l);
/* scatter (in place on a state), argmax, topk, arange (state_ops.c) */
void cu_emit_state_op(CuFn *f, CuLaunch *l);

/* The variants of the kernel's contraction (matmul / conv2d) or attention
 * anchor the backend can generate, the heuristic's first: at most max
 * tokens. */
int cu_contraction_candidates(CuFn *f, char (*out)[CG_VARIANT_LEN], int max);
int cu_attention_candidates(CuFn *f, char (*out)[CG_VARIANT_LEN], int max);

#endif
