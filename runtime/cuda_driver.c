/* The CUDA driver through one dlopen'ed symbol table (cuda_driver.h).
 *
 * The driver API's types are written out here (opaque handles as pointers,
 * CUdeviceptr as a 64-bit integer, enums as the numbers cuda.h gives them)
 * so that smelt builds without the CUDA toolkit.  The versioned entry
 * points are resolved by their real names: cuda.h maps cuMemAlloc to
 * cuMemAlloc_v2 with macros, which a dlsym caller has to do by hand.
 *
 * Each device object owns its library handle and symbol table (dlopen
 * counts references, so several devices share one mapping) and retains the
 * device's primary context, the context the CUDA runtime and PyTorch use,
 * so memory pointers can be exchanged with them.  Every entry point makes
 * that context current on the calling thread first (cheap, and it lets a
 * session move between threads).
 *
 * Module loading follows SPEC §5: the cubin for the GPU present, else the
 * unit's CUDA source compiled with NVRTC for this GPU (NVRTC opened lazily,
 * once per device), else PTX through the driver's JIT.
 */
#define _GNU_SOURCE /* RTLD_NODELETE */
#include "ir/target.h"
#include "runtime/cuda_driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

typedef int CUresult; /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef unsigned long long CUdeviceptr;

/* cuLaunchKernelEx's configuration, as cuda.h lays it out (CUDA 12+). */
typedef struct {
  int id;                   /* CUlaunchAttributeID */
  char pad[4];
  union {
    char pad[64];
    int programmatic_stream_serialization_allowed;
  } value;
} CUlaunchAttribute;
typedef struct {
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, smem;
  CUstream stream;
  CUlaunchAttribute *attrs;
  unsigned nattrs;
} CUlaunchConfig;

enum {
  CUDA_ERROR_NO_DEVICE = 100,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
  CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
  CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_MEMORYTYPE_DEVICE = 2,
  CU_MEMORYTYPE_UNIFIED = 4,
  CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
  CU_STREAM_NON_BLOCKING = 1,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_JIT_ERROR_LOG_BUFFER = 5,
  CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
  CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};

/* cuMemcpy2DAsync's description of a copy, as cuda.h lays it out. */
typedef struct {
  size_t srcXInBytes, srcY;
  int srcMemoryType;
  const void *srcHost;
  CUdeviceptr srcDevice;
  void *srcArray;
  size_t srcPitch;
  size_t dstXInBytes, dstY;
  int dstMemoryType;
  void *dstHost;
  CUdeviceptr dstDevice;
  void *dstArray;
  size_t dstPitch;
  size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

/* The symbol table: every driver function smelt calls. */
typedef struct {
  CUresult (*GetErrorName)(CUresult, const char **);
  CUresult (*GetErrorString)(CUresult, const char **);
  CUresult (*Init)(unsigned);
  CUresult (*DriverGetVersion)(int *);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetName)(char *, int, CUdevice);
  CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*DeviceTotalMem)(size_t *, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*StreamCreate)(CUstream *, unsigned);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*ModuleLoadDataEx)(CUmodule *, const void *, unsigned, int *, void **);
  CUresult (*ModuleUnload)(CUmodule);
  CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
  CUresult (*FuncSetAttribute)(CUfunction, int, int);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  CUresult (*PointerGetAttribute)(void *, int, CUdeviceptr);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void **, void **);
  CUresult (*StreamBeginCapture)(CUstream, int);
  CUresult (*StreamEndCapture)(CUstream, CUgraph *);
  CUresult (*GraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*GraphLaunch)(CUgraphExec, CUstream);
  CUresult (*GraphExecDestroy)(CUgraphExec);
  CUresult (*GraphDestroy)(CUgraph);
  CUresult (*EventCreate)(CUevent *, unsigned);
  CUresult (*EventDestroy)(CUevent);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
  CUresult (*FuncGetAttribute)(int *, int, CUfunction);
  /* optional (every real driver has them; tests' fake drivers may not):
   * freeing an RtCudaBuffer without changing the caller's context */
  CUresult (*CtxPushCurrent)(CUcontext);
  CUresult (*CtxPopCurrent)(CUcontext *);
  /* optional (NULL on drivers before CUDA 12): launches with attributes
   * (programmatic dependent launch) */
  CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
  /* optional (tests' fake drivers may lack it): strided copies, for
   * all_gather's blocks (runtime/nccl.c) */
  CUresult (*Memcpy2DAsync)(const CUDA_MEMCPY2D *, CUstream);
  /* optional (NULL on drivers before CUDA 12): TMA descriptors */
  CUresult (*TensorMapEncodeTiled)(void *, int, unsigned, void *, const unsigned long long *, const unsigned long long *,
                                   const unsigned *, const unsigned *, int, int, int, int);
} CuApi;

struct RtCudaDevice {
  void *lib;
  CuApi api;
  CUdevice dev;
  CUcontext ctx;
  CUstream stream;
  RtCudaInfo info;
  /* Compiles a unit's source for this GPU when the bundle has no cubin for
   * it (the compiler library's NVRTC, smelt_compile.h); NULL: none. */
  smelt_cuda_compile_fn compile;
  void *compile_ctx;
};

