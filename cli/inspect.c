/* smelt inspect: what a bundle holds, read back through the loader.
 *
 * The bundle is opened with every check the runtime does (sizes, offsets,
 * checksums, versions, the graph and the kernel table against each other)
 * but without linking its machine code, so a bundle built for another CPU
 * can still be inspected.  A corrupted bundle is reported with the loader's
 * message and exit status 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "codegen/cuda/cg_cuda.h"
#include "runtime/driver.h"

static const char inspect_help[] =
    "usage: smelt inspect BUNDLE.smelt [flags]\n"
    "\n"
    "Shows what a compiled bundle holds.  Without flags: the manifest, the sections\n"
    "with their sizes, the inputs and outputs, the number of kernels and the arena size.\n"
    "\n"
    "flags:\n"
    "  --ir              the final IR the kernels were generated from\n"
    "  --kernels         every kernel: tasks, estimated bytes and FLOPs, arguments\n"
    "  --source KERNEL   the IR nodes a kernel computes, its CUDA C and its LLVM IR\n"
    "                    (regenerated from the bundle's graph, before optimisation)\n"
    "  --memory          the activation arena against the sum of all intermediates,\n"
    "                    and each intermediate's offset, size and lifetime (kernels)\n"
    "  --dim NAME=VALUE  of a bundle of several specialisations (--dim seq=1,16 when\n"
    "                    compiling), the one --ir, --kernels, --memory and --source show\n"
    "                    (default: each in turn)\n";

static void print_tensor_list(const char *what, const Graph *g, const int *vals, int n) {
  printf("%s:\n", what);
  for (int i = 0; i < n; i++) {
    char ty[128];
    printf("  %-24s %s\n", g->val[vals[i]].name, ir_type_str(&g->val[vals[i]].type, ty, sizeof ty));
  }
}

static void print_summary(const smelt_bundle *b) {
  const RtBundle *f = rt_bundle_file(b);
  const Graph *g = rt_bundle_graph(b);
  const void *data;
  size_t len;
  printf("bundle %s\n", rt_bundle_path(f));
  if (rt_bundle_find(f, RT_SEC_MANIFEST, NULL, &data, &len)) {
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
  for (int i = 0; i < rt_bundle_section_count(f); i++) {
    const RtSection *sec = rt_bundle_section_at(f, i);
    const char *kind = rt_section_kind_name(sec->kind);
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

static void print_ir(const smelt_bundle *b) {
  const void *data;
  size_t len;
  if (rt_bundle_spec_find(b, RT_SEC_IR_TEXT, "", &data, &len)) fwrite(data, 1, len, stdout);
  else printf("(the bundle has no IR text)\n");
}

static void print_kernels(const smelt_bundle *b) {
  const Graph *g = rt_bundle_graph(b);
  printf("%-4s %-44s %-12s %6s %10s %14s %14s %5s\n", "#", "kernel", "group", "nodes", "tasks", "bytes", "flops",
         "args");
  for (int i = 0; i < rt_bundle_num_kernels(b); i++) {
    const Kernel *k = rt_bundle_kernel(b, i);
    const Group *gr = &g->groups[k->group];
    printf("%-4d %-44s %-12s %6d %10lld %14.0f %14.0f %5d\n", i, k->name, ir_group_kind_name(gr->kind), gr->nnodes,
           (long long)k->ntasks, k->bytes, k->flops, k->nargs);
  }
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
  if (!rt_bundle_spec_find(b, RT_SEC_IR_TEXT, "", &data, &len)) return;
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
  if (!rt_bundle_spec_find(b, RT_SEC_CUDA_LAUNCH, NULL, &lt, &ll)) return false;
  CgCudaModule *m;
  smelt_status st = cg_cuda_launch_decode(lt, ll, &m);
  if (st) {
    fprintf(stderr, "%s\n", st_message(st));
    st_free(st);
    return false;
  }
  bool printed = false;
  if (k < m->nkernels) {
    const CgCudaLaunch *l = &m->kernels[k];
    char unit[32];
    snprintf(unit, sizeof unit, "u%d", l->unit);
    if (rt_bundle_spec_find(b, RT_SEC_CUDA_SOURCE, unit, &src, &sl)) {
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
  cg_cuda_module_free(m);
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
  smelt_status st = rt_bundle_kernel_llvm_ir(b, k, &ir);
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
  const char *path = NULL, *source = NULL, *dim = NULL;
  bool ir = false, kernels = false, memory = false;
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
    else if ((v = cli_flag_value("--dim", argc, argv, &i, &missing)) || missing) {
      if (missing || !strchr(v, '=')) return cli_usage("inspect", "--dim needs NAME=VALUE");
      dim = v;
    } else if ((v = cli_flag_value("--source", argc, argv, &i, &missing)) || missing) {
      if (missing) return cli_usage("inspect", "--source needs a kernel name");
      source = v;
    } else if (a[0] == '-' && a[1]) return cli_usage("inspect", "unknown flag '%s'", a);
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
  if (!ir && !kernels && !memory && !source) print_summary(b);
  for (int i = first; i <= last && (ir || kernels || memory || source); i++) {
    const smelt_bundle *sp = rt_bundle_spec(b, i);
    if (rt_bundle_num_specs(b) > 1) printf("%s// ===== specialisation s%d: %s =====\n", i > first ? "\n" : "", i,
                                          rt_bundle_spec_label(sp));
    if (ir) print_ir(sp);
    if (kernels) print_kernels(sp);
    if (memory) print_memory(sp);
    if (source && (rc = print_source(sp, source)) != 0) break;
  }
  smelt_bundle_close(b);
  return rc;
}
