/* Collectives between the GPUs of a tensor-parallel CUDA session, through
 * NCCL reached with dlopen (as libcuda is: runtime/cuda_driver.h).
 *
 * smelt links no NCCL.  The library is found in this order:
 *   1. SMELT_NCCL_LIBRARY, a path;
 *   2. "libnccl.so.2" on the loader's path (LD_LIBRARY_PATH, ldconfig);
 *   3. the nvidia-nccl wheel that PyTorch installs: nvidia/nccl/lib/ under
 *      the site-packages of $VIRTUAL_ENV, /opt/ *, /usr/local, /usr, and
 *      pyenv's versions.
 * Without it, creating a group returns ST_UNSUPPORTED naming what was
 * tried.
 *
 * One group per session: one NCCL communicator per rank, all made at once
 * (ncclCommInitAll) for the ranks' devices, which must differ (NCCL does
 * not take two ranks on one GPU).  Every rank's thread then issues its own
 * rank's collectives on its own stream: the calls only queue work, so they
 * may also be captured into a CUDA graph (the session's graph holds the
 * collectives between its kernels).
 *
 * NCCL's NVLink multicast (NVLS) is turned off by setting NCCL_NVLS_ENABLE=0
 * before the first communicator, unless the caller set it: the machines we
 * test on require it, and a decode step's messages are too small to gain.
 * NCCL_RUNTIME_CONNECT=0 likewise: the peers are connected when the
 * communicators are made, not at a collective's first call, which for a
 * session is inside the capture of its first graph.
 * Nothing here prints or exits.
 */
#ifndef SMELT_RT_NCCL_H
#define SMELT_RT_NCCL_H

#include <stddef.h>

#include "ir/dtype.h"
#include "ir/status.h"

typedef struct RtNccl RtNccl;

/* Communicators for n ranks on the CUDA devices ordinals[0..n). */
smelt_status rt_nccl_create(int n, const int *ordinals, RtNccl **out_group) SMELT_MUST_USE;
void rt_nccl_destroy(RtNccl *g);
/* "NCCL 2.28.9 (/path/libnccl.so.2)" */
const char *rt_nccl_describe(const RtNccl *g);

/* Queued on stream (a CUstream of rank's device), not waited for:
 * out = the sum over the ranks of their `in` (count elements of dt; in
 * and out may be the same). */
smelt_status rt_nccl_all_reduce(RtNccl *g, int rank, const void *in, void *out, size_t count, DType dt,
                                void *stream) SMELT_MUST_USE;
/* out = every rank's `bytes` bytes of in, rank after rank. */
smelt_status rt_nccl_all_gather(RtNccl *g, int rank, const void *in, void *out, size_t bytes,
                                void *stream) SMELT_MUST_USE;

#endif
