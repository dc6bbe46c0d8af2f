/* smelt compile: load a model, run the pass pipeline, write the result:
 * a kernel bundle (SPEC §5: kernels generated for the target, memory plan,
 * constants, the final IR) or, with --emit ir, the final IR text alone.
 * IR dumps go to stderr (--print-ir-*) or to one file per pass
 * (--ir-dump-dir). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "ir/clock.h"
#include "compiler/cache.h"
#include "compiler/cpu_target.h"
#include "compiler/driver.h"

static const char compile_help[] =
    "usage: smelt compile MODEL.yaml -o OUT [flags]\n"
    "\n"
    "Optimises MODEL.yaml with the pass pipeline, generates kernels and writes the\n"
    "kernel bundle OUT (or, with --emit ir, the final IR text).\n"
    "\n"
    "flags:\n"
    "  -o, --output OUT        where to write the result (required)\n"
    "  --emit bundle|ir        what to write (default: bundle)\n"
    "  --dim NAME=VALUE[,VALUE...]  override a size from the model's dims (repeatable); several\n"
    "                          values compile one specialisation per combination (at most 16)\n"
    "                          into one bundle, and runs pick the one their input shapes fit\n"
    "  --dtype DTYPE           default element type of inputs and params (f32, f16, bf16, ...)\n"
    "  --passes a,b,c          run these passes instead of the default pipeline\n"
    "                          (default: canonicalize,const-fold,simplify,cse,dce,fuse-attention,merge-matmuls,layout,fuse,plan-memory)\n"
    "  --print-ir-after-all    print the IR after every pass to stderr\n"
    "  --graph-after=PASS FILE write the IR after PASS as a Graphviz graph (FILE.dot, or\n"
    "                          FILE.svg through `dot`)\n"
    "  --print-ir-after=PASS   print the IR after PASS (repeatable)\n"
    "  --print-ir-before=PASS  print the IR before PASS (repeatable)\n"
    "  --ir-dump-dir DIR       write DIR/NN-PASS.ir after each pass (DIR/00-input.ir first)\n"
    "  --explain-fusion        print every fusion decision with its numbers\n"
    "  --onchip-bytes N        on-chip budget per tile for fusion\n"
    "  --verbose               print what passes did (folds, rewrites)\n"
    "  --time                  print where the compile's time went (frontend, passes, code generation,\n"
    "                          NVRTC, writing the bundle, the compile cache) to stderr\n"
    "  --target cpu|cuda|cpu,cuda  kernel targets (default cpu)\n"
    "  --arch sm_90a,sm_80     CUDA archs to compile cubins for (default: the GPU present,\n"
    "                          else sm_90a); the CUDA source and PTX travel too\n"
    "  --cpu NAME[,NAME]       CPU variants to build (default native: this machine's CPU); a portable\n"
    "                          level (x86-64-v2, x86-64-v3, x86-64-v4) or a named CPU (znver3, ...);\n"
    "                          several: the runtime loads the best one the machine has\n"
    "  --tune-table FILE       the tuning table matmul/attention kernels take their variant from\n"
    "                          (written by 'smelt tune'; default: $SMELT_TUNE_TABLE, else the\n"
    "                          source tree's tuning/cuda.table when it exists); misses are noted\n"
    "  --no-tune-table         heuristics only\n"
    "  --external-weights      keep weights read from the model's safetensors files out of the bundle:\n"
    "                          it names the files (path, size, CRC-32C) and the runtime maps them\n"
    "                          at load, beside the bundle or where they were; a changed file is refused\n"
    "  --no-cache              compile even when the compile cache has this bundle, and do not store it\n"
    "                          (the cache: $SMELT_CACHE_DIR/bundles, else ~/.cache/smelt/bundles)\n"
    "  --quantize int8|int4|fp8  store matmul weights quantised (symmetric int8/int4 with a scale per\n"
    "                          group along K, or fp8 e4m3 with a scale per output channel), read\n"
    "                          through dequantize inside the matmul kernels; prints each layer's\n"
    "                          cosine and relative error against the float layer on calibration rows\n"
    "                          and stores the report in the bundle (a quant-report section)\n"
    "  --group G               elements of K per scale (default: 128 for int4, 0 = one scale per\n"
    "                          output channel for int8 and fp8); must divide every K\n"
    "  --quantize-only GLOB    quantise only matmuls whose weight or result name matches GLOB\n"
    "  --keep-below COS        keep in float the layers whose cosine is below COS (0.999 is where\n"
    "                          the report flags them)\n"
    "  --tp N                  tensor parallelism: split the model over N ranks (the shard pass:\n"
    "                          Megatron-style column- and row-parallel matmuls, attention by heads,\n"
    "                          embeddings by vocabulary, all_reduce/all_gather where needed); the\n"
    "                          bundle holds every rank's part, and smelt run/bench/generate run the\n"
    "                          ranks on threads of one process (CPU only so far)\n"
    "  --allow-tf32            f32 matmuls may use the TF32 tensor cores (operands rounded to a\n"
    "                          10-bit mantissa, f32 accumulation; relative error ~1e-3), like\n"
    "                          torch.backends.cuda.matmul.allow_tf32; default: f32 throughout\n";

/* Prints a note of the compiler (a tuning-table miss) to stderr. */
static void print_note(void *ctx, const char *msg) {
  (void)ctx;
  fprintf(stderr, "smelt: note: %s\n", msg);
}

