/* The tuning table (table.h): its text form, merging rows, and lookup.
 *
 * The file is line-oriented so that a person can read it, edit it and see
 * a re-tune as a diff.  Parsing splits each line at the first '#' (what
 * follows is the row's note, or the whole line is a comment), then into
 * blank-separated fields: op, dtype, arch, `m=LO..HI`, the shape fields
 * ("k=v", any number, possibly none) and, last, the variant token.  Every
 * field is checked where it stands, so a typo is an error at its
 * file:line:col rather than a row that silently never matches: the op must
 * be an operator of the IR, the dtype a dtype, the arch a CUDA arch, the
 * interval non-empty and starting at 1 or more, the shape fields NAME=VALUE
 * with no name twice, the variant lexically a token ("family" or
 * "family:params"; each family checks its own parameters when the row is
 * used), and no two rows may claim the same key and interval.
 *
 * Shapes are compared as sets of tokens: a shape is stored normalised,
 * tokens sorted by name and joined by single spaces, so "N=4096 K=64" and
 * "K=64  N=4096" are one shape; lookup normalises the kernel's key the
 * same way.  Of the rows whose key matches and whose interval holds M, the
 * narrowest interval wins (a row tuned at exactly this M beats a bucket
 * around it); among equally narrow ones the first in table order.
 *
 * Printing sorts the rows (op, dtype, arch, shape with numbers compared as
 * numbers, then interval), so two tunes of the same model print the same
 * text and a diff shows only what changed; columns are padded to the
 * widest entry and a blank line separates the (op, dtype, arch) blocks.
 * Saving writes a temporary file next to the target and renames it over,
 * so a reader (or a crash) never sees half a table.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cuda/cu_emit.h"
#include "codegen/cuda/table.h"
#include "ir/ir.h"

#define MAX_FIELDS 48
#define MAX_SHAPE_TOKENS 32

static smelt_status oom(void) { return st_error(ST_NO_MEMORY, "out of memory in the tuning table"); }

CgTuneTable *cg_tune_table_new(void) { return calloc(1, sizeof(CgTuneTable)); }

void cg_tune_table_free(CgTuneTable *t) {
  if (!t) return;
  free(t->rows);
  free(t);
}

static bool append_row(CgTuneTable *t, const CgTuneRow *r) {
  if (t->n == t->cap) {
    int cap = t->cap ? t->cap * 2 : 16;
    CgTuneRow *p = realloc(t->rows, sizeof *p * (size_t)cap);
    if (!p) return false;
    t->rows = p;
    t->cap = cap;
  }
  t->rows[t->n++] = *r;
  return true;
}

/* ---- shapes ---- */

typedef struct {
  const char *s;
  size_t n;
} Tok;

static size_t name_len(const Tok *t) {
  const char *eq = memchr(t->s, '=', t->n);
  return eq ? (size_t)(eq - t->s) : t->n;
}

/* Order of tokens inside a normalised shape: by name, then by the whole
 * token (names are unique in a valid shape; the tie-break keeps the order
 * total for any input). */
static int tok_cmp(const void *pa, const void *pb) {
  const Tok *a = pa, *b = pb;
  size_t na = name_len(a), nb = name_len(b);
  int c = strncmp(a->s, b->s, na < nb ? na : nb);
  if (c) return c;
  if (na != nb) return na < nb ? -1 : 1;
  c = strncmp(a->s, b->s, a->n < b->n ? a->n : b->n);
  if (c) return c;
  return a->n < b->n ? -1 : a->n > b->n;
}

/* Splits s into blank-separated tokens; -1 when there are more than max. */
static int split_tokens(const char *s, Tok *out, int max) {
  int n = 0;
  for (const char *p = s; *p;) {
    while (*p == ' ' || *p == '\t') p++;
    if (!*p) break;
    const char *start = p;
    while (*p && *p != ' ' && *p != '\t') p++;
    if (n == max) return -1;
    out[n++] = (Tok){start, (size_t)(p - start)};
  }
  return n;
}

/* rest with its tokens sorted by name and single spaces between them;
 * false when it has too many tokens or does not fit cap bytes. */
