/* Running generated CUDA kernels against the reference interpreter.
 *
 * An executor (Exec) runs the kernels of a CgCudaModule: either on a real
 * GPU through runtime/cuda_driver.h (NVRTC for the GPU's arch), or on the
 * CPU through the emulation in cuda_emu.hpp (the units compiled by the host
 * C++ compiler into shared objects).  h_check_graph then:
 *   - lowers the graph, generates its CUDA module,
 *   - gives every value the kernels touch a buffer of its own with guard
 *     regions before and after (filled with 0xA5), optionally offset by a
 *     few bytes so that vector paths must fall back to scalar code,
 *   - uploads inputs (deterministic random data in each input's range) and
 *     constants, launches every kernel in order,
 *   - checks that no guard byte changed, and compares every value a kernel
 *     stored with the interpreter's: NaN where the reference has NaN, the
 *     same infinities, and |x - ref| <= tol * (1 + |ref|) elsewhere, with
 *     tol by dtype (f32 2e-4, f64 1e-9, f16 4e-3, bf16 3e-2; fused f16/bf16
 *     intermediates stay f32 while the reference rounds every node).
 * (h_compare_tensor describes the looser whole-model criterion.)
 * It prints one line per value that fails (at most a few per graph) and
 * returns the number of failures.
 */
#ifndef SMELT_TEST_HARNESS_H
#define SMELT_TEST_HARNESS_H

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/lower.h"
#include "frontend/frontend.h"
#include "ir/interp.h"
#include "passes/passes.h"
#include "runtime/cuda_driver.h"
#include "tests/gpu/op_cases.h"

#define H_GUARD 256
#define H_GUARD_BYTE 0xA5

typedef struct Exec Exec;
struct Exec {
  const char *name;
  smelt_status (*load)(Exec *e, const CgCudaModule *m);
  void (*unload)(Exec *e);
  smelt_status (*alloc)(Exec *e, size_t bytes, uint64_t *out);
  void (*free)(Exec *e, uint64_t p);
  smelt_status (*upload)(Exec *e, uint64_t dst, const void *src, size_t n);
  smelt_status (*download)(Exec *e, void *dst, uint64_t src, size_t n);
  smelt_status (*launch)(Exec *e, int kernel, const uint64_t *args, int nargs);
  smelt_status (*sync)(Exec *e);
  /* state */
  const CgCudaModule *m;
  RtCudaDevice *dev;
  CgNvrtc *nvrtc;
  RtCudaModule **mods;
  RtCudaFunction *fns;
  void **libs;       /* emulation: one shared object per unit */
  char tmpdir[256];  /* emulation: where units are built */
  double load_ms;
};

/* ---- the real GPU ---- */

static inline smelt_status hc_load(Exec *e, const CgCudaModule *m) {
  e->m = m;
  e->mods = calloc((size_t)m->nunits, sizeof *e->mods);
  e->fns = calloc((size_t)(m->nkernels ? m->nkernels : 1), sizeof *e->fns);
  if (!e->mods || !e->fns) return st_error(ST_NO_MEMORY, "out of memory");
  const RtCudaInfo *info = rt_cuda_device_info(e->dev);
  /* every unit for this GPU, in parallel (through the disk cache) */
  const char *arch = info->arch;
  CgCudaBinary *bins = NULL;
  RETURN_IF_ERROR(cg_cuda_compile_module(e->nvrtc, m, &arch, 1, NULL, &bins));
  smelt_status st = NULL;
  for (int u = 0; u < m->nunits && !st; u++) {
    char what[32];
    snprintf(what, sizeof what, "unit%d", u);
    RtCudaImage img = {info->arch, bins[u].cubin, bins[u].cubin_len, bins[u].ptx};
    RtCudaLoadKind kind;
    st = rt_cuda_module_load(e->dev, &img, 1, m->units[u], what, &e->mods[u], &kind);
    if (!st && kind != RT_CUDA_LOADED_CUBIN) st = st_error(ST_INTERNAL, "%s: the cubin for %s was not used", what, info->arch);
  }
  cg_cuda_binaries_free(bins, m->nunits);
  RETURN_IF_ERROR(st);
  for (int i = 0; i < m->nkernels; i++)
    RETURN_IF_ERROR(rt_cuda_module_function(e->mods[m->kernels[i].unit], m->kernels[i].symbol, m->kernels[i].smem, &e->fns[i]));
  return NULL;
}

