/* smelt — the runtime's public C API (libsmelt_runtime).
 *
 * Open a kernel bundle, create a session on a device, bind inputs and
 * outputs, run.  This is all a deployed program needs: it links
 * libsmelt_runtime alone (libc, libm, pthread and dl; libcuda is dlopen'ed
 * when a CUDA session is made).  Compiling models is the compiler's API,
 * include/smelt_compile.h (libsmelt).
 *
 * Conventions
 *  - Every function that can fail returns a smelt_status: NULL on success,
 *    otherwise an error object owned by the caller, to be read with
 *    smelt_status_message() and released with smelt_status_free().
 *  - Objects returned through `out_` parameters are owned by the caller and
 *    released with the matching _close/_destroy function.
 *  - The library keeps no global mutable state and never prints or exits.
 *    A bundle may be shared by several sessions; a session must be used by
 *    one thread at a time; sessions on different threads are independent.
 */
#ifndef SMELT_H
#define SMELT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct Status *smelt_status;
typedef struct smelt_bundle smelt_bundle;
typedef struct smelt_session smelt_session;
typedef struct smelt_cuda_buffer smelt_cuda_buffer;

/* Error codes, as returned by smelt_status_code(). */
enum {
  SMELT_OK = 0,
  SMELT_INVALID_INPUT = 1, /* the model, bundle, file or argument is wrong */
  SMELT_IO = 2,
  SMELT_UNSUPPORTED = 3,   /* valid, but not available here (device, dtype) */
  SMELT_NO_MEMORY = 4,
  SMELT_INTERNAL = 5,
};

int smelt_status_code(const struct Status *st);
const char *smelt_status_message(const struct Status *st);
void smelt_status_free(smelt_status st);

/* Element types, as in the model format. */
typedef enum {
  SMELT_F32 = 1, SMELT_F16, SMELT_BF16, SMELT_F64, SMELT_I64, SMELT_I32, SMELT_I8, SMELT_U8, SMELT_BOOL,
} smelt_dtype;


/* Opens and validates a bundle (sizes, offsets, checksums, versions); a
 * truncated or corrupted file is an error, never a crash.  Two checks that
 * read most of a bundle's bytes are deferred to the first
 * smelt_session_create on it: the constants section's checksum, and the
 * content of external weights files (--external-weights; their sizes are
 * checked here).  A corrupted or changed file is refused there, with the
 * file named. */
smelt_status smelt_bundle_open(const char *path, smelt_bundle **out_bundle);
/* The same for a bundle held in memory (len bytes at data, copied: data
 * may be freed once this returns). */
smelt_status smelt_bundle_open_memory(const void *data, size_t len, smelt_bundle **out_bundle);
void smelt_bundle_close(smelt_bundle *bundle);

/* Compiles one CUDA C unit of a bundle for `arch` ("sm_90a") into a cubin
 * (malloc'd, *out_len bytes; the runtime free()s it), for a GPU the bundle
 * has no cubin for.  `what` names the unit in messages.  The runtime has no
 * compiler of its own: smelt_compile.h offers NVRTC's (smelt_nvrtc_compile).
 * SMELT_UNSUPPORTED (no compiler here) lets the runtime fall back to PTX. */
typedef smelt_status (*smelt_cuda_compile_fn)(void *ctx, const char *source, const char *what, const char *arch,
                                              void **out_cubin, size_t *out_len);

typedef struct {
  int threads; /* CPU worker threads; 0 = number of cores */
  /* CUDA: how to compile a unit the bundle has no cubin for; NULL = no
   * compiler (the cubin, else the PTX through the driver's JIT). */
  smelt_cuda_compile_fn cuda_compile;
  void *cuda_compile_ctx;
} smelt_session_options;

/* Specialisations.  A model compiled with several values of a dim
 * (dims "seq=1,16,64", `smelt compile --dim seq=1,16,64`) gives one bundle
 * holding a specialisation per combination of the values (the cartesian
 * product, at most 16); each takes inputs of other shapes, and a session
 * runs the one that fits the tensors bound to it.  A bundle compiled for
 * one combination has one specialisation. */
int smelt_bundle_num_specialisations(const smelt_bundle *bundle);
/* The dims in which specialisation i differs from the others, "seq=16" or
 * "seq=16 batch=2" (owned by the bundle); "" in a bundle of one, NULL for
 * an i out of range. */
