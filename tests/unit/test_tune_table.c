/* The tuning table (codegen/cuda/table.h) without a GPU: the buckets of
 * M; parsing a hand-written table (comments, blank lines, CRLF, tabs,
 * shape fields in any order) into the rows it says; lookup (shapes as
 * sets, the narrowest interval wins, every key field must match); put
 * (replaces the same shape and interval, adds others); the printed text
 * against a golden copy (sorted, numbers by value, aligned columns, notes
 * after '#') and parse(format(t)) == t; save and load through a file and
 * the errors of both; and malformed tables, each rejected with
 * file:line:col naming the field at fault. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cuda/table.h"
#include "tests/unit/check.h"

static void test_bucket(void) {
  static const int64_t cases[][3] = {{1, 1, 1},     {2, 2, 2},       {3, 3, 4},       {4, 3, 4},
                                     {5, 5, 8},     {8, 5, 8},       {9, 9, 16},      {1000, 513, 1024},
                                     {2048, 1025, 2048}, {2049, 2049, 4096}, {4096, 2049, 4096}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t lo = -1, hi = -1;
    cg_tune_bucket(cases[i][0], &lo, &hi);
    if (lo != cases[i][1] || hi != cases[i][2])
      fprintf(stderr, "bucket(%lld) = %lld..%lld, want %lld..%lld\n", (long long)cases[i][0], (long long)lo,
              (long long)hi, (long long)cases[i][1], (long long)cases[i][2]);
    CHECK(lo == cases[i][1] && hi == cases[i][2]);
    CHECK(lo <= cases[i][0] && cases[i][0] <= hi);
  }
  /* buckets tile the numbers: each starts right after the previous one */
  int64_t prev_hi = 0;
  for (int64_t m = 1; m <= 70000; m++) {
    int64_t lo, hi;
    cg_tune_bucket(m, &lo, &hi);
    if (lo != m) continue;
    CHECK(lo == prev_hi + 1);
    prev_hi = hi;
  }
}

static const char sample[] =
    "# a hand-written table\n"
    "\n"
    "matmul f16 sm_90a m=1..1 N=11008 K=4096 Z=1 tb=1 gemv:w=4,c=2,u=4,sk=1   # 0.0312 ms, 83% of 4280 GB/s\r\n"
    "  matmul\tf16  sm_90a   m=2..8   tb=1 Z=1 K=4096 N=11008    gemv:w=8,c=1,u=2,sk=2\n"
    "matmul f16 sm_90a m=1025..2048 K=4096 N=11008 Z=1 tb=1 wgmma:bm=128,bn=256,bk=64,st=4 #412 TFLOP/s  \n"
    "matmul f16 sm_90a m=1..4096 K=4096 N=11008 Z=1 tb=1 mma:bm=128,bn=128,bk=32,wm=64,wn=32,st=3,sk=1\n"
    "matmul f16 sm_80 m=1..1 K=4096 N=11008 Z=1 tb=1 gemv:w=4,c=4,u=2,sk=1\n"
    "attention f16 sm_90a m=2048..2048 T=2048 D=128 H=32 Hkv=32 causal=1 flash:bm=128,bn=64\n"
    "matmul bf16 sm_90a m=1..1 K=4096 N=4096 Z=1 tb=1 simple\n"
    "# the end"; /* no newline at the end */

static CgTuneKey key(const char *op, const char *dt, int64_t m, const char *rest) {
  CgTuneKey k;
  memset(&k, 0, sizeof k);
  snprintf(k.op, sizeof k.op, "%s", op);
  snprintf(k.dtype, sizeof k.dtype, "%s", dt);
  k.m = m;
  snprintf(k.rest, sizeof k.rest, "%s", rest);
  return k;
}

static const char *variant_for(const CgTuneTable *t, const char *arch, const char *op, const char *dt, int64_t m,
                               const char *rest) {
  CgTuneKey k = key(op, dt, m, rest);
  const CgTuneRow *r = cg_tune_lookup(t, arch, &k);
  return r ? r->variant : NULL;
}

