/* Shared pieces of the smelt command-line tool. */
#ifndef SMELT_CLI_H
#define SMELT_CLI_H

#include <stdbool.h>

#include "compiler/check.h"
#include "compiler/driver.h"
#include "frontend/frontend.h"
#include "ir/interp.h"
#include "ir/ir.h"
#include "passes/passes.h"

#define SMELT_VERSION "0.1.0"

/* Prints "smelt CMD: message" and a hint to use --help; returns 2. */
int cli_usage(const char *cmd, const char *fmt, ...) SMELT_PRINTF(2, 3);
/* Prints a status as-is to stderr, frees it, returns 1. */
int cli_fail(smelt_status st);

/* Options shared by the commands that load a YAML model. */
typedef struct {
  FeDim dims[32];
  int ndims;
  DType dtype;
} ModelOpts;

/* Tries to consume one model option at argv[*i] ("--dim k=v", "--dtype f16").
 * Returns 1 if consumed, 0 if not a model option, 2 on a usage error. */
int cli_model_opt(const char *cmd, int argc, char **argv, int *i, ModelOpts *mo);
smelt_status cli_load_model(const char *path, const ModelOpts *mo, Graph **out);
/* Whether some --dim was given several values (specialisations). */
bool cli_dims_several(const ModelOpts *mo);
/* The tuning table used when none is named: $SMELT_TUNE_TABLE, else the
 * source tree's tuning/cuda.table when it is readable, else NULL. */
const char *cli_default_tune_table(void);
/* Value of "--flag VALUE" or "--flag=VALUE" at argv[*i]; NULL if argv[*i] is not that flag. */
const char *cli_flag_value(const char *flag, int argc, char **argv, int *i, bool *missing);

/* "Did you mean" (cli/flags.c): the flag of a command's help text nearest
 * to arg, a misspelled flag, into out; false when none is near. */
bool cli_suggest_flag(const char *help, const char *arg, char *out, size_t cap);
/* cli_usage's "unknown flag 'ARG'", with the nearest flag of help when one
 * is near; returns 2. */
int cli_unknown_flag(const char *cmd, const char *help, const char *arg);
/* The word of known[0..n) nearest to word (a misspelled command), or NULL. */
const char *cli_suggest_word(const char *word, const char *const *known, int n);
/* A tolerance of --check (--rtol, --atol): a finite number >= 0 (cli/flags.c). */
bool cli_parse_tolerance(const char *s, double *out);
/* --tp N: tensor-parallel ranks, 1 to 64; false for anything else. */
bool cli_parse_tp(const char *s, int *out);
/* How many CUDA devices d names: "cuda" or "cuda:N" 1, a list
 * "cuda:0,cuda:1" (tensor-parallel ranks, one each) its length; 0 when d
 * is not such a name. */
int cli_cuda_devices(const char *d);
/* A model (not a bundle) run on a list of N devices: --tp defaults to N,
 * and another --tp is a usage error (its exit code; 0 when fine). */
int cli_devices_tp(const char *cmd, const char *device, bool model, int *tp);
#define CLI_TP_HELP "  --tp N                  (a model, not a bundle) split it over N tensor-parallel ranks, run\n" \
                    "                          on threads of the session (smelt compile --tp)\n" \
                    "  --devices LIST          the GPUs of the ranks, one each: cuda:0,cuda:1 (implies --tp N\n" \
                    "                          for a model); NCCL between them. One GPU named N times runs\n" \
                    "                          every rank on it, collectives through host memory (a test)\n"
/* Prints the table of a --check (one row per output: errors, cosine,
 * pass/FAIL and the rule that decided); returns 0 when every output
 * passed, else 1 (cli/run.c). */
int cli_print_output_check(const ScOutputReport *r);
/* The size of the axis that integer value v indexes where a gather reads it
 * as its indices (token ids into an embedding; *out_node: that gather's
 * name), else 0: random inputs keep such ids valid. */
int64_t cli_gather_range(const Graph *g, int v, const char **out_node);

/* Writes g as Graphviz DOT, or SVG through `dot` for a .svg path. */
smelt_status cli_write_graph(const Graph *g, const char *path);

int cli_compile(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_tune(int argc, char **argv);
int cli_generate(int argc, char **argv);

struct RtCudaDevice;
/* Copy bandwidth in bytes/s (read + written): of the host on `threads`
 * threads, the best of three 256 MiB copies; of a GPU, a copy kernel over
 * 1 GiB (how says how it was measured).  0 when it cannot be measured
 * (cli/bench.c). */
double cli_host_copy_bandwidth(int threads);
double cli_gpu_copy_bandwidth(struct RtCudaDevice *d, char *how, size_t cap);

#endif
