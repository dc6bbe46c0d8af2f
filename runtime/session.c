/* Bundles and sessions: the public API of include/smelt.h on the CPU and
 * on CUDA GPUs.
 *
 * Opening a bundle validates the file (runtime/bundle.c), rebuilds the
 * optimised graph from its serialised form (ir/serialize.c, which runs the
 * verifier), decodes the kernel table and checks it against the graph
 * (driver.c), hands the CPU object (if any, and if LLVM is built in) to the
 * JIT linker once, and decodes the CUDA launch table (if any), checking it
 * against the kernel table.  Nothing is optimised again: the object is
 * machine code and only needs linking.  After open the bundle is read-only,
 * which is what lets several sessions on several threads share it.
 *
 * A session owns what one run mutates.  CPU: the thread pool, the
 * activation memory and the bindings.  Intermediates (values passed between
 * kernels that are not graph outputs) live in one 64-byte-aligned arena at
 * the offsets plan-memory chose (Value.mem_offset), or each in a buffer of
 * its own when the graph has no plan (arena_bytes == 0) or the value was
 * left out of it.  Inputs and outputs live in the user's memory.  A run
 * resolves the pointer of every value once (rt_session_prepare), fills each
 * kernel's argument array from it, and calls the kernels in table order,
 * each split over the pool by task ranges.
 *
 * A small kernel is not worth waking threads for: a kernel gets at most one
 * thread per RT_WORK_PER_THREAD units of estimated work (bytes + flops),
 * so the microsecond-sized kernels of a small model run on the caller alone.
 *
 * CUDA: a session owns a device object (runtime/cuda_driver.h: the primary
 * context, a stream of its own), one module per compilation unit (the cubin
 * for this GPU, else NVRTC on the bundle's source, else PTX), the constants
 * uploaded once at creation, a device arena laid out by the same memory
 * plan, and a CUDA graph of the whole kernel sequence, captured on the
 * first run and replayed after.  A graph keeps the device addresses it was
 * captured with, so every kernel argument must be an address that stays
 * put: inputs and outputs bound in host memory (or in device memory that is
 * not 64-byte aligned, which the kernels assume) go through device staging
 * buffers the session owns, copied in before and out after each replay;
 * device memory bound by the user is used as is, and when a later binding
 * changes any argument address the graph is captured again (the argument
 * values of the last capture are kept to compare with).
 */
#include <stdlib.h>
#include <string.h>

#include <stdio.h>
#include <time.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/llvm/cg_llvm.h"
#include "include/smelt.h"
#include "ir/serialize.h"
#include "runtime/cuda_driver.h"
#include "runtime/driver.h"
#include "runtime/threadpool.h"

/* Units of estimated work (bytes + flops) per thread: about 10-20 us of a
 * core's time for generated code (measured at 20-80 GFLOP/s and 20 GB/s per
 * core); below that, handing a range to another thread costs more than it
 * saves. */
#define RT_WORK_PER_THREAD 1048576.0

/* The public enums mirror the internal ones number for number, so the API
 * converts by cast. */
#define SAME(a, b) ((int)(a) == (int)(b))
_Static_assert(SAME(SMELT_F32, DT_F32) && SAME(SMELT_F16, DT_F16) && SAME(SMELT_BF16, DT_BF16) &&
                   SAME(SMELT_F64, DT_F64) && SAME(SMELT_I64, DT_I64) && SAME(SMELT_I32, DT_I32) &&
                   SAME(SMELT_I8, DT_I8) && SAME(SMELT_U8, DT_U8) && SAME(SMELT_BOOL, DT_BOOL),
               "smelt_dtype mirrors DType");
_Static_assert(SAME(SMELT_OK, ST_OK) && SAME(SMELT_INVALID_INPUT, ST_INVALID_INPUT) && SAME(SMELT_IO, ST_IO) &&
                   SAME(SMELT_UNSUPPORTED, ST_UNSUPPORTED) && SAME(SMELT_NO_MEMORY, ST_NO_MEMORY) &&
                   SAME(SMELT_INTERNAL, ST_INTERNAL),
               "smelt status codes mirror StatusCode");
#undef SAME

typedef void (*RtKernelFn)(void *const *args, int64_t task_begin, int64_t task_end);

typedef struct {
  char *key, *value;
} ManifestEntry;

/* An opened bundle is its first specialisation; the others are bundles
 * of their own (specs[1..]) that share the root's file and manifest, so
 * that everything that works on one specialisation (sessions, check.c,
 * inspect) takes a smelt_bundle either way. */
struct smelt_bundle {
  RtBundle *file;      /* owned by the root */
  smelt_bundle *root;  /* itself for the bundle smelt_bundle_open returns */
  char prefix[16];     /* of its sections' names: "" in a bundle of one, else "sI/" */
  char *label;         /* "seq=16"; "" in a bundle of one (malloc'd) */
  char *signature;     /* rt_input_signature of g (malloc'd) */
  smelt_bundle **specs; /* the root's: every specialisation, specs[0] == root */
  int nspecs;
  Graph *g;
  Kernel *kernels;
  int nkernels;
  ManifestEntry *manifest;
  int nmanifest;
  CgJit *jit;          /* NULL when opened without machine code */
  RtKernelFn *fns;     /* per kernel */
  char *no_cpu;        /* why CPU sessions cannot run it (malloc'd); NULL when they can */
  CgCudaModule *cuda;  /* the CUDA launch table with the units' sources; NULL: no CUDA code */
  bool code;           /* opened with its code (not rt_bundle_open_nojit) */
};

/* What a CUDA session owns.  Device addresses are 0 when unset. */
typedef struct {
  RtCudaDevice *dev;
  RtCudaModule **mods;     /* per unit */
  RtCudaLoadKind *loaded;  /* per unit: how it was loaded */
  RtCudaFunction *fns;     /* per kernel */
  RtCudaPtr const_block;   /* every constant (rt_cuda_upload_constants) */
  RtCudaPtr *const_ptr;    /* per value: its constant's address */
  RtCudaPtr arena;
  RtCudaPtr *own;          /* per value: a buffer of its own (off-plan intermediate, staging) */
  RtCudaPtr *dptr;         /* per value: its device address in this run */
  bool *staged;            /* per value: an input/output copied through own[v] */
  RtCudaPtr *argval;       /* every kernel's argument values, back to back (argv_at) */
  RtCudaPtr *captured;     /* argval as the graph was captured with */
  void **params;           /* per kernel, back to back: &argval[..] of its arguments, then &ws when
                            * it has a workspace, then its TMA descriptors (cuLaunchKernel's kernelParams) */
  RtCudaPtr ws;            /* the workspace every kernel that needs one shares (zeroed once) */
  unsigned char *tmaps;    /* every kernel's TMA descriptors, 128 bytes each, 64-byte aligned */
  RtCudaPtr *tmap_base;    /* per descriptor: the address it was encoded for (0: not yet) */
  int *tmap_at;            /* per kernel: its first descriptor in tmaps */
  RtCudaLaunch *launches;  /* per kernel */
  RtCudaGraph *graph;      /* NULL: capture on the next run */
  void **mirror;           /* per value: host copy for rt_session_read_value */
} CudaState;

/* What a session keeps for one specialisation it has run: the memory and
 * argument arrays of that graph's runs. */
typedef struct {
  void *arena;
  void **own;          /* per value: its own buffer, or NULL */
  void **vptr;         /* per value: where it lives during a run */
  void **argv;         /* every kernel's argument pointers, back to back */
  int *argv_at;        /* per kernel: its first entry in argv */
  CudaState *cu;       /* NULL on the CPU */
} RtRun;

/* What was bound to one input or output slot. */
typedef struct {
  size_t bytes;
  bool bound;
  bool shaped;         /* bound with its shape (inputs only) */
  TensorType shape;    /* its shape, when shaped (dtype: the slot's) */
} Binding;

struct smelt_session {
  smelt_bundle *root;
  smelt_bundle *b;     /* the active specialisation; the root before one is chosen */
  RtRun *r;            /* its run state; NULL before one is chosen */
  RtRun *runs;         /* per specialisation, made when it is first chosen */
  bool *made;          /* per specialisation: runs[i] is made */
  int active, pinned;  /* specialisations; -1: none */
  bool cuda;
  int ordinal;
  RtCudaDevice *dev;   /* CUDA sessions: the device, shared by every run */
  RtPool *pool;        /* CPU sessions: the threads, shared by every run */
  const void **in_ptr; /* per graph input slot: bound memory */
  void **out_ptr;      /* per graph output slot: bound memory */
  Binding *in_bind, *out_bind;
};

/* ---- status wrappers ---- */

int smelt_status_code(const struct Status *st) { return st ? (int)st_code(st) : SMELT_OK; }
const char *smelt_status_message(const struct Status *st) { return st ? st_message(st) : "ok"; }
void smelt_status_free(smelt_status st) { st_free(st); }

/* ---- bundles ---- */

