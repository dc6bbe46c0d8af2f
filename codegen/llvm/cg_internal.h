/* Shared inside the LLVM backend: the state of one module and of one kernel
 * function under construction, and the helpers every kernel emitter uses.
 *
 * The central idea is "emit at coordinates": cg_emit(f, v, coords) returns
 * the scalar value of tensor v at the coordinate vector coords (i64 LLVM
 * values, one per dim of v), generated in the current block.  A value the
 * kernel receives as an argument is loaded; a value computed by a member of
 * the group is its op applied to its inputs emitted at coordinates derived
 * from coords (the same ones for elementwise ops, right-aligned with size-1
 * dims at 0 for broadcasting, permuted for transpose, and so on).  Kernels
 * are loop nests that call cg_emit at the coordinates of the results they
 * store; the group's anchor (a reduction, contraction or attention) is the
 * one value cg_emit cannot compute on its own: the kernel computes it and
 * installs it as an override for the coordinates it is valid at.
 *
 * Errors during emission are sticky (cg_fail records the first; emitters
 * return an undef value and go on) so that the emitters read as straight
 * code; the driver checks m->err before verifying the module.
 */
#ifndef SMELT_CG_INTERNAL_H
#define SMELT_CG_INTERNAL_H

#include <llvm-c/Core.h>

#include "codegen/llvm/cg_llvm.h"
#include "codegen/lower.h"

typedef struct {
  LLVMContextRef ctx;
  LLVMModuleRef mod;
  LLVMBuilderRef b;
  LLVMTypeRef t_void, t_i1, t_i8, t_i16, t_i32, t_i64, t_f16, t_f32, t_f64, t_ptr;
  bool native_f16; /* the target converts f16 to f32 in hardware (x86 F16C, AArch64) */
  /* the target has AVX-512: kernels ask for 512-bit vectors (compile.c
   * wide_vectors), which LLVM's tuning of Intel's AVX-512 CPUs otherwise
   * splits into 256-bit halves */
  bool avx512;
  /* f32 lanes of the target's vectors: 16 with AVX-512, 8 with AVX, else 4
   * (the GEMM families' register blocking) */
  int f32_lanes;
  bool pack_at_compile; /* CgLlvmOptions.pack_at_compile (gemm.c) */
  Graph *g;
  unsigned md_loop, md_vec_enable_kind, md_parallel;
  smelt_status err; /* the first error of the module; later ones are dropped */
} CgMod;

typedef struct CgFn CgFn;

/* A value cg_emit returned at some coordinates, valid in the current block
 * until the next loop boundary (cg_memo_clear). */
typedef struct {
  int value, rank;
  LLVMValueRef coords[IR_MAX_RANK];
  LLVMValueRef result;
} CgMemo;
#define CG_MEMO_CAP 256

struct CgFn {
  CgMod *m;
  LLVMBuilderRef b;
  Graph *g;
  const Kernel *k;
  const Group *grp;
  LLVMValueRef fn;
  LLVMBasicBlockRef entry; /* holds the allocas; branches to the body at the end */
  LLVMBuilderRef ab;       /* positioned at the end of entry */
  LLVMValueRef *base;      /* per argument: pointer to its storage element type */
  LLVMValueRef task_begin, task_end;
  LLVMValueRef ranges;     /* i64 *: the run's value of each ranged dim (Graph.ranges) */
  int nin;                 /* arguments [0, nin) are inputs, [nin, nargs) outputs */
  int *arg_of;             /* per value: its argument index, -1 if none */
  bool *member;            /* per node: in this group */
  bool *dep;               /* per node: reads the anchor's result, directly or through members */
  int anchor;              /* node id of the anchor, -1 for an elementwise group */
  /* Stored results: epi[] depend on the anchor (the anchor's own result
   * included) and have its result's shape; side[] do not depend on it. */
  int *epi, nepi, *side, nside;
  /* the override: anchor result ov_value is ov_result at exactly ov_coords */
  int ov_value;
  LLVMValueRef ov_result;
  LLVMValueRef ov_coords[IR_MAX_RANK];
  CgMemo memo[CG_MEMO_CAP];
  int nmemo;
  /* Some arguments overlap (an elementwise kernel in place, compile.c
   * shares_memory): not noalias.  Its store loops are then marked parallel
   * (cg_loop_begin_parallel), or the vectoriser would check the pointers at
   * run time, find them overlapping and take its scalar loop. */
  bool in_place;
  /* The loop id that loads and stores are tagged with as
   * llvm.mem.parallel_loop_access (NULL outside a parallel loop). */
  LLVMValueRef parallel_id;
};

