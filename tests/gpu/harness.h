/* Running generated CUDA kernels against the reference interpreter.
 *
 * An executor (Exec) runs the kernels of a FmtCudaModule: either on a real
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
#include "tests/unit/check.h"

#define H_GUARD 256
#define H_GUARD_BYTE 0xA5

typedef struct Exec Exec;
struct Exec {
  const char *name;
  smelt_status (*load)(Exec *e, const FmtCudaModule *m);
  void (*unload)(Exec *e);
  smelt_status (*alloc)(Exec *e, size_t bytes, uint64_t *out);
  void (*free)(Exec *e, uint64_t p);
  smelt_status (*upload)(Exec *e, uint64_t dst, const void *src, size_t n);
  smelt_status (*download)(Exec *e, void *dst, uint64_t src, size_t n);
  smelt_status (*launch)(Exec *e, int kernel, const uint64_t *args, int nargs);
  smelt_status (*sync)(Exec *e);
  /* state */
  const FmtCudaModule *m;
  RtCudaDevice *dev;
  CgNvrtc *nvrtc;
  RtCudaModule **mods;
  RtCudaFunction *fns;
  void **libs;       /* emulation: one shared object per unit */
  char tmpdir[256];  /* emulation: where units are built */
  double load_ms;
};

/* ---- the real GPU ---- */

