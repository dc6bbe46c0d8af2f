/* A stand-in for libcuda.so.1 that runs on the CPU, for testing the host
 * side of GPU code paths (smelt tune) where there is no GPU: loaded through
 * SMELT_LIBCUDA, it exports every driver entry point smelt resolves.
 *
 * It keeps device memory in host memory (cuMemAlloc is malloc, and the
 * copies and memsets are memcpy and memset), so uploads, downloads and
 * comparisons are real; it runs no kernel code: a launch only moves a
 * fake clock forward by a duration derived from the kernel's name, which
 * the events read, so timings are deterministic and differ between
 * kernels.  It reports one "Fake H200" (compute capability 9.0, 132 SMs,
 * 50 MiB of L2).
 *
 * Faults, chosen by environment variables naming kernels (whole symbol
 * names, several separated by commas):
 *   FAKE_CUDA_FAIL=s     launches of matching kernels fail (out of resources;
 *                        the context survives);
 *   FAKE_CUDA_CORRUPT=s  matching kernels write 0x5A over the first 16
 *                        bytes of the last allocation among their
 *                        parameters (an output or the workspace; the
 *                        parameter list of a smelt kernel is read up to a
 *                        NULL or 64 entries);
 *   FAKE_CUDA_STICKY=s   matching launches fail with an illegal address and
 *                        every later synchronisation fails too, as a real
 *                        context does after such a fault.
 * Built by tests/cpu/test_tune_cli.py with `cc -shared -fPIC`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
  OK = 0,
  ERR_INVALID_VALUE = 1,
  ERR_ILLEGAL_ADDRESS = 700,
  ERR_LAUNCH_OUT_OF_RESOURCES = 701,
};

#define EXPORT __attribute__((visibility("default")))

/* ---- allocations ---- */

typedef struct Alloc {
  unsigned char *p;
  size_t n;
  struct Alloc *next;
} Alloc;
static Alloc *allocs;
static int sticky; /* a fault poisoned the context */
static double clock_ms;

static Alloc *find(CUdeviceptr p) {
  for (Alloc *a = allocs; a; a = a->next)
    if ((uintptr_t)p >= (uintptr_t)a->p && (uintptr_t)p < (uintptr_t)a->p + (a->n ? a->n : 1)) return a;
  return NULL;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *out, size_t n) {
  Alloc *a = calloc(1, sizeof *a);
  if (!a || !(a->p = aligned_alloc(256, (n + 255) / 256 * 256 + 256))) {
    free(a);
    return 2; /* out of memory */
  }
  a->n = n;
  a->next = allocs;
  allocs = a;
  *out = (CUdeviceptr)(uintptr_t)a->p;
  return OK;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  for (Alloc **pp = &allocs; *pp; pp = &(*pp)->next)
    if ((uintptr_t)(*pp)->p == (uintptr_t)p) {
      Alloc *a = *pp;
      *pp = a->next;
      free(a->p);
      free(a);
      return OK;
    }
  return ERR_INVALID_VALUE;
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, void *s) {
  (void)s;
  Alloc *a = find(p);
  if (!a || (uintptr_t)p + n > (uintptr_t)a->p + a->n) return ERR_INVALID_VALUE;
  memset((void *)(uintptr_t)p, v, n);
  return OK;
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, void *s) {
  (void)s;
  Alloc *a = find(d);
  if (!a || (uintptr_t)d + n > (uintptr_t)a->p + a->n) return ERR_INVALID_VALUE;
  memcpy((void *)(uintptr_t)d, h, n);
  return OK;
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, void *s) {
  (void)s;
  Alloc *a = find(d);
  if (!a || (uintptr_t)d + n > (uintptr_t)a->p + a->n) return ERR_INVALID_VALUE;
  memcpy(h, (const void *)(uintptr_t)d, n);
  return OK;
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *st) {
  (void)st;
  if (!find(d) || !find(s)) return ERR_INVALID_VALUE;
  memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
  return OK;
}

EXPORT CUresult cuPointerGetAttribute(void *out, int attr, CUdeviceptr p) {
  if (attr != 2 || !find(p)) return ERR_INVALID_VALUE; /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */
  *(unsigned *)out = 2;                                 /* CU_MEMORYTYPE_DEVICE */
  return OK;
}

