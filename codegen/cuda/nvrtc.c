/* NVRTC, the CUDA run-time compiler, reached through dlopen: smelt builds
 * and runs without CUDA, and a machine without NVRTC only loses the CUDA
 * target.  Every entry point lives in one symbol table (CgNvrtc), resolved
 * once when the library is opened.
 *
 * One NVRTC program per (compilation unit, arch): compiling with
 * --gpu-architecture=sm_XX yields both the cubin and the PTX it was made
 * from, so one compile gives both (measured: NVRTC 13 returns the PTX of an
 * sm_ target).  The units of a module and the archs compile in parallel on
 * a few pthreads; NVRTC programs are independent, so nothing is shared but
 * the read-only symbol table.  Results go through the disk cache (cache.c).
 *
 * Options: the arch, C++17, and -I of the CUDA include directory, which
 * cuda_fp16.h / cuda_bf16.h need under NVRTC (FIELD-NOTES.md); the
 * directory is found when NVRTC is opened.  SMELT_NVRTC names the library
 * to load instead of the default search (and nothing else is tried), which
 * is how tests exercise the "no NVRTC" path.  The library is opened with
 * RTLD_NODELETE: NVRTC carries a C++ runtime whose static allocations would
 * otherwise be unmapped while still allocated (LeakSanitizer reports them).
 */
#define _GNU_SOURCE /* dladdr, RTLD_NODELETE */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "codegen/cuda/cu_cache.h"

typedef int nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *nvrtcProgram;

struct CgNvrtc {
  void *lib;
  char version[16];
  char include_dir[1024];
  const char *(*GetErrorString)(nvrtcResult);
  nvrtcResult (*Version)(int *, int *);
  nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                               const char *const *);
  nvrtcResult (*DestroyProgram)(nvrtcProgram *);
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetPTX)(nvrtcProgram, char *);
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
};

static bool file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* A directory that has cuda_fp16.h, or false. */
static bool try_include(CgNvrtc *nv, const char *dir) {
  if (!dir || !dir[0]) return false;
  char p[1100];
  snprintf(p, sizeof p, "%s/cuda_fp16.h", dir);
  if (!file_exists(p)) return false;
  snprintf(nv->include_dir, sizeof nv->include_dir, "%s", dir);
  return true;
}

static void find_include(CgNvrtc *nv) {
  char buf[1100];
  const char *envs[] = {"CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"};
  for (size_t i = 0; i < sizeof envs / sizeof *envs; i++) {
    const char *e = getenv(envs[i]);
    if (e && e[0]) {
      snprintf(buf, sizeof buf, "%s/include", e);
      if (try_include(nv, buf)) return;
    }
  }
  if (try_include(nv, "/usr/local/cuda/include")) return;
  /* next to the library: <root>/lib64/libnvrtc.so -> <root>/include; a pip
   * wheel keeps the headers in a sibling package (nvidia/cuda_runtime) */
  Dl_info info;
  if (dladdr((void *)nv->CreateProgram, &info) && info.dli_fname) {
    char lib[1024];
    snprintf(lib, sizeof lib, "%s", info.dli_fname);
    char *slash = strrchr(lib, '/');
    if (slash) {
      *slash = 0;
      snprintf(buf, sizeof buf, "%s/../include", lib);
      if (try_include(nv, buf)) return;
      snprintf(buf, sizeof buf, "%s/../../cuda_runtime/include", lib);
      if (try_include(nv, buf)) return;
    }
  }
  nv->include_dir[0] = 0;
}

