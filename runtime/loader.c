/* Opening a bundle.
 *
 * Opening validates the file (format/bundle.c, which maps it), opens the
 * external weights files if the bundle has any (format/weights.c: found,
 * mapped and size checked; their content hash is checked, and merged
 * weights assembled, when the first session starts, like the constants
 * section's checksum: rt_bundle_check_constants), rebuilds the optimised graph
 * from its serialised form (ir/serialize.c, which runs the verifier) with
 * its constants pointing into the mapped constants section or the weights,
 * never copied,
 * decodes the kernel table and checks it against the graph
 * (format/kernel_table.c), loads the CPU machine code (runtime/elf_loader.c:
 * the relocatable object the compiler made, linked here against an explicit
 * import table, after checking that this CPU has the features the code was
 * built for), and decodes the CUDA launch table (if any), checking it
 * against the kernel table.  Nothing is compiled or optimised: the object
 * is machine code and only needs relocating.  After open the bundle is
 * read-only, which is what lets several sessions on several threads share
 * it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/serialize.h"
#include "runtime/cpu_features.h"
#include "runtime/internal.h"

/* ---- bundles ---- */

/* What opening does with the bundle's code: nothing (inspect), load it and
 * run the prepack functions (sessions), or load it without running any of
 * it (rt_bundle_check_bytes, for the fuzzers: a mutated bundle may carry
 * any machine code, and running it would find nothing but itself). */
typedef enum { CODE_NONE, CODE_LOAD_AND_RUN, CODE_LOAD_ONLY } CodeMode;

void *rt_aligned_buffer(size_t bytes) {
  size_t n = (bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, n ? n : 64);
  if (p) memset(p, 0, n ? n : 64);
  return p;
}

/* Splits the manifest's "key=value" lines; lines without '=' are ignored
 * (room for comments), the manifest is text the tools show as-is. */
static smelt_status parse_manifest(smelt_bundle *b, const char *data, size_t len) {
  int cap = 0;
  size_t i = 0;
  while (i < len) {
    size_t e = i;
    while (e < len && data[e] != '\n') e++;
    const char *eq = memchr(data + i, '=', e - i);
    if (eq) {
      if (b->nmanifest == cap) {
        cap = cap ? 2 * cap : 16;
        ManifestEntry *m = realloc(b->manifest, (size_t)cap * sizeof *m);
        if (!m) return st_error(ST_NO_MEMORY, "out of memory reading the manifest");
        b->manifest = m;
      }
      ManifestEntry *m = &b->manifest[b->nmanifest];
      m->key = strndup(data + i, (size_t)(eq - (data + i)));
      m->value = strndup(eq + 1, (size_t)(data + e - (eq + 1)));
      if (!m->key || !m->value) {
        free(m->key);
        free(m->value);
        return st_error(ST_NO_MEMORY, "out of memory reading the manifest");
      }
      b->nmanifest++;
    }
    i = e + 1;
  }
  return NULL;
}

const char *rt_bundle_manifest_get(const smelt_bundle *b, const char *key) {
  b = b->root;
  for (int i = 0; i < b->nmanifest; i++)
    if (strcmp(b->manifest[i].key, key) == 0) return b->manifest[i].value;
  return NULL;
}

const Graph *rt_bundle_graph(const smelt_bundle *b) { return b->g; }
const FmtFile *rt_bundle_file(const smelt_bundle *b) { return b->file; }
int rt_bundle_num_kernels(const smelt_bundle *b) { return b->nkernels; }
const Kernel *rt_bundle_kernel(const smelt_bundle *b, int i) { return &b->kernels[i]; }
const RtElfImage *rt_bundle_code_image(const smelt_bundle *b) { return b->code_image; }

bool rt_bundle_spec_find(const smelt_bundle *b, FmtSectionKind kind, const char *name, const void **out_data,
                         size_t *out_len) {
  *out_data = NULL;
  *out_len = 0;
  if (name) {
    char full[FMT_SECTION_NAME_BYTES + 16];
    snprintf(full, sizeof full, "%s%s", b->prefix, name);
    return fmt_file_find(b->file, kind, full, out_data, out_len);
  }
  size_t pl = strlen(b->prefix);
  for (int i = 0; i < fmt_file_section_count(b->file); i++) {
    const FmtSection *sec = fmt_file_section_at(b->file, i);
    if (sec->kind != kind || strncmp(sec->name, b->prefix, pl) != 0) continue;
    *out_data = sec->data;
    *out_len = sec->size;
    return true;
  }
  return false;
}