/* ---- device, context, stream ---- */

EXPORT CUresult cuGetErrorName(CUresult r, const char **s) {
  *s = r == ERR_ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS"
       : r == ERR_LAUNCH_OUT_OF_RESOURCES ? "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"
       : r == ERR_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
                                : "CUDA_ERROR_UNKNOWN";
  return OK;
}
EXPORT CUresult cuGetErrorString(CUresult r, const char **s) {
  *s = r == ERR_ILLEGAL_ADDRESS ? "an illegal memory access was encountered (fake)"
       : r == ERR_LAUNCH_OUT_OF_RESOURCES ? "too many resources requested for launch (fake)"
                                           : "error (fake)";
  return OK;
}
EXPORT CUresult cuInit(unsigned f) { return f ? ERR_INVALID_VALUE : OK; }
EXPORT CUresult cuDriverGetVersion(int *v) { return *v = 13000, OK; }
EXPORT CUresult cuDeviceGetCount(int *n) { return *n = 1, OK; }
EXPORT CUresult cuDeviceGet(int *d, int i) { return i == 0 ? (*d = 0, OK) : ERR_INVALID_VALUE; }
EXPORT CUresult cuDeviceGetName(char *s, int n, int d) {
  (void)d;
  snprintf(s, (size_t)n, "Fake H200");
  return OK;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
  (void)d;
  switch (attr) {
  case 16: *v = 132; return OK;             /* SMs */
  case 38: *v = 50 << 20; return OK;        /* L2 */
  case 75: *v = 9; return OK;               /* CC major */
  case 76: *v = 0; return OK;               /* CC minor */
  case 97: *v = 227 << 10; return OK;       /* shared memory opt-in */
  default: *v = 0; return OK;
  }
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *n, int d) {
  (void)d;
  *n = (size_t)80 << 30;
  return OK;
}
static int ctx_token;
EXPORT CUresult cuDevicePrimaryCtxRetain(void **c, int d) {
  (void)d;
  *c = &ctx_token;
  return OK;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(int d) { return (void)d, OK; }
EXPORT CUresult cuCtxSetCurrent(void *c) { return (void)c, OK; }
static int stream_token;
EXPORT CUresult cuStreamCreate(void **s, unsigned f) {
  (void)f;
  *s = &stream_token;
  return OK;
}
EXPORT CUresult cuStreamDestroy_v2(void *s) { return (void)s, OK; }
EXPORT CUresult cuStreamSynchronize(void *s) { return (void)s, sticky ? ERR_ILLEGAL_ADDRESS : OK; }

/* ---- modules and functions ---- */

typedef struct Fn {
  char name[160];
  struct Fn *next;
} Fn;
typedef struct {
  Fn *fns;
} Mod;

EXPORT CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned n, int *o, void **v) {
  (void)n, (void)o, (void)v;
  if (!image) return ERR_INVALID_VALUE;
  Mod *mod = calloc(1, sizeof *mod);
  if (!mod) return 2;
  *m = mod;
  return OK;
}
EXPORT CUresult cuModuleUnload(void *m) {
  Mod *mod = m;
  for (Fn *f = mod->fns, *next; f; f = next) next = f->next, free(f);
  free(mod);
  return OK;
}
EXPORT CUresult cuModuleGetFunction(void **out, void *m, const char *name) {
  Mod *mod = m;
  Fn *f = calloc(1, sizeof *f);
  if (!f) return 2;
  snprintf(f->name, sizeof f->name, "%s", name);
  f->next = mod->fns;
  mod->fns = f;
  *out = f;
  return OK;
}
EXPORT CUresult cuFuncSetAttribute(void *f, int a, int v) { return (void)f, (void)a, (void)v, OK; }
EXPORT CUresult cuFuncGetAttribute(int *v, int a, void *f) { return (void)a, (void)f, *v = 0, OK; }

/* ---- running ---- */

/* Whether name is one of the comma-separated names of $env (exactly:
 * "k00_h__c1" must not select "k00_h__c10"). */
