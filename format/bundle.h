/* The `.smelt` kernel bundle: one file holding everything a compiled model
 * needs at run time (SPEC §5), as a list of named, typed sections.
 *
 *   header    u8 magic[8] "SMELT\0BN", u32 format_version (1),
 *             u32 section_count, u64 file_size, u64 checksum     (32 bytes)
 *   table     section_count entries of
 *             u32 kind, u32 flags (none defined: 0), char name[56]
 *             (NUL-terminated, zero-filled), u64 offset, u64 size,
 *             u64 checksum                                       (88 bytes each)
 *   payloads  each starting at a multiple of 64 bytes, zero padding between,
 *             in table order; the file ends where the last payload ends.
 *
 * All integers are little-endian.  Checksums are CRC-32C (Castagnoli, the
 * iSCSI/ext4 polynomial; hardware-accelerated on x86-64 with SSE4.2), stored
 * zero-extended in the u64 fields: a section's over its payload bytes, the
 * file's over every byte of the file but its own field, i.e. the header's
 * first 24 bytes and then everything after the header (table, padding,
 * payloads).  The header is included so that a changed section count, which
 * could otherwise hide trailing sections as padding, is caught.
 *
 * Loading treats the file as untrusted and checks everything before any
 * section is handed out: size, magic, version, the table's bounds, each
 * entry's kind, flags, name, alignment and extent, overlaps, duplicates,
 * every section's checksum and the file's.  Errors are ST_INVALID_INPUT (ST_IO
 * when the file cannot be read) with messages such as
 *   "model.smelt: error: truncated: header says 40960 bytes, file has 4096".
 *
 * Ownership: objects returned through out_ parameters of *_create and
 * *_open* are owned by the caller and released with the matching
 * *_destroy / fmt_file_close.  Section data returned by a bundle lives as
 * long as the bundle.  Nothing here prints, exits or keeps global state. */
#ifndef SMELT_FMT_BUNDLE_H
#define SMELT_FMT_BUNDLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir/status.h"

#define FMT_BUNDLE_MAGIC "SMELT\0BN" /* 8 bytes, the NUL included */
#define FMT_BUNDLE_VERSION 1
#define FMT_BUNDLE_ALIGN 64         /* payload alignment, in the file and in memory */
#define FMT_BUNDLE_HEADER_BYTES 32
#define FMT_BUNDLE_ENTRY_BYTES 88
#define FMT_SECTION_NAME_BYTES 56   /* the name field, its NUL included */
#define FMT_BUNDLE_MAX_SECTIONS 65536

/* Section kinds; the numbers are part of the file format. */
#define FMT_SECTION_KINDS(X)                                                          \
  X(MANIFEST, 1, "manifest")             /* text, key=value lines: versions, options */ \
  X(IR_TEXT, 2, "ir-text")               /* the final IR as ir_print writes it */      \
  X(GRAPH, 3, "graph")                   /* ir_graph_serialize: plan, groups, consts */ \
  X(CONSTANTS, 4, "constants")           /* every constant's bytes, 64-byte aligned     */ \
  X(KERNELS, 5, "kernels")               /* the kernel table */                        \
  X(CPU_OBJECT, 6, "cpu-object")         /* machine code; name = target triple/cpu */  \
  X(CUDA_SOURCE, 7, "cuda-source")       /* one CUDA C unit; name = "u0", "u1", ... */ \
  X(CUBIN, 8, "cubin")                   /* name = "ARCH/UNIT", "sm_90a/u0" */        \
  X(PTX, 9, "ptx")                       /* name = "ARCH/UNIT", NUL-terminated text */ \
  X(TUNING, 10, "tuning")                                                              \
  X(SPECIALISATION, 11, "specialisation")                                              \
  X(CUDA_LAUNCH, 12, "cuda-launch")      /* fmt_cuda_launch_encode's launch table */   \
  X(WEIGHTS, 13, "weights")              /* format/weights.h: external weights files */ \
  X(QUANT_REPORT, 14, "quant-report")    /* text: --quantize's per-layer accuracy */

typedef enum {
#define X(id, num, name) FMT_SEC_##id = num,
  FMT_SECTION_KINDS(X)
#undef X
} FmtSectionKind;

/* "graph" for FMT_SEC_GRAPH; NULL for a number that is no section kind. */
const char *fmt_section_kind_name(uint32_t kind);

/* CRC-32C of n bytes, continuing from crc (0 to start), zlib-style:
 * fmt_crc32c(fmt_crc32c(0, a, n), b, m) is the CRC of a followed by b.
 * fmt_crc32c(0, "123456789", 9) == 0xe3069283. */
uint32_t fmt_crc32c(uint32_t crc, const void *data, size_t n);
/* The same without the hardware path, so tests can compare the two. */
uint32_t fmt_crc32c_portable(uint32_t crc, const void *data, size_t n);
/* The CRC of A followed by B from crc1 = fmt_crc32c(0, A, |A|) and
 * crc2 = fmt_crc32c(0, B, len2), without reading either (zlib's
 * crc32_combine; O(log len2)). */
uint32_t fmt_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/* ---- writing ---- */

typedef struct FmtWriter FmtWriter;

