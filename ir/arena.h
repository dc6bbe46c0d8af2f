/* A bump allocator: many small allocations, one free.  The graph keeps its
 * names, attributes and constant data here so that destroying a graph is one
 * call and nobody has to track who owns a string. */
#ifndef SMELT_ARENA_H
#define SMELT_ARENA_H

#include <stddef.h>

typedef struct ArenaBlock ArenaBlock;
typedef struct {
  ArenaBlock *head;
} Arena;

/* Returns zeroed memory aligned to 64 bytes, or NULL when out of memory. */
void *arena_alloc(Arena *a, size_t size);
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
char *arena_printf(Arena *a, const char *fmt, ...);
void arena_free_all(Arena *a);

#endif