struct RtCudaModule {
  RtCudaDevice *d;
  CUmodule mod;
  char what[64];
  int code_cc; /* the compute capability its code was built for (0: unknown) */
};

struct RtCudaGraph {
  RtCudaDevice *d;
  CUgraph graph;
  CUgraphExec exec;
};

/* "cuLaunchKernel (kernel k03_x): CUDA_ERROR_INVALID_VALUE: invalid argument" */
static smelt_status cu_error(const RtCudaDevice *d, CUresult r, const char *call, const char *what) {
  const char *name = NULL, *desc = NULL;
  if (d->api.GetErrorName) d->api.GetErrorName(r, &name);
  if (d->api.GetErrorString) d->api.GetErrorString(r, &desc);
  return st_error(ST_INTERNAL, "CUDA: %s%s%s%s failed: %s (%d): %s", call, what ? " (" : "", what ? what : "",
                  what ? ")" : "", name ? name : "CUDA_ERROR", r, desc ? desc : "unknown error");
}

#define CU_CHECK(d, expr, call, what)                 \
  do {                                                \
    CUresult r_ = (expr);                             \
    if (r_ != 0) return cu_error((d), r_, call, what); \
  } while (0)

static smelt_status current(RtCudaDevice *d) {
  CU_CHECK(d, d->api.CtxSetCurrent(d->ctx), "cuCtxSetCurrent", NULL);
  return NULL;
}

/* Loads the library and fills the table; ST_UNSUPPORTED when absent. */
static smelt_status load_api(void **out_lib, CuApi *api) {
  const char *forced = getenv("SMELT_LIBCUDA");
  const char *libname = forced && forced[0] ? forced : "libcuda.so.1";
  /* kept mapped after dlclose, like NVRTC (nvrtc.c says why) */
  void *lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!lib)
    return st_error(ST_UNSUPPORTED, "no CUDA driver (%s not found)", libname);
  struct {
    void **slot;
    const char *name, *fallback;
  } syms[] = {
      {(void **)&api->GetErrorName, "cuGetErrorName", NULL},
      {(void **)&api->GetErrorString, "cuGetErrorString", NULL},
      {(void **)&api->Init, "cuInit", NULL},
      {(void **)&api->DriverGetVersion, "cuDriverGetVersion", NULL},
      {(void **)&api->DeviceGetCount, "cuDeviceGetCount", NULL},
      {(void **)&api->DeviceGet, "cuDeviceGet", NULL},
      {(void **)&api->DeviceGetName, "cuDeviceGetName", NULL},
      {(void **)&api->DeviceGetAttribute, "cuDeviceGetAttribute", NULL},
      {(void **)&api->DeviceTotalMem, "cuDeviceTotalMem_v2", NULL},
      {(void **)&api->DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL},
      {(void **)&api->DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"},
      {(void **)&api->CtxSetCurrent, "cuCtxSetCurrent", NULL},
      {(void **)&api->StreamCreate, "cuStreamCreate", NULL},
      {(void **)&api->StreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy"},
      {(void **)&api->StreamSynchronize, "cuStreamSynchronize", NULL},
      {(void **)&api->ModuleLoadDataEx, "cuModuleLoadDataEx", NULL},
      {(void **)&api->ModuleUnload, "cuModuleUnload", NULL},
      {(void **)&api->ModuleGetFunction, "cuModuleGetFunction", NULL},
      {(void **)&api->FuncSetAttribute, "cuFuncSetAttribute", NULL},
      {(void **)&api->MemAlloc, "cuMemAlloc_v2", NULL},
      {(void **)&api->MemFree, "cuMemFree_v2", NULL},
      {(void **)&api->MemsetD8Async, "cuMemsetD8Async", NULL},
      {(void **)&api->MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", NULL},
      {(void **)&api->MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", NULL},
      {(void **)&api->MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", NULL},
      {(void **)&api->PointerGetAttribute, "cuPointerGetAttribute", NULL},
      {(void **)&api->LaunchKernel, "cuLaunchKernel", NULL},
      {(void **)&api->StreamBeginCapture, "cuStreamBeginCapture_v2", NULL},
      {(void **)&api->StreamEndCapture, "cuStreamEndCapture", NULL},
      {(void **)&api->GraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", NULL},
      {(void **)&api->GraphLaunch, "cuGraphLaunch", NULL},
      {(void **)&api->GraphExecDestroy, "cuGraphExecDestroy", NULL},
      {(void **)&api->GraphDestroy, "cuGraphDestroy", NULL},
      {(void **)&api->EventCreate, "cuEventCreate", NULL},
      {(void **)&api->EventDestroy, "cuEventDestroy_v2", "cuEventDestroy"},
      {(void **)&api->EventRecord, "cuEventRecord", NULL},
      {(void **)&api->EventSynchronize, "cuEventSynchronize", NULL},
      /* CUDA 12.8 added _v2; older drivers have only the original */
      {(void **)&api->EventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"},
      {(void **)&api->FuncGetAttribute, "cuFuncGetAttribute", NULL},
  };
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++) {
    *syms[i].slot = dlsym(lib, syms[i].name);
    if (!*syms[i].slot && syms[i].fallback) *syms[i].slot = dlsym(lib, syms[i].fallback);
    if (!*syms[i].slot) {
      dlclose(lib);
      return st_error(ST_UNSUPPORTED, "CUDA driver %s lacks %s (driver too old?)", libname, syms[i].name);
    }
  }
  api->TensorMapEncodeTiled = dlsym(lib, "cuTensorMapEncodeTiled");
  api->LaunchKernelEx = dlsym(lib, "cuLaunchKernelEx");
  api->Memcpy2DAsync = dlsym(lib, "cuMemcpy2DAsync_v2");
  api->CtxPushCurrent = dlsym(lib, "cuCtxPushCurrent_v2");
  api->CtxPopCurrent = dlsym(lib, "cuCtxPopCurrent_v2");
  *out_lib = lib;
  return NULL;
}

smelt_status rt_cuda_device_count(int *out_count) {
  *out_count = 0;
  void *lib;
  CuApi api;
  memset(&api, 0, sizeof api);
  RETURN_IF_ERROR(load_api(&lib, &api));
  CUresult r = api.Init(0);
  int n = 0;
  if (r == 0) r = api.DeviceGetCount(&n);
  dlclose(lib);
  if (r == CUDA_ERROR_NO_DEVICE) return NULL;
  if (r != 0) return st_error(ST_UNSUPPORTED, "CUDA driver failed to initialise (error %d)", r);
  *out_count = n;
  return NULL;
}

static smelt_status query_info(RtCudaDevice *d, int ordinal) {
  RtCudaInfo *in = &d->info;
  CuApi *a = &d->api;
  in->ordinal = ordinal;
  CU_CHECK(d, a->DeviceGetName(in->name, (int)sizeof in->name, d->dev), "cuDeviceGetName", NULL);
  int major = 0, minor = 0, v = 0;
  CU_CHECK(d, a->DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev), "cuDeviceGetAttribute", "compute capability");
  CU_CHECK(d, a->DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev), "cuDeviceGetAttribute", "compute capability");
  in->cc = major * 10 + minor;
  /* Hopper's tensor-core instructions need the arch-specific target, which
   * runs only on 9.0 (FIELD-NOTES.md) */
  snprintf(in->arch, sizeof in->arch, in->cc == 90 ? "sm_%da" : "sm_%d", in->cc);
  if (a->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->dev) == 0) in->sm_count = v;
  if (a->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d->dev) == 0) in->smem_per_block_optin = v;
  if (a->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, d->dev) == 0) in->l2_bytes = v;
  int clock_khz = 0, bus_bits = 0;
  /* deprecated on newer drivers, where it may fail or read 0: then unknown */
  if (a->DeviceGetAttribute(&clock_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, d->dev) == 0 &&
      a->DeviceGetAttribute(&bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, d->dev) == 0)
    in->mem_bandwidth_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9; /* double data rate */
  size_t total = 0;
  if (a->DeviceTotalMem(&total, d->dev) == 0) in->total_mem = (int64_t)total;
  a->DriverGetVersion(&in->driver_version);
  return NULL;
}

