/* smelt inspect: what a bundle holds, read back through the loader.
 *
 * The bundle is opened with every check the runtime does (sizes, offsets,
 * checksums, versions, the graph and the kernel table against each other)
 * but without linking its machine code, so a bundle built for another CPU
 * can still be inspected.  A corrupted bundle is reported with the loader's
 * message and exit status 1.
 *
 * --dump-cubins writes the bundle's cubins out as files, one per
 * compilation unit and arch, with an index of which kernel (symbol, kind,
 * variant) lives in which unit, so that NVIDIA's cuobjdump can show the
 * SASS and the resource usage of each kernel (scripts/gpu-check.sh counts
 * tensor-core and local-memory instructions that way). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "codegen/cuda/cg_cuda.h"
#include "compiler/driver.h"

static const char inspect_help[] =
    "usage: smelt inspect BUNDLE.smelt [flags]\n"
    "\n"
    "Shows what a compiled bundle holds.  Without flags: the manifest, the sections\n"
    "with their sizes, the inputs and outputs, the number of kernels and the arena size.\n"
    "\n"
    "flags:\n"
    "  --ir              the final IR the kernels were generated from\n"
    "  --graph FILE      the final IR as a Graphviz graph: FILE.dot, or FILE.svg through `dot`\n"
    "                    (fusion groups as clusters with footprint and budget; edges are tensors)\n"
    "  --kernels         every kernel: tasks, estimated bytes and FLOPs, arguments; on\n"
    "                    CUDA its variant and workspace bytes\n"
    "  --source KERNEL   the IR nodes a kernel computes, its CUDA C and its LLVM IR\n"
    "                    (regenerated from the bundle's graph, before optimisation)\n"
    "  --quant           the per-layer accuracy report of a bundle compiled with --quantize\n"
    "  --memory          the activation arena against the sum of all intermediates,\n"
    "                    and each intermediate's offset, size and lifetime (kernels)\n"
    "  --dump-cubins DIR write every compilation unit's cubin per arch as\n"
    "                    DIR/u0.sm_90a.cubin (DIR/s1.u0.sm_90a.cubin for specialisation\n"
    "                    s1 of several) and DIR/kernels.tsv (each kernel's unit, symbol,\n"
    "                    kind, variant), for cuobjdump -sass / -res-usage\n"
    "  --dim NAME=VALUE  of a bundle of several specialisations (--dim seq=1,16 when\n"
    "                    compiling), the one --ir, --kernels, --memory, --source and\n"
    "                    --dump-cubins show\n"
    "                    (default: each in turn)\n";

static void print_tensor_list(const char *what, const Graph *g, const int *vals, int n) {
  printf("%s:\n", what);
  for (int i = 0; i < n; i++) {
    char ty[128];
    printf("  %-24s %s\n", g->val[vals[i]].name, ir_type_str(&g->val[vals[i]].type, ty, sizeof ty));
  }
}

static void print_summary(const smelt_bundle *b) {
  const FmtFile *f = rt_bundle_file(b);
  const Graph *g = rt_bundle_graph(b);
  const void *data;
  size_t len;
  printf("bundle %s\n", fmt_file_path(f));
  if (fmt_file_find(f, FMT_SEC_MANIFEST, NULL, &data, &len)) {
    printf("manifest:\n");
    const char *s = data, *end = s + len;
    while (s < end) {
      const char *nl = memchr(s, '\n', (size_t)(end - s));
      if (!nl) nl = end;
      printf("  %.*s\n", (int)(nl - s), s);
      s = nl + 1;
    }
  }
  printf("sections:\n");
  size_t total = 0;
  for (int i = 0; i < fmt_file_section_count(f); i++) {
    const FmtSection *sec = fmt_file_section_at(f, i);
    const char *kind = fmt_section_kind_name(sec->kind);
    printf("  %-12s %-32s %10zu bytes\n", kind ? kind : "?", sec->name, sec->size);
    total += sec->size;
  }
  printf("  %-45s %10zu bytes\n", "(all payloads)", total);
  int ns = rt_bundle_num_specs(b);
  if (ns > 1) {
    printf("specialisations: %d (a run takes the one its input shapes fit)\n", ns);
    for (int i = 0; i < ns; i++) {
      const smelt_bundle *sp = rt_bundle_spec(b, i);
      const Graph *sg = rt_bundle_graph(sp);
      printf("  s%-3d %-20s", i, rt_bundle_spec_label(sp));
      for (int k = 0; k < sg->ninputs; k++) {
        char ty[128];
        printf(" %s:%s", sg->val[sg->inputs[k]].name, ir_type_str(&sg->val[sg->inputs[k]].type, ty, sizeof ty));
      }
      printf("  (%d kernels, arena %lld bytes)\n", rt_bundle_num_kernels(sp), (long long)sg->arena_bytes);
    }
    printf("of s0:\n");
  }
  print_tensor_list("inputs", g, g->inputs, g->ninputs);
  print_tensor_list("outputs", g, g->outputs, g->noutputs);
  printf("kernels: %d\n", rt_bundle_num_kernels(b));
  if (g->arena_bytes > 0) printf("arena: %lld bytes\n", (long long)g->arena_bytes);
  else printf("arena: none (no memory plan: each intermediate has its own buffer)\n");
}

static void print_quant(const smelt_bundle *b) {
  const void *data;
  size_t len;
  if (rt_bundle_spec_find(b, FMT_SEC_QUANT_REPORT, "", &data, &len)) fwrite(data, 1, len, stdout);
  else printf("(the bundle was not compiled with --quantize)\n");
}

static void print_ir(const smelt_bundle *b) {
  const void *data;
  size_t len;
  if (rt_bundle_spec_find(b, FMT_SEC_IR_TEXT, "", &data, &len)) fwrite(data, 1, len, stdout);
  else printf("(the bundle has no IR text)\n");
}

/* The CUDA launch table of b decoded, or NULL when b has none (or it does
 * not decode: the loader would have refused the bundle then). */
