/* smelt run: execute a model on a device and read/write .npy tensors.
 *
 * Inputs come from .npy files or are random: floats uniform in [-1, 1) from
 * a splitmix64 stream seeded by --seed and the input's name (so every input
 * differs and runs repeat exactly); integers count 0, 1, 2, ... along the
 * last axis, which makes a valid position vector for rope; bools alternate.
 * --output may name any value of the model (an input, a param, an
 * intermediate), which is how tests read the weights a model initialised. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char run_help[] =
    "usage: smelt run MODEL.yaml [flags]\n"
    "\n"
    "Runs a model and reads/writes tensors as .npy files.\n"
    "\n"
    "flags:\n"
    "  --device ref            the reference interpreter (plain C, every op; the oracle)\n"
    "                          (cpu and cuda come with the kernel backends)\n"
    "  --input NAME=FILE.npy   an input's data (repeatable); NAME=random for random data\n"
    "                          (inputs not given are random)\n"
    "  --output NAME=FILE.npy  write any value of the model (output, input, param or\n"
    "                          intermediate) to FILE.npy (repeatable); without --output the\n"
    "                          model's outputs are summarised on stdout\n"
    "  --seed N                seed of random inputs (default 0)\n"
    "  --dim NAME=VALUE        override a size from the model's dims (repeatable)\n"
    "  --dtype DTYPE           default element type of inputs and params\n";

typedef struct {
  const char *name, *file;
} NameFile;

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void *random_tensor(const TensorType *t, const char *name, uint64_t seed) {
  size_t n = (size_t)ir_type_numel(t);
  void *p = calloc(n ? n : 1, dt_size(t->dt));
  if (!p) return NULL;
  uint64_t s = seed ^ hash_name(name);
  int64_t last = t->rank ? t->dim[t->rank - 1] : 1;
  for (size_t i = 0; i < n; i++) {
    double v;
    if (dt_is_float(t->dt)) v = (double)(splitmix64(&s) >> 11) * 0x1.0p-52 - 1.0;
    else if (t->dt == DT_BOOL) v = i % 2;
    else v = (double)((int64_t)i % (last ? last : 1));
    dt_store(t->dt, p, i, v);
  }
  return p;
}

static smelt_status load_input(const Graph *g, int v, const char *file, void **out) {
  TensorType t;
  void *data;
  RETURN_IF_ERROR(fe_npy_read(file, &t, &data));
  const TensorType *want = &g->val[v].type;
  char a[256], b[256];
  bool same_shape = t.rank == want->rank;
  for (int i = 0; same_shape && i < t.rank; i++) same_shape = t.dim[i] == want->dim[i];
  if (!same_shape || (t.dt != want->dt && !(want->dt == DT_BF16 && t.dt == DT_F32))) {
    free(data);
    return st_error(ST_INVALID_INPUT, "%s: error: input '%s' is %s, the file holds %s", file, g->val[v].name,
                    ir_type_str(want, a, sizeof a), ir_type_str(&t, b, sizeof b));
  }
  if (t.dt != want->dt) {
    /* numpy has no bf16: a bf16 input is given as f32 and rounded here */
    size_t n = (size_t)ir_type_numel(&t);
    for (size_t i = 0; i < n; i++) dt_store(DT_BF16, data, i, dt_load(DT_F32, data, i));
  }
  *out = data;
  return NULL;
}

static void summarise(const Graph *g, int v, const void *data) {
  const TensorType *t = &g->val[v].type;
  char buf[256];
  size_t n = (size_t)ir_type_numel(t);
  double sum = 0, sq = 0, mn = INFINITY, mx = -INFINITY;
  for (size_t i = 0; i < n; i++) {
    double x = dt_load(t->dt, data, i);
    sum += x, sq += x * x;
    mn = x < mn ? x : mn, mx = x > mx ? x : mx;
  }
  double mean = n ? sum / (double)n : 0;
  printf("%s: %s  mean %.6g  std %.6g  min %.6g  max %.6g\n  [", g->val[v].name, ir_type_str(t, buf, sizeof buf),
         mean, n ? sqrt(fmax(sq / (double)n - mean * mean, 0)) : 0, mn, mx);
  for (size_t i = 0; i < n && i < 8; i++) printf(i ? ", %.6g" : "%.6g", dt_load(t->dt, data, i));
  printf("%s]\n", n > 8 ? ", ..." : "");
}