int rt_bundle_num_specs(const smelt_bundle *b) { return b->root->nspecs; }
int rt_bundle_num_ranks(const smelt_bundle *b) { return b->root->nranks > 1 ? b->root->nranks : 1; }
const smelt_bundle *rt_bundle_rank_spec(const smelt_bundle *b, int rank, int spec) {
  const smelt_bundle *r = rank == 0 || !b->root->ranks ? b->root : b->root->ranks[rank];
  return r->specs[spec];
}
const smelt_bundle *rt_bundle_spec(const smelt_bundle *b, int i) { return b->root->specs[i]; }
const char *rt_bundle_spec_label(const smelt_bundle *b) { return b->label; }

int smelt_bundle_num_specialisations(const smelt_bundle *b) { return b->root->nspecs; }
const char *smelt_bundle_specialisation_dims(const smelt_bundle *b, int i) {
  return i >= 0 && i < b->root->nspecs ? b->root->specs[i]->label : NULL;
}

static smelt_status set_no_cpu(smelt_bundle *b, const char *why) {
  const char *path = fmt_file_path(b->file);
  size_t n = strlen(path) + strlen(why) + 16;
  if (!(b->no_cpu = malloc(n))) return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  snprintf(b->no_cpu, n, "%s: error: %s", path, why);
  return NULL;
}

/* The cpu-object sections of b's specialisation, in the order the compiler
 * wrote them (the most capable CPU variant first), named "TRIPLE/CPU".
 * Each variant's needed features are in the manifest under
 * "cpu_features:CPU".  The first whose features this CPU has is loaded;
 * when none fits, the error names what the most portable one (the last)
 * lacks. */
static smelt_status pick_cpu_variant(smelt_bundle *b, const void **out_obj, size_t *out_len, const char **out_cpu) {
  const char *path = fmt_file_path(b->file);
  const char *fake = rt_cpu_host_override();
  size_t pl = strlen(b->prefix);
  const char *last_cpu = NULL, *last_needs = NULL;
  int seen = 0;
  for (int i = 0; i < fmt_file_section_count(b->file); i++) {
    const FmtSection *sec = fmt_file_section_at(b->file, i);
    if (sec->kind != FMT_SEC_CPU_OBJECT || strncmp(sec->name, b->prefix, pl) != 0) continue;
    const char *slash = strrchr(sec->name + pl, '/');
    const char *cpu = slash ? slash + 1 : sec->name + pl;
    char key[FMT_SECTION_NAME_BYTES + 16];
    snprintf(key, sizeof key, "cpu_features:%s", cpu);
    const char *needs = rt_bundle_manifest_get(b, key);
    if (!needs)
      return st_error(ST_INVALID_INPUT, "%s: error: the CPU code for '%s' does not record the CPU features it needs "
                      "(manifest key %s); compile the model again", path, cpu, key);
    seen++;
    last_cpu = cpu, last_needs = needs;
    if (strncmp(sec->name + pl, "x86_64", 6) != 0) continue; /* another architecture's code */
    if (rt_cpu_has_all(needs, fake)) {
      *out_obj = sec->data;
      *out_len = sec->size;
      *out_cpu = cpu;
      return NULL;
    }
  }
  if (!seen)
    return set_no_cpu(b, "the bundle has no CPU machine code (it was compiled for --target cuda; "
                      "compile with --target cpu or cpu,cuda)");
  smelt_status st = rt_cpu_check_features(last_needs, fake, last_cpu);
  if (!st) st = st_error(ST_UNSUPPORTED, "this machine cannot run the bundle's CPU code (built for %s)", last_cpu);
  RETURN_IF_ERROR(set_no_cpu(b, st_message(st)));
  st_free(st);
  return NULL;
}

