/* Tensor parallelism on the CPU: the ranks of a bundle compiled with --tp
 * (passes/shard.c) run as threads of one process, one session each, and
 * their collectives meet here.
 *
 * Why threads of one process: the public API stays one session per model
 * (smelt run, bench, generate and the Python package need no change), the
 * ranks share the bundle's mapped file and the inputs the caller binds
 * (read in place, never copied per rank), and a collective is a memcpy
 * through shared memory, not a message.  The same shape serves the GPU
 * path later (one thread per device driving NCCL, as PyTorch's
 * single-process multi-device mode and TVM's disco threads do).
 *
 * RtCrew: n - 1 threads and the caller, each running one rank's part of a
 * step (a whole run, or one kernel for bench and check) at the same time.
 * RtComm: the rendezvous.  Each collective is three barriers: every rank
 * publishes its buffer; rank r reduces (or copies) its share of the result
 * from every rank's buffer; every rank copies the others' shares; the last
 * barrier keeps a buffer alive until nobody reads it.  Sums add the ranks
 * in rank order, so every rank gets bit-identical results.  A rank that
 * fails marks the communicator; the others' waits then return an error
 * instead of hanging.  Nothing here prints or exits.
 */
#ifndef SMELT_RT_COMM_H
#define SMELT_RT_COMM_H

#include <stddef.h>

#include "ir/dtype.h"
#include "ir/status.h"

typedef struct RtComm RtComm;
typedef struct RtCrew RtCrew;

smelt_status rt_comm_create(int nranks, RtComm **out_comm) SMELT_MUST_USE;
void rt_comm_destroy(RtComm *c);
/* Before the ranks start a step together: forgets an earlier failure. */
void rt_comm_begin(RtComm *c);
/* Rank `rank` failed: every wait returns an error from now on. */
void rt_comm_fail(RtComm *c, int rank);
/* The rank that failed first in this step, or -1. */
int rt_comm_failed_rank(const RtComm *c);

/* out = the sum over the ranks of their `in` (count elements of dtype dt,
 * a float type); in and out may be the same buffer. */
smelt_status rt_comm_all_reduce(RtComm *c, int rank, const void *in, void *out, size_t count, DType dt) SMELT_MUST_USE;
/* out = the ranks' `in` concatenated block by block: in holds `outer`
 * blocks of `block` bytes, out holds outer * nranks blocks, block o of rank
 * r at (o * nranks + r) * block (a concatenation along one axis). */
smelt_status rt_comm_all_gather(RtComm *c, int rank, const void *in, void *out, size_t outer, size_t block) SMELT_MUST_USE;

/* fn(ctx, r) for every rank r at once, rank 0 on the calling thread;
 * returns when all have returned.  Its result is that of the rank that
 * failed first (rt_comm_failed_rank of comm, when given), the others' are
 * freed. */
typedef smelt_status (*RtRankFn)(void *ctx, int rank);
smelt_status rt_crew_create(int nranks, RtCrew **out_crew) SMELT_MUST_USE;
void rt_crew_destroy(RtCrew *c);
smelt_status rt_crew_run(RtCrew *c, RtComm *comm, RtRankFn fn, void *ctx) SMELT_MUST_USE;

#endif