smelt_status rt_cuda_device_create(int ordinal, RtCudaDevice **out_device) {
  *out_device = NULL;
  RtCudaDevice *d = calloc(1, sizeof *d);
  if (!d) return st_error(ST_NO_MEMORY, "out of memory opening a CUDA device");
  smelt_status st = load_api(&d->lib, &d->api);
  if (st) {
    free(d);
    return st;
  }
  CUresult r = d->api.Init(0);
  int count = 0;
  if (r == 0) r = d->api.DeviceGetCount(&count);
  if (r != 0 || count == 0) {
    /* a driver that cannot initialise (no GPU, a container without one)
     * means CUDA is unavailable here, not that smelt failed */
    if (r != 0 && r != CUDA_ERROR_NO_DEVICE) {
      smelt_status e = cu_error(d, r, "cuInit", NULL);
      st = st_error(ST_UNSUPPORTED, "no usable CUDA device: %s", st_message(e));
      st_free(e);
    } else {
      st = st_error(ST_UNSUPPORTED, "no CUDA device (the driver found none)");
    }
    dlclose(d->lib);
    free(d);
    return st;
  }
  if (ordinal < 0 || ordinal >= count) {
    dlclose(d->lib);
    free(d);
    return st_error(ST_UNSUPPORTED, "no CUDA device %d (this machine has %d)", ordinal, count);
  }
  r = d->api.DeviceGet(&d->dev, ordinal);
  if (r == 0) r = d->api.DevicePrimaryCtxRetain(&d->ctx, d->dev);
  if (r != 0) {
    st = cu_error(d, r, "cuDevicePrimaryCtxRetain", NULL);
    dlclose(d->lib);
    free(d);
    return st;
  }
  st = current(d);
  if (!st) {
    r = d->api.StreamCreate(&d->stream, CU_STREAM_NON_BLOCKING);
    if (r != 0) st = cu_error(d, r, "cuStreamCreate", NULL);
  }
  if (!st) st = query_info(d, ordinal);
  if (st) {
    rt_cuda_device_destroy(d);
    return st;
  }
  *out_device = d;
  return NULL;
}