static inline void hc_unload(Exec *e) {
  if (e->mods)
    for (int u = 0; u < e->m->nunits; u++) rt_cuda_module_unload(e->mods[u]);
  free(e->mods), free(e->fns);
  e->mods = NULL, e->fns = NULL;
}

static inline smelt_status hc_alloc(Exec *e, size_t bytes, uint64_t *out) { return rt_cuda_alloc(e->dev, bytes, out); }
static inline void hc_free(Exec *e, uint64_t p) { rt_cuda_free(e->dev, p); }
static inline smelt_status hc_upload(Exec *e, uint64_t dst, const void *src, size_t n) { return rt_cuda_upload(e->dev, dst, src, n); }
static inline smelt_status hc_download(Exec *e, void *dst, uint64_t src, size_t n) { return rt_cuda_download(e->dev, dst, src, n); }
/* args: the kernel's arguments, then its workspace when it has one (the
 * caller's h_check_graph appends it); TMA descriptors are encoded here
 * from the argument addresses. */
static inline smelt_status hc_launch(Exec *e, int k, const uint64_t *args, int nargs) {
  RtCudaPtr vals[256];
  void *params[256 + CG_MAX_TMAPS];
  _Alignas(64) unsigned char maps[CG_MAX_TMAPS][128];
  if (nargs > 256) return st_error(ST_INTERNAL, "too many arguments");
  for (int i = 0; i < nargs; i++) vals[i] = args[i], params[i] = &vals[i];
  const CgCudaLaunch *l = &e->m->kernels[k];
  for (int t = 0; t < l->ntmaps; t++) {
    const CgCudaTmap *tm = &l->tmaps[t];
    RETURN_IF_ERROR(rt_cuda_tensor_map(e->dev, tm->dtype, tm->rank, args[tm->arg], tm->dims, tm->strides, tm->box,
                                       tm->swizzle, maps[t]));
    params[nargs + t] = maps[t];
  }
  RtCudaLaunch rl = {e->fns[k], l->name, {l->grid[0], l->grid[1], l->grid[2]}, {l->block[0], l->block[1], l->block[2]}, l->smem, params};
  return rt_cuda_launch(e->dev, &rl, 1);
}
static inline smelt_status hc_sync(Exec *e) { return rt_cuda_sync(e->dev); }

/* Opens device 0 and NVRTC; *skip says why there is nothing to test. */
static inline smelt_status h_exec_cuda(Exec *e, const char **skip) {
  memset(e, 0, sizeof *e);
  *skip = NULL;
  e->name = "cuda";
  smelt_status st = rt_cuda_device_create(0, &e->dev);
  if (st && st_code(st) == ST_UNSUPPORTED) {
    static char why[512];
    snprintf(why, sizeof why, "no CUDA device (%s)", st_message(st));
    st_free(st);
    *skip = why;
    return NULL;
  }
  RETURN_IF_ERROR(st);
  RETURN_IF_ERROR(cg_cuda_nvrtc_open(&e->nvrtc));
  e->load = hc_load, e->unload = hc_unload, e->alloc = hc_alloc, e->free = hc_free;
  e->upload = hc_upload, e->download = hc_download, e->launch = hc_launch, e->sync = hc_sync;
  return NULL;
}

static inline void h_exec_close(Exec *e) {
  if (e->dev) rt_cuda_device_destroy(e->dev);
  cg_cuda_nvrtc_close(e->nvrtc);
  if (e->tmpdir[0]) rmdir(e->tmpdir);
  memset(e, 0, sizeof *e);
}

/* ---- the CPU emulation ---- */