static smelt_status run_ref(const Graph *g, const NameFile *ins, int nin, const NameFile *outs, int nout,
                            uint64_t seed) {
  for (int i = 0; i < nin; i++) {
    int v = ir_find_value(g, ins[i].name);
    if (v < 0 || g->val[v].kind != VK_INPUT)
      return st_error(ST_INVALID_INPUT, "error: --input %s: the model has no input of that name", ins[i].name);
  }
  for (int i = 0; i < nout; i++)
    if (ir_find_value(g, outs[i].name) < 0)
      return st_error(ST_INVALID_INPUT, "error: --output %s: the model has no value of that name", outs[i].name);
  Interp *it;
  RETURN_IF_ERROR(ir_interp_create(g, &it));
  smelt_status st = NULL;
  for (int k = 0; k < g->ninputs && !st; k++) {
    int v = g->inputs[k];
    const char *file = NULL;
    for (int i = 0; i < nin; i++)
      if (strcmp(ins[i].name, g->val[v].name) == 0) file = ins[i].file;
    void *data = NULL;
    if (file && strcmp(file, "random") != 0) st = load_input(g, v, file, &data);
    else if (!(data = random_tensor(&g->val[v].type, g->val[v].name, seed))) st = st_error(ST_NO_MEMORY, "out of memory");
    if (!st) st = ir_interp_set_input(it, v, data);
    free(data);
  }
  if (!st) st = ir_interp_run(it);
  for (int i = 0; i < nout && !st; i++) {
    int v = ir_find_value(g, outs[i].name);
    const void *data = ir_interp_value(it, v);
    if (!data) st = st_error(ST_INTERNAL, "error: value '%s' was not computed", outs[i].name);
    else st = fe_npy_write(outs[i].file, &g->val[v].type, data);
  }
  if (!st && nout == 0)
    for (int i = 0; i < g->noutputs; i++) summarise(g, g->outputs[i], ir_interp_value(it, g->outputs[i]));
  ir_interp_destroy(it);
  return st;
}

static int parse_name_file(const char *flag, const char *v, NameFile *nf) {
  const char *eq = strchr(v, '=');
  if (!eq || eq == v || !eq[1]) return cli_usage("run", "%s needs NAME=FILE, got '%s'", flag, v);
  nf->name = strndup(v, (size_t)(eq - v));
  nf->file = eq + 1;
  return 0;
}

int cli_run(int argc, char **argv) {
  const char *model = NULL, *device = "ref";
  ModelOpts mo = {.dtype = DT_INVALID};
  NameFile ins[64], outs[64];
  int nin = 0, nout = 0, rc = 0;
  uint64_t seed = 0;
  for (int i = 1; i < argc && rc == 0; i++) {
    const char *a = argv[i], *v;
    bool missing = false;
    int r = cli_model_opt("run", argc, argv, &i, &mo);
    if (r == 2) rc = 2;
    if (r) continue;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(run_help, stdout);
      goto done;
    } else if ((v = cli_flag_value("--device", argc, argv, &i, &missing)) || missing) {
      if (missing) rc = cli_usage("run", "--device needs ref, cpu or cuda[:N]");
      device = v;
    } else if ((v = cli_flag_value("--input", argc, argv, &i, &missing)) || missing) {
      if (missing || nin == 64) rc = cli_usage("run", "--input needs NAME=FILE.npy");
      else if ((rc = parse_name_file("--input", v, &ins[nin])) == 0) nin++;
    } else if ((v = cli_flag_value("--output", argc, argv, &i, &missing)) || missing) {
      if (missing || nout == 64) rc = cli_usage("run", "--output needs NAME=FILE.npy");
      else if ((rc = parse_name_file("--output", v, &outs[nout])) == 0) nout++;
    } else if ((v = cli_flag_value("--seed", argc, argv, &i, &missing)) || missing) {
      char *end = NULL;
      seed = missing ? 0 : strtoull(v, &end, 10);
      if (missing || *end) rc = cli_usage("run", "--seed needs an integer");
    } else if (a[0] == '-') {
      rc = cli_usage("run", "unknown flag '%s'", a);
    } else if (!model) {
      model = a;
    } else {
      rc = cli_usage("run", "more than one model given ('%s' and '%s')", model, a);
    }
  }
  if (rc) goto done;
  if (!model) {
    rc = cli_usage("run", "no model given");
    goto done;
  }
  if (strcmp(device, "ref") != 0) {
    if (strcmp(device, "cpu") == 0 || strncmp(device, "cuda", 4) == 0)
      fprintf(stderr, "error: device '%s' is not available in this build: the CPU and CUDA backends are not built yet; use --device ref\n", device);
    else
      fprintf(stderr, "error: unknown device '%s' (ref, cpu, cuda[:N])\n", device);
    rc = 1;
    goto done;
  }
  size_t ml = strlen(model);
  if (ml > 6 && strcmp(model + ml - 6, ".smelt") == 0) {
    fprintf(stderr, "%s: error: kernel bundles are not supported yet; run the YAML model\n", model);
    rc = 1;
    goto done;
  }
  Graph *g = NULL;
  smelt_status st = cli_load_model(model, &mo, &g);
  if (!st) st = run_ref(g, ins, nin, outs, nout, seed);
  ir_graph_destroy(g);
  if (st) rc = cli_fail(st);
done:
  for (int i = 0; i < nin; i++) free((char *)ins[i].name);
  for (int i = 0; i < nout; i++) free((char *)outs[i].name);
  for (int i = 0; i < mo.ndims; i++) free((char *)mo.dims[i].name);
  return rc;
}