typedef struct {
  bool after_all;
  const char *after[16], *before[16];
  int nafter, nbefore;
  const char *dump_dir;
  const char *graph_after, *graph_file; /* --graph-after=PASS FILE */
  FILE *err;
  smelt_status io_error;
} DumpOpts;

static bool in_list(const char *const *list, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(list[i], name) == 0) return true;
  return false;
}

/* Turns "const_fold" into the command-line spelling "const-fold". */
static void cli_name(const char *c_name, char *buf, size_t n) {
  snprintf(buf, n, "%s", c_name);
  for (char *p = buf; *p; p++)
    if (*p == '_') *p = '-';
}

static void write_dump(DumpOpts *d, const char *file, const char *header, const Graph *g) {
  if (d->io_error) return;
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", d->dump_dir, file);
  FILE *f = fopen(path, "w");
  if (!f) {
    d->io_error = st_error(ST_IO, "%s: error: cannot write: %s", path, strerror(errno));
    return;
  }
  fprintf(f, "// %s\n", header);
  ir_print(f, g);
  if (fclose(f) != 0) d->io_error = st_error(ST_IO, "%s: error: write failed", path);
}

static void dump_hook(void *user, const PassInfo *pass, int index, bool after, bool changed, const Graph *g) {
  DumpOpts *d = user;
  char name[64], header[160];
  cli_name(pass->name, name, sizeof name);
  if (!after) {
    if (in_list(d->before, d->nbefore, name)) {
      fprintf(d->err, "// ----- IR before %s (pass %d) -----\n", name, index);
      ir_print(d->err, g);
    }
    return;
  }
  snprintf(header, sizeof header, "IR after %s (pass %d)%s", name, index, changed ? "" : ": no change");
  if (d->after_all || in_list(d->after, d->nafter, name)) {
    fprintf(d->err, "// ----- %s -----\n", header);
    if (changed) ir_print(d->err, g);
  }
  if (d->graph_after && strcmp(d->graph_after, name) == 0 && !d->io_error) d->io_error = cli_write_graph(g, d->graph_file);
  if (d->dump_dir) {
    char file[96];
    snprintf(file, sizeof file, "%02d-%s.ir", index, name);
    write_dump(d, file, header, g);
  }
}

/* One build of the model at exact dims (compiler/ranges.c may make more:
 * probes, which print and dump nothing). */
typedef struct {
  const char *model;
  DType dtype;
  const PassCtx *ctx;
  const char *passes;
  DumpOpts *d;
  bool verbose;
  const QuantOptions *quant; /* --quantize, or NULL */
  int tp, rank;              /* --tp: the ranks, and the one this build makes */
  char *tp_states;           /* the last build's PassCtx.tp_states, malloc'd */
  char *quant_report;        /* the last build's report (pass_quant_report_text), malloc'd */
  double frontend_s, passes_s; /* summed over builds (a ranged dim builds three times) */
} CompileBuild;

