/* Kernel lowering: from the fusion groups of a graph to Kernels (kernel.h).
 *
 * Target-independent: both the LLVM and the CUDA backends start from the
 * Kernels cg_lower returns.  What is decided here, once for every target:
 *   - the arguments of each kernel: the group's external inputs (graph
 *     inputs, constants, values of other groups) in order of first use, then
 *     the group's results that live in memory (used by another group, or a
 *     graph output), in member order;
 *   - the iteration space whose units are the kernel's tasks (see the
 *     cg_*_space functions below; the backends iterate exactly so);
 *   - the name, from the YAML names of the group's nodes, and the estimates
 *     of bytes moved and floating-point operations.
 */
#ifndef SMELT_LOWER_H
#define SMELT_LOWER_H

#include <stdbool.h>
#include <stddef.h>

#include "format/kernel.h"

/* One kernel per group of g->groups, in execution order (the order of the
 * groups' first members in g->node, which the fuse pass keeps topological).
 * Every live node must belong to a group.  The array and each Kernel's args
 * are owned by the caller: release with cg_kernels_free. */
smelt_status cg_lower(Graph *g, Kernel **out_kernels, int *out_n) SMELT_MUST_USE;
void cg_kernels_free(Kernel *k, int n);

/* Ranged dims (codegen/ranges.c): whether every node of g can run at any
 * value of its ranges (what it refuses is ST_UNSUPPORTED at the node), and
 * the tasks of kernel k (built around anchor, or over main_out) that a run
 * at a smaller value runs (k->rg).  cg_lower calls both. */
smelt_status cg_check_ranged(const Graph *g) SMELT_MUST_USE;
smelt_status cg_kernel_range(const Graph *g, int anchor, const TensorType *main_out, Kernel *k) SMELT_MUST_USE;
/* Whether a result of type t, stored over k's tasks in proportion (its
 * elementwise space spread over [0, ntasks)), has exactly the rows of the
 * tasks a run at any value of the ranges runs (always true without ranges). */
bool cg_same_task_rows(const Kernel *k, const TensorType *t);

/* Puts every live node in a group of its own (kind from its fusion class:
 * elementwise, broadcast and injective ops are GK_ELEMWISE, reductions, norms
 * and pooling GK_REDUCTION, matmul and conv2d GK_CONTRACTION, attention
 * GK_OPAQUE), for tests and for pipelines that do not run the fuse pass.
 * Fails if any node already has a group. */
smelt_status cg_single_node_groups(Graph *g) SMELT_MUST_USE;

/* "k07_layer.3_attn_norm_mul": 'k', the group index in two digits or more,
 * then the names of the member nodes' first results (a block prefix such as
 * "layer.3/" written once), sanitised to [A-Za-z0-9_.] and cut to fit buf.
 * The group's own `kernel` name, when the fuse pass set one, is used
 * (sanitised) instead.  Returns buf. */
char *cg_kernel_name(const Graph *g, int group, char *buf, size_t cap);

/* The node a group is built around: its reduction, contraction or opaque
 * member (SPEC fusion classes FC_REDUCTION and up), or -1 for a group made
 * only of elementwise, broadcast and injective nodes.  A group with two such
 * members cannot be lowered: *out_count says how many there were. */
int cg_group_anchor(const Graph *g, const Group *gr, int *out_count);

/* Reduced axes of a reduction-class op over one input (sum/mean/max/min:
 * `axes`, absent = all; softmax, log_softmax and the norms: `axis`;
 * global_avg_pool: every axis from 2 on).  Returns false for other ops. */
bool cg_reduced_axes(const Graph *g, const Node *n, bool red[IR_MAX_RANK]);

/* The elementwise iteration space over a tensor of shape t: `rows` are all
 * dims but the last, the last dim (`inner` elements) is cut into `nchunks`
 * chunks of at most `chunk` elements so that a long vector still spreads
 * over threads.  Task t covers row t / nchunks, chunk t % nchunks; ntasks =
 * rows * nchunks.  A rank-0 tensor is one row of one element. */
typedef struct {
  int64_t rows, inner, chunk, nchunks;
} CgSpace;
void cg_elemwise_space(const TensorType *t, CgSpace *out);

/* Tasks of a kernel built around `anchor` (a node id, -1 for an elementwise
 * group whose first stored result has type first_out):
 *   reductions and norms: one per row (every combination of the kept axes);
 *   matmul: one per output row (batch * M) and column block (see
 *   cg_matmul_space); conv2d: one per (n, o, oh);
 *   max/avg_pool2d: one per (n, c, oh); attention: one per (b, h, i).
 * Only the CPU runtime splits [0, ntasks) over threads; the CUDA target
 * chooses its own grids and does not read the count. */
int64_t cg_kernel_tasks(const Graph *g, int anchor, const TensorType *first_out);

/* A matmul's task space: *out_rows output rows (batch * M; every output
 * element with a 1-D right operand) times *out_col_blocks blocks of
 * CG_MM_COLS output columns (the last one partial).  The columns are split
 * only when there are fewer than CG_MM_SPLIT_ROWS rows and more than
 * CG_MM_COLS columns (decoding: M = 1 would otherwise be one task, one
 * thread); else there is one block, all columns.  Task t is column block
 * t / rows of row t % rows: a contiguous range of tasks is a run of whole
 * column blocks (every row) with at most a partial block at each end.
 * CG_MM_COLS is a multiple of every CPU GEMM panel width (8, 16 or 32
 * columns, codegen/llvm/gemm.c), so a block is whole panels. */
#define CG_MM_COLS 128
#define CG_MM_SPLIT_ROWS 64
void cg_matmul_space(const Graph *g, const Node *n, int64_t *out_rows, int64_t *out_col_blocks);

#endif
