/* Attention: y = softmax(scale * q k^T + mask) v over [B,H,S,D] queries and
 * [B,Hkv,T,D] keys/values (grouped-query: query head h reads kv head
 * h / (H / Hkv)), causal with the last query aligned to the last key
 * (query i sees keys j <= T - S + i), with an optional mask broadcast to
 * [B,H,S,T] (bool: may attend; otherwise added to the scores).  None of
 * the kernels materialises the S x T scores: each keeps, per query row, the
 * running maximum m, the running sum l of exp(s - m) and the output
 * accumulator, and rescales both by exp(m_old - m_new) when m grows (the
 * online softmax).  Three variants, chosen by token (cg_cuda.h):
 *
 * "flash:bm=..,bn=..,w=..,st=..[,ks=..]"  prefill, FlashAttention-2 style, f16/bf16
 *   with f32 accumulation, D = Dv a multiple of 16 up to 128, no mask.  A
 *   block of w warps owns bm query rows of one (b, h), bm / w = 16 or 32
 *   rows per warp (one or two m16 tiles).  The Q tile is copied to shared
 *   memory once; each warp keeps its rows' A fragments in registers
 *   (ldmatrix) when they take at most 32 per lane, else reads them again
 *   per k step (32 rows of a 128-wide head: the O accumulators and the
 *   scores leave no room).  K and V tiles of bn keys stream through `st` shared-memory
 *   buffers with 16-byte cp.async (zero-filled past T), rows padded by 16
 *   bytes so that ldmatrix's eight row addresses hit distinct banks.  Per
 *   tile a warp computes S = Q K^T with mma.sync.m16n8k16 (f32
 *   accumulators; K rows are the B operand "col" as stored), masks only
 *   where the tile crosses the causal diagonal or the end of the keys,
 *   takes row maxima over its accumulator fragments (a row's 4 lanes
 *   exchange with two shuffles), computes p = exp2(s * scale * log2(e) -
 *   m * scale * log2(e)) (ex2.approx), and turns p into the A fragments of the next
 *   product in registers (the m16n8 accumulator layout of two adjacent n8
 *   tiles is exactly the m16k16 A layout) to add P V with mma.sync (V
 *   fragments through ldmatrix.trans).  Causal blocks stop at the last tile
 *   their rows can see and run longest-first; a warp whose rows see no key
 *   of a tile skips it.  l is summed per lane and reduced across the quad
 *   once at the end; O / l goes through the group's epilogue.  Optional
 *   ",ks=2|4" (key split): ks groups of w warps share the rows, group kg
 *   taking keys kg * bn/ks .. of every tile, so that each warp does 1/ks of
 *   the block's work per tile (the blocks of the last causal rows, which
 *   see every key, decide a short prefill's time); at the end groups 1..
 *   leave (o, m, l) in the freed shared memory, lane by lane, and group 0
 *   merges them like two online-softmax states before its epilogue.
 *
 * "flashdec:split=..,bn=..,w=..[,pf=0|1|2][,tr=0|1]"  decode (few query rows
 *   per kv head), f16/bf16, D = Dv with D/8 dividing 32, no mask.
 *   Bandwidth bound: K and V must be read exactly once with 16-byte loads
 *   and enough of them in flight.  K and V are loaded when they are
 *   arguments, or when they are a concat along the keys of an argument and
 *   new keys (a KV cache with the step's key appended: the cache's keys are
 *   loaded, the rest computed); else computed element by element where
 *   they are used.  A block per (b, kv head, row chunk, split) takes the
 *   query rows of every query head sharing its kv head (up to 8 per block; more
 *   rows make more row chunks) against one of `split` slices of the keys.
 *   D/8 lanes form a key group: lane c of a group holds features 8c..8c+7
 *   of every query row (pre-scaled by scale * log2(e); computed once per
 *   block into shared memory, kept in registers for one or two rows, read
 *   from shared memory per key for more, leaving the registers to the
 *   accumulators) and loads the same 16 bytes of K and of V of its key, so
 *   the score needs only a shuffle sum over the group and P V needs no
 *   exchange at all (",tr=1": the U x rows scores of a step summed in one
 *   transposed reduction -- each shuffle level halves the values a lane
 *   keeps, then the levels backwards hand them all out again -- instead of
 *   a chain of log2(D/8) dependent shuffles per score).  Each group runs its own online softmax over bn /
 *   (groups per block) keys per step (that many 16-byte loads of K and of V
 *   in flight per lane, kept as 32-bit words); with ",pf=1" the loads of
 *   the next step are issued before the math of this one (a register
 *   software pipeline: 2x the chunks in flight, no exposed load latency per
 *   step), with ",pf=2" those of the step after next (3x), and the first
 *   steps' loads go out before the query prologue.  The groups are merged
 *   with shuffles, the warps through shared memory (parallel over the
 *   features).  With split > 1 each block writes its partial
 *   (m, l, acc[D]) per row to the workspace; the last block of a (b, kv
 *   head, row chunk) to finish -- found with __threadfence and an atomicAdd
 *   on a counter there -- merges the partials with every load in flight at
 *   once (the fixed cost that dominated short decodes when each output
 *   element walked the splits one dependent load after another; each
 *   thread's first partials are loaded together with the (m, l), one round
 *   trip to memory): a warp per
 *   row reads the splits' (m, l) on its lanes, reduces the maximum and the
 *   sum with shuffles and leaves the weights exp2(m_s - max) in shared
 *   memory; then the threads sum weight * partial over the splits, 16 bytes
 *   per load (the splits cut into groups when the row chunk has fewer
 *   4-float chunks than the block has threads), run the epilogue, zero what
 *   they read and reset the counter, so the workspace is left all-zero.
 *   The defaults come from H200 timings: 4 warps for one or two rows per kv
 *   head, loads two steps ahead; 8 warps for more, one step ahead; 2 keys
 *   per group and step; the transposed reduction; splits for ~512 blocks
 *   but at least 16 KB of K and V per block.
 *
 * "simple"  everything else (a mask, f32/f64, other head dims): one warp
 *   per query row, four rows per block.  Lane l holds the query features
 *   l, l+32, ... (scaled) and the output features l, l+32, ...  The keys
 *   are visited once; for key j the warp computes the score (partial dot
 *   products, then a shuffle reduction) and updates m, l and the
 *   accumulator.  A key masked out (score -inf) is skipped; a row with no
 *   visible key yields 0, like the reference.  Accumulation in float
 *   (double for f64).
 *
 * Operands: an operand that is a kernel argument is copied with 16-byte
 * accesses (cp.async, or vector loads in flashdec; with a uniform fallback
 * to plain loads when the pointers are not 16-byte aligned and alignment is
 * not guaranteed); an operand computed inside the group (rope, transpose,
 * reshape in front of the attention) is computed element by element with
 * cu_emit where the tile is filled.
 *
 * The PTX (cp.async, ldmatrix, mma.sync, cvt) is under #ifdef
 * __CUDA_ARCH__.  On the host (the CPU emulation of tests/gpu/cuda_emu.hpp)
 * each lane computes the fragments the PTX ISA's layouts give it, from the
 * shared-memory row addresses the lanes would pass to ldmatrix, and the P
 * fragments, which live in registers, are exchanged between the lanes of a
 * warp through a small shared array, so the kernel's indexing, masking and
 * softmax are tested without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cu_internal.h"

#define CU_ATT_ROWS_PER_BLOCK 4
#define LOG2E 1.4426950408889634
/* flashdec: query rows per block (registers: 16 floats per row per lane) */
#define DEC_MAX_ROWS 8
/* flashdec: the blocks the heuristic aims for (a few per SM of an H100/H200),
 * the K and V bytes a block streams at least, and the most splits (the last
 * block keeps a weight per split and row in shared memory) */
#define DEC_TARGET_BLOCKS 512
#define DEC_MIN_BLOCK_BYTES (16 * 1024)
#define DEC_MAX_SPLIT 1024

/* ---- the shape and the variants ---- */

typedef struct {
  const Node *an;
  DType dt;
  int64_t B, H, Hkv, G, S, T, D, Dv;
  double scale;
  bool causal, mask;
} Att;

typedef struct {
  int BM, BN, W, stages; /* rows per warp: BM / W, a multiple of 16 */
  int KS;                /* warps per row group, each taking BN / KS keys of every tile (1: none) */
} FlashParams;

typedef struct {
  int split, BN, W; /* BN: keys per block and step */
  int pf;           /* 1 (2): the loads of the step after this one (after the next) are issued before this step's math */
  int tr;           /* 1: the scores of a step summed over the key group in one transposed shuffle reduction */
} DecParams;

typedef enum { ATT_SIMPLE, ATT_FLASH, ATT_FLASHDEC } AttFamily;

typedef struct {
  AttFamily fam;
  FlashParams fp;
  DecParams dp;
} AttVariant;

static void att_shape(const CuFn *f, Att *a) {
  const Graph *g = f->g;
  const Node *an = &g->node[f->anchor];
  const TensorType *qt = &g->val[an->in[0]].type, *kt = &g->val[an->in[1]].type, *vt = &g->val[an->in[2]].type;
  memset(a, 0, sizeof *a);
  a->an = an;
  a->dt = qt->dt;
  a->B = qt->dim[0], a->H = qt->dim[1], a->S = qt->dim[2], a->D = qt->dim[3];
  a->Hkv = kt->dim[1], a->T = kt->dim[2], a->Dv = vt->dim[3];
  a->G = a->Hkv ? a->H / a->Hkv : 1;
  const Attr *sa = ir_attr(an, "scale");
  a->scale = sa ? sa->f : 1.0 / sqrt((double)a->D);
  a->causal = ir_attr_int(an, "causal") != 0;
  a->mask = an->nin > 3;
}