/* Registers the native target with LLVM, once per process (thread-safe). */
smelt_status cg_llvm_init(void) SMELT_MUST_USE;

/* ---- errors ---- */
void cg_fail(CgMod *m, StatusCode code, const char *fmt, ...) SMELT_PRINTF(3, 4);

/* ---- types, constants, calls (scalar.c) ---- */
LLVMTypeRef cg_ctype(CgMod *m, DType dt);  /* compute type: f32 for f16/bf16, i1 for bool */
LLVMTypeRef cg_stype(CgMod *m, DType dt);  /* storage element type */
LLVMValueRef cg_i64(CgMod *m, int64_t v);
LLVMValueRef cg_i32(CgMod *m, int32_t v);
LLVMValueRef cg_fconst(LLVMTypeRef t, double v);
/* The constant v of dtype dt's compute type (ints exact up to 2^53). */
LLVMValueRef cg_const_of(CgMod *m, DType dt, double v);
/* A call of an LLVM intrinsic ("llvm.exp"), overloaded on the types over. */
LLVMValueRef cg_intrinsic(CgMod *m, const char *name, LLVMTypeRef *over, int nover, LLVMValueRef *args,
                          int nargs);
/* A call of a one-argument libm function (tanhf, erff), resolved at JIT time. */
LLVMValueRef cg_libm(CgMod *m, const char *name, LLVMTypeRef t, LLVMValueRef x);
/* exp, tanh, erf: inline vectorisable polynomials for f32, exact for f64. */
LLVMValueRef cg_exp(CgMod *m, LLVMValueRef x);
LLVMValueRef cg_tanh(CgMod *m, LLVMValueRef x);
LLVMValueRef cg_erf(CgMod *m, LLVMValueRef x);
LLVMValueRef cg_fmax_nan(CgMod *m, LLVMValueRef a, LLVMValueRef b); /* numpy maximum: NaN wins */
/* r[0..n), the rows of an n x n matrix (n lanes each, n a power of two up
 * to 16), replaced by its columns, in registers. */
void cg_transpose_square(CgMod *m, LLVMValueRef *r, int n);
LLVMValueRef cg_fmin_nan(CgMod *m, LLVMValueRef a, LLVMValueRef b);
LLVMValueRef cg_select(CgMod *m, LLVMValueRef c, LLVMValueRef a, LLVMValueRef b);

/* Storage <-> compute conversions of one element. */
LLVMValueRef cg_from_storage(CgMod *m, DType dt, LLVMValueRef raw);
LLVMValueRef cg_to_storage(CgMod *m, DType dt, LLVMValueRef v);
/* `cast` semantics (ir/ref_ops.c): float to int truncates and saturates
 * (NaN to 0), int to int saturates, to bool is != 0, to f16/bf16 rounds. */
LLVMValueRef cg_convert(CgMod *m, LLVMValueRef v, DType from, DType to);
/* Elementwise ops on compute values; dt is the operands' dtype. */
LLVMValueRef cg_unary(CgMod *m, const Node *n, DType dt, LLVMValueRef x);
LLVMValueRef cg_binary(CgMod *m, Op op, DType dt, LLVMValueRef a, LLVMValueRef b);

/* ---- function scaffolding and loops (function.c) ---- */
LLVMValueRef cg_alloca(CgFn *f, LLVMTypeRef t, int64_t count, const char *name);
void cg_memo_clear(CgFn *f);
typedef struct {
  LLVMBasicBlockRef body, exit;
  LLVMValueRef iv, end;
  int memo_mark;
  LLVMValueRef id, outer_id; /* cg_loop_begin_parallel: its loop id, and the one it replaced */
} CgLoop;
/* for (iv = begin; iv < end; iv++): returns iv, leaves the builder in the
 * body.  cg_loop_end closes it and continues after the loop; `reorder` lets
 * the vectoriser reassociate floating-point reductions in it. */
LLVMValueRef cg_loop_begin(CgFn *f, CgLoop *l, LLVMValueRef begin, LLVMValueRef end, const char *name);
/* The same for a loop whose iterations touch disjoint memory (element j
 * reads and writes only what belongs to j), whatever the pointers' aliasing:
 * every load and store in it is tagged llvm.mem.parallel_loop_access, and
 * cg_loop_end marks the loop parallel and to be vectorised. */