static smelt_status compile_build(void *user, const FeDim *dims, int ndims, bool probe, Graph **out) {
  CompileBuild *c = user;
  DumpOpts quiet = {.err = c->d->err}, *d = probe ? &quiet : c->d;
  FeOptions fo = {.dims = dims, .ndims = ndims, .dtype = c->dtype};
  double t0 = smelt_now_s();
  smelt_status st = fe_load_model(c->model, &fo, out);
  double t1 = smelt_now_s();
  c->frontend_s += t1 - t0;
  if (!st && d->dump_dir) write_dump(d, "00-input.ir", "IR from the frontend", *out);
  PassCtx pc = {.onchip_bytes = c->ctx->onchip_bytes, .target = c->ctx->target, .arch = c->ctx->arch,
                .explain_fusion = c->ctx->explain_fusion && !probe, .quant = c->quant, .tp = c->tp,
                .rank = c->rank};
  if (!st) st = pass_run_pipeline(*out, &pc, c->passes, dump_hook, d);
  c->passes_s += smelt_now_s() - t1;
  if (!st && d->io_error) st = d->io_error, d->io_error = NULL;
  if (pc.log && (c->verbose || pc.explain_fusion) && !probe) {
    fputs(pc.log, stderr);
  } else if (pc.log && !probe && c->tp > 1 && c->rank == 0) {
    /* what --tp could not split is said without --verbose too */
    for (const char *l = pc.log; *l;) {
      const char *e = strchr(l, '\n');
      size_t n = e ? (size_t)(e - l) : strlen(l);
      char line[512];
      snprintf(line, sizeof line, "%.*s", (int)n, l);
      if (strncmp(line, "shard:", 6) == 0 && strstr(line, "kept whole")) fprintf(stderr, "smelt compile: note: %s\n", line);
      l += n + (e ? 1 : 0);
    }
  }
  if (!st && pc.tp_states) {
    free(c->tp_states);
    c->tp_states = pc.tp_states;
    pc.tp_states = NULL;
  }
  if (!st && !probe && pc.quant_report) {
    free(c->quant_report);
    if (!(c->quant_report = pass_quant_report_text(pc.quant_report))) st = st_error(ST_NO_MEMORY, "out of memory");
  }
  pass_ctx_free(&pc);
  if (st) {
    ir_graph_destroy(*out);
    *out = NULL;
  }
  return st;
}

