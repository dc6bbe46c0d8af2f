/* ByteBuf: doubling growth, little-endian numbers, sticky out-of-memory. */
#include "bytes.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void bb_put(ByteBuf *b, const void *data, size_t n) {
  if (b->oom) return;
  if (n > b->cap - b->len) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n) {
      if (cap > SIZE_MAX / 2) {
        b->oom = true;
        return;
      }
      cap *= 2;
    }
    unsigned char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->len, data, n);
  b->len += n;
}

void bb_u8(ByteBuf *b, unsigned v) {
  unsigned char c = (unsigned char)v;
  bb_put(b, &c, 1);
}

void bb_u32(ByteBuf *b, uint32_t v) {
  unsigned char c[4];
  for (int i = 0; i < 4; i++) c[i] = (unsigned char)(v >> (8 * i));
  bb_put(b, c, 4);
}

void bb_u64(ByteBuf *b, uint64_t v) {
  unsigned char c[8];
  for (int i = 0; i < 8; i++) c[i] = (unsigned char)(v >> (8 * i));
  bb_put(b, c, 8);
}

void bb_i32(ByteBuf *b, int32_t v) { bb_u32(b, (uint32_t)v); }
void bb_i64(ByteBuf *b, int64_t v) { bb_u64(b, (uint64_t)v); }

void bb_f64(ByteBuf *b, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  bb_u64(b, u);
}

void bb_printf(ByteBuf *b, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *tmp = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (!tmp) {
    b->oom = b->oom || n >= 0;
    va_end(ap2);
    return;
  }
  vsnprintf(tmp, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  bb_put(b, tmp, (size_t)n);
  free(tmp);
}
