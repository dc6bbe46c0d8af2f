/* The tuning table: which kernel variant each matmul / attention shape
 * gets on an arch, as measured by `smelt tune` on the GPU.
 *
 * A text file meant to be read, diffed and kept in the repository
 * (tuning/cuda.table) or handed to `smelt compile --tune-table FILE`.
 * One row per line; '#' starts a comment (after a row: the row's note,
 * kept through parse and format); fields are separated by blanks:
 *
 *   # op       dtype  arch    rows          shape                                         variant
 *   attention  f16    sm_90a  m=2048..2048  B=1 D=128 H=32 Hkv=32 T=2048 causal=1 mask=0  flash:...
 *
 *   matmul     f16    sm_90a  m=1..1        K=4096 N=11008 Z=1 ta=0 tb=1                  gemv:...   # 0.0312 ms, 83% of 4280 GB/s
 *   matmul     f16    sm_90a  m=1025..2048  K=4096 N=11008 Z=1 ta=0 tb=1                  mma:...    # 0.41 ms, 610 TFLOP/s
 *
 * op, dtype and arch match exactly; `m=LO..HI` is the interval of rows
 * (matmul M, attention query length S) the row covers, both ends
 * included; the shape fields (CgTuneKey.rest, "k=v" tokens) match exactly
 * as a set (stored and printed sorted by name); the last field is the
 * variant token (cg_cuda.h).  Prefill and decode shapes of one weight are
 * different rows by their intervals.  Lookup takes the row whose interval
 * holds M; where intervals of rows with the same key overlap, the
 * narrowest wins (the first of equally narrow ones).
 *
 * Parsing checks every field where it stands: the op must be an IR
 * operator, the dtype a dtype, the arch a CUDA arch, the interval non-empty
 * from 1 up, shape fields NAME=VALUE without a name twice, the variant
 * lexically a token ("family" or "family:params"; its family checks the
 * parameters when the row is used), and no two rows may have the same op,
 * dtype, arch, interval and shape.
 *
 * Errors in a table name file:line:col.  Nothing here prints or exits.
 */
#ifndef SMELT_CG_CUDA_TABLE_H
#define SMELT_CG_CUDA_TABLE_H

#include "codegen/cuda/cg_cuda.h"

typedef struct {
  char op[16];
  char dtype[8];
  char arch[16];
  int64_t m_lo, m_hi;
  char rest[128];                /* normalised: tokens sorted, single spaces */
  char variant[CG_VARIANT_LEN];
  char note[128];                /* the comment after the row (timings), without '#' */
} CgTuneRow;

struct CgTuneTable {
  CgTuneRow *rows;
  int n, cap;
};

/* An empty table (the caller's, free with cg_tune_table_free); NULL when
 * out of memory. */
CgTuneTable *cg_tune_table_new(void);
void cg_tune_table_free(CgTuneTable *t);
/* Parses a table's text; `path` names it in errors (file:line:col). */
smelt_status cg_tune_table_parse(const char *text, size_t len, const char *path, CgTuneTable **out) SMELT_MUST_USE;
smelt_status cg_tune_table_load(const char *path, CgTuneTable **out) SMELT_MUST_USE;
/* The text of t (malloc'd): a header comment, rows sorted by op, dtype,
 * arch, shape and interval, columns aligned.  NULL when out of memory. */
char *cg_tune_table_format(const CgTuneTable *t);
/* Writes the text atomically (temporary file + rename). */
smelt_status cg_tune_table_save(const CgTuneTable *t, const char *path) SMELT_MUST_USE;
/* Adds row r, replacing a row with the same op, dtype, arch, interval and
 * shape; false (t unchanged) when out of memory. */
bool cg_tune_table_put(CgTuneTable *t, const CgTuneRow *r);
/* The row for key on arch, or NULL. */
const CgTuneRow *cg_tune_lookup(const CgTuneTable *t, const char *arch, const CgTuneKey *key);
/* The interval a tuned M stands for: powers of two, [2^(j-1)+1, 2^j]
 * (1 -> 1..1, 2 -> 2..2, 3..4, 5..8, ..., 2048 -> 1025..2048). */
void cg_tune_bucket(int64_t m, int64_t *out_lo, int64_t *out_hi);

#endif