static bool streq(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

static void test_parse_and_lookup(void) {
  CgTuneTable *t = NULL;
  CHECK_OK(cg_tune_table_parse(sample, strlen(sample), "sample.table", &t));
  if (!t) return;
  CHECK(t->n == 7);
  const CgTuneRow *r = &t->rows[0];
  CHECK(streq(r->op, "matmul") && streq(r->dtype, "f16") && streq(r->arch, "sm_90a"));
  CHECK(r->m_lo == 1 && r->m_hi == 1);
  CHECK(streq(r->rest, "K=4096 N=11008 Z=1 tb=1")); /* normalised: sorted by name */
  CHECK(streq(r->variant, "gemv:w=4,c=2,u=4,sk=1"));
  CHECK(streq(r->note, "0.0312 ms, 83% of 4280 GB/s")); /* the CR of CRLF is not part of it */
  CHECK(streq(t->rows[1].rest, "K=4096 N=11008 Z=1 tb=1") && t->rows[1].note[0] == 0);
  CHECK(t->rows[1].m_lo == 2 && t->rows[1].m_hi == 8);
  CHECK(streq(t->rows[2].note, "412 TFLOP/s"));
  CHECK(streq(t->rows[5].rest, "D=128 H=32 Hkv=32 T=2048 causal=1"));
  CHECK(streq(t->rows[6].variant, "simple"));

  const char *mm = "N=11008 K=4096 Z=1 tb=1"; /* the order cg_cuda_tune_key writes */
  CHECK(streq(variant_for(t, "sm_90a", "matmul", "f16", 1, mm), "gemv:w=4,c=2,u=4,sk=1"));
  /* 5 is in 2..8 and in 1..4096: the narrower wins */
  CHECK(streq(variant_for(t, "sm_90a", "matmul", "f16", 5, mm), "gemv:w=8,c=1,u=2,sk=2"));
  CHECK(streq(variant_for(t, "sm_90a", "matmul", "f16", 2048, mm), "wgmma:bm=128,bn=256,bk=64,st=4"));
  CHECK(streq(variant_for(t, "sm_90a", "matmul", "f16", 300, mm), "mma:bm=128,bn=128,bk=32,wm=64,wn=32,st=3,sk=1"));
  CHECK(variant_for(t, "sm_90a", "matmul", "f16", 4097, mm) == NULL);
  CHECK(streq(variant_for(t, "sm_80", "matmul", "f16", 1, mm), "gemv:w=4,c=4,u=2,sk=1"));
  CHECK(variant_for(t, "sm_80", "matmul", "f16", 2, mm) == NULL);
  CHECK(variant_for(t, "sm_90", "matmul", "f16", 1, mm) == NULL); /* arch matches exactly */
  CHECK(variant_for(t, "sm_90a", "matmul", "bf16", 1, mm) == NULL);
  CHECK(variant_for(t, "sm_90a", "matmul", "f16", 1, "N=11008 K=4096 Z=2 tb=1") == NULL);
  CHECK(variant_for(t, "sm_90a", "matmul", "f16", 1, "N=11008 K=4096 Z=1") == NULL); /* a subset is not the shape */
  CHECK(variant_for(t, "sm_90a", "matmul", "f16", 1, "N=11008 K=4096 Z=1 tb=1 x=1") == NULL);
  CHECK(streq(variant_for(t, "sm_90a", "attention", "f16", 2048, "T=2048 D=128 H=32 Hkv=32 causal=1"),
              "flash:bm=128,bn=64"));
  CHECK(variant_for(t, "sm_90a", "attention", "f16", 2047, "T=2048 D=128 H=32 Hkv=32 causal=1") == NULL);
  CHECK(streq(variant_for(t, "sm_90a", "matmul", "bf16", 1, "tb=1   Z=1 N=4096 K=4096"), "simple"));
  CHECK(cg_tune_lookup(NULL, "sm_90a", &(CgTuneKey){"matmul", "f16", 1, "N=1"}) == NULL);
  cg_tune_table_free(t);

  /* an empty text, and one of comments only, are empty tables */
  CHECK_OK(cg_tune_table_parse("", 0, "empty.table", &t));
  CHECK(t && t->n == 0);
  cg_tune_table_free(t);
  const char *comments = "# nothing\n\n   # at all\n";
  CHECK_OK(cg_tune_table_parse(comments, strlen(comments), "comments.table", &t));
  CHECK(t && t->n == 0);
  cg_tune_table_free(t);
}

static CgTuneRow row(const char *op, const char *dt, const char *arch, int64_t lo, int64_t hi, const char *rest,
                     const char *variant, const char *note) {
  CgTuneRow r;
  memset(&r, 0, sizeof r);
  snprintf(r.op, sizeof r.op, "%s", op);
  snprintf(r.dtype, sizeof r.dtype, "%s", dt);
  snprintf(r.arch, sizeof r.arch, "%s", arch);
  r.m_lo = lo, r.m_hi = hi;
  snprintf(r.rest, sizeof r.rest, "%s", rest);
  snprintf(r.variant, sizeof r.variant, "%s", variant);
  snprintf(r.note, sizeof r.note, "%s", note);
  return r;
}

static bool rows_equal(const CgTuneRow *a, const CgTuneRow *b) {
  return streq(a->op, b->op) && streq(a->dtype, b->dtype) && streq(a->arch, b->arch) && a->m_lo == b->m_lo &&
         a->m_hi == b->m_hi && streq(a->rest, b->rest) && streq(a->variant, b->variant) && streq(a->note, b->note);
}

/* Every row of a is in b and the counts agree (row order aside). */
static bool tables_equal(const CgTuneTable *a, const CgTuneTable *b) {
  if (a->n != b->n) return false;
  for (int i = 0; i < a->n; i++) {
    bool found = false;
    for (int j = 0; j < b->n && !found; j++) found = rows_equal(&a->rows[i], &b->rows[j]);
    if (!found) return false;
  }
  return true;
}

static const char golden_rows[] =
    "\n"
    "# op       dtype  arch    rows          shape                             variant\n"
    "attention  f16    sm_90a  m=1..1        D=128 H=32 Hkv=8 T=4096 causal=1  flashdec:sp=16\n"
    "\n"
    "matmul     f16    sm_80   m=1..1        K=4096 N=11008 Z=1 tb=1           gemv:w=4             # 0.05 ms\n"
    "\n"
    "matmul     f16    sm_90a  m=1..1        K=4096 N=4096 Z=1 tb=1            gemv:w=2             # 0.01 ms\n"
    "matmul     f16    sm_90a  m=1..1        K=4096 N=11008 Z=1 tb=1           gemv:w=4,c=2         # 0.0312 ms, 83% of 4280 GB/s\n"
    "matmul     f16    sm_90a  m=3..4        K=4096 N=11008 Z=1 tb=1           gemv:w=8\n"
    "matmul     f16    sm_90a  m=1025..2048  K=4096 N=11008 Z=1 tb=1           wgmma:bm=128,bn=256  # 412 TFLOP/s\n";

static void test_put_format_roundtrip(void) {
  CgTuneTable *t = cg_tune_table_new();
  /* put out of order, shapes in cg_cuda_tune_key's order */
  CgTuneRow rs[] = {
      row("matmul", "f16", "sm_90a", 1025, 2048, "N=11008 K=4096 Z=1 tb=1", "wgmma:bm=128,bn=256", "412 TFLOP/s"),
      row("matmul", "f16", "sm_90a", 1, 1, "N=11008 K=4096 Z=1 tb=1", "gemv:w=1", "stale"),
      row("attention", "f16", "sm_90a", 1, 1, "T=4096 D=128 H=32 Hkv=8 causal=1", "flashdec:sp=16", ""),
      row("matmul", "f16", "sm_90a", 3, 4, "N=11008 K=4096 Z=1 tb=1", "gemv:w=8", ""),
      row("matmul", "f16", "sm_80", 1, 1, "N=11008 K=4096 Z=1 tb=1", "gemv:w=4", "0.05 ms"),
      row("matmul", "f16", "sm_90a", 1, 1, "N=4096 K=4096 Z=1 tb=1", "gemv:w=2", "0.01 ms"),
      /* the same shape and interval as the second: replaces it */
      row("matmul", "f16", "sm_90a", 1, 1, "tb=1 Z=1 K=4096 N=11008", "gemv:w=4,c=2", "0.0312 ms, 83% of 4280 GB/s"),
  };
  for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) cg_tune_table_put(t, &rs[i]);
  CHECK(t->n == 6);
  CgTuneKey k = key("matmul", "f16", 1, "N=11008 K=4096 Z=1 tb=1");
  const CgTuneRow *hit = cg_tune_lookup(t, "sm_90a", &k);
  CHECK(hit && streq(hit->variant, "gemv:w=4,c=2") && streq(hit->note, "0.0312 ms, 83% of 4280 GB/s"));

  char *text = cg_tune_table_format(t);
  CHECK(strncmp(text, "# smelt tuning table", 20) == 0);
  const char *rows_at = strstr(text, "\n\n# op");
  CHECK(rows_at != NULL);
  if (rows_at && strcmp(rows_at + 1, golden_rows) != 0)
    fprintf(stderr, "formatted table:\n%s\nwanted rows:\n%s", rows_at + 1, golden_rows);
  CHECK(rows_at && strcmp(rows_at + 1, golden_rows) == 0);
  /* no line ends in blanks */
  for (const char *p = text; (p = strchr(p, '\n')); p++) CHECK(p == text || (p[-1] != ' ' && p[-1] != '\t'));

  CgTuneTable *back = NULL;
  CHECK_OK(cg_tune_table_parse(text, strlen(text), "formatted.table", &back));
  CHECK(back && tables_equal(t, back));
  char *again = back ? cg_tune_table_format(back) : NULL;
  CHECK(again && strcmp(text, again) == 0); /* printing is a fixed point */
  free(again);
  cg_tune_table_free(back);

  /* the header alone when there are no rows, and that parses to nothing */
  CgTuneTable *empty = cg_tune_table_new();
  char *etext = cg_tune_table_format(empty);
  CHECK(strncmp(etext, "# smelt tuning table", 20) == 0 && !strstr(etext, "# op"));
  CgTuneTable *eback = NULL;
  CHECK_OK(cg_tune_table_parse(etext, strlen(etext), "empty.table", &eback));
  CHECK(eback && eback->n == 0);
  cg_tune_table_free(eback);
  free(etext);
  cg_tune_table_free(empty);

  /* save and load */
  char dir[] = "/tmp/smelt-tune-table-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256];
  snprintf(path, sizeof path, "%s/cuda.table", dir);
  CHECK_OK(cg_tune_table_save(t, path));
  CgTuneTable *loaded = NULL;
  CHECK_OK(cg_tune_table_load(path, &loaded));
  CHECK(loaded && tables_equal(t, loaded));
  /* saving again replaces the file whole, leaving no temporary behind */
  if (loaded) {
    CgTuneRow extra = row("matmul", "f16", "sm_90a", 5, 8, "N=11008 K=4096 Z=1 tb=1", "gemv:w=16", "");
    cg_tune_table_put(loaded, &extra);
    CHECK_OK(cg_tune_table_save(loaded, path));
    CgTuneTable *l2 = NULL;
    CHECK_OK(cg_tune_table_load(path, &l2));
    CHECK(l2 && l2->n == 7 && tables_equal(loaded, l2));
    cg_tune_table_free(l2);
  }
  char listing[512];
  snprintf(listing, sizeof listing, "ls -A %s | wc -l", dir);
  FILE *ls = popen(listing, "r");
  int files = -1;
  if (ls) {
    if (fscanf(ls, "%d", &files) != 1) files = -1;
    pclose(ls);
  }
  CHECK(files == 1);
  cg_tune_table_free(loaded);
  unlink(path);
  rmdir(dir);

  /* a missing file and an unwritable place are I/O errors naming the path */
  CgTuneTable *none = NULL;
  smelt_status st = cg_tune_table_load("/nonexistent/dir/cuda.table", &none);
  CHECK(st && st_code(st) == ST_IO && strstr(st_message(st), "/nonexistent/dir/cuda.table") && none == NULL);
  st_free(st);
  st = cg_tune_table_save(t, "/nonexistent/dir/cuda.table");
  CHECK(st && st_code(st) == ST_IO && strstr(st_message(st), "/nonexistent/dir/cuda.table"));
  st_free(st);

  free(text);
  cg_tune_table_free(t);
}