static void *aligned_buffer(size_t bytes) {
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
const RtBundle *rt_bundle_file(const smelt_bundle *b) { return b->file; }
int rt_bundle_num_kernels(const smelt_bundle *b) { return b->nkernels; }
const Kernel *rt_bundle_kernel(const smelt_bundle *b, int i) { return &b->kernels[i]; }

bool rt_bundle_spec_find(const smelt_bundle *b, RtSectionKind kind, const char *name, const void **out_data,
                         size_t *out_len) {
  *out_data = NULL;
  *out_len = 0;
  if (name) {
    char full[RT_SECTION_NAME_BYTES + 16];
    snprintf(full, sizeof full, "%s%s", b->prefix, name);
    return rt_bundle_find(b->file, kind, full, out_data, out_len);
  }
  size_t pl = strlen(b->prefix);
  for (int i = 0; i < rt_bundle_section_count(b->file); i++) {
    const RtSection *sec = rt_bundle_section_at(b->file, i);
    if (sec->kind != kind || strncmp(sec->name, b->prefix, pl) != 0) continue;
    *out_data = sec->data;
    *out_len = sec->size;
    return true;
  }
  return false;
}

int rt_bundle_num_specs(const smelt_bundle *b) { return b->root->nspecs; }
const smelt_bundle *rt_bundle_spec(const smelt_bundle *b, int i) { return b->root->specs[i]; }
const char *rt_bundle_spec_label(const smelt_bundle *b) { return b->label; }

int smelt_bundle_num_specialisations(const smelt_bundle *b) { return b->root->nspecs; }
const char *smelt_bundle_specialisation_dims(const smelt_bundle *b, int i) {
  return i >= 0 && i < b->root->nspecs ? b->root->specs[i]->label : NULL;
}

static smelt_status set_no_cpu(smelt_bundle *b, const char *why) {
  const char *path = rt_bundle_path(b->file);
  size_t n = strlen(path) + strlen(why) + 16;
  if (!(b->no_cpu = malloc(n))) return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  snprintf(b->no_cpu, n, "%s: error: %s", path, why);
  return NULL;
}

#ifdef SMELT_HAVE_LLVM
/* Links the CPU object, when the bundle has one; otherwise CPU sessions
 * are refused (b->no_cpu says why) but the bundle opens. */
static smelt_status load_machine_code(smelt_bundle *b) {
  const char *path = rt_bundle_path(b->file);
  const void *obj;
  size_t len;
  if (b->nkernels == 0) return NULL;
  if (!rt_bundle_spec_find(b, RT_SEC_CPU_OBJECT, NULL, &obj, &len))
    return set_no_cpu(b, "the bundle has no CPU machine code (it was compiled for --target cuda; "
                      "compile with --target cpu or cpu,cuda)");
  smelt_status st = cg_jit_create(obj, len, &b->jit);
  if (st) return st_prefix(st, "%s: error: loading the CPU object", path);
  b->fns = calloc((size_t)b->nkernels, sizeof *b->fns);
  if (!b->fns) return st_error(ST_NO_MEMORY, "%s: error: out of memory", path);
  for (int i = 0; i < b->nkernels; i++) {
    void *sym;
    if ((st = cg_jit_find(b->jit, b->kernels[i].name, &sym)))
      return st_prefix(st, "%s: error: kernel '%s' of the kernel table", path, b->kernels[i].name);
    /* POSIX guarantees that an object pointer from the dynamic linker can be
     * converted to a function pointer; so does the JIT. */
    b->fns[i] = (RtKernelFn)sym;
  }
  return NULL;
}

static void unload_machine_code(smelt_bundle *b) { cg_jit_destroy(b->jit); }
#else
static smelt_status load_machine_code(smelt_bundle *b) {
  if (b->nkernels == 0) return NULL;
  return set_no_cpu(b, "this smelt was built without LLVM (SMELT_LLVM=OFF) and cannot load CPU code; "
                    "use device 'cuda' with a bundle compiled for --target cuda");
}

static void unload_machine_code(smelt_bundle *b) { (void)b; }
#endif

/* Decodes the CUDA launch table, when there is one, and checks it against
 * the kernel table: one launch per kernel, same names and argument counts,
 * and a source for every unit (the loader falls back to it). */
static smelt_status load_cuda_table(smelt_bundle *b) {
  const char *path = rt_bundle_path(b->file);
  const void *data;
  size_t len;
  if (!rt_bundle_spec_find(b, RT_SEC_CUDA_LAUNCH, "", &data, &len)) return NULL;
  smelt_status st = cg_cuda_launch_decode(data, len, &b->cuda);
  if (st) return st_prefix(st, "%s: error", path);
  const CgCudaModule *m = b->cuda;
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
    if (!rt_bundle_spec_find(b, RT_SEC_CUDA_SOURCE, name, &data, &len))
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
  cg_cuda_module_free(b->cuda);
  rt_kernel_table_free(b->kernels, b->nkernels);
  ir_graph_destroy(b->g);
  free(b->label);
  free(b->signature);
}

void smelt_bundle_close(smelt_bundle *b) {
  if (!b) return;
  /* Only the root is handed out; its specialisations go with it. */
  for (int i = 1; i < b->nspecs; i++)
    if (b->specs[i]) {
      spec_close(b->specs[i]);
      free(b->specs[i]);
    }
  free(b->specs);
  spec_close(b);
  for (int i = 0; i < b->nmanifest; i++) {
    free(b->manifest[i].key);
    free(b->manifest[i].value);
  }
  free(b->manifest);
  rt_bundle_close(b->file);
  free(b);
}

/* One specialisation's graph, kernel table and (with jit) code, from the
 * sections under b->prefix.  Messages name the specialisation when the
 * bundle has several. */
static smelt_status load_spec(smelt_bundle *b, bool jit) {
  const char *path = rt_bundle_path(b->file);
  char where[96] = "";
  if (b->prefix[0]) snprintf(where, sizeof where, " specialisation %s (%s):", b->prefix, b->label);
  const void *data;
  size_t len;
  if (!rt_bundle_spec_find(b, RT_SEC_GRAPH, "", &data, &len))
    return st_error(ST_INVALID_INPUT, "%s: error:%s no graph section", path, where);
  smelt_status st = ir_graph_deserialize(data, len, &b->g);
  if (st) return st_prefix(st, "%s: error:%s", path, where);
  if (!rt_bundle_spec_find(b, RT_SEC_KERNELS, "", &data, &len))
    return st_error(ST_INVALID_INPUT, "%s: error:%s no kernel table", path, where);
  if ((st = rt_kernel_table_decode(data, len, b->g, &b->kernels, &b->nkernels)))
    return st_prefix(st, "%s: error:%s", path, where);
  if (b->prefix[0] && !rt_bundle_spec_find(b, RT_SEC_IR_TEXT, "", &data, &len))
    return st_error(ST_INVALID_INPUT, "%s: error:%s no IR text", path, where);
  if (!(b->signature = rt_input_signature(b->g))) return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  if (jit) RETURN_IF_ERROR(load_machine_code(b));
  if (jit) RETURN_IF_ERROR(load_cuda_table(b));
  b->code = jit;
  return NULL;
}

/* One line of the index, "sI/\tLABEL\tSIGNATURE", into spec (prefix,
 * label, and the signature it claims in *out_sig, malloc'd). */
static smelt_status parse_index_line(const char *path, const char *line, size_t n, int i, smelt_bundle *spec,
                                     char **out_sig) {
  *out_sig = NULL;
  char want[16];
  snprintf(want, sizeof want, "s%d/\t", i);
  size_t wl = strlen(want);
  const char *tab = n > wl ? memchr(line + wl, '\t', n - wl) : NULL;
  if (n <= wl || strncmp(line, want, wl) != 0 || !tab || tab == line + wl || memchr(line, 0, n))
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: entry %d is not \"s%d/<TAB>DIMS<TAB>INPUTS\"",
                    path, i, i);
  snprintf(spec->prefix, sizeof spec->prefix, "s%d/", i);
  spec->label = strndup(line + wl, (size_t)(tab - (line + wl)));
  *out_sig = strndup(tab + 1, (size_t)(line + n - (tab + 1)));
  if (!spec->label || !*out_sig) return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  return NULL;
}

/* Reads the index and loads every specialisation it lists: each must have
 * its sections, take the inputs the index says, and differ in them from
 * every other; all must have the same inputs and outputs by name, dtype and
 * rank (they are one model). */