/* The external weights' deferred check (format/weights.h), once. */
static smelt_status check_weights(const smelt_bundle *b) {
  b = b->root;
  if (!b->weights) return NULL;
  smelt_status st = fmt_weights_verify(b->weights);
  return st ? st_prefix(st, "%s: error: external weights", fmt_file_path(b->file)) : NULL;
}

/* The packed weights of the CPU code.  The compiler packs GEMM and conv
 * weights into zero-initialised globals of the object (its .bss, which
 * the image maps read+write) and gives each kernel that reads one a
 * function NAME__prepack(args) (codegen/llvm/cg_llvm.h; the suffix is
 * repeated here so the runtime needs no codegen header) that fills them
 * from the weight constants, which the bundle stores once.  They run
 * here, once per opened bundle, before any session exists; sessions then
 * only read the packed copies.  args has the kernel's layout with the
 * constant arguments set, the others NULL.  A kernel without the function
 * has nothing to pack.  The constants' checksum is not verified yet (it is
 * deferred to the first session: rt_bundle_check_constants), which is
 * fine: a session on a corrupted bundle is refused before any kernel reads
 * what was packed from it.  The cost moves to opening: every packed weight
 * is read and written once here.  External weights are the exception:
 * packing reads them, so they are checked and assembled first, here (a
 * CPU bundle with external weights pays that at open). */
#define RT_PREPACK_SUFFIX "__prepack"

static smelt_status prepack_weights(smelt_bundle *b) {
  const char *path = fmt_file_path(b->file);
  const Graph *g = b->g;
  for (int i = 0; i < b->nkernels; i++) {
    const Kernel *k = &b->kernels[i];
    char name[sizeof k->name + sizeof RT_PREPACK_SUFFIX];
    snprintf(name, sizeof name, "%s" RT_PREPACK_SUFFIX, k->name);
    void *sym = rt_elf_lookup(b->code_image, name);
    if (!sym) continue;
    /* packing reads the weights: external ones must be checked and
     * assembled first (their check is otherwise deferred to a session) */
    RETURN_IF_ERROR(check_weights(b));
    void **args = calloc((size_t)(k->nargs ? k->nargs : 1), sizeof *args);
    if (!args) return st_error(ST_NO_MEMORY, "%s: error: out of memory", path);
    for (int a = 0; a < k->nargs; a++) {
      const Value *v = &g->val[k->args[a]];
      if (v->kind != VK_CONST) continue;
      if (!v->data && ir_type_bytes(&v->type) > 0) {
        free(args);
        return st_error(ST_INVALID_INPUT, "%s: error: kernel '%s' reads constant '%s', which has no data", path,
                        k->name, v->name);
      }
      args[a] = v->data;
    }
    void (*fn)(void *const *) = (void (*)(void *const *))sym; /* as for the kernels below */
    fn(args);
    free(args);
  }
  return NULL;
}

/* Loads the CPU object, when the bundle has one that runs here; otherwise
 * CPU sessions are refused (b->no_cpu says why) but the bundle opens. */
static smelt_status load_machine_code(smelt_bundle *b, CodeMode mode) {
  const char *path = fmt_file_path(b->file);
  if (b->nkernels == 0) return NULL;
  const void *obj = NULL;
  size_t len = 0;
  const char *cpu = NULL;
  RETURN_IF_ERROR(pick_cpu_variant(b, &obj, &len, &cpu));
  if (!obj) return NULL;
  if (!(b->cpu_variant = strdup(cpu))) return st_error(ST_NO_MEMORY, "%s: error: out of memory", path);
  int nimports = 0;
  const RtElfImport *imports = rt_elf_default_imports(&nimports);
  smelt_status st = rt_elf_load(obj, len, imports, nimports, &b->code_image);
  if (st) return st_prefix(st, "%s: error: loading the CPU code (%s)", path, cpu);
  b->fns = calloc((size_t)b->nkernels, sizeof *b->fns);
  if (!b->fns) return st_error(ST_NO_MEMORY, "%s: error: out of memory", path);
  for (int i = 0; i < b->nkernels; i++) {
    if (fmt_kernel_collective(b->g, &b->kernels[i])) continue; /* runtime/comm.c runs it */
    void *sym = rt_elf_lookup(b->code_image, b->kernels[i].name);
    if (!sym)
      return st_error(ST_INVALID_INPUT, "%s: error: kernel '%s' of the kernel table is not in the CPU code", path,
                      b->kernels[i].name);
    /* POSIX guarantees that an object pointer can be converted to a function
     * pointer (dlsym relies on it); the loader hands out code addresses so. */
    b->fns[i] = (RtKernelFn)sym;
  }
  return mode == CODE_LOAD_AND_RUN ? prepack_weights(b) : NULL;
}

