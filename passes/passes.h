/* Graph passes and the pass manager.
 *
 * Each pass lives in its own file with one entry point
 *   smelt_status pass_NAME(Graph *g, PassCtx *ctx, bool *changed);
 * It rewrites g in place and sets *changed when it altered anything (the
 * pass manager then prints "no change" for the others).  The verifier runs
 * after every pass in the pipeline.
 */
#ifndef SMELT_PASSES_H
#define SMELT_PASSES_H

#include "../ir/ir.h"

typedef struct {
  int64_t onchip_bytes; /* fuse: on-chip budget per tile; 0 = target default */
  /* fuse: what the kernels are for, which sets the default budget:
   * "cpu" (NULL), "cuda" or "cpu,cuda"; arch: the CUDA archs, "sm_90a,sm_80"
   * (NULL = sm_90a).  Several targets or archs: the smallest budget. */
  const char *target;
  const char *arch;
  bool explain_fusion;  /* fuse: record every decision */
  /* A log the passes append human-readable notes to (fusion decisions,
   * folding notes); owned by the pass context, freed by pass_ctx_free. */
  char *log;
  size_t log_len, log_cap;
} PassCtx;

void pass_ctx_logf(PassCtx *ctx, const char *fmt, ...) SMELT_PRINTF(2, 3);
void pass_ctx_free(PassCtx *ctx);

typedef smelt_status (*PassFn)(Graph *g, PassCtx *ctx, bool *changed);

typedef struct {
  const char *name;
  PassFn run;
  const char *summary;
} PassInfo;

#define PASS_LIST(X)                                                                         \
  X(canonicalize, "negative axes made positive, defaults explicit, squeeze/unsqueeze to reshape") \
  X(const_fold, "evaluate all-constant nodes; fold batch_norm into conv2d/matmul")           \
  X(simplify, "algebraic identities: x*1, x+0, double transpose, reshape chains, no-op casts")  \
  X(cse, "common subexpression elimination")                                                 \
  X(dce, "dead code elimination")                                                            \
  X(fuse_attention, "matmul-scale-mask-softmax-matmul becomes attention")                    \
  X(merge_matmuls, "CUDA: matmuls sharing their input and reading constant weights become one") \
  X(layout, "CUDA: matmul weights stored [N, K] (transpose_b) for the GEMV/tensor-core kernels") \
  X(fuse, "cache-bounded fusion into kernels")                                               \
  X(plan_memory, "assign arena offsets to intermediates")

#define X(n, s) smelt_status pass_##n(Graph *g, PassCtx *ctx, bool *changed) SMELT_MUST_USE;
PASS_LIST(X)
#undef X

/* The pass called `name` on the command line ("const-fold"), or NULL. */
const PassInfo *pass_lookup(const char *name);
/* "canonicalize,const-fold,simplify,cse,dce,fuse-attention,merge-matmuls,layout,fuse,plan-memory" */
const char *pass_default_pipeline(void);

/* Called around every pass; `after` is false before it runs.  index counts
 * passes from 1.  Lets the CLI print or dump IR without the library printing. */
typedef void (*PassHook)(void *user, const PassInfo *pass, int index, bool after, bool changed,
                         const Graph *g);

/* Runs the comma-separated list of passes (NULL = default pipeline), verifying
 * the graph after each.  An unknown pass name is an ST_INVALID_INPUT error. */
smelt_status pass_run_pipeline(Graph *g, PassCtx *ctx, const char *passes, PassHook hook, void *user)
    SMELT_MUST_USE;

#endif