static smelt_status load_specs(smelt_bundle *b, const char *index, size_t len, bool jit) {
  const char *path = rt_bundle_path(b->file);
  const char *end = index + len, *nl = memchr(index, '\n', len);
  char head[64];
  int version = 0, n = 0, used = 0;
  if (!nl || (size_t)(nl - index) >= sizeof head)
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: bad header", path);
  snprintf(head, sizeof head, "%.*s", (int)(nl - index), index);
  if (sscanf(head, RT_SPEC_INDEX_MAGIC " %d %d%n", &version, &n, &used) != 2 || head[used] != 0)
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: bad header", path);
  if (version != RT_SPEC_INDEX_VERSION)
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index version %d (this smelt reads version %d)", path,
                    version, RT_SPEC_INDEX_VERSION);
  if (n < 2 || n > RT_MAX_SPECIALISATIONS)
    return st_error(ST_INVALID_INPUT, "%s: error: specialisation index: %d specialisations (expected 2 to %d)", path,
                    n, RT_MAX_SPECIALISATIONS);
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
    RETURN_IF_ERROR(parse_index_line(path, line, (size_t)(nl - line), i, sp, &sig));
    line = nl + 1;
    smelt_status st = load_spec(sp, jit);
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

/* The manifest, then the specialisations: the one of a plain bundle, or
 * those of the index. */
static smelt_status load_bundle(RtBundle *file, bool jit, smelt_bundle **out_bundle) {
  *out_bundle = NULL;
  smelt_bundle *b = calloc(1, sizeof *b);
  if (!b) {
    rt_bundle_close(file);
    return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  }
  b->file = file;
  b->root = b;
  const char *path = rt_bundle_path(file);
  const void *data;
  size_t len;
  smelt_status st = NULL;
  if (!rt_bundle_find(file, RT_SEC_MANIFEST, NULL, &data, &len)) {
    st = st_error(ST_INVALID_INPUT, "%s: error: no manifest section", path);
    goto fail;
  }
  if ((st = parse_manifest(b, data, len))) goto fail;
  if (rt_bundle_find(file, RT_SEC_SPECIALISATION, NULL, &data, &len)) {
    if ((st = load_specs(b, data, len, jit))) goto fail;
  } else {
    if (!(b->label = strdup("")) || !(b->specs = calloc(1, sizeof *b->specs))) {
      st = st_error(ST_NO_MEMORY, "out of memory opening a bundle");
      goto fail;
    }
    b->specs[0] = b;
    b->nspecs = 1;
    if ((st = load_spec(b, jit))) goto fail;
  }
  *out_bundle = b;
  return NULL;
fail:
  smelt_bundle_close(b);
  return st;
}

smelt_status smelt_bundle_open(const char *path, smelt_bundle **out_bundle) {
  *out_bundle = NULL;
  if (!path) return st_error(ST_INVALID_INPUT, "smelt_bundle_open: no path");
  RtBundle *file;
  RETURN_IF_ERROR(rt_bundle_open(path, &file));
  return load_bundle(file, true, out_bundle);
}

smelt_status rt_bundle_open_nojit(const char *path, smelt_bundle **out_bundle) {
  *out_bundle = NULL;
  RtBundle *file;
  RETURN_IF_ERROR(rt_bundle_open(path, &file));
  return load_bundle(file, false, out_bundle);
}

smelt_status rt_bundle_open_bytes(const void *data, size_t len, const char *name, smelt_bundle **out_bundle) {
  *out_bundle = NULL;
  RtBundle *file;
  RETURN_IF_ERROR(rt_bundle_open_memory(data, len, name, &file));
  return load_bundle(file, true, out_bundle);
}

smelt_status smelt_bundle_open_memory(const void *data, size_t len, smelt_bundle **out_bundle) {
  return rt_bundle_open_bytes(data, len, NULL, out_bundle);
}

/* ---- sessions ---- */

/* Parses a device name: "cpu", or "cuda" / "cuda:N" (*out_ordinal = N). */
static smelt_status parse_device(const char *device, bool *out_cuda, int *out_ordinal) {
  *out_cuda = false;
  *out_ordinal = 0;
  if (!device || strcmp(device, "cpu") == 0) return NULL;
  if (strcmp(device, "cuda") == 0) {
    *out_cuda = true;
    return NULL;
  }
  if (strncmp(device, "cuda:", 5) == 0) {
    const char *p = device + 5;
    char *end;
    long n = strtol(p, &end, 10);
    if (end != p && !*end && *p >= '0' && *p <= '9' && n <= 1024) {
      *out_cuda = true;
      *out_ordinal = (int)n;
      return NULL;
    }
  }
  return st_error(ST_UNSUPPORTED, "device '%s': unknown device (expected 'cpu', 'cuda' or 'cuda:N')", device);
}

static bool is_graph_output(const Graph *g, int v) {
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == v) return true;
  return false;
}

static int session_threads(const smelt_bundle *b, const smelt_session_options *o) {
  if (o && o->threads > 0) return o->threads;
  const char *t = rt_bundle_manifest_get(b, "threads");
  long n = t ? strtol(t, NULL, 10) : 0;
  return n > 0 && n <= 4096 ? (int)n : rt_cpu_count();
}

/* Gives every intermediate its memory: the arena at its planned offset, or
 * a buffer of its own.  The loader has checked every offset against the
 * arena's size. */
static smelt_status place_intermediates(smelt_session *s) {
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  if (g->arena_bytes > 0 && !(s->r->arena = aligned_buffer((size_t)g->arena_bytes)))
    return st_error(ST_NO_MEMORY, "out of memory: activation arena of %lld bytes", (long long)g->arena_bytes);
  for (int k = 0; k < b->nkernels; k++) {
    const Kernel *kn = &b->kernels[k];
    for (int a = kn->nargs - kn->nouts; a < kn->nargs; a++) {
      int v = kn->args[a];
      if (is_graph_output(g, v) || s->r->vptr[v]) continue;
      const Value *val = &g->val[v];
      if (s->r->arena && val->mem_offset >= 0) {
        s->r->vptr[v] = (char *)s->r->arena + val->mem_offset;
        continue;
      }
      if (!(s->r->own[v] = aligned_buffer(ir_type_bytes(&val->type))))
        return st_error(ST_NO_MEMORY, "out of memory: buffer of '%s'", val->name);
      s->r->vptr[v] = s->r->own[v];
    }
  }
  return NULL;
}

/* ---- CUDA sessions: creation ---- */

/* The bundle's compiled forms of unit u: one image per arch with a cubin
 * and/or PTX section named "ARCH/uU" under the specialisation's prefix. */
static int unit_images(const smelt_bundle *b, int u, RtCudaImage *img, char (*arch)[16], int cap) {
  char suffix[32];
  int n = snprintf(suffix, sizeof suffix, "/u%d", u), count = 0;
  size_t sl = (size_t)n;
  for (int i = 0; i < rt_bundle_section_count(b->file); i++) {
    const RtSection *sec = rt_bundle_section_at(b->file, i);
    if (sec->kind != RT_SEC_CUBIN && sec->kind != RT_SEC_PTX) continue;
    size_t pl = strlen(b->prefix);
    if (strncmp(sec->name, b->prefix, pl) != 0) continue;
    const char *rel = sec->name + pl;
    size_t nl = strlen(rel);
    if (nl <= sl || nl - sl >= 16 || strcmp(rel + nl - sl, suffix) != 0 || memchr(rel, '/', nl - sl)) continue;
    char a[16];
    snprintf(a, sizeof a, "%.*s", (int)(nl - sl), rel);
    int j = 0;
    while (j < count && strcmp(arch[j], a) != 0) j++;
    if (j == count) {
      if (count == cap) continue;
      memset(&img[count], 0, sizeof img[count]);
      snprintf(arch[count], 16, "%s", a);
      img[count].arch = arch[count];
      count++;
    }
    if (sec->kind == RT_SEC_CUBIN) {
      img[j].cubin = sec->size ? sec->data : NULL;
      img[j].cubin_len = sec->size;
    } else if (sec->size > 0 && ((const char *)sec->data)[sec->size - 1] == 0) {
      /* PTX without its NUL would be read past its end: ignored */
      img[j].ptx = sec->data;
    }
  }
  return count;
}

/* Loads every unit (cubin for this GPU, else NVRTC, else PTX) and finds
 * every kernel. */
static smelt_status cuda_load_modules(smelt_session *s) {
  const smelt_bundle *b = s->b;
  CudaState *cu = s->r->cu;
  const CgCudaModule *m = b->cuda;
  const char *path = rt_bundle_path(b->file);
  cu->mods = calloc((size_t)m->nunits, sizeof *cu->mods);
  cu->loaded = calloc((size_t)m->nunits, sizeof *cu->loaded);
  cu->fns = calloc((size_t)m->nkernels + 1, sizeof *cu->fns);
  if (!cu->mods || !cu->loaded || !cu->fns) return st_error(ST_NO_MEMORY, "out of memory");
  for (int u = 0; u < m->nunits; u++) {
    RtCudaImage img[2 * RT_MAX_CUDA_ARCHS];
    char arch[2 * RT_MAX_CUDA_ARCHS][16];
    int n = unit_images(b, u, img, arch, 2 * RT_MAX_CUDA_ARCHS);
    char what[96];
    snprintf(what, sizeof what, "unit u%d of %s", u, path);
    RETURN_IF_ERROR(rt_cuda_module_load(cu->dev, img, n, m->units[u], what, &cu->mods[u], &cu->loaded[u]));
  }
  for (int k = 0; k < m->nkernels; k++) {
    const CgCudaLaunch *l = &m->kernels[k];
    smelt_status st = rt_cuda_module_function(cu->mods[l->unit], l->symbol, l->smem, &cu->fns[k]);
    if (st) return st_prefix(st, "%s: kernel '%s'", path, l->name);
  }
  return NULL;
}