static bool shape_normalise(const char *rest, char *out, size_t cap) {
  Tok tok[MAX_SHAPE_TOKENS];
  int n = split_tokens(rest, tok, MAX_SHAPE_TOKENS);
  if (n < 0) return false;
  qsort(tok, (size_t)n, sizeof *tok, tok_cmp);
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    if (len + (i ? 1 : 0) + tok[i].n + 1 > cap) return false;
    if (i) out[len++] = ' ';
    memcpy(out + len, tok[i].s, tok[i].n);
    len += tok[i].n;
  }
  if (cap) out[len] = 0;
  return cap > 0;
}

static bool all_digits(const char *s, size_t n) {
  if (n == 0) return false;
  for (size_t i = 0; i < n; i++)
    if (!isdigit((unsigned char)s[i])) return false;
  return true;
}

/* Compares two digit strings as the numbers they are. */
static int num_cmp(const char *a, size_t na, const char *b, size_t nb) {
  while (na > 1 && *a == '0') a++, na--;
  while (nb > 1 && *b == '0') b++, nb--;
  if (na != nb) return na < nb ? -1 : 1;
  return strncmp(a, b, na);
}

/* Order of two normalised shapes in the printed table: token by token,
 * values that are numbers by value (N=4096 before N=11008). */
static int shape_cmp(const char *a, const char *b) {
  Tok ta[MAX_SHAPE_TOKENS], tb[MAX_SHAPE_TOKENS];
  int na = split_tokens(a, ta, MAX_SHAPE_TOKENS), nb = split_tokens(b, tb, MAX_SHAPE_TOKENS);
  if (na < 0 || nb < 0) return strcmp(a, b);
  for (int i = 0; i < na && i < nb; i++) {
    size_t la = name_len(&ta[i]), lb = name_len(&tb[i]);
    int c = strncmp(ta[i].s, tb[i].s, la < lb ? la : lb);
    if (!c && la != lb) c = la < lb ? -1 : 1;
    if (c) return c;
    const char *va = ta[i].s + la, *vb = tb[i].s + lb;
    size_t nva = ta[i].n - la, nvb = tb[i].n - lb;
    if (nva && nvb) va++, nva--, vb++, nvb--; /* past '=' */
    if (all_digits(va, nva) && all_digits(vb, nvb)) c = num_cmp(va, nva, vb, nvb);
    else {
      c = strncmp(va, vb, nva < nvb ? nva : nvb);
      if (!c && nva != nvb) c = nva < nvb ? -1 : 1;
    }
    if (c) return c;
  }
  return na < nb ? -1 : na > nb;
}

/* Same op, dtype, arch and shape (rows' shapes are normalised). */
static bool same_key(const CgTuneRow *a, const CgTuneRow *b) {
  return strcmp(a->op, b->op) == 0 && strcmp(a->dtype, b->dtype) == 0 && strcmp(a->arch, b->arch) == 0 &&
         strcmp(a->rest, b->rest) == 0;
}

static bool same_slot(const CgTuneRow *a, const CgTuneRow *b) {
  return same_key(a, b) && a->m_lo == b->m_lo && a->m_hi == b->m_hi;
}

/* ---- parsing ---- */

typedef struct {
  const char *s;
  size_t n;
  int col; /* 1-based */
} Field;

static bool copy_field(const Field *f, char *out, size_t cap) {
  if (f->n + 1 > cap) return false;
  memcpy(out, f->s, f->n);
  out[f->n] = 0;
  return true;
}

/* A decimal integer >= 0 of digits only (no sign, no blanks). */
static bool parse_count(const char *s, size_t n, int64_t *out) {
  if (!all_digits(s, n) || n > 18) return false;
  int64_t v = 0;
  for (size_t i = 0; i < n; i++) v = v * 10 + (s[i] - '0');
  *out = v;
  return true;
}

static bool is_name_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* "NAME=VALUE": a name of [A-Za-z0-9_] not starting with a digit, a
 * non-empty value of [A-Za-z0-9_.+-]. */
static bool shape_token_ok(const Field *f) {
  size_t nl = name_len(&(Tok){f->s, f->n});
  if (nl == 0 || nl >= f->n || isdigit((unsigned char)f->s[0])) return false;
  for (size_t i = 0; i < nl; i++)
    if (!is_name_char(f->s[i])) return false;
  if (nl + 1 == f->n) return false;
  for (size_t i = nl + 1; i < f->n; i++) {
    char c = f->s[i];
    if (!is_name_char(c) && c != '.' && c != '+' && c != '-') return false;
  }
  return true;
}

/* "family" or "family:params": the family [a-z][a-z0-9_]*, the params of
 * [A-Za-z0-9_=,.+-]. */