/* text must fail with a message starting `want` ("bad.table:L:C: error: ")
 * and containing `words`. */
static void expect_bad(const char *text, size_t len, const char *want, const char *words) {
  CgTuneTable *t = NULL;
  smelt_status st = cg_tune_table_parse(text, len, "bad.table", &t);
  CHECK(st != NULL && t == NULL);
  if (!st) {
    fprintf(stderr, "accepted: %s\n", text);
    cg_tune_table_free(t);
    return;
  }
  CHECK(st_code(st) == ST_INVALID_INPUT);
  const char *msg = st_message(st);
  bool ok = strncmp(msg, want, strlen(want)) == 0 && strstr(msg, words) != NULL;
  if (!ok) fprintf(stderr, "message '%s'\n  wanted '%s...%s'\n", msg, want, words);
  CHECK(ok);
  st_free(st);
}

#define BAD(text, want, words) expect_bad(text, sizeof(text) - 1, want, words)

static void test_malformed(void) {
  BAD("# header\nmatmull f16 sm_90a m=1..1 N=64 gemv:w=4\n", "bad.table:2:1: error: ", "unknown op 'matmull'");
  BAD("matmul f61 sm_90a m=1..1 N=64 gemv:w=4\n", "bad.table:1:8: error: ", "unknown dtype 'f61'");
  BAD("matmul  f16  sm90a m=1..1 N=64 gemv:w=4\n", "bad.table:1:14: error: ", "'sm90a' is not a CUDA arch");
  BAD("matmul f16 sm_90a M=1..1 N=64 gemv:w=4\n", "bad.table:1:19: error: ", "m=LO..HI");
  BAD("matmul f16 sm_90a m=1-4 N=64 gemv:w=4\n", "bad.table:1:19: error: ", "m=LO..HI");
  BAD("matmul f16 sm_90a m=1.. N=64 gemv:w=4\n", "bad.table:1:19: error: ", "m=LO..HI");
  BAD("matmul f16 sm_90a m=-1..4 N=64 gemv:w=4\n", "bad.table:1:19: error: ", "m=LO..HI");
  BAD("matmul f16 sm_90a m=0..4 N=64 gemv:w=4\n", "bad.table:1:21: error: ", "start at 1");
  BAD("matmul f16 sm_90a m=8..4 N=64 gemv:w=4\n", "bad.table:1:19: error: ", "empty interval m=8..4");
  BAD("matmul f16 sm_90a m=1..1 N=64 K4096 gemv:w=4\n", "bad.table:1:31: error: ", "NAME=VALUE");
  BAD("matmul f16 sm_90a m=1..1 N= gemv:w=4\n", "bad.table:1:26: error: ", "NAME=VALUE");
  BAD("matmul f16 sm_90a m=1..1 =4 gemv:w=4\n", "bad.table:1:26: error: ", "NAME=VALUE");
  BAD("matmul f16 sm_90a m=1..1 N=64 K=64 N=128 gemv:w=4\n", "bad.table:1:36: error: ",
      "shape field 'N' given twice (also at column 26)");
  BAD("matmul f16 sm_90a m=1..1 N=64 K=64\n", "bad.table:1:31: error: ", "the variant token is missing");
  BAD("matmul f16 sm_90a m=1..1 N=64 mma:bm=128;st=3\n", "bad.table:1:31: error: ", "expected a variant token");
  BAD("matmul f16 sm_90a m=1..1 N=64 Mma:bm=128\n", "bad.table:1:31: error: ", "expected a variant token");
  BAD("matmul f16 sm_90a m=1..1 N=64 mma:\n", "bad.table:1:31: error: ", "expected a variant token");
  BAD("matmul f16 sm_90a m=1..1\n", "bad.table:1:1: error: ", "this line has 4 fields");
  BAD("\n\n  matmul   # just an op\n", "bad.table:3:3: error: ", "this line has 1 field");
  BAD("matmul f16 sm_90a m=1..1 N=64 gemv:w=4\n"
      "matmul f16 sm_90a m=2..2 N=64 gemv:w=4\n"
      "matmul f16 sm_90a m=1..1 N=64 gemv:w=8  # again\n",
      "bad.table:3:1: error: ", "of line 1");
  BAD("matmul f16 sm_90a m=1..1 N=64 K=8 gemv:w=4\n"
      "matmul f16 sm_90a m=1..1 K=8  N=64 gemv:w=8\n",
      "bad.table:2:1: error: ", "of line 1"); /* the same shape written in another order */
  BAD("matmul f16 sm_90a m=1..1 N=64 gemv:w=4\nmatmul f16 sm_90a m=2..2 N=6\x01 gemv:w=4\n", "bad.table:2:29: error: ",
      "unexpected byte 0x01");
  BAD("matmul f16 sm_90a m=1..1 N=64 gemv:w=4\nmatmul f16 sm\0_90a m=2..2 N=64 gemv:w=4\n", "bad.table:2:14: error: ",
      "NUL byte");
  BAD("matmul f16 sm_90a m=1..1 N=64 mma:bm=128,bn=128,bk=32,wm=64,wn=32,st=3,sk=1,xx=1,yy=2,zz=3,aa=4,bb=5,cc=6,dd=7,ee=8,ff=9,gg=10,hh=11\n",
      "bad.table:1:31: error: ", "longer than 95");
  BAD("matmul f16 sm_90a m=1..99999999999999999999 N=64 gemv:w=4\n", "bad.table:1:19: error: ", "m=LO..HI");
  BAD("averylongopname_x f16 sm_90a m=1..1 N=64 gemv:w=4\n", "bad.table:1:1: error: ", "unknown op");

  /* a table file that does not parse: the error names the file */
  char dir[] = "/tmp/smelt-tune-bad-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256];
  snprintf(path, sizeof path, "%s/my.table", dir);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (f) {
    fputs("# mine\nmatmul f16 sm_90a m=1..1 N=64\n", f);
    fclose(f);
    CgTuneTable *t = NULL;
    smelt_status st = cg_tune_table_load(path, &t);
    char want[300];
    snprintf(want, sizeof want, "%s:2:26: error: ", path);
    CHECK(st && strncmp(st_message(st), want, strlen(want)) == 0 && t == NULL);
    if (st && strncmp(st_message(st), want, strlen(want)) != 0) fprintf(stderr, "message '%s'\n", st_message(st));
    st_free(st);
    unlink(path);
  }
  rmdir(dir);
}

int main(void) {
  test_bucket();
  test_parse_and_lookup();
  test_put_format_roundtrip();
  test_malformed();
  return check_done("test_tune_table");
}
