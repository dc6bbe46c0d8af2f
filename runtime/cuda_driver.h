/* The CUDA driver, reached through dlopen("libcuda.so.1"): what a session
 * needs to run a compiled model on an NVIDIA GPU.
 *
 * smelt links no CUDA library.  Every driver entry point is resolved once,
 * into one symbol table held by the device object, using the versioned
 * names (cuMemAlloc_v2, cuStreamBeginCapture_v2, ...).  On a machine
 * without the driver, rt_cuda_device_create returns ST_UNSUPPORTED ("no
 * CUDA driver (libcuda.so.1 not found)") and nothing else can be reached:
 * every other call needs the device object.  Every failing driver call
 * becomes a status naming the call and, for launches, the kernel.
 *
 * A typical session (runtime/session.c):
 *   rt_cuda_device_create(ordinal)            primary context, one stream
 *   rt_cuda_module_load(images, source)       per compilation unit: the cubin
 *                                             for this GPU, else NVRTC on the
 *                                             source, else PTX JIT
 *   rt_cuda_module_function(symbol, smem)     per kernel
 *   rt_cuda_alloc(arena_bytes), rt_cuda_upload(constants)
 *   per run: copy inputs in, rt_cuda_launch(kernels) or
 *            rt_cuda_graph_launch(graph captured once), copy outputs out
 *
 * Kernel parameters: an RtCudaLaunch's `params` is the kernelParams array of
 * cuLaunchKernel: params[i] points at the i-th argument's value (for
 * smelt's kernels, an RtCudaPtr).  Argument values are copied when a
 * launch is issued, and a captured graph keeps the values it was captured
 * with: replaying a graph runs on the same buffers, so a session captures
 * with its own device buffers and copies user data in and out of them.
 *
 * Threads: a device object may be used by one thread at a time (any
 * thread: every call makes the device's context current first).  Objects
 * returned through out_ parameters are owned by the caller and released
 * with the matching _destroy/_unload/_free; a device must outlive its
 * modules, buffers and graphs.  Nothing here prints or exits.
 */
#ifndef SMELT_RT_CUDA_DRIVER_H
#define SMELT_RT_CUDA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "include/smelt.h"
#include "ir/status.h"

typedef struct RtCudaDevice RtCudaDevice;
typedef struct RtCudaModule RtCudaModule;
typedef struct RtCudaGraph RtCudaGraph;
typedef uint64_t RtCudaPtr;     /* a device address (CUdeviceptr) */
typedef void *RtCudaFunction;   /* a kernel (CUfunction) */

typedef struct {
  int ordinal;
  char name[256];          /* "NVIDIA H200" */
  int cc;                  /* compute capability, major * 10 + minor: 90 */
  char arch[16];           /* the NVRTC target for this GPU: "sm_90a" on 9.0, else "sm_XY" */
  int sm_count;
  int64_t total_mem;
  int64_t smem_per_block_optin;
  int64_t l2_bytes;
  double mem_bandwidth_gbs; /* theoretical peak from memory clock and bus width; 0 if unknown */
  int driver_version;       /* 13000 for CUDA 13.0 */
} RtCudaInfo;

/* Number of CUDA devices; ST_UNSUPPORTED without a driver. */
smelt_status rt_cuda_device_count(int *out_count) SMELT_MUST_USE;
/* Opens device `ordinal`: loads the driver, cuInit, retains the primary
 * context, creates a stream.  ST_UNSUPPORTED when there is no driver or no
 * such device; SMELT_LIBCUDA names another library to load (tests). */
smelt_status rt_cuda_device_create(int ordinal, RtCudaDevice **out_device) SMELT_MUST_USE;
void rt_cuda_device_destroy(RtCudaDevice *d);
const RtCudaInfo *rt_cuda_device_info(const RtCudaDevice *d);
/* The device's stream (a CUstream), on which every launch and copy here is
 * queued. */
void *rt_cuda_device_stream(const RtCudaDevice *d);
/* The compiler rt_cuda_module_load calls for a unit without a cubin for
 * this GPU (include/smelt.h: smelt_cuda_compile_fn); NULL: none. */
void rt_cuda_device_set_compiler(RtCudaDevice *d, smelt_cuda_compile_fn fn, void *ctx);

/* ---- modules ---- */

/* One compiled form of a compilation unit: a cubin for `arch` and/or PTX. */
typedef struct {
  const char *arch;    /* "sm_90a", "sm_80" */
  const void *cubin;   /* may be NULL */
  size_t cubin_len;
  const char *ptx;     /* NUL-terminated; may be NULL */
} RtCudaImage;