static bool is_arg_value(const CuFn *f, int v) {
  const Value *val = &f->g->val[v];
  if (f->arg_of[v] < 0) return false;
  return !(val->kind == VK_NODE && f->member[val->node]);
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Shared memory one block may use for the archs the module is built for:
 * the one named, else every sm_80+ GPU (sm_80's limit). */
static int64_t smem_limit(const CuFn *f) {
  IrCudaArchLimits lim;
  ir_cuda_arch_limits(f->opt && f->opt->arch ? f->opt->arch : "sm_80", &lim);
  return lim.smem_per_block;
}

/* The parts the flash kernels share: f16/bf16, no mask, scores scaled by a
 * positive factor (the running maximum is taken on unscaled scores), and
 * something to compute. */
static bool tc_common(const Att *a, const char **why) {
  if (a->dt != DT_F16 && a->dt != DT_BF16) return *why = "needs f16 or bf16", false;
  if (a->mask) return *why = "does not take a mask", false;
  if (!(a->scale > 0)) return *why = "needs a positive scale", false;
  if (a->D != a->Dv) return *why = "needs q, k and v of one head dim", false;
  if (a->B < 1 || a->H < 1 || a->S < 1 || a->T < 1) return *why = "needs a non-empty problem", false;
  return true;
}

static bool flash_eligible(const Att *a, const char **why) {
  if (!tc_common(a, why)) return false;
  if (a->D % 16 != 0 || a->D > 128) return *why = "needs a head dim that is a multiple of 16 up to 128", false;
  return true;
}

/* Q, K and V tiles (f16/bf16, rows padded by 8); with a key split the same
 * memory later takes the other key groups' (o, m, l) in f32 for the merge. */
static int64_t flash_smem(const Att *a, const FlashParams *p) {
  int64_t tiles = 2 * (int64_t)(p->BM + 2 * p->stages * p->BN) * (a->D + 8);
  int64_t merge = 4 * (int64_t)(p->KS - 1) * p->BM * (a->D + 8);
  return tiles > merge ? tiles : merge;
}

static bool flash_valid(const CuFn *f, const Att *a, const FlashParams *p, const char **why) {
  if (!flash_eligible(a, why)) return false;
  if (p->W != 1 && p->W != 2 && p->W != 4 && p->W != 8) return *why = "w must be 1, 2, 4 or 8", false;
  if (p->BM != 16 * p->W && p->BM != 32 * p->W) return *why = "bm must be 16 or 32 rows per warp (16 w or 32 w)", false;
  if (p->BN != 16 && p->BN != 32 && p->BN != 64 && p->BN != 128) return *why = "bn must be 16, 32, 64 or 128", false;
  if (p->stages < 2 || p->stages > 4) return *why = "st must be 2, 3 or 4", false;
  if (p->KS != 1 && p->KS != 2 && p->KS != 4) return *why = "ks must be 1, 2 or 4", false;
  if (p->W * p->KS > 8) return *why = "w * ks must be at most 8 warps", false;
  if (p->BN / p->KS < 16) return *why = "bn / ks must be at least 16 keys per warp", false;
  if (flash_smem(a, p) > smem_limit(f)) return *why = "needs more shared memory than a block may use", false;
  if (a->B * a->H * cdiv(a->S, p->BM) > 0x7fffffffLL) return *why = "has more blocks than the grid takes", false;
  return true;
}

/* flashdec's query rows per kv head, the row chunks they are cut into and
 * the rows per block. */
static void dec_rows(const Att *a, int64_t *out_rows, int64_t *out_chunks, int *out_rb) {
  int64_t R = a->G * a->S;
  int64_t nrc = cdiv(R, DEC_MAX_ROWS);
  *out_rows = R;
  *out_chunks = nrc;
  *out_rb = (int)cdiv(R, nrc);
}

static bool dec_eligible(const Att *a, const char **why) {
  if (!tc_common(a, why)) return false;
  if (a->D < 8 || a->D > 256 || 32 % (a->D / 8) != 0 || a->D % 8 != 0)
    return *why = "needs a head dim of 8, 16, 32, 64, 128 or 256", false;
  return true;
}

static bool dec_valid(const CuFn *f, const Att *a, const DecParams *p, const char **why) {
  if (!dec_eligible(a, why)) return false;
  if (p->W != 1 && p->W != 2 && p->W != 4 && p->W != 8) return *why = "w must be 1, 2, 4 or 8", false;
  int groups = p->W * (32 / (int)(a->D / 8));
  if (p->BN % groups != 0 || p->BN / groups < 1 || p->BN / groups > 8)
    return *why = "bn must be 1 to 8 keys per key group (w * 32 / (D/8) groups)", false;
  if (p->pf < 0 || p->pf > 2) return *why = "pf must be 0, 1 or 2", false;
  if (p->tr != 0 && p->tr != 1) return *why = "tr must be 0 or 1", false;
  if (p->tr && a->D < 16) return *why = "tr needs key groups of several lanes (D >= 16)", false;
  if (p->split < 1 || p->split > DEC_MAX_SPLIT || p->split > a->T) return *why = "split must be 1 .. min(T, 1024)", false;
  int64_t R, nrc;
  int rb;
  dec_rows(a, &R, &nrc, &rb);
  if (((int64_t)p->W * rb * (a->D + 2) + (int64_t)rb * a->D + (p->split > 1 ? (int64_t)p->split * rb + 32 * 4 * p->W : 0)) * 4 >
      48 * 1024)
    return *why = "needs more than 48 KiB of shared memory", false;
  if (a->B * a->Hkv * nrc * p->split > 0x7fffffffLL) return *why = "has more blocks than the grid takes", false;
  (void)f;
  return true;
}

/* ---- tokens ---- */

/* "key=value,..." with each of the n keys named at most once: the first
 * nreq must be there and positive; the others are optional (vals keeps the
 * caller's default) and may be 0. */
static bool parse_fields(const char *s, int n, int nreq, const char *const *keys, int *vals) {
  bool seen[8] = {0};
  int got = 0;
  while (*s) {
    const char *eq = strchr(s, '=');
    if (!eq || eq[1] < '0' || eq[1] > '9') return false;
    size_t klen = (size_t)(eq - s);
    int k = -1;
    for (int i = 0; i < n; i++)
      if (strlen(keys[i]) == klen && strncmp(s, keys[i], klen) == 0) k = i;
    if (k < 0 || seen[k]) return false;
    char *end;
    long v = strtol(eq + 1, &end, 10);
    if (v < (k < nreq ? 1 : 0) || v > (1 << 20) || (*end != ',' && *end != 0)) return false;
    seen[k] = true;
    vals[k] = (int)v;
    got += k < nreq;
    s = end;
    if (*s == ',') {
      s++;
      if (!*s) return false;
    }
  }
  return got == nreq;
}

static bool parse_variant(const char *tok, AttVariant *out) {
  memset(out, 0, sizeof *out);
  if (strcmp(tok, "simple") == 0) return out->fam = ATT_SIMPLE, true;
  if (strncmp(tok, "flash:", 6) == 0) {
    static const char *const keys[] = {"bm", "bn", "w", "st", "ks"};
    int v[5] = {0, 0, 0, 0, 1};
    if (!parse_fields(tok + 6, 5, 4, keys, v)) return false;
    out->fam = ATT_FLASH;
    out->fp = (FlashParams){v[0], v[1], v[2], v[3], v[4]};
    return true;
  }
  if (strncmp(tok, "flashdec:", 9) == 0) {
    static const char *const keys[] = {"split", "bn", "w", "pf", "tr"};
    int v[5] = {0, 0, 0, 0, 0};
    if (!parse_fields(tok + 9, 5, 3, keys, v)) return false;
    out->fam = ATT_FLASHDEC;
    out->dp = (DecParams){v[0], v[1], v[2], v[3], v[4]};
    return true;
  }
  return false;
}

static void format_variant(const AttVariant *v, char out[CG_VARIANT_LEN]) {
  switch (v->fam) {
  case ATT_FLASH:
    /* ks=1 (no key split) is the default and left out */
    if (v->fp.KS > 1)
      snprintf(out, CG_VARIANT_LEN, "flash:bm=%d,bn=%d,w=%d,st=%d,ks=%d", v->fp.BM, v->fp.BN, v->fp.W, v->fp.stages, v->fp.KS);
    else snprintf(out, CG_VARIANT_LEN, "flash:bm=%d,bn=%d,w=%d,st=%d", v->fp.BM, v->fp.BN, v->fp.W, v->fp.stages);
    break;
  case ATT_FLASHDEC:
    /* pf=0 (no prefetch) and tr=0 (a shuffle chain per score) are the defaults and left out */
    snprintf(out, CG_VARIANT_LEN, "flashdec:split=%d,bn=%d,w=%d%s%s", v->dp.split, v->dp.BN, v->dp.W,
             v->dp.pf ? (v->dp.pf == 2 ? ",pf=2" : ",pf=1") : "", v->dp.tr ? ",tr=1" : "");
    break;
  default: snprintf(out, CG_VARIANT_LEN, "simple"); break;
  }
}

static bool variant_valid(const CuFn *f, const Att *a, const AttVariant *v, const char **why) {
  *why = "";
  switch (v->fam) {
  case ATT_FLASH: return flash_valid(f, a, &v->fp, why);
  case ATT_FLASHDEC: return dec_valid(f, a, &v->dp, why);
  default: return true;
  }
}

/* flashdec's defaults (from the H200 timings of tests/gpu/test_cuda_attention):
 * one or two rows: 4 warps and 2 keys per group and step (bn=16 was the
 * best of W3 decode), loads two steps ahead (6 chunks of 16 bytes in
 * flight per lane, registers allow it); more rows: 8 warps, 2 keys, one
 * step ahead (the accumulators take the registers); the transposed score
 * reduction (fewer shuffles, none dependent on another score's); splits for about
 * DEC_TARGET_BLOCKS blocks, each slice at least DEC_MIN_BLOCK_BYTES of K
 * and V (fixed costs per block: the first load's latency, the merge, the
 * partial written and read back). */
static void dec_default(const Att *a, DecParams *p) {
  int64_t R, nrc;
  int rb;
  dec_rows(a, &R, &nrc, &rb);
  int W = rb <= 2 ? 4 : 8, groups = W * (32 / (int)(a->D / 8));
  int U = 2, pf = rb <= 2 ? 2 : 1;
  int64_t units = a->B * a->Hkv * nrc;
  int64_t split = cdiv(DEC_TARGET_BLOCKS, units);
  int64_t most = a->T * 4 * a->D / DEC_MIN_BLOCK_BYTES;
  if (split > most) split = most;
  if (split > DEC_MAX_SPLIT) split = DEC_MAX_SPLIT;
  if (split < 1) split = 1;
  *p = (DecParams){(int)split, U * groups, W, pf, a->D >= 16};
}

/* The heuristic: few query rows per kv head (decode): flashdec; else the
 * flash prefill kernel, double buffered, after the H200 timings: a head
 * above 64 wide, 128 rows (32 per warp) against 32 keys per tile (64 keys
 * spill at 255 registers); a head up to 64 wide, 64 rows of 16 per warp
 * against 32 keys (more blocks) up to 1023 rows, 128 rows against 64 keys
 * for longer ones; short sequences 64 rows; else simple. */
static void heuristic(const CuFn *f, const Att *a, AttVariant *out) {
  const char *why;
  memset(out, 0, sizeof *out);
  out->fam = ATT_SIMPLE;
  AttVariant v = {0};
  if (dec_eligible(a, &why) && a->G * a->S <= 16) {
    v.fam = ATT_FLASHDEC;
    dec_default(a, &v.dp);
    if (variant_valid(f, a, &v, &why)) {
      *out = v;
      return;
    }
  }
  if (flash_eligible(a, &why)) {
    v.fam = ATT_FLASH;
    if (a->S < 256) v.fp = (FlashParams){64, 32, 4, 2, 1};
    else if (a->D > 64) v.fp = (FlashParams){128, 32, 4, 2, 1};
    else if (a->S >= 1024) v.fp = (FlashParams){128, 64, 4, 2, 1};
    /* causal, a few hundred rows: the blocks of the last rows decide; two key
     * groups halve the tiles' work on each warp of those blocks */
    else v.fp = a->causal ? (FlashParams){64, 128, 4, 2, 2} : (FlashParams){64, 32, 4, 2, 1};
    if (variant_valid(f, a, &v, &why)) *out = v;
  }
}

int cu_attention_candidates(CuFn *f, char (*out)[CG_VARIANT_LEN], int max) {
  Att a;
  att_shape(f, &a);
  AttVariant all[64];
  int n = 0;
  heuristic(f, &a, &all[n++]);
  const char *why;
  int64_t R, nrc;
  int rb;
  dec_rows(&a, &R, &nrc, &rb);
  if (flash_eligible(&a, &why) && a.S < 16) {
    /* a few query rows: one 64-row tile, for comparison with flashdec */
    all[n++] = (AttVariant){ATT_FLASH, {64, 64, 4, 2, 1}, {0}};
  } else if (flash_eligible(&a, &why)) {
    /* the tiles that came within ~15% of the best on the H200 (W3 and W4
     * prefill), double buffered, and one triple-buffered; 32 rows of a head
     * above 64 wide with more than 64 keys per tile do not fit in registers
     * (O and the scores alone take 256; with a key split, 64 keys per warp
     * spill too) */
    static const FlashParams fps[] = {{128, 32, 4, 2, 1}, {128, 32, 4, 3, 1}, {128, 64, 4, 2, 1}, {128, 64, 8, 2, 1},
                                      {128, 128, 8, 2, 1}, {64, 32, 4, 2, 1},  {64, 64, 4, 2, 1},  {64, 128, 4, 2, 1},
                                      {64, 32, 2, 2, 1},
                                      /* key splits: more warps on the same rows (the longest causal blocks
                                       * finish sooner), 8 warps at most */
                                      {64, 128, 4, 2, 2},  {64, 64, 4, 2, 2},  {64, 128, 4, 3, 2},  {64, 128, 2, 2, 4},
                                      {32, 128, 2, 2, 4},  {128, 64, 4, 2, 2}, {128, 128, 4, 2, 2}};
    for (size_t i = 0; i < sizeof fps / sizeof *fps; i++) {
      bool two = fps[i].BM == 32 * fps[i].W;
      if (two && a.D > 64 && (fps[i].BN > 64 || fps[i].BN / fps[i].KS > 32)) continue;
      all[n++] = (AttVariant){ATT_FLASH, fps[i], {0}};
    }
  }
  /* flashdec reads K and V once per row chunk: only for a few rows */
  if (dec_eligible(&a, &why) && R <= 4 * DEC_MAX_ROWS) {
    /* around the default: half, twice and four times the splits (2 to 16
     * blocks per SM of W3 decode); per split 4 and 8 warps, 1, 2 and 4 keys
     * per group and step, loads one and two steps ahead */
    DecParams d;
    dec_default(&a, &d);
    int gpw = 32 / (int)(a.D / 8);
    /* {warps, keys per group and step, pf, tr} */
    static const int wup[][4] = {{4, 2, 1, 1}, {4, 2, 2, 1}, {4, 1, 2, 1}, {4, 4, 1, 1}, {8, 2, 1, 1}, {8, 1, 2, 1}, {8, 2, 2, 1}};
    int splits[] = {d.split, d.split / 2, d.split * 2, d.split * 4}, tr = a.D >= 16;
    for (int i = 0; i < 4; i++)
      for (size_t k = 0; k < sizeof wup / sizeof *wup && n < 58; k++) {
        /* more than two rows: 4 warps only with 2 keys one step ahead (the
         * others spill with 8 rows' accumulators at sm_90's register split) */
        if (rb > 2 && wup[k][0] == 4 && (wup[k][1] != 2 || wup[k][2] != 1)) continue;
        if (splits[i] >= 1)
          all[n++] = (AttVariant){ATT_FLASHDEC, {0}, {splits[i], wup[k][1] * wup[k][0] * gpw, wup[k][0], wup[k][2], wup[k][3] && tr}};
      }
    /* the default and the old best of W3 decode with a shuffle chain per score;
     * without the prefetch */
    all[n++] = (AttVariant){ATT_FLASHDEC, {0}, {d.split, d.BN, d.W, d.pf, 0}};
    all[n++] = (AttVariant){ATT_FLASHDEC, {0}, {d.split, 2 * 4 * gpw, 4, 1, 0}};
    all[n++] = (AttVariant){ATT_FLASHDEC, {0}, {d.split, 2 * 8 * gpw, 8, 0, 0}};
    all[n++] = (AttVariant){ATT_FLASHDEC, {0}, {d.split, 2 * 4 * gpw, 4, 0, 0}};
  }
  all[n++] = (AttVariant){ATT_SIMPLE, {0}, {0}};
  int got = 0;
  for (int i = 0; i < n && got < max; i++) {
    if (!variant_valid(f, &a, &all[i], &why)) continue;
    char tok[CG_VARIANT_LEN];
    format_variant(&all[i], tok);
    bool dup = false;
    for (int j = 0; j < got && !dup; j++) dup = strcmp(out[j], tok) == 0;
    if (!dup) memcpy(out[got++], tok, CG_VARIANT_LEN);
  }
  return got;
}

/* ---- the simple kernel ---- */

static void emit_simple(CuFn *f, const Att *a, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = a->an;
  int64_t B = a->B, H = a->H, S = a->S, D = a->D, T = a->T, Dv = a->Dv, group = a->G;
  DType dt = a->dt;
  const char *ct = cu_ctype(dt);
  const char *sfx = dt == DT_F64 ? "" : "f";
  int DQ = (int)((D + 31) / 32), DV = (int)((Dv + 31) / 32);

  int64_t rows = B * H * S;
  l->kind = "attention";
  l->block[0] = 32 * CU_ATT_ROWS_PER_BLOCK;
  int64_t blocks = (rows + CU_ATT_ROWS_PER_BLOCK - 1) / CU_ATT_ROWS_PER_BLOCK;
  if (blocks > 0x7fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "%lld query rows exceed the grid", (long long)rows);
    return;
  }
  l->grid[0] = (unsigned)(blocks < 1 ? 1 : blocks);
  if (rows == 0) return;
  cu_line(f, "// variant: simple (one warp per query row, online softmax)");

  const char *lane = cu_tmp(f), *row = cu_tmp(f);
  cu_line(f, "const int %s = threadIdx.x %% 32;", lane);
  cu_line(f, "const %s %s = (%s)blockIdx.x * %d + threadIdx.x / 32;", f->idx, row, f->idx, CU_ATT_ROWS_PER_BLOCK);
  cu_open(f, "if (%s < %lld)", row, (long long)rows);
  TensorType rt = {.dt = dt, .rank = 3, .dim = {B, H, S}};
  CuCoords rc;
  cu_delinearize(f, row, &rt, &rc);
  const char *b = rc.c[0], *h = rc.c[1], *i = rc.c[2];
  const char *hk = cu_tmp(f);
  cu_line(f, "const %s %s = %s;  // grouped-query: %lld query heads per kv head", f->idx, hk,
          group == 1 ? h : cu_fmt(f, "%s / %lld", h, (long long)group), (long long)group);

  /* this lane's query features, scaled */
  cu_line(f, "%s q[%d];", ct, DQ);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int dd = 0; dd < %d; dd++)", DQ);
  const char *d = cu_tmp(f);
  cu_line(f, "const %s %s = %s + dd * 32;", f->idx, d, lane);
  cu_line(f, "q[dd] = 0;");
  cu_open(f, "if (%s < %lld)", d, (long long)D);
  {
    const char *c[4] = {b, h, i, d};
    CuCoords co;
    cu_coords_scalar(&co, 4, c);
    CuVal x;
    cu_emit(f, an->in[0], &co, &x);
    cu_line(f, "q[dd] = %s * %s;", x.l[0], cu_const(f, dt, a->scale));
  }
  cu_close(f);
  cu_close(f);

  cu_line(f, "%s acc[%d];", ct, DV);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int dd = 0; dd < %d; dd++) acc[dd] = 0;", DV);
  const char *m = cu_tmp(f), *sum = cu_tmp(f), *jend = cu_tmp(f);
  cu_line(f, "%s %s = %s, %s = 0;  // running maximum and sum of exp(s - m)", ct, m, cu_const(f, dt, -INFINITY), sum);
  if (a->causal)
    cu_line(f, "const %s %s = %s + %lld < %lld ? %s + %lld : %lld;  // causal: keys j <= T - S + i", f->idx, jend, i,
            (long long)(T - S + 1), (long long)T, i, (long long)(T - S + 1), (long long)T);
  else
    cu_line(f, "const %s %s = %lld;", f->idx, jend, (long long)T);
  const char *j = cu_tmp(f);
  cu_open(f, "for (%s %s = 0; %s < %s; %s++)", f->idx, j, j, jend, j);
  const char *s = cu_tmp(f);
  cu_line(f, "%s %s = 0;", ct, s);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int dd = 0; dd < %d; dd++)", DQ);
  d = cu_tmp(f);
  cu_line(f, "const %s %s = %s + dd * 32;", f->idx, d, lane);
  cu_open(f, "if (%s < %lld)", d, (long long)D);
  {
    const char *c[4] = {b, hk, j, d};
    CuCoords co;
    cu_coords_scalar(&co, 4, c);
    CuVal x;
    cu_emit(f, an->in[1], &co, &x);
    cu_line(f, "%s += q[dd] * %s;", s, x.l[0]);
  }
  cu_close(f);
  cu_close(f);
  cu_line(f, "%s = smelt_warp_reduce(%s, smelt_sum_op());", s, s);
  if (a->mask) {
    const TensorType *mt = &g->val[an->in[3]].type;
    const char *c4[4] = {b, h, i, j};
    CuCoords full, co;
    cu_coords_scalar(&full, 4, c4);
    cu_bcast_coords(mt, &full, &co);
    CuVal mk;
    cu_emit(f, an->in[3], &co, &mk);
    if (mt->dt == DT_BOOL) cu_line(f, "if (!%s) %s = %s;  // may not attend", mk.l[0], s, cu_const(f, dt, -INFINITY));
    else cu_line(f, "%s += %s;", s, mk.l[0]);
  }
  cu_line(f, "if (%s == %s) continue;  // masked out", s, cu_const(f, dt, -INFINITY));
  const char *mn = cu_tmp(f), *corr = cu_tmp(f), *p = cu_tmp(f);
  cu_line(f, "const %s %s = %s > %s ? %s : %s;", ct, mn, s, m, s, m);
  cu_line(f, "const %s %s = exp%s(%s - %s), %s = exp%s(%s - %s);", ct, corr, sfx, m, mn, p, sfx, s, mn);
  cu_line(f, "%s = %s * %s + %s;", sum, sum, corr, p);
  cu_line(f, "%s = %s;", m, mn);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int dd = 0; dd < %d; dd++)", DV);
  d = cu_tmp(f);
  cu_line(f, "const %s %s = %s + dd * 32;", f->idx, d, lane);
  cu_open(f, "if (%s < %lld)", d, (long long)Dv);
  {
    const char *c[4] = {b, hk, j, d};
    CuCoords co;
    cu_coords_scalar(&co, 4, c);
    CuVal x;
    cu_emit(f, an->in[2], &co, &x);
    cu_line(f, "acc[dd] = acc[dd] * %s + %s * %s;", corr, p, x.l[0]);
  }
  cu_close(f);
  cu_close(f);
  cu_close(f);

  /* results and the epilogue */
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int dd = 0; dd < %d; dd++)", DV);
  d = cu_tmp(f);
  cu_line(f, "const %s %s = %s + dd * 32;", f->idx, d, lane);
  cu_open(f, "if (%s < %lld)", d, (long long)Dv);
  {
    const Value *av = &g->val[an->out[0]];
    CuVal y = {{0}};
    y.l[0] = cu_tmp(f);
    cu_line(f, "const %s %s = %s > 0 ? acc[dd] / %s : %s;  // %s (attention); no visible key: 0", ct, y.l[0], sum, sum,
            cu_const(f, dt, 0), av->name);
    const char *c[4] = {b, h, i, d};
    CuCoords co;
    cu_coords_scalar(&co, 4, c);
    cu_store_epilogue(f, epi, nepi, &co, &y);
  }
  cu_close(f);
  cu_close(f);
  cu_close(f);
}