static inline smelt_status he_load(Exec *e, const CgCudaModule *m) {
  e->m = m;
  e->libs = calloc((size_t)m->nunits, sizeof *e->libs);
  if (!e->libs) return st_error(ST_NO_MEMORY, "out of memory");
  char cwd[1024];
  if (!getcwd(cwd, sizeof cwd)) return st_error(ST_IO, "getcwd failed");
  for (int u = 0; u < m->nunits; u++) {
    char src[512], so[512], cmd[4096];
    /* a name never used before: dlopen would return a loaded (NODELETE) object of the same name */
    static int serial;
    serial++;
    snprintf(src, sizeof src, "%s/u%d_%d.cpp", e->tmpdir, u, serial);
    snprintf(so, sizeof so, "%s/u%d_%d.so", e->tmpdir, u, serial);
    FILE *fp = fopen(src, "w");
    if (!fp) return st_error(ST_IO, "cannot write %s", src);
    fputs(m->units[u], fp);
    fprintf(fp, "\n// emulation entry points\n");
    for (int i = 0; i < m->nkernels; i++) {
      /* kernels with the same code share one function (module.c): one entry point */
      bool first = true;
      for (int j = 0; j < i && first; j++) first = strcmp(m->kernels[j].symbol, m->kernels[i].symbol) != 0;
      if (m->kernels[i].unit == u && first)
        fprintf(fp, "extern \"C\" void %s__emu(void **args) { smelt_emu_call(%s, args); }\n", m->kernels[i].symbol,
                m->kernels[i].symbol);
    }
    fclose(fp);
    snprintf(cmd, sizeof cmd,
             "c++ -std=c++17 -O1 -w -shared -fPIC -Wl,-Bsymbolic -DSMELT_EMU_IMPLEMENTATION -I%s/tests/gpu/emu_include "
             "-include %s/tests/gpu/cuda_emu.hpp %s -o %s -lpthread 2> %s/err.txt",
             cwd, cwd, src, so, e->tmpdir);
    if (system(cmd) != 0) {
      char err[2048] = "";
      snprintf(cmd, sizeof cmd, "%s/err.txt", e->tmpdir);
      FILE *ef = fopen(cmd, "r");
      if (ef) {
        size_t n = fread(err, 1, sizeof err - 1, ef);
        err[n] = 0;
        fclose(ef);
      }
      return st_error(ST_INTERNAL, "the host C++ compiler rejected emulated unit %d (%s):\n%s", u, src, err);
    }
    snprintf(cmd, sizeof cmd, "%s/err.txt", e->tmpdir);
    unlink(cmd);
    /* NODELETE: the C++ runtime's static allocations must outlive dlclose (LeakSanitizer) */
    e->libs[u] = dlopen(so, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    unlink(so);
    unlink(src);
    if (!e->libs[u]) return st_error(ST_INTERNAL, "dlopen %s: %s", so, dlerror());
  }
  return NULL;
}

static inline void he_unload(Exec *e) {
  if (e->libs)
    for (int u = 0; u < e->m->nunits; u++)
      if (e->libs[u]) dlclose(e->libs[u]);
  free(e->libs);
  e->libs = NULL;
}

static inline smelt_status he_alloc(Exec *e, size_t bytes, uint64_t *out) {
  (void)e;
  void *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!p) return st_error(ST_NO_MEMORY, "out of memory");
  *out = (uint64_t)(uintptr_t)p;
  return NULL;
}
static inline void he_free(Exec *e, uint64_t p) {
  (void)e;
  free((void *)(uintptr_t)p);
}
static inline smelt_status he_upload(Exec *e, uint64_t dst, const void *src, size_t n) {
  (void)e;
  if (n) memcpy((void *)(uintptr_t)dst, src, n);
  return NULL;
}
static inline smelt_status he_download(Exec *e, void *dst, uint64_t src, size_t n) {
  (void)e;
  if (n) memcpy(dst, (const void *)(uintptr_t)src, n);
  return NULL;
}
static inline smelt_status he_launch(Exec *e, int k, const uint64_t *args, int nargs) {
  const CgCudaLaunch *l = &e->m->kernels[k];
  void *lib = e->libs[l->unit];
  char sym[160];
  snprintf(sym, sizeof sym, "%s__emu", l->symbol);
  void (*wrapper)(void **) = (void (*)(void **))dlsym(lib, sym);
  int (*launch)(void (*)(void **), void **, const unsigned *, const unsigned *) =
      (int (*)(void (*)(void **), void **, const unsigned *, const unsigned *))dlsym(lib, "smelt_emu_launch");
  if (!wrapper || !launch) return st_error(ST_INTERNAL, "emulation: %s or smelt_emu_launch missing", sym);
  if (l->ntmaps) return st_error(ST_UNSUPPORTED, "emulation: %s uses TMA descriptors (Hopper only)", l->name);
  void *argv[256];
  for (int i = 0; i < nargs && i < 256; i++) argv[i] = (void *)(uintptr_t)args[i];
  if (launch(wrapper, argv, l->grid, l->block) != 0) return st_error(ST_INTERNAL, "emulation: bad launch of %s", l->name);
  return NULL;
}
static inline smelt_status he_sync(Exec *e) {
  (void)e;
  return NULL;
}

