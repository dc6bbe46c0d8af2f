/* The CUDA module: from the Kernels of a graph to compilation units of CUDA
 * C source and a launch table.
 *
 * For each Kernel the driver builds the per-kernel state (which values are
 * arguments, which nodes are members, which depend on the anchor), picks
 * the emitter from the anchor's op (none: elementwise; sum/mean/max/min,
 * softmax, norms, global_avg_pool: row reduction; pools; matmul and conv2d:
 * contraction; attention; scatter, argmax, topk, arange: state_ops.c), and wraps the body in an `extern "C" __global__`
 * function whose comment block names the YAML nodes it computes with their
 * shapes, every argument, and the estimated bytes and FLOPs.
 *
 * Every unit starts with the same prelude: the half/bfloat16 headers when a
 * kernel of the unit uses those types, and the small device functions the
 * generated expressions call (one definition of each numeric rule: NaN-
 * propagating max, saturating integer stores, stable sigmoid, ...) and the
 * warp/block reductions.
 *
 * The emitters write the PTX under #ifdef __CUDA_ARCH__ and, beside it,
 * host stand-ins for the CPU emulation the tests run; a product kernel
 * (CgCudaOptions.emulation false) keeps only the device side, as NVRTC
 * would see it (drop_host_side).
 */
#include <assert.h>
#include <ctype.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cu_kernels.h"

/* ---- the prelude ---- */