/* Device memory for what lives on the device for the session's life:
 * constants, the arena, intermediates off the plan. */
static smelt_status cuda_place(smelt_session *s) {
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  CudaState *cu = s->r->cu;
  RETURN_IF_ERROR(rt_cuda_upload_constants(cu->dev, g, &cu->const_block, cu->const_ptr));
  if (g->arena_bytes > 0) RETURN_IF_ERROR(rt_cuda_alloc(cu->dev, (size_t)g->arena_bytes, &cu->arena));
  for (int k = 0; k < b->nkernels; k++) {
    const Kernel *kn = &b->kernels[k];
    for (int a = kn->nargs - kn->nouts; a < kn->nargs; a++) {
      int v = kn->args[a];
      if (is_graph_output(g, v) || cu->dptr[v]) continue;
      const Value *val = &g->val[v];
      if (cu->arena && val->mem_offset >= 0) {
        cu->dptr[v] = cu->arena + (RtCudaPtr)val->mem_offset;
        continue;
      }
      smelt_status st = rt_cuda_alloc(cu->dev, ir_type_bytes(&val->type), &cu->own[v]);
      if (st) return st_prefix(st, "buffer of '%s'", val->name);
      cu->dptr[v] = cu->own[v];
    }
  }
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].kind == VK_CONST) cu->dptr[v] = cu->const_ptr[v];
  return NULL;
}

static smelt_status cuda_create(smelt_session *s, size_t nargs) {
  const smelt_bundle *b = s->b;
  size_t nval = (size_t)b->g->nval ? (size_t)b->g->nval : 1;
  CudaState *cu = s->r->cu = calloc(1, sizeof *cu);
  if (!cu) return st_error(ST_NO_MEMORY, "out of memory creating a session");
  cu->dev = s->dev; /* the session's */
  if (b->nkernels > 0 && !b->cuda)
    return st_error(ST_UNSUPPORTED, "%s: error: the bundle has no CUDA kernels (it was compiled for --target cpu; "
                    "compile with --target cuda or cpu,cuda)", rt_bundle_path(b->file));
  cu->const_ptr = calloc(nval, sizeof *cu->const_ptr);
  cu->own = calloc(nval, sizeof *cu->own);
  cu->dptr = calloc(nval, sizeof *cu->dptr);
  cu->staged = calloc(nval, sizeof *cu->staged);
  cu->mirror = calloc(nval, sizeof *cu->mirror);
  cu->argval = calloc(nargs ? nargs : 1, sizeof *cu->argval);
  cu->captured = calloc(nargs ? nargs : 1, sizeof *cu->captured);
  /* beyond the arguments: a workspace pointer and the TMA descriptors */
  uint64_t ws_bytes = 0;
  size_t ntmaps = 0;
  for (int k = 0; b->cuda && k < b->nkernels; k++) {
    const CgCudaLaunch *l = &b->cuda->kernels[k];
    if (l->workspace > ws_bytes) ws_bytes = l->workspace;
    ntmaps += (size_t)l->ntmaps;
  }
  size_t nparams = nargs + (size_t)b->nkernels + ntmaps;
  cu->params = calloc(nparams ? nparams : 1, sizeof *cu->params);
  cu->launches = calloc(b->nkernels ? (size_t)b->nkernels : 1, sizeof *cu->launches);
  cu->tmap_at = calloc(b->nkernels ? (size_t)b->nkernels : 1, sizeof *cu->tmap_at);
  cu->tmaps = ntmaps ? aligned_alloc(64, ntmaps * 128) : NULL;
  cu->tmap_base = calloc(ntmaps ? ntmaps : 1, sizeof *cu->tmap_base);
  if (!cu->const_ptr || !cu->own || !cu->dptr || !cu->staged || !cu->mirror || !cu->argval || !cu->captured ||
      !cu->params || !cu->launches || !cu->tmap_at || !cu->tmap_base || (ntmaps && !cu->tmaps))
    return st_error(ST_NO_MEMORY, "out of memory creating a session");
  if (ntmaps) memset(cu->tmaps, 0, ntmaps * 128);
  if (b->cuda) RETURN_IF_ERROR(cuda_load_modules(s));
  RETURN_IF_ERROR(cuda_place(s));
  if (ws_bytes) {
    RETURN_IF_ERROR(rt_cuda_alloc(cu->dev, (size_t)ws_bytes, &cu->ws));
    RETURN_IF_ERROR(rt_cuda_memset(cu->dev, cu->ws, 0, (size_t)ws_bytes));
  }
  size_t at = 0;
  int tm = 0;
  for (int k = 0; k < b->nkernels; k++) {
    const CgCudaLaunch *l = &b->cuda->kernels[k];
    void **p = cu->params + at;
    int n = 0;
    for (int a = 0; a < b->kernels[k].nargs; a++) p[n++] = &cu->argval[s->r->argv_at[k] + a];
    if (l->workspace) p[n++] = &cu->ws;
    cu->tmap_at[k] = tm;
    for (int t = 0; t < l->ntmaps; t++) p[n++] = cu->tmaps + (size_t)(tm++) * 128;
    at += (size_t)n;
    cu->launches[k] = (RtCudaLaunch){.fn = cu->fns[k], .name = l->name, .grid = {l->grid[0], l->grid[1], l->grid[2]},
                                     .block = {l->block[0], l->block[1], l->block[2]}, .smem = l->smem, .params = p};
  }
  return NULL;
}

/* Encodes the TMA descriptors whose tensors moved since they were last
 * encoded (a descriptor holds its tensor's address; with the session's own
 * buffers that is once, at the first run). */
static smelt_status cuda_encode_tmaps(smelt_session *s) {
  const smelt_bundle *b = s->b;
  CudaState *cu = s->r->cu;
  for (int k = 0; b->cuda && k < b->nkernels; k++) {
    const CgCudaLaunch *l = &b->cuda->kernels[k];
    for (int t = 0; t < l->ntmaps; t++) {
      const CgCudaTmap *m = &l->tmaps[t];
      RtCudaPtr base = cu->argval[s->r->argv_at[k] + m->arg];
      int at = cu->tmap_at[k] + t;
      if (cu->tmap_base[at] == base) continue;
      smelt_status st = rt_cuda_tensor_map(cu->dev, m->dtype, m->rank, base, m->dims, m->strides, m->box, m->swizzle,
                                           cu->tmaps + (size_t)at * 128);
      if (st) return st_prefix(st, "kernel '%s'", l->name);
      cu->tmap_base[at] = base;
    }
  }
  return NULL;
}

static void cuda_destroy(smelt_session *s) {
  CudaState *cu = s->r->cu;
  if (!cu) return;
  const Graph *g = s->b->g;
  rt_cuda_graph_destroy(cu->graph);
  if (cu->dev) {
    for (int v = 0; cu->own && v < g->nval; v++) rt_cuda_free(cu->dev, cu->own[v]);
    rt_cuda_free(cu->dev, cu->arena);
    rt_cuda_free(cu->dev, cu->const_block);
    rt_cuda_free(cu->dev, cu->ws);
    for (int u = 0; cu->mods && u < s->b->cuda->nunits; u++) rt_cuda_module_unload(cu->mods[u]);
  }
  for (int v = 0; cu->mirror && v < g->nval; v++) free(cu->mirror[v]);
  free(cu->mods), free(cu->loaded), free(cu->fns), free(cu->const_ptr), free(cu->own);
  free(cu->dptr), free(cu->staged), free(cu->mirror), free(cu->argval), free(cu->captured), free(cu->params);
  free(cu->launches), free(cu->tmaps), free(cu->tmap_at), free(cu->tmap_base);
  free(cu);
}

/* ---- sessions: specialisations ---- */

static smelt_status check_binding(const Graph *g, int v, const char *what, const void *data, size_t bytes);

/* Frees the run state s->r of specialisation s->b, leaving it zeroed. */
static void free_run(smelt_session *s) {
  if (!s->r) return;
  cuda_destroy(s);
  if (s->r->own)
    for (int v = 0; v < s->b->g->nval; v++) free(s->r->own[v]);
  free(s->r->own);
  free(s->r->arena);
  free(s->r->vptr);
  free(s->r->argv);
  free(s->r->argv_at);
  memset(s->r, 0, sizeof *s->r);
}

/* Makes specialisation i's run state (arena, buffers, argument arrays; on
 * CUDA its modules, constants and device memory) the current one. */
