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
#include "compiler/check.h"
#include "compiler/driver.h"

static const char run_help[] =
    "usage: smelt run MODEL.yaml|OUT.smelt [flags]\n"
    "\n"
    "Runs a model (a YAML model is compiled in memory first) and reads/writes\n"
    "tensors as .npy files.\n"
    "\n"
    "flags:\n"
    "  --device ref|cpu|cuda[:N]  ref: the reference interpreter (plain C, every op; the oracle);\n"
    "                          cpu: the generated kernels on a thread pool; cuda: on GPU N\n"
    "                          (default 0); a YAML model is compiled for that target (default:\n"
    "                          ref for a YAML model, the bundle's target for a bundle)\n"
    "  --threads N             CPU worker threads (default: the number of cores)\n"
    CLI_TP_HELP
    "  --check                 also run the reference and print max abs/rel and rel L2 error\n"
    "                          per output; exit 1 when one exceeds the tolerance\n"
    "  --check=groups          compare every fused group's results with the unfused reference\n"
    "                          and name the first group that diverges\n"
    "  --rtol R, --atol A      with --check: judge every float result elementwise as\n"
    "                          numpy.allclose, |x - ref| <= A + R*|ref| (the one not given is 0),\n"
    "                          instead of the default rules (f32/f64: rel L2 <= 1e-5; f16/bf16:\n"
    "                          cosine >= 0.999; a reference ~0: max abs <= 1e-2 / 1e-1);\n"
    "                          integers stay exact\n"
    "  --input NAME=FILE.npy   an input's data (repeatable); NAME=random for random data\n"
    "                          (inputs not given are random)\n"
    "  --output NAME=FILE.npy  write a value to FILE.npy (repeatable): any value of the model\n"
    "                          (input, param, intermediate) on ref, outputs on cpu/cuda; without\n"
    "                          --output the model's outputs are summarised on stdout\n"
    "                          (bf16 values are written as f32: numpy has no bf16)\n"
    "  --seed N                seed of random inputs (default 0)\n"
    "  --dim NAME=VALUE        override a size from the model's dims (repeatable); of a bundle\n"
    "                          of several specialisations, the one to run (else the shapes of\n"
    "                          the --input files choose it)\n"
    "  --dtype DTYPE           default element type of inputs and params\n"
    "  --allow-tf32            (YAML on cuda) f32 matmuls may use the TF32 tensor cores, as\n"
    "                          smelt compile --allow-tf32 (--check still holds f32 outputs to\n"
    "                          f32's tolerance, which TF32's ~1e-3 misses)\n";

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

/* An input's data when none is given: floats uniform in [-1, 1); the
 * indices of a gather uniform over the axis it indexes (valid ids); other
 * integers 0, 1, 2, ... along the last axis (valid positions); bools
 * alternating.  Says so on stderr. */
static void *random_tensor(const Graph *g, int v, uint64_t seed) {
  const TensorType *t = &g->val[v].type;
  const char *name = g->val[v].name, *gnode = NULL;
  size_t n = (size_t)ir_type_numel(t);
  void *p = calloc(n ? n : 1, dt_size(t->dt));
  if (!p) return NULL;
  uint64_t s = seed ^ hash_name(name);
  int64_t last = t->rank ? t->dim[t->rank - 1] : 1;
  int64_t range = dt_is_int(t->dt) ? cli_gather_range(g, v, &gnode) : 0;
  for (size_t i = 0; i < n; i++) {
    double x;
    if (dt_is_float(t->dt)) x = (double)(splitmix64(&s) >> 11) * 0x1.0p-52 - 1.0;
    else if (t->dt == DT_BOOL) x = i % 2;
    else if (range > 0) x = (double)(splitmix64(&s) % (uint64_t)range);
    else x = (double)((int64_t)i % (last ? last : 1));
    dt_store(t->dt, p, i, x);
  }
  if (dt_is_float(t->dt))
    fprintf(stderr, "smelt: note: input '%s' not given: random, uniform in [-1, 1) (seed %llu)\n", name,
            (unsigned long long)seed);
  else if (range > 0)
    fprintf(stderr, "smelt: note: input '%s' not given: random ids in [0, %lld), the range of gather '%s'\n", name,
            (long long)range, gnode);
  else if (t->dt == DT_BOOL) fprintf(stderr, "smelt: note: input '%s' not given: alternating false, true\n", name);
  else fprintf(stderr, "smelt: note: input '%s' not given: 0, 1, 2, ... along its last axis\n", name);
  return p;
}

