/* smelt tune: the command line of the tuner engine (compiler/tune.h).
 * Flags become ScTuneOptions, the engine's report lines go to stdout as
 * they come, and its status decides the exit code (SPEC §6: 2 for a usage
 * error, 1 for anything the run could not get past, 0 otherwise, also when
 * candidates were REJECTED).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "compiler/tune.h"
#include "ir/target.h"

static const char tune_help[] =
    "usage: smelt tune MODEL.yaml [--target cuda] [flags]\n"
    "\n"
    "Measures every variant of the model's matmul, conv2d and attention kernels on the\n"
    "GPU and writes the fastest of each shape into a tuning table, which `smelt compile\n"
    "--target cuda` then uses.  Each candidate's result is checked against the\n"
    "heuristic's first; a candidate that disagrees is reported as REJECTED.\n"
    "\n"
    "flags:\n"
    "  --target cuda           the target tuned (the only one that has variants)\n"
    "  --dim NAME=VALUE[,VALUE...]  sizes, as for smelt compile (repeatable); several values\n"
    "                          tune every combination (prefill and decode shapes, say)\n"
    "  --dtype DTYPE           default element type of inputs and params (f16, bf16, ...)\n"
    "  -o, --output TABLE      the table to update (default: $SMELT_TUNE_TABLE, else the\n"
    "                          source tree's tuning/cuda.table, the one smelt compile reads);\n"
    "                          rows of other shapes are kept\n"
    "  --budget SECONDS        stop starting new shapes after this long (default 300);\n"
    "                          what was measured is written\n"
    "  --device N              the GPU to measure on (default 0)\n"
    "  --arch ARCH             the arch to tune for (default: the GPU's, sm_90a on an H200);\n"
    "                          the GPU must be able to run it\n"
    "  --dry-run               list the shapes and candidates, generate and compile them\n"
    "                          (NVRTC), without a GPU; writes nothing\n"
    "  --allow-tf32            f32 matmuls may use the TF32 tensor cores (as smelt compile\n"
    "                          --allow-tf32): their tf32 variants are candidates too, the\n"
    "                          heuristic's tf32 one the reference, with a TF32 tolerance;\n"
    "                          a row naming tf32 is used only by compiles with --allow-tf32\n"
    "  --quantize int8|int4|fp8  quantise the matmul weights first, as smelt compile\n"
    "                          --quantize does, and tune the quantised kernels\n"
    "  --group G               elements of K per scale (as smelt compile; default 128 for\n"
    "                          int4, 0 = per output channel for int8 and fp8)\n";

/* Flushed per line: a long run is watched as it goes. */
static void print_line(void *ctx, const char *line) {
  (void)ctx;
  printf("%s\n", line);
  fflush(stdout);
}

static bool parse_ordinal(const char *v, int *out) {
  if (strcmp(v, "cuda") == 0) return *out = 0, true;
  if (strncmp(v, "cuda:", 5) == 0) v += 5;
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (errno || end == v || *end || n < 0 || n > 1024) return false;
  *out = (int)n;
  return true;
}

