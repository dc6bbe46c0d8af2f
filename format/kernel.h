/* Kernels: what a fusion group becomes, for any target.
 *
 * The fuse pass leaves the graph partitioned into groups (ir.h: Group); every
 * live node belongs to exactly one.  Kernel lowering turns each group into a
 * Kernel: the list of buffers it reads and writes (value ids, in a fixed
 * order: external inputs first, constants among them, then the group's
 * outputs that live in memory), how many independent tasks its work splits
 * into, and cost estimates for the roofline report.  The targets (LLVM for
 * the CPU, CUDA C for the GPU) generate code from the same Kernel.
 *
 * CPU kernel ABI (codegen/llvm):
 *     void NAME(void *const *args, int64_t task_begin, int64_t task_end);
 *   args[i] points at the data of value args[i] of the Kernel, and
 *   args[nargs] at the run's values of the graph's ranged dims (int64_t,
 *   one per Graph.ranges; the max of each when the graph has none); the thread
 *   pool calls it on disjoint task ranges covering [0, ntasks).
 *     void NAME__prepack(void *const *args);   (optional)
 *   fills the kernel's packed copies of its constant weights (zero-filled
 *   .bss of the object) from those constants; the runtime calls it once
 *   when it loads the code, with args[i] set for the constant arguments
 *   and NULL for the others (codegen/llvm/gemm.c, runtime/loader.c).
 */
#ifndef SMELT_KERNEL_H
#define SMELT_KERNEL_H

#include "ir/ir.h"

/* The tasks a kernel runs when a ranged dim (ir.h: TensorType.dyn) is
 * below its max.  range 0: every run runs [0, ntasks).  Else the tasks form
 * outer * mid * inner (row-major), their middle index runs along the
 * ranged axis, and a run with range range-1 at value d runs, for each
 * o < outer, the tasks [(o * mid) * inner, (o * mid + a * d + b) * inner):
 * the rows the run has, never one beyond them (codegen/lower.c). */
typedef struct {
  int range;
  int32_t a, b;
  int64_t outer, mid, inner;
} KernelRange;

typedef struct {
  char name[96];   /* "k07_layer.3_attn_norm_mul": from the YAML names of its nodes */
  int group;       /* index into g->groups */
  int *args;       /* value ids: inputs (constants included), then outputs */
  int nargs, nouts;
  int64_t ntasks;  /* independent units of work (rows, tiles, element blocks) */
  double bytes;    /* estimated bytes moved to and from memory */
  double flops;    /* estimated floating-point operations */
  KernelRange rg;  /* with ranged dims: the tasks a run at a smaller value runs */
} Kernel;

/* A kernel that is one collective (all_reduce, all_gather: passes/shard.c):
 * the runtime runs it across the ranks (runtime/comm.c); no target
 * generates code for it. */
static inline bool fmt_kernel_collective(const Graph *g, const Kernel *k) {
  if (k->group < 0 || k->group >= g->ngroups) return false;
  int a = g->groups[k->group].anchor;
  return a >= 0 && a < g->nnode && ir_op_is_collective(g->node[a].op);
}

#endif