static FmtCudaModule *launch_table(const smelt_bundle *b) {
  const void *lt;
  size_t ll;
  FmtCudaModule *m = NULL;
  if (!rt_bundle_spec_find(b, FMT_SEC_CUDA_LAUNCH, "", &lt, &ll)) return NULL;
  smelt_status st = fmt_cuda_launch_decode(lt, ll, &m);
  if (st) {
    fprintf(stderr, "%s\n", st_message(st));
    st_free(st);
    return NULL;
  }
  return m;
}

static void print_kernels(const smelt_bundle *b) {
  const Graph *g = rt_bundle_graph(b);
  FmtCudaModule *m = launch_table(b);
  if (m && m->nkernels != rt_bundle_num_kernels(b)) {
    fmt_cuda_module_free(m);
    m = NULL;
  }
  printf("%-4s %-44s %-12s %6s %10s %14s %14s %5s", "#", "kernel", "group", "nodes", "tasks", "bytes", "flops",
         "args");
  if (m) printf(" %10s  %s", "workspace", "CUDA variant");
  printf("\n");
  for (int i = 0; i < rt_bundle_num_kernels(b); i++) {
    const Kernel *k = rt_bundle_kernel(b, i);
    const Group *gr = &g->groups[k->group];
    printf("%-4d %-44s %-12s %6d %10lld %14.0f %14.0f %5d", i, k->name, ir_group_kind_name(gr->kind), gr->nnodes,
           (long long)k->ntasks, k->bytes, k->flops, k->nargs);
    if (m) {
      const FmtCudaLaunch *l = &m->kernels[i];
      printf(" %10llu  %s", (unsigned long long)l->workspace, l->variant[0] ? l->variant : "-");
    }
    printf("\n");
  }
  fmt_cuda_module_free(m);
}

/* ---- --dump-cubins ---- */

static bool write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(data, 1, len, f) == len;
  return fclose(f) == 0 && ok;
}

/* Writes the cubins of specialisations first..last of b into dir and the
 * index dir/kernels.tsv: one line per kernel, its cubin's stem ("u3",
 * "s1.u3"), symbol, kind, variant ("-" for none), workspace and dynamic
 * shared memory bytes, grid, block and name.  The archs are the
 * manifest's cuda_archs. */
