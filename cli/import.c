/* smelt import: an ONNX model as smelt YAML plus a safetensors file of its
 * constants, so that a user can read and edit what was imported.
 *
 * The YAML is the imported graph written out node by node: graph inputs
 * under `inputs:` (their symbolic sizes by dim name), every constant the
 * graph uses under `params:` as `from: NAME` of the safetensors file written
 * next to the YAML, every node with its smelt op and attributes, and the
 * outputs.  Names are the ONNX names; YAML names cannot contain '/', which
 * the TorchScript exporter puts in every intermediate name
 * ("/layers.0/attn/MatMul_output_0"), so there a '/' becomes '.' (and a
 * leading one goes), with a numeric suffix where that would collide.
 * Graph inputs and outputs keep their names unchanged whenever they can.
 *
 * Sizes computed from the symbolic dims (a Reshape to [batch*seq, 64]) are
 * fixed numbers in the YAML: the `dims:` it declares name the input sizes
 * only, so changing one means importing again with --dim (or compiling the
 * .onnx directly, which re-imports). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_import(int argc, char **argv);

static const char import_help[] =
    "usage: smelt import MODEL.onnx -o OUT.yaml [--dim NAME=VALUE] [--dtype f16]\n"
    "       smelt import hf DIR -o OUT.yaml [--ctx N] [--seq N] [--dtype D] [--no-cache]\n"
    "\n"
    "Writes the ONNX model as smelt YAML (OUT.yaml) and its constants as OUT.safetensors\n"
    "next to it.  Symbolic ONNX dims (dim_param) become dims of the same name; --dim sets\n"
    "the value the import uses (default 1).\n"
    "\n"
    "'smelt import hf DIR' writes the Hugging Face checkpoint in DIR (config.json and\n"
    "model.safetensors, or the shards of model.safetensors.index.json) as smelt YAML that\n"
    "reads the weights from the checkpoint's files by their HF names (nothing is copied but\n"
    "the repacked linears of a GPTQ or AWQ checkpoint: NAME.gptq.safetensors beside the YAML).\n"
    "Llama-family models: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM.\n"
    "The model takes ids and pos ([seq] i32) and keeps a KV cache per layer (state\n"
    "k_cache/v_cache [1, kv_heads, ctx, head_dim]); its outputs are the last position's\n"
    "logits [1, vocab] and their argmax next.  Prefill with --dim seq=L, decode with seq=1.\n"
    "  --ctx N       KV cache capacity (default min(max_position_embeddings, 2048))\n"
    "  --seq N       the seq dim's value in the YAML (default 1; compile with --dim seq=N)\n"
    "  --dtype D     the model's dtype (default: the checkpoint's f32/f16/bf16)\n"
    "  --no-cache    no KV cache: causal attention over the whole sequence and logits\n"
    "                [seq, vocab] for every position, as a forward pass in transformers\n";

static void print_help(FILE *f) { fputs(import_help, f); }

/* ---- names ---- */

typedef struct {
  char **name; /* per value id: its YAML name (NULL until assigned) */
  char **taken;
  int ntaken, cap;
} Names;

static bool taken(const Names *nm, const char *s) {
  for (int i = 0; i < nm->ntaken; i++)
    if (!strcmp(nm->taken[i], s)) return true;
  return false;
}

static const char *yaml_name(Names *nm, const Graph *g, int v) {
  if (nm->name[v]) return nm->name[v];
  const char *src = g->val[v].name;
  size_t n = strlen(src);
  char *s = malloc(n + 24);
  if (!s) abort();
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)src[i];
    if (c == '/' && k == 0) continue;
    s[k++] = c == '/' ? '.' : c < 0x20 || c == 0x7f ? '_' : (char)c;
  }
  if (!k) s[k++] = 'v';
  s[k] = 0;
  for (int suffix = 1; taken(nm, s); suffix++) snprintf(s + k, 24, "_%d", suffix);
  if (nm->ntaken == nm->cap) {
    nm->cap = nm->cap ? 2 * nm->cap : 256;
    nm->taken = realloc(nm->taken, sizeof(char *) * (size_t)nm->cap);
    if (!nm->taken) abort();
  }
  nm->taken[nm->ntaken++] = s;
  nm->name[v] = s;
  return s;
}

