// A CPU emulation of the CUDA C that smelt generates, for tests on machines
// without a GPU: the generated source is compiled by the host C++ compiler
// with this header forced in front (-include), into a shared object the test
// loads.
//
// Every thread of a block is a pthread; blocks run one after another, so a
// __shared__ variable (a function-local static here) is shared by exactly
// the threads of the running block.  __syncthreads is a barrier of the
// block, __shfl_xor_sync and __shfl_sync an exchange through a per-warp slot array between
// two barriers of the warp.  This is faithful for code whose barriers and
// shuffles are reached by every thread of the block / warp, which is what
// CUDA itself requires.  It is slow, and meant for small shapes.
//
// __half and __nv_bfloat16 come from the cuda_fp16.h / cuda_bf16.h beside
// this file (storage structs and round-to-nearest-even conversions), so the
// host needs no CUDA headers.
#ifndef SMELT_CUDA_EMU_HPP
#define SMELT_CUDA_EMU_HPP

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <cstdio>
#include <utility>

struct dim3 {
  unsigned x, y, z;
};

extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static
#define __align__(n) alignas(n)

void smelt_emu_syncthreads();
void smelt_emu_warp_sync();
void *smelt_emu_warp_slots();
#define __syncthreads() smelt_emu_syncthreads()

template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
  T *slots = (T *)smelt_emu_warp_slots();
  unsigned lane = threadIdx.x % 32;
  slots[lane] = v;
  smelt_emu_warp_sync();
  T r = slots[lane ^ (unsigned)o];
  smelt_emu_warp_sync();
  return r;
}

template <typename T> T __shfl_sync(unsigned, T v, int src) {
  T *slots = (T *)smelt_emu_warp_slots();
  unsigned lane = threadIdx.x % 32;
  slots[lane] = v;
  smelt_emu_warp_sync();
  T r = slots[src & 31];
  smelt_emu_warp_sync();
  return r;
}

inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline double __longlong_as_double(long long i) {
  double d;
  memcpy(&d, &i, 8);
  return d;
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline void __sincosf(float x, float *s, float *c) {
  *s = sinf(x);
  *c = cosf(x);
}
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
using std::erf;
using std::exp;
using std::log;
using std::pow;
using std::sqrt;
using std::tanh;
using std::trunc;

// Calls a kernel with its pointer arguments taken from args[].
template <typename... A, size_t... I> void smelt_emu_apply(void (*fn)(A...), void **args, std::index_sequence<I...>) {
  fn((A)args[I]...);
}
template <typename... A> void smelt_emu_call(void (*fn)(A...), void **args) {
  smelt_emu_apply(fn, args, std::index_sequence_for<A...>{});
}

#ifdef SMELT_EMU_IMPLEMENTATION
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

static pthread_barrier_t emu_block_barrier;
static pthread_barrier_t emu_warp_barrier[32];
static long long emu_warp_slots[32][32 * 2]; /* room for 32 doubles per warp */

void smelt_emu_syncthreads() { pthread_barrier_wait(&emu_block_barrier); }
void smelt_emu_warp_sync() { pthread_barrier_wait(&emu_warp_barrier[threadIdx.x / 32]); }
void *smelt_emu_warp_slots() { return emu_warp_slots[threadIdx.x / 32]; }

struct EmuThread {
  void (*wrapper)(void **);
  void **args;
  unsigned tid;
};

static void *emu_thread(void *p) {
  EmuThread *t = (EmuThread *)p;
  threadIdx = dim3{t->tid % blockDim.x, (t->tid / blockDim.x) % blockDim.y, t->tid / (blockDim.x * blockDim.y)};
  for (unsigned z = 0; z < gridDim.z; z++)
    for (unsigned y = 0; y < gridDim.y; y++)
      for (unsigned x = 0; x < gridDim.x; x++) {
        blockIdx = dim3{x, y, z};
        t->wrapper(t->args);
        /* the block's static (shared) variables are reused by the next block */
        pthread_barrier_wait(&emu_block_barrier);
      }
  return nullptr;
}

// Runs wrapper(args) as a grid of blocks; returns 0, or -1 if threads could
// not be started.
extern "C" int smelt_emu_launch(void (*wrapper)(void **), void **args, const unsigned *grid, const unsigned *block) {
  gridDim = dim3{grid[0], grid[1], grid[2]};
  blockDim = dim3{block[0], block[1], block[2]};
  unsigned n = block[0] * block[1] * block[2];
  if (n == 0 || n > 1024 || (n > 32 && n % 32)) return -1;
  pthread_barrier_init(&emu_block_barrier, nullptr, n);
  for (unsigned w = 0; w < (n + 31) / 32; w++) pthread_barrier_init(&emu_warp_barrier[w], nullptr, n < 32 ? n : 32);
  pthread_t th[1024];
  EmuThread ts[1024];
  int rc = 0;
  unsigned started = 0;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  for (unsigned i = 0; i < n; i++) {
    ts[i] = EmuThread{wrapper, args, i};
    if (pthread_create(&th[i], &attr, emu_thread, &ts[i]) != 0) {
      rc = -1;
      break;
    }
    started++;
  }
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    /* cannot run a partial block: the started threads would wait forever */
    fprintf(stderr, "smelt_emu_launch: could not start %u threads\n", n);
    abort();
  }
  for (unsigned i = 0; i < started; i++) pthread_join(th[i], nullptr);
  pthread_barrier_destroy(&emu_block_barrier);
  for (unsigned w = 0; w < (n + 31) / 32; w++) pthread_barrier_destroy(&emu_warp_barrier[w]);
  return rc;
}
#endif

#endif