/* Loads the model the test wrote to `path` (then deletes the file) and
 * runs the default pass pipeline; NULL, with the error on stderr after
 * `what`, when either fails. */
static inline Graph *h_load_temp_model(const char *path, const char *what) {
  FeOptions fo = {0};
  Graph *g = NULL;
  smelt_status st = fe_load_yaml(path, &fo, &g);
  unlink(path);
  if (!st) {
    PassCtx ctx = {0};
    st = pass_run_pipeline(g, &ctx, NULL, NULL, NULL);
    pass_ctx_free(&ctx);
  }
  if (st) {
    fprintf(stderr, "%s: %s\n", what, st_message(st));
    st_free(st);
    ir_graph_destroy(g);
    return NULL;
  }
  return g;
}

/* A CPU executor; *skip says why there is none (no C++ compiler). */
static inline smelt_status h_exec_emulated(Exec *e, const char **skip) {
  memset(e, 0, sizeof *e);
  *skip = NULL;
  e->name = "emulated";
  if (system("c++ --version > /dev/null 2>&1") != 0) {
    *skip = "no host C++ compiler (c++) for the CPU emulation";
    return NULL;
  }
  snprintf(e->tmpdir, sizeof e->tmpdir, "/tmp/smelt-emu-XXXXXX");
  if (!mkdtemp(e->tmpdir)) return st_error(ST_IO, "mkdtemp failed");
  e->load = he_load, e->unload = he_unload, e->alloc = he_alloc, e->free = he_free;
  e->upload = he_upload, e->download = he_download, e->launch = he_launch, e->sync = he_sync;
  return NULL;
}

/* ---- data and comparison ---- */

static inline uint64_t h_rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Random data for a value of type t in [lo, hi) (integers: [lo, hi]). */
static inline void *h_random(const TensorType *t, double lo, double hi, uint64_t seed) {
  int64_t n = ir_type_numel(t);
  void *p = calloc((size_t)(n ? n : 1), dt_size(t->dt));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; p && i < n; i++) {
    double u = (double)(h_rng(&s) >> 11) / 9007199254740992.0;
    double v = lo + u * (hi - lo);
    if (dt_is_int(t->dt)) v = floor(lo + u * (hi - lo + 1));
    if (t->dt == DT_BOOL) v = u < 0.5;
    dt_store(t->dt, p, (size_t)i, v);
  }
  return p;
}

static inline double h_tol(DType dt) {
  switch (dt) {
  case DT_F16: return 4e-3;
  case DT_BF16: return 3e-2;
  case DT_F64: return 1e-9;
  case DT_F32: return 2e-4;
  default: return 0;
  }
}

typedef struct {
  int values, elements, failures, guard_failures;
  double worst; /* largest err / (tol * (1 + |ref|)) seen */
} HStats;

/* Compares n elements of dtype dt; returns the index of the first bad one or -1. */
static inline int64_t h_compare(DType dt, DType precision, const void *got, const void *ref, int64_t n, double *worst,
                                double *gv, double *rv) {
  /* a result computed from f16 data is only as exact as f16, whatever its own dtype */
  double tol = h_tol(dt) > h_tol(precision) ? h_tol(dt) : h_tol(precision);
  for (int64_t i = 0; i < n; i++) {
    double a = dt_load(dt, got, (size_t)i), b = dt_load(dt, ref, (size_t)i);
    bool ok;
    if (isnan(b)) ok = isnan(a);
    else if (isinf(b)) ok = a == b;
    else if (isnan(a) || isinf(a)) ok = false;
    else {
      double lim = tol * (1 + fabs(b));
      ok = fabs(a - b) <= lim;
      if (lim > 0 && fabs(a - b) / lim > *worst) *worst = fabs(a - b) / lim;
    }
    if (!ok) {
      *gv = a, *rv = b;
      return i;
    }
  }
  return -1;
}

/* Whole-model comparison: through several layers f16/bf16 rounding
 * differences grow (fused values stay f32, the reference rounds every
 * node), so a model's values are compared as tensors, like `smelt run
 * --check`: the largest error relative to the tensor's largest magnitude,
 * and the cosine similarity (>= 0.999 for f16/bf16).  NaN and infinities
 * must still match element for element. */