static smelt_status make_run(smelt_session *s, int i) {
  s->b = s->root->specs[i];
  s->r = &s->runs[i];
  s->made[i] = true;
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  size_t nval = (size_t)g->nval, nargs = 0;
  for (int k = 0; k < b->nkernels; k++) nargs += (size_t)b->kernels[k].nargs;
  s->r->own = calloc(nval ? nval : 1, sizeof *s->r->own);
  s->r->vptr = calloc(nval ? nval : 1, sizeof *s->r->vptr);
  s->r->argv = calloc(nargs ? nargs : 1, sizeof *s->r->argv);
  s->r->argv_at = calloc(b->nkernels ? (size_t)b->nkernels : 1, sizeof *s->r->argv_at);
  if (!s->r->own || !s->r->vptr || !s->r->argv || !s->r->argv_at)
    return st_error(ST_NO_MEMORY, "out of memory creating a session");
  for (int k = 0, at = 0; k < b->nkernels; k++) {
    s->r->argv_at[k] = at;
    at += b->kernels[k].nargs;
  }
  return s->cuda ? cuda_create(s, nargs) : place_intermediates(s);
}

/* Makes specialisation i the active one, creating its run state the first
 * time; a session keeps the state of every specialisation it has run, so
 * going back and forth (decode, prefill, decode) costs nothing. */
static smelt_status activate(smelt_session *s, int i) {
  if (s->active == i) return NULL;
  smelt_bundle *prev_b = s->b;
  RtRun *prev_r = s->r;
  if (s->made[i]) {
    s->b = s->root->specs[i];
    s->r = &s->runs[i];
    s->active = i;
    return NULL;
  }
  smelt_status st = make_run(s, i);
  if (st) {
    free_run(s);
    s->made[i] = false;
    s->b = prev_b;
    s->r = prev_r;
    if (s->root->nspecs > 1) st = st_prefix(st, "specialisation %s", s->root->specs[i]->label);
    return st;
  }
  s->active = i;
  return NULL;
}

/* The specialisations a bundle has, for messages: "seq=1,16,64" when they
 * differ in one dim, else their labels separated by "; ". */
static const char *spec_list(const smelt_bundle *root, char *buf, size_t cap) {
  const char *eq0 = strchr(root->specs[0]->label, '=');
  size_t nl = eq0 ? (size_t)(eq0 - root->specs[0]->label) + 1 : 0;
  bool one_dim = nl > 0;
  for (int i = 0; i < root->nspecs && one_dim; i++) {
    const char *l = root->specs[i]->label;
    one_dim = strncmp(l, root->specs[0]->label, nl) == 0 && !strchr(l, ' ');
  }
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < root->nspecs && len + 1 < cap; i++) {
    const char *l = root->specs[i]->label;
    int w = one_dim ? snprintf(buf + len, cap - len, "%s%s", i ? "," : "", i ? l + nl : l)
                    : snprintf(buf + len, cap - len, "%s%s", i ? "; " : "", l);
    if (w < 0) break;
    len += (size_t)w;
  }
  return buf;
}

static const char *shape_str(const TensorType *t, char *buf, size_t cap) {
  size_t k = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < t->rank && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)t->dim[i]);
  if (k < cap) snprintf(buf + k, cap - k, "]");
  return buf;
}

static int slot_value(const Graph *g, bool input, int slot) { return input ? g->inputs[slot] : g->outputs[slot]; }

/* Whether specialisation sp takes binding bd in that input/output slot:
 * the same shape when bound with one, else the same size. */
static bool takes(const smelt_bundle *sp, bool input, int slot, const Binding *bd) {
  const TensorType *t = &sp->g->val[slot_value(sp->g, input, slot)].type;
  if (bd->shaped) {
    if (bd->shape.rank != t->rank) return false;
    for (int d = 0; d < t->rank; d++)
      if (bd->shape.dim[d] != t->dim[d]) return false;
  }
  return ir_type_bytes(t) == bd->bytes;
}

/* Checks a binding against specialisation sp (the message of a bundle of
 * one: what the tensor is and what was bound). */
static smelt_status check_against(const smelt_bundle *sp, bool input, int slot, const void *data, const Binding *bd) {
  const Graph *g = sp->g;
  int v = slot_value(g, input, slot);
  const Value *val = &g->val[v];
  if (bd->shaped && !takes(sp, input, slot, bd) && ir_type_bytes(&val->type) == bd->bytes) {
    char ty[128], sh[128];
    return st_error(ST_INVALID_INPUT, "%s '%s' is %s; the bound tensor has shape %s", input ? "input" : "output",
                    val->name, ir_type_str(&val->type, ty, sizeof ty), shape_str(&bd->shape, sh, sizeof sh));
  }
  return check_binding(g, v, input ? "input" : "output", data, bd->bytes);
}

/* Checks a binding before it is recorded: against the chosen
 * specialisation when there is one, else against all of them. */
static smelt_status check_slot(smelt_session *s, bool input, int slot, const void *data, const Binding *bd) {
  const smelt_bundle *root = s->root;
  if (s->pinned >= 0) return check_against(root->specs[s->pinned], input, slot, data, bd);
  for (int i = 0; i < root->nspecs; i++)
    if (takes(root->specs[i], input, slot, bd)) return check_against(root->specs[i], input, slot, data, bd);
  char what[160], sh[192], list[512];
  const char *name = root->g->val[slot_value(root->g, input, slot)].name;
  if (bd->shaped) snprintf(sh, sizeof sh, "with shape %s", shape_str(&bd->shape, what, sizeof what));
  else snprintf(sh, sizeof sh, "of %zu bytes", bd->bytes);
  return st_error(ST_INVALID_INPUT, "no specialisation of model '%s' takes %s '%s' %s; the bundle has %s",
                  root->g->name, input ? "input" : "output", name, sh, spec_list(root, list, sizeof list));
}

/* Picks the specialisation of the next run: the one chosen with
 * smelt_session_select, else the only one that takes every binding. */
static smelt_status choose(smelt_session *s) {
  const smelt_bundle *root = s->root;
  if (s->pinned >= 0) return activate(s, s->pinned);
  const Graph *g = root->g;
  int found = -1, count = 0;
  char list[512], fits[512] = "";
  for (int i = 0; i < root->nspecs; i++) {
    bool ok = true;
    for (int k = 0; k < g->ninputs && ok; k++) ok = !s->in_bind[k].bound || takes(root->specs[i], true, k, &s->in_bind[k]);
    for (int k = 0; k < g->noutputs && ok; k++)
      ok = !s->out_bind[k].bound || takes(root->specs[i], false, k, &s->out_bind[k]);
    if (!ok) continue;
    size_t n = strlen(fits);
    snprintf(fits + n, sizeof fits - n, "%s%s", count ? ", " : "", root->specs[i]->label);
    if (count++ == 0 || i == s->active) found = i;
  }
  if (count == 1) return activate(s, found);
  if (count == 0) {
    /* each binding fits some specialisation, but not the same one */
    char what[1024] = "", sh[160];
    for (int k = 0; k < g->ninputs + g->noutputs; k++) {
      bool input = k < g->ninputs;
      const Binding *bd = input ? &s->in_bind[k] : &s->out_bind[k - g->ninputs];
      if (!bd->bound) continue;
      size_t n = strlen(what);
      if (bd->shaped) shape_str(&bd->shape, sh, sizeof sh);
      else snprintf(sh, sizeof sh, "%zu bytes", bd->bytes);
      snprintf(what + n, sizeof what - n, "%s%s '%s' %s", n ? ", " : "", input ? "input" : "output",
               g->val[slot_value(g, input, input ? k : k - g->ninputs)].name, sh);
    }
    return st_error(ST_INVALID_INPUT, "no specialisation of model '%s' takes all of %s together; the bundle has %s",
                    g->name, what, spec_list(root, list, sizeof list));
  }
  return st_error(ST_INVALID_INPUT, "the tensors bound fit %d specialisations of model '%s' (%s): bind the inputs "
                  "with smelt_session_bind_input_shaped or choose one with smelt_session_select", count, g->name, fits);
}

/* Whether the space-separated label has the item "k=v". */
static bool label_has(const char *label, const char *item, size_t n) {
  for (const char *p = label; *p;) {
    size_t len = strcspn(p, " ");
    if (len == n && strncmp(p, item, n) == 0) return true;
    p += len;
    p += strspn(p, " ");
  }
  return false;
}

/* Whether any label names dim `name` (n bytes). */
static bool labels_name(const smelt_bundle *root, const char *name, size_t n) {
  for (int i = 0; i < root->nspecs; i++)
    for (const char *p = root->specs[i]->label; *p;) {
      size_t len = strcspn(p, " ");
      if (len > n && p[n] == '=' && strncmp(p, name, n) == 0) return true;
      p += len;
      p += strspn(p, " ");
    }
  return false;
}

/* Whether the manifest's dims ("seq=16;hidden=64", as compiled) hold the
 * item "k=v" (n bytes) as given. */
