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
 * cache: true (the 4th input is the queries' positions pos [S], i32 or
 *   i64, read from memory at run time: a CUDA graph replays the kernels
 *   with new positions; k and v are caches of capacity T, written in place
 *   by scatter, so they are arguments and load with 16-byte accesses):
 *   query i sees keys 0 .. pos[i].  simple: a row's keys end at pos[i].
 *   flashdec: the block reads every pos, the valid keys are 0 .. max(pos);
 *   they are cut into at most `split` slices of at least 16 KB of K and V
 *   each, the blocks of the slices past them return at once and the last
 *   of the others merges only theirs (the count it waits for is the
 *   number of valid slices); with S > 1 each row also stops at its pos.
 *   flash: the block's positions go to shared memory; the block streams
 *   the tiles up to its largest, a warp skips tiles past its rows' largest
 *   and masks the tiles past its smallest, blocks run longest-first.  So
 *   the cost follows the positions, not the capacity.
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

#include "codegen/cuda/cu_attention.h"

/* flashdec: the blocks the heuristic aims for (a few per SM of an H100/H200),
 * the K and V bytes a block streams at least, and the most splits (the last
 * block keeps a weight per split and row in shared memory) */
#define DEC_TARGET_BLOCKS 512
#define DEC_MIN_BLOCK_BYTES (16 * 1024)
#define DEC_MAX_SPLIT 1024

/* ---- the shape and the variants ---- */

void cu_att_shape(const CuFn *f, Att *a) {
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
  a->cache = ir_attr_int(an, "cache") != 0;
  a->mask = an->nin > 3 && !a->cache;
  a->pos = a->cache ? an->in[3] : -1;
}

const char *cu_att_pos(CuFn *f, const Att *a, const char *i) {
  const char *c[1] = {i};
  CuCoords co;
  cu_coords_scalar(&co, 1, c);
  CuVal x;
  cu_emit(f, a->pos, &co, &x);
  return cu_fmt(f, "(long long)(%s)", x.l[0]);
}

bool cu_att_is_arg_value(const CuFn *f, int v) {
  const Value *val = &f->g->val[v];
  if (f->arg_of[v] < 0) return false;
  return !(val->kind == VK_NODE && f->member[val->node]);
}

int64_t cu_att_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

bool cu_att_flash_eligible(const Att *a, const char **why) {
  if (!tc_common(a, why)) return false;
  if (a->D % 16 != 0 || a->D > 128) return *why = "needs a head dim that is a multiple of 16 up to 128", false;
  return true;
}

/* Q, K and V tiles (f16/bf16, rows padded by 8); with a key split the same
 * memory later takes the other key groups' (o, m, l) in f32 for the merge. */
int64_t cu_att_flash_smem(const Att *a, const FlashParams *p) {
  int64_t tiles = 2 * (int64_t)(p->BM + 2 * p->stages * p->BN) * (a->D + 8);
  int64_t merge = 4 * (int64_t)(p->KS - 1) * p->BM * (a->D + 8);
  /* cache: the block's positions (a static int per row) count against the same limit */
  return (tiles > merge ? tiles : merge) + (a->cache ? 4 * (int64_t)p->BM : 0);
}

static bool flash_valid(const CuFn *f, const Att *a, const FlashParams *p, const char **why) {
  if (!cu_att_flash_eligible(a, why)) return false;
  if (p->W != 1 && p->W != 2 && p->W != 4 && p->W != 8) return *why = "w must be 1, 2, 4 or 8", false;
  if (p->BM != 16 * p->W && p->BM != 32 * p->W) return *why = "bm must be 16 or 32 rows per warp (16 w or 32 w)", false;
  if (p->BN != 16 && p->BN != 32 && p->BN != 64 && p->BN != 128) return *why = "bn must be 16, 32, 64 or 128", false;
  if (p->stages < 2 || p->stages > 4) return *why = "st must be 2, 3 or 4", false;
  if (p->KS != 1 && p->KS != 2 && p->KS != 4) return *why = "ks must be 1, 2 or 4", false;
  if (p->W * p->KS > 8) return *why = "w * ks must be at most 8 warps", false;
  if (p->BN / p->KS < 16) return *why = "bn / ks must be at least 16 keys per warp", false;
  if (cu_att_flash_smem(a, p) > smem_limit(f)) return *why = "needs more shared memory than a block may use", false;
  if (a->B * a->H * cu_att_cdiv(a->S, p->BM) > 0x7fffffffLL) return *why = "has more blocks than the grid takes", false;
  return true;
}