static int dump_cubins(const smelt_bundle *b, int first, int last, const char *dir) {
  const char *archs = rt_bundle_manifest_get(b, "cuda_archs");
  if (!archs || !archs[0]) {
    fprintf(stderr, "smelt inspect: %s has no CUDA code (compile with --target cuda)\n",
            fmt_file_path(rt_bundle_file(b)));
    return 1;
  }
  if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "smelt inspect: cannot create %s: %s\n", dir, strerror(errno));
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/kernels.tsv", dir);
  FILE *idx = fopen(path, "w");
  if (!idx) {
    fprintf(stderr, "smelt inspect: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  fprintf(idx, "# unit\tsymbol\tkind\tvariant\tworkspace\tsmem\tgrid\tblock\tname\n");
  int written = 0, rc = 0;
  for (int i = first; i <= last && !rc; i++) {
    const smelt_bundle *sp = rt_bundle_spec(b, i);
    FmtCudaModule *m = launch_table(sp);
    if (!m) continue;
    char tag[16] = "";
    if (rt_bundle_num_specs(b) > 1) snprintf(tag, sizeof tag, "s%d.", i);
    for (int u = 0; u < m->nunits && !rc; u++) {
      /* every arch of the comma-separated list */
      for (const char *a = archs; *a && !rc;) {
        int n = (int)strcspn(a, ",");
        char name[64];
        snprintf(name, sizeof name, "%.*s/u%d", n < 16 ? n : 16, a, u);
        const void *data;
        size_t len;
        if (rt_bundle_spec_find(sp, FMT_SEC_CUBIN, name, &data, &len) && len > 0) {
          snprintf(path, sizeof path, "%s/%su%d.%.*s.cubin", dir, tag, u, n < 16 ? n : 16, a);
          if (!write_file(path, data, len)) {
            fprintf(stderr, "smelt inspect: cannot write %s: %s\n", path, strerror(errno));
            rc = 1;
          } else {
            printf("%s  %zu bytes\n", path, len);
            written++;
          }
        }
        a += n;
        if (*a == ',') a++;
      }
    }
    for (int k = 0; k < m->nkernels; k++) {
      const FmtCudaLaunch *l = &m->kernels[k];
      fprintf(idx, "%su%d\t%s\t%s\t%s\t%llu\t%u\t%u,%u,%u\t%u,%u,%u\t%s\n", tag, l->unit, l->symbol, l->kind,
              l->variant[0] ? l->variant : "-", (unsigned long long)l->workspace, l->smem, l->grid[0], l->grid[1],
              l->grid[2], l->block[0], l->block[1], l->block[2], l->name);
    }
    fmt_cuda_module_free(m);
  }
  if (fclose(idx) != 0 && !rc) {
    fprintf(stderr, "smelt inspect: cannot write %s/kernels.tsv\n", dir);
    rc = 1;
  }
  if (!rc) printf("%d cubins and %s/kernels.tsv written\n", written, dir);
  return rc;
}

/* Intermediates: values a kernel writes that are not graph outputs.  Their
 * lifetime runs from the kernel that writes them to the last that reads them. */
static void print_memory(const smelt_bundle *b) {
  const Graph *g = rt_bundle_graph(b);
  int nk = rt_bundle_num_kernels(b);
  int *def = malloc((size_t)(g->nval ? g->nval : 1) * sizeof *def);
  int *last = malloc((size_t)(g->nval ? g->nval : 1) * sizeof *last);
  if (!def || !last) {
    free(def);
    free(last);
    fprintf(stderr, "smelt inspect: out of memory\n");
    return;
  }
  for (int v = 0; v < g->nval; v++) def[v] = last[v] = -1;
  for (int k = 0; k < nk; k++) {
    const Kernel *kn = rt_bundle_kernel(b, k);
    for (int a = 0; a < kn->nargs; a++) {
      if (a >= kn->nargs - kn->nouts) def[kn->args[a]] = k;
      last[kn->args[a]] = k;
    }
  }
  for (int i = 0; i < g->noutputs; i++) def[g->outputs[i]] = -1;
  long long sum = 0;
  int count = 0;
  for (int v = 0; v < g->nval; v++)
    if (def[v] >= 0) {
      sum += (long long)ir_type_bytes(&g->val[v].type);
      count++;
    }
  if (g->arena_bytes > 0)
    printf("arena: %lld bytes for %d intermediates of %lld bytes in all (%.1f%%)\n", (long long)g->arena_bytes,
           count, sum, sum ? 100.0 * (double)g->arena_bytes / (double)sum : 0.0);
  else
    printf("arena: none (no memory plan); %d intermediates of %lld bytes in all, each in its own buffer\n", count,
           sum);
  printf("%-32s %-20s %12s %12s %s\n", "value", "type", "offset", "bytes", "lifetime (kernels)");
  for (int v = 0; v < g->nval; v++) {
    if (def[v] < 0) continue;
    char ty[128], off[32];
    if (g->arena_bytes > 0 && g->val[v].mem_offset >= 0)
      snprintf(off, sizeof off, "%lld", (long long)g->val[v].mem_offset);
    else snprintf(off, sizeof off, "own");
    printf("%-32s %-20s %12s %12zu %d..%d\n", g->val[v].name, ir_type_str(&g->val[v].type, ty, sizeof ty), off,
           ir_type_bytes(&g->val[v].type), def[v], last[v]);
  }
  free(def);
  free(last);
}

/* The lines of the IR text from "group NAME (" to the line closing it. */
static void print_group_block(const smelt_bundle *b, const char *kernel) {
  const void *data;
  size_t len;
  if (!rt_bundle_spec_find(b, FMT_SEC_IR_TEXT, "", &data, &len)) return;
  char *text = strndup(data, len);
  if (!text) return;
  char head[160];
  snprintf(head, sizeof head, "group %s (", kernel);
  char *s = strstr(text, head);
  if (s) {
    while (s > text && s[-1] != '\n') s--;
    char *e = strstr(s, "\n  }\n");
    if (e) e[4] = 0;
    printf("// IR nodes of %s\n%s\n", kernel, s);
  }
  free(text);
}

/* The CUDA C of kernel k, cut from its compilation unit in the bundle: the
 * comment block above the __global__ function through its closing brace.
 * Returns false when the bundle has no CUDA code. */
static bool print_cuda_source(const smelt_bundle *b, int k) {
  const void *lt, *src;
  size_t ll, sl;
  if (!rt_bundle_spec_find(b, FMT_SEC_CUDA_LAUNCH, NULL, &lt, &ll)) return false;
  FmtCudaModule *m;
  smelt_status st = fmt_cuda_launch_decode(lt, ll, &m);
  if (st) {
    fprintf(stderr, "%s\n", st_message(st));
    st_free(st);
    return false;
  }
  bool printed = false;
  if (k < m->nkernels) {
    const FmtCudaLaunch *l = &m->kernels[k];
    char unit[32];
    snprintf(unit, sizeof unit, "u%d", l->unit);
    if (rt_bundle_spec_find(b, FMT_SEC_CUDA_SOURCE, unit, &src, &sl)) {
      char *text = strndup(src, sl);
      char needle[160];
      snprintf(needle, sizeof needle, " %s(", l->symbol);
      char *at = text ? strstr(text, needle) : NULL;
      if (at) {
        char *start = at;
        while (start > text && start[-1] != '\n') start--;
        /* take in the comment lines just above the signature */
        for (;;) {
          char *prev = start > text ? start - 1 : text;
          while (prev > text && prev[-1] != '\n') prev--;
          if (prev == start || !(strncmp(prev, "//", 2) == 0 || strncmp(prev, "/*", 2) == 0 || strncmp(prev, " *", 2) == 0))
            break;
          start = prev;
        }
        char *end = strstr(at, "\n}\n");
        if (end) end[2] = 0;
        printf("// CUDA C (unit %s; grid %u,%u,%u block %u,%u,%u, %u B dynamic shared memory)\n%s\n", unit,
               l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2], l->smem, start);
        printed = true;
      }
      free(text);
    }
  }
  fmt_cuda_module_free(m);
  return printed;
}