static inline bool h_compare_tensor(DType dt, const void *got, const void *ref, int64_t n, double *out_rel, double *out_cos) {
  double tol = dt == DT_F16 ? 2e-2 : dt == DT_BF16 ? 8e-2 : dt == DT_F64 ? 1e-9 : dt == DT_F32 ? 1e-4 : 0;
  double mincos = dt == DT_F16 || dt == DT_BF16 ? 0.999 : 0.99999;
  double maxref = 0, maxerr = 0, dot = 0, na = 0, nb = 0;
  bool ok = true;
  for (int64_t i = 0; i < n; i++) {
    double a = dt_load(dt, got, (size_t)i), b = dt_load(dt, ref, (size_t)i);
    if (isnan(b) || isinf(b)) {
      ok = ok && (isnan(b) ? isnan(a) : a == b);
      continue;
    }
    if (isnan(a) || isinf(a)) {
      ok = false;
      continue;
    }
    maxref = fabs(b) > maxref ? fabs(b) : maxref;
    maxerr = fabs(a - b) > maxerr ? fabs(a - b) : maxerr;
    dot += a * b, na += a * a, nb += b * b;
  }
  double rel = maxerr / (maxref > 1e-30 ? maxref : 1e-30);
  double cos = na > 0 && nb > 0 ? dot / sqrt(na * nb) : (na == nb ? 1 : 0);
  *out_rel = rel;
  *out_cos = cos;
  return ok && (maxerr == 0 || rel <= tol) && (maxerr == 0 || cos >= mincos);
}

/* Runs g on e and compares with the interpreter.  inputs: per input value
 * in op-suite order (OcInput ranges) or NULL for [-1, 1).  offset: bytes
 * added to every buffer (0: 256-byte aligned). */
