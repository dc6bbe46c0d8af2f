/* Arena: a list of blocks; small requests are carved from the newest block,
 * large ones get a block of their own.  Everything is 64-byte aligned so that
 * constant tensors stored here can be read with vector loads. */
#include "arena.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ARENA_ALIGN 64
#define ARENA_BLOCK (1u << 16)
/* From here on a request gets a calloc'd block of its own (fresh pages
 * the kernel zeroes when first touched: no memset pass over a 700 MB
 * weight before it is copied in), backed by huge pages where the kernel
 * offers them (fewer page faults). */
#define ARENA_BIG ((size_t)1 << 20)

struct ArenaBlock {
  ArenaBlock *next;
  void *raw; /* what to free: the block itself, or the calloc'd memory it sits in */
  size_t used, cap;
  _Alignas(64) unsigned char data[];
};

/* A block for one request of `need` bytes, zeroed, or NULL. */
static ArenaBlock *big_block(size_t need) {
  size_t bytes = sizeof(ArenaBlock) + need + ARENA_ALIGN;
  unsigned char *raw = calloc(1, bytes);
  if (!raw) return NULL;
  ArenaBlock *b = (ArenaBlock *)(raw + (ARENA_ALIGN - (uintptr_t)raw % ARENA_ALIGN) % ARENA_ALIGN);
  b->raw = raw;
  b->used = need;
  b->cap = need;
#ifdef MADV_HUGEPAGE
  long page = sysconf(_SC_PAGESIZE);
  if (page > 0) {
    uintptr_t lo = ((uintptr_t)b->data + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    uintptr_t hi = ((uintptr_t)raw + bytes) / (uintptr_t)page * (uintptr_t)page;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* advice: failure changes nothing */
  }
#endif
  return b;
}

void *arena_alloc(Arena *a, size_t size) {
  if (size > SIZE_MAX - 2 * ARENA_ALIGN - ARENA_BLOCK) return NULL;
  size_t need = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  if (need == 0) need = ARENA_ALIGN;
  if (need >= ARENA_BIG) {
    ArenaBlock *b = big_block(need);
    if (!b) return NULL;
    /* behind the head: the partly used block stays first for small requests */
    if (a->head) {
      b->next = a->head->next;
      a->head->next = b;
    } else {
      b->next = NULL;
      a->head = b;
    }
    return b->data;
  }
  ArenaBlock *b = a->head;
  if (!b || b->cap - b->used < need) {
    size_t cap = need > ARENA_BLOCK ? need : ARENA_BLOCK;
    b = aligned_alloc(ARENA_ALIGN, (sizeof(ArenaBlock) + cap + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1));
    if (!b) return NULL;
    b->raw = b;
    b->used = 0;
    b->cap = cap;
    if (a->head && need > ARENA_BLOCK) {
      /* keep the partly used block at the head for later small requests */
      b->next = a->head->next;
      a->head->next = b;
    } else {
      b->next = a->head;
      a->head = b;
    }
  }
  void *p = b->data + b->used;
  b->used += need;
  memset(p, 0, size);
  return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
  char *p = arena_alloc(a, n + 1);
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

char *arena_strdup(Arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(Arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = n >= 0 ? arena_alloc(a, (size_t)n + 1) : NULL;
  if (p) vsnprintf(p, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return p;
}

void arena_free_all(Arena *a) {
  ArenaBlock *b = a->head;
  while (b) {
    ArenaBlock *next = b->next;
    free(b->raw);
    b = next;
  }
  a->head = NULL;
}
