/* safetensors reader.
 *
 * The format is an 8-byte little-endian header length N, N bytes of JSON
 *   {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]},
 *    ..., "__metadata__": {"key": "value", ...}}
 * and then the data buffer; offsets are relative to the start of that buffer.
 *
 * The file is mapped read-only, not read (a model's weights are hundreds of
 * MB, and the YAML frontend copies each tensor once into its graph from
 * the mapping).  It is untrusted input, so the reader checks every
 * fact the header states before anyone can use it: the header fits in the
 * file, is a JSON object without duplicate names, each entry has exactly the
 * three known keys, a known dtype, a shape of non-negative sizes whose byte
 * count does not overflow, offsets inside the data buffer that span exactly
 * numel * element size, and no two tensors overlap (checked by sorting the
 * ranges by start).  After that a SafeTensor's data pointer can be read for
 * nbytes without further checks.  Note it may be unaligned (nothing in the
 * format forces alignment): copy it with memcpy before typed access.
 *
 * F8_E4M3 and F8_E5M2 are smelt's f8e4m3 and f8e5m2 (quantised weights).
 * I4 and U4 are not safetensors dtypes: they are smelt's own i4 and u4,
 * packed two per byte as ir/dtype.h says (numel / 2 bytes, rounded up),
 * for the weights that `smelt import hf` repacks from GPTQ and AWQ
 * checkpoints.
 * Dtypes that smelt has no type for (I16, U16, U32, U64) are accepted
 * with dt = DT_INVALID, so that a weights file with some such tensor can
 * still provide the others; using one as a param is the loader's error.
 * Tensors are kept sorted by name, so lookups are a binary search and
 * fe_safetensors_at() enumerates in a stable order.
 */
#define _DEFAULT_SOURCE /* MAP_POPULATE, realpath */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "fe_internal.h"

/* The reference implementation refuses headers above 100 MB; so do we, so
 * that a corrupt length cannot make us parse gigabytes of data as JSON. */
#define ST_MAX_HEADER (100u * 1000 * 1000)
/* The largest weights file accepted. */
#define ST_MAX_FILE ((size_t)1 << 40)

struct SafeTensors {
  unsigned char *buf; /* the whole file, mapped read-only (NULL when empty) */
  size_t size;
  Arena arena; /* names and dtype strings */
  SafeTensor *t;
  int n;
};

static const struct {
  const char *name;
  DType dt;
  unsigned bits;
} st_dtypes[] = {
    {"F64", DT_F64, 64},     {"F32", DT_F32, 32},     {"F16", DT_F16, 16},     {"BF16", DT_BF16, 16},
    {"I64", DT_I64, 64},     {"I32", DT_I32, 32},     {"I16", DT_INVALID, 16}, {"I8", DT_I8, 8},
    {"U8", DT_U8, 8},        {"BOOL", DT_BOOL, 8},    {"U16", DT_INVALID, 16}, {"U32", DT_INVALID, 32},
    {"U64", DT_INVALID, 64}, {"F8_E4M3", DT_F8E4M3, 8}, {"F8_E5M2", DT_F8E5M2, 8},
    {"I4", DT_I4, 4},        {"U4", DT_U4, 4},
};

const char *fe_safetensors_dtype_name(DType dt) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (st_dtypes[i].dt == dt && dt != DT_INVALID) return st_dtypes[i].name;
  return NULL;
}

smelt_status fe_st_header_open(FeStHeader *h) {
  memset(h, 0, sizeof *h);
  h->json = open_memstream(&h->buf, &h->len);
  if (!h->json) return st_error(ST_NO_MEMORY, "out of memory");
  fputc('{', h->json);
  return NULL;
}