static bool manifest_has(const smelt_bundle *root, const char *item, size_t n) {
  const char *dims = rt_bundle_manifest_get(root, "dims");
  for (const char *p = dims ? dims : ""; *p;) {
    size_t len = strcspn(p, ";");
    if (len == n && strncmp(p, item, n) == 0) return true;
    p += len;
    p += strspn(p, ";");
  }
  return false;
}

smelt_status rt_bundle_find_spec(const smelt_bundle *b, const char *dims, int *out_index) {
  const smelt_bundle *root = b->root;
  *out_index = -1;
  char list[512];
  const char *text = dims ? dims : "";
  int found = -1, count = 0;
  char fits[512] = "";
  for (int i = 0; i < root->nspecs; i++) {
    bool ok = true;
    for (const char *p = text + strspn(text, "; "); *p && ok;) {
      size_t n = strcspn(p, "; ");
      const char *eq = memchr(p, '=', n);
      if (!eq || eq == p)
        return st_error(ST_INVALID_INPUT, "dims '%s': expected NAME=VALUE", text);
      if (labels_name(root, p, (size_t)(eq - p))) ok = label_has(root->specs[i]->label, p, n);
      else if (!manifest_has(root, p, n))
        return st_error(ST_INVALID_INPUT, "%s: the bundle was not compiled for %.*s (%s%s%s)",
                        rt_bundle_path(root->file), (int)n, p, root->nspecs > 1 ? "its specialisations: " : "its dims: ",
                        root->nspecs > 1 ? spec_list(root, list, sizeof list) : "",
                        root->nspecs > 1 ? "" : (rt_bundle_manifest_get(root, "dims") && *rt_bundle_manifest_get(root, "dims") ? rt_bundle_manifest_get(root, "dims") : "the model's"));
      p += n;
      p += strspn(p, "; ");
    }
    if (!ok) continue;
    size_t k = strlen(fits);
    snprintf(fits + k, sizeof fits - k, "%s%s", count ? "; " : "", root->specs[i]->label);
    if (count++ == 0) found = i;
  }
  if (count > 1)
    return st_error(ST_INVALID_INPUT, "%s: %s fits %d specialisations (%s): give a value for each dim in which they "
                    "differ", rt_bundle_path(root->file), text, count, fits);
  if (found < 0)
    return st_error(ST_INVALID_INPUT, "%s: no specialisation has %s; the bundle has %s", rt_bundle_path(root->file),
                    text, spec_list(root, list, sizeof list));
  *out_index = found;
  return NULL;
}

smelt_status rt_bundle_match_inputs(const smelt_bundle *b, const char *const *names, const TensorType *shapes, int n,
                                    int *out_index) {
  const smelt_bundle *root = b->root;
  const Graph *g = root->g;
  *out_index = -1;
  char list[512], sh[160];
  int *slot = calloc(n > 0 ? (size_t)n : 1, sizeof *slot);
  Binding *bd = calloc(n > 0 ? (size_t)n : 1, sizeof *bd);
  smelt_status st = NULL;
  if (!slot || !bd) st = st_error(ST_NO_MEMORY, "out of memory");
  /* each input alone first, for the message that names it */
  for (int i = 0; i < n && !st; i++) {
    slot[i] = -1;
    for (int k = 0; k < g->ninputs; k++)
      if (strcmp(g->val[g->inputs[k]].name, names[i]) == 0) slot[i] = k;
    if (slot[i] < 0) {
      st = st_error(ST_INVALID_INPUT, "model '%s' has no input named '%s'", g->name, names[i]);
      break;
    }
    TensorType t = shapes[i];
    t.dt = g->val[g->inputs[slot[i]]].type.dt;
    bd[i] = (Binding){.bytes = ir_type_bytes(&t), .bound = true, .shaped = true, .shape = t};
    bool any = false;
    for (int j = 0; j < root->nspecs && !any; j++) any = takes(root->specs[j], true, slot[i], &bd[i]);
    if (!any)
      st = st_error(ST_INVALID_INPUT, "no specialisation of model '%s' takes input '%s' with shape %s; the bundle has %s",
                    g->name, names[i], shape_str(&t, sh, sizeof sh), spec_list(root, list, sizeof list));
  }
  int found = -1, count = 0;
  for (int j = 0; j < root->nspecs && !st; j++) {
    bool ok = true;
    for (int i = 0; i < n && ok; i++) ok = takes(root->specs[j], true, slot[i], &bd[i]);
    if (ok && count++ == 0) found = j;
  }
  if (!st && count == 0)
    st = st_error(ST_INVALID_INPUT, "no specialisation of model '%s' takes these inputs together; the bundle has %s",
                  g->name, spec_list(root, list, sizeof list));
  else if (!st && count > 1)
    st = st_error(ST_INVALID_INPUT, "the inputs given fit %d specialisations of model '%s' (the bundle has %s)", count,
                  g->name, spec_list(root, list, sizeof list));
  free(slot);
  free(bd);
  if (!st) *out_index = found;
  return st;
}

smelt_status smelt_session_select(smelt_session *s, int i) {
  if (i < -1 || i >= s->root->nspecs)
    return st_error(ST_INVALID_INPUT, "smelt_session_select: specialisation %d (the bundle has %d)", i,
                    s->root->nspecs);
  if (i >= 0) RETURN_IF_ERROR(activate(s, i));
  s->pinned = i;
  return NULL;
}

int smelt_session_specialisation(const smelt_session *s) { return s->active; }

/* ---- sessions ---- */

smelt_status smelt_session_create(smelt_bundle *b, const char *device, const smelt_session_options *options,
                                  smelt_session **out_session) {
  *out_session = NULL;
  if (!b) return st_error(ST_INVALID_INPUT, "smelt_session_create: no bundle");
  b = b->root;
  bool cuda;
  int ordinal;
  RETURN_IF_ERROR(parse_device(device, &cuda, &ordinal));
  if (!b->code)
    return st_error(ST_INVALID_INPUT, "%s: the bundle was opened without its machine code", rt_bundle_path(b->file));
  if (!cuda && b->no_cpu) return st_error(ST_UNSUPPORTED, "%s", b->no_cpu);
  if (options && options->threads < 0)
    return st_error(ST_INVALID_INPUT, "smelt_session_create: %d threads", options->threads);
  const Graph *g = b->g;
  smelt_session *s = calloc(1, sizeof *s);
  if (!s) return st_error(ST_NO_MEMORY, "out of memory creating a session");
  s->root = s->b = b;
  s->active = s->pinned = -1;
  s->cuda = cuda;
  s->ordinal = ordinal;
  size_t nin = g->ninputs ? (size_t)g->ninputs : 1, nout = g->noutputs ? (size_t)g->noutputs : 1;
  s->runs = calloc((size_t)b->nspecs, sizeof *s->runs);
  s->made = calloc((size_t)b->nspecs, sizeof *s->made);
  s->in_ptr = calloc(nin, sizeof *s->in_ptr);
  s->out_ptr = calloc(nout, sizeof *s->out_ptr);
  s->in_bind = calloc(nin, sizeof *s->in_bind);
  s->out_bind = calloc(nout, sizeof *s->out_bind);
  smelt_status st = NULL;
  if (!s->runs || !s->made || !s->in_ptr || !s->out_ptr || !s->in_bind || !s->out_bind) {
    st = st_error(ST_NO_MEMORY, "out of memory creating a session");
    goto fail;
  }
  if (cuda) {
    if ((st = rt_cuda_device_create(ordinal, &s->dev))) {
      st = st_prefix(st, "device 'cuda:%d'", ordinal);
      goto fail;
    }
    if (b->nkernels > 0 && !b->cuda) {
      st = st_error(ST_UNSUPPORTED, "%s: error: the bundle has no CUDA kernels (it was compiled for --target cpu; "
                    "compile with --target cuda or cpu,cuda)", rt_bundle_path(b->file));
      goto fail;
    }
  } else if ((st = rt_pool_create(session_threads(b, options), &s->pool))) {
    goto fail;
  }
  /* A bundle of one has nothing to choose: it is chosen now, as before
   * bundles had specialisations. */
  if (b->nspecs == 1 && (st = smelt_session_select(s, 0))) goto fail;
  *out_session = s;
  return NULL;
fail:
  smelt_session_destroy(s);
  return st;
}

void smelt_session_destroy(smelt_session *s) {
  if (!s) return;
  for (int i = 0; s->made && i < s->root->nspecs; i++) {
    if (!s->made[i]) continue;
    s->b = s->root->specs[i];
    s->r = &s->runs[i];
    free_run(s);
  }
  if (s->dev) rt_cuda_device_destroy(s->dev);
  rt_pool_destroy(s->pool);
  free(s->runs);
  free(s->made);
  free(s->in_ptr);
  free(s->out_ptr);
  free(s->in_bind);
  free(s->out_bind);
  free(s);
}

int smelt_session_num_inputs(const smelt_session *s) { return s->b->g->ninputs; }
int smelt_session_num_outputs(const smelt_session *s) { return s->b->g->noutputs; }