/* How a module was loaded, for reports. */
typedef enum { RT_CUDA_LOADED_CUBIN, RT_CUDA_LOADED_NVRTC, RT_CUDA_LOADED_PTX } RtCudaLoadKind;

/* Loads one compilation unit, in this order of preference:
 *   1. a cubin whose arch runs on this GPU (same major version, minor not
 *      above the GPU's; an 'a' arch only on exactly its GPU);
 *   2. `source` (may be NULL) compiled for the GPU's own arch by the
 *      device's compiler hook (the compiler library's NVRTC, through its
 *      disk cache), when one is set;
 *   3. PTX of an arch the GPU can JIT (driver JIT, ~80 ms).
 * The error says what was tried.  `what` names the unit in messages. */
smelt_status rt_cuda_module_load(RtCudaDevice *d, const RtCudaImage *images, int nimages, const char *source,
                                 const char *what, RtCudaModule **out_module, RtCudaLoadKind *out_kind) SMELT_MUST_USE;
/* Loads a cubin or PTX image as is (cuModuleLoadDataEx; JIT log in errors). */
smelt_status rt_cuda_module_load_image(RtCudaDevice *d, const void *image, const char *what,
                                       RtCudaModule **out_module) SMELT_MUST_USE;
void rt_cuda_module_unload(RtCudaModule *m);
/* The compute capability the loaded code was built for (the cubin's or
 * PTX's arch, or the GPU's for NVRTC): 90 for sm_90a. */
int rt_cuda_module_code_cc(const RtCudaModule *m);
/* Whether launches may use programmatic dependent launch here: a GPU of
 * compute capability 9.0 or later, a driver with cuLaunchKernelEx, and
 * SMELT_CUDA_PDL not set to 0 (for comparisons). */
bool rt_cuda_device_has_pdl(const RtCudaDevice *d);
/* The kernel called symbol; when it needs more than 48 KiB of dynamic shared
 * memory, raises its limit to smem. */
smelt_status rt_cuda_module_function(RtCudaModule *m, const char *symbol, unsigned smem,
                                     RtCudaFunction *out_fn) SMELT_MUST_USE;

/* ---- memory ---- */

/* Device memory, aligned to at least 256 bytes (what cuMemAlloc gives). */
smelt_status rt_cuda_alloc(RtCudaDevice *d, size_t bytes, RtCudaPtr *out_ptr) SMELT_MUST_USE;
void rt_cuda_free(RtCudaDevice *d, RtCudaPtr p);
smelt_status rt_cuda_memset(RtCudaDevice *d, RtCudaPtr p, int byte, size_t n) SMELT_MUST_USE;
/* Whether p is device (or managed) memory of the driver, as opposed to host
 * memory it does not know (cuPointerGetAttribute). */
bool rt_cuda_is_device_pointer(RtCudaDevice *d, const void *p);
/* Whether kernels on this device may read p as it is: device memory of
 * this device (not another's), or managed memory. */
bool rt_cuda_is_local_pointer(RtCudaDevice *d, const void *p);
/* Device memory that may outlive the device object (include/smelt.h:
 * smelt_session_cuda_alloc): it retains the primary context itself, and
 * rt_cuda_buffer_free frees it with the caller's current context left as
 * it was.  cuMemFree waits for work on the memory to finish. */
typedef struct RtCudaBuffer RtCudaBuffer;
smelt_status rt_cuda_buffer_alloc(RtCudaDevice *d, size_t bytes, RtCudaBuffer **out_buffer) SMELT_MUST_USE;
RtCudaPtr rt_cuda_buffer_ptr(const RtCudaBuffer *b);
void rt_cuda_buffer_free(RtCudaBuffer *b);
/* Copies n bytes; src / dst may be host or device memory (told apart with
 * rt_cuda_is_device_pointer).  Ordered on the device's stream and complete
 * when the call returns. */
smelt_status rt_cuda_upload(RtCudaDevice *d, RtCudaPtr dst, const void *src, size_t n) SMELT_MUST_USE;
/* A run's input, copied without waiting: from pageable host memory the
 * driver has staged the bytes when the call returns (src may be reused),
 * from device memory the copy is queued on the stream (src must hold its
 * value until the stream gets there: smelt_session_run waits for it, and
 * smelt_session_enqueue says so); either way the kernels queued after it
 * see the copy.  Pinned host memory as rt_cuda_upload. */
