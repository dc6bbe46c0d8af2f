/* NCCL through dlopen: see runtime/nccl.h. */
#define _GNU_SOURCE
#include "runtime/nccl.h"

#include <dlfcn.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* nccl.h's types, as far as they are used here (a stable ABI since 2.0). */
typedef int ncclResult_t; /* ncclSuccess = 0 */
typedef struct ncclComm *ncclComm_t;
enum { NCCL_INT8 = 0, NCCL_INT32 = 2, NCCL_INT64 = 4, NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8,
       NCCL_BFLOAT16 = 9, NCCL_SUM = 0 };

typedef struct {
  ncclResult_t (*GetVersion)(int *);
  ncclResult_t (*CommInitAll)(ncclComm_t *, int, const int *);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*AllReduce)(const void *, void *, size_t, int, int, ncclComm_t, void *);
  ncclResult_t (*AllGather)(const void *, void *, size_t, int, ncclComm_t, void *);
  const char *(*GetErrorString)(ncclResult_t);
  const char *(*GetLastError)(ncclComm_t); /* NCCL 2.13+; may be NULL */
} NcclApi;

struct RtNccl {
  void *lib;
  NcclApi api;
  int n;
  ncclComm_t *comms;
  char desc[600];
};

static smelt_status nccl_error(const RtNccl *g, ncclResult_t r, const char *call, int rank) {
  const char *why = g->api.GetErrorString ? g->api.GetErrorString(r) : "unknown error";
  const char *last = g->api.GetLastError && g->comms && rank >= 0 ? g->api.GetLastError(g->comms[rank]) : NULL;
  return st_error(ST_INTERNAL, "NCCL: %s failed%s: %s (%d)%s%s", call, rank >= 0 ? " on a rank" : "", why, r,
                  last && *last ? ": " : "", last && *last ? last : "");
}

/* Opens path and resolves the table; NULL when either fails. */
static void *try_open(const char *path, NcclApi *api) {
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!lib) return NULL;
  struct {
    void **slot;
    const char *name;
  } syms[] = {
      {(void **)&api->GetVersion, "ncclGetVersion"},     {(void **)&api->CommInitAll, "ncclCommInitAll"},
      {(void **)&api->CommDestroy, "ncclCommDestroy"},   {(void **)&api->AllReduce, "ncclAllReduce"},
      {(void **)&api->AllGather, "ncclAllGather"},       {(void **)&api->GetErrorString, "ncclGetErrorString"},
  };
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
    if (!(*syms[i].slot = dlsym(lib, syms[i].name))) {
      dlclose(lib);
      return NULL;
    }
  api->GetLastError = (const char *(*)(ncclComm_t))dlsym(lib, "ncclGetLastError");
  return lib;
}

/* The library, in the order runtime/nccl.h gives; *tried lists the places
 * looked at when none was found. */
static void *find_library(NcclApi *api, char *where, size_t cap, char *tried, size_t tcap) {
  const char *env = getenv("SMELT_NCCL_LIBRARY");
  if (env && *env) {
    snprintf(where, cap, "%s", env);
    snprintf(tried, tcap, "SMELT_NCCL_LIBRARY=%s", env);
    return try_open(env, api);
  }
  void *lib = try_open("libnccl.so.2", api);
  if (lib) {
    snprintf(where, cap, "libnccl.so.2");
    return lib;
  }
  char venv[512] = "";
  const char *ve = getenv("VIRTUAL_ENV");
  if (ve && *ve && strlen(ve) < 400) snprintf(venv, sizeof venv, "%s/lib/python3*/site-packages", ve);
  const char *patterns[] = {venv,
                            "/opt/*/.venv/lib/python3*/site-packages",
                            "/opt/*/lib/python3*/site-packages",
                            "/usr/local/lib/python3*/dist-packages",
                            "/usr/local/lib/python3*/site-packages",
                            "/usr/lib/python3*/dist-packages",
                            "/root/.pyenv/versions/*/lib/python3*/site-packages"};
  snprintf(tried, tcap, "libnccl.so.2 on the loader's path, nvidia/nccl/lib/ of the Python packages");
  for (size_t i = 0; i < sizeof patterns / sizeof *patterns; i++) {
    if (!patterns[i][0]) continue;
    char pat[640];
    snprintf(pat, sizeof pat, "%s/nvidia/nccl/lib/libnccl.so.2", patterns[i]);
    glob_t gl;
    if (glob(pat, 0, NULL, &gl) != 0) continue;
    for (size_t j = 0; j < gl.gl_pathc; j++)
      if ((lib = try_open(gl.gl_pathv[j], api))) {
        snprintf(where, cap, "%s", gl.gl_pathv[j]);
        globfree(&gl);
        return lib;
      }
    globfree(&gl);
  }
  return NULL;
}

