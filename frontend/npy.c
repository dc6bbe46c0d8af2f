/* .npy reader and writer (numpy's NEP 1 format).
 *
 * A file is the magic "\x93NUMPY", a major and minor version byte, the
 * header length (2 bytes little endian in v1.0, 4 bytes in v2.0 and v3.0),
 * then the header: a Python dict literal such as
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and a newline, then the raw data in C order.
 *
 * The reader parses that dict with a tiny tokenizer that knows exactly the
 * three keys numpy writes and refuses anything else, so a corrupt header
 * cannot be mistaken for a valid one; then it checks that the data length
 * is exactly numel * element size.  Supported descrs are the little-endian
 * (or byte-sized) forms of smelt's dtypes: <f4 <f2 <f8 <i8 <i4 |i1 |u1 |b1.
 * numpy has no bfloat16, so the writer stores bf16 tensors as f32 (every
 * bf16 value is exactly representable in f32, so nothing is lost); all other
 * dtypes are written natively.  The writer emits v1.0 with the header padded
 * so the data starts on a 64-byte boundary, as numpy itself does.
 *
 * Reader and writer accept the same shapes (npy_shape_ok): rank at most
 * IR_MAX_RANK, no negative dim, and every prefix product of the dims at most
 * NPY_MAX_NUMEL, the bound of the bundle format (ir/serialize.c), so that
 * what one side accepts the other does too and ir_type_bytes cannot overflow
 * on it, whatever the dtype.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fe_internal.h"

#define NPY_MAX_FILE ((size_t)1 << 40)
/* Elements of a tensor: its bytes fit in int64 for every dtype. */
#define NPY_MAX_NUMEL (INT64_MAX / 8)

static const struct {
  const char *descr;
  DType dt;
} npy_descrs[] = {
    {"<f4", DT_F32}, {"<f2", DT_F16}, {"<f8", DT_F64}, {"<i8", DT_I64},
    {"<i4", DT_I32}, {"|i1", DT_I8},  {"|u1", DT_U8},  {"|b1", DT_BOOL},
};

/* The one shape rule of both sides (see above).  Prefix products, not only
 * the total: ir_type_numel multiplies left to right, so [2^61, 2^61, 0]
 * would overflow before it reached the 0. */
static bool npy_shape_ok(const TensorType *t) {
  if (t->rank < 0 || t->rank > IR_MAX_RANK) return false;
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) {
    if (t->dim[i] < 0 || (t->dim[i] > 0 && n > NPY_MAX_NUMEL / t->dim[i])) return false;
    n *= t->dim[i];
  }
  return true;
}

/* ---- header parsing ---- */

typedef struct {
  const char *p, *end;
} Lex;

static void skip_ws(Lex *lx) {
  while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\n' || *lx->p == '\r')) lx->p++;
}

static bool eat(Lex *lx, char c) {
  skip_ws(lx);
  if (lx->p < lx->end && *lx->p == c) {
    lx->p++;
    return true;
  }
  return false;
}

/* A quoted string of at most cap-1 characters (no escapes: numpy never
 * writes any in these headers). */
static bool lex_string(Lex *lx, char *out, size_t cap) {
  skip_ws(lx);
  if (lx->p >= lx->end || (*lx->p != '\'' && *lx->p != '"')) return false;
  char q = *lx->p++;
  size_t n = 0;
  while (lx->p < lx->end && *lx->p != q) {
    if (*lx->p == '\\' || n + 1 >= cap) return false;
    out[n++] = *lx->p++;
  }
  if (lx->p >= lx->end) return false;
  lx->p++;
  out[n] = 0;
  return true;
}

static bool lex_word(Lex *lx, const char *w) {
  skip_ws(lx);
  size_t n = strlen(w);
  if ((size_t)(lx->end - lx->p) < n || memcmp(lx->p, w, n) != 0) return false;
  lx->p += n;
  return true;
}

static bool lex_uint(Lex *lx, int64_t *out) {
  skip_ws(lx);
  int64_t v = 0;
  const char *s = lx->p;
  while (lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9') {
    int d = *lx->p - '0';
    if (v > (INT64_MAX - d) / 10) return false;
    v = v * 10 + d;
    lx->p++;
  }
  /* numpy writes 3L for long ints under Python 2 */
  if (lx->p < lx->end && *lx->p == 'L') lx->p++;
  *out = v;
  return lx->p > s;
}

