/* External weights (format/weights.h): the weights section's encoding, its
 * untrusting decoder, and opening the files at load.
 *
 * Opening maps each file read-only and checks its size; tensors are
 * either views of the mapping (one contiguous copy at an aligned offset)
 * or places in one anonymous region, reserved but not touched.  Verifying
 * (deferred by the runtime to the first session) hashes each file with
 * the hardware CRC-32C in 4 MB pieces on several threads, joined with
 * fmt_crc32c_combine, compares size and CRC with what the compiler
 * recorded (a file edited after the compile is refused by name rather than
 * feeding wrong numbers to the model), and then assembles the other
 * tensors from their copies, again in pieces on several threads.  For W4
 * (705 MB, every weight a merged or unaligned one) opening was ~600-700 ms
 * of single-threaded CRC and copying; it is now a few ms, the rest paid
 * once when a session starts, in parallel.  The mappings stay until
 * fmt_weights_close. */
#define _DEFAULT_SOURCE /* MAP_POPULATE, realpath */
#include "format/weights.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/bundle.h"
#include "format/parallel.h"
#include "ir/bytes.h"

static const unsigned char MAGIC[4] = {'S', 'W', 'G', 'T'};
#define FILE_MIN_BYTES 20   /* name 4, path 4, size 8, crc 4 */
#define TENSOR_BYTES 16     /* nbytes 8, first 4, count 4 */
#define COPY_BYTES 76       /* file 4, nine u64 */

/* ---- mapping a file ---- */

typedef struct {
  unsigned char *p;
  size_t len;
} Map;

static void unmap(Map *m) {
  if (m->p && m->len) munmap(m->p, m->len);
  m->p = NULL;
  m->len = 0;
}

/* Maps path read-only; ENOENT and friends come back as *out_errno with no
 * status, so callers can try the next place. */
static smelt_status map_file(const char *path, Map *out, int *out_errno, bool populate) {
  memset(out, 0, sizeof *out);
  *out_errno = 0;
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    *out_errno = errno;
    return NULL;
  }
  struct stat sb;
  if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return st_error(ST_IO, "%s: error: not a regular file", path);
  }
  if ((uintmax_t)sb.st_size > SIZE_MAX) {
    close(fd);
    return st_error(ST_IO, "%s: error: file too large", path);
  }
  out->len = (size_t)sb.st_size;
  if (out->len) {
    void *p = mmap(NULL, out->len, PROT_READ, MAP_PRIVATE | (populate ? MAP_POPULATE : 0), fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      close(fd);
      out->len = 0;
      return st_error(ST_IO, "%s: error: cannot map: %s", path, strerror(err));
    }
    out->p = p;
  }
  close(fd);
  return NULL;
}

smelt_status fmt_weights_hash_file(const char *path, uint64_t *out_size, uint32_t *out_crc) {
  *out_size = 0;
  *out_crc = 0;
  Map m;
  int err;
  RETURN_IF_ERROR(map_file(path, &m, &err, false));
  if (err) return st_error(ST_IO, "%s: error: cannot open: %s", path, strerror(err));
  *out_size = m.len;
  *out_crc = fmt_crc32c_parallel(m.p, m.len);
  unmap(&m);
  return NULL;
}

/* ---- encoding ---- */

static void put_str(ByteBuf *b, const char *s) {
  size_t n = s ? strlen(s) : 0;
  bb_u32(b, (uint32_t)n);
  bb_put(b, s, n);
}