static const char prelude_common[] =
    "// Numeric rules shared by every kernel (smelt's reference semantics).\n"
    "#define SMELT_INF_F __int_as_float(0x7f800000)\n"
    "#define SMELT_NAN_F __int_as_float(0x7fc00000)\n"
    "#define SMELT_INF_D __longlong_as_double(0x7ff0000000000000LL)\n"
    "#define SMELT_NAN_D __longlong_as_double(0x7ff8000000000000LL)\n"
    "\n"
    "// N elements of T moved as one (16-byte) access.\n"
    "template <typename T, int N> struct __align__(sizeof(T) * N) smelt_pack { T v[N]; };\n"
    "__device__ __forceinline__ bool smelt_aligned(const void *p, int bytes) {\n"
    "  return ((unsigned long long)p & (unsigned long long)(bytes - 1)) == 0;\n"
    "}\n"
    "\n"
    "// exp of a large positive argument would overflow: use the form whose exponent is never positive.\n"
    "__device__ __forceinline__ float smelt_sigmoid(float x) {\n"
    "  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));\n"
    "  const float e = expf(x);\n"
    "  return e / (1.0f + e);\n"
    "}\n"
    "__device__ __forceinline__ double smelt_sigmoid(double x) {\n"
    "  if (x >= 0.0) return 1.0 / (1.0 + exp(-x));\n"
    "  const double e = exp(x);\n"
    "  return e / (1.0 + e);\n"
    "}\n"
    "__device__ __forceinline__ float smelt_silu(float x) { return x * smelt_sigmoid(x); }\n"
    "__device__ __forceinline__ double smelt_silu(double x) { return x * smelt_sigmoid(x); }\n"
    "// f16/bf16 results: the fast exp and divide (a few ulp of float, far under the result's step).\n"
    "__device__ __forceinline__ float smelt_silu_fast(float x) { return __fdividef(x, 1.0f + __expf(-x)); }\n"
    "__device__ __forceinline__ float smelt_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }\n"
    "__device__ __forceinline__ double smelt_gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752)); }\n"
    "__device__ __forceinline__ float smelt_gelu_tanh(float x) {\n"
    "  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));\n"
    "}\n"
    "__device__ __forceinline__ double smelt_gelu_tanh(double x) {\n"
    "  return 0.5 * x * (1.0 + tanh(0.79788456080286536 * (x + 0.044715 * x * x * x)));\n"
    "}\n"
    "\n"
    "// numpy's maximum/minimum: NaN wins.\n"
    "__device__ __forceinline__ float smelt_max_nan(float a, float b) { return (a != a || b != b) ? SMELT_NAN_F : (a > b ? a : b); }\n"
    "__device__ __forceinline__ float smelt_min_nan(float a, float b) { return (a != a || b != b) ? SMELT_NAN_F : (a < b ? a : b); }\n"
    "__device__ __forceinline__ double smelt_max_nan(double a, double b) { return (a != a || b != b) ? SMELT_NAN_D : (a > b ? a : b); }\n"
    "__device__ __forceinline__ double smelt_min_nan(double a, double b) { return (a != a || b != b) ? SMELT_NAN_D : (a < b ? a : b); }\n"
    "__device__ __forceinline__ long long smelt_max_nan(long long a, long long b) { return a > b ? a : b; }\n"
    "__device__ __forceinline__ long long smelt_min_nan(long long a, long long b) { return a < b ? a : b; }\n"
    "__device__ __forceinline__ int smelt_max_nan(int a, int b) { return a > b ? a : b; }\n"
    "__device__ __forceinline__ int smelt_min_nan(int a, int b) { return a < b ? a : b; }\n"
    "\n"
    "// Integers: division truncates; x/0 saturates to the sign's extreme (0/0 is 0),\n"
    "// every result is brought into its dtype's range, float-to-int truncates and\n"
    "// saturates with NaN as 0: what the reference's double arithmetic and store do.\n"
    "__device__ __forceinline__ long long smelt_idiv(long long a, long long b) {\n"
    "  if (b == 0) return a > 0 ? 0x7fffffffffffffffLL : a < 0 ? (-0x7fffffffffffffffLL - 1) : 0;\n"
    "  if (b == -1) return a == (-0x7fffffffffffffffLL - 1) ? 0x7fffffffffffffffLL : -a;\n"
    "  return a / b;\n"
    "}\n"
    "__device__ __forceinline__ long long smelt_sat(long long v, long long lo, long long hi) { return v < lo ? lo : v > hi ? hi : v; }\n"
    "__device__ __forceinline__ long long smelt_sat_i32(long long v) { return smelt_sat(v, -2147483648LL, 2147483647LL); }\n"
    "__device__ __forceinline__ long long smelt_sat_i8(long long v) { return smelt_sat(v, -128, 127); }\n"
    "__device__ __forceinline__ long long smelt_sat_u8(long long v) { return smelt_sat(v, 0, 255); }\n"
    "__device__ __forceinline__ long long smelt_f2i(double v, double lo, double hi) {\n"
    "  if (v != v) return 0;\n"
    "  v = trunc(v);\n"
    "  return (long long)(v < lo ? lo : v > hi ? hi : v);\n"
    "}\n"
    "__device__ __forceinline__ long long smelt_f2i_i64(double v) { return smelt_f2i(v, -9223372036854775808.0, 9223372036854774784.0); }\n"
    "__device__ __forceinline__ long long smelt_f2i_i32(double v) { return smelt_f2i(v, -2147483648.0, 2147483647.0); }\n"
    "__device__ __forceinline__ long long smelt_f2i_i8(double v) { return smelt_f2i(v, -128.0, 127.0); }\n"
    "__device__ __forceinline__ long long smelt_f2i_u8(double v) { return smelt_f2i(v, 0.0, 255.0); }\n"
    "// Quantised weights: i4/u4 two per byte (element i in the low nibble of byte i/2\n"
    "// when i is even), FP8 E4M3 (bias 7, S.1111.111 NaN) and E5M2 (bias 15, IEEE-like):\n"
    "// normal codes rebias their exponent into float's, subnormal ones are m * 2^(1-bias-M)\n"
    "// (exact either way, and safe under flush-to-zero).\n"
    "__device__ __forceinline__ int smelt_u4(const unsigned char *p, long long i) { return (p[i >> 1] >> ((i & 1) * 4)) & 15; }\n"
    "__device__ __forceinline__ int smelt_i4(const unsigned char *p, long long i) { return (smelt_u4(p, i) ^ 8) - 8; }\n"
    "__device__ __forceinline__ float smelt_f8e4m3(unsigned b) {\n"
    "  const unsigned e = (b >> 3) & 15u, m = b & 7u;\n"
    "  float v = e ? __int_as_float((int)(((e + 120u) << 23) | (m << 20))) : (float)m * 0.001953125f;\n"
    "  if (e == 15u && m == 7u) v = SMELT_NAN_F;\n"
    "  return (b & 0x80u) ? -v : v;\n"
    "}\n"
    "__device__ __forceinline__ float smelt_f8e5m2(unsigned b) {\n"
    "  const unsigned e = (b >> 2) & 31u, m = b & 3u;\n"
    "  float v = e ? __int_as_float((int)(((e + 112u) << 23) | (m << 21))) : (float)m * 1.52587890625e-05f;\n"
    "  if (e == 31u) v = m ? SMELT_NAN_F : SMELT_INF_F;\n"
    "  return (b & 0x80u) ? -v : v;\n"
    "}\n"
    "// gather: negative indices count from the end; out of range is clamped (never a fault).\n"
    "__device__ __forceinline__ long long smelt_gather_index(long long i, long long len) {\n"
    "  if (i < 0) i += len;\n"
    "  return i < 0 ? 0 : i >= len ? (len > 0 ? len - 1 : 0) : i;\n"
    "}\n"
    "\n"
    "// Reductions across a warp (shuffles) and a block (shuffles, then one\n"
    "// partial per warp in shared memory).  Every thread gets the result, and\n"
    "// every thread combines the partials in the same order.\n"
    "struct smelt_sum_op { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };\n"
    "struct smelt_max_op { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return smelt_max_nan(a, b); } };\n"
    "struct smelt_min_op { template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return smelt_min_nan(a, b); } };\n"
    "template <typename T, typename Op> __device__ __forceinline__ T smelt_warp_reduce(T v, Op op) {\n"
    "#pragma unroll\n"
    "  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "  return v;\n"
    "}\n"
    "template <typename T, typename Op> __device__ __forceinline__ T smelt_block_reduce(T v, Op op, T *scratch) {\n"
    "  v = smelt_warp_reduce(v, op);\n"
    "  __syncthreads();  // the previous reduction may still be reading scratch\n"
    "  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;\n"
    "  __syncthreads();\n"
    "  v = scratch[0];\n"
    "  for (int w = 1; w < (int)(blockDim.x + 31) / 32; w++) v = op(v, scratch[w]);\n"
    "  return v;\n"
    "}\n"
    "\n"
    "// A TMA descriptor (CUtensorMap), passed by value as a __grid_constant__ parameter.\n"
    "struct __align__(64) smelt_tmap { unsigned long long opaque[16]; };\n"
    "\n"
    "// Programmatic dependent launch (sm_90+): the runtime lets each kernel start while the one\n"
    "// before it is still running.  smelt_pdl_wait() returns once the kernels before this one have\n"
    "// finished and their writes are visible; every kernel calls it before it touches memory other\n"
    "// than its constants, then lets the kernel after it be scheduled.\n"
    "__device__ __forceinline__ void smelt_pdl_wait() {\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
    "  asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
    "  asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "// An L2 prefetch of constant data, issued before smelt_pdl_wait() (a hint: it never faults).\n"
    "__device__ __forceinline__ void smelt_prefetch_l2(const void *p) {\n"
    "#if defined(__CUDA_ARCH__)\n"
    "  asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"(p));\n"
    "#else\n"
    "  (void)p;\n"
    "#endif\n"
    "}\n"
    "// The same for `bytes` bytes from p (both multiples of 16): one bulk prefetch on sm_90+.\n"
    "__device__ __forceinline__ void smelt_prefetch_l2_bulk(const void *p, unsigned bytes) {\n"
    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
    "  asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" :: \"l\"(p), \"r\"(bytes) : \"memory\");\n"
    "#elif defined(__CUDA_ARCH__)\n"
    "  for (unsigned o = 0; o < bytes; o += 128) asm volatile(\"prefetch.global.L2 [%0];\" :: \"l\"((const char *)p + o));\n"
    "#else\n"
    "  (void)p, (void)bytes;\n"
    "#endif\n"
    "}\n";

