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

struct smelt_bundle {
  RtBundle *file;
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
  void **params;           /* params[i] = &argval[i]: cuLaunchKernel's kernelParams */
  RtCudaLaunch *launches;  /* per kernel */
  RtCudaGraph *graph;      /* NULL: capture on the next run */
  void **mirror;           /* per value: host copy for rt_session_read_value */
} CudaState;

struct smelt_session {
  smelt_bundle *b;
  RtPool *pool;
  void *arena;
  void **own;          /* per value: its own buffer, or NULL */
  void **vptr;         /* per value: where it lives during a run */
  const void **in_ptr; /* per graph input slot: bound memory */
  void **out_ptr;      /* per graph output slot: bound memory */
  void **argv;         /* every kernel's argument pointers, back to back */
  int *argv_at;        /* per kernel: its first entry in argv */
  CudaState *cu;       /* NULL on the CPU */
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
  for (int i = 0; i < b->nmanifest; i++)
    if (strcmp(b->manifest[i].key, key) == 0) return b->manifest[i].value;
  return NULL;
}

const Graph *rt_bundle_graph(const smelt_bundle *b) { return b->g; }
const RtBundle *rt_bundle_file(const smelt_bundle *b) { return b->file; }
int rt_bundle_num_kernels(const smelt_bundle *b) { return b->nkernels; }
const Kernel *rt_bundle_kernel(const smelt_bundle *b, int i) { return &b->kernels[i]; }

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
  if (!rt_bundle_find(b->file, RT_SEC_CPU_OBJECT, NULL, &obj, &len))
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
  if (!rt_bundle_find(b->file, RT_SEC_CUDA_LAUNCH, NULL, &data, &len)) return NULL;
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
    if (!rt_bundle_find(b->file, RT_SEC_CUDA_SOURCE, name, &data, &len))
      return st_error(ST_INVALID_INPUT, "%s: error: no CUDA source for unit %s", path, name);
    if (memchr(data, 0, len))
      return st_error(ST_INVALID_INPUT, "%s: error: CUDA source %s contains a NUL byte", path, name);
    if (!(b->cuda->units[u] = strndup(data, len))) return st_error(ST_NO_MEMORY, "%s: error: out of memory", path);
  }
  return NULL;
}

void smelt_bundle_close(smelt_bundle *b) {
  if (!b) return;
  unload_machine_code(b);
  free(b->fns);
  free(b->no_cpu);
  cg_cuda_module_free(b->cuda);
  rt_kernel_table_free(b->kernels, b->nkernels);
  ir_graph_destroy(b->g);
  for (int i = 0; i < b->nmanifest; i++) {
    free(b->manifest[i].key);
    free(b->manifest[i].value);
  }
  free(b->manifest);
  rt_bundle_close(b->file);
  free(b);
}

