/* Scaffolding of a kernel function: allocas, loops, conditionals and index
 * arithmetic.
 *
 * Loops are emitted already rotated (a guard, then a body that ends in the
 * latch test), the form LLVM's loop passes expect, with the induction
 * variable a phi.  Scalar accumulators live in allocas of the entry block,
 * which SROA turns into phis before the vectoriser runs, so the emitters can
 * treat them as variables.  A loop may carry llvm.loop.vectorize.enable
 * metadata: besides forcing vectorisation it is the one hint under which
 * LLVM may reassociate a floating-point reduction (the C API of LLVM 14
 * cannot set fast-math flags on instructions), so sums and dot products
 * become vector reductions.
 *
 * Loop and conditional boundaries also bound the emission memo (emit.c): a
 * value computed inside a loop body does not dominate the code after the
 * loop, so the memo forgets everything recorded since the loop began.
 */
#include <llvm-c/DebugInfo.h>

#include "codegen/llvm/cg_internal.h"

LLVMValueRef cg_alloca(CgFn *f, LLVMTypeRef t, int64_t count, const char *name) {
  LLVMValueRef a = LLVMBuildAlloca(f->ab, LLVMArrayType(t, (unsigned)(count > 0 ? count : 1)), name);
  LLVMSetAlignment(a, 64);
  /* a pointer to the element type, so that GEP2 over t indexes it */
  return LLVMBuildBitCast(f->ab, a, LLVMPointerType(t, 0), "");
}

void cg_memo_clear(CgFn *f) { f->nmemo = 0; }

/* A self-referential loop id: !{!self, !{"llvm.loop.vectorize.enable", i1 true}}. */
static LLVMValueRef vectorize_id(CgFn *f) {
  CgMod *m = f->m;
  LLVMMetadataRef tmp = LLVMTemporaryMDNode(m->ctx, NULL, 0);
  LLVMMetadataRef kv[2] = {LLVMMDStringInContext2(m->ctx, "llvm.loop.vectorize.enable", 26),
                           LLVMValueAsMetadata(LLVMConstInt(m->t_i1, 1, 0))};
  LLVMMetadataRef hint = LLVMMDNodeInContext2(m->ctx, kv, 2);
  LLVMMetadataRef ops[2] = {tmp, hint};
  LLVMMetadataRef id = LLVMMDNodeInContext2(m->ctx, ops, 2);
  LLVMMetadataReplaceAllUsesWith(tmp, id);
  return LLVMMetadataAsValue(m->ctx, id);
}

static void mark_vectorize(CgFn *f, LLVMValueRef br) { LLVMSetMetadata(br, f->m->md_loop, vectorize_id(f)); }

LLVMValueRef cg_loop_begin(CgFn *f, CgLoop *l, LLVMValueRef begin, LLVMValueRef end, const char *name) {
  CgMod *m = f->m;
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(f->b);
  l->body = LLVMAppendBasicBlockInContext(m->ctx, f->fn, name);
  l->exit = LLVMAppendBasicBlockInContext(m->ctx, f->fn, "");
  l->end = end;
  l->memo_mark = f->nmemo;
  l->id = l->outer_id = NULL;
  LLVMBuildCondBr(f->b, LLVMBuildICmp(f->b, LLVMIntSLT, begin, end, ""), l->body, l->exit);
  LLVMPositionBuilderAtEnd(f->b, l->body);
  l->iv = LLVMBuildPhi(f->b, m->t_i64, name);
  LLVMAddIncoming(l->iv, &begin, &pre, 1);
  return l->iv;
}

void cg_tag_access(CgFn *f, LLVMValueRef inst) {
  if (f->parallel_id) LLVMSetMetadata(inst, f->m->md_parallel, f->parallel_id);
}

LLVMValueRef cg_loop_begin_parallel(CgFn *f, CgLoop *l, LLVMValueRef begin, LLVMValueRef end, const char *name) {
  LLVMValueRef iv = cg_loop_begin(f, l, begin, end, name);
  l->id = vectorize_id(f);
  l->outer_id = f->parallel_id;
  f->parallel_id = l->id;
  return iv;
}

void cg_loop_end(CgFn *f, CgLoop *l, bool reorder) {
  LLVMBasicBlockRef latch = LLVMGetInsertBlock(f->b);
  LLVMValueRef next = LLVMBuildNSWAdd(f->b, l->iv, cg_i64(f->m, 1), "");
  LLVMValueRef br = LLVMBuildCondBr(f->b, LLVMBuildICmp(f->b, LLVMIntSLT, next, l->end, ""), l->body, l->exit);
  if (l->id) {
    LLVMSetMetadata(br, f->m->md_loop, l->id);
    f->parallel_id = l->outer_id;
  } else if (reorder) {
    mark_vectorize(f, br);
  }
  LLVMAddIncoming(l->iv, &next, &latch, 1);
  LLVMPositionBuilderAtEnd(f->b, l->exit);
  f->nmemo = l->memo_mark;
}

void cg_if_begin(CgFn *f, CgIf *s, LLVMValueRef cond, const char *name) {
  s->then = LLVMAppendBasicBlockInContext(f->m->ctx, f->fn, name);
  s->merge = LLVMAppendBasicBlockInContext(f->m->ctx, f->fn, "");
  s->memo_mark = f->nmemo;
  LLVMBuildCondBr(f->b, cond, s->then, s->merge);
  LLVMPositionBuilderAtEnd(f->b, s->then);
}