smelt_status fmt_weights_encode(const FmtWeights *w, void **out_buf, size_t *out_len) {
  *out_buf = NULL;
  *out_len = 0;
  ByteBuf b = {0};
  bb_put(&b, MAGIC, 4);
  bb_u32(&b, FMT_WEIGHTS_VERSION);
  bb_u32(&b, (uint32_t)w->nfiles);
  bb_u32(&b, (uint32_t)w->ntensors);
  bb_u32(&b, (uint32_t)w->ncopies);
  for (int i = 0; i < w->nfiles; i++) {
    put_str(&b, w->files[i].name);
    put_str(&b, w->files[i].path);
    bb_u64(&b, w->files[i].size);
    bb_u32(&b, w->files[i].crc);
  }
  for (int i = 0; i < w->ntensors; i++) {
    bb_u64(&b, w->tensors[i].nbytes);
    bb_u32(&b, w->tensors[i].first);
    bb_u32(&b, w->tensors[i].ncopies);
  }
  for (int i = 0; i < w->ncopies; i++) {
    const FmtWeightsCopy *c = &w->copies[i];
    bb_u32(&b, c->file);
    const uint64_t f[9] = {c->src, c->dst, c->rows, c->cols, c->elem, c->src_row, c->src_col, c->dst_row, c->dst_col};
    for (int k = 0; k < 9; k++) bb_u64(&b, f[k]);
  }
  if (b.oom) {
    free(b.p);
    return st_error(ST_NO_MEMORY, "out of memory writing the weights section");
  }
  *out_buf = b.p;
  *out_len = b.len;
  return NULL;
}

/* ---- decoding ---- */

typedef struct {
  const unsigned char *p;
  size_t len, pos;
  bool bad;
} Rd;

static const unsigned char *rd_take(Rd *r, size_t n) {
  if (r->bad || n > r->len - r->pos) {
    r->bad = true;
    return NULL;
  }
  const unsigned char *p = r->p + r->pos;
  r->pos += n;
  return p;
}