/* A double-quoted YAML (and JSON) string. */
static void put_quoted(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

/* ---- safetensors ---- */

static smelt_status write_safetensors(const char *path, const Graph *g, const int *consts, int n, Names *nm) {
  FeStHeader hd;
  RETURN_IF_ERROR(fe_st_header_open(&hd));
  for (int i = 0; i < n; i++) {
    const Value *v = &g->val[consts[i]];
    fe_st_header_add(&hd, yaml_name(nm, g, consts[i]), v->type.dt, v->type.rank, v->type.dim);
  }
  FILE *f = fopen(path, "wb");
  if (!f) {
    fclose(hd.json);
    free(hd.buf);
    return st_error(ST_IO, "%s: error: cannot write: %s", path, strerror(errno));
  }
  smelt_status st = fe_st_header_write(&hd, f, path);
  bool ok = !st;
  for (int i = 0; i < n && ok; i++) {
    const Value *v = &g->val[consts[i]];
    size_t bytes = ir_type_bytes(&v->type);
    ok = !bytes || fwrite(v->data, 1, bytes, f) == bytes;
  }
  ok &= fclose(f) == 0;
  if (st) return st;
  if (!ok) return st_error(ST_IO, "%s: error: write failed", path);
  return NULL;
}

/* ---- YAML ---- */

static void put_float(FILE *f, double x) {
  if (isnan(x)) fputs(".nan", f);
  else if (isinf(x)) fputs(x > 0 ? ".inf" : "-.inf", f);
  else {
    char b[40];
    snprintf(b, sizeof b, "%.17g", x);
    /* YAML reads "1e-05" and "2.5" as floats and "3" as an int: all are fine for a float attribute */
    fputs(b, f);
  }
}

static void put_attr(FILE *f, const Attr *a) {
  fprintf(f, ", %s: ", a->name);
  switch (a->type) {
  case AT_INT: fprintf(f, "%" PRId64, a->i); break;
  case AT_BOOL: fputs(a->i ? "true" : "false", f); break;
  case AT_FLOAT: put_float(f, a->f); break;
  case AT_DTYPE: fputs(dt_name(a->dt), f); break;
  case AT_ENUM: fputs(a->s, f); break;
  case AT_INTS:
    fputc('[', f);
    for (int i = 0; i < a->n; i++) fprintf(f, "%s%" PRId64, i ? ", " : "", a->ints[i]);
    fputc(']', f);
    break;
  }
}

static void put_shape(FILE *f, const TensorType *t, const char *const *dimnames) {
  fputc('[', f);
  for (int d = 0; d < t->rank; d++) {
    if (d) fputs(", ", f);
    if (dimnames && dimnames[d]) put_quoted(f, dimnames[d]);
    else fprintf(f, "%" PRId64, t->dim[d]);
  }
  fputc(']', f);
}

static smelt_status write_yaml(const char *path, const char *model, const char *weights_base, const Graph *g,
                               const FeOnnxInfo *info, const int *consts, int nconst, Names *nm) {
  FILE *f = fopen(path, "w");
  if (!f) return st_error(ST_IO, "%s: error: cannot write: %s", path, strerror(errno));
  fprintf(f, "# Imported by smelt import from %s (ONNX opset %" PRId64 "%s%s).\n", model, info->opset,
          info->producer && *info->producer ? ", producer " : "", info->producer ? info->producer : "");
  if (info->ndims) {
    fputs("# Sizes computed from the dims are fixed numbers below: to change a dim, import\n"
          "# again with --dim (or compile the .onnx directly with --dim).\n",
          f);
  }
  fputs("smelt: 1\nname: ", f);
  put_quoted(f, g->name ? g->name : "model");
  fputc('\n', f);
  if (info->ndims) {
    fputs("dims: {", f);
    for (int i = 0; i < info->ndims; i++) {
      fputs(i ? ", " : "", f);
      put_quoted(f, info->dims[i].name);
      fprintf(f, ": %" PRId64, info->dims[i].value);
    }
    fputs("}\n", f);
  }
  if (nconst) {
    fputs("weights: ", f);
    put_quoted(f, weights_base);
    fputc('\n', f);
  }
  fputs("inputs:\n", f);
  for (int i = 0; i < g->ninputs; i++) {
    const Value *v = &g->val[g->inputs[i]];
    fputs("  ", f);
    put_quoted(f, yaml_name(nm, g, g->inputs[i]));
    fputs(": {shape: ", f);
    put_shape(f, &v->type, info->input_dims ? info->input_dims + i * IR_MAX_RANK : NULL);
    fprintf(f, ", dtype: %s}\n", dt_name(v->type.dt));
  }
  if (nconst) fputs("params:\n", f);
  for (int i = 0; i < nconst; i++) {
    const Value *v = &g->val[consts[i]];
    const char *n = yaml_name(nm, g, consts[i]);
    fputs("  ", f);
    put_quoted(f, n);
    fputs(": {shape: ", f);
    put_shape(f, &v->type, NULL);
    fprintf(f, ", dtype: %s, from: ", dt_name(v->type.dt));
    put_quoted(f, n);
    fputs("}\n", f);
  }
  fputs("nodes:\n", f);
  for (int i = 0; i < g->nnode; i++) {
    const Node *nd = &g->node[i];
    if (nd->dead) continue;
    fputs("  - {out: ", f);
    if (nd->nout > 1) fputc('[', f);
    for (int o = 0; o < nd->nout; o++) {
      fputs(o ? ", " : "", f);
      put_quoted(f, yaml_name(nm, g, nd->out[o]));
    }
    if (nd->nout > 1) fputc(']', f);
    fprintf(f, ", op: %s, in: [", ir_op_name(nd->op));
    for (int k = 0; k < nd->nin; k++) {
      fputs(k ? ", " : "", f);
      put_quoted(f, yaml_name(nm, g, nd->in[k]));
    }
    fputc(']', f);
    for (int a = 0; a < nd->nattr; a++) put_attr(f, &nd->attr[a]);
    fputs("}\n", f);
  }
  fputs("outputs: [", f);
  for (int i = 0; i < g->noutputs; i++) {
    fputs(i ? ", " : "", f);
    put_quoted(f, yaml_name(nm, g, g->outputs[i]));
  }
  fputs("]\n", f);
  if (fclose(f) != 0) return st_error(ST_IO, "%s: error: write failed", path);
  return NULL;
}

/* The import proper, after the flags: read MODEL.onnx, write OUT.yaml and
 * its safetensors file. */
static int import_model(const char *model, const char *out, const ModelOpts *mo_) {
  const ModelOpts mo = *mo_;
  if (!model) return cli_usage("import", "needs a MODEL.onnx");
  if (!strcmp(model, "hf")) return cli_usage("import", "'hf' comes first: smelt import hf DIR -o OUT.yaml");
  if (!out) return cli_usage("import", "needs -o OUT.yaml");
  size_t ol = strlen(out);
  if (ol < 6 || (strcmp(out + ol - 5, ".yaml") && strcmp(out + ol - 4, ".yml")))
    return cli_usage("import", "-o must name a .yaml file, got '%s'", out);

  /* the YAML holds the sizes computed from each dim as numbers: one value */
  if (cli_dims_several(&mo)) return cli_usage("import", "--dim takes one value per dim here (an import fixes the sizes "
                                                        "computed from it); import once per value, or compile the .onnx "
                                                        "with several values");
  for (int d = 0; d < mo.ndims; d++)
    if (mo.dims[d].max > 0)
      return cli_usage("import", "--dim %s: a range cannot be imported (the sizes computed from the dim become "
                                 "numbers); import at one value", mo.dims[d].name);
  FeOptions fo = {.dims = mo.dims, .ndims = mo.ndims, .dtype = mo.dtype};
  Graph *g = NULL;
  FeOnnxInfo info;
  smelt_status st = fe_load_onnx_info(model, &fo, &g, &info);
  if (st) return cli_fail(st);

  /* the safetensors file: OUT without .yaml/.yml, plus .safetensors */
  size_t stem = ol - (strcmp(out + ol - 4, ".yml") ? 5 : 4);
  char *wpath = malloc(stem + 16);
  if (!wpath) abort();
  snprintf(wpath, stem + 16, "%.*s.safetensors", (int)stem, out);
  const char *wbase = strrchr(wpath, '/') ? strrchr(wpath, '/') + 1 : wpath;

  int *uses = ir_use_counts(g);
  int *consts = malloc(sizeof(int) * (size_t)(g->nval + 1));
  Names nm = {.name = calloc((size_t)g->nval + 1, sizeof(char *))};
  if (!uses || !consts || !nm.name) abort();
  int nconst = 0;
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].kind == VK_CONST && uses[v]) consts[nconst++] = v;
  /* inputs and outputs claim their names first: they are what users bind */
  for (int i = 0; i < g->ninputs; i++) yaml_name(&nm, g, g->inputs[i]);
  for (int i = 0; i < g->noutputs; i++) yaml_name(&nm, g, g->outputs[i]);
  st = nconst ? write_safetensors(wpath, g, consts, nconst, &nm) : NULL;
  if (!st) st = write_yaml(out, model, wbase, g, &info, consts, nconst, &nm);
  int rc = 0;
  if (st) rc = cli_fail(st);
  else fprintf(stderr, "smelt import: wrote %s (%d nodes, %d inputs) and %s (%d tensors)\n", out, g->nnode,
               g->ninputs, nconst ? wpath : "no weights", nconst);
  for (int i = 0; i < nm.ntaken; i++) free(nm.taken[i]);
  free(nm.taken);
  free(nm.name);
  free(consts);
  free(uses);
  free(wpath);
  ir_graph_destroy(g);
  return rc;
}