/* ---- pieces of generated code the flash kernels share ---- */

/* Host stand-ins for ldmatrix and mma.sync (emulation only), after the
 * fragment layouts of the PTX ISA (g = lane / 4, t = lane % 4).  Without
 * warps to exchange registers each lane computes what another lane would
 * hold: ldsm evaluates the row address lane s would give, and mma gathers
 * the rows and columns of its result from the lanes that hold them. */

/* Fills rows [row0, row0 + rows) x D of operand `v` (head `head`) into the
 * shared tile `dst` (row stride `stride` elements; rows >= nrows zero):
 * 16-byte chunks with cp.async when v is a kernel argument (global rows
 * start at `gbase`), else computed element by element with cu_emit. */
static void fill_tile(CuFn *f, const Att *a, int v, const char *gbase, const char *dst, const char *b, const char *head,
                      const char *row0, int64_t nrows, int rows, int stride, int threads, const char *aligned) {
  int D = (int)a->D, CD = D / 8, chunks = rows * CD;
  if (gbase) {
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int it = 0; it < %d; it++)", cdiv(chunks, threads) > 0 ? (int)cdiv(chunks, threads) : 1);
    cu_line(f, "const int c = threadIdx.x + it * %d, r = c / %d, dc = (c %% %d) * 8;", threads, CD, CD);
    if (chunks % threads) cu_line(f, "if (c >= %d) break;", chunks);
    cu_line(f, "const long long gr = (long long)(%s) + r;", row0);
    cu_line(f, "const bool ok = gr < %lldLL;", (long long)nrows);
    cu_line(f, "const unsigned short *src = %s + (ok ? gr * %d + dc : 0LL);", gbase, D);
    cu_line(f, "unsigned short *dsts = %s + r * %d + dc;", dst, stride);
    cu_tc_cp_async16(f, "dsts", "src", "ok", aligned);
    cu_close(f);
    return;
  }
  const char *st = cu_stype(a->dt);
  cu_line(f, "// %s is computed in this kernel: element by element", f->g->val[v].name);
  cu_open(f, "for (int c = threadIdx.x; c < %d; c += %d)", chunks, threads);
  const char *r = cu_tmp(f), *dc = cu_tmp(f), *gr = cu_tmp(f);
  cu_line(f, "const int %s = c / %d, %s = (c %% %d) * 8;", r, CD, dc, CD);
  cu_line(f, "const %s %s = (%s)(%s) + %s;", f->idx, gr, f->idx, row0, r);
  cu_line(f, "%s *dsts = reinterpret_cast<%s *>(%s + %s * %d + %s);", st, st, dst, r, stride, dc);
  cu_open(f, "if (%s < %lld)", gr, (long long)nrows);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < 8; e++)");
  const char *d = cu_tmp(f);
  cu_line(f, "const %s %s = %s + e;", f->idx, d, dc);
  const char *c[4] = {b, head, gr, d};
  CuCoords co;
  cu_coords_scalar(&co, 4, c);
  CuVal x;
  cu_emit(f, v, &co, &x);
  cu_line(f, "dsts[e] = %s;", cu_to_storage(f, a->dt, x.l[0]));
  cu_close(f);
  cu_close(f);
  cu_line(f, "else");
  cu_line(f, "  for (int e = 0; e < 8; e++) reinterpret_cast<unsigned short *>(dsts)[e] = 0;");
  cu_close(f);
}

/* fexp2: 2^x with the hardware's ex2.approx on the GPU (the scores are
 * already in log2 units; -inf gives 0), exp2f in the emulation. */
static void emit_fexp2(CuFn *f) {
  cu_line(f, "auto fexp2 = [](float x) -> float {");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "  float y;");
  cu_line(f, "  asm(\"ex2.approx.ftz.f32 %%0, %%1;\\n\" : \"=f\"(y) : \"f\"(x));");
  cu_line(f, "  return y;");
  cu_line(f, "#else");
  cu_line(f, "  return exp2f(x);");
  cu_line(f, "#endif");
  cu_line(f, "};");
}

static void commit(CuFn *f) {
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"cp.async.commit_group;\\n\" ::);");
  cu_line(f, "#endif");
}

static void wait_group(CuFn *f, int n) {
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "asm volatile(\"cp.async.wait_group %d;\\n\" ::);", n);
  cu_line(f, "#endif");
}

/* ---- flash: the prefill kernel ---- */