const char *smelt_bundle_specialisation_dims(const smelt_bundle *bundle, int i);

/* Creates a session running the bundle on device "cpu" (or "cuda", "cuda:N"
 * where built).  The bundle must outlive the session.  options may be NULL.
 * On a bundle of several specialisations no specialisation is chosen yet:
 * see smelt_session_bind_input_shaped and smelt_session_select. */
smelt_status smelt_session_create(smelt_bundle *bundle, const char *device, const smelt_session_options *options,
                                  smelt_session **out_session);
void smelt_session_destroy(smelt_session *session);

/* The session's inputs and outputs, in model order (the same names,
 * dtypes and ranks in every specialisation).  The dims are those of the
 * chosen specialisation; before one is chosen, a dim in which the
 * specialisations differ is -1. */
typedef struct {
  const char *name;
  smelt_dtype dtype;
  int rank;
  int64_t dims[8];
} smelt_tensor_info;

int smelt_session_num_inputs(const smelt_session *session);
int smelt_session_num_outputs(const smelt_session *session);
void smelt_session_input_info(const smelt_session *session, int i, smelt_tensor_info *out_info);
void smelt_session_output_info(const smelt_session *session, int i, smelt_tensor_info *out_info);

/* The same descriptions from the bundle alone, without a session (so
 * also for a CUDA-only bundle on a machine without a GPU): the tensors of
 * specialisation `spec` (0 <= spec < smelt_bundle_num_specialisations),
 * with its exact dims (a ranged axis, `seq: {max: N}`: its extent at the
 * max, as a session's before its first run).  The counts, names, dtypes
 * and ranks are the same in every specialisation, and so are the states
 * (every specialisation shares them).  SMELT_INVALID_INPUT for a spec or
 * i out of range (then *out_info is zeroed).  The names are owned by the
 * bundle. */
int smelt_bundle_num_inputs(const smelt_bundle *bundle);
int smelt_bundle_num_outputs(const smelt_bundle *bundle);
int smelt_bundle_num_states(const smelt_bundle *bundle);
smelt_status smelt_bundle_input_info(const smelt_bundle *bundle, int spec, int i, smelt_tensor_info *out_info);
smelt_status smelt_bundle_output_info(const smelt_bundle *bundle, int spec, int i, smelt_tensor_info *out_info);
smelt_status smelt_bundle_state_info(const smelt_bundle *bundle, int spec, int i, smelt_tensor_info *out_info);

/* Binds the memory of an input or output by name; `bytes` must equal the
 * tensor's size.  The memory must stay valid until the next run returns.
 * Host pointers are accepted on every device.  With several
 * specialisations and none chosen, `bytes` must be the size of the tensor
 * in at least one of them, or SMELT_INVALID_INPUT says which sizes they
 * take. */
smelt_status smelt_session_bind_input(smelt_session *session, const char *name, const void *data, size_t bytes);
smelt_status smelt_session_bind_output(smelt_session *session, const char *name, void *data, size_t bytes);
/* Binds an input with its shape (rank dims, row-major); `bytes` must be its
 * size.  This is how a session on a bundle of several specialisations
 * picks one: each run uses the specialisation that takes every tensor bound
 * (shapes where given, else sizes; specialisations always differ in the
 * shapes of their inputs).  An input no specialisation takes in that shape
 * is SMELT_INVALID_INPUT at once, e.g. "no specialisation of model
 * 'tiny_llama' takes input 'x' with shape [3,64]; the bundle has seq=1,16,64";
 * bindings that each fit some specialisation but no single one together
 * fail at the run.  Rebinding with other shapes switches specialisation at
 * the next run; a session keeps what it set up for each one it has run. */
smelt_status smelt_session_bind_input_shaped(smelt_session *session, const char *name, const void *data, int rank,
                                             const int64_t *dims, size_t bytes);
/* Chooses specialisation i (0 <= i < smelt_bundle_num_specialisations)
 * for every run from now on; bindings are then checked against it alone,
 * and smelt_session_input_info gives its shapes.  -1 returns to choosing
 * from the bindings at each run. */
smelt_status smelt_session_select(smelt_session *session, int i);
/* The specialisation chosen (by smelt_session_select or by the last run);
 * -1 before any.  Always 0 on a bundle of one. */