/* Before a specialisation is chosen, the dims in which they differ are -1. */
static void tensor_info(const smelt_session *s, bool input, int slot, smelt_tensor_info *out) {
  const Graph *g = s->b->g;
  const Value *val = &g->val[slot_value(g, input, slot)];
  memset(out, 0, sizeof *out);
  out->name = val->name;
  out->dtype = (smelt_dtype)val->type.dt;
  out->rank = val->type.rank;
  for (int i = 0; i < val->type.rank && i < 8; i++) {
    out->dims[i] = val->type.dim[i];
    for (int j = 0; !s->r && j < s->root->nspecs; j++) {
      const Graph *o = s->root->specs[j]->g;
      if (o->val[slot_value(o, input, slot)].type.dim[i] != val->type.dim[i]) out->dims[i] = -1;
    }
  }
}

void smelt_session_input_info(const smelt_session *s, int i, smelt_tensor_info *out_info) {
  tensor_info(s, true, i, out_info);
}

void smelt_session_output_info(const smelt_session *s, int i, smelt_tensor_info *out_info) {
  tensor_info(s, false, i, out_info);
}

/* "x, y" into buf: the names of a list of values, for messages. */
static const char *name_list(const Graph *g, const int *vals, int n, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < n && len + 1 < cap; i++) {
    int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", g->val[vals[i]].name);
    if (w < 0) break;
    len += (size_t)w;
  }
  if (n == 0) snprintf(buf, cap, "none");
  return buf;
}

/* Checks size and alignment of memory bound to value v. */
static smelt_status check_binding(const Graph *g, int v, const char *what, const void *data, size_t bytes) {
  const Value *val = &g->val[v];
  size_t want = ir_type_bytes(&val->type);
  char ty[128];
  if (bytes != want)
    return st_error(ST_INVALID_INPUT, "%s '%s' is %s (%zu bytes); the bound memory has %zu bytes", what, val->name,
                    ir_type_str(&val->type, ty, sizeof ty), want, bytes);
  if (!data && want > 0) return st_error(ST_INVALID_INPUT, "%s '%s': NULL data", what, val->name);
  /* Kernels load whole elements: memory must be aligned to the element size. */
  if (data && (uintptr_t)data % dt_size(val->type.dt) != 0)
    return st_error(ST_INVALID_INPUT, "%s '%s': the bound memory is not aligned to its %zu-byte elements", what,
                    val->name, dt_size(val->type.dt));
  return NULL;
}

/* Binds every slot of that name (the same value may be listed as an
 * output twice). */
static smelt_status bind(smelt_session *s, bool input, const char *name, const void *data, const Binding *bd) {
  const Graph *g = s->b->g; /* names, dtypes and ranks are the same in every specialisation */
  const int *vals = input ? g->inputs : g->outputs;
  int n = input ? g->ninputs : g->noutputs;
  bool found = false;
  for (int i = 0; name && i < n; i++) {
    if (strcmp(g->val[vals[i]].name, name) != 0) continue;
    if (!found) RETURN_IF_ERROR(check_slot(s, input, i, data, bd));
    if (input) {
      s->in_ptr[i] = data;
      s->in_bind[i] = *bd;
    } else {
      s->out_ptr[i] = (void *)data;
      s->out_bind[i] = *bd;
    }
    found = true;
  }
  if (!found) {
    char list[512];
    return st_error(ST_INVALID_INPUT, "no %s named '%s' (the %ss are: %s)", input ? "input" : "output",
                    name ? name : "(null)", input ? "input" : "output", name_list(g, vals, n, list, sizeof list));
  }
  return NULL;
}

smelt_status smelt_session_bind_input(smelt_session *s, const char *name, const void *data, size_t bytes) {
  Binding bd = {.bytes = bytes, .bound = true};
  return bind(s, true, name, data, &bd);
}

smelt_status smelt_session_bind_input_shaped(smelt_session *s, const char *name, const void *data, int rank,
                                             const int64_t *dims, size_t bytes) {
  Binding bd = {.bytes = bytes, .bound = true, .shaped = true};
  if (rank < 0 || rank > IR_MAX_RANK || (rank > 0 && !dims))
    return st_error(ST_INVALID_INPUT, "input '%s': rank %d (expected 0 to %d, with its dims)", name ? name : "(null)",
                    rank, IR_MAX_RANK);
  bd.shape.rank = rank;
  for (int d = 0; d < rank; d++) {
    if (dims[d] < 0) return st_error(ST_INVALID_INPUT, "input '%s': dim %d is %lld", name ? name : "(null)", d, (long long)dims[d]);
    bd.shape.dim[d] = dims[d];
  }
  return bind(s, true, name, data, &bd);
}

smelt_status smelt_session_bind_output(smelt_session *s, const char *name, void *data, size_t bytes) {
  Binding bd = {.bytes = bytes, .bound = true};
  return bind(s, false, name, data, &bd);
}
/* ---- CUDA sessions: running ---- */

/* Gives value v, bound by the user at p (n bytes), its device address: p
 * itself when it is device memory aligned as the kernels assume, else the
 * value's staging buffer. */
static smelt_status cuda_bind(smelt_session *s, int v, const void *p, size_t n) {
  CudaState *cu = s->r->cu;
  if (p && (uintptr_t)p % 64 == 0 && rt_cuda_is_device_pointer(cu->dev, p)) {
    cu->dptr[v] = (RtCudaPtr)(uintptr_t)p;
    cu->staged[v] = false;
    return NULL;
  }
  if (!cu->own[v]) {
    smelt_status st = rt_cuda_alloc(cu->dev, n, &cu->own[v]);
    if (st) return st_prefix(st, "staging buffer of '%s'", s->b->g->val[v].name);
  }
  cu->dptr[v] = cu->own[v];
  cu->staged[v] = true;
  return NULL;
}

static smelt_status cuda_prepare(smelt_session *s) {
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  CudaState *cu = s->r->cu;
  for (int i = 0; i < g->ninputs; i++) {
    int v = g->inputs[i];
    RETURN_IF_ERROR(cuda_bind(s, v, s->in_ptr[i], ir_type_bytes(&g->val[v].type)));
  }
  /* A node result bound to several output slots is computed once, into the
   * first slot's memory; rt_session_finish copies it to the others. */
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    bool first = true;
    for (int j = 0; j < i; j++) first = first && g->outputs[j] != v;
    if (g->val[v].kind == VK_NODE && first)
      RETURN_IF_ERROR(cuda_bind(s, v, s->out_ptr[i], ir_type_bytes(&g->val[v].type)));
  }
  for (int i = 0; i < g->ninputs; i++) {
    int v = g->inputs[i];
    size_t n = ir_type_bytes(&g->val[v].type);
    if (!cu->staged[v] || n == 0) continue;
    smelt_status st = rt_cuda_upload(cu->dev, cu->dptr[v], s->in_ptr[i], n);
    if (st) return st_prefix(st, "input '%s'", g->val[v].name);
  }
  for (int k = 0; k < b->nkernels; k++) {
    const Kernel *kn = &b->kernels[k];
    for (int a = 0; a < kn->nargs; a++) cu->argval[s->r->argv_at[k] + a] = cu->dptr[kn->args[a]];
  }
  return cuda_encode_tmaps(s);
}

static size_t total_args(const smelt_bundle *b) {
  size_t n = 0;
  for (int k = 0; k < b->nkernels; k++) n += (size_t)b->kernels[k].nargs;
  return n;
}

/* Captures the kernel sequence into a CUDA graph, unless the graph held
 * was captured with exactly the current argument addresses. */
static smelt_status cuda_ensure_graph(smelt_session *s) {
  CudaState *cu = s->r->cu;
  size_t n = total_args(s->b);
  if (cu->graph && memcmp(cu->captured, cu->argval, n * sizeof *cu->argval) == 0) return NULL;
  rt_cuda_graph_destroy(cu->graph);
  cu->graph = NULL;
  smelt_status st = rt_cuda_graph_capture(cu->dev, cu->launches, s->b->nkernels, &cu->graph);
  if (st) return st_prefix(st, "%s: capturing the CUDA graph", rt_bundle_path(s->b->file));
  memcpy(cu->captured, cu->argval, n * sizeof *cu->argval);
  return NULL;
}

static smelt_status cuda_finish(smelt_session *s) {
  const Graph *g = s->b->g;
  CudaState *cu = s->r->cu;
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    size_t n = ir_type_bytes(&g->val[v].type);
    if (n == 0 || (uintptr_t)s->out_ptr[i] == cu->dptr[v]) continue;
    smelt_status st = rt_cuda_download(cu->dev, s->out_ptr[i], cu->dptr[v], n);
    if (st) return st_prefix(st, "output '%s'", g->val[v].name);
  }
  return NULL;
}

