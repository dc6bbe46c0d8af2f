/* External weights: constants a bundle does not carry but takes, at load,
 * from the safetensors files the model was compiled with
 * (`smelt compile --external-weights`).  Multi-GB models then compile into
 * bundles of a few MB, and the weights are memory-mapped, never read whole.
 *
 * The "weights" section lists the files and, per external tensor, a recipe:
 * strided copies out of the files into the tensor's bytes.  A weight read
 * as it is in the file is one copy; what merge-matmuls makes of several
 * (QKV side by side, gate/up columns interleaved) is one copy per source
 * with row strides.  Encoding (little-endian; str = u32 length + bytes):
 *
 *   header  u8[4] "SWGT", u32 version (1), u32 nfiles, u32 ntensors,
 *           u32 ncopies
 *   file    str name (as the model names it, "w4.safetensors"),
 *           str path (absolute, where the compiler read it), u64 size,
 *           u32 crc (CRC-32C of the whole file)
 *   tensor  u64 nbytes, u32 first copy, u32 copy count
 *   copy    u32 file, u64 src, dst, rows, cols, elem, src_row, src_col,
 *           dst_row, dst_col: for r < rows, c < cols, elem bytes from
 *           file offset src + r*src_row + c*src_col to tensor offset
 *           dst + r*dst_row + c*dst_col
 *
 * The graph section refers to external tensor i (ir/serialize.h).  At load
 * each file is found (its absolute path, else its name next to the bundle,
 * else its name as a path), mapped, and checked: size and CRC must be those
 * recorded, or the load fails naming the file.  A tensor that is one
 * contiguous copy at a 64-byte-aligned file offset is used where it lies in
 * the mapping; any other is assembled into a buffer of its own.
 *
 * Decoding trusts nothing: every copy must stay inside its file and its
 * tensor (overflow-checked), and the bytes a tensor's copies write add up
 * to at most its size, which bounds the work a hostile section can ask for.
 * Messages start with "weights section: " or name the file. */
#ifndef SMELT_FMT_WEIGHTS_H
#define SMELT_FMT_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "ir/status.h"

#define FMT_WEIGHTS_VERSION 1

typedef struct {
  char *name;    /* as the model names it */
  char *path;    /* absolute, at compile time */
  uint64_t size;
  uint32_t crc;  /* CRC-32C of the whole file */
} FmtWeightsFile;

typedef struct {
  uint32_t file;
  uint64_t src, dst, rows, cols, elem, src_row, src_col, dst_row, dst_col;
} FmtWeightsCopy;

typedef struct {
  uint64_t nbytes;
  uint32_t first, ncopies; /* copies[first .. first + ncopies) */
} FmtWeightsTensor;

/* A decoded or to-be-encoded weights table; every array malloc'd. */
typedef struct {
  FmtWeightsFile *files;
  int nfiles;
  FmtWeightsTensor *tensors;
  int ntensors;
  FmtWeightsCopy *copies;
  int ncopies;
} FmtWeights;

/* The size and CRC-32C of the whole file at path, read through a mapping. */
smelt_status fmt_weights_hash_file(const char *path, uint64_t *out_size, uint32_t *out_crc) SMELT_MUST_USE;

smelt_status fmt_weights_encode(const FmtWeights *w, void **out_buf, size_t *out_len) SMELT_MUST_USE;
/* A new table (fmt_weights_free) from untrusted bytes. */
smelt_status fmt_weights_decode(const void *data, size_t len, FmtWeights **out) SMELT_MUST_USE;
void fmt_weights_free(FmtWeights *w);

/* The files of a table, mapped and checked, and its tensors assembled. */
typedef struct FmtWeightsSet FmtWeightsSet;
/* bundle_path: the bundle's path, whose directory is searched for the
 * files by name.  Owned by the caller (fmt_weights_close). */
smelt_status fmt_weights_open(const FmtWeights *w, const char *bundle_path, FmtWeightsSet **out_set) SMELT_MUST_USE;
/* Tensor i's bytes (64-byte aligned, read-only: they may be the mapped
 * file) and their count; the arrays have fmt_weights_set_count entries. */
void *const *fmt_weights_set_data(const FmtWeightsSet *s);
const size_t *fmt_weights_set_sizes(const FmtWeightsSet *s);
int fmt_weights_set_count(const FmtWeightsSet *s);
/* Bytes assembled into buffers of their own (not used in place). */
uint64_t fmt_weights_set_copied_bytes(const FmtWeightsSet *s);
void fmt_weights_close(FmtWeightsSet *s);

#endif