smelt_status cg_cuda_nvrtc_open(CgNvrtc **out_nvrtc) {
  *out_nvrtc = NULL;
  CgNvrtc *nv = calloc(1, sizeof *nv);
  if (!nv) return st_error(ST_NO_MEMORY, "out of memory opening NVRTC");
  const char *forced = getenv("SMELT_NVRTC");
  if (forced && forced[0]) {
    nv->lib = dlopen(forced, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  } else {
    const char *names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2",
                           "/usr/local/cuda/lib64/libnvrtc.so", NULL};
    char home[1100];
    const char *ch = getenv("CUDA_HOME");
    for (int i = 0; names[i] && !nv->lib; i++) nv->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!nv->lib && ch && ch[0]) {
      snprintf(home, sizeof home, "%s/lib64/libnvrtc.so", ch);
      nv->lib = dlopen(home, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    }
  }
  if (!nv->lib) {
    free(nv);
    return st_error(ST_UNSUPPORTED, "no NVRTC (libnvrtc.so not found%s%s): CUDA kernels cannot be compiled here",
                    forced && forced[0] ? "; SMELT_NVRTC=" : "", forced && forced[0] ? forced : "");
  }
  struct {
    void **slot;
    const char *name;
  } syms[] = {
      {(void **)&nv->GetErrorString, "nvrtcGetErrorString"},
      {(void **)&nv->Version, "nvrtcVersion"},
      {(void **)&nv->CreateProgram, "nvrtcCreateProgram"},
      {(void **)&nv->DestroyProgram, "nvrtcDestroyProgram"},
      {(void **)&nv->CompileProgram, "nvrtcCompileProgram"},
      {(void **)&nv->GetPTXSize, "nvrtcGetPTXSize"},
      {(void **)&nv->GetPTX, "nvrtcGetPTX"},
      {(void **)&nv->GetCUBINSize, "nvrtcGetCUBINSize"},
      {(void **)&nv->GetCUBIN, "nvrtcGetCUBIN"},
      {(void **)&nv->GetProgramLogSize, "nvrtcGetProgramLogSize"},
      {(void **)&nv->GetProgramLog, "nvrtcGetProgramLog"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
    *syms[i].slot = dlsym(nv->lib, syms[i].name);
    if (!*syms[i].slot) {
      smelt_status st = st_error(ST_UNSUPPORTED, "NVRTC library lacks %s (too old?)", syms[i].name);
      dlclose(nv->lib);
      free(nv);
      return st;
    }
  }
  int major = 0, minor = 0;
  if (nv->Version(&major, &minor) != 0) {
    dlclose(nv->lib);
    free(nv);
    return st_error(ST_UNSUPPORTED, "nvrtcVersion failed");
  }
  snprintf(nv->version, sizeof nv->version, "%d.%d", major, minor);
  find_include(nv);
  *out_nvrtc = nv;
  return NULL;
}

void cg_cuda_nvrtc_close(CgNvrtc *nv) {
  if (!nv) return;
  if (nv->lib) dlclose(nv->lib);
  free(nv);
}

const char *cg_cuda_nvrtc_version(const CgNvrtc *nv) { return nv->version; }
const char *cg_cuda_nvrtc_include_dir(const CgNvrtc *nv) { return nv->include_dir; }

void cg_cuda_binary_clear(CgCudaBinary *b) {
  free(b->cubin);
  free(b->ptx);
  memset(b, 0, sizeof *b);
}

void cg_cuda_binaries_free(CgCudaBinary *b, int n) {
  if (!b) return;
  for (int i = 0; i < n; i++) cg_cuda_binary_clear(&b[i]);
  free(b);
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* The program log, trimmed: a long log is mostly repetition. */
static char *program_log(CgNvrtc *nv, nvrtcProgram p) {
  size_t n = 0;
  if (nv->GetProgramLogSize(p, &n) != 0 || n == 0) return NULL;
  char *log = malloc(n + 1);
  if (!log) return NULL;
  if (nv->GetProgramLog(p, log) != 0) {
    free(log);
    return NULL;
  }
  log[n] = 0;
  if (n > 8000) strcpy(log + 7980, "\n... (log truncated)");
  return log;
}

smelt_status cg_cuda_compile_source(CgNvrtc *nv, const char *source, const char *what, const char *arch,
                                    const CgCudaCompileOptions *o, CgCudaBinary *out) {
  memset(out, 0, sizeof *out);
  int cc;
  if (!ir_cuda_parse_arch(arch, &cc, NULL) || strlen(arch) >= sizeof out->arch)
    return st_error(ST_INVALID_INPUT, "'%s' is not a CUDA arch (expected sm_90a, sm_80, compute_80, ...)", arch);
  snprintf(out->arch, sizeof out->arch, "%s", arch);
  char archopt[64], incopt[1100];
  snprintf(archopt, sizeof archopt, "--gpu-architecture=%s", arch);
  const char *opts[4];
  int nopts = 0;
  opts[nopts++] = archopt;
  opts[nopts++] = "--std=c++17";
  /* the key leaves out the include path: where the toolkit lives does not
   * change the code, its version (NVRTC's, in the key) does */
  char key[65];
  cu_cache_key(source, opts, nopts, arch, nv->version, key);
  if (nv->include_dir[0]) {
    snprintf(incopt, sizeof incopt, "-I%s", nv->include_dir);
    opts[nopts++] = incopt;
  }
  char *dir = o && o->no_cache ? NULL : cg_cuda_cache_dir(o);
  if (dir && cu_cache_read(dir, key, out)) {
    out->cache_hit = true;
    free(dir);
    return NULL;
  }
  double t0 = now_ms();
  nvrtcProgram p = NULL;
  nvrtcResult r = nv->CreateProgram(&p, source, what ? what : "smelt.cu", 0, NULL, NULL);
  if (r != 0) {
    free(dir);
    return st_error(ST_INTERNAL, "nvrtcCreateProgram (%s): %s", what ? what : "smelt.cu", nv->GetErrorString(r));
  }
  r = nv->CompileProgram(p, nopts, opts);
  if (r != 0) {
    char *log = program_log(nv, p);
    smelt_status st = st_error(ST_INTERNAL, "NVRTC failed to compile %s for %s: %s%s%s%s", what ? what : "smelt.cu",
                               arch, nv->GetErrorString(r), log ? "\n" : "", log ? log : "",
                               !nv->include_dir[0] && log && strstr(log, "cuda_fp16.h")
                                   ? "\n(no CUDA include directory found: set CUDA_HOME)"
                                   : "");
    free(log);
    nv->DestroyProgram(&p);
    free(dir);
    return st;
  }
  size_t ncubin = 0, nptx = 0;
  smelt_status st = NULL;
  if (nv->GetPTXSize(p, &nptx) != 0 || nptx == 0) {
    st = st_error(ST_INTERNAL, "NVRTC produced no PTX for %s (%s)", what ? what : "smelt.cu", arch);
  } else {
    out->ptx = malloc(nptx + 1);
    if (!out->ptx || nv->GetPTX(p, out->ptx) != 0) st = st_error(ST_INTERNAL, "nvrtcGetPTX failed for %s", arch);
    else out->ptx[nptx] = 0, out->ptx_len = strlen(out->ptx);
  }
  /* compute_XX targets give PTX only (FIELD-NOTES.md) */
  if (!st && nv->GetCUBINSize(p, &ncubin) == 0 && ncubin > 0) {
    out->cubin = malloc(ncubin);
    if (!out->cubin || nv->GetCUBIN(p, out->cubin) != 0) st = st_error(ST_INTERNAL, "nvrtcGetCUBIN failed for %s", arch);
    else out->cubin_len = ncubin;
  }
  nv->DestroyProgram(&p);
  out->compile_ms = now_ms() - t0;
  if (st) {
    cg_cuda_binary_clear(out);
  } else if (dir) {
    cu_cache_write(dir, key, out);
  }
  free(dir);
  return st;
}

/* ---- a module in parallel ---- */

typedef struct {
  CgNvrtc *nv;
  const FmtCudaModule *m;
  const char *const *archs;
  int narch, njobs, next;
  const CgCudaCompileOptions *o;
  CgCudaBinary *out;
  smelt_status *st;
  pthread_mutex_t mu;
} Jobs;

static void *worker(void *arg) {
  Jobs *j = arg;
  for (;;) {
    pthread_mutex_lock(&j->mu);
    int i = j->next++;
    pthread_mutex_unlock(&j->mu);
    if (i >= j->njobs) return NULL;
    int u = i / j->narch, a = i % j->narch;
    char what[64];
    snprintf(what, sizeof what, "unit%d.cu", u);
    j->st[i] = cg_cuda_compile_source(j->nv, j->m->units[u], what, j->archs[a], j->o, &j->out[i]);
  }
}

static int cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > 64 ? 64 : (int)n;
}

smelt_status cg_cuda_compile_module(CgNvrtc *nv, const FmtCudaModule *m, const char *const *archs, int narch,
                                    const CgCudaCompileOptions *o, CgCudaBinary **out) {
  *out = NULL;
  for (int u = 0; u < m->nunits; u++)
    if (!m->units[u]) return st_error(ST_INVALID_INPUT, "CUDA module: unit %d has no source", u);
  int njobs = m->nunits * narch;
  CgCudaBinary *bins = calloc((size_t)(njobs ? njobs : 1), sizeof *bins);
  smelt_status *sts = calloc((size_t)(njobs ? njobs : 1), sizeof *sts);
  if (!bins || !sts) {
    free(bins), free(sts);
    return st_error(ST_NO_MEMORY, "out of memory compiling CUDA kernels");
  }
  Jobs j = {nv, m, archs, narch, njobs, 0, o, bins, sts, PTHREAD_MUTEX_INITIALIZER};
  int nthreads = o && o->threads > 0 ? o->threads : cpu_count();
  if (nthreads > njobs) nthreads = njobs;
  pthread_t *tids = calloc((size_t)(nthreads ? nthreads : 1), sizeof *tids);
  int started = 0;
  if (tids)
    for (int t = 1; t < nthreads; t++) {
      if (pthread_create(&tids[t], NULL, worker, &j) != 0) break;
      started++;
    }
  worker(&j); /* the caller works too; with no threads started it does everything */
  for (int t = 1; t <= started; t++) pthread_join(tids[t], NULL);
  free(tids);
  pthread_mutex_destroy(&j.mu);
  smelt_status first = NULL;
  for (int i = 0; i < njobs; i++) {
    if (sts[i] && !first) first = sts[i];
    else if (sts[i]) st_free(sts[i]);
  }
  free(sts);
  if (first) {
    cg_cuda_binaries_free(bins, njobs);
    return first;
  }
  *out = bins;
  return NULL;
}