void fe_st_header_add(FeStHeader *h, const char *name, DType dt, int rank, const int64_t *dim) {
  FILE *f = h->json;
  int64_t numel = 1;
  for (int d = 0; d < rank; d++) numel *= dim[d];
  uint64_t bytes = ((uint64_t)numel * (uint64_t)dt_bits(dt) + 7) / 8; /* as ir_type_bytes counts a packed tensor */
  fputs(h->n++ ? ",\"" : "\"", f);
  for (const char *s = name; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    fputc(*s, f);
  }
  const char *dn = fe_safetensors_dtype_name(dt);
  fprintf(f, "\":{\"dtype\":\"%s\",\"shape\":[", dn ? dn : "?"); /* every dtype smelt stores has a name */
  for (int d = 0; d < rank; d++) fprintf(f, "%s%" PRId64, d ? "," : "", dim[d]);
  fprintf(f, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", h->off, h->off + bytes);
  h->off += bytes;
}

smelt_status fe_st_header_write(FeStHeader *h, FILE *f, const char *path) {
  fputc('}', h->json);
  while (ftell(h->json) % 8) fputc(' ', h->json);
  bool ok = fclose(h->json) == 0;
  if (!ok) {
    free(h->buf);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)h->len >> (8 * i));
  ok = fwrite(le, 1, 8, f) == 8 && fwrite(h->buf, 1, h->len, f) == h->len;
  free(h->buf);
  h->buf = NULL;
  if (!ok) return st_error(ST_IO, "%s: error: write failed: %s", path, strerror(errno));
  return NULL;
}

static int find_dtype(const char *name) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (strcmp(st_dtypes[i].name, name) == 0) return (int)i;
  return -1;
}

static uint64_t read_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* A JSON integer that is >= 0; jansson has already refused non-integers
 * that do not fit (they become reals, which we reject). */
static bool json_nonneg(const json_t *j, uint64_t *out) {
  if (!json_is_integer(j) || json_integer_value(j) < 0) return false;
  *out = (uint64_t)json_integer_value(j);
  return true;
}

/* Fills t from one header entry; data_size is the size of the data buffer. */
static smelt_status parse_entry(SafeTensors *s, const char *name, json_t *e, const unsigned char *data,
                                uint64_t data_size, SafeTensor *t, uint64_t *begin_out) {
  if (!json_is_object(e)) return st_error(ST_INVALID_INPUT, "tensor '%s': entry is not a JSON object", name);
  const char *key;
  json_t *v;
  json_object_foreach(e, key, v) {
    if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
      return st_error(ST_INVALID_INPUT, "tensor '%s': unknown key '%s'", name, key);
  }
  json_t *jdt = json_object_get(e, "dtype"), *jshape = json_object_get(e, "shape");
  json_t *joff = json_object_get(e, "data_offsets");
  if (!jdt || !jshape || !joff)
    return st_error(ST_INVALID_INPUT, "tensor '%s': entry needs dtype, shape and data_offsets", name);
  if (!json_is_string(jdt)) return st_error(ST_INVALID_INPUT, "tensor '%s': dtype is not a string", name);
  int di = find_dtype(json_string_value(jdt));
  if (di < 0)
    return st_error(ST_INVALID_INPUT, "tensor '%s': unknown dtype '%s'", name, json_string_value(jdt));
  if (!json_is_array(jshape))
    return st_error(ST_INVALID_INPUT, "tensor '%s': shape is not a list", name);
  size_t rank = json_array_size(jshape);
  if (rank > IR_MAX_RANK)
    return st_error(ST_INVALID_INPUT, "tensor '%s': rank %zu exceeds the maximum of %d", name, rank, IR_MAX_RANK);
  /* numel * element bits must fit in int64: checked one dimension at a time */
  uint64_t bits = st_dtypes[di].bits;
  t->rank = (int)rank;
  for (size_t i = 0; i < rank; i++) {
    uint64_t d;
    if (!json_nonneg(json_array_get(jshape, i), &d))
      return st_error(ST_INVALID_INPUT, "tensor '%s': shape[%zu] is not a non-negative integer", name, i);
    if (d != 0 && bits > (uint64_t)INT64_MAX / d)
      return st_error(ST_INVALID_INPUT, "tensor '%s': shape overflows (more than 2^60 bytes)", name);
    bits *= d;
    t->dim[i] = (int64_t)d;
  }
  uint64_t bytes = (bits + 7) / 8; /* as ir_type_bytes counts a packed tensor */
  uint64_t begin, end;
  if (!json_is_array(joff) || json_array_size(joff) != 2 || !json_nonneg(json_array_get(joff, 0), &begin) ||
      !json_nonneg(json_array_get(joff, 1), &end) || begin > end)
    return st_error(ST_INVALID_INPUT, "tensor '%s': data_offsets must be [BEGIN, END] with 0 <= BEGIN <= END",
                    name);
  if (end > data_size)
    return st_error(ST_INVALID_INPUT,
                    "tensor '%s': data_offsets [%llu, %llu] run past the end of the data (%llu bytes; file truncated?)",
                    name, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_size);
  if (end - begin != bytes)
    return st_error(ST_INVALID_INPUT, "tensor '%s': data_offsets span %llu bytes but its dtype and shape need %llu",
                    name, (unsigned long long)(end - begin), (unsigned long long)bytes);
  t->name = arena_strdup(&s->arena, name);
  t->st_dtype = st_dtypes[di].name;
  t->dt = st_dtypes[di].dt;
  t->data = data + begin;
  t->offset = (uint64_t)(data + begin - s->buf);
  t->nbytes = (size_t)bytes;
  *begin_out = begin;
  if (!t->name) return st_error(ST_NO_MEMORY, "out of memory");
  return NULL;
}