void rt_cuda_device_destroy(RtCudaDevice *d) {
  if (!d) return;
  if (d->ctx) {
    d->api.CtxSetCurrent(d->ctx);
    if (d->stream) {
      d->api.StreamSynchronize(d->stream);
      d->api.StreamDestroy(d->stream);
    }
    d->api.DevicePrimaryCtxRelease(d->dev);
  }
  if (d->lib) dlclose(d->lib);
  free(d);
}

const RtCudaInfo *rt_cuda_device_info(const RtCudaDevice *d) { return &d->info; }

void *rt_cuda_device_stream(const RtCudaDevice *d) { return d->stream; }

/* ---- buffers that outlive their device object ---- */

/* What freeing needs, copied from the device: the library stays mapped
 * after dlclose (RTLD_NODELETE), and the retained primary context keeps
 * the memory. */
struct RtCudaBuffer {
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxPushCurrent)(CUcontext);
  CUresult (*CtxPopCurrent)(CUcontext *);
  CUresult (*DevicePrimaryCtxRelease)(CUdevice);
  CUdevice dev;
  CUcontext ctx;
  RtCudaPtr ptr;
};

smelt_status rt_cuda_buffer_alloc(RtCudaDevice *d, size_t bytes, RtCudaBuffer **out_buffer) {
  *out_buffer = NULL;
  RtCudaBuffer *b = calloc(1, sizeof *b);
  if (!b) return st_error(ST_NO_MEMORY, "out of memory");
  CUcontext ctx = NULL;
  CUresult r = d->api.DevicePrimaryCtxRetain(&ctx, d->dev);
  if (r != 0) {
    free(b);
    return cu_error(d, r, "cuDevicePrimaryCtxRetain", NULL);
  }
  smelt_status st = rt_cuda_alloc(d, bytes ? bytes : 1, &b->ptr);
  if (st) {
    d->api.DevicePrimaryCtxRelease(d->dev);
    free(b);
    return st;
  }
  b->MemFree = d->api.MemFree;
  b->CtxSetCurrent = d->api.CtxSetCurrent;
  b->CtxPushCurrent = d->api.CtxPushCurrent;
  b->CtxPopCurrent = d->api.CtxPopCurrent;
  b->DevicePrimaryCtxRelease = d->api.DevicePrimaryCtxRelease;
  b->dev = d->dev;
  b->ctx = ctx;
  *out_buffer = b;
  return NULL;
}

RtCudaPtr rt_cuda_buffer_ptr(const RtCudaBuffer *b) { return b->ptr; }

void rt_cuda_buffer_free(RtCudaBuffer *b) {
  if (!b) return;
  /* the caller's current context is left as it was, where the driver can */
  if (b->CtxPushCurrent && b->CtxPopCurrent) {
    if (b->CtxPushCurrent(b->ctx) == 0) {
      b->MemFree(b->ptr);
      CUcontext prev;
      b->CtxPopCurrent(&prev);
    }
  } else if (b->CtxSetCurrent(b->ctx) == 0) {
    b->MemFree(b->ptr);
  }
  b->DevicePrimaryCtxRelease(b->dev);
  free(b);
}

void rt_cuda_device_set_compiler(RtCudaDevice *d, smelt_cuda_compile_fn fn, void *ctx) {
  d->compile = fn;
  d->compile_ctx = ctx;
}

/* ---- modules ---- */

smelt_status rt_cuda_module_load_image(RtCudaDevice *d, const void *image, const char *what,
                                       RtCudaModule **out_module) {
  *out_module = NULL;
  RETURN_IF_ERROR(current(d));
  RtCudaModule *m = calloc(1, sizeof *m);
  if (!m) return st_error(ST_NO_MEMORY, "out of memory loading a CUDA module");
  m->d = d;
  snprintf(m->what, sizeof m->what, "%s", what ? what : "module");
  char log[4096] = "";
  int opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *vals[2] = {log, (void *)(uintptr_t)sizeof log};
  CUresult r = d->api.ModuleLoadDataEx(&m->mod, image, 2, opts, vals);
  if (r != 0) {
    smelt_status st = cu_error(d, r, "cuModuleLoadDataEx", m->what);
    free(m);
    if (log[0]) {
      smelt_status s2 = st_error(st_code(st), "%s\n%s", st_message(st), log);
      st_free(st);
      st = s2;
    }
    return st;
  }
  *out_module = m;
  return NULL;
}

/* Can code built for `arch` run on a GPU of compute capability cc? */
static bool cubin_runs(const char *arch, int cc) {
  int acc;
  bool specific;
  if (!arch || !ir_cuda_parse_arch(arch, &acc, &specific)) return false;
  if (specific) return acc == cc;
  return acc / 10 == cc / 10 && acc <= cc;
}