static inline int h_check_graph(Exec *e, Graph *g, const OpSuite *ranges, const CgCudaOptions *opt, size_t offset,
                                bool whole_model, const char *what, HStats *stats) {
  int failures = 0;
#define H_FAIL(...)                                          \
  do {                                                       \
    if (failures < 12) {                                     \
      fprintf(stderr, "%s [%s]: ", what, e->name);           \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
    }                                                        \
    failures++;                                              \
  } while (0)
  smelt_status st = NULL;
  if (g->ngroups == 0) st = cg_single_node_groups(g);
  Kernel *k = NULL;
  int nk = 0;
  if (!st) st = cg_lower(g, &k, &nk);
  CgCudaModule *m = NULL;
  if (!st) st = cg_cuda_generate(g, k, nk, opt, &m);
  if (st) {
    H_FAIL("%s", st_message(st));
    st_free(st);
    cg_kernels_free(k, nk);
    return failures;
  }
  /* the reference */
  Interp *it = NULL;
  void **data = calloc((size_t)g->nval, sizeof(void *));
  st = ir_interp_create(g, &it);
  for (int i = 0; i < g->ninputs && !st; i++) {
    int v = g->inputs[i];
    double lo = -1, hi = 1;
    if (ranges)
      for (int j = 0; j < ranges->nin; j++)
        if (ranges->in[j].value == v) lo = ranges->in[j].lo, hi = ranges->in[j].hi;
    data[v] = h_random(&g->val[v].type, lo, hi, (uint64_t)v + 7);
    st = ir_interp_set_input(it, v, data[v]);
  }
  if (!st) st = ir_interp_run(it);
  if (st) {
    H_FAIL("reference: %s", st_message(st));
    st_free(st);
    goto done;
  }
  /* device buffers with guards */
  uint64_t *buf = calloc((size_t)g->nval, sizeof(uint64_t));
  bool *stored = calloc((size_t)g->nval, sizeof(bool));
  st = e->load(e, m);
  for (int i = 0; i < nk && !st; i++)
    for (int a = 0; a < k[i].nargs && !st; a++) {
      int v = k[i].args[a];
      if (a >= k[i].nargs - k[i].nouts) stored[v] = true;
      if (buf[v]) continue;
      size_t bytes = ir_type_bytes(&g->val[v].type), total = bytes + 2 * H_GUARD + offset;
      st = e->alloc(e, total, &buf[v]);
      unsigned char *pat = malloc(total);
      if (!st && pat) {
        memset(pat, H_GUARD_BYTE, total);
        const void *src = g->val[v].kind == VK_CONST ? g->val[v].data : g->val[v].kind == VK_INPUT ? data[v] : NULL;
        if (src && bytes) memcpy(pat + H_GUARD + offset, src, bytes);
        st = e->upload(e, buf[v], pat, total);
      }
      free(pat);
    }
  /* one zeroed workspace of the largest size serves every kernel: each
   * leaves it zero (CgCudaLaunch.workspace) */
  uint64_t ws = 0, ws_bytes = 0;
  for (int i = 0; i < nk; i++)
    if (m->kernels[i].workspace > ws_bytes) ws_bytes = m->kernels[i].workspace;
  if (!st && ws_bytes) {
    unsigned char *zero = calloc(1, (size_t)ws_bytes);
    st = zero ? e->alloc(e, (size_t)ws_bytes, &ws) : st_error(ST_NO_MEMORY, "out of memory");
    if (!st) st = e->upload(e, ws, zero, (size_t)ws_bytes);
    free(zero);
  }
  for (int i = 0; i < nk && !st; i++) {
    uint64_t args[257];
    int na = k[i].nargs < 256 ? k[i].nargs : 256;
    for (int a = 0; a < na; a++) args[a] = buf[k[i].args[a]] + H_GUARD + offset;
    if (m->kernels[i].workspace) args[na++] = ws;
    st = e->launch(e, i, args, na);
    if (!st) st = e->sync(e);
    if (st) st = st_prefix(st, "kernel %s", k[i].name);
  }
  if (st) {
    H_FAIL("%s", st_message(st));
    st_free(st);
  } else {
    for (int v = 0; v < g->nval; v++) {
      if (!stored[v]) continue;
      const TensorType *t = &g->val[v].type;
      size_t bytes = ir_type_bytes(t), total = bytes + 2 * H_GUARD + offset;
      unsigned char *host = malloc(total);
      if (!host) continue;
      st = e->download(e, host, buf[v], total);
      if (st) {
        H_FAIL("download '%s': %s", g->val[v].name, st_message(st));
        st_free(st);
        free(host);
        continue;
      }
      for (size_t b = 0; b < total; b++)
        if ((b < H_GUARD + offset || b >= H_GUARD + offset + bytes) && host[b] != H_GUARD_BYTE) {
          H_FAIL("'%s': guard byte %zd %s the tensor was overwritten", g->val[v].name,
                 b < H_GUARD + offset ? (ssize_t)(H_GUARD + offset - b) : (ssize_t)(b - H_GUARD - offset - bytes + 1),
                 b < H_GUARD + offset ? "before" : "after");
          if (stats) stats->guard_failures++;
          break;
        }
      const void *ref = ir_interp_value(it, v);
      if (whole_model && ref) {
        double rel, cos;
        if (!h_compare_tensor(t->dt, host + H_GUARD + offset, ref, ir_type_numel(t), &rel, &cos))
          H_FAIL("'%s': max error %.3g of the largest magnitude, cosine %.6f", g->val[v].name, rel, cos);
        if (stats) stats->values++, stats->elements += (int)ir_type_numel(t);
        free(host);
        continue;
      }
      double gv = 0, rv = 0;
      int64_t bad = ref ? h_compare(t->dt, ranges ? ranges->dt : t->dt, host + H_GUARD + offset, ref, ir_type_numel(t), stats ? &stats->worst : &gv, &gv, &rv) : -2;
      if (bad == -2) H_FAIL("'%s': the reference did not compute it", g->val[v].name);
      else if (bad >= 0) {
        char ts[128];
        ir_type_str(t, ts, sizeof ts);
        H_FAIL("'%s' %s: element %lld is %.9g, reference %.9g", g->val[v].name, ts, (long long)bad, gv, rv);
      }
      if (stats) stats->values++, stats->elements += (int)ir_type_numel(t);
      free(host);
    }
  }
  e->unload(e);
  for (int v = 0; v < g->nval; v++)
    if (buf[v]) e->free(e, buf[v]);
  if (ws) e->free(e, ws);
  free(buf), free(stored);
done:
  for (int v = 0; v < g->nval; v++) free(data[v]);
  free(data);
  ir_interp_destroy(it);
  cg_cuda_module_free(m);
  cg_kernels_free(k, nk);
  if (stats) stats->failures += failures;
  return failures;
#undef H_FAIL
}

#endif