static bool variant_ok(const Field *f) {
  if (f->n == 0 || !islower((unsigned char)f->s[0])) return false;
  size_t i = 0;
  while (i < f->n && (islower((unsigned char)f->s[i]) || isdigit((unsigned char)f->s[i]) || f->s[i] == '_')) i++;
  if (i == f->n) return true;
  if (f->s[i] != ':' || i + 1 == f->n) return false;
  for (i++; i < f->n; i++) {
    char c = f->s[i];
    if (!is_name_char(c) && c != '=' && c != ',' && c != '.' && c != '+' && c != '-') return false;
  }
  return true;
}

#define FAIL_AT(col, ...) st_at((SrcLoc){path, lineno, (col)}, __VA_ARGS__)

/* One line (without its newline): *out_row says whether it held a row. */
static smelt_status parse_line(const char *line, size_t len, const char *path, int lineno, CgTuneRow *r,
                               bool *out_row) {
  *out_row = false;
  memset(r, 0, sizeof *r);
  const char *hash = memchr(line, '#', len);
  size_t body = hash ? (size_t)(hash - line) : len;
  Field f[MAX_FIELDS];
  int nf = 0;
  for (size_t i = 0; i < body;) {
    while (i < body && (line[i] == ' ' || line[i] == '\t')) i++;
    if (i == body) break;
    size_t start = i;
    while (i < body && line[i] != ' ' && line[i] != '\t') i++;
    if (nf == MAX_FIELDS)
      return FAIL_AT((int)start + 1, "more than %d fields on one line", MAX_FIELDS);
    f[nf++] = (Field){line + start, i - start, (int)start + 1};
  }
  if (nf == 0) return NULL; /* blank or a comment */
  for (int i = 0; i < nf; i++)
    for (size_t j = 0; j < f[i].n; j++)
      if ((unsigned char)f[i].s[j] < 0x20 || (unsigned char)f[i].s[j] >= 0x7f)
        return FAIL_AT(f[i].col + (int)j, "unexpected byte 0x%02x (the table is plain ASCII text)",
                       (unsigned char)f[i].s[j]);
  if (nf < 5)
    return FAIL_AT(f[0].col, "a row needs op, dtype, arch, m=LO..HI, the shape fields and a variant; this line has %d field%s",
                   nf, nf == 1 ? "" : "s");

  /* op: an operator of the IR (cg_cuda_tune_key's op names are) */
  if (!copy_field(&f[0], r->op, sizeof r->op) || ir_op_from_name(r->op) == OP_COUNT)
    return FAIL_AT(f[0].col, "unknown op '%.*s' (a row names the kernel's operator: matmul, attention)", (int)f[0].n,
                   f[0].s);
  if (!copy_field(&f[1], r->dtype, sizeof r->dtype) || dt_from_name(r->dtype) == DT_INVALID)
    return FAIL_AT(f[1].col, "unknown dtype '%.*s'", (int)f[1].n, f[1].s);
  int cc;
  bool specific;
  if (!copy_field(&f[2], r->arch, sizeof r->arch) || !ir_cuda_parse_arch(r->arch, &cc, &specific))
    return FAIL_AT(f[2].col, "'%.*s' is not a CUDA arch (sm_90a, sm_80, ...)", (int)f[2].n, f[2].s);

  /* m=LO..HI */
  const Field *mf = &f[3];
  const char *dots = NULL; /* the field is not NUL-terminated: search within it */
  for (size_t i = 2; i + 1 < mf->n && !dots; i++)
    if (mf->s[i] == '.' && mf->s[i + 1] == '.') dots = mf->s + i;
  if (mf->n < 2 || strncmp(mf->s, "m=", 2) != 0 || !dots ||
      !parse_count(mf->s + 2, (size_t)(dots - mf->s - 2), &r->m_lo) ||
      !parse_count(dots + 2, (size_t)(mf->s + mf->n - dots - 2), &r->m_hi))
    return FAIL_AT(mf->col, "expected the rows as m=LO..HI (e.g. m=1..1, m=1025..2048), got '%.*s'", (int)mf->n, mf->s);
  if (r->m_lo < 1) return FAIL_AT(mf->col + 2, "the rows start at 1 at least, got m=%lld..", (long long)r->m_lo);
  if (r->m_hi < r->m_lo)
    return FAIL_AT(mf->col, "empty interval m=%lld..%lld (the first end is above the second)", (long long)r->m_lo,
                   (long long)r->m_hi);

  /* the shape: fields 4 .. nf-2 */
  char shape[sizeof r->rest * 2] = "";
  size_t slen = 0;
  for (int i = 4; i < nf - 1; i++) {
    if (!shape_token_ok(&f[i]))
      return FAIL_AT(f[i].col, "expected a shape field NAME=VALUE (e.g. N=4096), got '%.*s'", (int)f[i].n, f[i].s);
    size_t nl = name_len(&(Tok){f[i].s, f[i].n});
    for (int j = 4; j < i; j++)
      if (name_len(&(Tok){f[j].s, f[j].n}) == nl && strncmp(f[j].s, f[i].s, nl) == 0)
        return FAIL_AT(f[i].col, "shape field '%.*s' given twice (also at column %d)", (int)nl, f[i].s, f[j].col);
    if (slen + f[i].n + 2 > sizeof r->rest)
      return FAIL_AT(f[i].col, "the shape is longer than %zu characters", sizeof r->rest - 1);
    slen += (size_t)snprintf(shape + slen, sizeof shape - slen, "%s%.*s", slen ? " " : "", (int)f[i].n, f[i].s);
  }
  if (!shape_normalise(shape, r->rest, sizeof r->rest))
    return FAIL_AT(f[4].col, "the shape has too many fields (at most %d)", MAX_SHAPE_TOKENS);

  /* the variant, last */
  const Field *vf = &f[nf - 1];
  if (!variant_ok(vf)) {
    if (shape_token_ok(vf) && !memchr(vf->s, ':', vf->n))
      return FAIL_AT(vf->col, "the row ends with the shape field '%.*s': the variant token is missing", (int)vf->n,
                     vf->s);
    return FAIL_AT(vf->col, "expected a variant token (family or family:params, e.g. mma:bm=128,...), got '%.*s'",
                   (int)vf->n, vf->s);
  }
  if (!copy_field(vf, r->variant, sizeof r->variant))
    return FAIL_AT(vf->col, "the variant token is longer than %d characters", CG_VARIANT_LEN - 1);

  /* the note: the comment after the row, trimmed */
  if (hash) {
    const char *s = hash + 1, *e = line + len;
    while (s < e && (*s == ' ' || *s == '\t')) s++;
    while (e > s && (e[-1] == ' ' || e[-1] == '\t')) e--;
    size_t n = (size_t)(e - s);
    if (n >= sizeof r->note) n = sizeof r->note - 1; /* a note is for reading: a long one is cut */
    memcpy(r->note, s, n);
    r->note[n] = 0;
  }
  *out_row = true;
  return NULL;
}