static void emit_flash(CuFn *f, const Att *a, const FlashParams *p, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = a->an;
  bool bf16 = a->dt == DT_BF16;
  int D = (int)a->D, W = p->W, BM = p->BM, BN = p->BN, ST = p->stages, MI = p->BM / (16 * p->W), KS = p->KS;
  /* KS key groups of W warps: warp (kg, rw) takes rows rw and keys kg * BNW .. of every tile */
  int BNW = BN / KS, NW = W * KS;
  int QS = D + 8, threads = 32 * NW, KD = D / 16, NJ = BNW / 8, OJ = D / 8, PK = BNW / 16;
  int64_t B = a->B, H = a->H, S = a->S, T = a->T, G = a->G;
  int64_t NQB = cdiv(S, BM), NT = cdiv(T, BN), BH = B * H;
  int64_t smem_elems = flash_smem(a, p) / 2;
  double sl2 = a->scale * LOG2E;
  /* Q's A fragments stay in registers when they take at most 32 per lane;
   * else (two m16 tiles of a 128-wide head) they are read again per k step */
  bool qregs = MI * KD * 4 <= 32;

  l->kind = "attention";
  l->block[0] = (unsigned)threads;
  l->grid[0] = (unsigned)(NQB * BH);
  l->smem = (unsigned)(smem_elems * 2);
  int qv = an->in[0], kv = an->in[1], vv = an->in[2];
  bool qa = is_arg_value(f, qv), ka = is_arg_value(f, kv), va = is_arg_value(f, vv);

  cu_line(f, "// variant: flash (FlashAttention-2: mma.sync.m16n8k16.row.col.f32.%s, ldmatrix, cp.async, online softmax)",
          bf16 ? "bf16.bf16" : "f16.f16");
  cu_line(f, "// %s = attention(%s, %s, %s): B %lld, H %lld, Hkv %lld, S %lld, T %lld, D %d%s", g->val[an->out[0]].name,
          g->val[qv].name, g->val[kv].name, g->val[vv].name, (long long)B, (long long)H, (long long)a->Hkv, (long long)S,
          (long long)T, D, a->causal ? ", causal (query i sees keys j <= T - S + i)" : "");
  cu_line(f, "// parameters: %d query rows per block (%d warps of %d), %d keys per tile, %d stages", BM, W, 16 * MI, BN, ST);
  if (KS > 1)
    cu_line(f, "// key split: %d groups of %d warps, group kg takes keys kg * %d .. +%d of every tile; merged at the end", KS, W, BNW,
            BNW - 1);
  cu_tc_emu_helpers(f);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "extern __shared__ __align__(16) unsigned short smelt_fa_smem[];");
  cu_line(f, "#else");
  cu_line(f, "__align__(16) __shared__ unsigned short smelt_fa_smem[%lld];", (long long)smem_elems);
  cu_line(f, "// P fragments, exchanged between the lanes of a warp");
  cu_line(f, "static unsigned emu_pf[%d][32][%d];", NW, MI * PK * 4);
  cu_line(f, "#endif");
  cu_line(f, "unsigned short *const Qs = smelt_fa_smem;  // [%d][%d] (rows padded by 8)", BM, QS);
  cu_line(f, "unsigned short *const Ks = smelt_fa_smem + %d;  // [%d stages][%d][%d]", BM * QS, ST, BN, QS);
  cu_line(f, "unsigned short *const Vs = smelt_fa_smem + %d;  // [%d stages][%d][%d]", BM * QS + ST * BN * QS, ST, BN, QS);
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  if (KS > 1) cu_line(f, "const int rw = warp %% %d, kg = warp / %d;  // row warp, key group", W, W);
  else cu_line(f, "const int rw = warp;  // row warp");
  cu_line(f, "// f32 pair -> f16x2 / bf16x2 (round to nearest even), lo in the low half");
  cu_line(f, "auto pack2 = [](float lo, float hi) -> unsigned {");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "  unsigned r;");
  cu_line(f, "  asm(\"cvt.rn.%s.f32 %%0, %%1, %%2;\\n\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo));", bf16 ? "bf16x2" : "f16x2");
  cu_line(f, "  return r;");
  cu_line(f, "#else");
  cu_line(f, "  return (unsigned)%s(lo).x | (unsigned)%s(hi).x << 16;", bf16 ? "__float2bfloat16_rn" : "__float2half_rn",
          bf16 ? "__float2bfloat16_rn" : "__float2half_rn");
  cu_line(f, "#endif");
  cu_line(f, "};");
  emit_fexp2(f);
  if (a->causal)
    cu_line(f, "// block -> (query block, b, h); causal: the longest query blocks first");
  else
    cu_line(f, "// block -> (query block, b, h)");
  cu_line(f, "const long long qb = %s(long long)(blockIdx.x / %lldu), bh = blockIdx.x %% %lldu;", a->causal ? cu_fmt(f, "%lldLL - 1 - ", (long long)NQB) : "",
          (long long)BH, (long long)BH);
  const char *b = "b", *h = "h", *hk = "hk";
  cu_line(f, "const %s b = (%s)(bh / %lld), h = (%s)(bh %% %lld), hk = h / %lld;", f->idx, f->idx, (long long)H, f->idx,
          (long long)H, (long long)G);
  cu_line(f, "const long long m0 = qb * %d;", BM);
  if (qa)
    cu_line(f, "const unsigned short *Qg = reinterpret_cast<const unsigned short *>(a%d) + ((long long)b * %lld + h) * %lldLL;  // %s",
            f->arg_of[qv], (long long)H, (long long)(S * D), g->val[qv].name);
  if (ka)
    cu_line(f, "const unsigned short *Kg = reinterpret_cast<const unsigned short *>(a%d) + ((long long)b * %lld + hk) * %lldLL;  // %s",
            f->arg_of[kv], (long long)a->Hkv, (long long)(T * D), g->val[kv].name);
  if (va)
    cu_line(f, "const unsigned short *Vg = reinterpret_cast<const unsigned short *>(a%d) + ((long long)b * %lld + hk) * %lldLL;  // %s",
            f->arg_of[vv], (long long)a->Hkv, (long long)(T * D), g->val[vv].name);
  const char *aligned = "true";
  if ((qa || ka || va) && !(f->opt && f->opt->args_aligned)) {
    aligned = "aligned16";
    cu_line(f, "const bool aligned16 = true%s%s%s;", qa ? cu_fmt(f, " && smelt_aligned(a%d, 16)", f->arg_of[qv]) : "",
            ka ? cu_fmt(f, " && smelt_aligned(a%d, 16)", f->arg_of[kv]) : "",
            va ? cu_fmt(f, " && smelt_aligned(a%d, 16)", f->arg_of[vv]) : "");
  }
  if (a->causal) {
    cu_line(f, "// causal: the block's last row sees keys up to T - S + that row");
    cu_line(f, "const long long last_row = m0 + %d < %lldLL ? m0 + %d : %lldLL;", BM - 1, (long long)S, BM - 1, (long long)(S - 1));
    cu_line(f, "const int ntiles = (int)((%lldLL + last_row) / %d + 1 < %lldLL ? (%lldLL + last_row) / %d + 1 : %lldLL);",
            (long long)(T - S), BN, (long long)NT, (long long)(T - S), BN, (long long)NT);
  } else {
    cu_line(f, "const int ntiles = %lld;", (long long)NT);
  }

  /* the prologue: Q, then KV tiles 0 .. ST-2, one commit group each */
  cu_line(f, "// Q tile (rows m0 .. m0+%d), then KV tiles 0 .. %d in flight", BM - 1, ST - 2);
  cu_open(f, "%s", "");
  fill_tile(f, a, qv, qa ? "Qg" : NULL, "Qs", b, h, "m0", S, BM, QS, threads, aligned);
  cu_close(f);
  commit(f);
  /* one tile of K and V into buffer `stage` */
#define FILL_KV(stage, tile)                                                                                                 \
  do {                                                                                                                       \
    cu_open(f, "%s", "");                                                                                                    \
    cu_line(f, "const long long n0 = (long long)(%s) * %d;", tile, BN);                                                     \
    cu_line(f, "unsigned short *ks = Ks + (%s) * %d, *vs = Vs + (%s) * %d;", stage, BN * QS, stage, BN * QS);              \
    fill_tile(f, a, kv, ka ? "Kg" : NULL, "ks", b, hk, "n0", T, BN, QS, threads, aligned);                                  \
    fill_tile(f, a, vv, va ? "Vg" : NULL, "vs", b, hk, "n0", T, BN, QS, threads, aligned);                                  \
    cu_close(f);                                                                                                             \
  } while (0)
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int s = 0; s < %d; s++)", ST - 1);
  cu_open(f, "if (s < ntiles)");
  FILL_KV("s", "s");
  cu_close(f);
  commit(f);
  cu_close(f);

  cu_line(f, "float o[%d][%d][4];  // O accumulators: m16n8 fragments of this warp's %d rows x %d", MI, OJ, 16 * MI, D);
  cu_line(f, "float mrow[%d][2], lrow[%d][2];  // per fragment row (g, g + 8): running max (unscaled), this lane's sum", MI, MI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "mrow[i][0] = mrow[i][1] = -SMELT_INF_F, lrow[i][0] = lrow[i][1] = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++) o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.0f;", OJ);
  cu_close(f);
  cu_line(f, "const int wr = rw * %d;  // this warp's first row in the block", 16 * MI);
  cu_line(f, "const long long r0 = m0 + wr;");
  const char *pq = cu_fmt(f, "Qs + (wr + i * 16 + (lane & 15)) * %d + kd * 16 + (lane >> 4) * 8", QS);
  const char *kgo = KS > 1 ? cu_fmt(f, "kg * %d + ", BNW) : "";
  const char *pk = cu_fmt(f, "ks + (%sj * 8 + (lane & 7) + ((lane >> 4) << 3)) * %d + kd * 16 + ((lane >> 3) & 1) * 8", kgo, QS);
  const char *pv = cu_fmt(f, "vs + (%skk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * %d + j * 8 + (lane >> 4) * 8", kgo, QS);
  wait_group(f, ST - 1);
  cu_line(f, "__syncthreads();");
  if (qregs) {
    cu_line(f, "// the Q tile has landed (the oldest group): this warp's A fragments into registers");
    cu_line(f, "#ifdef __CUDA_ARCH__");
    cu_line(f, "unsigned qf[%d][%d][4];", MI, KD);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int i = 0; i < %d; i++)", MI);
    cu_line(f, "  #pragma unroll");
    cu_open(f, "  for (int kd = 0; kd < %d; kd++)", KD);
    cu_line(f, "const unsigned short *pq = %s;", pq);
    cu_tc_ldmatrix_x4(f, "qf[i][kd]", "pq", false);
    cu_close(f);
    cu_line(f, "#endif");
  } else {
    cu_line(f, "// the Q tile has landed (the oldest group); its fragments are read per k step (%d rows x %d would take %d registers)",
            16 * MI, D, MI * KD * 4);
  }

  cu_open(f, "for (int kt = 0; kt < ntiles; kt++)");
  cu_line(f, "// tile kt has landed (at most %d newer groups pending); everyone is done with tile kt-1", ST - 2);
  wait_group(f, ST - 2);
  cu_line(f, "__syncthreads();");
  cu_open(f, "%s", "");
  cu_line(f, "const int next = kt + %d;  // into the buffer tile kt-1 used", ST - 1);
  cu_open(f, "if (next < ntiles)");
  FILL_KV(cu_fmt(f, "(next %% %d)", ST), "next");
  cu_close(f);
  commit(f);
  cu_close(f);