smelt_status rt_cuda_upload_input(RtCudaDevice *d, RtCudaPtr dst, const void *src, size_t n) SMELT_MUST_USE;
/* n bytes device to device, queued on the device's stream (no wait). */
smelt_status rt_cuda_copy_async(RtCudaDevice *d, RtCudaPtr dst, RtCudaPtr src, size_t n) SMELT_MUST_USE;
smelt_status rt_cuda_download(RtCudaDevice *d, void *dst, RtCudaPtr src, size_t n) SMELT_MUST_USE;
/* height rows of width bytes, device to device, src_pitch and dst_pitch
 * bytes apart, queued on the device's stream (no wait). */
smelt_status rt_cuda_copy_2d_async(RtCudaDevice *d, RtCudaPtr dst, size_t dst_pitch, RtCudaPtr src, size_t src_pitch,
                                   size_t width, size_t height) SMELT_MUST_USE;

/* Every constant of g that a kernel reads (VK_CONST values) in one device
 * allocation, each at a 256-byte-aligned offset, copied from the graph.
 * out_ptrs (g->nval entries, owned by the caller) receives each constant's
 * device address and 0 for every other value; *out_block is the
 * allocation (release with rt_cuda_free).  No constants: *out_block = 0. */
struct Graph;
smelt_status rt_cuda_upload_constants(RtCudaDevice *d, const struct Graph *g, RtCudaPtr *out_block,
                                      RtCudaPtr *out_ptrs) SMELT_MUST_USE;

/* ---- running ---- */

typedef struct {
  RtCudaFunction fn;
  const char *name;          /* for messages and timings */
  unsigned grid[3], block[3], smem;
  void **params;             /* kernelParams (see above) */
  /* Launched with programmatic stream serialization (cuLaunchKernelEx):
   * only for a kernel whose code waits for its predecessors
   * (FmtCudaLaunch.pdl) built for sm_90+, where rt_cuda_device_has_pdl. */
  bool pdl;
  /* Not a kernel (fn NULL): work that queues itself on the stream, a
   * collective through NCCL (runtime/nccl.c): enqueue(ctx, stream), also
   * while a graph is captured. */
  smelt_status (*enqueue)(void *ctx, void *stream);
  void *ctx;
} RtCudaLaunch;

/* Issues launches l[0..n) in order on the device's stream (asynchronous). */
smelt_status rt_cuda_launch(RtCudaDevice *d, const RtCudaLaunch *l, int n) SMELT_MUST_USE;
/* Waits for the stream; an error of a kernel that ran shows here. */
smelt_status rt_cuda_sync(RtCudaDevice *d) SMELT_MUST_USE;

/* Captures launches l[0..n) into a CUDA graph (stream capture), once, and
 * instantiates it; rt_cuda_graph_launch replays it (asynchronously). */
smelt_status rt_cuda_graph_capture(RtCudaDevice *d, const RtCudaLaunch *l, int n, RtCudaGraph **out_graph) SMELT_MUST_USE;
smelt_status rt_cuda_graph_launch(RtCudaDevice *d, RtCudaGraph *gr) SMELT_MUST_USE;
void rt_cuda_graph_destroy(RtCudaGraph *gr);

/* Times each launch with events around it: out_ms[i] is the mean over
 * `reps` runs of the whole list (after one warm-up run). */
smelt_status rt_cuda_time_kernels(RtCudaDevice *d, const RtCudaLaunch *l, int n, int reps, double *out_ms) SMELT_MUST_USE;

/* ---- TMA descriptors (Hopper) ---- */

/* Encodes a tiled-copy descriptor (a CUtensorMap, 128 bytes, into out,
 * which must be 64-byte aligned) for the tensor at device address base:
 * dtype a smelt DType (f16, bf16, f32), rank 1..5 dims innermost first,
 * strides in bytes of dims 1..rank-1, box the elements of one copy,
 * swizzle 0/32/64/128 bytes.  Elements outside dims read as zero.
 * ST_UNSUPPORTED on a driver without cuTensorMapEncodeTiled. */
smelt_status rt_cuda_tensor_map(RtCudaDevice *d, int dtype, int rank, RtCudaPtr base, const uint64_t *dims,
                                const uint64_t *strides, const uint32_t *box, int swizzle, void *out) SMELT_MUST_USE;

/* What a loaded kernel uses (cuFuncGetAttribute): for the resource report. */
typedef struct {
  int registers;    /* per thread */
  int local_bytes;  /* per thread: stack frame and spills */
  int static_smem;  /* bytes of static shared memory */
} RtCudaResources;
smelt_status rt_cuda_function_resources(RtCudaDevice *d, RtCudaFunction fn, RtCudaResources *out) SMELT_MUST_USE;

#endif