static uint64_t rd_le(Rd *r, int bytes) {
  const unsigned char *p = rd_take(r, (size_t)bytes);
  uint64_t v = 0;
  for (int i = 0; p && i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static char *rd_str(Rd *r) {
  uint32_t n = (uint32_t)rd_le(r, 4);
  const unsigned char *s = rd_take(r, n);
  if (!s) return NULL;
  if (memchr(s, 0, n)) {
    r->bad = true;
    return NULL;
  }
  char *d = malloc((size_t)n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

void fmt_weights_free(FmtWeights *w) {
  if (!w) return;
  for (int i = 0; i < w->nfiles; i++) {
    free(w->files[i].name);
    free(w->files[i].path);
  }
  free(w->files);
  free(w->tensors);
  free(w->copies);
  free(w);
}

static smelt_status bad(const char *fmt, ...) SMELT_PRINTF(1, 2);
static smelt_status bad(const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return st_error(ST_INVALID_INPUT, "weights section: %s", msg);
}

/* The last byte a strided copy touches, plus one: base + (rows-1)*row +
 * (cols-1)*col + elem, false when it overflows. */
static bool extent(uint64_t base, uint64_t rows, uint64_t cols, uint64_t elem, uint64_t row, uint64_t col,
                   uint64_t *out_end) {
  uint64_t a, b, e;
  if (__builtin_mul_overflow(rows - 1, row, &a) || __builtin_mul_overflow(cols - 1, col, &b)) return false;
  if (__builtin_add_overflow(base, a, &e) || __builtin_add_overflow(e, b, &e) || __builtin_add_overflow(e, elem, &e))
    return false;
  *out_end = e;
  return true;
}

static smelt_status check_copy(const FmtWeights *w, const FmtWeightsCopy *c, const FmtWeightsTensor *t, int ti,
                               int ci, uint64_t *written) {
  if (c->file >= (uint32_t)w->nfiles) return bad("tensor %d, copy %d: file %u of %d", ti, ci, c->file, w->nfiles);
  if (c->rows == 0 || c->cols == 0 || c->elem == 0) return NULL; /* copies nothing */
  uint64_t bytes, src_end, dst_end;
  if (__builtin_mul_overflow(c->rows, c->cols, &bytes) || __builtin_mul_overflow(bytes, c->elem, &bytes) ||
      __builtin_add_overflow(*written, bytes, written) || *written > t->nbytes)
    return bad("tensor %d: its copies write more than its %llu bytes", ti, (unsigned long long)t->nbytes);
  if (!extent(c->src, c->rows, c->cols, c->elem, c->src_row, c->src_col, &src_end) ||
      src_end > w->files[c->file].size)
    return bad("tensor %d, copy %d: reads past the end of '%s' (%llu bytes)", ti, ci, w->files[c->file].name,
               (unsigned long long)w->files[c->file].size);
  if (!extent(c->dst, c->rows, c->cols, c->elem, c->dst_row, c->dst_col, &dst_end) || dst_end > t->nbytes)
    return bad("tensor %d, copy %d: writes past the tensor's %llu bytes", ti, ci, (unsigned long long)t->nbytes);
  return NULL;
}

smelt_status fmt_weights_decode(const void *data, size_t len, FmtWeights **out) {
  *out = NULL;
  Rd r = {.p = data, .len = len};
  const unsigned char *m = rd_take(&r, 4);
  if (!m || memcmp(m, MAGIC, 4) != 0) return bad("bad magic");
  uint32_t version = (uint32_t)rd_le(&r, 4);
  if (!r.bad && version != FMT_WEIGHTS_VERSION)
    return bad("unsupported version %u (this smelt reads version %d)", version, FMT_WEIGHTS_VERSION);
  uint64_t nf = rd_le(&r, 4), nt = rd_le(&r, 4), nc = rd_le(&r, 4);
  if (r.bad) return bad("truncated header");
  if (nf * FILE_MIN_BYTES + nt * TENSOR_BYTES + nc * COPY_BYTES > len - r.pos)
    return bad("%llu files, %llu tensors and %llu copies do not fit in %zu bytes", (unsigned long long)nf,
               (unsigned long long)nt, (unsigned long long)nc, len);
  FmtWeights *w = calloc(1, sizeof *w);
  if (!w) return st_error(ST_NO_MEMORY, "out of memory");
  w->files = calloc(nf ? nf : 1, sizeof *w->files);
  w->tensors = calloc(nt ? nt : 1, sizeof *w->tensors);
  w->copies = calloc(nc ? nc : 1, sizeof *w->copies);
  smelt_status st = NULL;
  if (!w->files || !w->tensors || !w->copies) st = st_error(ST_NO_MEMORY, "out of memory");
  for (uint64_t i = 0; i < nf && !st; i++) {
    FmtWeightsFile *f = &w->files[i];
    w->nfiles++;
    f->name = rd_str(&r);
    f->path = rd_str(&r);
    f->size = rd_le(&r, 8);
    f->crc = (uint32_t)rd_le(&r, 4);
    if (r.bad) st = bad("file %llu: truncated or has a NUL in its name", (unsigned long long)i);
    else if (!f->name || !f->path) st = st_error(ST_NO_MEMORY, "out of memory");
    else if (!f->name[0]) st = bad("file %llu has no name", (unsigned long long)i);
  }
  for (uint64_t i = 0; i < nt && !st; i++) {
    FmtWeightsTensor *t = &w->tensors[i];
    t->nbytes = rd_le(&r, 8);
    t->first = (uint32_t)rd_le(&r, 4);
    t->ncopies = (uint32_t)rd_le(&r, 4);
    w->ntensors++;
    if (r.bad) st = bad("tensor %llu: truncated", (unsigned long long)i);
    else if (t->first > nc || t->ncopies > nc - t->first)
      st = bad("tensor %llu: copies %u..%llu of %llu", (unsigned long long)i, t->first,
               (unsigned long long)t->first + t->ncopies, (unsigned long long)nc);
    else if (t->nbytes > SIZE_MAX / 2)
      st = bad("tensor %llu: %llu bytes", (unsigned long long)i, (unsigned long long)t->nbytes);
  }
  for (uint64_t i = 0; i < nc && !st; i++) {
    FmtWeightsCopy *c = &w->copies[i];
    c->file = (uint32_t)rd_le(&r, 4);
    uint64_t *f[9] = {&c->src, &c->dst, &c->rows, &c->cols, &c->elem, &c->src_row, &c->src_col, &c->dst_row,
                      &c->dst_col};
    for (int k = 0; k < 9; k++) *f[k] = rd_le(&r, 8);
    w->ncopies++;
    if (r.bad) st = bad("copy %llu: truncated", (unsigned long long)i);
  }
  if (!st && r.pos != len) st = bad("%zu unexpected bytes at the end", len - r.pos);
  for (int i = 0; i < w->ntensors && !st; i++) {
    uint64_t written = 0;
    const FmtWeightsTensor *t = &w->tensors[i];
    for (uint32_t k = 0; k < t->ncopies && !st; k++)
      st = check_copy(w, &w->copies[t->first + k], t, i, (int)k, &written);
  }
  if (st) {
    fmt_weights_free(w);
    return st;
  }
  *out = w;
  return NULL;
}


/* ---- opening ---- */

struct FmtWeightsSet {
  const FmtWeights *w; /* the caller's table; outlives the set */
  char *bundle_path;   /* for looking at the other places again */
  Map *maps;           /* per file */
  int *place;          /* per file: which of places() it was mapped from */
  int nfiles;
  void **data;         /* per tensor */
  size_t *sizes;
  bool *owned;         /* per tensor: data lies in `region`, assembled by verify */
  int ntensors;
  unsigned char *region; /* anonymous mapping holding every assembled tensor */
  size_t region_len;
  uint64_t copied;
  pthread_mutex_t lock;
  int state;           /* 0: not verified yet, 1: good, -1: refused (error, code) */
  char *error;
  StatusCode code;
};

void fmt_weights_close(FmtWeightsSet *s) {
  if (!s) return;
  for (int i = 0; i < s->nfiles; i++) unmap(&s->maps[i]);
  if (s->region) munmap(s->region, s->region_len);
  free(s->maps);
  free(s->place);
  free(s->data);
  free(s->sizes);
  free(s->owned);
  free(s->bundle_path);
  free(s->error);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

void *const *fmt_weights_set_data(const FmtWeightsSet *s) { return s->data; }
const size_t *fmt_weights_set_sizes(const FmtWeightsSet *s) { return s->sizes; }
int fmt_weights_set_count(const FmtWeightsSet *s) { return s->ntensors; }
uint64_t fmt_weights_set_copied_bytes(const FmtWeightsSet *s) { return s->copied; }

/* The places file f is looked for, in order (absolute path at compile
 * time, its name beside the bundle, its name as given); duplicates and
 * empty ones are "". */
static void places(const FmtWeightsFile *f, const char *bundle_path, char near[4096], const char *place[3]) {
  const char *slash = strrchr(bundle_path, '/');
  if (f->name[0] == '/') snprintf(near, 4096, "%s", f->name);
  else if (slash) snprintf(near, 4096, "%.*s/%s", (int)(slash - bundle_path), bundle_path, f->name);
  else snprintf(near, 4096, "%s", f->name);
  place[0] = f->path, place[1] = near, place[2] = f->name;
  for (int i = 1; i < 3; i++)
    for (int j = 0; j < i; j++)
      if (place[i][0] && strcmp(place[i], place[j]) == 0) place[i] = "";
}

static smelt_status not_the_one(const char *where, const FmtWeightsFile *f, size_t len) {
  return st_error(ST_INVALID_INPUT,
                  "%s: error: weights file '%s' is not the one the bundle was compiled with: it has %zu bytes%s, "
                  "the bundle expects %llu bytes with CRC-32C 0x%08x (compile the model again, or give the "
                  "original file)",
                  where, f->name, len, len == f->size ? " and another content" : "", (unsigned long long)f->size,
                  f->crc);
}

/* Finds and maps file f: the first place that holds a file of the
 * recorded size is taken (its content is checked by verify, which looks
 * at the other places again when it differs); when none does, the error
 * names the first file found (changed size) or every place tried
 * (missing).  *out_place is the index of the place taken. */
static smelt_status find_file(const FmtWeightsFile *f, const char *bundle_path, Map *out, int *out_place) {
  char near[4096];
  const char *place[3];
  places(f, bundle_path, near, place);
  smelt_status first = NULL;
  for (int i = 0; i < 3; i++) {
    if (!place[i][0]) continue;
    int err;
    Map m;
    smelt_status st = map_file(place[i], &m, &err, false);
    if (!st && err) continue;
    if (!st && m.len != f->size) st = not_the_one(place[i], f, m.len);
    if (!st) {
      *out = m;
      *out_place = i;
      st_free(first);
      return NULL;
    }
    unmap(&m);
    if (!first) first = st;
    else st_free(st);
  }
  if (first) return first;
  return st_error(ST_IO, "error: weights file '%s' not found (looked at %s%s%s%s%s); it must be beside the bundle or at "
                  "the path it was compiled from", f->name, f->path, strcmp(near, f->path) ? ", " : "",
                  strcmp(near, f->path) ? near : "",
                  strcmp(f->name, near) && strcmp(f->name, f->path) ? ", " : "",
                  strcmp(f->name, near) && strcmp(f->name, f->path) ? f->name : "");
}

static bool is_view(const FmtWeightsTensor *t, const FmtWeightsCopy *c, size_t align) {
  return t->ncopies == 1 && c->rows == 1 && c->cols == 1 && c->dst == 0 && c->elem == t->nbytes &&
         c->src % align == 0 && t->nbytes > 0;
}

smelt_status fmt_weights_open_deferred(const FmtWeights *w, const char *bundle_path, size_t view_align,
                                       FmtWeightsSet **out_set) {
  *out_set = NULL;
  if (view_align < 1 || view_align > 4096 || (view_align & (view_align - 1)))
    return st_error(ST_INVALID_INPUT, "weights: view alignment %zu is not a power of two up to 4096", view_align);
  FmtWeightsSet *s = calloc(1, sizeof *s);
  if (!s) return st_error(ST_NO_MEMORY, "out of memory");
  pthread_mutex_init(&s->lock, NULL);
  s->w = w;
  s->bundle_path = strdup(bundle_path ? bundle_path : "");
  s->maps = calloc((size_t)(w->nfiles ? w->nfiles : 1), sizeof *s->maps);
  s->place = calloc((size_t)(w->nfiles ? w->nfiles : 1), sizeof *s->place);
  s->data = calloc((size_t)(w->ntensors ? w->ntensors : 1), sizeof *s->data);
  s->sizes = calloc((size_t)(w->ntensors ? w->ntensors : 1), sizeof *s->sizes);
  s->owned = calloc((size_t)(w->ntensors ? w->ntensors : 1), sizeof *s->owned);
  smelt_status st = NULL;
  if (!s->bundle_path || !s->maps || !s->place || !s->data || !s->sizes || !s->owned) st = st_error(ST_NO_MEMORY, "out of memory");
  for (int i = 0; i < w->nfiles && !st; i++) {
    st = find_file(&w->files[i], s->bundle_path, &s->maps[i], &s->place[i]);
    if (!st) s->nfiles++;
  }
  /* Views where the file allows, else a place in one anonymous region
   * (zero pages until verify writes them: reserving costs nothing). */
  uint64_t region = 0;
  bool any_owned = false;
  for (int i = 0; i < w->ntensors && !st; i++) {
    const FmtWeightsTensor *t = &w->tensors[i];
    s->sizes[i] = (size_t)t->nbytes;
    if (is_view(t, &w->copies[t->first], view_align)) continue;
    s->owned[i] = any_owned = true;
    region += (t->nbytes + 63) / 64 * 64; /* each at most SIZE_MAX / 2 (decode) */
    if (region > SIZE_MAX / 2) st = st_error(ST_NO_MEMORY, "external weights: %llu bytes to assemble",
                                             (unsigned long long)region);
  }
  /* zero-byte tensors still get a pointer into a mapping, never NULL + 0 */
  if (any_owned && region == 0) region = 64;
  if (!st && region) {
    s->region_len = (size_t)region;
    void *p = mmap(NULL, s->region_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      s->region_len = 0;
      st = st_error(ST_NO_MEMORY, "out of memory for %llu bytes of assembled weights", (unsigned long long)region);
    } else {
      s->region = p; /* no MADV_HUGEPAGE: with THP defrag "madvise" its faults may stall in compaction */
    }
  }
  size_t at = 0;
  for (int i = 0; i < w->ntensors && !st; i++) {
    const FmtWeightsTensor *t = &w->tensors[i];
    const FmtWeightsCopy *c = &w->copies[t->first];
    s->ntensors++;
    if (!s->owned[i]) {
      s->data[i] = s->maps[c->file].p + c->src; /* the mapping is page-aligned */
      continue;
    }
    s->data[i] = s->region + at;
    at += ((size_t)t->nbytes + 63) / 64 * 64;
    s->copied += t->nbytes;
  }
  if (st) {
    fmt_weights_close(s);
    return st;
  }
  *out_set = s;
  return NULL;
}

/* ---- verifying and assembling ---- */

/* A piece of work for the threads: CRC of bytes [off, off+len) of a file,
 * or rows [r0, r1) (bytes [b0, b1) of a one-row copy) of one copy. */
typedef struct {
  int file, copy, tensor;
  size_t off, len;
  uint64_t r0, r1;
  uint32_t crc;
} Task;

typedef struct {
  FmtWeightsSet *s;
  Task *t;
} Work;

#define PIECE_BYTES ((uint64_t)4 << 20)

static void crc_task(void *ctx, int i) {
  Work *k = ctx;
  Task *t = &k->t[i];
  t->crc = fmt_crc32c(0, k->s->maps[t->file].p + t->off, t->len);
}

/* Rows [r0, r1) of copy c into dst; a copy of one element is split by
 * bytes instead (r0, r1 are then byte offsets inside the element). */
static void run_copy(unsigned char *dst, const unsigned char *src, const FmtWeightsCopy *c, uint64_t r0, uint64_t r1) {
  if (c->rows == 1 && c->cols == 1) {
    memcpy(dst + c->dst + r0, src + c->src + r0, (size_t)(r1 - r0));
    return;
  }
  bool dense = c->src_col == c->elem && c->dst_col == c->elem;
  for (uint64_t r = r0; r < r1; r++) {
    const unsigned char *s = src + c->src + r * c->src_row;
    unsigned char *d = dst + c->dst + r * c->dst_row;
    if (dense || c->cols == 1) {
      memcpy(d, s, (size_t)(c->cols * c->elem));
      continue;
    }
    switch (c->elem) { /* fixed sizes: the compiler turns each memcpy into one move */
    case 2:
      for (uint64_t k = 0; k < c->cols; k++) memcpy(d + k * c->dst_col, s + k * c->src_col, 2);
      break;
    case 4:
      for (uint64_t k = 0; k < c->cols; k++) memcpy(d + k * c->dst_col, s + k * c->src_col, 4);
      break;
    default:
      for (uint64_t k = 0; k < c->cols; k++) memcpy(d + k * c->dst_col, s + k * c->src_col, (size_t)c->elem);
    }
  }
}

static void copy_task(void *ctx, int i) {
  Work *k = ctx;
  const Task *t = &k->t[i];
  const FmtWeightsCopy *c = &k->s->w->copies[t->copy];
  run_copy(k->s->data[t->tensor], k->s->maps[c->file].p, c, t->r0, t->r1);
}

/* Appends a task, growing the array. */
static bool push(Task **a, int *n, int *cap, Task t) {
  if (*n == *cap) {
    int nc = *cap ? 2 * *cap : 256;
    Task *p = realloc(*a, sizeof *p * (size_t)nc);
    if (!p) return false;
    *a = p, *cap = nc;
  }
  (*a)[(*n)++] = t;
  return true;
}

/* File i's content differs from what the bundle recorded: the other
 * places are looked at, and one of the right size and CRC is mapped over
 * the first (same size, same address, so the views stay valid). */
static smelt_status other_place(FmtWeightsSet *s, int i) {
  const FmtWeightsFile *f = &s->w->files[i];
  char near[4096];
  const char *place[3];
  places(f, s->bundle_path, near, place);
  smelt_status first = not_the_one(place[s->place[i]], f, s->maps[i].len);
  for (int k = s->place[i] + 1; k < 3; k++) {
    if (!place[k][0]) continue;
    int err;
    Map m;
    smelt_status st = map_file(place[k], &m, &err, true);
    if (st || err) {
      st_free(st);
      continue;
    }
    bool good = m.len == f->size && fmt_crc32c_parallel(m.p, m.len) == f->crc;
    unmap(&m);
    int fd = good ? open(place[k], O_RDONLY) : -1;
    if (fd < 0) continue;
    void *p = mmap(s->maps[i].p, s->maps[i].len, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) break;
    st_free(first);
    return NULL;
  }
  return first;
}

static smelt_status verify(FmtWeightsSet *s) {
  const FmtWeights *w = s->w;
  Task *t = NULL;
  int n = 0, cap = 0;
  bool oom = false;
  uint64_t bytes = 0;
  for (int i = 0; i < s->nfiles && !oom; i++) {
    for (size_t off = 0; off < s->maps[i].len && !oom; off += PIECE_BYTES) {
      size_t len = s->maps[i].len - off < PIECE_BYTES ? s->maps[i].len - off : PIECE_BYTES;
      oom = !push(&t, &n, &cap, (Task){.file = i, .off = off, .len = len});
    }
    bytes += s->maps[i].len;
  }
  if (oom) {
    free(t);
    return st_error(ST_NO_MEMORY, "out of memory checking the weights files");
  }
  Work k = {s, t};
  fmt_parallel_for(fmt_parallel_threads(bytes), n, crc_task, &k);
  smelt_status st = NULL;
  for (int i = 0, at = 0; i < s->nfiles && !st; i++) {
    uint32_t crc = 0;
    for (; at < n && t[at].file == i; at++) crc = fmt_crc32c_combine(crc, t[at].crc, t[at].len);
    if (crc != w->files[i].crc) st = other_place(s, i);
  }
  n = 0;
  bytes = 0;
  for (int i = 0; i < s->ntensors && !st && !oom; i++) {
    if (!s->owned[i]) continue;
    const FmtWeightsTensor *tn = &w->tensors[i];
    for (uint32_t q = 0; q < tn->ncopies && !oom; q++) {
      const FmtWeightsCopy *c = &w->copies[tn->first + q];
      if (!c->rows || !c->cols || !c->elem) continue;
      uint64_t total = c->rows * c->cols * c->elem; /* checked on decode */
      bytes += total;
      if (c->rows == 1 && c->cols == 1) {
        for (uint64_t b = 0; b < c->elem && !oom; b += PIECE_BYTES)
          oom = !push(&t, &n, &cap, (Task){.tensor = i, .copy = (int)(tn->first + q), .r0 = b,
                                          .r1 = c->elem - b < PIECE_BYTES ? c->elem : b + PIECE_BYTES});
        continue;
      }
      uint64_t row = c->cols * c->elem, step = row >= PIECE_BYTES ? 1 : PIECE_BYTES / row;
      for (uint64_t r = 0; r < c->rows && !oom; r += step)
        oom = !push(&t, &n, &cap, (Task){.tensor = i, .copy = (int)(tn->first + q), .r0 = r,
                                        .r1 = c->rows - r < step ? c->rows : r + step});
    }
  }
  if (!st && oom) st = st_error(ST_NO_MEMORY, "out of memory assembling the weights");
  k.t = t;
  if (!st) fmt_parallel_for(fmt_parallel_threads(bytes), n, copy_task, &k);
  free(t);
  return st;
}

smelt_status fmt_weights_verify(FmtWeightsSet *s) {
  pthread_mutex_lock(&s->lock);
  if (s->state == 0) {
    smelt_status st = verify(s);
    s->state = st ? -1 : 1;
    if (st) {
      s->code = st_code(st);
      s->error = strdup(st_message(st));
      st_free(st);
    }
  }
  smelt_status st = s->state < 0 ? st_error(s->code, "%s", s->error ? s->error : "weights file refused") : NULL;
  pthread_mutex_unlock(&s->lock);
  return st;
}

smelt_status fmt_weights_open(const FmtWeights *w, const char *bundle_path, FmtWeightsSet **out_set) {
  RETURN_IF_ERROR(fmt_weights_open_deferred(w, bundle_path, 64, out_set));
  smelt_status st = fmt_weights_verify(*out_set);
  if (st) {
    fmt_weights_close(*out_set);
    *out_set = NULL;
  }
  return st;
}