#undef FAIL_AT

smelt_status cg_tune_table_parse(const char *text, size_t len, const char *path, CgTuneTable **out) {
  *out = NULL;
  if (!path) path = "<tuning table>";
  CgTuneTable *t = cg_tune_table_new();
  if (!t) return oom();
  int *line_of = NULL; /* per row: its line, for messages about duplicates */
  int line_cap = 0;
  int lineno = 0;
  smelt_status st = NULL;
  for (size_t pos = 0; pos < len && !st;) {
    lineno++;
    const char *nl = memchr(text + pos, '\n', len - pos);
    size_t end = nl ? (size_t)(nl - text) : len, n = end - pos;
    const char *line = text + pos;
    pos = nl ? end + 1 : len;
    if (n && line[n - 1] == '\r') n--;
    const char *nul = memchr(line, 0, n);
    if (nul) {
      st = st_at((SrcLoc){path, lineno, (int)(nul - line) + 1}, "unexpected NUL byte (the table is plain text)");
      break;
    }
    CgTuneRow r;
    bool is_row;
    st = parse_line(line, n, path, lineno, &r, &is_row);
    if (st || !is_row) continue;
    for (int i = 0; i < t->n && !st; i++)
      if (same_slot(&t->rows[i], &r))
        st = st_at((SrcLoc){path, lineno, 1},
                   "this row has the op, dtype, arch, rows and shape of line %d (one variant per shape and interval)",
                   line_of[i]);
    if (st) break;
    if (t->n == line_cap) {
      line_cap = line_cap ? line_cap * 2 : 16;
      int *p = realloc(line_of, sizeof *p * (size_t)line_cap);
      if (!p) {
        st = oom();
        break;
      }
      line_of = p;
    }
    line_of[t->n] = lineno;
    if (!append_row(t, &r)) st = oom();
  }
  free(line_of);
  if (st) {
    cg_tune_table_free(t);
    return st;
  }
  *out = t;
  return NULL;
}

