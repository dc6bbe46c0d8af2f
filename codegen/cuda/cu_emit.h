/* The bottom layer of the CUDA backend (text.c, scalar.c, emit.c): the state
 * of one kernel under generation and the helpers every kernel emitter uses.
 * It includes no other header of the backend but cg_cuda.h; the layers
 * above are listed in cg_cuda.h.
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
#ifndef SMELT_CU_EMIT_H
#define SMELT_CU_EMIT_H

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
/* Out of memory marks the buffer (oom, sticky, as ByteBuf in ir/bytes.c):
 * its text is then incomplete, and whoever uses it checks the mark. */
typedef struct {
  char *s;
  size_t len, cap;
  bool oom;
} CuBuf;

void cu_buf_printf(CuBuf *b, const char *fmt, ...) SMELT_PRINTF(2, 3);
void cu_buf_append(CuBuf *b, const char *s, size_t n);
/* Appends src's text; src's out-of-memory mark carries over. */
void cu_buf_append_buf(CuBuf *b, const CuBuf *src);
void cu_buf_free(CuBuf *b);
/* Takes the text out of b (a malloc'd string; "" when empty) and resets b;
 * NULL when b is marked out of memory or the string cannot be made. */
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

void cu_fail(CuFn *f, StatusCode code, const char *fmt, ...) SMELT_PRINTF(3, 4);
/* Appends one line of code at the current indentation. */
void cu_line(CuFn *f, const char *fmt, ...) SMELT_PRINTF(2, 3);
/* A fresh temporary name "tN". */
const char *cu_tmp(CuFn *f);
/* b's text in f's arena (b stays the caller's); "" and f failed with
 * ST_NO_MEMORY when b is marked out of memory. */
const char *cu_buf_str(CuFn *f, const CuBuf *b);
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
/* Axis a's extent in this run: a literal, or along a ranged dim (ir.h:
 * TensorType.dyn) an expression of the kernel's `rng` argument, the run's
 * value of each range (codegen/ranges.c; module.c declares it). */
const char *cu_extent(CuFn *f, const TensorType *t, int a);
/* Work that follows a run's length (ranged dims): memory is laid out at
 * the max, and the rows past a run's extent along a ranged axis are left
 * as they are (nothing reads them into a kept result: codegen/ranges.c).
 * cu_live: the condition that row-major linear index `lin` of shape t
 * lies inside this run's extents; NULL when t has no ranged axis. */
const char *cu_live(CuFn *f, const TensorType *t, const char *lin);
/* The number of elements of t in this run (the product of its extents):
 * a literal when t has no ranged axis. */
const char *cu_run_numel(CuFn *f, const TensorType *t);
/* Linear index `lin` of t from `c`, an index that counts only this run's
 * elements (row-major over the run's extents): the same expression when
 * nothing but the outermost non-1 axis is ranged. */
const char *cu_run_index(CuFn *f, const TensorType *t, const char *c);

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

/* ---- what an emitter fills in for the driver (module.c) ---- */
typedef struct {
  unsigned grid[3], block[3], smem;
  const char *kind;
  /* matmul / attention: the variant token (FmtCudaLaunch.variant) */
  char variant[CG_VARIANT_LEN];
  uint64_t workspace;    /* > 0: the kernel has a `ws` parameter (FmtCudaLaunch.workspace) */
  int ntmaps;            /* TMA descriptors: parameters tm0, tm1, ... */
  FmtCudaTmap tmaps[FMT_MAX_TMAPS];
  int min_blocks;        /* > 0: __launch_bounds__(threads, min_blocks) */
  /* Code the kernel runs before smelt_pdl_wait() (module.c's header puts
   * the wait first in every kernel), while the kernel before it may still
   * run: it may touch nothing but constants (a GEMV's L2 prefetch of its
   * weights).  NULL: none. */
  const char *pre_wait;
} CuLaunch;
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

#endif