typedef struct {
  uint64_t begin, end;
  int index;
} Range;

static int cmp_range(const void *a, const void *b) {
  const Range *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_tensor(const void *a, const void *b) {
  return strcmp(((const SafeTensor *)a)->name, ((const SafeTensor *)b)->name);
}

static smelt_status parse_header(SafeTensors *s) {
  if (s->size < 8)
    return st_error(ST_INVALID_INPUT, "file is %zu bytes, too short for a safetensors header", s->size);
  uint64_t n = read_le64(s->buf);
  if (n > s->size - 8)
    return st_error(ST_INVALID_INPUT, "header length %llu exceeds the file size (%zu bytes; truncated or not a safetensors file?)",
                    (unsigned long long)n, s->size);
  if (n > ST_MAX_HEADER)
    return st_error(ST_INVALID_INPUT, "header length %llu exceeds the limit of %u bytes", (unsigned long long)n,
                    ST_MAX_HEADER);
  json_error_t jerr;
  json_t *root = json_loadb((const char *)s->buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return st_error(ST_INVALID_INPUT, "header is not valid JSON: %s (at byte %d of the header)", jerr.text,
                    jerr.position);
  smelt_status st = NULL;
  Range *ranges = NULL;
  if (!json_is_object(root)) {
    st = st_error(ST_INVALID_INPUT, "header is not a JSON object");
    goto done;
  }
  const unsigned char *data = s->buf + 8 + n;
  uint64_t data_size = s->size - 8 - n;
  size_t count = json_object_size(root);
  s->t = calloc(count ? count : 1, sizeof *s->t);
  ranges = calloc(count ? count : 1, sizeof *ranges);
  if (!s->t || !ranges) {
    st = st_error(ST_NO_MEMORY, "out of memory");
    goto done;
  }
  const char *key;
  json_t *v;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "__metadata__") == 0) {
      /* free-form string map; smelt only checks its shape */
      if (!json_is_object(v)) {
        st = st_error(ST_INVALID_INPUT, "__metadata__ is not a JSON object");
        goto done;
      }
      continue;
    }
    SafeTensor *t = &s->t[s->n];
    uint64_t begin = 0;
    st = parse_entry(s, key, v, data, data_size, t, &begin);
    if (st) goto done;
    ranges[s->n].begin = begin;
    ranges[s->n].end = begin + t->nbytes;
    ranges[s->n].index = s->n;
    s->n++;
  }
  /* Overlap: after sorting by start, each non-empty range must begin at or
   * after the end of every earlier non-empty one. */
  qsort(ranges, (size_t)s->n, sizeof *ranges, cmp_range);
  uint64_t reach = 0;
  int reach_index = -1;
  for (int i = 0; i < s->n; i++) {
    if (ranges[i].begin == ranges[i].end) continue;
    if (reach_index >= 0 && ranges[i].begin < reach) {
      st = st_error(ST_INVALID_INPUT, "tensors '%s' and '%s' overlap in the data buffer",
                    s->t[reach_index].name, s->t[ranges[i].index].name);
      goto done;
    }
    reach = ranges[i].end;
    reach_index = ranges[i].index;
  }
  qsort(s->t, (size_t)s->n, sizeof *s->t, cmp_tensor);
done:
  free(ranges);
  json_decref(root);
  return st;
}