static const char prelude_f16[] =
    "#include <cuda_fp16.h>\n"
    "// An explicit cast to f16 rounds once, so a later cast back sees the rounded value.\n"
    "__device__ __forceinline__ float smelt_round_f16(float x) { return __half2float(__float2half_rn(x)); }\n";
/* (the CPU emulation's stand-ins go from a product kernel: drop_host_side) */
static const char prelude_h2[] =
    "// f16 pairs in 32-bit words (the first in the low half), for the quantised GEMV's half mode:\n"
    "// the product, a - b, a * b + c (rounded once), the pair of two floats, the sum of a pair in f32.\n"
    "#ifndef __CUDA_ARCH__\n"
    "__device__ __forceinline__ float smelt_h2_half(unsigned a, int hi) {\n"
    "  __half h;\n"
    "  h.x = (unsigned short)(hi ? a >> 16 : a & 0xffffu);\n"
    "  return __half2float(h);\n"
    "}\n"
    "#endif\n"
    "__device__ __forceinline__ unsigned smelt_h2_pack(float lo, float hi) {\n"
    "#ifdef __CUDA_ARCH__\n"
    "  unsigned d;\n"
    "  asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(d) : \"f\"(hi), \"f\"(lo));\n"
    "  return d;\n"
    "#else\n"
    "  return (unsigned)__half_as_ushort(__float2half_rn(lo)) | (unsigned)__half_as_ushort(__float2half_rn(hi)) << 16;\n"
    "#endif\n"
    "}\n"
    "__device__ __forceinline__ unsigned smelt_h2_mul(unsigned a, unsigned b) {\n"
    "#ifdef __CUDA_ARCH__\n"
    "  unsigned d;\n"
    "  asm(\"mul.rn.f16x2 %0, %1, %2;\" : \"=r\"(d) : \"r\"(a), \"r\"(b));\n"
    "  return d;\n"
    "#else\n"
    "  return smelt_h2_pack(smelt_h2_half(a, 0) * smelt_h2_half(b, 0), smelt_h2_half(a, 1) * smelt_h2_half(b, 1));\n"
    "#endif\n"
    "}\n"
    "__device__ __forceinline__ unsigned smelt_h2_sub(unsigned a, unsigned b) {\n"
    "#ifdef __CUDA_ARCH__\n"
    "  unsigned d;\n"
    "  asm(\"sub.rn.f16x2 %0, %1, %2;\" : \"=r\"(d) : \"r\"(a), \"r\"(b));\n"
    "  return d;\n"
    "#else\n"
    "  return smelt_h2_pack(smelt_h2_half(a, 0) - smelt_h2_half(b, 0), smelt_h2_half(a, 1) - smelt_h2_half(b, 1));\n"
    "#endif\n"
    "}\n"
    "__device__ __forceinline__ unsigned smelt_h2_fma(unsigned a, unsigned b, unsigned c) {\n"
    "#ifdef __CUDA_ARCH__\n"
    "  unsigned d;\n"
    "  asm(\"fma.rn.f16x2 %0, %1, %2, %3;\" : \"=r\"(d) : \"r\"(a), \"r\"(b), \"r\"(c));\n"
    "  return d;\n"
    "#else\n"
    "  /* exact product and sum in double, then rounded (to f32 first: a tie there may round twice) */\n"
    "  float lo = (float)((double)smelt_h2_half(a, 0) * smelt_h2_half(b, 0) + smelt_h2_half(c, 0));\n"
    "  float hi = (float)((double)smelt_h2_half(a, 1) * smelt_h2_half(b, 1) + smelt_h2_half(c, 1));\n"
    "  return smelt_h2_pack(lo, hi);\n"
    "#endif\n"
    "}\n"
    "__device__ __forceinline__ float smelt_h2_sum(unsigned a) {\n"
    "#ifdef __CUDA_ARCH__\n"
    "  float lo, hi;\n"
    "  asm(\"{.reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h;}\" : \"=f\"(lo), \"=f\"(hi) : \"r\"(a));\n"
    "  return lo + hi;\n"
    "#else\n"
    "  return smelt_h2_half(a, 0) + smelt_h2_half(a, 1);\n"
    "#endif\n"
    "}\n";