/* (d0, d1, ...) with an optional trailing comma; () is a scalar. */
static bool lex_shape(Lex *lx, TensorType *t) {
  if (!eat(lx, '(')) return false;
  t->rank = 0;
  if (eat(lx, ')')) return true;
  for (;;) {
    int64_t d;
    if (t->rank >= IR_MAX_RANK || !lex_uint(lx, &d)) return false;
    t->dim[t->rank++] = d;
    if (eat(lx, ')')) return true;
    if (!eat(lx, ',')) return false;
    if (eat(lx, ')')) return true;
  }
}

static smelt_status parse_header(const char *path, const char *h, size_t n, TensorType *t) {
  SrcLoc loc = {path, 0, 0};
  Lex lx = {h, h + n};
  char key[32], descr[16] = "";
  bool have_descr = false, have_order = false, have_shape = false, fortran = false;
  if (!eat(&lx, '{')) return st_at(loc, ".npy header is not a dict");
  while (!eat(&lx, '}')) {
    if (!lex_string(&lx, key, sizeof key) || !eat(&lx, ':'))
      return st_at(loc, ".npy header is malformed near byte %d", (int)(lx.p - h));
    if (strcmp(key, "descr") == 0 && !have_descr) {
      if (!lex_string(&lx, descr, sizeof descr)) return st_at(loc, ".npy header: 'descr' is not a simple dtype string");
      have_descr = true;
    } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
      if (lex_word(&lx, "True")) fortran = true;
      else if (!lex_word(&lx, "False")) return st_at(loc, ".npy header: 'fortran_order' is not True or False");
      have_order = true;
    } else if (strcmp(key, "shape") == 0 && !have_shape) {
      if (!lex_shape(&lx, t))
        return st_at(loc, ".npy header: 'shape' is not a tuple of at most %d non-negative integers", IR_MAX_RANK);
      have_shape = true;
    } else {
      return st_at(loc, ".npy header: unexpected or repeated key '%s'", key);
    }
    if (!eat(&lx, ',')) {
      if (!eat(&lx, '}')) return st_at(loc, ".npy header is malformed near byte %d", (int)(lx.p - h));
      break;
    }
  }
  skip_ws(&lx);
  if (lx.p != lx.end) return st_at(loc, ".npy header has trailing bytes after the dict");
  if (!have_descr || !have_order || !have_shape)
    return st_at(loc, ".npy header lacks one of 'descr', 'fortran_order', 'shape'");
  if (fortran) return st_at(loc, "Fortran-order .npy arrays are not supported (save with C order)");
  t->dt = DT_INVALID;
  for (size_t i = 0; i < sizeof npy_descrs / sizeof npy_descrs[0]; i++)
    if (strcmp(descr, npy_descrs[i].descr) == 0) t->dt = npy_descrs[i].dt;
  if (t->dt == DT_INVALID) {
    if (descr[0] == '>') return st_at(loc, "big-endian .npy data ('%s') is not supported", descr);
    return st_at(loc, ".npy dtype '%s' is not supported (expected one of <f4 <f2 <f8 <i8 <i4 |i1 |u1 |b1)", descr);
  }
  return NULL;
}