/* Maps the file at path into s->buf, s->size. */
static smelt_status map_whole(const char *path, SafeTensors *s) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return st_error(ST_IO, "cannot open: %s", strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return st_error(ST_IO, "cannot read: not a regular file");
  }
  if ((unsigned long long)sb.st_size > ST_MAX_FILE) {
    close(fd);
    return st_error(ST_IO, "file is too large (%lld bytes, at most %zu)", (long long)sb.st_size, ST_MAX_FILE);
  }
  s->size = (size_t)sb.st_size;
  if (s->size) {
    void *p = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      close(fd);
      s->size = 0;
      return st_error(ST_IO, "cannot map: %s", strerror(err));
    }
    s->buf = p;
  }
  close(fd);
  return NULL;
}

smelt_status fe_safetensors_open_bare(const char *path, SafeTensors **out) {
  *out = NULL;
  SafeTensors *s = calloc(1, sizeof *s);
  if (!s) return st_error(ST_NO_MEMORY, "out of memory");
  smelt_status st = map_whole(path, s);
  if (!st) st = parse_header(s);
  if (st) {
    fe_safetensors_close(s);
    return st;
  }
  *out = s;
  return NULL;
}

smelt_status fe_safetensors_open(const char *path, SafeTensors **out) {
  smelt_status st = fe_safetensors_open_bare(path, out);
  if (!st) return NULL;
  SrcLoc loc = {path, 0, 0};
  smelt_status located = st_at(loc, "%s", st_message(st));
  /* keep I/O failures distinguishable from malformed files */
  if (st_code(st) != ST_INVALID_INPUT) {
    smelt_status io = st_error(st_code(st), "%s", st_message(located));
    st_free(located);
    located = io;
  }
  st_free(st);
  return located;
}

void fe_safetensors_close(SafeTensors *s) {
  if (!s) return;
  if (s->buf) munmap(s->buf, s->size);
  free(s->t);
  arena_free_all(&s->arena);
  free(s);
}

const SafeTensor *fe_safetensors_find(const SafeTensors *s, const char *name) {
  SafeTensor key = {0};
  key.name = name;
  return bsearch(&key, s->t, (size_t)s->n, sizeof *s->t, cmp_tensor);
}

int fe_safetensors_count(const SafeTensors *s) { return s->n; }

const SafeTensor *fe_safetensors_at(const SafeTensors *s, int i) {
  return i >= 0 && i < s->n ? &s->t[i] : NULL;
}

smelt_status fe_safetensors_index_files(const char *path, char ***out_files, int *out_n) {
  *out_files = NULL;
  *out_n = 0;
  unsigned char *text = NULL;
  size_t len = 0;
  RETURN_IF_ERROR(fe_read_file(path, (size_t)64 << 20, &text, &len));
  json_error_t je;
  json_t *root = json_loadb((const char *)text, len, 0, &je);
  free(text);
  if (!root) return st_error(ST_INVALID_INPUT, "line %d: not JSON: %s", je.line, je.text);
  json_t *map = json_object_get(root, "weight_map");
  smelt_status st = NULL;
  if (!json_is_object(map)) st = st_error(ST_INVALID_INPUT, "no \"weight_map\" object");
  char **files = NULL;
  int n = 0;
  const char *key;
  json_t *val;
  json_object_foreach(map, key, val) {
    if (st) break;
    const char *f = json_string_value(val);
    if (!f || !*f || strchr(f, '/') || strstr(f, "..")) {
      st = st_error(ST_INVALID_INPUT, "weight_map[\"%.80s\"] is not the name of a file beside the index", key);
      break;
    }
    bool seen = false;
    for (int i = 0; i < n && !seen; i++) seen = strcmp(files[i], f) == 0;
    if (seen) continue;
    /* checked here, not only by the caller: the search above is linear, and
     * a 64 MiB index can name a million files */
    if (n == FE_MAX_WEIGHT_FILES) {
      st = st_error(ST_INVALID_INPUT, "the weight_map names more than %d files", FE_MAX_WEIGHT_FILES);
      break;
    }
    char **nf = realloc(files, sizeof *files * (size_t)(n + 1));
    if (!nf || !(nf[n] = strdup(f))) {
      if (nf) files = nf;
      st = st_error(ST_NO_MEMORY, "out of memory");
      break;
    }
    files = nf;
    n++;
  }
  json_decref(root);
  if (!st && n == 0) st = st_error(ST_INVALID_INPUT, "the weight_map names no files");
  if (st) {
    for (int i = 0; i < n; i++) free(files[i]);
    free(files);
    return st;
  }
  *out_files = files;
  *out_n = n;
  return NULL;
}