smelt_status cg_tune_table_load(const char *path, CgTuneTable **out) {
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return st_error(ST_IO, "%s: error: cannot read the tuning table: %s", path, strerror(errno));
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : 65536;
      char *p = realloc(buf, cap);
      if (!p) {
        free(buf);
        fclose(f);
        return st_error(ST_NO_MEMORY, "%s: error: out of memory reading the tuning table", path);
      }
      buf = p;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
  }
  bool bad = ferror(f) != 0;
  fclose(f);
  if (bad) {
    free(buf);
    return st_error(ST_IO, "%s: error: read failed", path);
  }
  smelt_status st = cg_tune_table_parse(buf ? buf : "", len, path, out);
  free(buf);
  return st;
}

/* ---- printing ---- */

static int row_cmp(const void *pa, const void *pb) {
  const CgTuneRow *a = *(const CgTuneRow *const *)pa, *b = *(const CgTuneRow *const *)pb;
  int c = strcmp(a->op, b->op);
  if (!c) c = strcmp(a->dtype, b->dtype);
  if (!c) c = strcmp(a->arch, b->arch);
  if (!c) c = shape_cmp(a->rest, b->rest);
  if (!c) c = a->m_lo < b->m_lo ? -1 : a->m_lo > b->m_lo;
  if (!c) c = a->m_hi < b->m_hi ? -1 : a->m_hi > b->m_hi;
  return c;
}

static const char header[] =
    "# smelt tuning table: the kernel variant each matmul / attention shape gets\n"
    "# on a CUDA arch.\n"
    "#\n"
    "# Made by `smelt tune MODEL.yaml --target cuda`, which generates every\n"
    "# candidate variant of each tunable kernel of the model, checks its result\n"
    "# against the heuristic's, times it on the GPU and keeps the fastest; the\n"
    "# note after '#' is what was measured.  Read by `smelt compile --target cuda`\n"
    "# (--tune-table FILE; by default tuning/cuda.table).  Re-tuning replaces rows\n"
    "# of the same shape and interval and keeps the others; rows may be edited by\n"
    "# hand.\n"
    "#\n"
    "# Columns: op, dtype, arch; rows m=LO..HI (matmul M or attention query\n"
    "# length S, both ends included, the narrowest matching interval wins);\n"
    "# the shape (matched exactly, as a set of fields); the variant token.\n";

static int imax(int a, int b) { return a > b ? a : b; }

char *cg_tune_table_format(const CgTuneTable *t) {
  CuBuf b = {0};
  cu_buf_printf(&b, "%s", header);
  if (t->n == 0) return cu_buf_take(&b);
  const CgTuneRow **rows = malloc(sizeof *rows * (size_t)t->n);
  char (*rng)[48] = malloc(sizeof *rng * (size_t)t->n);
  if (!rows || !rng) {
    free(rows), free(rng);
    cu_buf_free(&b);
    return NULL;
  }
  for (int i = 0; i < t->n; i++) rows[i] = &t->rows[i];
  qsort(rows, (size_t)t->n, sizeof *rows, row_cmp);

  /* the column labels sit over their columns: the first one's "# " is part
   * of the op column's width */
  static const char *labels[] = {"# op", "dtype", "arch", "rows", "shape", "variant"};
  int w[6];
  for (int c = 0; c < 6; c++) w[c] = (int)strlen(labels[c]);
  for (int i = 0; i < t->n; i++) {
    const CgTuneRow *r = rows[i];
    snprintf(rng[i], sizeof rng[i], "m=%lld..%lld", (long long)r->m_lo, (long long)r->m_hi);
    w[0] = imax(w[0], (int)strlen(r->op));
    w[1] = imax(w[1], (int)strlen(r->dtype));
    w[2] = imax(w[2], (int)strlen(r->arch));
    w[3] = imax(w[3], (int)strlen(rng[i]));
    w[4] = imax(w[4], (int)strlen(r->rest));
    w[5] = imax(w[5], (int)strlen(r->variant));
  }
  cu_buf_printf(&b, "\n%-*s  %-*s  %-*s  %-*s  %-*s  %s\n", w[0], labels[0], w[1], labels[1], w[2], labels[2], w[3],
                labels[3], w[4], labels[4], labels[5]);
  for (int i = 0; i < t->n; i++) {
    const CgTuneRow *r = rows[i];
    /* a blank line between blocks of one op, dtype and arch */
    if (i > 0 && (strcmp(r->op, rows[i - 1]->op) || strcmp(r->dtype, rows[i - 1]->dtype) ||
                  strcmp(r->arch, rows[i - 1]->arch)))
      cu_buf_printf(&b, "\n");
    cu_buf_printf(&b, "%-*s  %-*s  %-*s  %-*s  %-*s  ", w[0], r->op, w[1], r->dtype, w[2], r->arch, w[3], rng[i], w[4],
                  r->rest);
    if (r->note[0]) cu_buf_printf(&b, "%-*s  # %s\n", w[5], r->variant, r->note);
    else cu_buf_printf(&b, "%s\n", r->variant);
  }
  free(rng);
  free(rows);
  return cu_buf_take(&b);
}