void cg_if_end(CgFn *f, CgIf *s) {
  LLVMBuildBr(f->b, s->merge);
  LLVMPositionBuilderAtEnd(f->b, s->merge);
  f->nmemo = s->memo_mark;
}

/* ---- index arithmetic ---- */

LLVMValueRef cg_add(CgFn *f, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildNSWAdd(f->b, a, b, ""); }
LLVMValueRef cg_mul(CgFn *f, LLVMValueRef a, LLVMValueRef b) { return LLVMBuildNSWMul(f->b, a, b, ""); }
LLVMValueRef cg_mulc(CgFn *f, LLVMValueRef a, int64_t c) {
  if (c == 0) return cg_i64(f->m, 0);
  if (c == 1) return a;
  return LLVMBuildNSWMul(f->b, a, cg_i64(f->m, c), "");
}
LLVMValueRef cg_min(CgFn *f, LLVMValueRef a, LLVMValueRef b) {
  return LLVMBuildSelect(f->b, LLVMBuildICmp(f->b, LLVMIntSLT, a, b, ""), a, b, "");
}
LLVMValueRef cg_max(CgFn *f, LLVMValueRef a, LLVMValueRef b) {
  return LLVMBuildSelect(f->b, LLVMBuildICmp(f->b, LLVMIntSGT, a, b, ""), a, b, "");
}

LLVMValueRef cg_linear(CgFn *f, const TensorType *t, LLVMValueRef const *coords) {
  LLVMValueRef lin = cg_i64(f->m, 0);
  int64_t stride = 1;
  for (int i = t->rank - 1; i >= 0; i--) {
    /* a size-1 dim contributes nothing whatever its coordinate */
    if (t->dim[i] != 1) lin = cg_add(f, lin, cg_mulc(f, coords[i], stride));
    stride *= t->dim[i];
  }
  return lin;
}

void cg_delinearize(CgFn *f, LLVMValueRef lin, const int64_t *dims, int n, LLVMValueRef *out) {
  /* dims [0, outer) are all 1: dim `outer` takes what is left of lin as it
   * is (lin < the product of dims), with no division LLVM cannot see
   * through ([1, 128, K] rows are then consecutive, as [128, K] ones) */
  int outer = 0;
  while (outer < n - 1 && dims[outer] == 1) outer++;
  for (int i = n - 1; i >= 0; i--) {
    if (dims[i] == 1) {
      out[i] = cg_i64(f->m, 0);
    } else if (i <= outer) {
      out[i] = lin;
    } else {
      /* lin is never negative: unsigned division by a constant is a multiply */
      LLVMValueRef d = cg_i64(f->m, dims[i]);
      out[i] = LLVMBuildURem(f->b, lin, d, "");
      lin = LLVMBuildUDiv(f->b, lin, d, "");
    }
  }
}

/* floor(t * total / ntasks) without overflow: in i64 when the product fits
 * (the common case, ntasks == total needing nothing at all), else through
 * double; either is monotonic in t and exact at 0 and ntasks, so adjacent
 * task ranges still tile [0, total) exactly. */
static LLVMValueRef scale_task(CgFn *f, LLVMValueRef t, int64_t ntasks, int64_t total) {
  CgMod *m = f->m;
  if (ntasks == total) return t;
  if (ntasks <= 0) return cg_i64(m, 0);
  if (total == 0 || total <= INT64_MAX / 4 / ntasks)
    return LLVMBuildUDiv(f->b, cg_mulc(f, t, total), cg_i64(m, ntasks), "");
  LLVMValueRef d = LLVMBuildFMul(f->b, LLVMBuildSIToFP(f->b, t, m->t_f64, ""), cg_fconst(m->t_f64, (double)total), "");
  d = LLVMBuildFDiv(f->b, d, cg_fconst(m->t_f64, (double)ntasks), "");
  LLVMValueRef r = cg_min(f, LLVMBuildFPToSI(f->b, d, m->t_i64, ""), cg_i64(m, total));
  return LLVMBuildSelect(f->b, LLVMBuildICmp(f->b, LLVMIntEQ, t, cg_i64(m, ntasks), ""), cg_i64(m, total), r, "");
}

LLVMValueRef cg_extent(CgFn *f, const TensorType *t, int a) {
  CgMod *m = f->m;
  if (!t->dyn[a]) return cg_i64(m, t->dim[a]);
  LLVMValueRef idx = cg_i64(m, t->dyn[a] - 1);
  LLVMValueRef d = LLVMBuildLoad2(f->b, m->t_i64, LLVMBuildInBoundsGEP2(f->b, m->t_i64, f->ranges, &idx, 1, ""), "d");
  return cg_add(f, cg_mulc(f, d, t->dyn_a[a]), cg_i64(m, t->dyn_b[a]));
}

void cg_task_span(CgFn *f, int64_t ntasks, int64_t total, LLVMValueRef *out_begin, LLVMValueRef *out_end) {
  *out_begin = scale_task(f, f->task_begin, ntasks, total);
  *out_end = scale_task(f, f->task_end, ntasks, total);
}