static const char prelude_bf16[] =
    "#include <cuda_bf16.h>\n"
    "__device__ __forceinline__ float smelt_round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }\n";

/* ---- one kernel ---- */

/* A name fit for a comment: no newlines, no end of comment. */
static const char *comment_safe(CuFn *f, const char *s) {
  char *p = (char *)cu_fmt(f, "%s", s ? s : "");
  for (char *q = p; *q; q++) {
    if ((unsigned char)*q < 32) *q = ' ';
    if (q[0] == '*' && q[1] == '/') q[1] = '|';
  }
  return p;
}

static void type_str(const TensorType *t, char *buf, size_t n) { ir_type_str(t, buf, n); }

static void header(CuFn *f, CuBuf *out, const CuLaunch *l, const char *symbol) {
  const Graph *g = f->g;
  const Kernel *k = f->k;
  const Group *gr = f->grp;
  char tb[128];
  cu_buf_printf(out, "/* %s: %s kernel, %d node%s", comment_safe(f, k->name), l->kind, gr->nnodes, gr->nnodes == 1 ? "" : "s");
  if (f->anchor >= 0) cu_buf_printf(out, " around %s", comment_safe(f, ir_node_name(g, &g->node[f->anchor])));
  cu_buf_printf(out, "\n");
  for (int i = 0; i < gr->nnodes; i++) {
    const Node *n = &g->node[gr->nodes[i]];
    cu_buf_printf(out, " *   ");
    for (int o = 0; o < n->nout; o++)
      cu_buf_printf(out, "%s%s", o ? ", " : "", comment_safe(f, g->val[n->out[o]].name));
    cu_buf_printf(out, " = %s(", ir_op_name(n->op));
    for (int j = 0; j < n->nin; j++) cu_buf_printf(out, "%s%s", j ? ", " : "", comment_safe(f, g->val[n->in[j]].name));
    type_str(&g->val[n->out[0]].type, tb, sizeof tb);
    cu_buf_printf(out, ")  %s%s\n", tb, n->loc.line ? cu_fmt(f, "  (line %d)", n->loc.line) : "");
  }
  cu_buf_printf(out, " * arguments:\n");
  for (int a = 0; a < k->nargs; a++) {
    const Value *v = &g->val[k->args[a]];
    type_str(&v->type, tb, sizeof tb);
    const char *role = a >= f->nin ? "output" : v->kind == VK_CONST ? "constant" : v->kind == VK_INPUT ? "graph input" : "input";
    cu_buf_printf(out, " *   a%d  %s  %s  (%s)\n", a, comment_safe(f, v->name), tb, role);
  }
  cu_buf_printf(out, " * estimated %.0f bytes moved, %.0f FLOPs; launch: grid %ux%ux%u, block %ux%ux%u, %u bytes dynamic shared memory\n */\n",
                k->bytes, k->flops, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2], l->smem);
  if (l->variant[0]) cu_buf_printf(out, "// variant: %s\n", l->variant);
  unsigned threads = l->block[0] * l->block[1] * l->block[2];
  if (l->min_blocks > 0)
    cu_buf_printf(out, "extern \"C\" __global__ void __launch_bounds__(%u, %d) %s(", threads, l->min_blocks, symbol);
  else
    cu_buf_printf(out, "extern \"C\" __global__ void __launch_bounds__(%u) %s(", threads, symbol);
  for (int a = 0; a < k->nargs; a++) {
    const Value *v = &g->val[k->args[a]];
    cu_buf_printf(out, "%s%s%s *__restrict__ a%d", a ? ", " : "", a < f->nin ? "const " : "", cu_stype(v->type.dt), a);
  }
  /* after the arguments: with ranged dims the run's value of each range
   * (format/cuda_launch.h), the workspace, then the TMA descriptors by value */
  bool ranged = g->nranges > 0;
  if (ranged) cu_buf_printf(out, "%sconst long long *__restrict__ rng", k->nargs ? ", " : "");
  if (l->workspace) cu_buf_printf(out, "%sunsigned char *__restrict__ ws", k->nargs || ranged ? ", " : "");
  for (int t = 0; t < l->ntmaps; t++)
    cu_buf_printf(out, "%sconst __grid_constant__ smelt_tmap tm%d", k->nargs || ranged || l->workspace || t ? ", " : "", t);
  cu_buf_printf(out, ") {\n");
  if (l->pre_wait) cu_buf_printf(out, "%s", l->pre_wait);
  cu_buf_printf(out, "  smelt_pdl_wait();\n");
}