/* flashdec's query rows per kv head, the row chunks they are cut into and
 * the rows per block. */
void cu_att_dec_rows(const Att *a, int64_t *out_rows, int64_t *out_chunks, int *out_rb) {
  int64_t R = a->G * a->S;
  int64_t nrc = cu_att_cdiv(R, CU_ATT_DEC_MAX_ROWS);
  *out_rows = R;
  *out_chunks = nrc;
  *out_rb = (int)cu_att_cdiv(R, nrc);
}

bool cu_att_dec_eligible(const Att *a, const char **why) {
  if (!tc_common(a, why)) return false;
  if (a->D < 8 || a->D > 256 || 32 % (a->D / 8) != 0 || a->D % 8 != 0)
    return *why = "needs a head dim of 8, 16, 32, 64, 128 or 256", false;
  return true;
}

static bool dec_valid(const CuFn *f, const Att *a, const DecParams *p, const char **why) {
  if (!cu_att_dec_eligible(a, why)) return false;
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
  cu_att_dec_rows(a, &R, &nrc, &rb);
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

bool cu_att_parse_variant(const char *tok, AttVariant *out) {
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

void cu_att_format_variant(const AttVariant *v, char out[CG_VARIANT_LEN]) {
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

bool cu_att_variant_valid(const CuFn *f, const Att *a, const AttVariant *v, const char **why) {
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
void cu_att_dec_default(const Att *a, DecParams *p) {
  int64_t R, nrc;
  int rb;
  cu_att_dec_rows(a, &R, &nrc, &rb);
  int W = rb <= 2 ? 4 : 8, groups = W * (32 / (int)(a->D / 8));
  int U = 2, pf = rb <= 2 ? 2 : 1;
  int64_t units = a->B * a->Hkv * nrc;
  int64_t split = cu_att_cdiv(DEC_TARGET_BLOCKS, units);
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
void cu_att_heuristic(const CuFn *f, const Att *a, AttVariant *out) {
  const char *why;
  memset(out, 0, sizeof *out);
  out->fam = ATT_SIMPLE;
  AttVariant v = {0};
  if (cu_att_dec_eligible(a, &why) && a->G * a->S <= 16) {
    v.fam = ATT_FLASHDEC;
    cu_att_dec_default(a, &v.dp);
    if (cu_att_variant_valid(f, a, &v, &why)) {
      *out = v;
      return;
    }
  }
  if (cu_att_flash_eligible(a, &why)) {
    v.fam = ATT_FLASH;
    if (a->S < 256) v.fp = (FlashParams){64, 32, 4, 2, 1};
    else if (a->D > 64) v.fp = (FlashParams){128, 32, 4, 2, 1};
    else if (a->S >= 1024) v.fp = (FlashParams){128, 64, 4, 2, 1};
    /* causal, a few hundred rows: the blocks of the last rows decide; two key
     * groups halve the tiles' work on each warp of those blocks */
    else v.fp = a->causal || a->cache ? (FlashParams){64, 128, 4, 2, 2} : (FlashParams){64, 32, 4, 2, 1};
    if (cu_att_variant_valid(f, a, &v, &why)) *out = v;
  }
}

/* ---- pieces the flash kernels share ---- */

/* fexp2: 2^x with the hardware's ex2.approx on the GPU (the scores are
 * already in log2 units; -inf gives 0), exp2f in the emulation. */
void cu_att_fexp2(CuFn *f) {
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