int cli_tune(int argc, char **argv) {
  ModelOpts mo = {.dtype = DT_INVALID};
  ScTuneOptions o = {.budget_s = 300, .log = print_line};
  QuantOptions qo = {.mode = QM_NONE, .group = -1, .seed = 1};
  char dims_text[1024] = "";
  int rc = 0;
  for (int i = 1; i < argc && !rc; i++) {
    const char *a = argv[i], *v;
    bool missing = false;
    int r = cli_model_opt("tune", argc, argv, &i, &mo);
    if (r == 2) {
      rc = 2;
      break;
    }
    if (r == 1) {
      if (strncmp(a, "--dim", 5) == 0) {
        size_t n = strlen(dims_text);
        const char *d = a[5] == '=' ? a + 6 : argv[i];
        if (n + strlen(d) + 2 > sizeof dims_text) rc = cli_usage("tune", "too many --dim flags");
        else snprintf(dims_text + n, sizeof dims_text - n, "%s%s", n ? ";" : "", d);
      }
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(tune_help, stdout);
      for (int d = 0; d < mo.ndims; d++) free((char *)mo.dims[d].name);
      return 0;
    } else if ((v = cli_flag_value("-o", argc, argv, &i, &missing)) || missing ||
               (v = cli_flag_value("--output", argc, argv, &i, &missing)) || missing) {
      if (missing || !v[0]) rc = cli_usage("tune", "-o needs a file name");
      o.table_path = v;
    } else if ((v = cli_flag_value("--target", argc, argv, &i, &missing)) || missing) {
      if (missing || strcmp(v, "cuda") != 0)
        rc = cli_usage("tune", "only CUDA kernels have variants to tune: --target cuda%s%s%s", missing ? "" : " (got '",
                       missing ? "" : v, missing ? "" : "')");
    } else if ((v = cli_flag_value("--budget", argc, argv, &i, &missing)) || missing) {
      char *end = NULL;
      double s = missing ? 0 : strtod(v, &end);
      if (missing || *end || !(s > 0) || !isfinite(s)) rc = cli_usage("tune", "--budget needs a number of seconds > 0");
      o.budget_s = s;
    } else if ((v = cli_flag_value("--device", argc, argv, &i, &missing)) || missing) {
      if (missing || !parse_ordinal(v, &o.device)) rc = cli_usage("tune", "--device needs a GPU number (0, 1, ...)");
    } else if ((v = cli_flag_value("--arch", argc, argv, &i, &missing)) || missing) {
      int cc;
      bool specific;
      /* the engine keeps the arch in 16 bytes */
      if (missing || strchr(v, ',') || strncmp(v, "sm_", 3) != 0 || strlen(v) >= 16 ||
          !ir_cuda_parse_arch(v, &cc, &specific))
        rc = cli_usage("tune", "--arch needs one real arch such as sm_90a or sm_80%s%s%s", missing ? "" : " (got '",
                       missing ? "" : v, missing ? "" : "')");
      o.arch = v;
    } else if ((v = cli_flag_value("--quantize", argc, argv, &i, &missing)) || missing) {
      if (missing || (qo.mode = pass_quant_mode(v)) == QM_NONE)
        rc = cli_usage("tune", "--quantize takes int8, int4 or fp8%s%s%s", missing ? "" : " (got '", missing ? "" : v,
                       missing ? "" : "')");
    } else if ((v = cli_flag_value("--group", argc, argv, &i, &missing)) || missing) {
      char *end;
      long long gv = missing ? -1 : strtoll(v, &end, 10);
      if (missing || end == v || *end || gv < 0) rc = cli_usage("tune", "--group needs 0 or a positive integer");
      qo.group = gv;
    } else if (strcmp(a, "--dry-run") == 0) {
      o.dry_run = true;
    } else if (strcmp(a, "--allow-tf32") == 0) {
      o.allow_tf32 = true;
    } else if (a[0] == '-' && a[1]) {
      rc = cli_unknown_flag("tune", tune_help, a);
    } else if (!o.model) {
      o.model = a;
    } else {
      rc = cli_usage("tune", "one model at a time ('%s' and '%s')", o.model, a);
    }
  }
  if (!rc && !o.model) rc = cli_usage("tune", "no model given (smelt tune MODEL.yaml --target cuda)");
  if (!rc && qo.mode == QM_NONE && qo.group >= 0) rc = cli_usage("tune", "--group applies to --quantize");
  if (qo.mode != QM_NONE) {
    if (qo.group < 0) qo.group = qo.mode == QM_INT4 ? 128 : 0;
    o.quant = &qo;
  }
  /* every combination of the --dim values (specialisations, SPEC §2) */
  ScDimSpace space;
  smelt_status st = rc ? NULL : sc_dim_space_parse(dims_text[0] ? dims_text : NULL, &space);
  if (st) {
    rc = cli_usage("tune", "--dim: %s", st_message(st));
    st_free(st);
    sc_dim_space_free(&space);
  }
  if (rc) {
    for (int d = 0; d < mo.ndims; d++) free((char *)mo.dims[d].name);
    return rc;
  }
  /* the table `smelt compile` reads by default (cli_default_tune_table),
   * whether or not it exists yet */
  if (!o.table_path && getenv("SMELT_TUNE_TABLE") && getenv("SMELT_TUNE_TABLE")[0])
    o.table_path = getenv("SMELT_TUNE_TABLE");
#ifdef SMELT_DEFAULT_TUNE_TABLE
  if (!o.table_path) o.table_path = SMELT_DEFAULT_TUNE_TABLE;
#endif
  if (!o.table_path) o.table_path = "tuning/cuda.table";
  o.dims = &space;
  o.dtype = mo.dtype;

  st = sc_tune_model(&o, NULL);
  sc_dim_space_free(&space);
  for (int d = 0; d < mo.ndims; d++) free((char *)mo.dims[d].name);
  return st ? cli_fail(st) : 0;
}