static bool ptx_runs(const char *arch, int cc) {
  int acc;
  bool specific;
  if (!arch || !ir_cuda_parse_arch(arch, &acc, &specific)) return false;
  return specific ? acc == cc : acc <= cc;
}

static int arch_cc(const char *arch) {
  int cc = 0;
  ir_cuda_parse_arch(arch, &cc, NULL);
  return cc;
}

smelt_status rt_cuda_module_load(RtCudaDevice *d, const RtCudaImage *images, int nimages, const char *source,
                                 const char *what, RtCudaModule **out_module, RtCudaLoadKind *out_kind) {
  *out_module = NULL;
  int cc = d->info.cc;
  /* 1. the best cubin: the highest arch that runs here */
  int best = -1;
  for (int i = 0; i < nimages; i++)
    if (images[i].cubin && images[i].cubin_len && cubin_runs(images[i].arch, cc) &&
        (best < 0 || arch_cc(images[i].arch) > arch_cc(images[best].arch)))
      best = i;
  if (best >= 0) {
    if (out_kind) *out_kind = RT_CUDA_LOADED_CUBIN;
    RETURN_IF_ERROR(rt_cuda_module_load_image(d, images[best].cubin, what, out_module));
    (*out_module)->code_cc = arch_cc(images[best].arch);
    return NULL;
  }
  /* 2. compile the source for this GPU */
  smelt_status nvrtc_st = NULL;
  if (source && d->compile) {
    void *cubin = NULL;
    size_t len = 0;
    nvrtc_st = d->compile(d->compile_ctx, source, what, d->info.arch, &cubin, &len);
    if (!nvrtc_st) {
      smelt_status st = rt_cuda_module_load_image(d, cubin, what, out_module);
      free(cubin);
      if (!st) (*out_module)->code_cc = cc;
      if (out_kind) *out_kind = RT_CUDA_LOADED_NVRTC;
      return st;
    }
    /* NVRTC missing: fall through to the PTX; a compile error is final */
    if (st_code(nvrtc_st) != ST_UNSUPPORTED) return nvrtc_st;
  }
  /* 3. PTX through the driver's JIT */
  best = -1;
  for (int i = 0; i < nimages; i++)
    if (images[i].ptx && ptx_runs(images[i].arch, cc) && (best < 0 || arch_cc(images[i].arch) > arch_cc(images[best].arch)))
      best = i;
  if (best >= 0) {
    st_free(nvrtc_st);
    if (out_kind) *out_kind = RT_CUDA_LOADED_PTX;
    RETURN_IF_ERROR(rt_cuda_module_load_image(d, images[best].ptx, what, out_module));
    (*out_module)->code_cc = arch_cc(images[best].arch);
    return NULL;
  }
  {
    char archs[256] = "";
    size_t n = 0;
    for (int i = 0; i < nimages && n + 20 < sizeof archs; i++)
      n += (size_t)snprintf(archs + n, sizeof archs - n, "%s%s", i ? "," : "", images[i].arch ? images[i].arch : "?");
    smelt_status st = st_error(ST_UNSUPPORTED,
                               "%s: no code for this GPU (%s, %s): the bundle has [%s]; %s",
                               what ? what : "CUDA module", d->info.name, d->info.arch, archs,
                               !source ? "no CUDA source to compile"
                               : nvrtc_st ? st_message(nvrtc_st)
                               : !d->compile ? "no CUDA compiler hook (smelt_session_options.cuda_compile)"
                                          : "NVRTC unavailable");
    st_free(nvrtc_st);
    return st;
  }
}

int rt_cuda_module_code_cc(const RtCudaModule *m) { return m ? m->code_cc : 0; }

bool rt_cuda_device_has_pdl(const RtCudaDevice *d) {
  if (!d->api.LaunchKernelEx || d->info.cc < 90) return false;
  const char *e = getenv("SMELT_CUDA_PDL");
  return !(e && strcmp(e, "0") == 0);
}

void rt_cuda_module_unload(RtCudaModule *m) {
  if (!m) return;
  if (m->mod && current(m->d) == NULL) m->d->api.ModuleUnload(m->mod);
  free(m);
}

smelt_status rt_cuda_module_function(RtCudaModule *m, const char *symbol, unsigned smem, RtCudaFunction *out_fn) {
  *out_fn = NULL;
  RtCudaDevice *d = m->d;
  RETURN_IF_ERROR(current(d));
  CUfunction f;
  CU_CHECK(d, d->api.ModuleGetFunction(&f, m->mod, symbol), "cuModuleGetFunction", symbol);
  if (smem > 48 * 1024)
    CU_CHECK(d, d->api.FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem),
             "cuFuncSetAttribute", symbol);
  *out_fn = f;
  return NULL;
}

/* ---- memory ---- */

