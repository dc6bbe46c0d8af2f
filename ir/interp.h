/* The reference interpreter: runs any graph in plain C, every v1 operator.
 *
 * It is the oracle every backend is tested against, so it favours being
 * obviously right over being fast: every operator reads its inputs as double
 * and writes double, and the interpreter converts to and from each value's
 * storage dtype (f16/bf16 are therefore computed in at least f32, as the
 * spec requires, and rounded once on store).
 */
#ifndef SMELT_INTERP_H
#define SMELT_INTERP_H

#include "ir.h"

/* Arguments of one reference kernel.  in[i]/out[i] hold ir_type_numel()
 * doubles in row-major order. */
typedef struct {
  const Graph *g;
  const Node *n;
  int nin, nout;
  const double *const *in;
  const TensorType *const *in_type;
  double *const *out;
  const TensorType *const *out_type;
} RefArgs;

typedef smelt_status (*RefFn)(const RefArgs *a);

/* The reference kernels named in ops.def. */
#define OP(id, name, mn, mx, nout, fc, attrs, infer, ref) smelt_status ref(const RefArgs *a);
#include "ops.def"
#undef OP

/* Evaluates one node on typed buffers (each in[i] holds the data of the
 * node's i-th input in its dtype; out[i] receives the i-th result).  Used by
 * const-fold and by the interpreter itself. */
smelt_status ir_eval_node(const Graph *g, const Node *n, const void *const *in, void *const *out)
    SMELT_MUST_USE;

typedef struct Interp Interp;

/* Creates an interpreter for g (which must outlive it); owned by the caller. */
smelt_status ir_interp_create(const Graph *g, Interp **out_interp) SMELT_MUST_USE;
void ir_interp_destroy(Interp *it);
/* Copies the data of input value `value` (in its graph dtype and shape). */
smelt_status ir_interp_set_input(Interp *it, int value, const void *data) SMELT_MUST_USE;
/* Runs every live node in order.  All inputs must have been set.  State
 * tensors start at zero (or as set with ir_interp_set_input) and keep
 * their updates from one run to the next, as in a session. */
smelt_status ir_interp_run(Interp *it) SMELT_MUST_USE;
/* One run of the graphs of a tensor-parallel model's ranks (passes/shard.c:
 * the same nodes in the same order, each rank's own constants), its[r]
 * running rank r's: every node on every rank in turn, the collectives
 * across all of them (all_reduce sums in double, in rank order; all_gather
 * concatenates), as one session's ranks would.  The graphs' inputs must be
 * set on every interpreter. */
smelt_status ir_interp_run_ranks(Interp *const *its, int nranks) SMELT_MUST_USE;
/* Data of any value after a run (inputs, constants, node results); NULL if
 * it was not computed.  Owned by the interpreter. */
const void *ir_interp_value(const Interp *it, int value);

#endif