int smelt_session_specialisation(const smelt_session *session);

/* State tensors (a model's `state:`, e.g. the KV cache of a causal LM):
 * the session owns them, in host memory on the CPU and in device memory on
 * CUDA.  They are zero when the session is created, every run reads them
 * and updates them in place (nothing copies a cache per run), and every
 * specialisation of the bundle shares them, so a prefill run and the decode
 * runs after it see the same cache.  `bytes` must equal the state's size;
 * reading and writing copy between the state and host memory. */
int smelt_session_num_states(const smelt_session *session);
void smelt_session_state_info(const smelt_session *session, int i, smelt_tensor_info *out_info);
/* Zeroes every state (a new sequence). */
smelt_status smelt_session_reset_state(smelt_session *session);
smelt_status smelt_session_read_state(smelt_session *session, const char *name, void *data, size_t bytes);
smelt_status smelt_session_write_state(smelt_session *session, const char *name, const void *data, size_t bytes);

/* The version of this library, "0.2.0". */
const char *smelt_version(void);

/* Runs the model once on the bound tensors (on a bundle of several
 * specialisations, the one that takes them; see above).
 *
 * On CUDA the run is synchronous: it returns when the GPU work is done.
 * It queues every copy and kernel on the session's own stream
 * (smelt_session_cuda_stream; a non-blocking stream, so it does not wait
 * for the legacy default stream either), waits for that stream, and copies
 * outputs bound in host memory back before returning: bound outputs,
 * device or host, hold the results when it returns, and the inputs'
 * memory may be reused.  It does not wait for work on other streams: memory that
 * another stream is still writing must be made ready first, by making the
 * session's stream wait for it (cuStreamWaitEvent) or by synchronising. */
smelt_status smelt_session_run(smelt_session *session);

/* Queues a run and returns without waiting for it (CUDA; on the CPU it is
 * smelt_session_run).  For a decode loop that feeds each step's result to
 * the next on the device: the host queues step t + 1 while the GPU runs
 * step t, so the GPU never waits for the host between steps.
 *   - Every output must be bound to device memory (SMELT_INVALID_INPUT
 *     otherwise): nothing is copied back.
 *   - Inputs in pageable host memory are copied before the call returns
 *     (the memory may be reused; the driver first waits for the stream's
 *     earlier work, so bind device memory to keep runs back to back).
 *     Inputs in device memory are read when the stream gets there: keep
 *     them unchanged until then, or change them only with work queued on
 *     the session's stream (smelt_session_cuda_stream).
 *   - A failing kernel is reported by a later call: the next enqueue or
 *     run, or smelt_session_synchronize. */
smelt_status smelt_session_enqueue(smelt_session *session);
/* Waits until every run queued on the session has finished (the results
 * of smelt_session_enqueue are then in their device memory); reports a
 * kernel's failure.  NULL at once on the CPU. */
smelt_status smelt_session_synchronize(smelt_session *session);

/* CUDA sessions.  The CUstream the session queues its runs on (valid for
 * the session's life), for a producer of input memory to order its work
 * before the run (the DLPack `stream` protocol): *out_stream is a CUstream.
 * SMELT_UNSUPPORTED on a CPU session. */
smelt_status smelt_session_cuda_stream(const smelt_session *session, void **out_stream);
/* Device memory on the session's GPU (256-byte aligned, uninitialised),
 * e.g. for outputs a caller hands on: bound as an input or output it is
 * used in place, with no staging.  A buffer holds the device's primary
 * context itself, so it stays valid after the session is destroyed, until
 * smelt_cuda_buffer_free (which may be called from any thread, leaves the
 * thread's current CUDA context as it was, and waits for work on the
 * memory to finish, as cuMemFree does).  SMELT_UNSUPPORTED on a CPU
 * session, SMELT_NO_MEMORY when the device has no room. */
smelt_status smelt_session_cuda_alloc(smelt_session *session, size_t bytes, smelt_cuda_buffer **out_buffer);
/* The buffer's device address (a CUdeviceptr), NULL for NULL. */
void *smelt_cuda_buffer_data(const smelt_cuda_buffer *buffer);
void smelt_cuda_buffer_free(smelt_cuda_buffer *buffer);

#ifdef __cplusplus
}
#endif
#endif