smelt_status rt_cuda_alloc(RtCudaDevice *d, size_t bytes, RtCudaPtr *out_ptr) {
  *out_ptr = 0;
  RETURN_IF_ERROR(current(d));
  CUdeviceptr p;
  CUresult r = d->api.MemAlloc(&p, bytes ? bytes : 1);
  if (r != 0) {
    smelt_status st = cu_error(d, r, "cuMemAlloc", NULL);
    smelt_status s2 = st_error(r == 2 ? ST_NO_MEMORY : ST_INTERNAL, "%s (%zu bytes)", st_message(st), bytes);
    st_free(st);
    return s2;
  }
  *out_ptr = p;
  return NULL;
}

void rt_cuda_free(RtCudaDevice *d, RtCudaPtr p) {
  if (!p || current(d) != NULL) return;
  d->api.MemFree(p);
}

smelt_status rt_cuda_memset(RtCudaDevice *d, RtCudaPtr p, int byte, size_t n) {
  RETURN_IF_ERROR(current(d));
  CU_CHECK(d, d->api.MemsetD8Async(p, (unsigned char)byte, n, d->stream), "cuMemsetD8Async", NULL);
  CU_CHECK(d, d->api.StreamSynchronize(d->stream), "cuStreamSynchronize", "after memset");
  return NULL;
}

bool rt_cuda_is_device_pointer(RtCudaDevice *d, const void *p) {
  if (!p || current(d) != NULL) return false;
  unsigned int type = 0;
  /* host memory the driver does not know is an error here, not a type */
  if (d->api.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) != 0) return false;
  return type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED;
}

bool rt_cuda_is_local_pointer(RtCudaDevice *d, const void *p) {
  if (!p || current(d) != NULL) return false;
  unsigned int type = 0;
  int ordinal = -1;
  if (d->api.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p) != 0) return false;
  if (type == CU_MEMORYTYPE_UNIFIED) return true;
  if (type != CU_MEMORYTYPE_DEVICE) return false;
  if (d->api.PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)(uintptr_t)p) != 0)
    return true; /* a driver that cannot say: as before */
  return ordinal == d->info.ordinal;
}

smelt_status rt_cuda_copy_2d_async(RtCudaDevice *d, RtCudaPtr dst, size_t dst_pitch, RtCudaPtr src, size_t src_pitch,
                                   size_t width, size_t height) {
  if (width == 0 || height == 0) return NULL;
  RETURN_IF_ERROR(current(d));
  if (height == 1 || (dst_pitch == width && src_pitch == width))
    return rt_cuda_copy_async(d, dst, src, width * height);
  if (!d->api.Memcpy2DAsync) return st_error(ST_UNSUPPORTED, "CUDA driver lacks cuMemcpy2DAsync_v2");
  CUDA_MEMCPY2D c;
  memset(&c, 0, sizeof c);
  c.srcMemoryType = c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.srcDevice = src, c.srcPitch = src_pitch;
  c.dstDevice = dst, c.dstPitch = dst_pitch;
  c.WidthInBytes = width, c.Height = height;
  CU_CHECK(d, d->api.Memcpy2DAsync(&c, d->stream), "cuMemcpy2DAsync", NULL);
  return NULL;
}

smelt_status rt_cuda_upload(RtCudaDevice *d, RtCudaPtr dst, const void *src, size_t n) {
  if (n == 0) return NULL;
  RETURN_IF_ERROR(current(d));
  if (rt_cuda_is_device_pointer(d, src))
    CU_CHECK(d, d->api.MemcpyDtoDAsync(dst, (CUdeviceptr)(uintptr_t)src, n, d->stream), "cuMemcpyDtoDAsync", NULL);
  else
    CU_CHECK(d, d->api.MemcpyHtoDAsync(dst, src, n, d->stream), "cuMemcpyHtoDAsync", NULL);
  CU_CHECK(d, d->api.StreamSynchronize(d->stream), "cuStreamSynchronize", "after a copy to the device");
  return NULL;
}

smelt_status rt_cuda_upload_input(RtCudaDevice *d, RtCudaPtr dst, const void *src, size_t n) {
  if (n == 0) return NULL;
  RETURN_IF_ERROR(current(d));
  unsigned int type = 0;
  /* pageable host memory (the driver does not know it): the driver stages
   * it before cuMemcpyHtoDAsync returns, so the caller may reuse it at
   * once, and the kernels after it in the stream see the copy */
  if (d->api.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)src) != 0) {
    CU_CHECK(d, d->api.MemcpyHtoDAsync(dst, src, n, d->stream), "cuMemcpyHtoDAsync", NULL);
    return NULL;
  }
  /* device memory: a copy in the stream's order, before the kernels */
  if (type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED)
    return rt_cuda_copy_async(d, dst, (RtCudaPtr)(uintptr_t)src, n);
  return rt_cuda_upload(d, dst, src, n);
}

smelt_status rt_cuda_copy_async(RtCudaDevice *d, RtCudaPtr dst, RtCudaPtr src, size_t n) {
  if (n == 0) return NULL;
  RETURN_IF_ERROR(current(d));
  CU_CHECK(d, d->api.MemcpyDtoDAsync(dst, src, n, d->stream), "cuMemcpyDtoDAsync", NULL);
  return NULL;
}