smelt_status fe_npy_read(const char *path, TensorType *out_type, void **out_data) {
  *out_data = NULL;
  memset(out_type, 0, sizeof *out_type);
  SrcLoc loc = {path, 0, 0};
  unsigned char *buf;
  size_t size;
  smelt_status st = fe_read_file(path, NPY_MAX_FILE, &buf, &size);
  if (st) {
    smelt_status io = st_error(st_code(st), "%s: error: %s", path, st_message(st));
    st_free(st);
    return io;
  }
  size_t start;
  uint64_t hlen;
  if (size < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
    st = st_at(loc, "not a .npy file (bad magic)");
    goto done;
  }
  if (buf[6] == 1) {
    hlen = (uint64_t)buf[8] | (uint64_t)buf[9] << 8;
    start = 10;
  } else if ((buf[6] == 2 || buf[6] == 3) && size >= 12) {
    hlen = (uint64_t)buf[8] | (uint64_t)buf[9] << 8 | (uint64_t)buf[10] << 16 | (uint64_t)buf[11] << 24;
    start = 12;
  } else {
    st = st_at(loc, "unsupported .npy format version %d.%d", buf[6], buf[7]);
    goto done;
  }
  if (hlen > size - start) {
    st = st_at(loc, ".npy header length %llu exceeds the file size (truncated?)", (unsigned long long)hlen);
    goto done;
  }
  TensorType t;
  memset(&t, 0, sizeof t);
  st = parse_header(path, (const char *)buf + start, (size_t)hlen, &t);
  if (st) goto done;
  if (!npy_shape_ok(&t)) {
    st = st_at(loc, ".npy shape is too large (a prefix product of its dims exceeds 2^60 elements)");
    goto done;
  }
  uint64_t bytes = (uint64_t)ir_type_bytes(&t);
  size_t have = size - start - (size_t)hlen;
  if (have != bytes) {
    char tb[128];
    st = st_at(loc, ".npy data is %zu bytes but %s needs %llu%s", have, ir_type_str(&t, tb, sizeof tb),
               (unsigned long long)bytes, have < bytes ? " (truncated?)" : "");
    goto done;
  }
  void *data = malloc(bytes ? (size_t)bytes : 1);
  if (!data) {
    st = st_error(ST_NO_MEMORY, "%s: error: out of memory", path);
    goto done;
  }
  memcpy(data, buf + start + hlen, (size_t)bytes);
  *out_type = t;
  *out_data = data;
done:
  free(buf);
  return st;
}

/* ---- writing ---- */

static const char *descr_of(DType dt) {
  if (dt == DT_BF16) return "<f4"; /* widened on write, see above */
  for (size_t i = 0; i < sizeof npy_descrs / sizeof npy_descrs[0]; i++)
    if (npy_descrs[i].dt == dt) return npy_descrs[i].descr;
  return NULL;
}

smelt_status fe_npy_write(const char *path, const TensorType *type, const void *data) {
  SrcLoc loc = {path, 0, 0};
  const char *descr = descr_of(type->dt);
  if (!descr) return st_at(loc, "cannot write dtype %s to .npy", dt_name(type->dt));
  if (type->rank < 0 || type->rank > IR_MAX_RANK) return st_at(loc, "cannot write rank %d to .npy", type->rank);
  if (!npy_shape_ok(type)) return st_at(loc, "cannot write a tensor of invalid shape to .npy");
  uint64_t numel = (uint64_t)ir_type_numel(type);

  char header[512]; /* 8 dims of 19 digits plus padding fit easily */
  int n = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
  for (int i = 0; i < type->rank; i++)
    n += snprintf(header + n, sizeof header - (size_t)n, "%lld%s", (long long)type->dim[i],
                  type->rank == 1 || i + 1 < type->rank ? ", " : "");
  /* numpy writes (3,) for one dimension: a Python 1-tuple needs the comma */
  if (type->rank == 1) n -= 1;
  n += snprintf(header + n, sizeof header - (size_t)n, "), }");
  /* pad with spaces so that magic(6)+version(2)+len(2)+header ends on 64 bytes, newline last */
  size_t total = 10 + (size_t)n + 1;
  size_t pad = (64 - total % 64) % 64;
  size_t hlen = (size_t)n + pad + 1;
  memset(header + n, ' ', pad);
  header[hlen - 1] = '\n';

  const void *payload = data;
  size_t bytes = (size_t)numel * dt_size(type->dt);
  float *widened = NULL;
  if (type->dt == DT_BF16) {
    widened = malloc(numel ? (size_t)numel * sizeof(float) : 1);
    if (!widened) return st_error(ST_NO_MEMORY, "%s: error: out of memory", path);
    for (uint64_t i = 0; i < numel; i++) {
      uint16_t h;
      memcpy(&h, (const unsigned char *)data + 2 * i, 2);
      widened[i] = dt_bf16_to_f32(h);
    }
    payload = widened;
    bytes = (size_t)numel * sizeof(float);
  }

  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                           (unsigned char)(hlen >> 8)};
  smelt_status st = NULL;
  FILE *f = fopen(path, "wb");
  if (!f) {
    st = st_error(ST_IO, "%s: error: cannot write: %s", path, strerror(errno));
  } else {
    bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, hlen, f) == hlen &&
              (bytes == 0 || fwrite(payload, 1, bytes, f) == bytes);
    int err = errno;
    if (fclose(f) != 0 && ok) {
      ok = false;
      err = errno;
    }
    if (!ok) st = st_error(ST_IO, "%s: error: cannot write: %s", path, strerror(err));
  }
  free(widened);
  return st;
}