#undef FILL_KV
  cu_line(f, "const unsigned short *ks = Ks + (kt %% %d) * %d, *vs = Vs + (kt %% %d) * %d;", ST, BN * QS, ST, BN * QS);
  if (KS > 1) cu_line(f, "const long long n0 = (long long)kt * %d + kg * %d;  // this warp's first key", BN, BNW);
  else cu_line(f, "const long long n0 = (long long)kt * %d;", BN);
  if (a->causal) {
    cu_line(f, "// causal: this warp's rows see no key of %s", KS > 1 ? "its part of this tile" : "this tile");
    cu_line(f, "if (n0 > %lldLL + r0 + %d) continue;", (long long)(T - S), 16 * MI - 1);
  }

  cu_line(f, "// S = Q K^T: %d x %d scores of this warp, f32", 16 * MI, BNW);
  cu_line(f, "float s[%d][%d][4];", MI, NJ);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "  #pragma unroll");
  cu_line(f, "  for (int j = 0; j < %d; j++) s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.0f;", NJ);
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kd = 0; kd < %d; kd++)", KD);
  const char *qfrag = "qf[i][kd]";
  if (!qregs) {
    qfrag = "qk[i]";
    cu_line(f, "unsigned qk[%d][4];  // this k step's Q fragments", MI);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", MI);
    cu_line(f, "const unsigned short *pq = %s;", pq);
    cu_tc_ldmatrix_x4(f, "qk[i]", "pq", false);
    cu_close(f);
  }
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j += 2)", NJ);
  cu_line(f, "// K rows are keys: matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15)");
  cu_line(f, "unsigned r[4];");
  cu_line(f, "const unsigned short *pk = %s;", pk);
  cu_tc_ldmatrix_x4(f, "r", "pk", false);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_tc_mma_16816(f, bf16, "s[i][j]", qfrag, "r[0]", "r[1]");
  cu_tc_mma_16816(f, bf16, "s[i][j + 1]", qfrag, "r[2]", "r[3]");
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_line(f, "#else");
  cu_line(f, "for (int kd = 0; kd < %d; kd++)", KD);
  cu_line(f, "  for (int i = 0; i < %d; i++)", MI);
  cu_open(f, "    for (int j = 0; j < %d; j++)", NJ);
  cu_line(f, "auto a_of = [&](int l, unsigned x[4]) { emu_ldsm_x4(x, [&](int lane) { return %s; }, false, l); };", pq);
  cu_line(f, "auto b_of = [&](int l, unsigned y[2]) {");
  cu_line(f, "  unsigned r[4];");
  cu_line(f, "  const int j0 = j & ~1;");
  cu_line(f, "  emu_ldsm_x4(r, [&](int lane) { const int j = j0; return %s; }, false, l);", pk);
  cu_line(f, "  y[0] = r[(j & 1) * 2], y[1] = r[(j & 1) * 2 + 1];");
  cu_line(f, "};");
  cu_line(f, "emu_mma(s[i][j], a_of, b_of, %s);", bf16 ? "true" : "false");
  cu_close(f);
  cu_line(f, "#endif");

  /* masks: keys past T, and keys past the causal limit of each row */
  const char *edge = a->causal ? cu_fmt(f, "n0 + %d > %lldLL || n0 + %d > %lldLL + r0", BNW, (long long)T, BNW - 1, (long long)(T - S))
                               : cu_fmt(f, "n0 + %d > %lldLL", BNW, (long long)T);
  bool any_edge = a->causal || T % BNW != 0;
  if (any_edge) {
    cu_line(f, "// the tile crosses %s: mask", a->causal ? "the end of the keys or the causal diagonal" : "the end of the keys");
    cu_open(f, "if (%s)", edge);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int i = 0; i < %d; i++)", MI);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int j = 0; j < %d; j++)", NJ);
    cu_line(f, "    #pragma unroll");
    cu_open(f, "    for (int e = 0; e < 4; e++)");
    cu_line(f, "const long long key = n0 + j * 8 + (lane & 3) * 2 + (e & 1);");
    if (a->causal) {
      cu_line(f, "const long long row = r0 + i * 16 + (lane >> 2) + (e >> 1) * 8;");
      cu_line(f, "if (key >= %lldLL || key > %lldLL + row) s[i][j][e] = -SMELT_INF_F;", (long long)T, (long long)(T - S));
    } else {
      cu_line(f, "if (key >= %lldLL) s[i][j][e] = -SMELT_INF_F;", (long long)T);
    }
    cu_close(f);
    cu_close(f);
  }

  cu_line(f, "// online softmax per fragment row: the row's 4 lanes (a quad) share its maximum");
  cu_line(f, "unsigned pf[%d][%d][4];  // P as the A fragments of P V", MI, PK);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int hr = 0; hr < 2; hr++)");
  cu_line(f, "float mx = mrow[i][hr];");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++) mx = fmaxf(mx, fmaxf(s[i][j][2 * hr], s[i][j][2 * hr + 1]));", NJ);
  cu_line(f, "mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));");
  cu_line(f, "mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));");
  cu_line(f, "// exp2 of scaled scores; a row that has seen no key yet keeps 0 (no inf - inf)");
  cu_line(f, "const float base = mx == -SMELT_INF_F ? 0.0f : mx * %s;", cu_const(f, DT_F32, sl2));
  cu_line(f, "const float corr = fexp2(mrow[i][hr] * %s - base);", cu_const(f, DT_F32, sl2));
  cu_line(f, "mrow[i][hr] = mx;");
  cu_line(f, "float sum = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", NJ);
  cu_line(f, "s[i][j][2 * hr] = fexp2(s[i][j][2 * hr] * %s - base);", cu_const(f, DT_F32, sl2));
  cu_line(f, "s[i][j][2 * hr + 1] = fexp2(s[i][j][2 * hr + 1] * %s - base);", cu_const(f, DT_F32, sl2));
  cu_line(f, "sum += s[i][j][2 * hr] + s[i][j][2 * hr + 1];");
  cu_close(f);
  cu_line(f, "lrow[i][hr] = lrow[i][hr] * corr + sum;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int j = 0; j < %d; j++) o[i][j][2 * hr] *= corr, o[i][j][2 * hr + 1] *= corr;", OJ);
  cu_close(f);
  cu_line(f, "// accumulator tiles 2kk, 2kk+1 (keys 16kk ..) are the m16k16 A fragment kk");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kk = 0; kk < %d; kk++)", PK);
  cu_line(f, "pf[i][kk][0] = pack2(s[i][2 * kk][0], s[i][2 * kk][1]);");
  cu_line(f, "pf[i][kk][1] = pack2(s[i][2 * kk][2], s[i][2 * kk][3]);");
  cu_line(f, "pf[i][kk][2] = pack2(s[i][2 * kk + 1][0], s[i][2 * kk + 1][1]);");
  cu_line(f, "pf[i][kk][3] = pack2(s[i][2 * kk + 1][2], s[i][2 * kk + 1][3]);");
  cu_close(f);
  cu_close(f);

  cu_line(f, "// O += P V (V rows are keys: ldmatrix.trans gives the B fragments)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int kk = 0; kk < %d; kk++)", PK);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j += 2)", OJ);
  cu_line(f, "unsigned r[4];");
  cu_line(f, "const unsigned short *pv = %s;", pv);
  cu_tc_ldmatrix_x4(f, "r", "pv", true);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_tc_mma_16816(f, bf16, "o[i][j]", "pf[i][kk]", "r[0]", "r[1]");
  cu_tc_mma_16816(f, bf16, "o[i][j + 1]", "pf[i][kk]", "r[2]", "r[3]");
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_line(f, "#else");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "  for (int kk = 0; kk < %d; kk++)", PK);
  cu_line(f, "    for (int q = 0; q < 4; q++) emu_pf[warp][lane][(i * %d + kk) * 4 + q] = pf[i][kk][q];", PK);
  cu_line(f, "smelt_emu_warp_sync();");
  cu_line(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "  for (int kk = 0; kk < %d; kk++)", PK);
  cu_open(f, "    for (int j = 0; j < %d; j++)", OJ);
  cu_line(f, "auto a_of = [&](int l, unsigned x[4]) { for (int q = 0; q < 4; q++) x[q] = emu_pf[warp][l][(i * %d + kk) * 4 + q]; };",
          PK);
  cu_line(f, "auto b_of = [&](int l, unsigned y[2]) {");
  cu_line(f, "  unsigned r[4];");
  cu_line(f, "  const int j0 = j & ~1;");
  cu_line(f, "  emu_ldsm_x4(r, [&](int lane) { const int j = j0; return %s; }, true, l);", pv);
  cu_line(f, "  y[0] = r[(j & 1) * 2], y[1] = r[(j & 1) * 2 + 1];");
  cu_line(f, "};");
  cu_line(f, "emu_mma(o[i][j], a_of, b_of, %s);", bf16 ? "true" : "false");
  cu_close(f);
  cu_line(f, "smelt_emu_warp_sync();  // the exchange array is rewritten by the next tile");
  cu_line(f, "#endif");
  cu_close(f); /* kt */
  wait_group(f, 0);

  if (KS > 1) {
    /* per lane, fragment by fragment: the lanes of warps (kg, rw) hold the
     * same rows and columns for every kg, so the merge needs no exchange
     * within a warp; [..][lane] keeps the accesses free of bank conflicts */
    int FR = MI * (OJ * 4 + 4);
    cu_line(f, "// key split: groups 1 .. %d leave their (o, m, l) in shared memory (no tile is read any more);", KS - 1);
    cu_line(f, "// group 0 merges them into its own, as two online-softmax states are merged");
    cu_line(f, "__syncthreads();");
    cu_line(f, "float *const mg = reinterpret_cast<float *>(smelt_fa_smem);  // [group - 1][row warp][%d values][32 lanes]", FR);
    cu_open(f, "if (kg > 0)");
    cu_line(f, "float *const dst = mg + ((kg - 1) * %d + rw) * %d + lane;", W, FR * 32);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", MI);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int j = 0; j < %d; j++)", OJ);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int e = 0; e < 4; e++) dst[((i * %d + j) * 4 + e) * 32] = o[i][j][e];", OJ);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int hr = 0; hr < 2; hr++)");
    cu_line(f, "  dst[(%d + i * 4 + hr) * 32] = mrow[i][hr], dst[(%d + i * 4 + 2 + hr) * 32] = lrow[i][hr];", MI * OJ * 4,
            MI * OJ * 4);
    cu_close(f);
    cu_close(f);
    cu_line(f, "__syncthreads();");
    cu_line(f, "if (kg > 0) return;");
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int g = 1; g < %d; g++)", KS);
    cu_line(f, "const float *const src = mg + ((g - 1) * %d + rw) * %d + lane;", W, FR * 32);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int i = 0; i < %d; i++)", MI);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int hr = 0; hr < 2; hr++)");
    cu_line(f, "const float mo = src[(%d + i * 4 + hr) * 32], lo = src[(%d + i * 4 + 2 + hr) * 32];", MI * OJ * 4, MI * OJ * 4);
    cu_line(f, "const float mx = fmaxf(mrow[i][hr], mo);");
    cu_line(f, "// weights in log2 units; a state that has seen no key weighs 0");
    cu_line(f, "const float fa = mrow[i][hr] == -SMELT_INF_F ? 0.0f : fexp2((mrow[i][hr] - mx) * %s);", cu_const(f, DT_F32, sl2));
    cu_line(f, "const float fo = mo == -SMELT_INF_F ? 0.0f : fexp2((mo - mx) * %s);", cu_const(f, DT_F32, sl2));
    cu_line(f, "mrow[i][hr] = mx;");
    cu_line(f, "lrow[i][hr] = lrow[i][hr] * fa + lo * fo;");
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int j = 0; j < %d; j++)", OJ);
    cu_line(f, "o[i][j][2 * hr] = o[i][j][2 * hr] * fa + src[((i * %d + j) * 4 + 2 * hr) * 32] * fo;", OJ);
    cu_line(f, "o[i][j][2 * hr + 1] = o[i][j][2 * hr + 1] * fa + src[((i * %d + j) * 4 + 2 * hr + 1) * 32] * fo;", OJ);
    cu_close(f);
    cu_close(f);
    cu_close(f);
    cu_close(f);
  }

  cu_line(f, "// O / l through the epilogue: fragment element e of tile (i, j) is row g (+8 for e >= 2), column 2t (+1 for odd e)");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int i = 0; i < %d; i++)", MI);
  cu_line(f, "float inv[2];");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int hr = 0; hr < 2; hr++)");
  cu_line(f, "float sum = lrow[i][hr];");
  cu_line(f, "sum += __shfl_xor_sync(0xffffffffu, sum, 1);");
  cu_line(f, "sum += __shfl_xor_sync(0xffffffffu, sum, 2);");
  cu_line(f, "inv[hr] = sum > 0.0f ? 1.0f / sum : 0.0f;");
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int j = 0; j < %d; j++)", OJ);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < 4; e++)");
  const char *row = cu_tmp(f), *d = cu_tmp(f);
  cu_line(f, "const %s %s = (%s)(r0 + i * 16 + (lane >> 2) + (e >> 1) * 8);", f->idx, row, f->idx);
  cu_line(f, "const %s %s = j * 8 + (lane & 3) * 2 + (e & 1);", f->idx, d);
  cu_open(f, "if (%s < %lld)", row, (long long)S);
  CuVal y = {{0}};
  y.l[0] = cu_tmp(f);
  cu_line(f, "const float %s = o[i][j][e] * inv[e >> 1];  // %s (attention)", y.l[0], g->val[an->out[0]].name);
  const char *c[4] = {b, h, row, d};
  CuCoords co;
  cu_coords_scalar(&co, 4, c);
  cu_store_epilogue(f, epi, nepi, &co, &y);
  cu_close(f);
  cu_close(f);
  cu_close(f);
  cu_close(f);
}

/* ---- flashdec: the split-KV decode kernel ---- */

/* Declares `regs` and loads into it (when v is an argument) U 16-byte
 * chunks of operand v for keys `step` + u * NG + grp (zeros past kend);
 * key indices are of type jt (int when every key offset fits).  A chunk
 * is 4 x 32 bits, two 16-bit features each (feature 2i in the low half):
 * whole registers, which copy between pipeline stages without 16-bit moves
 * (packs of unsigned short went partly through local memory). */