smelt_status cg_tune_table_save(const CgTuneTable *t, const char *path) {
  char *text = cg_tune_table_format(t);
  /* next to the target (rename does not cross file systems), named by the
   * process so that two tuners do not write into one temporary */
  size_t cap = strlen(path) + 32;
  char *tmp = text ? malloc(cap) : NULL;
  if (!tmp) {
    free(text);
    return oom();
  }
  size_t n = strlen(text);
  snprintf(tmp, cap, "%s.tmp.%ld", path, (long)getpid());
  smelt_status st = NULL;
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    st = st_error(ST_IO, "%s: error: cannot write the tuning table: %s", tmp, strerror(errno));
  } else {
    bool ok = fwrite(text, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (!ok) st = st_error(ST_IO, "%s: error: writing the tuning table failed", tmp);
    else if (rename(tmp, path) != 0)
      st = st_error(ST_IO, "%s: error: cannot replace the tuning table: %s", path, strerror(errno));
    if (st) unlink(tmp);
  }
  free(tmp);
  free(text);
  return st;
}

/* ---- merging and lookup ---- */

bool cg_tune_table_put(CgTuneTable *t, const CgTuneRow *r) {
  CgTuneRow row = *r;
  /* the row's own strings may not be NUL-terminated if the caller filled
   * them carelessly; terminate before reading */
  row.op[sizeof row.op - 1] = 0, row.dtype[sizeof row.dtype - 1] = 0, row.arch[sizeof row.arch - 1] = 0;
  row.rest[sizeof row.rest - 1] = 0, row.variant[sizeof row.variant - 1] = 0, row.note[sizeof row.note - 1] = 0;
  char norm[sizeof row.rest];
  if (shape_normalise(row.rest, norm, sizeof norm)) memcpy(row.rest, norm, sizeof norm);
  for (int i = 0; i < t->n; i++)
    if (same_slot(&t->rows[i], &row)) {
      t->rows[i] = row;
      return true;
    }
  return append_row(t, &row);
}

const CgTuneRow *cg_tune_lookup(const CgTuneTable *t, const char *arch, const CgTuneKey *key) {
  if (!t || !arch || !key) return NULL;
  char rest[sizeof key->rest];
  char raw[sizeof key->rest];
  snprintf(raw, sizeof raw, "%.*s", (int)strnlen(key->rest, sizeof key->rest), key->rest);
  if (!shape_normalise(raw, rest, sizeof rest)) return NULL;
  const CgTuneRow *best = NULL;
  for (int i = 0; i < t->n; i++) {
    const CgTuneRow *r = &t->rows[i];
    if (key->m < r->m_lo || key->m > r->m_hi) continue;
    if (strcmp(r->op, key->op) || strcmp(r->dtype, key->dtype) || strcmp(r->arch, arch) || strcmp(r->rest, rest))
      continue;
    if (!best || r->m_hi - r->m_lo < best->m_hi - best->m_lo) best = r;
  }
  return best;
}

void cg_tune_bucket(int64_t m, int64_t *out_lo, int64_t *out_hi) {
  if (m <= 1) {
    *out_lo = *out_hi = m < 1 ? 1 : m;
    return;
  }
  int64_t hi = 1;
  while (hi < m && hi <= INT64_MAX / 2) hi *= 2;
  if (hi < m) { /* beyond 2^62: one bucket up to the largest value */
    *out_lo = hi + 1, *out_hi = INT64_MAX;
    return;
  }
  *out_lo = hi / 2 + 1;
  *out_hi = hi;
}