static void unload_machine_code(smelt_bundle *b) {
  rt_elf_free(b->code_image);
  free(b->cpu_variant);
}

/* Decodes the CUDA launch table, when there is one, and checks it against
 * the kernel table: one launch per kernel, same names and argument counts,
 * and a source for every unit (the loader falls back to it). */
static smelt_status load_cuda_table(smelt_bundle *b) {
  const char *path = fmt_file_path(b->file);
  const void *data;
  size_t len;
  if (!rt_bundle_spec_find(b, FMT_SEC_CUDA_LAUNCH, "", &data, &len)) return NULL;
  smelt_status st = fmt_cuda_launch_decode(data, len, &b->cuda);
  if (st) return st_prefix(st, "%s: error", path);
  const FmtCudaModule *m = b->cuda;
  if (m->nkernels != b->nkernels)
    return st_error(ST_INVALID_INPUT, "%s: error: CUDA launch table: %d kernels, the kernel table has %d", path,
                    m->nkernels, b->nkernels);
  for (int i = 0; i < m->nkernels; i++)
    if (strcmp(m->kernels[i].name, b->kernels[i].name) != 0 || m->kernels[i].nargs != b->kernels[i].nargs)
      return st_error(ST_INVALID_INPUT, "%s: error: CUDA launch table: kernel %d is '%s' with %d arguments, the kernel "
                      "table says '%s' with %d", path, i, m->kernels[i].name, m->kernels[i].nargs,
                      b->kernels[i].name, b->kernels[i].nargs);
  for (int u = 0; u < m->nunits; u++) {
    char name[32];
    snprintf(name, sizeof name, "u%d", u);
    if (!rt_bundle_spec_find(b, FMT_SEC_CUDA_SOURCE, name, &data, &len))
      return st_error(ST_INVALID_INPUT, "%s: error: no CUDA source for unit %s%s", path, b->prefix, name);
    if (memchr(data, 0, len))
      return st_error(ST_INVALID_INPUT, "%s: error: CUDA source %s contains a NUL byte", path, name);
    if (!(b->cuda->units[u] = strndup(data, len))) return st_error(ST_NO_MEMORY, "%s: error: out of memory", path);
  }
  return NULL;
}

/* Frees what one specialisation owns. */
static void spec_close(smelt_bundle *b) {
  unload_machine_code(b);
  free(b->fns);
  free(b->no_cpu);
  fmt_cuda_module_free(b->cuda);
  fmt_kernel_table_free(b->kernels, b->nkernels);
  ir_graph_destroy(b->g);
  free(b->label);
  free(b->signature);
}

/* Frees a root's specialisations and itself, but not what it shares with
 * the other ranks. */
static void close_specs(smelt_bundle *b) {
  for (int i = 1; i < b->nspecs; i++)
    if (b->specs[i]) {
      spec_close(b->specs[i]);
      free(b->specs[i]);
    }
  free(b->specs);
  spec_close(b);
}

void smelt_bundle_close(smelt_bundle *b) {
  if (!b) return;
  /* Only the root is handed out; its specialisations and ranks go with it. */
  for (int r = 1; b->ranks && r < b->nranks; r++)
    if (b->ranks[r]) {
      close_specs(b->ranks[r]);
      free(b->ranks[r]);
    }
  free(b->ranks);
  close_specs(b);
  for (int i = 0; i < b->nmanifest; i++) {
    free(b->manifest[i].key);
    free(b->manifest[i].value);
  }
  free(b->manifest);
  fmt_weights_close(b->weights);
  fmt_weights_free(b->weights_table);
  fmt_file_close(b->file);
  free(b);
}