/* Which types a kernel touches, for the prelude's includes. */
static void kernel_types(const Graph *g, const Kernel *k, bool *f16, bool *bf16) {
  const Group *gr = &g->groups[k->group];
  for (int a = 0; a < k->nargs; a++) {
    DType dt = g->val[k->args[a]].type.dt;
    *f16 |= dt == DT_F16;
    *bf16 |= dt == DT_BF16;
  }
  for (int i = 0; i < gr->nnodes; i++) {
    const Node *n = &g->node[gr->nodes[i]];
    for (int o = 0; o < n->nout; o++) {
      DType dt = g->val[n->out[o]].type.dt;
      *f16 |= dt == DT_F16;
      *bf16 |= dt == DT_BF16;
    }
  }
}

static bool is_row_reduction(Op op) {
  switch (op) {
  case OP_SUM: case OP_MEAN: case OP_MAX: case OP_MIN: case OP_SOFTMAX: case OP_LOG_SOFTMAX:
  case OP_LAYER_NORM: case OP_RMS_NORM: case OP_GLOBAL_AVG_POOL: return true;
  default: return false;
  }
}

/* ---- the host side ---- */

/* Whether line [p, end) is the directive `word` followed by `arg` (or by
 * anything when arg is NULL), after indentation. */
static bool is_directive(const char *p, const char *end, const char *word, const char *arg) {
  while (p < end && *p == ' ') p++;
  size_t n = strlen(word);
  if ((size_t)(end - p) < n || memcmp(p, word, n) != 0) return false;
  p += n;
  if (!arg) return p == end || *p == ' ';
  while (p < end && *p == ' ') p++;
  size_t a = strlen(arg);
  return (size_t)(end - p) == a && memcmp(p, arg, a) == 0;
}

/* Keeps what NVRTC compiles of a kernel body: the emitters write the PTX
 * under `#ifdef __CUDA_ARCH__` and the CPU emulation's stand-ins under
 * `#else` or `#ifndef __CUDA_ARCH__`; without CgCudaOptions.emulation the
 * device side stays, without its directives, and the host side goes.
 * Other conditionals are copied as they are. */