static int matches(const char *env, const char *name) {
  const char *s = getenv(env);
  size_t len = strlen(name);
  while (s && *s) {
    size_t n = strcspn(s, ",");
    if (n == len && strncmp(name, s, n) == 0) return 1;
    s += n + (s[n] == ',');
  }
  return 0;
}

/* A kernel's fake duration: 10 to 40 microseconds by a hash of its name. */
static double duration_ms(const char *name) {
  unsigned h = 2166136261u;
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
  return 0.010 + (h % 1000) * 0.00003;
}

EXPORT CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned smem, void *s, void **params, void **extra) {
  (void)s, (void)smem, (void)extra;
  const Fn *f = fn;
  if (sticky) return ERR_ILLEGAL_ADDRESS;
  if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long long)bx * by * bz > 1024) return ERR_INVALID_VALUE;
  if (matches("FAKE_CUDA_FAIL", f->name)) return ERR_LAUNCH_OUT_OF_RESOURCES;
  if (matches("FAKE_CUDA_STICKY", f->name)) {
    sticky = 1;
    return ERR_ILLEGAL_ADDRESS;
  }
  /* the helpers of smelt tune have fixed, short parameter lists */
  int is_helper = strncmp(f->name, "smelt_", 6) == 0;
  if (!is_helper && matches("FAKE_CUDA_CORRUPT", f->name)) {
    Alloc *last = NULL;
    for (int i = 0; i < 64 && params && params[i]; i++) {
      Alloc *a = find(*(CUdeviceptr *)params[i]);
      if (a) last = a;
    }
    if (last) memset(last->p, 0x5A, last->n < 16 ? last->n : 16);
  }
  clock_ms += duration_ms(f->name);
  return OK;
}

EXPORT CUresult cuEventCreate(void **e, unsigned f) {
  (void)f;
  double *t = calloc(1, sizeof *t);
  if (!t) return 2;
  *e = t;
  return OK;
}
EXPORT CUresult cuEventDestroy_v2(void *e) { return free(e), OK; }
EXPORT CUresult cuEventRecord(void *e, void *s) {
  (void)s;
  *(double *)e = clock_ms;
  return OK;
}
EXPORT CUresult cuEventSynchronize(void *e) { return (void)e, sticky ? ERR_ILLEGAL_ADDRESS : OK; }
EXPORT CUresult cuEventElapsedTime_v2(float *ms, void *a, void *b) {
  *ms = (float)(*(double *)b - *(double *)a);
  return OK;
}

/* Graphs: capture is not simulated (smelt tune does not use it). */
EXPORT CUresult cuStreamBeginCapture_v2(void *s, int m) { return (void)s, (void)m, ERR_INVALID_VALUE; }
EXPORT CUresult cuStreamEndCapture(void *s, void **g) { return (void)s, (void)g, ERR_INVALID_VALUE; }
EXPORT CUresult cuGraphInstantiateWithFlags(void **e, void *g, unsigned long long f) {
  return (void)e, (void)g, (void)f, ERR_INVALID_VALUE;
}
EXPORT CUresult cuGraphLaunch(void *e, void *s) { return (void)e, (void)s, ERR_INVALID_VALUE; }
EXPORT CUresult cuGraphExecDestroy(void *e) { return (void)e, OK; }
EXPORT CUresult cuGraphDestroy(void *g) { return (void)g, OK; }

/* TMA: the descriptor's bytes do not matter to a launch that runs nothing;
 * the arguments are checked as the driver would. */
EXPORT CUresult cuTensorMapEncodeTiled(void *out, int dtype, unsigned rank, void *base, const unsigned long long *dims,
                                       const unsigned long long *strides, const unsigned *box, const unsigned *estr,
                                       int interleave, int swizzle, int l2, int oob) {
  (void)dtype, (void)strides, (void)estr, (void)interleave, (void)swizzle, (void)l2, (void)oob;
  if (((uintptr_t)out & 63) || rank < 1 || rank > 5 || !find((CUdeviceptr)(uintptr_t)base) || ((uintptr_t)base & 15))
    return ERR_INVALID_VALUE;
  for (unsigned i = 0; i < rank; i++)
    if (!dims[i] || !box[i] || box[i] > 256) return ERR_INVALID_VALUE;
  memset(out, 0, 128);
  return OK;
}
