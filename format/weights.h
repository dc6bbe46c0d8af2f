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
 * contiguous copy at an aligned file offset is used where it lies in the
 * mapping; any other is assembled into a region of its own.  The content
 * check and the assembly can be deferred (fmt_weights_open_deferred, then
 * fmt_weights_verify before any byte is read): the runtime does them when
 * the first session starts, so opening a bundle stays in milliseconds.
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
/* Opening in two steps, so that opening a bundle costs no pass over the
 * weights.  fmt_weights_open_deferred finds and maps the files (size
 * checked; a missing file or one of another size is refused now) and
 * gives every tensor its address: a view of the mapping when the tensor
 * is one contiguous copy at a file offset that is a multiple of
 * view_align (64 for CPU code; a smaller power of two such as 8 where the
 * bytes are only uploaded), else a place in a reserved region.  Nothing
 * is read: the tensors' bytes may be read only after fmt_weights_verify
 * has returned NULL.  w and its arrays must outlive the set.
 * bundle_path: the bundle's path, whose directory is searched for the
 * files by name.  Owned by the caller (fmt_weights_close). */
smelt_status fmt_weights_open_deferred(const FmtWeights *w, const char *bundle_path, size_t view_align,
                                       FmtWeightsSet **out_set) SMELT_MUST_USE;
/* Checks the files' CRC-32C against the table (a file of the right size
 * but other content is looked for at its other places, then refused by
 * name) and assembles the tensors that are not views, on several threads
 * (format/parallel.h).  Done once; later calls return the first answer.
 * Safe to call from several threads. */
smelt_status fmt_weights_verify(FmtWeightsSet *s) SMELT_MUST_USE;
/* Both steps at once, views at 64-byte-aligned offsets only. */
smelt_status fmt_weights_open(const FmtWeights *w, const char *bundle_path, FmtWeightsSet **out_set) SMELT_MUST_USE;
/* Tensor i's bytes (read-only: they may be the mapped file; 64-byte
 * aligned, or view_align for views of fmt_weights_open_deferred) and their
 * count; the arrays have fmt_weights_set_count entries. */
void *const *fmt_weights_set_data(const FmtWeightsSet *s);
const size_t *fmt_weights_set_sizes(const FmtWeightsSet *s);
int fmt_weights_set_count(const FmtWeightsSet *s);
/* Bytes assembled (or to be assembled) into the region, not used in place. */
uint64_t fmt_weights_set_copied_bytes(const FmtWeightsSet *s);
void fmt_weights_close(FmtWeightsSet *s);

#endif