smelt_status rt_cuda_download(RtCudaDevice *d, void *dst, RtCudaPtr src, size_t n) {
  if (n == 0) return NULL;
  RETURN_IF_ERROR(current(d));
  if (rt_cuda_is_device_pointer(d, dst))
    CU_CHECK(d, d->api.MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, src, n, d->stream), "cuMemcpyDtoDAsync", NULL);
  else
    CU_CHECK(d, d->api.MemcpyDtoHAsync(dst, src, n, d->stream), "cuMemcpyDtoHAsync", NULL);
  CU_CHECK(d, d->api.StreamSynchronize(d->stream), "cuStreamSynchronize", "after a copy from the device");
  return NULL;
}

smelt_status rt_cuda_upload_constants(RtCudaDevice *d, const Graph *g, RtCudaPtr *out_block, RtCudaPtr *out_ptrs) {
  *out_block = 0;
  size_t total = 0;
  for (int v = 0; v < g->nval; v++) {
    out_ptrs[v] = 0;
    if (g->val[v].kind != VK_CONST) continue;
    total = (total + 255) / 256 * 256 + ir_type_bytes(&g->val[v].type);
  }
  if (total == 0) return NULL;
  RtCudaPtr block;
  RETURN_IF_ERROR(rt_cuda_alloc(d, total, &block));
  size_t off = 0;
  for (int v = 0; v < g->nval; v++) {
    if (g->val[v].kind != VK_CONST) continue;
    off = (off + 255) / 256 * 256;
    size_t n = ir_type_bytes(&g->val[v].type);
    smelt_status st = g->val[v].data ? rt_cuda_upload(d, block + off, g->val[v].data, n) : rt_cuda_memset(d, block + off, 0, n);
    if (st) {
      rt_cuda_free(d, block);
      for (int w = 0; w < g->nval; w++) out_ptrs[w] = 0;
      return st_prefix(st, "constant '%s'", g->val[v].name);
    }
    out_ptrs[v] = block + off;
    off += n;
  }
  *out_block = block;
  return NULL;
}

/* ---- running ---- */

static smelt_status launch_one(RtCudaDevice *d, const RtCudaLaunch *l) {
  if (l->enqueue) return l->enqueue(l->ctx, d->stream); /* a collective */
  if (l->pdl && d->api.LaunchKernelEx) {
    /* the kernel may start while the one before it runs: its code waits
     * for it (griddepcontrol.wait) before touching its buffers */
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmatic_stream_serialization_allowed = 1;
    CUlaunchConfig cfg = {l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2], l->smem,
                          d->stream, &attr, 1};
    CU_CHECK(d, d->api.LaunchKernelEx(&cfg, (CUfunction)l->fn, l->params, NULL), "cuLaunchKernelEx",
             l->name ? l->name : "kernel");
    return NULL;
  }
  CU_CHECK(d,
           d->api.LaunchKernel((CUfunction)l->fn, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],
                               l->block[2], l->smem, d->stream, l->params, NULL),
           "cuLaunchKernel", l->name ? l->name : "kernel");
  return NULL;
}

smelt_status rt_cuda_launch(RtCudaDevice *d, const RtCudaLaunch *l, int n) {
  RETURN_IF_ERROR(current(d));
  for (int i = 0; i < n; i++) RETURN_IF_ERROR(launch_one(d, &l[i]));
  return NULL;
}

smelt_status rt_cuda_sync(RtCudaDevice *d) {
  RETURN_IF_ERROR(current(d));
  CU_CHECK(d, d->api.StreamSynchronize(d->stream), "cuStreamSynchronize", "kernel execution");
  return NULL;
}

