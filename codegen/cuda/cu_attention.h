/* Shared by the attention kernels.  Bottom-up: attention.c (the shape, the
 * variant tokens and their checks, the heuristic, helpers of the generated
 * code), flash.c (the prefill kernel), flashdec.c (the split-KV decode
 * kernel), attention_emit.c (cu_kernels.h's cu_attention_candidates and
 * cu_emit_attention: picks the variant, emits it or the simple kernel).  attention.c's opening comment
 * describes all three kernels. */
#ifndef SMELT_CU_ATTENTION_H
#define SMELT_CU_ATTENTION_H

#include "codegen/cuda/cu_tc.h"

#define CU_ATT_LOG2E 1.4426950408889634
/* flashdec: query rows per block (registers: 16 floats per row per lane) */
#define CU_ATT_DEC_MAX_ROWS 8

typedef struct {
  const Node *an;
  DType dt;
  int64_t B, H, Hkv, G, S, T, D, Dv;
  double scale;
  bool causal, mask;
  /* cache: true: k and v are caches of capacity T and query i sees keys
   * 0 .. pos[i], pos = the anchor's 4th input (i32 or i64), read at run time */
  bool cache;
  int pos;
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

/* The attention anchor's shape and attributes. */
void cu_att_shape(const CuFn *f, Att *a);
/* Whether value v is a kernel argument that no member computes (read from
 * memory as it is). */
bool cu_att_is_arg_value(const CuFn *f, int v);
int64_t cu_att_cdiv(int64_t a, int64_t b);
/* flash's shared memory for p, in bytes. */
int64_t cu_att_flash_smem(const Att *a, const FlashParams *p);
/* flashdec's query rows per kv head, the row chunks they are cut into and
 * the rows per block. */
void cu_att_dec_rows(const Att *a, int64_t *out_rows, int64_t *out_chunks, int *out_rb);
/* pos[i] of a cache attention (i a C expression of the index type), as a
 * long long expression (read with cu_emit: an argument is loaded). */
const char *cu_att_pos(CuFn *f, const Att *a, const char *i);
/* Declares the lambda fexp2 (2^x: ex2.approx on the GPU). */
void cu_att_fexp2(CuFn *f);

/* Whether the flash / flashdec kernels can compute a at all (*why says why
 * not), and flashdec's default parameters. */
bool cu_att_flash_eligible(const Att *a, const char **why);
bool cu_att_dec_eligible(const Att *a, const char **why);
void cu_att_dec_default(const Att *a, DecParams *p);

/* Variant tokens ("flash:...", "flashdec:...", "simple"): parse (false:
 * not an attention token), print, whether v can compute a (*why says why
 * not), and the heuristic's choice. */
bool cu_att_parse_variant(const char *tok, AttVariant *out);
void cu_att_format_variant(const AttVariant *v, char out[CG_VARIANT_LEN]);
bool cu_att_variant_valid(const CuFn *f, const Att *a, const AttVariant *v, const char **why);
void cu_att_heuristic(const CuFn *f, const Att *a, AttVariant *out);

/* The kernels for a valid p (attention.c checks it), storing the epilogue
 * values epi[0..nepi). */
void cu_att_emit_flash(CuFn *f, const Att *a, const FlashParams *p, const int *epi, int nepi, CuLaunch *l);
void cu_att_emit_flashdec(CuFn *f, const Att *a, const DecParams *p, const int *epi, int nepi, CuLaunch *l);

#endif