static void drop_host_side(CuBuf *body) {
  enum { MAX_NEST = 64 };
  bool arch[MAX_NEST], device[MAX_NEST]; /* per open conditional: on __CUDA_ARCH__; in its device branch */
  int depth = 0, hidden = 0;             /* hidden: open __CUDA_ARCH__ conditionals in their host branch */
  CuBuf out = {0};
  const char *p = body->s ? body->s : "", *end = p + body->len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *le = nl ? nl : end, *next = nl ? nl + 1 : end;
    bool keep = true;
    if (is_directive(p, le, "#ifdef", "__CUDA_ARCH__") || is_directive(p, le, "#ifndef", "__CUDA_ARCH__")) {
      bool dev = is_directive(p, le, "#ifdef", "__CUDA_ARCH__");
      assert(depth < MAX_NEST);
      arch[depth] = true, device[depth++] = dev;
      hidden += !dev;
      keep = false;
    } else if (is_directive(p, le, "#if", NULL) || is_directive(p, le, "#ifdef", NULL) || is_directive(p, le, "#ifndef", NULL)) {
      assert(depth < MAX_NEST);
      arch[depth] = false, device[depth++] = true;
      keep = hidden == 0;
    } else if (depth > 0 && arch[depth - 1] && is_directive(p, le, "#else", NULL)) {
      hidden += device[depth - 1] ? 1 : -1;
      device[depth - 1] = !device[depth - 1];
      keep = false;
    } else if (depth > 0 && is_directive(p, le, "#endif", NULL)) {
      depth--;
      if (arch[depth]) hidden -= !device[depth];
      keep = !arch[depth] && hidden == 0;
    } else {
      keep = hidden == 0;
    }
    if (keep) cu_buf_append(&out, p, (size_t)(next - p));
    p = next;
  }
  assert(depth == 0 && hidden == 0);
  cu_buf_free(body);
  *body = out;
}

/* What makes two generated kernels the same machine code: the launch
 * shape, the parameter types and the body without its comments (which
 * name the model's nodes, different in every layer). */
static char *kernel_key(const CuFn *f, const CuLaunch *l, const CuBuf *body) {
  CuBuf key = {0};
  cu_buf_printf(&key, "%u %u %u %u %u %u %u %d %llu %d|", l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1],
                l->block[2], l->smem, l->min_blocks, (unsigned long long)l->workspace, l->ntmaps);
  for (int t = 0; t < l->ntmaps; t++) {
    const FmtCudaTmap *m = &l->tmaps[t];
    cu_buf_printf(&key, "%d %d %d %d", m->arg, m->dtype, m->rank, m->swizzle);
    for (int d = 0; d < m->rank; d++) cu_buf_printf(&key, " %llu %u", (unsigned long long)m->dims[d], m->box[d]);
    cu_buf_printf(&key, "|");
  }
  for (int a = 0; a < f->k->nargs; a++)
    cu_buf_printf(&key, "%s%s,", a < f->nin ? "c" : "", cu_stype(f->g->val[f->k->args[a]].type.dt));
  const char *p = body->s ? body->s : "", *end = p + body->len;
  while (p < end) {
    /* the code up to the next comment, then skip the comment */
    const char *q = p;
    while (q + 1 < end && !(q[0] == '/' && (q[1] == '/' || q[1] == '*'))) q++;
    if (q + 1 >= end) q = end;
    cu_buf_append(&key, p, (size_t)(q - p));
    if (q == end) break;
    if (q[1] == '/') {
      while (q < end && *q != '\n') q++;
    } else {
      q += 2;
      while (q + 1 < end && !(q[0] == '*' && q[1] == '/')) q++;
      q = q + 2 <= end ? q + 2 : end;
    }
    p = q;
  }
  return cu_buf_take(&key);
}