smelt_status rt_cuda_graph_capture(RtCudaDevice *d, const RtCudaLaunch *l, int n, RtCudaGraph **out_graph) {
  *out_graph = NULL;
  RETURN_IF_ERROR(current(d));
  RtCudaGraph *gr = calloc(1, sizeof *gr);
  if (!gr) return st_error(ST_NO_MEMORY, "out of memory capturing a CUDA graph");
  gr->d = d;
  CUresult r = d->api.StreamBeginCapture(d->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (r != 0) {
    free(gr);
    return cu_error(d, r, "cuStreamBeginCapture", NULL);
  }
  smelt_status st = NULL;
  for (int i = 0; i < n && !st; i++) st = launch_one(d, &l[i]);
  /* the capture must be ended even after a failed launch */
  r = d->api.StreamEndCapture(d->stream, &gr->graph);
  if (!st && r != 0) st = cu_error(d, r, "cuStreamEndCapture", NULL);
  if (!st) {
    r = d->api.GraphInstantiateWithFlags(&gr->exec, gr->graph, 0);
    if (r != 0) st = cu_error(d, r, "cuGraphInstantiateWithFlags", NULL);
  }
  if (st) {
    rt_cuda_graph_destroy(gr);
    return st;
  }
  *out_graph = gr;
  return NULL;
}

smelt_status rt_cuda_graph_launch(RtCudaDevice *d, RtCudaGraph *gr) {
  RETURN_IF_ERROR(current(d));
  CU_CHECK(d, d->api.GraphLaunch(gr->exec, d->stream), "cuGraphLaunch", NULL);
  return NULL;
}

void rt_cuda_graph_destroy(RtCudaGraph *gr) {
  if (!gr) return;
  if (current(gr->d) == NULL) {
    if (gr->exec) gr->d->api.GraphExecDestroy(gr->exec);
    if (gr->graph) gr->d->api.GraphDestroy(gr->graph);
  }
  free(gr);
}

smelt_status rt_cuda_time_kernels(RtCudaDevice *d, const RtCudaLaunch *l, int n, int reps, double *out_ms) {
  RETURN_IF_ERROR(current(d));
  if (n <= 0) return NULL;
  for (int i = 0; i < n; i++) out_ms[i] = 0;
  if (reps < 1) reps = 1;
  CUevent *ev = calloc((size_t)n + 1, sizeof *ev);
  if (!ev) return st_error(ST_NO_MEMORY, "out of memory timing kernels");
  smelt_status st = NULL;
  int made = 0;
  for (; made <= n && !st; made++) {
    CUresult r = d->api.EventCreate(&ev[made], 0);
    if (r != 0) st = cu_error(d, r, "cuEventCreate", NULL);
  }
  if (!st) st = rt_cuda_launch(d, l, n); /* warm-up: first-launch costs out of the numbers */
  for (int rep = 0; rep < reps && !st; rep++) {
    CUresult r = d->api.EventRecord(ev[0], d->stream);
    if (r != 0) st = cu_error(d, r, "cuEventRecord", NULL);
    for (int i = 0; i < n && !st; i++) {
      st = launch_one(d, &l[i]);
      if (!st && (r = d->api.EventRecord(ev[i + 1], d->stream)) != 0) st = cu_error(d, r, "cuEventRecord", l[i].name);
    }
    if (!st && (r = d->api.EventSynchronize(ev[n])) != 0) st = cu_error(d, r, "cuEventSynchronize", "kernel execution");
    for (int i = 0; i < n && !st; i++) {
      float ms = 0;
      if ((r = d->api.EventElapsedTime(&ms, ev[i], ev[i + 1])) != 0) st = cu_error(d, r, "cuEventElapsedTime", l[i].name);
      out_ms[i] += ms / reps;
    }
  }
  for (int i = 0; i < made && ev[i]; i++) d->api.EventDestroy(ev[i]);
  free(ev);
  return st;
}

/* ---- TMA descriptors and kernel resources ---- */

smelt_status rt_cuda_tensor_map(RtCudaDevice *d, int dtype, int rank, RtCudaPtr base, const uint64_t *dims,
                                const uint64_t *strides, const uint32_t *box, int swizzle, void *out) {
  if (!d->api.TensorMapEncodeTiled)
    return st_error(ST_UNSUPPORTED, "the CUDA driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12+)");
  /* CUtensorMapDataType: FLOAT16 6, FLOAT32 7, BFLOAT16 9; swizzle NONE 0, 32B 1, 64B 2, 128B 3 */
  int ty = dtype == DT_F16 ? 6 : dtype == DT_BF16 ? 9 : dtype == DT_F32 ? 7 : -1;
  int sw = swizzle == 0 ? 0 : swizzle == 32 ? 1 : swizzle == 64 ? 2 : swizzle == 128 ? 3 : -1;
  if (ty < 0 || sw < 0 || rank < 1 || rank > 5)
    return st_error(ST_INVALID_INPUT, "TMA descriptor: dtype %d, rank %d, swizzle %d not supported", dtype, rank, swizzle);
  unsigned long long gd[5], gs[4];
  unsigned bx[5], es[5];
  for (int i = 0; i < rank; i++) gd[i] = dims[i], bx[i] = box[i], es[i] = 1;
  for (int i = 0; i + 1 < rank; i++) gs[i] = strides[i];
  RETURN_IF_ERROR(current(d));
  /* interleave NONE, L2 promotion 128B, out-of-bounds elements read as zero */
  CUresult r = d->api.TensorMapEncodeTiled(out, ty, (unsigned)rank, (void *)(uintptr_t)base, gd, gs, bx, es, 0, sw, 2, 0);
  if (r != 0) return cu_error(d, r, "cuTensorMapEncodeTiled", NULL);
  return NULL;
}

smelt_status rt_cuda_function_resources(RtCudaDevice *d, RtCudaFunction fn, RtCudaResources *out) {
  /* CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES 1, LOCAL_SIZE_BYTES 3, NUM_REGS 4 */
  int v[3] = {0, 0, 0}, attr[3] = {4, 3, 1};
  memset(out, 0, sizeof *out);
  for (int i = 0; i < 3; i++) {
    CUresult r = d->api.FuncGetAttribute(&v[i], attr[i], (CUfunction)fn);
    if (r != 0) return cu_error(d, r, "cuFuncGetAttribute", NULL);
  }
  out->registers = v[0];
  out->local_bytes = v[1];
  out->static_smem = v[2];
  return NULL;
}