int cli_compile(int argc, char **argv) {
  const char *model = NULL, *out = NULL, *passes = NULL;
  ModelOpts mo = {.dtype = DT_INVALID};
  DumpOpts d = {.err = stderr};
  PassCtx ctx = {0};
  bool verbose = false, emit_ir = false, show_time = false;
  double t_start = smelt_now_s();
  const char *target = "cpu", *cpu = NULL, *arch = NULL, *tune_table = NULL;
  bool no_tune_table = false, allow_tf32 = false, external_weights = false, no_cache = false;
  QuantOptions qo = {.mode = QM_NONE, .group = -1, .seed = 1};
  int tp = 1;
  char tp_passes[1024];
  char quant_desc[320] = "";
  char default_arch[32];
  char dims_text[512] = "";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    bool missing = false;
    int r = cli_model_opt("compile", argc, argv, &i, &mo);
    if (r == 2) return 2;
    if (r == 1) {
      if (strncmp(a, "--dim", 5) == 0) {
        size_t k = strlen(dims_text);
        snprintf(dims_text + k, sizeof dims_text - k, "%s%s", k ? ";" : "", a[5] == '=' ? a + 6 : argv[i]);
      }
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(compile_help, stdout);
      return 0;
    } else if ((v = cli_flag_value("-o", argc, argv, &i, &missing)) || missing ||
               (v = cli_flag_value("--output", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("compile", "-o needs a file name");
      out = v;
    } else if ((v = cli_flag_value("--passes", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("compile", "--passes needs a list");
      passes = v;
    } else if ((v = cli_flag_value("--graph-after", argc, argv, &i, &missing)) || missing) {
      if (missing || i + 1 >= argc) return cli_usage("compile", "--graph-after needs a pass name and a file (--graph-after=fuse g.svg)");
      d.graph_after = v;
      d.graph_file = argv[++i];
    } else if (strcmp(a, "--print-ir-after-all") == 0) {
      d.after_all = true;
    } else if ((v = cli_flag_value("--print-ir-after", argc, argv, &i, &missing)) || missing) {
      if (missing || d.nafter == 16) return cli_usage("compile", "--print-ir-after needs a pass name");
      d.after[d.nafter++] = v;
    } else if ((v = cli_flag_value("--print-ir-before", argc, argv, &i, &missing)) || missing) {
      if (missing || d.nbefore == 16) return cli_usage("compile", "--print-ir-before needs a pass name");
      d.before[d.nbefore++] = v;
    } else if ((v = cli_flag_value("--ir-dump-dir", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("compile", "--ir-dump-dir needs a directory");
      d.dump_dir = v;
    } else if (strcmp(a, "--explain-fusion") == 0) {
      ctx.explain_fusion = true;
    } else if (strcmp(a, "--verbose") == 0) {
      verbose = true;
    } else if (strcmp(a, "--time") == 0) {
      show_time = true;
    } else if ((v = cli_flag_value("--onchip-bytes", argc, argv, &i, &missing)) || missing) {
      char *end;
      long long nb = missing ? 0 : strtoll(v, &end, 10);
      if (missing || *end || nb <= 0) return cli_usage("compile", "--onchip-bytes needs a positive integer");
      ctx.onchip_bytes = nb;
    } else if ((v = cli_flag_value("--target", argc, argv, &i, &missing)) || missing) {
      bool has_cpu, has_cuda;
      smelt_status bad = missing ? NULL : sc_parse_targets(v, &has_cpu, &has_cuda);
      if (missing || bad) {
        st_free(bad);
        return cli_usage("compile", "--target needs cpu, cuda or cpu,cuda%s%s%s", missing ? "" : " (got '",
                         missing ? "" : v, missing ? "" : "')");
      }
      target = v;
    } else if ((v = cli_flag_value("--arch", argc, argv, &i, &missing)) || missing) {
      smelt_status bad = missing ? NULL : sc_check_archs(v);
      if (missing || bad) {
        int rc = cli_usage("compile", "%s", bad ? st_message(bad) : "--arch needs a list like sm_90a,sm_80");
        st_free(bad);
        return rc;
      }
      arch = v;
    } else if ((v = cli_flag_value("--tune-table", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("compile", "--tune-table needs a file");
      tune_table = v;
    } else if (strcmp(a, "--no-tune-table") == 0) {
      no_tune_table = true;
    } else if ((v = cli_flag_value("--quantize", argc, argv, &i, &missing)) || missing) {
      if (missing || (qo.mode = pass_quant_mode(v)) == QM_NONE)
        return cli_usage("compile", "--quantize takes int8, int4 or fp8%s%s%s", missing ? "" : " (got '", missing ? "" : v,
                         missing ? "" : "')");
    } else if ((v = cli_flag_value("--group", argc, argv, &i, &missing)) || missing) {
      char *end;
      long long gv = missing ? -1 : strtoll(v, &end, 10);
      if (missing || end == v || *end || gv < 0) return cli_usage("compile", "--group needs 0 or a positive integer");
      qo.group = gv;
    } else if ((v = cli_flag_value("--quantize-only", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("compile", "--quantize-only needs a pattern (a glob like 'layer.*/w_*')");
      qo.only = v;
    } else if ((v = cli_flag_value("--keep-below", argc, argv, &i, &missing)) || missing) {
      char *end;
      double kb = missing ? 0 : strtod(v, &end);
      if (missing || *end || !(kb > 0 && kb <= 1)) return cli_usage("compile", "--keep-below needs a cosine in (0, 1]");
      qo.keep_below = kb;
    } else if ((v = cli_flag_value("--tp", argc, argv, &i, &missing)) || missing) {
      char *end;
      long tv = missing ? 0 : strtol(v, &end, 10);
      if (missing || *end || tv < 1 || tv > 64) return cli_usage("compile", "--tp needs a number of ranks, 1 to 64");
      tp = (int)tv;
    } else if (strcmp(a, "--allow-tf32") == 0) {
      allow_tf32 = true;
    } else if (strcmp(a, "--external-weights") == 0) {
      external_weights = true;
    } else if (strcmp(a, "--no-cache") == 0) {
      no_cache = true;
    } else if ((v = cli_flag_value("--cpu", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("compile", "--cpu needs a CPU name or list (%s)", sc_cpu_known_names());
      ScCpuTargets t;
      smelt_status bad = sc_cpu_targets_parse(v, &t);
      sc_cpu_targets_free(&t);
      if (bad) {
        int rc = cli_usage("compile", "%s", smelt_status_message(bad));
        smelt_status_free(bad);
        return rc;
      }
      cpu = v;
    } else if ((v = cli_flag_value("--emit", argc, argv, &i, &missing)) || missing) {
      if (missing || (strcmp(v, "ir") && strcmp(v, "bundle"))) return cli_usage("compile", "--emit takes bundle or ir");
      emit_ir = strcmp(v, "ir") == 0;
    } else if (a[0] == '-') {
      return cli_unknown_flag("compile", compile_help, a);
    } else if (!model) {
      model = a;
    } else {
      return cli_usage("compile", "more than one model given ('%s' and '%s')", model, a);
    }
  }
  if (!model) return cli_usage("compile", "no model given");
  if (qo.mode == QM_NONE && (qo.group >= 0 || qo.only || qo.keep_below > 0))
    return cli_usage("compile", "--group, --quantize-only and --keep-below apply to --quantize");
  if (qo.mode != QM_NONE) {
    if (qo.group < 0) qo.group = qo.mode == QM_INT4 ? 128 : 0;
    if (!passes) passes = pass_quantize_pipeline();
    else if (!strstr(passes, "quantize"))
      return cli_usage("compile", "--quantize needs the quantize pass in --passes (before fuse)");
    snprintf(quant_desc, sizeof quant_desc, "%s group=%lld%s%s keep_below=%g", pass_quant_mode_name(qo.mode),
             (long long)qo.group, qo.only ? " only=" : "", qo.only ? qo.only : "", qo.keep_below);
  }
  bool for_cuda = strstr(target, "cuda") != NULL;
  if (tp > 1) {
    smelt_status bad = pass_with_shard(passes, tp_passes, sizeof tp_passes);
    if (bad) {
      int rc = cli_usage("compile", "%s", st_message(bad));
      st_free(bad);
      return rc;
    }
    passes = tp_passes;
  }
  if (arch && !for_cuda) return cli_usage("compile", "--arch applies to --target cuda (or cpu,cuda)");
  if (tune_table && no_tune_table) return cli_usage("compile", "--tune-table and --no-tune-table contradict");
  if (allow_tf32 && !for_cuda) return cli_usage("compile", "--allow-tf32 applies to --target cuda (or cpu,cuda)");
  if (for_cuda && !tune_table && !no_tune_table) tune_table = cli_default_tune_table();
  if (for_cuda && !arch) {
    sc_cuda_default_arch(default_arch, sizeof default_arch);
    arch = default_arch;
  }
  /* the fuse pass's budget is the target's on-chip memory */
  ctx.target = target;
  ctx.arch = for_cuda ? arch : NULL;
  if (!out) return cli_usage("compile", "no output given (-o OUT)");
  /* pass names given to --print-ir-* must exist: a typo would silently print nothing */
  for (int i = 0; i < d.nafter + d.nbefore; i++) {
    const char *p = i < d.nafter ? d.after[i] : d.before[i - d.nafter];
    if (!pass_lookup(p)) return cli_usage("compile", "unknown pass '%s' (see 'smelt passes')", p);
  }
  if (d.dump_dir && mkdir(d.dump_dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "%s: error: cannot create directory: %s\n", d.dump_dir, strerror(errno));
    return 1;
  }

  /* The compile cache: the same model, weights and options again is a copy
   * of the bundle made the first time.  Not when the IR or the passes' notes
   * were asked for (a hit would not print them). */
  ScCompileOptions co = {.targets = target, .archs = for_cuda ? arch : NULL, .cpu = cpu, .model = model,
                         .dims = dims_text[0] ? dims_text : NULL,
                         .dtype = mo.dtype != DT_INVALID ? dt_name(mo.dtype) : NULL, .passes = passes,
                         .onchip_bytes = ctx.onchip_bytes, .tune_table = for_cuda ? tune_table : NULL,
                         .allow_tf32 = allow_tf32, .external_weights = external_weights, .log = print_note,
                         .quantize = quant_desc[0] ? quant_desc : NULL, .tp = tp > 1 ? tp : 0};
  ScCompileTimes times = {0};
  if (show_time) co.times = &times;
  double t_key = 0, t_store = 0;
  char key[65] = "";
  /* not with --quantize either: a hit would not print the report */
  bool cacheable = !emit_ir && !no_cache && !d.after_all && !d.nafter && !d.nbefore && !d.dump_dir && !d.graph_after && !verbose &&
                   !ctx.explain_fusion && qo.mode == QM_NONE;
  if (cacheable) {
    double t0 = smelt_now_s();
    smelt_status kst = sc_cache_key(model, &co, key);
    if (kst) key[0] = 0; /* not cacheable: compile */
    st_free(kst);
    bool hit = key[0] && sc_cache_fetch(key, out);
    t_key = smelt_now_s() - t0;
    if (hit) {
      if (show_time)
        fprintf(stderr, "time: %.3f s: a compile cache hit (the key, from the model and its weights' checksums, and "
                "the bundle: %.3f s)\n", smelt_now_s() - t_start, t_key);
      pass_ctx_free(&ctx);
      for (int i = 0; i < mo.ndims; i++) free((char *)mo.dims[i].name);
      return 0;
    }
  }

  /* One pipeline run per combination of the --dim values (specialisations,
   * SPEC §2); with one value per dim, one run and a plain bundle. */
  ScDimSpace space;
  smelt_status st = sc_dim_space_parse(dims_text[0] ? dims_text : NULL, &space);
  if (st) {
    int rc = cli_usage("compile", "--dim: %s", st_message(st));
    st_free(st);
    pass_ctx_free(&ctx);
    for (int i = 0; i < mo.ndims; i++) free((char *)mo.dims[i].name);
    return rc;
  }
  /* --tp: the same once per rank, rank-major */
  ScSpecGraph *specs = calloc((size_t)tp * FMT_MAX_SPECIALISATIONS, sizeof *specs);
  char labels[FMT_MAX_SPECIALISATIONS][256];
  double frontend_s = 0, passes_s = 0;
  int n = 0;
  const char *dump_root = d.dump_dir;
  char dump_dir[4096];
  if (!specs) st = st_error(ST_NO_MEMORY, "out of memory");
  bool noisy = d.after_all || d.nafter || d.nbefore || verbose || ctx.explain_fusion;
  for (int r = 0; r < tp && !st; r++)
    for (int c = 0; c < space.ncombos && !st; c++, n++) {
      FeDim dims[SC_MAX_DIMS];
      sc_dim_space_combo(&space, c, dims);
      sc_dim_space_label(&space, c, labels[c], sizeof labels[c]);
      specs[n] = (ScSpecGraph){.label = labels[c]};
      if (tp > 1 && noisy) fprintf(stderr, "// ===== rank %d of %d =====\n", r, tp);
      if (space.ncombos > 1 && noisy) fprintf(stderr, "// ===== specialisation s%d: %s =====\n", c, labels[c]);
      if ((space.ncombos > 1 || tp > 1) && dump_root) {
        /* DIR/rR/ per rank, DIR/[rR/]sI/ per specialisation */
        int k = snprintf(dump_dir, sizeof dump_dir, "%s", dump_root);
        if (tp > 1) {
          k += snprintf(dump_dir + k, sizeof dump_dir - (size_t)k, "/r%d", r);
          if (mkdir(dump_dir, 0777) != 0 && errno != EEXIST) {
            st = st_error(ST_IO, "%s: error: cannot create directory: %s", dump_dir, strerror(errno));
            break;
          }
        }
        if (space.ncombos > 1) snprintf(dump_dir + k, sizeof dump_dir - (size_t)k, "/s%d", c);
        if (mkdir(dump_dir, 0777) != 0 && errno != EEXIST) {
          st = st_error(ST_IO, "%s: error: cannot create directory: %s", dump_dir, strerror(errno));
          break;
        }
        d.dump_dir = dump_dir;
      }
      CompileBuild cb = {.model = model, .dtype = mo.dtype, .ctx = &ctx, .passes = passes, .d = &d, .verbose = verbose,
                         .quant = qo.mode != QM_NONE ? &qo : NULL, .tp = tp, .rank = r};
      st = sc_build_ranged(compile_build, &cb, dims, space.ndims, &specs[n].g);
      specs[n].tp_states = cb.tp_states;
      frontend_s += cb.frontend_s;
      passes_s += cb.passes_s;
      if (!st && cb.quant_report) {
        /* the report: printed here, stored in the bundle by the driver */
        if (tp > 1) printf("rank %d\n", r);
        if (space.ncombos > 1) printf("specialisation s%d: %s\n", c, labels[c]);
        fputs(cb.quant_report, stdout);
        specs[n].quant_report = cb.quant_report;
      } else {
        free(cb.quant_report);
      }
      if (st && space.ncombos > 1) st = st_prefix(st, "specialisation %s", labels[c]);
      if (st && tp > 1) st = st_prefix(st, "rank %d", r);
    }
  if (!st && !emit_ir) {
    st = sc_compile_specs(specs, n / tp, &co, out);
    double t0 = smelt_now_s();
    if (!st && key[0]) sc_cache_store(key, out);
    t_store = smelt_now_s() - t0;
  } else if (!st) {
    FILE *f = fopen(out, "w");
    if (!f) {
      st = st_error(ST_IO, "%s: error: cannot write: %s", out, strerror(errno));
    } else {
      int per = n / tp;
      for (int i = 0; i < n; i++) {
        if (tp > 1 && i % per == 0) fprintf(f, "%s// rank %d of %d\n", i ? "\n" : "", i / per, tp);
        if (per > 1) fprintf(f, "%s// specialisation s%d: %s\n", i ? "\n" : "", i % per, labels[i % per]);
        ir_print(f, specs[i].g);
      }
      if (fclose(f) != 0) st = st_error(ST_IO, "%s: error: write failed", out);
    }
  }
  if (show_time && !st) {
    const ScCompileTimes *t = &times;
    fprintf(stderr,
            "time: %.3f s in all\n"
            "  cache key    %7.3f s  (the model text, its weights' CRC-32C, the options)\n"
            "  frontend     %7.3f s  (parsing, weights mapped or read)\n"
            "  passes       %7.3f s\n"
            "  lower        %7.3f s\n"
            "  llvm         %7.3f s  (CPU machine code)\n"
            "  cuda c       %7.3f s\n"
            "  nvrtc        %7.3f s  (or its disk cache)\n"
            "  graph        %7.3f s  (serialising graphs and pooling constants)\n"
            "  write        %7.3f s  (layout, checksum, the file)\n"
            "  cache store  %7.3f s\n",
            smelt_now_s() - t_start, t_key, frontend_s, passes_s, t->lower_s, t->cpu_s, t->cuda_gen_s, t->nvrtc_s,
            t->graph_s, t->write_s, t_store);
  }
  st_free(d.io_error);
  pass_ctx_free(&ctx);
  for (int i = 0; i < n; i++) {
    ir_graph_destroy(specs[i].g);
    free((char *)specs[i].quant_report);
    free((char *)specs[i].tp_states);
  }
  free(specs);
  sc_dim_space_free(&space);
  for (int i = 0; i < mo.ndims; i++) free((char *)mo.dims[i].name);
  return st ? cli_fail(st) : 0;
}
