/* The tuner engine: measures every variant of a model's matmul and
 * attention kernels on a GPU and records the fastest of each shape in a
 * tuning table (codegen/cuda/table.h), the one `smelt compile --target cuda`
 * reads.  compiler/tune.c says how candidates are generated, checked and
 * timed.  `smelt tune` (cli/tune.c) is this with a command line around it.
 *
 * Nothing here prints or exits: every progress line goes to
 * ScTuneOptions.log, and errors come back as a status.
 */
#ifndef SMELT_COMPILER_TUNE_H
#define SMELT_COMPILER_TUNE_H

#include <stdbool.h>

#include "compiler/driver.h"
#include "ir/ir.h"
#include "passes/passes.h"

typedef struct {
  const char *model;       /* the model file (YAML); required */
  /* The specialisations to tune, every combination of the dims' values
   * (sc_dim_space_parse); NULL = the model's own dims only. */
  const ScDimSpace *dims;
  DType dtype;             /* default element type of inputs and params; DT_INVALID = the model's */
  /* The table to update; required.  An existing file is read first, and
   * only the rows measured now are replaced; its directory is created. */
  const char *table_path;
  /* The arch to tune for, one real arch ("sm_90a"); NULL = the GPU's (in a
   * dry run sc_cuda_default_arch()).  The GPU must be able to run it. */
  const char *arch;
  int device;              /* the CUDA device to measure on */
  /* No new shape is started once this many seconds have passed since the
   * call began (<= 0: no limit); what was measured is written. */
  double budget_s;
  /* Everything up to the GPU (jobs, candidates, generation, NVRTC) without
   * one; no table is written (nor created). */
  bool dry_run;
  /* f32 matmuls may use the TF32 tensor cores: their tf32 variants are
   * candidates too, compared with a TF32 tolerance (CgCudaOptions.allow_tf32). */
  bool allow_tf32;
  /* Quantise the matmul weights first, as `smelt compile --quantize` does
   * (the quantize pass in the pipeline), so that the quantised kernels'
   * variants are the ones measured; NULL = none. */
  const QuantOptions *quant;
  /* Each line of the report, without its newline, as it happens: the GPU
   * and the number of shapes, per shape its candidates with their times or
   * why each was dropped or REJECTED, the winner, and a closing summary.
   * NULL = none. */
  void (*log)(void *ctx, const char *line);
  void *log_ctx;
} ScTuneOptions;

/* What a run did (also filled when it stopped on an error). */
typedef struct {
  int shapes;       /* kernels with a tuning key, one per table row */
  int measured;     /* shapes started before the budget ran out */
  int tuned;        /* rows put into the table */
  int rejected;     /* candidates that failed to run or disagreed with the reference */
  int dropped;      /* candidates that could not be generated, compiled, loaded or mapped */
  bool out_of_time; /* the budget stopped it before the last shape */
} ScTuneResult;

/* Tunes o->model's kernels on GPU o->device (none in a dry run) and
 * updates the table, which is rewritten after every shape that got a row:
 * an error after that keeps what was measured.  A broken table is an error
 * before any GPU is opened.  A candidate that cannot be built or that fails
 * its checks is logged and skipped; the status is an error only when the
 * run cannot go on (no model, no GPU, the GPU context lost, out of memory,
 * the table not writable).  out_result may be NULL. */
smelt_status sc_tune_model(const ScTuneOptions *o, ScTuneResult *out_result) SMELT_MUST_USE;

#endif
