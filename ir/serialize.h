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

#include <stddef.h>

#include "ir.h"

/* The version of the encoding written by ir_graph_serialize; the reader
 * accepts exactly this version. */
#define IR_SERIAL_VERSION 1

/* Encodes g into a malloc'd buffer owned by the caller (free()).  Fails with
 * ST_INTERNAL when g breaks an invariant the encoding relies on (a rank above
 * IR_MAX_RANK, an invalid op), ST_NO_MEMORY when the buffer cannot be had. */
smelt_status ir_graph_serialize(const Graph *g, void **out_buf, size_t *out_len) SMELT_MUST_USE;

/* Decodes len bytes at buf into a new graph owned by the caller
 * (ir_graph_destroy()).  On failure *out_graph is NULL.  Constant data is
 * copied into the graph's arena, 64-byte aligned; buf may be freed after. */
smelt_status ir_graph_deserialize(const void *buf, size_t len, Graph **out_graph) SMELT_MUST_USE;

#endif