static void dec_fetch(CuFn *f, const Att *a, int v, const char *regs, const char *gbase, const char *aligned, int U,
                      int NG, const char *step, const char *jt, int64_t T0) {
  cu_line(f, "smelt_pack<unsigned, 4> %s[%d];  // %s, features 2i, 2i+1 in word i", regs, U, f->g->val[v].name);
  if (!gbase) return;
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "const %s j = %s + u * %d + grp;", jt, step, NG);
  cu_line(f, "const unsigned short *src = %s + (long long)j * %lld + c * 8;", gbase, (long long)a->D);
  if (T0 < a->T) {
    cu_line(f, "// only the keys of the cache (the concat's first input) are loaded");
    cu_open(f, "if (j < kend && j < %lld)", (long long)T0);
  } else cu_open(f, "if (j < kend)");
  if (strcmp(aligned, "true") == 0) {
    cu_line(f, "%s[u] = *reinterpret_cast<const smelt_pack<unsigned, 4> *>(src);", regs);
  } else {
    cu_line(f, "if (%s) %s[u] = *reinterpret_cast<const smelt_pack<unsigned, 4> *>(src);", aligned, regs);
    cu_line(f, "else");
    cu_line(f, "  for (int i = 0; i < 4; i++) %s[u].v[i] = (unsigned)src[2 * i] | (unsigned)src[2 * i + 1] << 16;", regs);
  }
  cu_close(f);
  cu_line(f, "else");
  cu_line(f, "  %s[u] = smelt_pack<unsigned, 4>{{0u, 0u, 0u, 0u}};", regs);
  cu_close(f);
}

/* The 8 features of key j (a C expression) as floats `out[8]`: converted
 * from the fetched chunk `regs[u]` (arg: the operand, or for keys below T0
 * the first input of its concat, was loaded), or computed with cu_emit when
 * the operand is computed in the kernel (0 past kend). */
static void dec_floats(CuFn *f, const Att *a, int v, const char *regs, bool arg, int64_t T0, const char *out) {
  cu_line(f, "float %s[8];", out);
  bool part = arg && T0 < a->T;
  if (part) {
    cu_line(f, "// keys below %lld: loaded from the cache; the others computed (the concat's later inputs)", (long long)T0);
    cu_open(f, "if (j < %lld)", (long long)T0);
  }
  if (arg) {
    cu_line(f, "#pragma unroll");
    if (a->dt == DT_BF16)
      cu_line(f, "for (int e = 0; e < 8; e++) %s[e] = __int_as_float((int)(e & 1 ? %s[u].v[e / 2] & 0xffff0000u : %s[u].v[e / 2] << 16));",
              out, regs, regs);
    else {
      cu_line(f, "for (int e = 0; e < 8; e++)");
      cu_line(f, "#ifdef __CUDA_ARCH__");
      cu_line(f, "  %s[e] = __half2float(__ushort_as_half((unsigned short)(%s[u].v[e / 2] >> (e & 1) * 16)));", out, regs);
      cu_line(f, "#else");
      cu_line(f, "  %s[e] = emu_cvt((unsigned short)(%s[u].v[e / 2] >> (e & 1) * 16), false);", out, regs);
      cu_line(f, "#endif");
    }
    if (!part) return;
    cu_close(f);
    cu_open(f, "else");
  }
  cu_line(f, "// %s is computed in this kernel", f->g->val[v].name);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < 8; e++)");
  cu_line(f, "%s[e] = 0.0f;", out);
  cu_open(f, "if (j < kend)");
  const char *jj = cu_tmp(f), *d = cu_tmp(f);
  cu_line(f, "const %s %s = (%s)j, %s = c * 8 + e;", f->idx, jj, f->idx, d);
  const char *co4[4] = {"b", "hk", jj, d};
  CuCoords co;
  cu_coords_scalar(&co, 4, co4);
  CuVal x;
  cu_emit(f, v, &co, &x);
  cu_line(f, "%s[e] = %s;", out, x.l[0]);
  cu_close(f);
  cu_close(f);
  if (part) cu_close(f);
}

/* The result at element x (row x / D of the block, feature x % D) = A / L
 * (0 when no key was seen) through the epilogue, for rows that exist. */
static void dec_store(CuFn *f, const Att *a, const int *epi, int nepi, const char *x, const char *A, const char *L) {
  int64_t R, NRC;
  int RB, D = (int)a->D;
  dec_rows(a, &R, &NRC, &RB);
  cu_open(f, "%s", "");
  cu_line(f, "const long long row = (long long)rc * %d + %s / %d;", RB, x, D);
  cu_open(f, "if (row < %lldLL)", (long long)R);
  const char *hh = cu_tmp(f), *ii = cu_tmp(f), *dd = cu_tmp(f);
  cu_line(f, "const %s %s = hk * %lld + (%s)(row / %lld), %s = (%s)(row %% %lld), %s = %s %% %d;", f->idx, hh, (long long)a->G,
          f->idx, (long long)a->S, ii, f->idx, (long long)a->S, dd, x, D);
  CuVal y = {{0}};
  y.l[0] = cu_tmp(f);
  cu_line(f, "const float %s = %s > 0.0f ? %s / %s : 0.0f;  // %s (attention)", y.l[0], L, A, L, f->g->val[a->an->out[0]].name);
  const char *c[4] = {"b", hh, ii, dd};
  CuCoords co;
  cu_coords_scalar(&co, 4, c);
  cu_store_epilogue(f, epi, nepi, &co, &y);
  cu_close(f);
  cu_close(f);
}

/* Where flashdec loads operand v (K or V) from: v itself when it is an
 * argument (*T0 = T); the first input of a concat along the keys when v
 * is one computed in this kernel whose first input is an argument of v's
 * dtype and layout [B, Hkv, T0, D] (a KV cache with the new keys appended:
 * keys below T0 are loaded, the others computed); else -1. */
static int dec_source(const CuFn *f, const Att *a, int v, int64_t *T0) {
  const Graph *g = f->g;
  *T0 = a->T;
  if (is_arg_value(f, v)) return v;
  const Value *val = &g->val[v];
  if (val->kind != VK_NODE || !f->member[val->node]) return -1;
  const Node *n = &g->node[val->node];
  if (n->op != OP_CONCAT || n->nin < 2) return -1;
  int64_t axis = ir_attr_int(n, "axis");
  if (axis < 0) axis += 4;
  int c0 = n->in[0];
  const TensorType *t = &g->val[c0].type;
  if (axis != 2 || !is_arg_value(f, c0) || t->dt != a->dt || t->rank != 4) return -1;
  if (t->dim[0] != a->B || t->dim[1] != a->Hkv || t->dim[3] != a->D || t->dim[2] < 1 || t->dim[2] >= a->T) return -1;
  *T0 = t->dim[2];
  return c0;
}

