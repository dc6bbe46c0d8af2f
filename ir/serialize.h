/* Binary serialisation of a Graph: how the optimised graph (with its memory
 * plan, fusion groups and constants) travels inside a `.smelt` bundle.
 *
 * The encoding is compact and little-endian; ir/serialize.c describes it
 * field by field.  Operators and dtypes are written by name, not by enum
 * number, so reordering ops.def or DTYPE_LIST does not break old bundles.
 *
 * The deserialiser treats its input as untrusted (a bundle may be truncated,
 * corrupted or hostile): every read is bounds-checked, every count and size is
 * checked for overflow, every id for range, and the result is run through
 * ir_verify().  Any failure is an ST_INVALID_INPUT status whose message starts
 * with "graph section: " (callers prefix the file name); it never crashes and
 * never leaks. */
#ifndef SMELT_SERIALIZE_H
#define SMELT_SERIALIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir.h"

/* The version of the encoding written by ir_graph_serialize; the reader
 * accepts exactly this version.  2: constants are references into a
 * constants blob or to external tensors, no longer bytes inline. */
#define IR_SERIAL_VERSION 4

/* Where a constant's bytes are: at an offset of the constants blob (the
 * bundle's constants section, format/constants.h), or external tensor
 * number `index` (format/weights.h). */
typedef enum { IR_CONST_BLOB = 1, IR_CONST_EXTERN = 2 } IrConstWhere;
typedef struct {
  IrConstWhere where;
  uint64_t index; /* blob offset (a multiple of 64), or external tensor number */
} IrConstRef;

/* What the encoder does with constant bytes: put stores value v's bytes
 * (ir_type_bytes of its type, at g->val[v].data) and says where they went.
 * Only constants that something uses are put (a live node's operand, a
 * graph output, or keep[v]); any other constant is written as a dead value
 * without data. */
typedef struct {
  smelt_status (*put)(void *ctx, const Graph *g, int v, IrConstRef *out_ref);
  void *ctx;
  const bool *keep; /* per value, or NULL: also keep these (kernel arguments) */
} IrConstSink;

/* Encodes g into a malloc'd buffer owned by the caller (free()).  Fails with
 * ST_INTERNAL when g breaks an invariant the encoding relies on (a rank above
 * IR_MAX_RANK, an invalid op), ST_NO_MEMORY when the buffer cannot be had,
 * or with the sink's status. */
smelt_status ir_graph_serialize(const Graph *g, const IrConstSink *sink, void **out_buf,
                                size_t *out_len) SMELT_MUST_USE;

/* Where a decoded graph's constants point: blob_len bytes at blob (64-byte
 * aligned; NULL, 0 when there is none), and next external tensors. */
typedef struct {
  const void *blob;
  size_t blob_len;
  void *const *ext;
  const size_t *ext_len;
  int next;
} IrConstSpace;

/* Decodes len bytes at buf into a new graph owned by the caller
 * (ir_graph_destroy()).  On failure *out_graph is NULL.  Every constant
 * reference is checked against cs (range, size, alignment) and the
 * constant's data points into cs's memory, which is not copied: it must
 * outlive the graph and is read-only (it may be a read-only mapping). */
smelt_status ir_graph_deserialize(const void *buf, size_t len, const IrConstSpace *cs,
                                  Graph **out_graph) SMELT_MUST_USE;

#endif