static int print_source(const smelt_bundle *b, const char *kernel) {
  int k = -1;
  for (int i = 0; i < rt_bundle_num_kernels(b); i++)
    if (strcmp(rt_bundle_kernel(b, i)->name, kernel) == 0) k = i;
  if (k < 0) {
    fprintf(stderr, "smelt inspect: no kernel named '%s' (see --kernels)\n", kernel);
    return 1;
  }
  const Kernel *kn = rt_bundle_kernel(b, k);
  printf("// kernel %s: %lld tasks, %.0f bytes, %.0f flops (estimates)\n", kn->name, (long long)kn->ntasks,
         kn->bytes, kn->flops);
  print_group_block(b, kernel);
  bool cuda = print_cuda_source(b, k);
  char *ir;
  smelt_status st = sc_bundle_kernel_llvm_ir(b, k, &ir);
  if (st && cuda) {
    st_free(st); /* a CUDA-only bundle, or a build without LLVM: the CUDA C above is the source */
    return 0;
  }
  if (st) return cli_fail(st);
  printf("// LLVM IR (before optimisation)\n%s", ir);
  free(ir);
  return 0;
}

int cli_inspect(int argc, char **argv) {
  const char *path = NULL, *source = NULL, *dim = NULL, *cubin_dir = NULL, *graph = NULL;
  bool ir = false, kernels = false, memory = false, quant = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool missing;
    const char *v;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(inspect_help, stdout);
      return 0;
    }
    if (strcmp(a, "--ir") == 0) ir = true;
    else if (strcmp(a, "--kernels") == 0) kernels = true;
    else if (strcmp(a, "--memory") == 0) memory = true;
    else if (strcmp(a, "--quant") == 0) quant = true;
    else if ((v = cli_flag_value("--dim", argc, argv, &i, &missing)) || missing) {
      if (missing || !strchr(v, '=')) return cli_usage("inspect", "--dim needs NAME=VALUE");
      dim = v;
    } else if ((v = cli_flag_value("--dump-cubins", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("inspect", "--dump-cubins needs a directory");
      cubin_dir = v;
    } else if ((v = cli_flag_value("--graph", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("inspect", "--graph needs a file (FILE.dot or FILE.svg)");
      graph = v;
    } else if ((v = cli_flag_value("--source", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("inspect", "--source needs a kernel name");
      source = v;
    } else if (a[0] == '-' && a[1]) return cli_unknown_flag("inspect", inspect_help, a);
    else if (path) return cli_usage("inspect", "one bundle at a time ('%s' and '%s')", path, a);
    else path = a;
  }
  if (!path) return cli_usage("inspect", "which bundle? (smelt inspect BUNDLE.smelt)");
  smelt_bundle *b;
  smelt_status st = rt_bundle_open_nojit(path, &b);
  if (st) return cli_fail(st);
  int rc = 0, first = 0, last = rt_bundle_num_specs(b) - 1;
  if (dim) {
    if ((st = rt_bundle_find_spec(b, dim, &first))) {
      smelt_bundle_close(b);
      return cli_fail(st);
    }
    last = first;
  }
  if (graph) {
    /* of a bundle of several specialisations: the first, or the one --dim names */
    st = cli_write_graph(rt_bundle_graph(rt_bundle_spec(b, first)), graph);
    if (st) {
      smelt_bundle_close(b);
      return cli_fail(st);
    }
  }
  if (!ir && !kernels && !memory && !source && !cubin_dir && !graph && !quant) print_summary(b);
  for (int i = first; i <= last && (ir || kernels || memory || source || quant); i++) {
    const smelt_bundle *sp = rt_bundle_spec(b, i);
    if (rt_bundle_num_specs(b) > 1) printf("%s// ===== specialisation s%d: %s =====\n", i > first ? "\n" : "", i,
                                          rt_bundle_spec_label(sp));
    if (quant) print_quant(sp);
    if (ir) print_ir(sp);
    if (kernels) print_kernels(sp);
    if (memory) print_memory(sp);
    if (source && (rc = print_source(sp, source)) != 0) break;
  }
  if (cubin_dir && !rc) rc = dump_cubins(b, first, last, cubin_dir);
  smelt_bundle_close(b);
  return rc;
}
