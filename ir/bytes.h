/* A growable byte buffer for the binary formats smelt writes (the graph
 * section, the kernel table, manifests and indexes).  Numbers are written
 * little-endian whatever the host.  Allocation failure sets `oom` and turns
 * later writes into no-ops, so a writer checks once at the end.  The memory
 * in `p` belongs to the caller (free(b.p)). */
#ifndef SMELT_BYTES_H
#define SMELT_BYTES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct {
  unsigned char *p;
  size_t len, cap;
  bool oom;
} ByteBuf;

void bb_put(ByteBuf *b, const void *data, size_t n);
void bb_u8(ByteBuf *b, unsigned v);
void bb_u32(ByteBuf *b, uint32_t v);
void bb_u64(ByteBuf *b, uint64_t v);
void bb_i32(ByteBuf *b, int32_t v);
void bb_i64(ByteBuf *b, int64_t v);
void bb_f64(ByteBuf *b, double v);
/* Appends formatted text (no NUL). */
void bb_printf(ByteBuf *b, const char *fmt, ...) SMELT_PRINTF(2, 3);

#endif