/* The constants section and the external weights, for every
 * specialisation's graph. */
static smelt_status load_constants(smelt_bundle *b) {
  const char *path = fmt_file_path(b->file);
  fmt_file_find(b->file, FMT_SEC_CONSTANTS, "", &b->consts, &b->consts_len);
  const void *data;
  size_t len;
  if (!fmt_file_find(b->file, FMT_SEC_WEIGHTS, "", &data, &len)) return NULL;
  smelt_status st = fmt_weights_decode(data, len, &b->weights_table);
  /* Views of the files need the 64-byte alignment CPU code assumes only
   * when the bundle has CPU code; CUDA only uploads the bytes (8: any
   * element type's own alignment). */
  size_t align = 8;
  for (int i = 0; i < fmt_file_section_count(b->file); i++)
    if (fmt_file_section_at(b->file, i)->kind == FMT_SEC_CPU_OBJECT) align = 64;
  if (!st) st = fmt_weights_open_deferred(b->weights_table, path, align, &b->weights);
  if (st) return st_prefix(st, "%s: error: external weights", path);
  return NULL;
}

/* One specialisation's graph, kernel table and (unless CODE_NONE) code, from the
 * sections under b->prefix.  Messages name the specialisation when the
 * bundle has several. */
static smelt_status load_spec(smelt_bundle *b, CodeMode code) {
  const char *path = fmt_file_path(b->file);
  char where[96] = "";
  if (b->prefix[0]) snprintf(where, sizeof where, " specialisation %s (%s):", b->prefix, b->label);
  const void *data;
  size_t len;
  if (!rt_bundle_spec_find(b, FMT_SEC_GRAPH, "", &data, &len))
    return st_error(ST_INVALID_INPUT, "%s: error:%s no graph section", path, where);
  const smelt_bundle *r = b->root;
  IrConstSpace cs = {.blob = r->consts, .blob_len = r->consts_len};
  if (r->weights) {
    cs.ext = fmt_weights_set_data(r->weights);
    cs.ext_len = fmt_weights_set_sizes(r->weights);
    cs.next = fmt_weights_set_count(r->weights);
  }
  smelt_status st = ir_graph_deserialize(data, len, &cs, &b->g);
  if (st) return st_prefix(st, "%s: error:%s", path, where);
  if (!rt_bundle_spec_find(b, FMT_SEC_KERNELS, "", &data, &len))
    return st_error(ST_INVALID_INPUT, "%s: error:%s no kernel table", path, where);
  if ((st = fmt_kernel_table_decode(data, len, b->g, &b->kernels, &b->nkernels)))
    return st_prefix(st, "%s: error:%s", path, where);
  if (b->prefix[0] && !rt_bundle_spec_find(b, FMT_SEC_IR_TEXT, "", &data, &len))
    return st_error(ST_INVALID_INPUT, "%s: error:%s no IR text", path, where);
  if (!(b->signature = fmt_input_signature(b->g))) return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  if (code != CODE_NONE) RETURN_IF_ERROR(load_machine_code(b, code));
  if (code != CODE_NONE) RETURN_IF_ERROR(load_cuda_table(b));
  b->code = code != CODE_NONE;
  return NULL;
}

/* One line of the index, "sI/\tLABEL\tSIGNATURE", into spec (prefix,
 * label, and the signature it claims in *out_sig, malloc'd). */
static smelt_status parse_index_line(const char *path, const char *base, const char *line, size_t n, int i,
                                     smelt_bundle *spec, char **out_sig) {
  *out_sig = NULL;
  char want[16];
  snprintf(want, sizeof want, "s%d/\t", i);
  size_t wl = strlen(want);
  const char *tab = n > wl ? memchr(line + wl, '\t', n - wl) : NULL;
  if (n <= wl || strncmp(line, want, wl) != 0 || !tab || tab == line + wl || memchr(line, 0, n))
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: entry %d is not \"s%d/<TAB>DIMS<TAB>INPUTS\"",
                    path, i, i);
  snprintf(spec->prefix, sizeof spec->prefix, "%ss%d/", base, i);
  spec->label = strndup(line + wl, (size_t)(tab - (line + wl)));
  *out_sig = strndup(tab + 1, (size_t)(line + n - (tab + 1)));
  if (!spec->label || !*out_sig) return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  return NULL;
}

