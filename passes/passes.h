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

/* quantize: what to quantise and how (smelt compile --quantize ...). */
typedef enum { QM_NONE, QM_INT8, QM_INT4, QM_FP8 } QuantMode;
typedef struct {
  QuantMode mode;
  int64_t group;      /* elements of K per scale; 0 = one scale per output channel */
  const char *only;   /* glob (fnmatch) on the weight's or the matmul's name; NULL = every matmul */
  double keep_below;  /* layers whose cosine is below this stay in float; 0 = none */
  uint64_t seed;      /* of the random calibration inputs */
} QuantOptions;

/* One matmul the quantize pass looked at: its output against the
 * unquantised one's on the calibration rows (QuantReport). */
typedef struct {
  char *layer, *weight; /* the matmul's result and its weight (YAML names) */
  int64_t K, N, group, rows;
  double cosine, rel_err; /* cosine similarity, ||y_q - y|| / ||y|| */
  bool flagged;           /* cosine < 0.999 */
  bool kept;              /* left in float (--keep-below) */
  double bytes_before, bytes_after; /* of the weight (and its scales) */
} QuantLayer;

typedef struct {
  QuantOptions opt;
  char *calibration; /* how the calibration rows were made */
  QuantLayer *layers;
  int nlayers, cap;
} QuantReport;

/* The report as text, the table `smelt compile --quantize` prints and the
 * bundle's quant-report section holds (malloc'd; NULL when out of memory). */
char *pass_quant_report_text(const QuantReport *r);
void pass_quant_report_free(QuantReport *r);
/* "int8", "int4", "fp8" to a mode (QM_NONE when it is none of them). */
QuantMode pass_quant_mode(const char *name);
const char *pass_quant_mode_name(QuantMode m);

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
  /* quantize: its options (NULL: the pass changes nothing) and its report,
   * owned by the context (pass_ctx_free) */
  const QuantOptions *quant;
  QuantReport *quant_report;
  /* shard: tensor parallelism (--tp): tp ranks (0 or 1: the pass changes
   * nothing) and the rank whose part of the model this pipeline makes */
  int tp, rank;
  /* shard: the states it stored split, "NAME:AXIS;NAME:AXIS" (malloc'd,
   * freed by pass_ctx_free; NULL = none), for the bundle's manifest */
  char *tp_states;
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
  X(shard, "--tp N: one rank's part of the model, matmuls split Megatron-style, collectives inserted") \
  X(fuse_attention, "matmul-scale-mask-softmax-matmul becomes attention")                    \
  X(merge_matmuls, "CUDA: matmuls sharing their input and reading constant weights become one") \
  X(layout, "CUDA: matmul weights stored [N, K] (transpose_b) for the GEMV/tensor-core kernels") \
  X(quantize, "matmul weights to int8/int4/fp8 with dequantize (--quantize), per-layer accuracy") \
  X(fuse, "cache-bounded fusion into kernels")                                               \
  X(plan_memory, "assign arena offsets to intermediates")

#define X(n, s) smelt_status pass_##n(Graph *g, PassCtx *ctx, bool *changed) SMELT_MUST_USE;
PASS_LIST(X)
#undef X

/* The pass called `name` on the command line ("const-fold"), or NULL. */
const PassInfo *pass_lookup(const char *name);
/* "canonicalize,const-fold,simplify,cse,dce,fuse-attention,merge-matmuls,layout,fuse,plan-memory" */
const char *pass_default_pipeline(void);
/* The default pipeline with quantize before fuse (after layout, so that a
 * CUDA weight is quantised in its [N, K] layout): --quantize's. */
const char *pass_quantize_pipeline(void);

/* The pipeline `base` (NULL: the default) with shard, const-fold, cse and
 * dce before fuse-attention (--tp), into buf; an error when base has no
 * fuse-attention to place them before or names shard already (then it is
 * returned as it is, in buf). */
smelt_status pass_with_shard(const char *base, char *buf, size_t cap) SMELT_MUST_USE;

/* Called around every pass; `after` is false before it runs.  index counts
 * passes from 1.  Lets the CLI print or dump IR without the library printing. */
typedef void (*PassHook)(void *user, const PassInfo *pass, int index, bool after, bool changed,
                         const Graph *g);

/* Runs the comma-separated list of passes (NULL = default pipeline), verifying
 * the graph after each.  An unknown pass name is an ST_INVALID_INPUT error. */
smelt_status pass_run_pipeline(Graph *g, PassCtx *ctx, const char *passes, PassHook hook, void *user)
    SMELT_MUST_USE;

#endif