static smelt_status gen_kernel(const Graph *g, const Kernel *k, const CgCudaOptions *opt, const char *force,
                               const char *symbol, CuBuf *out, FmtCudaLaunch *launch, char **out_key) {
  CuFn f;
  RETURN_IF_ERROR(cu_fn_init(&f, g, k, opt, force));
  int count = f.nanchors;

  CuBuf body = {0};
  f.out = &body;
  f.indent = 1;
  CuLaunch l = {.grid = {1, 1, 1}, .block = {1, 1, 1}, .kind = "elementwise"};
  if (count > 1) {
    cu_fail(&f, ST_UNSUPPORTED, "the group has %d reduction/contraction/opaque nodes; a kernel is built around one", count);
  } else if (f.anchor < 0) {
    cu_emit_elemwise(&f, &l);
  } else {
    Op op = g->node[f.anchor].op;
    if (is_row_reduction(op)) cu_emit_reduction(&f, &l);
    else if (op == OP_MAX_POOL2D || op == OP_AVG_POOL2D) cu_emit_pool(&f, &l);
    else if (op == OP_MATMUL || op == OP_CONV2D) cu_emit_contraction(&f, &l);
    else if (op == OP_ATTENTION) cu_emit_attention(&f, &l);
    else if (op == OP_SCATTER || op == OP_ARGMAX || op == OP_TOPK || op == OP_ARANGE) cu_emit_state_op(&f, &l);
    else cu_fail(&f, ST_UNSUPPORTED, "no CUDA lowering for %s", ir_op_name(op));
  }
  smelt_status st = f.err;
  f.err = NULL;
  if (!st && !opt->emulation) drop_host_side(&body);
  if (!st && body.oom) st = st_error(ST_NO_MEMORY, "out of memory generating CUDA code");
  if (!st) {
    header(&f, out, &l, symbol);
    cu_buf_append(out, body.s ? body.s : "", body.len);
    cu_buf_printf(out, "}\n\n");
    memset(launch, 0, sizeof *launch);
    snprintf(launch->name, sizeof launch->name, "%s", k->name);
    snprintf(launch->symbol, sizeof launch->symbol, "%s", symbol);
    launch->nargs = k->nargs;
    for (int i = 0; i < 3; i++) launch->grid[i] = l.grid[i], launch->block[i] = l.block[i];
    launch->smem = l.smem;
    launch->kind = l.kind;
    launch->vectorised = f.vectorised;
    snprintf(launch->variant, sizeof launch->variant, "%s", l.variant);
    launch->workspace = l.workspace;
    launch->ntmaps = l.ntmaps;
    memcpy(launch->tmaps, l.tmaps, sizeof l.tmaps);
    launch->pdl = true; /* the header's smelt_pdl_wait() */
    *out_key = kernel_key(&f, &l, &body);
    if (f.err) { /* out of memory in the header */
      st = f.err;
      f.err = NULL;
    } else if (out->oom || !*out_key) {
      st = st_error(ST_NO_MEMORY, "out of memory generating CUDA code");
    }
  }
  cu_buf_free(&body);
  cu_fn_fini(&f);
  return st;
}

/* A C identifier from a kernel name: [A-Za-z0-9_], not starting with a digit. */
static void make_symbol(const char *name, char *out, size_t cap) {
  size_t n = 0;
  if (!isalpha((unsigned char)name[0]) && name[0] != '_' && n + 1 < cap) out[n++] = 'k';
  for (const char *p = name; *p && n + 1 < cap; p++) out[n++] = isalnum((unsigned char)*p) ? *p : '_';
  out[n] = 0;
}