static void emit_flashdec(CuFn *f, const Att *a, const DecParams *p, const int *epi, int nepi, CuLaunch *l) {
  const Graph *g = f->g;
  const Node *an = a->an;
  int D = (int)a->D, W = p->W, LPK = D / 8, GPW = 32 / LPK, NG = W * GPW, U = p->BN / NG, SPLIT = p->split;
  int threads = 32 * W;
  int64_t R, NRC;
  int RB;
  dec_rows(a, &R, &NRC, &RB);
  int64_t S = a->S, T = a->T, G = a->G, Hkv = a->Hkv, B = a->B;
  int64_t CHUNK = cdiv(T, SPLIT);
  int64_t units = B * Hkv * NRC;
  double sl2 = a->scale * LOG2E;
  /* key indices in 32 bits when every key's offset (up to 4 steps past T) fits: fewer registers */
  bool j32 = (T + 4 * (int64_t)p->BN) * D < 0x7fffffffLL;
  const char *jt = j32 ? "int" : "long long", *ll = j32 ? "" : "LL";
  /* workspace: counters (one per unit), then (m, l) and acc[D] per unit, split and row */
  uint64_t cnt_bytes = (uint64_t)cdiv(units * 4, 16) * 16;
  uint64_t ml_floats = (uint64_t)units * SPLIT * RB * 2, acc_floats = (uint64_t)units * SPLIT * RB * D;
  uint64_t acc_off = cnt_bytes + (uint64_t)cdiv((int64_t)ml_floats * 4, 16) * 16; /* 16-byte aligned: read as float4 */

  l->kind = "attention";
  l->block[0] = (unsigned)threads;
  l->grid[0] = (unsigned)(SPLIT * units); /* one dimension: side outputs' grid-stride loops use every block */
  l->workspace = SPLIT > 1 ? acc_off + 4 * acc_floats : 0;
  int qv = an->in[0], kv = an->in[1], vv = an->in[2];
  /* K and V come from memory with 16-byte loads when they are arguments,
   * or for the keys of a concat's first input when they are a concat
   * along the keys of an argument (a KV cache) and what follows it (the
   * new keys, computed element by element) */
  int64_t k0, v0;
  int kin = dec_source(f, a, kv, &k0), vin = dec_source(f, a, vv, &v0);
  bool ka = kin >= 0, va = vin >= 0;

  cu_line(f, "// variant: flashdec (split-KV decode: K and V read once with 16-byte loads, online softmax per key group)");
  cu_line(f, "// %s = attention(%s, %s, %s): B %lld, H %lld, Hkv %lld, S %lld, T %lld, D %d%s", g->val[an->out[0]].name,
          g->val[qv].name, g->val[kv].name, g->val[vv].name, (long long)B, (long long)a->H, (long long)Hkv, (long long)S,
          (long long)T, D, a->causal ? ", causal (query i sees keys j <= T - S + i)" : "");
  cu_line(f, "// parameters: %lld query rows per kv head in %lld chunk(s) of %d; %d warps, key groups of %d lanes (%d groups),",
          (long long)R, (long long)NRC, RB, W, LPK, NG);
  cu_line(f, "// %d keys per group and step (%d per block), %d split(s) of %lld keys%s", U, p->BN, SPLIT, (long long)CHUNK,
          p->pf == 2 ? ", loads two steps ahead" : p->pf ? ", loads one step ahead" : "");
  cu_line(f, "#ifndef __CUDA_ARCH__");
  cu_line(f, "auto emu_cvt = [](unsigned short h, bool bf16) -> float {");
  cu_line(f, "  if (bf16) { unsigned u = (unsigned)h << 16; float v; memcpy(&v, &u, 4); return v; }");
  cu_line(f, "  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;");
  cu_line(f, "  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);");
  cu_line(f, "  return s ? -v : v;");
  cu_line(f, "};");
  cu_line(f, "#endif");
  cu_line(f, "const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;");
  emit_fexp2(f);
  cu_line(f, "const int grp = warp * %d + lane / %d;  // this lane's key group", GPW, LPK);
  cu_line(f, "const int c = lane %% %d;  // its features: 8c .. 8c+7", LPK);
  cu_line(f, "// block -> (b, kv head, row chunk, split); the splits of one unit are neighbours");
  cu_line(f, "const int sp = (int)(blockIdx.x %% %du);  // this block's slice of the keys", SPLIT);
  cu_line(f, "const long long unit = blockIdx.x / %du;  // (b, kv head, row chunk)", SPLIT);
  cu_line(f, "const int rc = (int)(unit %% %lld);  // row chunk", (long long)NRC);
  cu_line(f, "const %s hk = (%s)(unit / %lld %% %lld), b = (%s)(unit / %lld);", f->idx, f->idx, (long long)NRC, (long long)Hkv,
          f->idx, (long long)(NRC * Hkv));
  cu_line(f, "const %s kbeg = (%s)sp * %lld;", jt, jt, (long long)CHUNK);
  cu_line(f, "const %s kend = kbeg + %lld < %lld%s ? kbeg + %lld : %lld%s;  // this split's keys [kbeg, kend)", jt, (long long)CHUNK,
          (long long)T, ll, (long long)CHUNK, (long long)T, ll);
  if (ka)
    cu_line(f, "const unsigned short *Kg = reinterpret_cast<const unsigned short *>(a%d) + ((long long)b * %lld + hk) * %lldLL;  // %s",
            f->arg_of[kin], (long long)Hkv, (long long)(k0 * D), g->val[kin].name);
  if (va)
    cu_line(f, "const unsigned short *Vg = reinterpret_cast<const unsigned short *>(a%d) + ((long long)b * %lld + hk) * %lldLL;  // %s",
            f->arg_of[vin], (long long)Hkv, (long long)(v0 * D), g->val[vin].name);
  const char *aligned = "true";
  if ((ka || va) && !(f->opt && f->opt->args_aligned)) {
    aligned = "aligned16";
    cu_line(f, "const bool aligned16 = true%s%s;", ka ? cu_fmt(f, " && smelt_aligned(a%d, 16)", f->arg_of[kin]) : "",
            va ? cu_fmt(f, " && smelt_aligned(a%d, 16)", f->arg_of[vin]) : "");
  }

  /* pf: a software pipeline pf steps deep: the loads of step base + pf * BN
   * are issued before the math of step base, so that every lane keeps
   * (pf + 1) U chunks of K and of V in flight while it computes (the
   * latency of a step's loads is no longer exposed once per step).  The
   * first steps' loads are issued before the query prologue, whose own
   * loads and __syncthreads they overlap. */
  bool pf = p->pf && (ka || va);
  if (pf) {
    cu_line(f, "// software pipeline: this step's K and V chunks (keys base + u * %d + grp) were loaded %d step(s) ahead;", NG, p->pf);
    cu_line(f, "// the first step(s)' loads are issued here, in flight during the query prologue");
    dec_fetch(f, a, kv, "kr", ka ? "Kg" : NULL, aligned, U, NG, "kbeg", jt, k0);
    dec_fetch(f, a, vv, "vr", va ? "Vg" : NULL, aligned, U, NG, "kbeg", jt, v0);
    if (p->pf == 2) {
      if (ka) dec_fetch(f, a, kv, "kn", "Kg", aligned, U, NG, cu_fmt(f, "(kbeg + %d)", p->BN), jt, k0);
      if (va) dec_fetch(f, a, vv, "vn", "Vg", aligned, U, NG, cu_fmt(f, "(kbeg + %d)", p->BN), jt, v0);
    }
  }

  /* the rows: r -> row rc * RB + r of this kv head: query head hk * G + row / S, position row % S */
  cu_line(f, "// this block's query rows: row -> query head hk * %lld + row / %lld, position row %% %lld", (long long)G,
          (long long)S, (long long)S);
  cu_line(f, "// the query rows, times scale * log2(e), computed once per block (in parallel) into shared memory");
  cu_line(f, "__align__(16) __shared__ float sq[%d][%d];", RB, D);
  cu_open(f, "for (int x = threadIdx.x; x < %d; x += %d)", RB * D, threads);
  cu_line(f, "const int r = x / %d;", D);
  cu_line(f, "const long long row = (long long)rc * %d + r;", RB);
  cu_line(f, "float qx = 0.0f;");
  cu_open(f, "if (row < %lldLL)", (long long)R);
  const char *h = cu_tmp(f), *i = cu_tmp(f), *d = cu_tmp(f);
  cu_line(f, "const %s %s = hk * %lld + (%s)(row / %lld), %s = (%s)(row %% %lld), %s = x %% %d;", f->idx, h, (long long)G,
          f->idx, (long long)S, i, f->idx, (long long)S, d, D);
  {
    const char *c[4] = {"b", h, i, d};
    CuCoords co;
    cu_coords_scalar(&co, 4, c);
    CuVal x;
    cu_emit(f, qv, &co, &x);
    cu_line(f, "qx = %s * %s;", x.l[0], cu_const(f, DT_F32, sl2));
  }
  cu_close(f);
  cu_line(f, "sq[r][x %% %d] = qx;", D);
  cu_close(f);
  /* causal with several positions: a row's last key; else every row sees
   * every key of the split (rows past R -- zero queries, finite scores --
   * are computed but never stored): no per-row limit, no registers for it */
  bool needlim = a->causal && S > 1;
  const char *mask = needlim ? "j < kend && j <= lim[r]" : "j < kend";
  if (needlim) {
    cu_line(f, "%s lim[%d];  // the last key each row sees (-1: not a row)", jt, RB);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int r = 0; r < %d; r++)", RB);
    cu_line(f, "const long long row = (long long)rc * %d + r;", RB);
    cu_line(f, "lim[r] = row < %lldLL ? %lld%s + (%s)(row %% %lld) : -1;", (long long)R, (long long)(T - S), ll, jt, (long long)S);
    cu_close(f);
  } else cu_line(f, "// every row sees every key of the split (S = 1 or not causal): only the split's end masks");
  cu_line(f, "__syncthreads();");
  /* one or two rows: this lane's features in registers; more: read from
   * shared memory per key (registers go to the accumulators) */
  const char *qe = "sq[r][c * 8 + e]";
  if (RB <= 2) {
    qe = "q[r][e]";
    cu_line(f, "float q[%d][8];  // this lane's features 8c .. 8c+7", RB);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int r = 0; r < %d; r++)", RB);
    cu_line(f, "  #pragma unroll");
    cu_line(f, "  for (int e = 0; e < 8; e++) q[r][e] = sq[r][c * 8 + e];");
  }

  cu_line(f, "float m[%d], lsum[%d], acc[%d][8];  // per row: running max (log2 units), sum, output features", RB, RB, RB);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", RB);
  cu_line(f, "m[r] = -SMELT_INF_F, lsum[r] = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 8; e++) acc[r][e] = 0.0f;");
  cu_close(f);

  cu_open(f, "for (%s base = kbeg; base < kend; base += %d)", jt, p->BN);
  if (pf) {
    /* pf = 1: kn is step base + BN; pf = 2: kn (loaded a step ago) is base + BN, kn2 base + 2 BN */
    const char *nk = p->pf == 2 ? "kn2" : "kn", *nv = p->pf == 2 ? "vn2" : "vn";
    cu_line(f, "// the chunks of step base + %d, in flight during this step's math (zeros past kend)", p->pf * p->BN);
    if (ka) dec_fetch(f, a, kv, nk, "Kg", aligned, U, NG, cu_fmt(f, "(base + %d)", p->pf * p->BN), jt, k0);
    if (va) dec_fetch(f, a, vv, nv, "Vg", aligned, U, NG, cu_fmt(f, "(base + %d)", p->pf * p->BN), jt, v0);
  } else {
    cu_line(f, "// %d keys per group in flight: key base + u * %d + grp", U, NG);
    dec_fetch(f, a, kv, "kr", ka ? "Kg" : NULL, aligned, U, NG, "base", jt, k0);
    dec_fetch(f, a, vv, "vr", va ? "Vg" : NULL, aligned, U, NG, "base", jt, v0);
  }
  cu_line(f, "float sc[%d][%d];  // scores (log2 units)", U, RB);
  bool tr = p->tr && LPK > 1;
  int NP = 1, LV = 0, TL = 0; /* tr: values padded to NP (a power of 2); LV levels over the group, TL of them halving */
  if (tr) {
    while (NP < U * RB) NP *= 2;
    while ((1 << LV) < LPK) LV++;
    while ((1 << TL) < NP && TL < LV) TL++;
    cu_line(f, "float part[%d];  // per key u and row r (index u * %d + r): this lane's part of the dot product", NP, RB);
    if (NP > U * RB) {
      cu_line(f, "#pragma unroll");
      cu_line(f, "for (int i = %d; i < %d; i++) part[i] = 0.0f;  // padding to a power of 2", U * RB, NP);
    }
  }
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "const %s j = base + u * %d + grp;", jt, NG);
  dec_floats(f, a, kv, "kr", ka, k0, "kf");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", RB);
  cu_line(f, "float x = 0.0f;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 8; e++) x += %s * kf[e];", qe);
  if (tr) cu_line(f, "part[u * %d + r] = x;", RB);
  else {
    if (LPK > 1) {
      cu_line(f, "#pragma unroll");
      cu_line(f, "for (int o = %d; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);  // over the group", LPK / 2);
    }
    cu_line(f, "sc[u][r] = %s ? x : -SMELT_INF_F;", mask);
  }
  cu_close(f);
  cu_close(f);
  if (tr) {
    /* a transposed reduction: at each of the first TL levels a lane sends
     * half of its values and keeps the other half (the lower lane of the
     * pair keeps the lower half), so the NP sums take NP - 1 + ... shuffles
     * instead of NP * LV; the remaining levels sum what is left; then the
     * same levels backwards hand every lane all the sums again */
    cu_line(f, "// the sums over the group of all %d values at once: each shuffle level halves the values a lane keeps", NP);
    for (int k = 0; k < TL; k++) {
      int o = LPK >> (k + 1), hv = NP >> (k + 1);
      cu_open(f, "%s", "");
      cu_line(f, "const bool up = (lane & %d) != 0;  // keeps values %d.. of the %d", o, hv, 2 * hv);
      cu_line(f, "#pragma unroll");
      cu_open(f, "for (int i = 0; i < %d; i++)", hv);
      cu_line(f, "const float snd = up ? part[i] : part[i + %d], kept = up ? part[i + %d] : part[i];", hv, hv);
      cu_line(f, "part[i] = kept + __shfl_xor_sync(0xffffffffu, snd, %d);", o);
      cu_close(f);
      cu_close(f);
    }
    if (TL < LV) {
      cu_line(f, "// the levels left: plain sums of the %d value(s) each lane keeps", NP >> TL);
      for (int k = TL; k < LV; k++) {
        cu_line(f, "#pragma unroll");
        cu_line(f, "for (int i = 0; i < %d; i++) part[i] += __shfl_xor_sync(0xffffffffu, part[i], %d);", NP >> TL, LPK >> (k + 1));
      }
    }
    cu_line(f, "// back up the levels: every lane gets all the sums");
    for (int k = TL - 1; k >= 0; k--) {
      int o = LPK >> (k + 1), hv = NP >> (k + 1);
      cu_open(f, "%s", "");
      cu_line(f, "const bool up = (lane & %d) != 0;", o);
      cu_line(f, "#pragma unroll");
      cu_open(f, "for (int i = 0; i < %d; i++)", hv);
      cu_line(f, "const float other = __shfl_xor_sync(0xffffffffu, part[i], %d), mine = part[i];", o);
      cu_line(f, "part[i] = up ? other : mine, part[i + %d] = up ? mine : other;", hv);
      cu_close(f);
      cu_close(f);
    }
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int u = 0; u < %d; u++)", U);
    cu_line(f, "const %s j = base + u * %d + grp;", jt, NG);
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int r = 0; r < %d; r++) sc[u][r] = %s ? part[u * %d + r] : -SMELT_INF_F;", RB, mask, RB);
    cu_close(f);
  }
  cu_line(f, "// rescale by the new maximum, then add the keys");
  cu_line(f, "float mb[%d];", RB);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", RB);
  cu_line(f, "float mx = m[r];");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int u = 0; u < %d; u++) mx = fmaxf(mx, sc[u][r]);", U);
  cu_line(f, "mb[r] = mx == -SMELT_INF_F ? 0.0f : mx;  // no key seen yet: no inf - inf");
  cu_line(f, "const float corr = fexp2(m[r] - mb[r]);");
  cu_line(f, "m[r] = mx;");
  cu_line(f, "lsum[r] *= corr;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 8; e++) acc[r][e] *= corr;");
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int u = 0; u < %d; u++)", U);
  cu_line(f, "const %s j = base + u * %d + grp;", jt, NG);
  dec_floats(f, a, vv, "vr", va, v0, "vf");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", RB);
  cu_line(f, "const float pr = fexp2(sc[u][r] - mb[r]);");
  cu_line(f, "lsum[r] += pr;");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 8; e++) acc[r][e] += pr * vf[e];");
  cu_close(f);
  cu_close(f);
  if (pf) {
    cu_line(f, "// the next step's chunks become this step's");
    cu_line(f, "#pragma unroll");
    if (p->pf == 2)
      cu_line(f, "for (int u = 0; u < %d; u++) {%s%s }", U, ka ? " kr[u] = kn[u]; kn[u] = kn2[u];" : "",
              va ? " vr[u] = vn[u]; vn[u] = vn2[u];" : "");
    else cu_line(f, "for (int u = 0; u < %d; u++) {%s%s }", U, ka ? " kr[u] = kn[u];" : "", va ? " vr[u] = vn[u];" : "");
  }
  cu_close(f); /* base */

  /* merge the groups: within the warp by shuffles, then the warps in shared memory */
  cu_line(f, "// merge two online-softmax states: (m, l, acc) and (mo, lo, acco)");
  if (GPW > 1) {
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int off = %d; off < 32; off <<= 1)", LPK);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int r = 0; r < %d; r++)", RB);
    cu_line(f, "const float mo = __shfl_xor_sync(0xffffffffu, m[r], off), lo = __shfl_xor_sync(0xffffffffu, lsum[r], off);");
    cu_line(f, "const float mx = fmaxf(m[r], mo), mbase = mx == -SMELT_INF_F ? 0.0f : mx;");
    cu_line(f, "const float fa = fexp2(m[r] - mbase), fo = fexp2(mo - mbase);");
    cu_line(f, "m[r] = mx;");
    cu_line(f, "lsum[r] = lsum[r] * fa + lo * fo;");
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int e = 0; e < 8; e++) acc[r][e] = acc[r][e] * fa + __shfl_xor_sync(0xffffffffu, acc[r][e], off) * fo;");
    cu_close(f);
    cu_close(f);
  }
  cu_line(f, "__shared__ float sm_m[%d][%d], sm_l[%d][%d], sm_acc[%d][%d][%d];", W, RB, W, RB, W, RB, D);
  cu_open(f, "if (lane < %d)", LPK);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int r = 0; r < %d; r++)", RB);
  cu_line(f, "if (c == 0) sm_m[warp][r] = m[r], sm_l[warp][r] = lsum[r];");
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int e = 0; e < 8; e++) sm_acc[warp][r][c * 8 + e] = acc[r][e];");
  cu_close(f);
  cu_close(f);
  cu_line(f, "__syncthreads();");

  if (SPLIT == 1) {
    cu_line(f, "// one split: the block's result is final");
    cu_open(f, "for (int x = threadIdx.x; x < %d; x += %d)", RB * D, threads);
    cu_line(f, "const int r = x / %d;", D);
    cu_line(f, "const long long row = (long long)rc * %d + r;", RB);
    cu_line(f, "if (row >= %lldLL) continue;", (long long)R);
    cu_line(f, "float mx = -SMELT_INF_F, L = 0.0f, A = 0.0f;");
    cu_line(f, "for (int w = 0; w < %d; w++) mx = fmaxf(mx, sm_m[w][r]);", W);
    cu_open(f, "for (int w = 0; w < %d; w++)", W);
    cu_line(f, "const float fw = sm_m[w][r] == -SMELT_INF_F ? 0.0f : fexp2(sm_m[w][r] - mx);");
    cu_line(f, "L += sm_l[w][r] * fw, A += sm_acc[w][r][x %% %d] * fw;", D);
    cu_close(f);
    dec_store(f, a, epi, nepi, "x", "A", "L");
    cu_close(f);
    return;
  }
  cu_line(f, "// this block's partial (m, l, acc) per row into the workspace: unit (b, hk, rc), split sp");
  cu_line(f, "unsigned *const cnt = reinterpret_cast<unsigned *>(ws) + unit;");
  cu_line(f, "float *const wml = reinterpret_cast<float *>(ws + %llu) + unit * %d;  // [split][row][m, l]",
          (unsigned long long)cnt_bytes, SPLIT * RB * 2);
  cu_line(f, "float *const wacc = reinterpret_cast<float *>(ws + %llu) + unit * %d;  // [split][row][D]",
          (unsigned long long)acc_off, SPLIT * RB * D);
  cu_open(f, "for (int x = threadIdx.x; x < %d; x += %d)", RB * D, threads);
  cu_line(f, "const int r = x / %d;", D);
  cu_line(f, "float mx = -SMELT_INF_F, L = 0.0f, A = 0.0f;");
  cu_line(f, "for (int w = 0; w < %d; w++) mx = fmaxf(mx, sm_m[w][r]);", W);
  cu_open(f, "for (int w = 0; w < %d; w++)", W);
  cu_line(f, "const float fw = sm_m[w][r] == -SMELT_INF_F ? 0.0f : fexp2(sm_m[w][r] - mx);");
  cu_line(f, "L += sm_l[w][r] * fw, A += sm_acc[w][r][x %% %d] * fw;", D);
  cu_close(f);
  cu_line(f, "wacc[(long long)sp * %d + x] = A;", RB * D);
  cu_line(f, "if (x %% %d == 0) wml[((long long)sp * %d + r) * 2] = mx, wml[((long long)sp * %d + r) * 2 + 1] = L;", D, RB, RB);
  cu_close(f);
  cu_line(f, "// the last block of this unit to finish merges the partials");
  cu_line(f, "__shared__ int is_last;");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__threadfence();  // this thread's part of the partial is visible before the count says so");
  cu_line(f, "#endif");
  cu_line(f, "__syncthreads();");
  cu_open(f, "if (threadIdx.x == 0)");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "is_last = atomicAdd(cnt, 1u) == %du;", SPLIT - 1);
  cu_line(f, "#else");
  cu_line(f, "is_last = (*cnt)++ == %du;  // the emulation runs blocks one after another", SPLIT - 1);
  cu_line(f, "#endif");
  cu_close(f);
  cu_line(f, "__syncthreads();");
  cu_line(f, "if (!is_last) return;");
  cu_line(f, "#ifdef __CUDA_ARCH__");
  cu_line(f, "__threadfence();");
  cu_line(f, "auto ld = [](const float *p) { return __ldcg(p); };  // past L1: written by other SMs");
  cu_line(f, "auto ld4 = [](const float *p) {");
  cu_line(f, "  const float4 t = __ldcg(reinterpret_cast<const float4 *>(p));");
  cu_line(f, "  return smelt_pack<float, 4>{{t.x, t.y, t.z, t.w}};");
  cu_line(f, "};");
  cu_line(f, "#else");
  cu_line(f, "auto ld = [](const float *p) { return *p; };");
  cu_line(f, "auto ld4 = [](const float *p) { return *reinterpret_cast<const smelt_pack<float, 4> *>(p); };");
  cu_line(f, "#endif");
  /* the sums' layout: 4 features per thread (16-byte loads), the splits
   * cut into NSG groups when there are fewer 4-feature chunks than threads */
  int NX4 = RB * D / 4, NSG = NX4 >= threads ? 1 : threads / NX4;
  if (NSG > SPLIT) NSG = SPLIT;
  /* one pass: when every thread has at most one 4-feature chunk, its first
   * NPRE partials are loaded before the weights (in flight together with
   * the (m, l) loads: one round trip to memory instead of two) */
  int NPRE = NSG * NX4 <= threads ? (int)cdiv(SPLIT, NSG) : 0;
  if (NPRE > 4) NPRE = 4; /* 16 registers: more spilled with 8 rows' accumulators live */
  if (NPRE) {
    cu_line(f, "// this thread's first %d partial(s) (splits sg + k * %d, 4 features), loaded now: in flight with the (m, l) loads", NPRE,
            NSG);
    cu_line(f, "const int px4 = threadIdx.x %% %d, psg = threadIdx.x / %d;", NX4, NX4);
    cu_line(f, "smelt_pack<float, 4> pre[%d];", NPRE);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int k = 0; k < %d; k++)", NPRE);
    cu_line(f, "const int s = psg + k * %d;", NSG);
    cu_line(f, "pre[k] = smelt_pack<float, 4>{{0.0f, 0.0f, 0.0f, 0.0f}};  // (not a ?: of two packs: that goes through local memory)");
    cu_line(f, "if (psg < %d && s < %d) pre[k] = ld4(&wacc[(long long)s * %d + px4 * 4]);", NSG, SPLIT, RB * D);
    cu_close(f);
  }
  /* the weights: one warp per row, lanes over the splits, every load in flight at once */
  int NS = (int)cdiv(SPLIT, 32);
  cu_line(f, "// the weights exp2(m_s - max) of every split's partial: a warp per row, lanes over the splits");
  cu_line(f, "__shared__ float cw[%d][%d], cl[%d];  // [split][row] weights; per row the merged sum", SPLIT, RB, RB);
  cu_open(f, "for (int r = warp; r < %d; r += %d)", RB, W);
  cu_line(f, "float ms[%d], ls[%d], mx = -SMELT_INF_F, L = 0.0f;", NS, NS);
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int k = 0; k < %d; k++)", NS);
  cu_line(f, "const int s = lane + 32 * k;");
  cu_line(f, "ms[k] = s < %d ? ld(&wml[(s * %d + r) * 2]) : -SMELT_INF_F;", SPLIT, RB);
  cu_line(f, "ls[k] = s < %d ? ld(&wml[(s * %d + r) * 2 + 1]) : 0.0f;", SPLIT, RB);
  cu_line(f, "mx = fmaxf(mx, ms[k]);");
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int k = 0; k < %d; k++)", NS);
  cu_line(f, "const int s = lane + 32 * k;");
  cu_line(f, "const float w = ms[k] == -SMELT_INF_F ? 0.0f : fexp2(ms[k] - mx);");
  cu_line(f, "L += ls[k] * w;");
  cu_open(f, "if (s < %d)", SPLIT);
  cu_line(f, "cw[s][r] = w;");
  cu_line(f, "wml[(s * %d + r) * 2] = wml[(s * %d + r) * 2 + 1] = 0.0f;  // read: leave the workspace zero", RB, RB);
  cu_close(f);
  cu_close(f);
  cu_line(f, "#pragma unroll");
  cu_line(f, "for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);");
  cu_line(f, "if (lane == 0) cl[r] = L;");
  cu_close(f);
  cu_line(f, "__syncthreads();");
  cu_line(f, "// sum of weight * partial over the splits: 4 features per thread (16-byte loads, all independent)%s",
          NSG > 1 ? cu_fmt(f, ", the splits in %d groups", NSG) : "");
  if (NSG > 1) cu_line(f, "__shared__ smelt_pack<float, 4> cred[%d][%d];  // per split group", NSG, NX4);
  cu_open(f, "for (int t = threadIdx.x; t < %d; t += %d)", NSG * NX4, threads);
  cu_line(f, "const int x4 = t %% %d, sg = t / %d, r = x4 * 4 / %d;", NX4, NX4, D);
  cu_line(f, "smelt_pack<float, 4> A = {{0.0f, 0.0f, 0.0f, 0.0f}};");
  if (NPRE) {
    cu_line(f, "// the partials loaded before the weights (t is this thread's index: one chunk per thread)");
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int k = 0; k < %d; k++)", NPRE);
    cu_line(f, "const int s = sg + k * %d;", NSG);
    cu_line(f, "const float w = s < %d ? cw[s][r] : 0.0f;", SPLIT);
    cu_line(f, "A.v[0] += w * pre[k].v[0], A.v[1] += w * pre[k].v[1], A.v[2] += w * pre[k].v[2], A.v[3] += w * pre[k].v[3];");
    cu_close(f);
  }
  cu_line(f, "#pragma unroll 16");
  cu_open(f, "for (int s = sg + %d; s < %d; s += %d)", NPRE * NSG, SPLIT, NSG);
  cu_line(f, "const float w = cw[s][r];");
  cu_line(f, "const smelt_pack<float, 4> pt = ld4(&wacc[(long long)s * %d + x4 * 4]);", RB * D);
  cu_line(f, "A.v[0] += w * pt.v[0], A.v[1] += w * pt.v[1], A.v[2] += w * pt.v[2], A.v[3] += w * pt.v[3];");
  cu_close(f);
  cu_line(f, "// read: leave the workspace zero");
  cu_line(f, "for (int s = sg; s < %d; s += %d) *reinterpret_cast<smelt_pack<float, 4> *>(&wacc[(long long)s * %d + x4 * 4]) = smelt_pack<float, 4>{{0.0f, 0.0f, 0.0f, 0.0f}};",
          SPLIT, NSG, RB * D);
  if (NSG > 1) {
    cu_line(f, "cred[sg][x4] = A;");
    cu_close(f);
    cu_line(f, "__syncthreads();");
    cu_open(f, "for (int x4 = threadIdx.x; x4 < %d; x4 += %d)", NX4, threads);
    cu_line(f, "smelt_pack<float, 4> A = cred[0][x4];");
    cu_line(f, "#pragma unroll");
    cu_line(f, "for (int s = 1; s < %d; s++) A.v[0] += cred[s][x4].v[0], A.v[1] += cred[s][x4].v[1], A.v[2] += cred[s][x4].v[2], A.v[3] += cred[s][x4].v[3];",
            NSG);
  }
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int e = 0; e < 4; e++)");
  cu_line(f, "const int x = x4 * 4 + e;");
  dec_store(f, a, epi, nepi, "x", "A.v[e]", cu_fmt(f, "cl[x / %d]", D));
  cu_close(f);
  cu_close(f);
  cu_line(f, "if (threadIdx.x == 0) *cnt = 0u;  // ready for the next launch");
}