/* ---- smelt import hf ---- */

static bool parse_count(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v <= 0) return false;
  *out = v;
  return true;
}

static int import_hf(int argc, char **argv) {
  const char *dir = NULL, *out = NULL;
  FeHfOptions o = {.dtype = DT_INVALID};
  for (int i = 1; i < argc; i++) {
    bool missing;
    const char *v;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      print_help(stdout);
      return 0;
    }
    if ((v = cli_flag_value("-o", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("import", "-o needs a file name");
      out = v;
    } else if ((v = cli_flag_value("--ctx", argc, argv, &i, &missing)) || missing) {
      if (missing || !parse_count(v, &o.ctx)) return cli_usage("import", "--ctx needs a positive integer");
    } else if ((v = cli_flag_value("--seq", argc, argv, &i, &missing)) || missing) {
      if (missing || !parse_count(v, &o.seq)) return cli_usage("import", "--seq needs a positive integer");
    } else if ((v = cli_flag_value("--dtype", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("import", "--dtype needs a dtype");
      o.dtype = dt_from_name(v);
      if (o.dtype == DT_INVALID || !dt_is_float(o.dtype))
        return cli_usage("import", "--dtype must be f32, f16 or bf16, got '%s'", v);
    } else if (!strcmp(argv[i], "--no-cache")) {
      o.no_cache = true;
    } else if (argv[i][0] == '-') {
      return cli_unknown_flag("import hf", import_help, argv[i]);
    } else if (!dir) {
      dir = argv[i];
    } else {
      return cli_usage("import", "unexpected argument '%s'", argv[i]);
    }
  }
  if (!dir) return cli_usage("import", "'import hf' needs a checkpoint directory");
  if (!out) return cli_usage("import", "needs -o OUT.yaml");
  size_t ol = strlen(out);
  if (ol < 6 || (strcmp(out + ol - 5, ".yaml") && strcmp(out + ol - 4, ".yml")))
    return cli_usage("import", "-o must name a .yaml file, got '%s'", out);
  char *ydir = strrchr(out, '/') ? strndup(out, (size_t)(strrchr(out, '/') - out)) : strdup(".");
  if (!ydir) abort();
  if (!*ydir) {
    free(ydir);
    ydir = strdup("/");
    if (!ydir) abort();
  }
  char *text = NULL;
  FeHfInfo info;
  smelt_status st = fe_hf_import(dir, ydir, &o, &text, &info);
  free(ydir);
  if (st) return cli_fail(st);
  FILE *f = fopen(out, "w");
  if (!f) {
    free(text);
    return cli_fail(st_error(ST_IO, "%s: error: cannot write: %s", out, strerror(errno)));
  }
  size_t n = strlen(text);
  bool ok = fwrite(text, 1, n, f) == n;
  ok &= fclose(f) == 0;
  free(text);
  if (!ok) return cli_fail(st_error(ST_IO, "%s: error: write failed", out));
  fprintf(stderr, "smelt import hf: wrote %s (%s, %" PRId64 " layers, %s", out, info.arch, info.layers,
          dt_name(info.dtype));
  if (info.ctx) fprintf(stderr, ", KV cache of %" PRId64, info.ctx);
  else fputs(", no KV cache", stderr);
  fprintf(stderr, ", weights in %d file%s)\n", info.nfiles, info.nfiles == 1 ? "" : "s");
  return 0;
}

int cli_import(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "hf")) return import_hf(argc - 1, argv + 1);
  const char *model = NULL, *out = NULL;
  ModelOpts mo = {.dtype = DT_INVALID};
  int rc;
  for (int i = 1; i < argc; i++) {
    bool missing;
    const char *v;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      print_help(stdout);
      return 0;
    }
    int r = cli_model_opt("import", argc, argv, &i, &mo);
    if (r == 2) {
      rc = 2;
      goto done;
    }
    if (r == 1) continue;
    if ((v = cli_flag_value("-o", argc, argv, &i, &missing)) || missing) {
      if (missing) {
        rc = cli_usage("import", "-o needs a file name");
        goto done;
      }
      out = v;
    } else if (argv[i][0] == '-') {
      rc = cli_unknown_flag("import", import_help, argv[i]);
      goto done;
    } else if (!model) {
      model = argv[i];
    } else {
      rc = cli_usage("import", "unexpected argument '%s'", argv[i]);
      goto done;
    }
  }
  rc = import_model(model, out, &mo);
done:
  for (int d = 0; d < mo.ndims; d++) free((char *)mo.dims[d].name);
  return rc;
}