/* Reads the index and loads every specialisation it lists: each must have
 * its sections, take the inputs the index says, and differ in them from
 * every other; all must have the same inputs and outputs by name, dtype and
 * rank (they are one model). */
static smelt_status load_specs(smelt_bundle *b, const char *base, const char *index, size_t len, CodeMode code) {
  const char *path = fmt_file_path(b->file);
  const char *end = index + len, *nl = memchr(index, '\n', len);
  char head[64];
  int version = 0, n = 0, used = 0;
  if (!nl || (size_t)(nl - index) >= sizeof head)
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: bad header", path);
  snprintf(head, sizeof head, "%.*s", (int)(nl - index), index);
  if (sscanf(head, FMT_SPEC_INDEX_MAGIC " %d %d%n", &version, &n, &used) != 2 || head[used] != 0)
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: bad header", path);
  if (version != FMT_SPEC_INDEX_VERSION)
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index version %d (this smelt reads version %d)", path,
                    version, FMT_SPEC_INDEX_VERSION);
  if (n < 2 || n > FMT_MAX_SPECIALISATIONS)
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: %d specialisations (expected 2 to %d)", path,
                    n, FMT_MAX_SPECIALISATIONS);
  if (!(b->specs = calloc((size_t)n, sizeof *b->specs))) return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  b->nspecs = n;
  b->specs[0] = b;
  const char *line = nl + 1;
  for (int i = 0; i < n; i++) {
    if (i > 0) {
      if (!(b->specs[i] = calloc(1, sizeof *b->specs[i]))) return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
      b->specs[i]->file = b->file;
      b->specs[i]->root = b;
    }
    smelt_bundle *sp = b->specs[i];
    nl = line < end ? memchr(line, '\n', (size_t)(end - line)) : NULL;
    if (!nl) return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: %d entries, the header says %d", path, i, n);
    char *sig;
    RETURN_IF_ERROR(parse_index_line(path, base, line, (size_t)(nl - line), i, sp, &sig));
    line = nl + 1;
    smelt_status st = load_spec(sp, code);
    if (!st && strcmp(sig, sp->signature) != 0)
      st = st_error(ST_INVALID_INPUT, "%s: error: specialisation index: %s (%s) takes %s, the index says %s", path,
                    sp->prefix, sp->label, sp->signature, sig);
    free(sig);
    RETURN_IF_ERROR(st);
    for (int j = 0; j < i; j++) {
      const smelt_bundle *o = b->specs[j];
      if (strcmp(o->signature, sp->signature) == 0 || strcmp(o->label, sp->label) == 0)
        return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: %s (%s) and %s (%s) are not distinct (%s)",
                        path, o->prefix, o->label, sp->prefix, sp->label, sp->signature);
    }
    const Graph *g0 = b->g, *g = sp->g;
    bool same = g->ninputs == g0->ninputs && g->noutputs == g0->noutputs;
    for (int k = 0; same && k < g->ninputs + g->noutputs; k++) {
      const Value *v = k < g->ninputs ? &g->val[g->inputs[k]] : &g->val[g->outputs[k - g->ninputs]];
      const Value *v0 = k < g->ninputs ? &g0->val[g0->inputs[k]] : &g0->val[g0->outputs[k - g->ninputs]];
      same = strcmp(v->name, v0->name) == 0 && v->type.dt == v0->type.dt && v->type.rank == v0->type.rank;
    }
    if (!same)
      return st_error(ST_INVALID_INPUT, "%s: error: specialisation %s (%s) has other inputs or outputs than %s (%s)",
                      path, sp->prefix, sp->label, b->prefix, b->label);
  }
  if (line != end)
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: more entries than the header's %d", path, n);
  return NULL;
}

/* One rank's specialisations, under the prefix base ("" without --tp,
 * else "rR/"): the one of a plain bundle, or those of the index. */
