/* The constants pool (format/constants.h).
 *
 * Entries are kept in insertion order (that is the blob's layout) and
 * indexed by an open-addressing hash table on (CRC-32C, size); the CRC runs
 * at memory speed with the hardware instruction, so deduplicating a 700 MB
 * model costs a few tens of ms, and memcmp confirms every hit.  The blob is
 * never materialised here: the section is written from the entries as
 * pieces (the data, then zeros up to the next multiple of 64), each with
 * the CRC taken here, so the writer's section checksum combines them
 * instead of reading the weights a second time. */
#include "format/constants.h"
#include "format/parallel.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  const void *data;
  size_t n;
  uint64_t offset;
  uint32_t crc;
} Entry;

struct FmtConstPool {
  Entry *e;
  int n, cap;
  int *slot;     /* hash table of entry indices, -1 = empty; nslot a power of two */
  size_t nslot;
  uint64_t end;  /* the blob's size */
};

smelt_status fmt_const_pool_create(FmtConstPool **out_pool) {
  *out_pool = calloc(1, sizeof **out_pool);
  return *out_pool ? NULL : st_error(ST_NO_MEMORY, "out of memory");
}

void fmt_const_pool_destroy(FmtConstPool *p) {
  if (!p) return;
  free(p->e);
  free(p->slot);
  free(p);
}

uint64_t fmt_const_pool_bytes(const FmtConstPool *p) { return p->end; }
int fmt_const_pool_count(const FmtConstPool *p) { return p->n; }

static size_t hash_of(uint32_t crc, size_t n) {
  uint64_t h = ((uint64_t)crc << 32 | (uint32_t)n) * 0x9e3779b97f4a7c15u;
  return (size_t)(h >> 17);
}

/* Doubles the table and re-inserts every entry. */
static bool grow_table(FmtConstPool *p) {
  size_t nslot = p->nslot ? 2 * p->nslot : 64;
  int *slot = malloc(sizeof *slot * nslot);
  if (!slot) return false;
  for (size_t i = 0; i < nslot; i++) slot[i] = -1;
  for (int i = 0; i < p->n; i++) {
    size_t h = hash_of(p->e[i].crc, p->e[i].n) & (nslot - 1);
    while (slot[h] >= 0) h = (h + 1) & (nslot - 1);
    slot[h] = i;
  }
  free(p->slot);
  p->slot = slot;
  p->nslot = nslot;
  return true;
}

smelt_status fmt_const_pool_add(FmtConstPool *p, const void *data, size_t n, uint64_t *out_offset) {
  *out_offset = 0;
  uint32_t crc = fmt_crc32c_parallel(data, n);
  if ((size_t)(p->n + 1) * 2 > p->nslot && !grow_table(p)) return st_error(ST_NO_MEMORY, "out of memory");
  size_t h = hash_of(crc, n) & (p->nslot - 1);
  for (; p->slot[h] >= 0; h = (h + 1) & (p->nslot - 1)) {
    const Entry *e = &p->e[p->slot[h]];
    if (e->crc == crc && e->n == n && (n == 0 || memcmp(e->data, data, n) == 0)) {
      *out_offset = e->offset;
      return NULL;
    }
  }
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 64;
    Entry *e = realloc(p->e, sizeof *e * (size_t)cap);
    if (!e) return st_error(ST_NO_MEMORY, "out of memory");
    p->e = e;
    p->cap = cap;
  }
  uint64_t off = (p->end + FMT_BUNDLE_ALIGN - 1) / FMT_BUNDLE_ALIGN * FMT_BUNDLE_ALIGN;
  p->e[p->n] = (Entry){data, n, off, crc};
  p->slot[h] = p->n++;
  p->end = off + n;
  *out_offset = off;
  return NULL;
}

smelt_status fmt_const_pool_add_section(const FmtConstPool *p, FmtWriter *w, const char *name) {
  if (p->n == 0) return NULL;
  FmtPiece *pieces = malloc(sizeof *pieces * (size_t)p->n * 2);
  if (!pieces) return st_error(ST_NO_MEMORY, "out of memory");
  int np = 0;
  uint64_t pos = 0;
  for (int i = 0; i < p->n; i++) {
    if (p->e[i].offset > pos) pieces[np++] = (FmtPiece){.len = (size_t)(p->e[i].offset - pos)};
    pieces[np++] = (FmtPiece){p->e[i].data, p->e[i].n, true, p->e[i].crc}; /* hashed once, here */
    pos = p->e[i].offset + p->e[i].n;
  }
  smelt_status st = fmt_writer_add_pieces(w, FMT_SEC_CONSTANTS, name, pieces, np);
  free(pieces);
  return st;
}