static smelt_status cuda_run(smelt_session *s) {
  RETURN_IF_ERROR(rt_session_prepare(s));
  CudaState *cu = s->r->cu;
  if (s->b->nkernels > 0) {
    RETURN_IF_ERROR(cuda_ensure_graph(s));
    smelt_status st = rt_cuda_graph_launch(cu->dev, cu->graph);
    if (!st) st = rt_cuda_sync(cu->dev);
    /* A kernel that faults poisons the context: it cannot be found by
     * running the kernels again one by one in this session. */
    if (st)
      return st_prefix(st, "%s: running the CUDA graph of %d kernels (smelt run --check=groups runs them one at a time "
                       "and names the failing one)", rt_bundle_path(s->b->file), s->b->nkernels);
  }
  return cuda_finish(s);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + 1e-6 * (double)ts.tv_nsec;
}

RtCudaDevice *rt_session_cuda_device(smelt_session *s) { return s->dev; }

void rt_session_cuda_loaded(const smelt_session *s, char *buf, size_t cap) {
  int count[3] = {0, 0, 0};
  int nunits = s->r && s->r->cu && s->b->cuda ? s->b->cuda->nunits : 0;
  for (int u = 0; u < nunits; u++) count[s->r->cu->loaded[u]]++;
  snprintf(buf, cap, "%d unit%s: %d from cubins, %d compiled by NVRTC now, %d from PTX", nunits,
           nunits == 1 ? "" : "s", count[RT_CUDA_LOADED_CUBIN], count[RT_CUDA_LOADED_NVRTC], count[RT_CUDA_LOADED_PTX]);
}

smelt_status rt_session_cuda_time_kernels(smelt_session *s, int iters, double *out_ms) {
  CudaState *cu = s->r ? s->r->cu : NULL;
  int nk = s->b->nkernels;
  if (!cu) return st_error(ST_INVALID_INPUT, "rt_session_cuda_time_kernels: not a CUDA session");
  if (nk == 0) return NULL;
  double *one = malloc((size_t)nk * sizeof *one);
  if (!one) return st_error(ST_NO_MEMORY, "out of memory");
  smelt_status st = NULL;
  for (int i = 0; i < iters && !st; i++) {
    st = rt_cuda_time_kernels(cu->dev, cu->launches, nk, 1, one);
    for (int k = 0; k < nk && !st; k++) out_ms[(size_t)k * (size_t)iters + (size_t)i] = one[k];
  }
  free(one);
  return st;
}

smelt_status rt_session_cuda_time_graph(smelt_session *s, int reps, int batch, double *out_ms) {
  CudaState *cu = s->r ? s->r->cu : NULL;
  if (!cu) return st_error(ST_INVALID_INPUT, "rt_session_cuda_time_graph: not a CUDA session");
  if (s->b->nkernels == 0) {
    for (int r = 0; r < reps; r++) out_ms[r] = 0;
    return NULL;
  }
  if (!cu->graph) return st_error(ST_INVALID_INPUT, "rt_session_cuda_time_graph: no graph yet: run the session first");
  if (batch < 1) batch = 1;
  for (int r = 0; r < reps; r++) {
    double t0 = now_ms();
    for (int i = 0; i < batch; i++) RETURN_IF_ERROR(rt_cuda_graph_launch(cu->dev, cu->graph));
    RETURN_IF_ERROR(rt_cuda_sync(cu->dev));
    out_ms[r] = (now_ms() - t0) / batch;
  }
  return NULL;
}

/* ---- running, on either device ---- */

smelt_status rt_session_prepare(smelt_session *s) {
  RETURN_IF_ERROR(choose(s));
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  for (int i = 0; i < g->ninputs; i++)
    if (!s->in_ptr[i] && ir_type_bytes(&g->val[g->inputs[i]].type) > 0)
      return st_error(ST_INVALID_INPUT, "input '%s' is not bound", g->val[g->inputs[i]].name);
  for (int i = 0; i < g->noutputs; i++)
    if (!s->out_ptr[i] && ir_type_bytes(&g->val[g->outputs[i]].type) > 0)
      return st_error(ST_INVALID_INPUT, "output '%s' is not bound", g->val[g->outputs[i]].name);
  /* Bindings made before smelt_session_select chose another
   * specialisation were checked against the ones then possible. */
  for (int i = 0; i < g->ninputs; i++)
    if (s->in_bind[i].bound) RETURN_IF_ERROR(check_against(b, true, i, s->in_ptr[i], &s->in_bind[i]));
  for (int i = 0; i < g->noutputs; i++)
    if (s->out_bind[i].bound) RETURN_IF_ERROR(check_against(b, false, i, s->out_ptr[i], &s->out_bind[i]));
  if (s->r->cu) return cuda_prepare(s);
  /* Outputs first, then inputs and constants over them: a value that is
   * both an input and an output is read from the input, and the output gets
   * a copy in rt_session_finish. */
  for (int i = g->noutputs - 1; i >= 0; i--) s->r->vptr[g->outputs[i]] = s->out_ptr[i];
  for (int i = 0; i < g->ninputs; i++) s->r->vptr[g->inputs[i]] = (void *)s->in_ptr[i];
  for (int k = 0; k < b->nkernels; k++) {
    const Kernel *kn = &b->kernels[k];
    void **argv = s->r->argv + s->r->argv_at[k];
    for (int a = 0; a < kn->nargs; a++) {
      int v = kn->args[a];
      /* The kernel table's validation guarantees a kernel never writes a
       * constant or an input: their memory is only read. */
      argv[a] = g->val[v].kind == VK_CONST ? g->val[v].data : s->r->vptr[v];
    }
  }
  return NULL;
}

typedef struct {
  RtKernelFn fn;
  void *const *args;
} KernelCall;

static void call_kernel(void *ctx, int64_t begin, int64_t end) {
  const KernelCall *c = ctx;
  c->fn(c->args, begin, end);
}

smelt_status rt_session_run_kernel(smelt_session *s, int i) {
  const Kernel *kn = &s->b->kernels[i];
  if (s->r->cu) {
    smelt_status st = rt_cuda_launch(s->r->cu->dev, &s->r->cu->launches[i], 1);
    if (!st) st = rt_cuda_sync(s->r->cu->dev);
    return st ? st_prefix(st, "kernel '%s'", kn->name) : NULL;
  }
  KernelCall c = {.fn = s->b->fns[i], .args = s->r->argv + s->r->argv_at[i]};
  double work = kn->bytes + kn->flops;
  int max_parts = 0;
  if (work > 0) max_parts = work / RT_WORK_PER_THREAD >= 4096 ? 4096 : (int)(work / RT_WORK_PER_THREAD);
  if (work > 0 && max_parts < 1) max_parts = 1;
  rt_pool_parallel_for(s->pool, kn->ntasks, max_parts, call_kernel, &c);
  return NULL;
}

smelt_status rt_session_finish(smelt_session *s) {
  if (s->r->cu) return cuda_finish(s);
  const Graph *g = s->b->g;
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    const void *src = g->val[v].kind == VK_CONST ? g->val[v].data : s->r->vptr[v];
    size_t n = ir_type_bytes(&g->val[v].type);
    if (src != s->out_ptr[i] && n > 0) memmove(s->out_ptr[i], src, n);
  }
  return NULL;
}

smelt_status smelt_session_run(smelt_session *s) {
  if (s->cuda) return cuda_run(s);
  RETURN_IF_ERROR(rt_session_prepare(s));
  for (int k = 0; k < s->b->nkernels; k++) RETURN_IF_ERROR(rt_session_run_kernel(s, k));
  return rt_session_finish(s);
}

void *rt_session_value_data(const smelt_session *s, int v) {
  const Graph *g = s->b->g;
  if (v < 0 || v >= g->nval || !s->r || s->r->cu) return NULL;
  return g->val[v].kind == VK_CONST ? g->val[v].data : s->r->vptr[v];
}

smelt_status rt_session_read_value(smelt_session *s, int v, const void **out_data) {
  *out_data = NULL;
  const Graph *g = s->b->g;
  if (v < 0 || v >= g->nval || !s->r) return NULL;
  if (!s->r->cu || g->val[v].kind == VK_CONST) {
    *out_data = g->val[v].kind == VK_CONST ? g->val[v].data : s->r->vptr[v];
    return NULL;
  }
  CudaState *cu = s->r->cu;
  if (!cu->dptr[v]) return NULL;
  size_t n = ir_type_bytes(&g->val[v].type);
  if (!cu->mirror[v] && !(cu->mirror[v] = malloc(n ? n : 1)))
    return st_error(ST_NO_MEMORY, "out of memory reading '%s'", g->val[v].name);
  smelt_status st = rt_cuda_download(cu->dev, cu->mirror[v], cu->dptr[v], n);
  if (st) return st_prefix(st, "reading '%s' from the device", g->val[v].name);
  *out_data = cu->mirror[v];
  return NULL;
}

const smelt_bundle *rt_session_bundle(const smelt_session *s) { return s->b; }
int rt_session_threads(const smelt_session *s) { return s->pool ? rt_pool_threads(s->pool) : 0; }