LLVMValueRef cg_loop_begin_parallel(CgFn *f, CgLoop *l, LLVMValueRef begin, LLVMValueRef end, const char *name);
void cg_loop_end(CgFn *f, CgLoop *l, bool reorder);
/* Tags a load or store with the enclosing parallel loop's id, if any. */
void cg_tag_access(CgFn *f, LLVMValueRef inst);
/* if (cond) { ... }: the builder is in the then-block until cg_if_end. */
typedef struct {
  LLVMBasicBlockRef then, merge;
  int memo_mark;
} CgIf;
void cg_if_begin(CgFn *f, CgIf *s, LLVMValueRef cond, const char *name);
void cg_if_end(CgFn *f, CgIf *s);

/* Index arithmetic on i64 values (nsw, constant-folded). */
LLVMValueRef cg_add(CgFn *f, LLVMValueRef a, LLVMValueRef b);
LLVMValueRef cg_mul(CgFn *f, LLVMValueRef a, LLVMValueRef b);
LLVMValueRef cg_mulc(CgFn *f, LLVMValueRef a, int64_t c);
LLVMValueRef cg_min(CgFn *f, LLVMValueRef a, LLVMValueRef b);
LLVMValueRef cg_max(CgFn *f, LLVMValueRef a, LLVMValueRef b);
/* Row-major linear index of coords in shape t, and its inverse over dims
 * [0, n) (no division for the outermost dim, none at all when n == 1). */
LLVMValueRef cg_linear(CgFn *f, const TensorType *t, LLVMValueRef const *coords);
void cg_delinearize(CgFn *f, LLVMValueRef lin, const int64_t *dims, int n, LLVMValueRef *out);
/* The extent of axis a of t in this run: dim[a], or a * d + b for a
 * ranged axis (ir.h) with d read from the run's ranges. */
LLVMValueRef cg_extent(CgFn *f, const TensorType *t, int a);

/* Task range [tb, te) of ntasks mapped onto [0, total) in proportion. */
void cg_task_span(CgFn *f, int64_t ntasks, int64_t total, LLVMValueRef *out_begin, LLVMValueRef *out_end);

/* ---- element access and emission (emit.c) ---- */
LLVMValueRef cg_load_arg(CgFn *f, int arg, LLVMValueRef lin);
void cg_store_arg(CgFn *f, int arg, LLVMValueRef lin, LLVMValueRef v);
/* Coordinates of operand type `in` broadcast to an output of rank out_rank. */
void cg_bcast_coords(CgFn *f, const TensorType *in, int out_rank, LLVMValueRef const *coords, LLVMValueRef *out);
LLVMValueRef cg_emit(CgFn *f, int value, LLVMValueRef const *coords);
/* Stores value v (a stored result of the group) at coords. */
void cg_store_value(CgFn *f, int v, LLVMValueRef const *coords);
/* Stores every epilogue result at coords (the anchor result's shape), with
 * the anchor's result there being anchor_value. */
void cg_store_epilogue(CgFn *f, LLVMValueRef const *coords, LLVMValueRef anchor_value);
/* Elementwise loop nests storing values vals[0..n) over their own shapes,
 * each spread over the kernel's tasks in proportion. */
void cg_store_loops(CgFn *f, const int *vals, int n);
/* Shape of the anchor's result (the epilogue's iteration space). */
const TensorType *cg_anchor_type(CgFn *f);

/* ---- kernels ---- */
smelt_status cg_llvm_emit_elemwise(CgFn *f) SMELT_MUST_USE;
smelt_status cg_llvm_emit_reduction(CgFn *f) SMELT_MUST_USE;
/* matmul / conv2d with elementwise epilogue: the generic loop version;
 * a register-blocked GEMM can replace it behind this entry point. */
smelt_status cg_llvm_emit_contraction(CgFn *f) SMELT_MUST_USE;
smelt_status cg_llvm_emit_attention(CgFn *f) SMELT_MUST_USE;
smelt_status cg_llvm_emit_pool(CgFn *f) SMELT_MUST_USE;
/* scatter (in place on a state), argmax, topk and arange (state_ops.c) */
smelt_status cg_llvm_emit_scatter(CgFn *f) SMELT_MUST_USE;
smelt_status cg_llvm_emit_argmax(CgFn *f) SMELT_MUST_USE;
/* The largest k topk's CPU kernel takes: its k best pairs of a row live on
 * the worker thread's stack (64 KiB at most). */
#define CG_TOPK_MAX_K 4096
smelt_status cg_llvm_emit_topk(CgFn *f) SMELT_MUST_USE;
smelt_status cg_llvm_emit_arange(CgFn *f) SMELT_MUST_USE;

#endif