smelt_status rt_nccl_create(int n, const int *ordinals, RtNccl **out_group) {
  *out_group = NULL;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++)
      if (ordinals[i] == ordinals[j])
        return st_error(ST_INVALID_INPUT, "NCCL: ranks %d and %d are both on cuda:%d (NCCL takes one rank per GPU)", j,
                        i, ordinals[i]);
  RtNccl *g = calloc(1, sizeof *g);
  if (!g) return st_error(ST_NO_MEMORY, "out of memory");
  char where[512], tried[512];
  g->lib = find_library(&g->api, where, sizeof where, tried, sizeof tried);
  if (!g->lib) {
    free(g);
    return st_error(ST_UNSUPPORTED, "no NCCL library (looked for %s); install the nvidia-nccl wheel or set "
                    "SMELT_NCCL_LIBRARY to libnccl.so.2's path", tried);
  }
  int v = 0;
  g->api.GetVersion(&v);
  /* 2.9+: 10000 * major + 100 * minor + patch; before, 1000 * major + ... */
  int major = v >= 10000 ? v / 10000 : v / 1000, minor = v >= 10000 ? v / 100 % 100 : v / 100 % 10;
  snprintf(g->desc, sizeof g->desc, "NCCL %d.%d.%d (%s)", major, minor, v % 100, where);
  if (v < 20900) { /* graph capture of collectives */
    smelt_status st = st_error(ST_UNSUPPORTED, "%s: NCCL 2.9 or later is needed (CUDA graph capture)", g->desc);
    free(g);
    return st;
  }
  /* the machines' rule (runtime/nccl.h), unless the caller chose; and
   * every connection made now, at init (NCCL 2.22+ makes them at a
   * collective's first use by default, which for a session is inside the
   * capture of its CUDA graph) */
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  g->n = n;
  if (!(g->comms = calloc((size_t)n, sizeof *g->comms))) {
    free(g);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  ncclResult_t r = g->api.CommInitAll(g->comms, n, ordinals);
  if (r != 0) {
    smelt_status st = nccl_error(g, r, "ncclCommInitAll", -1);
    free(g->comms);
    free(g);
    return st;
  }
  *out_group = g;
  return NULL;
}

void rt_nccl_destroy(RtNccl *g) {
  if (!g) return;
  for (int i = 0; i < g->n; i++)
    if (g->comms[i]) g->api.CommDestroy(g->comms[i]);
  free(g->comms);
  free(g);
}

const char *rt_nccl_describe(const RtNccl *g) { return g ? g->desc : "no NCCL"; }

static int nccl_type(DType dt) {
  switch (dt) {
  case DT_F32: return NCCL_FLOAT32;
  case DT_F16: return NCCL_FLOAT16;
  case DT_BF16: return NCCL_BFLOAT16;
  case DT_F64: return NCCL_FLOAT64;
  case DT_I32: return NCCL_INT32;
  case DT_I64: return NCCL_INT64;
  default: return -1;
  }
}

smelt_status rt_nccl_all_reduce(RtNccl *g, int rank, const void *in, void *out, size_t count, DType dt, void *stream) {
  int t = nccl_type(dt);
  if (t < 0) return st_error(ST_UNSUPPORTED, "NCCL: all_reduce of %s", dt_name(dt));
  if (rank < 0 || rank >= g->n) return st_error(ST_INTERNAL, "NCCL: rank %d of %d", rank, g->n);
  if (count == 0) return NULL;
  ncclResult_t r = g->api.AllReduce(in, out, count, t, NCCL_SUM, g->comms[rank], stream);
  return r ? nccl_error(g, r, "ncclAllReduce", rank) : NULL;
}

smelt_status rt_nccl_all_gather(RtNccl *g, int rank, const void *in, void *out, size_t bytes, void *stream) {
  if (rank < 0 || rank >= g->n) return st_error(ST_INTERNAL, "NCCL: rank %d of %d", rank, g->n);
  if (bytes == 0) return NULL;
  ncclResult_t r = g->api.AllGather(in, out, bytes, NCCL_INT8, g->comms[rank], stream);
  return r ? nccl_error(g, r, "ncclAllGather", rank) : NULL;
}