smelt_status fmt_writer_create(FmtWriter **out_writer) SMELT_MUST_USE;
/* Appends a section; data (len bytes) is copied.  name may be NULL (stored
 * as ""); it must be shorter than FMT_SECTION_NAME_BYTES, and no two sections
 * may share kind and name. */
smelt_status fmt_writer_add(FmtWriter *w, FmtSectionKind kind, const char *name, const void *data,
                                  size_t len) SMELT_MUST_USE;
/* The same for a malloc'd buffer the writer takes over instead of copying
 * (a model's serialized graph holds its weights: hundreds of MB): *data
 * becomes NULL when the section was added, and stays the caller's when it
 * was not. */
smelt_status fmt_writer_take(FmtWriter *w, FmtSectionKind kind, const char *name, void **data,
                                   size_t len) SMELT_MUST_USE;
/* A part of a section's payload that stays the caller's: len bytes at data,
 * or len zero bytes when data is NULL. */
typedef struct {
  const void *data;
  size_t len;
  bool has_crc;  /* crc is fmt_crc32c(0, data, len), known to the caller: */
  uint32_t crc;  /* the writer then does not read the bytes to checksum them */
} FmtPiece;
/* Appends a section made of the pieces in order, without copying their
 * bytes (the array itself is copied): they must stay valid and unchanged
 * until the writer is destroyed.  For the constants section, whose bytes
 * are the graphs' (hundreds of MB). */
smelt_status fmt_writer_add_pieces(FmtWriter *w, FmtSectionKind kind, const char *name, const FmtPiece *pieces,
                                   int npieces) SMELT_MUST_USE;
/* Writes the bundle to path atomically: a temporary file in the same
 * directory, fsync, rename over path, fsync of the directory.  On failure
 * path is untouched and no temporary file is left.  The file gets mode 0644. */
/* Whether fmt_writer_write fsyncs the file and its directory before it
 * returns (default false: the rename is atomic, not durable). */
void fmt_writer_set_durable(FmtWriter *w, bool durable);
/* How fmt_writer_write puts the bytes in the file: FMT_WRITE_AUTO (a
 * shared mapping filled on several threads for a bundle of 64 MB or more on
 * a machine of 4 cores or more, else write()), FMT_WRITE_MAPPED or
 * FMT_WRITE_PLAIN (for tests: the same bytes either way). */
typedef enum { FMT_WRITE_AUTO, FMT_WRITE_MAPPED, FMT_WRITE_PLAIN } FmtWriteWay;
void fmt_writer_set_way(FmtWriter *w, FmtWriteWay way);
smelt_status fmt_writer_write(const FmtWriter *w, const char *path) SMELT_MUST_USE;
/* The same bytes in a malloc'd buffer owned by the caller (free()). */
smelt_status fmt_writer_to_memory(const FmtWriter *w, void **out_buf, size_t *out_len) SMELT_MUST_USE;
void fmt_writer_destroy(FmtWriter *w);

/* ---- reading ---- */

typedef struct FmtFile FmtFile;

typedef struct {
  FmtSectionKind kind;
  uint32_t flags;
  const char *name;  /* NUL-terminated, inside the bundle */
  const void *data;  /* 64-byte aligned */
  size_t size;
} FmtSection;

/* Maps the file at path read-only (page-aligned, so payloads are 64-byte
 * aligned) and validates it, every checksum included.  The file must not
 * be modified in place while it is open (fmt_writer_write replaces files
 * by rename, which is safe).  Messages start with "PATH: error: ". */
smelt_status fmt_file_open(const char *path, FmtFile **out_bundle) SMELT_MUST_USE;
/* The same, except that the checksums of the sections of kind defer_kind
 * (0: none) are not verified now but by fmt_file_check_deferred; their
 * stored checksums still enter the file checksum, so the header and table
 * are verified.  For the constants section: checksumming a 700 MB model's
 * weights costs ~50 ms, more than everything else in opening it, and
 * nothing reads them before a session starts. */
smelt_status fmt_file_open_deferred(const char *path, FmtSectionKind defer_kind, FmtFile **out_bundle) SMELT_MUST_USE;
/* Verifies the deferred sections' checksums, once (later calls return the
 * first answer); safe to call from several threads.  NULL when there are
 * none, or they are intact. */
smelt_status fmt_file_check_deferred(FmtFile *b) SMELT_MUST_USE;
/* The same for len bytes in memory (copied; data may be freed after).
 * name is used in messages in place of a path (NULL: "<memory>"). */
smelt_status fmt_file_open_memory(const void *data, size_t len, const char *name,
                                   FmtFile **out_bundle) SMELT_MUST_USE;
/* Finds the section of that kind and name (NULL name: the first of the
 * kind).  Returns false, leaving the outputs NULL/0, when there is none. */
bool fmt_file_find(const FmtFile *b, FmtSectionKind kind, const char *name, const void **out_data, size_t *out_len);
int fmt_file_section_count(const FmtFile *b);
/* The i-th section in table order, 0 <= i < fmt_file_section_count(b). */
const FmtSection *fmt_file_section_at(const FmtFile *b, int i);
/* The path or name the bundle was opened with, for messages. */
const char *fmt_file_path(const FmtFile *b);
void fmt_file_close(FmtFile *b);

#endif