/* ---- entry ---- */

void cu_emit_attention(CuFn *f, CuLaunch *l) {
  Att a;
  att_shape(f, &a);
  int *epi, nepi, *side, nside;
  cu_split_outputs(f, &epi, &nepi, &side, &nside);
  if (nside) cu_store_loops(f, side, nside);

  /* the variant: forced, else the tuning table's, else the heuristic's */
  AttVariant v;
  bool from_table = false;
  const char *tok = cu_pick_variant(f, &from_table);
  const char *why = "";
  if (tok) {
    bool ok = parse_variant(tok, &v);
    if (!ok) why = "is not an attention variant (flash:bm=..,bn=..,w=..,st=..[,ks=..], flashdec:split=..,bn=..,w=..[,pf=..][,tr=..], simple)";
    else ok = variant_valid(f, &a, &v, &why);
    if (!ok && !from_table) {
      cu_fail(f, ST_INVALID_INPUT, "variant '%s' %s for attention '%s' (%s B %lld H %lld Hkv %lld S %lld T %lld D %lld%s%s)",
              tok, why, f->g->val[a.an->out[0]].name, dt_name(a.dt), (long long)a.B, (long long)a.H, (long long)a.Hkv,
              (long long)a.S, (long long)a.T, (long long)a.D, a.causal ? " causal" : "", a.mask ? " masked" : "");
      return;
    }
    if (!ok) {
      cu_log(f, "%s: tuned variant '%s' %s; using the heuristic", f->k->name, tok, why);
      heuristic(f, &a, &v);
    }
  } else {
    heuristic(f, &a, &v);
    char h[CG_VARIANT_LEN];
    format_variant(&v, h);
    cu_note_heuristic(f, h);
  }
  format_variant(&v, l->variant);
  switch (v.fam) {
  case ATT_FLASH: emit_flash(f, &a, &v.fp, epi, nepi, l); break;
  case ATT_FLASHDEC: emit_flashdec(f, &a, &v.dp, epi, nepi, l); break;
  default: emit_simple(f, &a, epi, nepi, l); break;
  }
}