static smelt_status load_rank_specs(smelt_bundle *b, const char *base, CodeMode code) {
  const void *data;
  size_t len;
  if (fmt_file_find(b->file, FMT_SEC_SPECIALISATION, base, &data, &len)) return load_specs(b, base, data, len, code);
  snprintf(b->prefix, sizeof b->prefix, "%s", base);
  if (!(b->label = strdup("")) || !(b->specs = calloc(1, sizeof *b->specs)))
    return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  b->specs[0] = b;
  b->nspecs = 1;
  return load_spec(b, code);
}

/* The ranks must be one model cut in parts: the same specialisations
 * taking the same inputs and giving the same outputs, and the same
 * collectives in the same order with the same sizes (a rank waiting for a
 * collective that another never reaches would wait forever). */
static smelt_status check_rank(const smelt_bundle *b0, const smelt_bundle *rb) {
  const char *path = fmt_file_path(b0->file);
  if (rb->nspecs != b0->nspecs)
    return st_error(ST_INVALID_INPUT, "%s: error: rank %d has %d specialisations, rank 0 %d", path, rb->rank,
                    rb->nspecs, b0->nspecs);
  for (int i = 0; i < b0->nspecs; i++) {
    const smelt_bundle *x = b0->specs[i], *y = rb->specs[i];
    const Graph *g0 = x->g, *g = y->g;
    bool same = strcmp(x->signature, y->signature) == 0 && g->noutputs == g0->noutputs && y->nkernels == x->nkernels;
    for (int k = 0; same && k < g->noutputs; k++)
      same = ir_type_equal(&g->val[g->outputs[k]].type, &g0->val[g0->outputs[k]].type) &&
             strcmp(g->val[g->outputs[k]].name, g0->val[g0->outputs[k]].name) == 0;
    if (!same)
      return st_error(ST_INVALID_INPUT, "%s: error: rank %d's specialisation %d is not rank 0's model (inputs, "
                      "outputs or kernels differ)", path, rb->rank, i);
    for (int k = 0; k < x->nkernels; k++) {
      const Kernel *a = &x->kernels[k], *c = &y->kernels[k];
      bool ca = fmt_kernel_collective(g0, a), cc = fmt_kernel_collective(g, c);
      if (!ca && !cc) continue;
      bool match = ca && cc && a->nargs == 2 && c->nargs == 2 &&
                   g0->node[g0->groups[a->group].anchor].op == g->node[g->groups[c->group].anchor].op;
      for (int j = 0; match && j < 2; j++)
        match = ir_type_equal(&g0->val[a->args[j]].type, &g->val[c->args[j]].type);
      if (!match)
        return st_error(ST_INVALID_INPUT, "%s: error: kernel %d of rank %d (%s) and of rank 0 (%s) are not the same "
                        "collective", path, k, rb->rank, c->name, a->name);
    }
  }
  return NULL;
}

/* Rank 0's specialisations into b, then with --tp (manifest "tp") every
 * other rank's into a bundle of its own. */
static smelt_status load_ranks(smelt_bundle *b, CodeMode code) {
  const char *path = fmt_file_path(b->file);
  const char *tp = rt_bundle_manifest_get(b, "tp");
  char *end = NULL;
  long n = tp ? strtol(tp, &end, 10) : 1;
  if (tp && (*end || n < 2 || n > 64))
    return st_error(ST_INVALID_INPUT, "%s: error: manifest: tp=%s (2 to 64 ranks)", path, tp);
  b->nranks = (int)n;
  if (n == 1) return load_rank_specs(b, "", code);
  if (!(b->ranks = calloc((size_t)n, sizeof *b->ranks))) return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  b->ranks[0] = b;
  RETURN_IF_ERROR(load_rank_specs(b, "r0/", code));
  for (int r = 1; r < n; r++) {
    smelt_bundle *rb = calloc(1, sizeof *rb);
    if (!rb) return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
    b->ranks[r] = rb;
    rb->file = b->file;
    rb->root = rb;
    rb->owner = b;
    rb->rank = r;
    rb->nranks = (int)n;
    rb->manifest = b->manifest, rb->nmanifest = b->nmanifest;
    rb->consts = b->consts, rb->consts_len = b->consts_len;
    rb->weights_table = b->weights_table, rb->weights = b->weights;
    char base[16];
    snprintf(base, sizeof base, "r%d/", r);
    smelt_status st = load_rank_specs(rb, base, code);
    if (!st) st = check_rank(b, rb);
    if (st) return st_prefix(st, "rank %d", r);
  }
  return NULL;
}