smelt_status cg_cuda_generate(const Graph *g, const Kernel *k, int nk, const CgCudaOptions *opt,
                              FmtCudaModule **out_module) {
  *out_module = NULL;
  CgCudaOptions dflt = {0};
  if (!opt) opt = &dflt;
  FmtCudaModule *m = calloc(1, sizeof *m);
  if (!m) return st_error(ST_NO_MEMORY, "out of memory generating CUDA code");
  m->nkernels = nk;
  m->kernels = calloc((size_t)(nk ? nk : 1), sizeof *m->kernels);
  CuBuf *texts = calloc((size_t)(nk ? nk : 1), sizeof *texts);
  bool *f16 = calloc((size_t)(nk ? nk : 1), sizeof(bool)), *bf16 = calloc((size_t)(nk ? nk : 1), sizeof(bool));
  char **keys = calloc((size_t)(nk ? nk : 1), sizeof(char *));
  int *dup_of = malloc(sizeof(int) * (size_t)(nk ? nk : 1)), *ndup = calloc((size_t)(nk ? nk : 1), sizeof(int));
  int *uniq_idx = malloc(sizeof(int) * (size_t)(nk ? nk : 1));
  for (int i = 0; dup_of && i < nk; i++) dup_of[i] = -1;
  if (!m->kernels || !texts || !f16 || !bf16 || !keys || !dup_of || !ndup || !uniq_idx) {
    free(texts), free(f16), free(bf16), free(keys), free(dup_of), free(ndup), free(uniq_idx);
    fmt_cuda_module_free(m);
    return st_error(ST_NO_MEMORY, "out of memory generating CUDA code");
  }
  smelt_status st = NULL;
  for (int i = 0; i < nk && !st; i++) {
    if (fmt_kernel_collective(g, &k[i])) {
      /* all_reduce / all_gather (passes/shard.c): no code; the runtime
       * issues it through NCCL on the rank's stream (runtime/nccl.c) */
      FmtCudaLaunch *l = &m->kernels[i];
      snprintf(l->name, sizeof l->name, "%s", k[i].name);
      make_symbol(k[i].name, l->symbol, sizeof l->symbol);
      l->nargs = k[i].nargs;
      for (int d = 0; d < 3; d++) l->grid[d] = l->block[d] = 1;
      l->kind = "collective";
      dup_of[i] = nk; /* in no unit */
      continue;
    }
    char sym[sizeof m->kernels[i].symbol - 8];
    make_symbol(k[i].name, sym, sizeof sym);
    /* names are unique as kernels go, but sanitising may make two equal */
    char uniq[sizeof m->kernels[i].symbol];
    snprintf(uniq, sizeof uniq, "%s", sym);
    for (int n = 2;; n++) {
      bool clash = false;
      for (int j = 0; j < i && !clash; j++) clash = dup_of[j] != nk && strcmp(m->kernels[j].symbol, uniq) == 0;
      if (!clash) break;
      snprintf(uniq, sizeof uniq, "%.96s_%d", sym, n);
    }
    st = gen_kernel(g, &k[i], opt, opt->force ? opt->force[i] : NULL, uniq, &texts[i], &m->kernels[i], &keys[i]);
    if (!st) kernel_types(g, &k[i], &f16[i], &bf16[i]);
    /* the same code as an earlier kernel (the same layer again): launch
     * that one's function, compile it once */
    for (int j = 0; j < i && !st; j++)
      if (dup_of[j] < 0 && keys[j] && keys[i] && strcmp(keys[j], keys[i]) == 0) {
        dup_of[i] = j;
        memcpy(m->kernels[i].symbol, m->kernels[j].symbol, sizeof m->kernels[i].symbol);
        cu_buf_free(&texts[i]);
        ndup[j]++;
        break;
      }
  }
  /* the kernels each shared function stands for, in its comment */
  for (int j = 0; j < nk && !st; j++) {
    if (dup_of[j] >= 0 || ndup[j] == 0) continue;
    CuBuf t = {0};
    cu_buf_printf(&t, "// %s is also launched for", m->kernels[j].symbol);
    for (int i = j + 1; i < nk; i++)
      if (dup_of[i] == j) cu_buf_printf(&t, " %s", m->kernels[i].name);
    cu_buf_printf(&t, " (the same code).\n");
    cu_buf_append_buf(&t, &texts[j]);
    cu_buf_free(&texts[j]);
    texts[j] = t;
    if (t.oom) st = st_error(ST_NO_MEMORY, "out of memory generating CUDA code");
  }
  if (!st) {
    int nu = 0;
    for (int i = 0; i < nk; i++)
      if (dup_of[i] < 0) uniq_idx[nu++] = i;
    int max_units = opt->max_units > 0 ? opt->max_units : 16;
    m->nunits = nu < max_units ? nu : max_units;
    if (m->nunits < 1) m->nunits = 1;
    m->units = calloc((size_t)m->nunits, sizeof(char *));
    if (!m->units) st = st_error(ST_NO_MEMORY, "out of memory generating CUDA code");
    /* contiguous runs of the distinct kernels, sizes differing by at most one */
    for (int u = 0; u < m->nunits && !st; u++) {
      int first = (int)((int64_t)nu * u / m->nunits), last = (int)((int64_t)nu * (u + 1) / m->nunits);
      bool h = false, b = false;
      for (int x = first; x < last; x++) h |= f16[uniq_idx[x]], b |= bf16[uniq_idx[x]];
      CuBuf src = {0};
      cu_buf_printf(&src, "// smelt: CUDA C for model '%s', unit %d of %d (kernels %d..%d).\n",
                    g->name ? g->name : "", u, m->nunits, last > first ? uniq_idx[first] : 0,
                    last > first ? uniq_idx[last - 1] : -1);
      cu_buf_printf(&src, "// Generated code: every kernel's comment names the model nodes it computes.\n");
      if (h) {
        CuBuf h2 = {0};
        cu_buf_printf(&h2, "%s", prelude_h2);
        if (!opt->emulation) drop_host_side(&h2);
        cu_buf_printf(&src, "%s", prelude_f16);
        cu_buf_append_buf(&src, &h2);
        cu_buf_free(&h2);
      }
      if (b) cu_buf_printf(&src, "%s", prelude_bf16);
      cu_buf_printf(&src, "%s\n", prelude_common);
      for (int x = first; x < last; x++) {
        int i = uniq_idx[x];
        m->kernels[i].unit = u;
        cu_buf_append_buf(&src, &texts[i]);
      }
      m->units[u] = cu_buf_take(&src);
      if (!m->units[u]) st = st_error(ST_NO_MEMORY, "out of memory generating CUDA code");
    }
    for (int i = 0; i < nk && !st; i++)
      if (dup_of[i] >= 0 && dup_of[i] < nk) m->kernels[i].unit = m->kernels[dup_of[i]].unit;
  }
  for (int i = 0; i < nk; i++) {
    cu_buf_free(&texts[i]);
    free(keys[i]);
  }
  free(texts), free(f16), free(bf16), free(keys), free(dup_of), free(ndup), free(uniq_idx);
  if (st) {
    fmt_cuda_module_free(m);
    return st;
  }
  *out_module = m;
  return NULL;
}