/* Everything but the machine code: manifest, graph, kernel table. */
static smelt_status load_bundle(RtBundle *file, bool jit, smelt_bundle **out_bundle) {
  *out_bundle = NULL;
  smelt_bundle *b = calloc(1, sizeof *b);
  if (!b) {
    rt_bundle_close(file);
    return st_error(ST_NO_MEMORY, "out of memory opening a bundle");
  }
  b->file = file;
  const char *path = rt_bundle_path(file);
  const void *data;
  size_t len;
  smelt_status st = NULL;
  if (!rt_bundle_find(file, RT_SEC_MANIFEST, NULL, &data, &len)) {
    st = st_error(ST_INVALID_INPUT, "%s: error: no manifest section", path);
    goto fail;
  }
  if ((st = parse_manifest(b, data, len))) goto fail;
  if (!rt_bundle_find(file, RT_SEC_GRAPH, NULL, &data, &len)) {
    st = st_error(ST_INVALID_INPUT, "%s: error: no graph section", path);
    goto fail;
  }
  if ((st = ir_graph_deserialize(data, len, &b->g))) {
    st = st_prefix(st, "%s: error", path);
    goto fail;
  }
  if (!rt_bundle_find(file, RT_SEC_KERNELS, NULL, &data, &len)) {
    st = st_error(ST_INVALID_INPUT, "%s: error: no kernel table", path);
    goto fail;
  }
  if ((st = rt_kernel_table_decode(data, len, b->g, &b->kernels, &b->nkernels))) {
    st = st_prefix(st, "%s: error", path);
    goto fail;
  }
  if (jit && (st = load_machine_code(b))) goto fail;
  if (jit && (st = load_cuda_table(b))) goto fail;
  b->code = jit;
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
  if (g->arena_bytes > 0 && !(s->arena = aligned_buffer((size_t)g->arena_bytes)))
    return st_error(ST_NO_MEMORY, "out of memory: activation arena of %lld bytes", (long long)g->arena_bytes);
  for (int k = 0; k < b->nkernels; k++) {
    const Kernel *kn = &b->kernels[k];
    for (int a = kn->nargs - kn->nouts; a < kn->nargs; a++) {
      int v = kn->args[a];
      if (is_graph_output(g, v) || s->vptr[v]) continue;
      const Value *val = &g->val[v];
      if (s->arena && val->mem_offset >= 0) {
        s->vptr[v] = (char *)s->arena + val->mem_offset;
        continue;
      }
      if (!(s->own[v] = aligned_buffer(ir_type_bytes(&val->type))))
        return st_error(ST_NO_MEMORY, "out of memory: buffer of '%s'", val->name);
      s->vptr[v] = s->own[v];
    }
  }
  return NULL;
}

/* ---- CUDA sessions: creation ---- */

/* The bundle's compiled forms of unit u: one image per arch with a cubin
 * and/or PTX section named "ARCH/uU". */
