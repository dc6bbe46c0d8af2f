/* Bundles and sessions: the public API of include/smelt.h on the CPU.
 *
 * Opening a bundle validates the file (runtime/bundle.c), rebuilds the
 * optimised graph from its serialised form (ir/serialize.c, which runs the
 * verifier), decodes the kernel table and checks it against the graph
 * (driver.c), and hands the CPU object to the JIT linker once; every kernel
 * is looked up by name.  Nothing is optimised again: the object is machine
 * code and only needs linking.  After open the bundle is read-only, which is
 * what lets several sessions on several threads share it.
 *
 * A session owns what one run mutates: the thread pool, the activation
 * memory and the bindings.  Intermediates (values passed between kernels
 * that are not graph outputs) live in one 64-byte-aligned arena at the
 * offsets plan-memory chose (Value.mem_offset), or each in a buffer of its
 * own when the graph has no plan (arena_bytes == 0) or the value was left
 * out of it.  Inputs and outputs live in the user's memory.  A run resolves
 * the pointer of every value once (rt_session_prepare), fills each
 * kernel's argument array from it, and calls the kernels in table order,
 * each split over the pool by task ranges.
 *
 * A small kernel is not worth waking threads for: a kernel gets at most one
 * thread per RT_WORK_PER_THREAD units of estimated work (bytes + flops),
 * so the microsecond-sized kernels of a small model run on the caller alone.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/llvm/cg_llvm.h"
#include "include/smelt.h"
#include "ir/serialize.h"
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
};

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

#ifdef SMELT_HAVE_LLVM
static smelt_status load_machine_code(smelt_bundle *b) {
  const char *path = rt_bundle_path(b->file);
  const void *obj;
  size_t len;
  if (b->nkernels == 0) return NULL;
  if (!rt_bundle_find(b->file, RT_SEC_CPU_OBJECT, NULL, &obj, &len))
    return st_error(ST_UNSUPPORTED, "%s: error: the bundle has no CPU machine code (it was compiled for other targets)",
                    path);
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
  return st_error(ST_UNSUPPORTED, "%s: error: this smelt was built without LLVM (SMELT_LLVM=OFF) and cannot load "
                  "CPU code", rt_bundle_path(b->file));
}

static void unload_machine_code(smelt_bundle *b) { (void)b; }
#endif

void smelt_bundle_close(smelt_bundle *b) {
  if (!b) return;
  unload_machine_code(b);
  free(b->fns);
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

/* "cpu" is this backend; "cuda" and "cuda:N" name a backend not built here;
 * anything else is a typo. */
static smelt_status check_device(const char *device) {
  if (!device || strcmp(device, "cpu") == 0) return NULL;
  if (strcmp(device, "cuda") == 0 || strncmp(device, "cuda:", 5) == 0)
    return st_error(ST_UNSUPPORTED, "device '%s': this build of smelt has no CUDA runtime yet; use device 'cpu'",
                    device);
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

smelt_status smelt_session_create(smelt_bundle *b, const char *device, const smelt_session_options *options,
                                  smelt_session **out_session) {
  *out_session = NULL;
  if (!b) return st_error(ST_INVALID_INPUT, "smelt_session_create: no bundle");
  RETURN_IF_ERROR(check_device(device));
  if (b->nkernels > 0 && !b->fns)
    return st_error(ST_INVALID_INPUT, "%s: the bundle was opened without its machine code", rt_bundle_path(b->file));
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
  if ((st = place_intermediates(s))) goto fail;
  if ((st = rt_pool_create(session_threads(b, options), &s->pool))) goto fail;
  *out_session = s;
  return NULL;
fail:
  smelt_session_destroy(s);
  return st;
}

void smelt_session_destroy(smelt_session *s) {
  if (!s) return;
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

smelt_status rt_session_prepare(smelt_session *s) {
  const smelt_bundle *b = s->b;
  const Graph *g = b->g;
  for (int i = 0; i < g->ninputs; i++)
    if (!s->in_ptr[i] && ir_type_bytes(&g->val[g->inputs[i]].type) > 0)
      return st_error(ST_INVALID_INPUT, "input '%s' is not bound", g->val[g->inputs[i]].name);
  for (int i = 0; i < g->noutputs; i++)
    if (!s->out_ptr[i] && ir_type_bytes(&g->val[g->outputs[i]].type) > 0)
      return st_error(ST_INVALID_INPUT, "output '%s' is not bound", g->val[g->outputs[i]].name);
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

void rt_session_run_kernel(smelt_session *s, int i) {
  const Kernel *kn = &s->b->kernels[i];
  KernelCall c = {.fn = s->b->fns[i], .args = s->argv + s->argv_at[i]};
  double work = kn->bytes + kn->flops;
  int max_parts = 0;
  if (work > 0) max_parts = work / RT_WORK_PER_THREAD >= 4096 ? 4096 : (int)(work / RT_WORK_PER_THREAD);
  if (work > 0 && max_parts < 1) max_parts = 1;
  rt_pool_parallel_for(s->pool, kn->ntasks, max_parts, call_kernel, &c);
}

void rt_session_finish(smelt_session *s) {
  const Graph *g = s->b->g;
  for (int i = 0; i < g->noutputs; i++) {
    int v = g->outputs[i];
    const void *src = g->val[v].kind == VK_CONST ? g->val[v].data : s->vptr[v];
    size_t n = ir_type_bytes(&g->val[v].type);
    if (src != s->out_ptr[i] && n > 0) memmove(s->out_ptr[i], src, n);
  }
}

smelt_status smelt_session_run(smelt_session *s) {
  RETURN_IF_ERROR(rt_session_prepare(s));
  for (int k = 0; k < s->b->nkernels; k++) rt_session_run_kernel(s, k);
  rt_session_finish(s);
  return NULL;
}

void *rt_session_value_data(const smelt_session *s, int v) {
  const Graph *g = s->b->g;
  if (v < 0 || v >= g->nval) return NULL;
  return g->val[v].kind == VK_CONST ? g->val[v].data : s->vptr[v];
}

const smelt_bundle *rt_session_bundle(const smelt_session *s) { return s->b; }
int rt_session_threads(const smelt_session *s) { return rt_pool_threads(s->pool); }
