/* The constants section of a bundle: one blob holding the bytes of every
 * constant of every specialisation, each at a multiple of 64 bytes (the
 * alignment kernels are compiled for), each distinct content once.
 *
 * The graph section (ir/serialize.h) refers to a constant by (offset,
 * nbytes) in this blob; the runtime points the constant at the mapped
 * bundle, so constants are neither copied nor duplicated across
 * specialisations (a model compiled with --dim seq=1,16 carries one copy of
 * its weights).  Padding between constants is zero.
 *
 * The pool collects the blob while graphs are serialised: identical bytes
 * (CRC-32C and size to find candidates, memcmp to be sure) get the offset
 * they got the first time.  It keeps pointers, not copies: the data given
 * to fmt_const_pool_add must stay valid and unchanged until the writer that
 * fmt_const_pool_add_section fed is destroyed. */
#ifndef SMELT_FMT_CONSTANTS_H
#define SMELT_FMT_CONSTANTS_H

#include <stddef.h>
#include <stdint.h>

#include "format/bundle.h"

typedef struct FmtConstPool FmtConstPool;

/* Owned by the caller (fmt_const_pool_destroy). */
smelt_status fmt_const_pool_create(FmtConstPool **out_pool) SMELT_MUST_USE;
/* Places n bytes at data in the blob (or finds them there) and returns
 * their offset, a multiple of 64. */
smelt_status fmt_const_pool_add(FmtConstPool *p, const void *data, size_t n, uint64_t *out_offset) SMELT_MUST_USE;
/* The blob's size so far, and how many distinct constants it holds. */
uint64_t fmt_const_pool_bytes(const FmtConstPool *p);
int fmt_const_pool_count(const FmtConstPool *p);
/* Adds the blob to w as a constants section named name (pieces: the bytes
 * stay the callers' of fmt_const_pool_add).  Nothing when the pool is empty. */
smelt_status fmt_const_pool_add_section(const FmtConstPool *p, FmtWriter *w, const char *name) SMELT_MUST_USE;
void fmt_const_pool_destroy(FmtConstPool *p);

#endif