static inline smelt_status hc_load(Exec *e, const FmtCudaModule *m) {
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
  void *params[256 + FMT_MAX_TMAPS];
  _Alignas(64) unsigned char maps[FMT_MAX_TMAPS][128];
  if (nargs > 256) return st_error(ST_INTERNAL, "too many arguments");
  for (int i = 0; i < nargs; i++) vals[i] = args[i], params[i] = &vals[i];
  const FmtCudaLaunch *l = &e->m->kernels[k];
  for (int t = 0; t < l->ntmaps; t++) {
    const FmtCudaTmap *tm = &l->tmaps[t];
    RETURN_IF_ERROR(rt_cuda_tensor_map(e->dev, tm->dtype, tm->rank, args[tm->arg], tm->dims, tm->strides, tm->box,
                                       tm->swizzle, maps[t]));
    params[nargs + t] = maps[t];
  }
  RtCudaLaunch rl = {e->fns[k], l->name, {l->grid[0], l->grid[1], l->grid[2]}, {l->block[0], l->block[1], l->block[2]}, l->smem, params, false, NULL, NULL};
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

static inline smelt_status he_load(Exec *e, const FmtCudaModule *m) {
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
  const FmtCudaLaunch *l = &e->m->kernels[k];
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
 * runs the default pass pipeline for `target` (NULL: none named; "cuda":
 * the CUDA-only rules, merge-matmuls, prologues and layout epilogues);
 * NULL, with the error on stderr after `what`, when either fails. */
static inline Graph *h_load_temp_model_for(const char *path, const char *what, const char *target) {
  FeOptions fo = {0};
  Graph *g = NULL;
  smelt_status st = fe_load_yaml(path, &fo, &g);
  unlink(path);
  if (!st) {
    PassCtx ctx = {.target = target};
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

static inline Graph *h_load_temp_model(const char *path, const char *what) {
  return h_load_temp_model_for(path, what, NULL);
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

/* sqrt(sum (got - ref)^2 / sum ref^2), the reference as floats (reff) or
 * doubles (refd); INFINITY when got has a NaN. */
static inline double h_rel_l2(const float *got, const float *reff, const double *refd, int64_t n) {
  double e = 0, r = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(got[i])) return INFINITY;
    double b = refd ? refd[i] : (double)reff[i];
    double d = (double)got[i] - b;
    e += d * d, r += b * b;
  }
  return r > 0 ? sqrt(e / r) : sqrt(e);
}

/* A model of `count` matmuls mm<i> = x @ w<i> (each B an input, so no
 * pass changes its layout; A given as [K, M] when ta, B as [N, K] when
 * tb; batch 0: rank-2 operands), each followed by the epilogue `epi`
 * ("bias_silu", "gelu_res", "mul": relu * r, or "": neg) giving y<i>,
 * the outputs; `name` names the model and its temporary file. */
static inline Graph *h_matmul_model(const char *name, const char *dt, int64_t batch, int64_t M, int64_t K, int64_t N,
                                    bool ta, bool tb, const char *epi, int count) {
  char path[64];
  snprintf(path, sizeof path, "/tmp/smelt-%s-XXXXXX", name);
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "w");
  char bat[32] = "";
  if (batch) snprintf(bat, sizeof bat, "%lld, ", (long long)batch);
  fprintf(fp, "smelt: 1\nname: %s\nseed: 3\ndtype: %s\ninputs:\n  x: {shape: [%s%lld, %lld]}\n", name, dt, bat,
          (long long)(ta ? K : M), (long long)(ta ? M : K));
  fprintf(fp, "  bias: {shape: [%lld]}\n  r: {shape: [%lld]}\n", (long long)N, (long long)N);
  for (int i = 0; i < count; i++)
    fprintf(fp, "  w%d: {shape: [%s%lld, %lld]}\n", i, bat, (long long)(tb ? N : K), (long long)(tb ? K : N));
  fprintf(fp, "nodes:\n");
  for (int i = 0; i < count; i++) {
    fprintf(fp, "  - {out: mm%d, op: matmul, in: [x, w%d]%s%s}\n", i, i, ta ? ", transpose_a: true" : "",
            tb ? ", transpose_b: true" : "");
    if (!strcmp(epi, "bias_silu"))
      fprintf(fp, "  - {out: e%d, op: add, in: [mm%d, bias]}\n  - {out: y%d, op: silu, in: [e%d]}\n", i, i, i, i);
    else if (!strcmp(epi, "gelu_res"))
      fprintf(fp, "  - {out: e%d, op: gelu, in: [mm%d]}\n  - {out: y%d, op: add, in: [e%d, r]}\n", i, i, i, i);
    else if (!strcmp(epi, "mul"))
      fprintf(fp, "  - {out: e%d, op: relu, in: [mm%d]}\n  - {out: y%d, op: mul, in: [e%d, r]}\n", i, i, i, i);
    else fprintf(fp, "  - {out: y%d, op: neg, in: [mm%d]}\n", i, i);
  }
  fprintf(fp, "outputs: [");
  for (int i = 0; i < count; i++) fprintf(fp, "%sy%d", i ? ", " : "", i);
  fprintf(fp, "]\n");
  fclose(fp);
  char what[64];
  snprintf(what, sizeof what, "%s model", name);
  return h_load_temp_model(path, what);
}

/* One matmul y0 = x [za?, M, K] @ w [zb?, K, N] (B given as [zb?, N, K]
 * with transpose_b when tb; za, zb 0: no batch dim), both inputs, then
 * the epilogue `epi`: "" (none), "bias_silu" (bias [N] param, silu) or
 * "res" (+ r of the result's shape); `seed` seeds the bias. */
static inline Graph *h_batched_matmul_model(unsigned seed, const char *dt, int64_t za, int64_t zb, int64_t M,
                                            int64_t K, int64_t N, const char *epi, bool tb) {
  char path[] = "/tmp/smelt-wg-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "w");
  char as[64], bs[64], rs[64];
  int64_t zr = za > zb ? za : zb;
  if (za) snprintf(as, sizeof as, "[%lld, %lld, %lld]", (long long)za, (long long)M, (long long)K);
  else snprintf(as, sizeof as, "[%lld, %lld]", (long long)M, (long long)K);
  int64_t r0 = tb ? N : K, r1 = tb ? K : N;
  if (zb) snprintf(bs, sizeof bs, "[%lld, %lld, %lld]", (long long)zb, (long long)r0, (long long)r1);
  else snprintf(bs, sizeof bs, "[%lld, %lld]", (long long)r0, (long long)r1);
  if (zr) snprintf(rs, sizeof rs, "[%lld, %lld, %lld]", (long long)zr, (long long)M, (long long)N);
  else snprintf(rs, sizeof rs, "[%lld, %lld]", (long long)M, (long long)N);
  fprintf(fp, "smelt: 1\nname: wg\nseed: %u\ndtype: %s\ninputs:\n  x: {shape: %s}\n  w: {shape: %s}\n", seed, dt, as,
          bs);
  if (!strcmp(epi, "res")) fprintf(fp, "  r: {shape: %s}\n", rs);
  fprintf(fp, "params:\n  bias: {shape: [%lld], init: {normal: 0.5}}\nnodes:\n", (long long)N);
  fprintf(fp, "  - {out: y0, op: matmul, in: [x, w]%s}\n", tb ? ", transpose_b: true" : "");
  const char *last = "y0";
  if (!strcmp(epi, "bias_silu")) {
    fprintf(fp, "  - {out: y1, op: add, in: [y0, bias]}\n  - {out: y2, op: silu, in: [y1]}\n");
    last = "y2";
  } else if (!strcmp(epi, "res")) {
    fprintf(fp, "  - {out: y1, op: add, in: [y0, r]}\n");
    last = "y1";
  }
  fprintf(fp, "outputs: [%s]\n", last);
  fclose(fp);
  return h_load_temp_model(path, "batched matmul model");
}

/* The index i of the matmul "mm<i>" kernel k computes, or -1. */
static inline int h_matmul_index(const Graph *g, const Kernel *k) {
  int count;
  int a = cg_group_anchor(g, &g->groups[k->group], &count);
  if (a < 0 || g->node[a].op != OP_MATMUL) return -1;
  const char *name = g->val[g->node[a].out[0]].name;
  return strncmp(name, "mm", 2) == 0 ? atoi(name + 2) : -1;
}

/* Appends tok to toks[0..*n) unless it is there or max are. */
static inline void h_add_token(char (*toks)[CG_VARIANT_LEN], int *n, int max, const char *tok) {
  for (int i = 0; i < *n; i++)
    if (!strcmp(toks[i], tok)) return;
  if (*n >= max) return;
  size_t len = 0;
  while (len < CG_VARIANT_LEN - 1 && tok[len]) len++;
  memcpy(toks[*n], tok, len);
  toks[(*n)++][len] = 0;
}

/* force[i] for each kernel of g (calloc'd; NULL after an error, in *st):
 * the token toks[j] of the matmul mm<j> it computes, NULL for others. */
static inline const char **h_force_table(Graph *g, char (*toks)[CG_VARIANT_LEN], int *out_nk, smelt_status *st) {
  Kernel *k = NULL;
  int nk = 0;
  *st = cg_lower(g, &k, &nk);
  if (*st) return NULL;
  const char **force = calloc((size_t)(nk ? nk : 1), sizeof *force);
  for (int i = 0; i < nk && force; i++) {
    int mi = h_matmul_index(g, &k[i]);
    force[i] = mi >= 0 ? toks[mi] : NULL;
  }
  cg_kernels_free(k, nk);
  *out_nk = nk;
  return force;
}

/* The unit tests' NVRTC: opened with its cache in a fresh directory dir
 * (a mkdtemp template); NULL, after a SKIP line, where it is missing. */
static inline CgNvrtc *h_nvrtc_open(char *dir, CgCudaCompileOptions *copts, bool *dir_ok) {
  *dir_ok = mkdtemp(dir) != NULL;
  copts->cache_dir = dir;
  copts->no_cache = true;
  CgNvrtc *nv = NULL;
  smelt_status st = cg_cuda_nvrtc_open(&nv);
  if (st) {
    char line[600];
    snprintf(line, sizeof line, "NVRTC not available (%s): variants are generated and emulated but not compiled",
             st_message(st));
    check_skip_part("nvrtc", line);
    st_free(st);
    return NULL;
  }
  return nv;
}

/* Generates g's kernels k[0..nk) with opt, checks through same(forced,
 * used, arch) that every forced kernel recorded its token, and compiles
 * the module with nv (when not NULL) for opt->arch.  Returns the number of
 * failures (each printed, prefixed by what). */
static inline int h_generate_and_compile(CgNvrtc *nv, const CgCudaCompileOptions *copts, Graph *g, const Kernel *k,
                                         int nk, const CgCudaOptions *opt, const char *what,
                                         bool (*same)(const char *forced, const char *used, const char *arch)) {
  int failures = 0;
  const char *arch = opt->arch;
  FmtCudaModule *m = NULL;
  smelt_status st = cg_cuda_generate(g, k, nk, opt, &m);
  if (st) {
    fprintf(stderr, "%s (%s): %s\n", what, arch, st_message(st));
    st_free(st);
    failures++;
  }
  for (int i = 0; m && i < m->nkernels; i++)
    if (opt->force[i] && !same(opt->force[i], m->kernels[i].variant, arch)) {
      fprintf(stderr, "%s (%s): kernel %s was forced to %s but used %s\n", what, arch, m->kernels[i].name, opt->force[i],
              m->kernels[i].variant);
      failures++;
    }
  if (m && nv) {
    CgCudaBinary *bins = NULL;
    st = cg_cuda_compile_module(nv, m, &arch, 1, copts, &bins);
    if (st) {
      fprintf(stderr, "%s (%s): %s\n", what, arch, st_message(st));
      st_free(st);
      failures++;
    } else {
      for (int u = 0; u < m->nunits; u++)
        if (bins[u].cubin_len == 0) fprintf(stderr, "%s (%s): unit %d compiled to nothing\n", what, arch, u), failures++;
      cg_cuda_binaries_free(bins, m->nunits);
    }
  }
  fmt_cuda_module_free(m);
  return failures;
}

/* Random inputs of g in [-1, 1) (or per input the range `ranges` gives;
 * seed: the value + 7) into data[v], run through the interpreter *it. */
static inline smelt_status h_interp_random(Graph *g, const OpSuite *ranges, void **data, Interp **it) {
  smelt_status st = ir_interp_create(g, it);
  for (int i = 0; i < g->ninputs && !st; i++) {
    int v = g->inputs[i];
    double lo = -1, hi = 1;
    if (ranges)
      for (int j = 0; j < ranges->nin; j++)
        if (ranges->in[j].value == v) lo = ranges->in[j].lo, hi = ranges->in[j].hi;
    data[v] = h_random(&g->val[v].type, lo, hi, (uint64_t)v + 7);
    const TensorType *t = &g->val[v].type;
    if (!ranges && dt_is_int(t->dt) && data[v]) {
      /* integers without a range are positions or ids: 0, 1, 2, ... along
       * the last axis (as smelt run makes them), valid for rope, scatter,
       * cache attention and gather */
      int64_t n = ir_type_numel(t), last = t->rank && t->dim[t->rank - 1] ? t->dim[t->rank - 1] : 1;
      for (int64_t j = 0; j < n; j++) dt_store(t->dt, data[v], (size_t)j, (double)(j % last));
    }
    st = ir_interp_set_input(*it, v, data[v]);
  }
  /* state tensors start with data too, so that the rows a scatter leaves
   * alone are compared (the device buffer holds the same) */
  for (int i = 0; i < g->nstates && !st; i++) {
    int v = g->states[i];
    data[v] = h_random(&g->val[v].type, -1, 1, (uint64_t)v + 7);
    st = ir_interp_set_input(*it, v, data[v]);
  }
  if (!st) st = ir_interp_run(*it);
  return st;
}

/* A buffer buf[v] for every value the kernels k[0..nk) touch, H_GUARD
 * bytes of H_GUARD_BYTE before and after (and `offset` bytes more before),
 * holding the value's constant data or input data[v]; stored[v]: some
 * kernel writes v. */
static inline smelt_status h_upload_guarded(Exec *e, const Graph *g, const Kernel *k, int nk, void *const *data,
                                            size_t offset, uint64_t *buf, bool *stored) {
  smelt_status st = NULL;
  for (int i = 0; i < nk && !st; i++)
    for (int pass = 0; pass < 2; pass++)
    for (int a = 0; a < k[i].nargs && !st; a++) {
      int v = k[i].args[a];
      /* the result of a scatter into a state lives in the state's buffer,
       * as in a session (runtime/cuda_session.c): the states first */
      int sv = ir_state_of(g, v);
      bool is_state = sv == v, in_state = sv >= 0 && sv != v;
      if (pass == 0 && !is_state) continue;
      if (pass == 1 && is_state) continue;
      if (a >= k[i].nargs - k[i].nouts) stored[v] = true;
      if (in_state) {
        buf[v] = buf[sv]; /* the state is an argument of the same kernel: allocated in pass 0 */
        continue;
      }
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
  return st;
}

/* Downloads value v's buffer (as h_upload_guarded made it) into *host
 * (malloc'd, guards included; the value at H_GUARD + offset); *guard: the
 * first overwritten guard byte (negative: before the value, 1-based), 0
 * when none. */
static inline smelt_status h_download_guarded(Exec *e, const Graph *g, int v, uint64_t buf, size_t offset,
                                              unsigned char **host, ssize_t *guard) {
  size_t bytes = ir_type_bytes(&g->val[v].type), total = bytes + 2 * H_GUARD + offset;
  *guard = 0;
  *host = malloc(total);
  if (!*host) return st_error(ST_NO_MEMORY, "out of memory");
  RETURN_IF_ERROR(e->download(e, *host, buf, total));
  for (size_t b = 0; b < total; b++)
    if ((b < H_GUARD + offset || b >= H_GUARD + offset + bytes) && (*host)[b] != H_GUARD_BYTE) {
      *guard = b < H_GUARD + offset ? -(ssize_t)(H_GUARD + offset - b) : (ssize_t)(b - H_GUARD - offset - bytes + 1);
      break;
    }
  return NULL;
}

/* Buffers of h_upload_guarded and inputs of h_interp_random: freed. */
static inline void h_free_guarded(Exec *e, const Graph *g, uint64_t *buf, bool *stored, void **data) {
  for (int v = 0; v < g->nval; v++) {
    if (buf && buf[v] && !(ir_state_of(g, v) >= 0 && ir_state_of(g, v) != v)) e->free(e, buf[v]); /* aliases: once */
    if (data) free(data[v]);
  }
  free(buf), free(stored), free(data);
}

/* A CUDA test's start: device 0 and NVRTC opened into *e, the device
 * printed.  Returns -1 to go on, else the exit status (CHECK_SKIPPED after
 * a SKIP line without a device). */
static inline int h_cuda_test_start(Exec *e, const char *test) {
  const char *skip = NULL;
  smelt_status st = h_exec_cuda(e, &skip);
  if (st) {
    fprintf(stderr, "%s: %s\n", test, st_message(st));
    st_free(st);
    return 1;
  }
  if (skip) {
    printf("SKIP: %s\n", skip);
    return CHECK_SKIPPED;
  }
  const RtCudaInfo *info = rt_cuda_device_info(e->dev);
  printf("device %d: %s (%s, %d SMs), NVRTC %s\n", info->ordinal, info->name, info->arch, info->sm_count,
         cg_cuda_nvrtc_version(e->nvrtc));
  return -1;
}

/* What the kernels k[0..nk) of m take after their arguments
 * (format/cuda_launch.h): *rng, with ranged dims, each range of g at rv[r]
 * (rv NULL: at its max); *ws, one zeroed workspace of the largest size,
 * which serves every kernel since each leaves it zero.  0 where none. */
static inline smelt_status h_kernel_scratch(Exec *e, const Graph *g, const FmtCudaModule *m, int nk, const int64_t *rv,
                                            uint64_t *rng, uint64_t *ws) {
  *rng = *ws = 0;
  if (g->nranges) {
    int64_t vals[IR_MAX_RANGES] = {0};
    for (int r = 0; r < g->nranges; r++) vals[r] = rv ? rv[r] : g->ranges[r].max;
    RETURN_IF_ERROR(e->alloc(e, sizeof vals, rng));
    RETURN_IF_ERROR(e->upload(e, *rng, vals, sizeof vals));
  }
  uint64_t ws_bytes = 0;
  for (int i = 0; i < nk; i++)
    if (m->kernels[i].workspace > ws_bytes) ws_bytes = m->kernels[i].workspace;
  if (!ws_bytes) return NULL;
  unsigned char *zero = calloc(1, (size_t)ws_bytes);
  smelt_status st = zero ? e->alloc(e, (size_t)ws_bytes, ws) : st_error(ST_NO_MEMORY, "out of memory");
  if (!st) st = e->upload(e, *ws, zero, (size_t)ws_bytes);
  free(zero);
  return st;
}

/* Runs the kernels k[0..nk) of m one after another, each on the buffers
 * of h_upload_guarded (buf[v] + H_GUARD + offset), then rng and ws as it
 * takes them (h_kernel_scratch). */
static inline smelt_status h_launch_all(Exec *e, const Kernel *k, int nk, const FmtCudaModule *m, const uint64_t *buf,
                                        size_t offset, uint64_t rng, uint64_t ws) {
  for (int i = 0; i < nk; i++) {
    uint64_t args[258];
    int na = k[i].nargs < 256 ? k[i].nargs : 256;
    for (int a = 0; a < na; a++) args[a] = buf[k[i].args[a]] + H_GUARD + offset;
    if (rng) args[na++] = rng;
    if (m->kernels[i].workspace) args[na++] = ws;
    smelt_status st = e->launch(e, i, args, na);
    if (!st) st = e->sync(e);
    if (st) return st_prefix(st, "kernel %s", k[i].name);
  }
  return NULL;
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
  FmtCudaModule *m = NULL;
  /* the emulation compiles the kernels' host side (CgCudaOptions.emulation) */
  CgCudaOptions o = opt ? *opt : (CgCudaOptions){0};
  o.emulation = e->load == he_load;
  if (!st) st = cg_cuda_generate(g, k, nk, &o, &m);
  if (st) {
    H_FAIL("%s", st_message(st));
    st_free(st);
    cg_kernels_free(k, nk);
    return failures;
  }
  /* the reference */
  Interp *it = NULL;
  void **data = calloc((size_t)g->nval, sizeof(void *));
  st = h_interp_random(g, ranges, data, &it);
  if (st) {
    H_FAIL("reference: %s", st_message(st));
    st_free(st);
    goto done;
  }
  /* device buffers with guards */
  uint64_t *buf = calloc((size_t)g->nval, sizeof(uint64_t));
  bool *stored = calloc((size_t)g->nval, sizeof(bool));
  st = e->load(e, m);
  if (!st) st = h_upload_guarded(e, g, k, nk, data, offset, buf, stored);
  uint64_t ws = 0, rng = 0;
  if (!st) st = h_kernel_scratch(e, g, m, nk, NULL, &rng, &ws);
  if (!st) st = h_launch_all(e, k, nk, m, buf, offset, rng, ws);
  if (st) {
    H_FAIL("%s", st_message(st));
    st_free(st);
  } else {
    for (int v = 0; v < g->nval; v++) {
      if (!stored[v]) continue;
      const TensorType *t = &g->val[v].type;
      unsigned char *host = NULL;
      ssize_t guard = 0;
      st = h_download_guarded(e, g, v, buf[v], offset, &host, &guard);
      if (st) {
        H_FAIL("download '%s': %s", g->val[v].name, st_message(st));
        st_free(st);
        free(host);
        continue;
      }
      if (guard) {
        H_FAIL("'%s': guard byte %zd %s the tensor was overwritten", g->val[v].name, guard < 0 ? -guard : guard,
               guard < 0 ? "before" : "after");
        if (stats) stats->guard_failures++;
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
    if (buf[v] && !(ir_state_of(g, v) >= 0 && ir_state_of(g, v) != v)) e->free(e, buf[v]); /* aliases: once */
  if (ws) e->free(e, ws);
  if (rng) e->free(e, rng);
  free(buf), free(stored);
done:
  for (int v = 0; v < g->nval; v++) free(data[v]);
  free(data);
  ir_interp_destroy(it);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
  if (stats) stats->failures += failures;
  return failures;
#undef H_FAIL
}

#endif