/* The manifest, then the specialisations: the one of a plain bundle, or
 * those of the index, of every rank. */
static smelt_status load_bundle(FmtFile *file, CodeMode code, smelt_bundle **out_bundle) {
  *out_bundle = NULL;
  smelt_bundle *b = calloc(1, sizeof *b);
  if (!b) {
    fmt_file_close(file);
    return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  }
  b->file = file;
  b->root = b;
  const char *path = fmt_file_path(file);
  const void *data;
  size_t len;
  smelt_status st = NULL;
  if (!fmt_file_find(file, FMT_SEC_MANIFEST, NULL, &data, &len)) {
    st = st_error(ST_INVALID_INPUT, "%s: error: no manifest section", path);
    goto fail;
  }
  if ((st = parse_manifest(b, data, len))) goto fail;
  if ((st = load_constants(b))) goto fail;
  if ((st = load_ranks(b, code))) goto fail;
  *out_bundle = b;
  return NULL;
fail:
  smelt_bundle_close(b);
  return st;
}

/* The checks opening defers, done once whoever asks first: the constants
 * section's checksum, and the external weights files' content (CRC) with
 * the assembly of the weights that are not used where they lie. */
smelt_status rt_bundle_check_constants(const smelt_bundle *b) {
  RETURN_IF_ERROR(fmt_file_check_deferred(b->root->file));
  return check_weights(b);
}

/* The constants section's checksum and the external weights are verified
 * when a session first needs them (rt_bundle_check_constants), not here:
 * for W4 (705 MB) the constants' CRC is ~50 ms of memory bandwidth, and the
 * external weights' CRC and assembly were ~600 ms, against a few ms for
 * the rest of opening. */
smelt_status smelt_bundle_open(const char *path, smelt_bundle **out_bundle) {
  *out_bundle = NULL;
  if (!path) return st_error(ST_INVALID_INPUT, "smelt_bundle_open: no path");
  FmtFile *file;
  RETURN_IF_ERROR(fmt_file_open_deferred(path, FMT_SEC_CONSTANTS, &file));
  return load_bundle(file, CODE_LOAD_AND_RUN, out_bundle);
}

/* Without code, nothing will start a session to check the constants, so
 * they are checked now (smelt inspect refuses a corrupted bundle). */
smelt_status rt_bundle_open_nojit(const char *path, smelt_bundle **out_bundle) {
  *out_bundle = NULL;
  FmtFile *file;
  RETURN_IF_ERROR(fmt_file_open(path, &file));
  RETURN_IF_ERROR(load_bundle(file, CODE_NONE, out_bundle));
  smelt_status st = check_weights(*out_bundle);
  if (st) {
    smelt_bundle_close(*out_bundle);
    *out_bundle = NULL;
  }
  return st;
}

smelt_status rt_bundle_open_bytes(const void *data, size_t len, const char *name, smelt_bundle **out_bundle) {
  *out_bundle = NULL;
  FmtFile *file;
  RETURN_IF_ERROR(fmt_file_open_memory(data, len, name, &file));
  return load_bundle(file, CODE_LOAD_AND_RUN, out_bundle);
}

smelt_status rt_bundle_check_bytes(const void *data, size_t len, const char *name) {
  FmtFile *file;
  smelt_bundle *b;
  RETURN_IF_ERROR(fmt_file_open_memory(data, len, name, &file));
  RETURN_IF_ERROR(load_bundle(file, CODE_LOAD_ONLY, &b));
  smelt_status st = rt_bundle_check_constants(b);
  smelt_bundle_close(b);
  return st;
}

smelt_status smelt_bundle_open_memory(const void *data, size_t len, smelt_bundle **out_bundle) {
  return rt_bundle_open_bytes(data, len, NULL, out_bundle);
}