static int unit_images(const smelt_bundle *b, int u, RtCudaImage *img, char (*arch)[16], int cap) {
  char suffix[32];
  int n = snprintf(suffix, sizeof suffix, "/u%d", u), count = 0;
  size_t sl = (size_t)n;
  for (int i = 0; i < rt_bundle_section_count(b->file); i++) {
    const RtSection *sec = rt_bundle_section_at(b->file, i);
    if (sec->kind != RT_SEC_CUBIN && sec->kind != RT_SEC_PTX) continue;
    size_t nl = strlen(sec->name);
    if (nl <= sl || nl - sl >= 16 || strcmp(sec->name + nl - sl, suffix) != 0) continue;
    char a[16];
    snprintf(a, sizeof a, "%.*s", (int)(nl - sl), sec->name);
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
  CudaState *cu = s->cu;
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
  CudaState *cu = s->cu;
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

static smelt_status cuda_create(smelt_session *s, int ordinal, size_t nargs) {
  const smelt_bundle *b = s->b;
  size_t nval = (size_t)b->g->nval ? (size_t)b->g->nval : 1;
  CudaState *cu = s->cu = calloc(1, sizeof *cu);
  if (!cu) return st_error(ST_NO_MEMORY, "out of memory creating a session");
  smelt_status st = rt_cuda_device_create(ordinal, &cu->dev);
  if (st) return st_prefix(st, "device 'cuda:%d'", ordinal);
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
  cu->params = calloc(nargs ? nargs : 1, sizeof *cu->params);
  cu->launches = calloc(b->nkernels ? (size_t)b->nkernels : 1, sizeof *cu->launches);
  if (!cu->const_ptr || !cu->own || !cu->dptr || !cu->staged || !cu->mirror || !cu->argval || !cu->captured ||
      !cu->params || !cu->launches)
    return st_error(ST_NO_MEMORY, "out of memory creating a session");
  for (size_t i = 0; i < nargs; i++) cu->params[i] = &cu->argval[i];
  if (b->cuda) RETURN_IF_ERROR(cuda_load_modules(s));
  RETURN_IF_ERROR(cuda_place(s));
  for (int k = 0; k < b->nkernels; k++) {
    const CgCudaLaunch *l = &b->cuda->kernels[k];
    cu->launches[k] = (RtCudaLaunch){.fn = cu->fns[k], .name = l->name, .grid = {l->grid[0], l->grid[1], l->grid[2]},
                                     .block = {l->block[0], l->block[1], l->block[2]}, .smem = l->smem,
                                     .params = cu->params + s->argv_at[k]};
  }
  return NULL;
}

static void cuda_destroy(smelt_session *s) {
  CudaState *cu = s->cu;
  if (!cu) return;
  const Graph *g = s->b->g;
  rt_cuda_graph_destroy(cu->graph);
  if (cu->dev) {
    for (int v = 0; cu->own && v < g->nval; v++) rt_cuda_free(cu->dev, cu->own[v]);
    rt_cuda_free(cu->dev, cu->arena);
    rt_cuda_free(cu->dev, cu->const_block);
    for (int u = 0; cu->mods && u < s->b->cuda->nunits; u++) rt_cuda_module_unload(cu->mods[u]);
    rt_cuda_device_destroy(cu->dev);
  }
  for (int v = 0; cu->mirror && v < g->nval; v++) free(cu->mirror[v]);
  free(cu->mods), free(cu->loaded), free(cu->fns), free(cu->const_ptr), free(cu->own);
  free(cu->dptr), free(cu->staged), free(cu->mirror), free(cu->argval), free(cu->captured), free(cu->params);
  free(cu->launches);
  free(cu);
}

smelt_status smelt_session_create(smelt_bundle *b, const char *device, const smelt_session_options *options,
                                  smelt_session **out_session) {
  *out_session = NULL;
  if (!b) return st_error(ST_INVALID_INPUT, "smelt_session_create: no bundle");
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
  s->b = b;
  size_t nval = (size_t)g->nval, nargs = 0;
  for (int k = 0; k < b->nkernels; k++) nargs += (size_t)b->kernels[k].nargs;
  s->own = calloc(nval ? nval : 1, sizeof *s->own);
  s->vptr = calloc(nval ? nval : 1, sizeof *s->vptr);
  s->in_ptr = calloc(g->ninputs ? (size_t)g->ninputs : 1, sizeof *s->in_ptr);
  s->out_ptr = calloc(g->noutputs ? (size_t)g->noutputs : 1, sizeof *s->out_ptr);
  s->argv = calloc(nargs ? nargs : 1, sizeof *s->argv);
  s->argv_at = calloc(b->nkernels ? (size_t)b->nkernels : 1, sizeof *s->argv_at);
  smelt_status st = NULL;
  if (!s->own || !s->vptr || !s->in_ptr || !s->out_ptr || !s->argv || !s->argv_at) {
    st = st_error(ST_NO_MEMORY, "out of memory creating a session");
    goto fail;
  }
  for (int k = 0, at = 0; k < b->nkernels; k++) {
    s->argv_at[k] = at;
    at += b->kernels[k].nargs;
  }
  if (cuda) {
    if ((st = cuda_create(s, ordinal, nargs))) goto fail;
  } else {
    if ((st = place_intermediates(s))) goto fail;
    if ((st = rt_pool_create(session_threads(b, options), &s->pool))) goto fail;
  }
  *out_session = s;
  return NULL;
fail:
  smelt_session_destroy(s);
  return st;
}

void smelt_session_destroy(smelt_session *s) {
  if (!s) return;
  cuda_destroy(s);
  rt_pool_destroy(s->pool);
  if (s->own)
    for (int v = 0; v < s->b->g->nval; v++) free(s->own[v]);
  free(s->own);
  free(s->arena);
  free(s->vptr);
  free(s->in_ptr);
  free(s->out_ptr);
  free(s->argv);
  free(s->argv_at);
  free(s);
}

int smelt_session_num_inputs(const smelt_session *s) { return s->b->g->ninputs; }
int smelt_session_num_outputs(const smelt_session *s) { return s->b->g->noutputs; }

static void tensor_info(const Graph *g, int v, smelt_tensor_info *out) {
  const Value *val = &g->val[v];
  memset(out, 0, sizeof *out);
  out->name = val->name;
  out->dtype = (smelt_dtype)val->type.dt;
  out->rank = val->type.rank;
  for (int i = 0; i < val->type.rank && i < 8; i++) out->dims[i] = val->type.dim[i];
}

void smelt_session_input_info(const smelt_session *s, int i, smelt_tensor_info *out_info) {
  tensor_info(s->b->g, s->b->g->inputs[i], out_info);
}

void smelt_session_output_info(const smelt_session *s, int i, smelt_tensor_info *out_info) {
  tensor_info(s->b->g, s->b->g->outputs[i], out_info);
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

smelt_status smelt_session_bind_input(smelt_session *s, const char *name, const void *data, size_t bytes) {
  const Graph *g = s->b->g;
  bool found = false;
  for (int i = 0; name && i < g->ninputs; i++) {
    if (strcmp(g->val[g->inputs[i]].name, name) != 0) continue;
    RETURN_IF_ERROR(check_binding(g, g->inputs[i], "input", data, bytes));
    s->in_ptr[i] = data;
    found = true;
  }
  if (!found) {
    char list[512];
    return st_error(ST_INVALID_INPUT, "no input named '%s' (the inputs are: %s)", name ? name : "(null)",
                    name_list(g, g->inputs, g->ninputs, list, sizeof list));
  }
  return NULL;
}

smelt_status smelt_session_bind_output(smelt_session *s, const char *name, void *data, size_t bytes) {
  const Graph *g = s->b->g;
  bool found = false;
  /* The same value may be listed as an output twice: bind every slot. */
  for (int i = 0; name && i < g->noutputs; i++) {
    if (strcmp(g->val[g->outputs[i]].name, name) != 0) continue;
    RETURN_IF_ERROR(check_binding(g, g->outputs[i], "output", data, bytes));
    s->out_ptr[i] = data;
    found = true;
  }
  if (!found) {
    char list[512];
    return st_error(ST_INVALID_INPUT, "no output named '%s' (the outputs are: %s)", name ? name : "(null)",
                    name_list(g, g->outputs, g->noutputs, list, sizeof list));
  }
  return NULL;
}

/* ---- CUDA sessions: running ---- */

/* Gives value v, bound by the user at p (n bytes), its device address: p
 * itself when it is device memory aligned as the kernels assume, else the
 * value's staging buffer. */
static smelt_status cuda_bind(smelt_session *s, int v, const void *p, size_t n) {
  CudaState *cu = s->cu;
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
  CudaState *cu = s->cu;
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
    for (int a = 0; a < kn->nargs; a++) cu->argval[s->argv_at[k] + a] = cu->dptr[kn->args[a]];
  }
  return NULL;
}

static size_t total_args(const smelt_bundle *b) {
  size_t n = 0;
  for (int k = 0; k < b->nkernels; k++) n += (size_t)b->kernels[k].nargs;
  return n;
}

/* Captures the kernel sequence into a CUDA graph, unless the graph held
 * was captured with exactly the current argument addresses. */
static smelt_status cuda_ensure_graph(smelt_session *s) {
  CudaState *cu = s->cu;
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
  CudaState *cu = s->cu;
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
  CudaState *cu = s->cu;
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

RtCudaDevice *rt_session_cuda_device(smelt_session *s) { return s->cu ? s->cu->dev : NULL; }

void rt_session_cuda_loaded(const smelt_session *s, char *buf, size_t cap) {
  int count[3] = {0, 0, 0};
  int nunits = s->cu && s->b->cuda ? s->b->cuda->nunits : 0;
  for (int u = 0; u < nunits; u++) count[s->cu->loaded[u]]++;
  snprintf(buf, cap, "%d unit%s: %d from cubins, %d compiled by NVRTC now, %d from PTX", nunits,
           nunits == 1 ? "" : "s", count[RT_CUDA_LOADED_CUBIN], count[RT_CUDA_LOADED_NVRTC], count[RT_CUDA_LOADED_PTX]);
}

smelt_status rt_session_cuda_time_kernels(smelt_session *s, int iters, double *out_ms) {
  CudaState *cu = s->cu;
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
  CudaState *cu = s->cu;
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
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  for (int i = 0; i < g->ninputs; i++)
    if (!s->in_ptr[i] && ir_type_bytes(&g->val[g->inputs[i]].type) > 0)
      return st_error(ST_INVALID_INPUT, "input '%s' is not bound", g->val[g->inputs[i]].name);
  for (int i = 0; i < g->noutputs; i++)
    if (!s->out_ptr[i] && ir_type_bytes(&g->val[g->outputs[i]].type) > 0)
      return st_error(ST_INVALID_INPUT, "output '%s' is not bound", g->val[g->outputs[i]].name);
  if (s->cu) return cuda_prepare(s);
  /* Outputs first, then inputs and constants over them: a value that is
   * both an input and an output is read from the input, and the output gets
   * a copy in rt_session_finish. */
  for (int i = g->noutputs - 1; i >= 0; i--) s->vptr[g->outputs[i]] = s->out_ptr[i];
  for (int i = 0; i < g->ninputs; i++) s->vptr[g->inputs[i]] = (void *)s->in_ptr[i];
  for (int k = 0; k < b->nkernels; k++) {
    const Kernel *kn = &b->kernels[k];
    void **argv = s->argv + s->argv_at[k];
    for (int a = 0; a < kn->nargs; a++) {
      int v = kn->args[a];
      /* The kernel table's validation guarantees a kernel never writes a
       * constant or an input: their memory is only read. */
      argv[a] = g->val[v].kind == VK_CONST ? g->val[v].data : s->vptr[v];
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
  if (s->cu) {
    smelt_status st = rt_cuda_launch(s->cu->dev, &s->cu->launches[i], 1);
    if (!st) st = rt_cuda_sync(s->cu->dev);
    return st ? st_prefix(st, "kernel '%s'", kn->name) : NULL;
  }
  KernelCall c = {.fn = s->b->fns[i], .args = s->argv + s->argv_at[i]};
  double work = kn->bytes + kn->flops;
  int max_parts = 0;
  if (work > 0) max_parts = work / RT_WORK_PER_THREAD >= 4096 ? 4096 : (int)(work / RT_WORK_PER_THREAD);
  if (work > 0 && max_parts < 1) max_parts = 1;
  rt_pool_parallel_for(s->pool, kn->ntasks, max_parts, call_kernel, &c);
  return NULL;
}

smelt_status rt_session_finish(smelt_session *s) {
  if (s->cu) return cuda_finish(s);
  const Graph *g = s->b->g;
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    const void *src = g->val[v].kind == VK_CONST ? g->val[v].data : s->vptr[v];
    size_t n = ir_type_bytes(&g->val[v].type);
    if (src != s->out_ptr[i] && n > 0) memmove(s->out_ptr[i], src, n);
  }
  return NULL;
}

smelt_status smelt_session_run(smelt_session *s) {
  if (s->cu) return cuda_run(s);
  RETURN_IF_ERROR(rt_session_prepare(s));
  for (int k = 0; k < s->b->nkernels; k++) RETURN_IF_ERROR(rt_session_run_kernel(s, k));
  return rt_session_finish(s);
}

void *rt_session_value_data(const smelt_session *s, int v) {
  const Graph *g = s->b->g;
  if (v < 0 || v >= g->nval || s->cu) return NULL;
  return g->val[v].kind == VK_CONST ? g->val[v].data : s->vptr[v];
}

smelt_status rt_session_read_value(smelt_session *s, int v, const void **out_data) {
  *out_data = NULL;
  const Graph *g = s->b->g;
  if (v < 0 || v >= g->nval) return NULL;
  if (!s->cu || g->val[v].kind == VK_CONST) {
    *out_data = g->val[v].kind == VK_CONST ? g->val[v].data : s->vptr[v];
    return NULL;
  }
  CudaState *cu = s->cu;
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