/* The shape of a tensor of type t in a run with the ranges at rv. */
static TensorType run_type(const TensorType *t, const int64_t *rv) {
  TensorType u = *t;
  for (int a = 0; a < t->rank; a++) u.dim[a] = ir_type_extent(t, a, rv), u.dyn[a] = 0;
  return u;
}

static smelt_status load_input(const Graph *g, int v, const char *file, void **out, TensorType *shape, int64_t *rv) {
  TensorType t;
  void *data;
  RETURN_IF_ERROR(fe_npy_read(file, &t, &data));
  const TensorType *want = &g->val[v].type;
  char a[256], b[256];
  bool same_shape = t.rank == want->rank;
  /* a ranged axis takes any extent of its range (the same value in every input) */
  for (int i = 0; same_shape && i < t.rank; i++)
    same_shape = want->dyn[i] ? rt_solve_range(g, want, i, t.dim[i], rv) : t.dim[i] == want->dim[i];
  *shape = t;
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

static void summarise(const Graph *g, int v, const void *data, const int64_t *rv) {
  TensorType rt = run_type(&g->val[v].type, rv);
  const TensorType *t = &rt;
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

/* Reads or makes the data of every graph input, in graph input order. */
static smelt_status gather_inputs(const Graph *g, const NameFile *ins, int nin, uint64_t seed, void **data,
                                  TensorType *shapes, int64_t *rv) {
  for (int r = 0; r < IR_MAX_RANGES; r++) rv[r] = -1;
  for (int i = 0; i < nin; i++) {
    int v = ir_find_value(g, ins[i].name);
    if (v < 0 || g->val[v].kind != VK_INPUT)
      return st_error(ST_INVALID_INPUT, "error: --input %s: the model has no input of that name", ins[i].name);
  }
  for (int k = 0; k < g->ninputs; k++) {
    int v = g->inputs[k];
    const char *file = NULL;
    for (int i = 0; i < nin; i++)
      if (strcmp(ins[i].name, g->val[v].name) == 0) file = ins[i].file;
    if (file && strcmp(file, "random") != 0) RETURN_IF_ERROR(load_input(g, v, file, &data[k], &shapes[k], rv));
  }
  for (int k = 0; k < g->ninputs; k++) {
    int v = g->inputs[k];
    if (data[k]) continue;
    /* random: at the max of its ranges, unless an input file set one */
    const TensorType *t = &g->val[v].type;
    for (int a = 0; a < t->rank; a++) {
      int r = t->dyn[a] - 1;
      if (r < 0) continue;
      if (rv[r] >= 0 && rv[r] != g->ranges[r].max)
        return st_error(ST_INVALID_INPUT, "error: input '%s' is ranged along '%s', which the --input files set to %lld: "
                        "give it as a file too (random inputs take the range's max, %lld)", t->rank ? g->val[v].name : "",
                        g->ranges[r].name, (long long)rv[r], (long long)g->ranges[r].max);
      rv[r] = g->ranges[r].max;
    }
    if (!(data[k] = random_tensor(g, v, seed))) return st_error(ST_NO_MEMORY, "out of memory");
    shapes[k] = run_type(t, NULL);
  }
  for (int r = 0; r < g->nranges; r++)
    if (rv[r] < 0) rv[r] = g->ranges[r].max;
  return NULL;
}

static smelt_status run_ref(const Graph *g, void *const *inputs, const NameFile *outs, int nout) {
  for (int i = 0; i < nout; i++)
    if (ir_find_value(g, outs[i].name) < 0)
      return st_error(ST_INVALID_INPUT, "error: --output %s: the model has no value of that name", outs[i].name);
  Interp *it;
  RETURN_IF_ERROR(ir_interp_create(g, &it));
  smelt_status st = NULL;
  for (int k = 0; k < g->ninputs && !st; k++) st = ir_interp_set_input(it, g->inputs[k], inputs[k]);
  if (!st) st = ir_interp_run(it);
  for (int i = 0; i < nout && !st; i++) {
    int v = ir_find_value(g, outs[i].name);
    const void *data = ir_interp_value(it, v);
    if (!data) st = st_error(ST_INTERNAL, "error: value '%s' was not computed", outs[i].name);
    else st = fe_npy_write(outs[i].file, &g->val[v].type, data);
  }
  if (!st && nout == 0)
    for (int i = 0; i < g->noutputs; i++) summarise(g, g->outputs[i], ir_interp_value(it, g->outputs[i]), NULL);
  ir_interp_destroy(it);
  return st;
}

int cli_print_output_check(const ScOutputReport *r) {
  printf("check against the reference interpreter:\n");
  printf("  %-24s %12s %12s %12s %10s  %-6s %s\n", "output", "max abs", "max rel", "rel L2", "cosine", "result",
         "rule (what decides)");
  for (int i = 0; i < r->noutputs; i++) {
    const ScOutputCheck *o = &r->outputs[i];
    char rule[128];
    printf("  %-24s %12.3g %12.3g %12.3g %10.6f  %-6s %s\n", o->name, o->diff.max_abs, o->diff.max_rel,
           o->diff.rel_l2, o->diff.cosine, o->diff.pass ? "pass" : "FAIL", sc_rule_text(&o->diff, rule, sizeof rule));
  }
  bool any = false;
  for (int i = 0; i < r->noutputs; i++) any |= r->outputs[i].has_f32;
  if (any) {
    /* what the f16 arithmetic costs against full precision: shown, not judged */
    printf("against the f32 reference (the same graph in f32; informational, does not decide the check):\n");
    for (int i = 0; i < r->noutputs; i++) {
      const ScOutputCheck *o = &r->outputs[i];
      if (!o->has_f32) continue;
      char rule[128];
      printf("  %-24s %12.3g %12.3g %12.3g %10.6f  %-6s %s\n", o->name, o->f32.max_abs, o->f32.max_rel,
             o->f32.rel_l2, o->f32.cosine, o->f32.pass ? "ok" : "LOW", sc_rule_text(&o->f32, rule, sizeof rule));
    }
  }
  if (r->f32_note[0]) printf("  (%s)\n", r->f32_note);
  return r->pass ? 0 : 1;
}

static int print_group_check(const ScGroupReport *r) {
  printf("check of every fused group against the unfused reference:\n");
  printf("  %-28s %-24s %12s %10s  %-6s %s\n", "kernel", "value", "max abs", "cosine", "result", "rule");
  for (int i = 0; i < r->nchecks; i++) {
    const ScValueCheck *c = &r->checks[i];
    char rule[128];
    printf("  %-28s %-24s %12.3g %10.6f  %-6s %s\n", c->kernel_name, c->value_name, c->diff.max_abs, c->diff.cosine,
           c->clobbered ? "CLOBBERED (memory plan)" : c->diff.pass ? "pass" : "FAIL",
           sc_rule_text(&c->diff, rule, sizeof rule));
  }
  if (r->first_bad >= 0) {
    const ScValueCheck *c = &r->checks[r->first_bad];
    printf("first divergence: kernel %s (group %d), value %s\n", c->kernel_name, c->group, c->value_name);
    return 1;
  }
  printf("all groups match\n");
  return 0;
}

/* Runs a bundle on a device (cpu, cuda, cuda:N); returns a status, and in
 * *check_rc 1 when a --check found a mismatch. */
static smelt_status run_device(smelt_bundle *b, int spec, const char *device, int threads, void *const *inputs,
                               const TensorType *shapes, const int64_t *rv, const NameFile *outs, int nout, int check,
                               const ScTol *tol, int *check_rc) {
  const Graph *g = rt_bundle_graph(rt_bundle_spec(b, spec));
  for (int i = 0; i < nout; i++) {
    int v = ir_find_value(g, outs[i].name);
    bool is_output = false;
    for (int k = 0; k < g->noutputs; k++) is_output |= g->outputs[k] == v;
    if (!is_output)
      return st_error(ST_INVALID_INPUT, "error: --output %s: not an output of the model (--device ref can write any value)",
                      outs[i].name);
  }
  smelt_session_options so = {.threads = threads, .cuda_compile = smelt_nvrtc_compile};
  smelt_session *s;
  RETURN_IF_ERROR(smelt_session_create(b, device, &so, &s));
  /* the checks bind and run the session's specialisation: choose it first */
  smelt_status st = smelt_session_select(s, spec);
  if (st) {
  } else if (check == 1) {
    ScOutputReport r;
    st = sc_check_outputs_tol(s, (const void *const *)inputs, tol, &r);
    if (!st) *check_rc = cli_print_output_check(&r), sc_output_report_free(&r);
  } else if (check == 2) {
    ScGroupReport r;
    st = sc_check_groups_tol(s, (const void *const *)inputs, tol, &r);
    if (!st) *check_rc = print_group_check(&r), sc_group_report_free(&r);
  }
  void **res = calloc((size_t)g->noutputs + 1, sizeof(void *));
  if (!res) st = st ? st : st_error(ST_NO_MEMORY, "out of memory");
  for (int k = 0; k < g->ninputs && !st; k++) {
    const Value *v = &g->val[g->inputs[k]];
    st = smelt_session_bind_input_shaped(s, v->name, inputs[k], shapes[k].rank, shapes[k].dim, ir_type_bytes(&shapes[k]));
  }
  for (int k = 0; k < g->noutputs && !st; k++) {
    const Value *v = &g->val[g->outputs[k]];
    TensorType t = run_type(&v->type, rv);
    if (!(res[k] = malloc(ir_type_bytes(&t) + 1))) st = st_error(ST_NO_MEMORY, "out of memory");
    else st = smelt_session_bind_output(s, v->name, res[k], ir_type_bytes(&t));
  }
  if (!st) st = smelt_session_run(s);
  for (int i = 0; i < nout && !st; i++) {
    int v = ir_find_value(g, outs[i].name);
    for (int k = 0; k < g->noutputs && !st; k++)
      if (g->outputs[k] == v) {
        TensorType t = run_type(&g->val[v].type, rv);
        st = fe_npy_write(outs[i].file, &t, res[k]);
      }
  }
  if (!st && nout == 0 && !check)
    for (int k = 0; k < g->noutputs; k++) summarise(g, g->outputs[k], res[k], rv);
  for (int k = 0; res && k < g->noutputs; k++) free(res[k]);
  free(res);
  smelt_session_destroy(s);
  return st;
}

/* Which specialisation of bundle b to run: the one --dim names, else the
 * one the shapes of the --input files fit (a bundle of one: that one). */
static smelt_status choose_spec(smelt_bundle *b, const ModelOpts *mo, const char *dims, const NameFile *ins, int nin,
                                int *out_spec) {
  *out_spec = 0;
  if (mo->ndims) return rt_bundle_find_spec(b, dims, out_spec);
  if (rt_bundle_num_specs(b) == 1) return NULL;
  const char *names[64];
  TensorType shapes[64];
  int n = 0;
  smelt_status st = NULL;
  for (int i = 0; i < nin && !st; i++) {
    if (strcmp(ins[i].file, "random") == 0) continue;
    void *data;
    if ((st = fe_npy_read(ins[i].file, &shapes[n], &data))) break;
    free(data);
    names[n++] = ins[i].name;
  }
  if (st) return st;
  if (n == 0) {
    char list[512] = "";
    for (int i = 0; i < rt_bundle_num_specs(b); i++) {
      size_t k = strlen(list);
      snprintf(list + k, sizeof list - k, "%s%s", i ? "; " : "", rt_bundle_spec_label(rt_bundle_spec(b, i)));
    }
    return st_error(ST_INVALID_INPUT, "error: the bundle holds %d specialisations (%s): choose one with --dim or give "
                    "--input files whose shapes pick one", rt_bundle_num_specs(b), list);
  }
  return rt_bundle_match_inputs(b, names, shapes, n, out_spec);
}

/* "seq=1;hidden=64" for the compile options, from the --dim flags. */
static void dims_string(const ModelOpts *mo, char *buf, size_t n) {
  buf[0] = 0;
  for (int i = 0; i < mo->ndims; i++) {
    size_t k = strlen(buf);
    if (mo->dims[i].max > 0)
      snprintf(buf + k, n - k, "%s%s=%lld..%lld", i ? ";" : "", mo->dims[i].name, (long long)mo->dims[i].value,
               (long long)mo->dims[i].max);
    else snprintf(buf + k, n - k, "%s%s=%lld", i ? ";" : "", mo->dims[i].name, (long long)mo->dims[i].value);
  }
}

static int parse_name_file(const char *flag, const char *v, NameFile *nf) {
  const char *eq = strchr(v, '=');
  if (!eq || eq == v || !eq[1]) return cli_usage("run", "%s needs NAME=FILE, got '%s'", flag, v);
  nf->name = strndup(v, (size_t)(eq - v));
  nf->file = eq + 1;
  return 0;
}

int cli_run(int argc, char **argv) {
  const char *model = NULL, *device = NULL;
  ModelOpts mo = {.dtype = DT_INVALID};
  NameFile ins[64], outs[64];
  int nin = 0, nout = 0, rc = 0;
  uint64_t seed = 0;
  int check = 0, threads = 0;
  bool allow_tf32 = false;
  int tp = 1;
  ScTol tol = {0};
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
    } else if ((v = cli_flag_value("--devices", argc, argv, &i, &missing)) || missing) {
      if (missing || cli_cuda_devices(v) < 1) rc = cli_usage("run", "--devices needs a list of GPUs: cuda:0,cuda:1");
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
    } else if (strcmp(a, "--check") == 0 || strcmp(a, "--check=outputs") == 0) {
      check = 1;
    } else if (strcmp(a, "--check=groups") == 0) {
      check = 2;
    } else if (strcmp(a, "--allow-tf32") == 0) {
      allow_tf32 = true;
    } else if ((v = cli_flag_value("--tp", argc, argv, &i, &missing)) || missing) {
      if (!cli_parse_tp(v, &tp)) rc = cli_usage("run", "--tp needs a number of ranks, 1 to 64");
    } else if ((v = cli_flag_value("--rtol", argc, argv, &i, &missing)) || missing) {
      if (!cli_parse_tolerance(v, &tol.rtol)) rc = cli_usage("run", "--rtol needs a number >= 0");
      tol.set = true;
    } else if ((v = cli_flag_value("--atol", argc, argv, &i, &missing)) || missing) {
      if (!cli_parse_tolerance(v, &tol.atol)) rc = cli_usage("run", "--atol needs a number >= 0");
      tol.set = true;
    } else if ((v = cli_flag_value("--threads", argc, argv, &i, &missing)) || missing) {
      char *end = NULL;
      threads = missing ? 0 : (int)strtol(v, &end, 10);
      if (missing || *end || threads < 1) rc = cli_usage("run", "--threads needs a positive integer");
    } else if (a[0] == '-') {
      rc = cli_unknown_flag("run", run_help, a);
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
  size_t ml0 = strlen(model);
  if (!device && ml0 > 6 && strcmp(model + ml0 - 6, ".smelt") == 0) {
    /* a bundle runs where it was compiled for: cpu when it has CPU code */
    smelt_bundle *peek = NULL;
    smelt_status pst = rt_bundle_open_nojit(model, &peek);
    const char *targets = pst ? NULL : rt_bundle_manifest_get(peek, "targets");
    device = targets && !strstr(targets, "cpu") && strstr(targets, "cuda") ? "cuda" : "cpu";
    smelt_bundle_close(peek);
    st_free(pst); /* reported when the bundle is opened below */
  }
  if (!device) device = "ref";
  bool is_ref = strcmp(device, "ref") == 0, is_cpu = strcmp(device, "cpu") == 0;
  bool is_cuda = cli_cuda_devices(device) > 0;
  if (!is_ref && !is_cpu && !is_cuda) {
    rc = cli_usage("run", "unknown device '%s' (ref, cpu, cuda, cuda:N)", device);
    goto done;
  }
  if (tol.set && !check) {
    rc = cli_usage("run", "--rtol and --atol set the tolerance of --check: add --check");
    goto done;
  }
  if (check && is_ref) {
    rc = cli_usage("run", "--check compares a device with the reference: use it with --device cpu or cuda");
    goto done;
  }
  size_t ml = strlen(model);
  bool is_bundle = ml > 6 && strcmp(model + ml - 6, ".smelt") == 0;
  if (is_bundle && mo.dtype != DT_INVALID) {
    rc = cli_usage("run", "--dtype applies when compiling; a bundle is already compiled");
    goto done;
  }
  if (tp > 1 && (is_bundle || is_ref)) {
    rc = cli_usage("run", "--tp applies when compiling a model for the cpu or cuda (a bundle's ranks are set by smelt "
                   "compile --tp)");
    goto done;
  }
  if ((rc = cli_devices_tp("run", device, !is_bundle, &tp)) != 0) goto done;
  if (allow_tf32 && (is_bundle || !is_cuda)) {
    rc = cli_usage("run", "--allow-tf32 applies when compiling a YAML model for cuda (smelt compile --allow-tf32 for a bundle)");
    goto done;
  }
  if (cli_dims_several(&mo)) {
    rc = cli_usage("run", "several values of a --dim make specialisations: compile them into a bundle "
                          "(smelt compile --dim ...), then run it with --dim NAME=VALUE or inputs of the shapes wanted");
    goto done;
  }
  smelt_status st = NULL;
  Graph *own = NULL;
  smelt_bundle *b = NULL;
  const Graph *g = NULL;
  int spec = 0;
  char dims[1024];
  dims_string(&mo, dims, sizeof dims);
  if (is_bundle) {
    st = !is_ref ? smelt_bundle_open(model, &b) : rt_bundle_open_nojit(model, &b);
    if (!st) st = choose_spec(b, &mo, dims, ins, nin, &spec);
    if (!st) g = rt_bundle_graph(rt_bundle_spec(b, spec));
  } else if (!is_ref) {
    /* a YAML model on a device: compile in memory for it first (for CUDA,
     * the arch of the GPU present) */
    smelt_compile_options co = {.targets = is_cpu ? "cpu" : "cuda", .dims = dims[0] ? dims : NULL,
                                .dtype = mo.dtype != DT_INVALID ? dt_name(mo.dtype) : NULL, .allow_tf32 = allow_tf32,
                                .tp = tp};
    void *buf = NULL;
    size_t len = 0;
    st = sc_compile_model_to_memory(model, &co, &buf, &len);
    if (!st) st = smelt_bundle_open_memory(buf, len, &b);
    free(buf);
    if (!st) g = rt_bundle_graph(b);
  } else {
    st = cli_load_model(model, &mo, &own);
    g = own;
  }
  void **inputs = NULL;
  TensorType *shapes = NULL;
  int64_t rv[IR_MAX_RANGES];
  if (!st && (!(inputs = calloc((size_t)g->ninputs + 1, sizeof(void *))) ||
              !(shapes = calloc((size_t)g->ninputs + 1, sizeof *shapes))))
    st = st_error(ST_NO_MEMORY, "out of memory");
  if (!st) st = gather_inputs(g, ins, nin, seed, inputs, shapes, rv);
  int check_rc = 0;
  if (!st && check && g->nranges)
    for (int r = 0; r < g->nranges && !st; r++)
      if (rv[r] != g->ranges[r].max)
        st = st_error(ST_INVALID_INPUT, "error: --check runs a ranged model at the max of its ranges (%s = %lld); "
                      "without --check any value runs", g->ranges[r].name, (long long)g->ranges[r].max);
  if (!st) st = !is_ref ? run_device(b, spec, device, threads, inputs, shapes, rv, outs, nout, check, &tol, &check_rc) : run_ref(g, inputs, outs, nout);
  free(shapes);
  for (int k = 0; inputs && k < g->ninputs; k++) free(inputs[k]);
  free(inputs);
  ir_graph_destroy(own);
  smelt_bundle_close(b);
  if (st) rc = cli_fail(st);
  else rc = check_rc;
done:
  for (int i = 0; i < nin; i++) free((char *)ins[i].name);
  for (int i = 0; i < nout; i++) free((char *)outs[i].name);
  for (int i = 0; i < mo.ndims; i++) free((char *)mo.dims[i].name);
  return rc;
}
