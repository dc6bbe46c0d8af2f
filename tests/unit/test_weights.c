/* Unit tests of the constants pool, the weights table and the CRC pieces
 * they rest on (format/constants.c, format/weights.c, format/bundle.c).
 *
 * - fmt_crc32c (three-lane hardware path) equals the portable table CRC on
 *   many lengths and alignments; fmt_crc32c_combine joins CRCs of parts.
 * - The pool: equal bytes get one offset (across calls, as across
 *   specialisations), offsets are multiples of 64, the section written from
 *   it holds each constant at its offset with zero padding.
 * - The weights table: encode/decode round trip; every proper prefix is
 *   refused; copies that read past their file, write past their tensor,
 *   overflow, name a missing file, or write more than the tensor holds are
 *   refused by name; opening assembles strided copies (an interleave) and
 *   uses an aligned contiguous tensor in place; a file of the wrong size or
 *   content is refused naming it, a missing one as not found. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/bundle.h"
#include "format/constants.h"
#include "format/weights.h"
#include "tests/unit/check.h"

static void test_crc(void) {
  enum { N = 300000 };
  unsigned char *buf = malloc(N + 64);
  for (int i = 0; i < N + 64; i++) buf[i] = (unsigned char)(i * 2654435761u >> 13);
  static const size_t lens[] = {0, 1, 7, 8, 63, 24575, 24576, 24577, 3 * 8192 * 4 + 5, N};
  for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
    for (int a = 0; a < 9; a++) CHECK(fmt_crc32c(0, buf + a, lens[k]) == fmt_crc32c_portable(0, buf + a, lens[k]));
  CHECK(fmt_crc32c(0, "123456789", 9) == 0xe3069283u);
  for (size_t cut = 0; cut <= N; cut += 37777) {
    uint32_t whole = fmt_crc32c(0, buf, N);
    uint32_t a = fmt_crc32c(0, buf, cut), b = fmt_crc32c(0, buf + cut, N - cut);
    CHECK(fmt_crc32c_combine(a, b, N - cut) == whole);
  }
  free(buf);
}

static void test_pool(void) {
  FmtConstPool *p;
  CHECK_OK(fmt_const_pool_create(&p));
  float a[10], b[10], c[3];
  for (int i = 0; i < 10; i++) a[i] = (float)i, b[i] = (float)i;
  c[0] = 1, c[1] = 2, c[2] = 3;
  uint64_t oa, ob, oc, oa2;
  CHECK_OK(fmt_const_pool_add(p, a, sizeof a, &oa));
  CHECK_OK(fmt_const_pool_add(p, c, sizeof c, &oc));
  CHECK_OK(fmt_const_pool_add(p, b, sizeof b, &ob)); /* same bytes elsewhere: deduplicated */
  b[3] = 7;
  CHECK_OK(fmt_const_pool_add(p, b, sizeof b, &oa2)); /* now different */
  CHECK(oa == 0 && ob == oa && oc == 64 && oa2 == 128);
  CHECK(fmt_const_pool_count(p) == 3 && fmt_const_pool_bytes(p) == 128 + sizeof b);
  /* many constants: the table grows, every duplicate is found */
  static int big[3000][4];
  uint64_t off[3000], again;
  for (int i = 0; i < 3000; i++) {
    big[i][0] = i;
    CHECK_OK(fmt_const_pool_add(p, big[i], sizeof big[i], &off[i]));
  }
  for (int i = 0; i < 3000; i += 7) {
    int copy[4] = {i, 0, 0, 0};
    CHECK_OK(fmt_const_pool_add(p, copy, sizeof copy, &again));
    CHECK(again == off[i] && off[i] % 64 == 0);
  }
  FmtWriter *w;
  CHECK_OK(fmt_writer_create(&w));
  CHECK_OK(fmt_const_pool_add_section(p, w, NULL));
  void *mem;
  size_t len;
  CHECK_OK(fmt_writer_to_memory(w, &mem, &len));
  FmtFile *f;
  CHECK_OK(fmt_file_open_memory(mem, len, "pool", &f));
  const void *blob;
  size_t blen;
  CHECK(f && fmt_file_find(f, FMT_SEC_CONSTANTS, "", &blob, &blen));
  if (f && blob) {
    CHECK(blen == fmt_const_pool_bytes(p));
    CHECK(memcmp((const char *)blob + oc, c, sizeof c) == 0 && memcmp((const char *)blob + oa2, b, sizeof b) == 0);
    CHECK(memcmp((const char *)blob + off[2999], big[2999], sizeof big[2999]) == 0);
    static const unsigned char zero[64];
    CHECK(memcmp((const char *)blob + oc + sizeof c, zero, 64 - sizeof c) == 0);
  }
  fmt_file_close(f);
  free(mem);
  fmt_writer_destroy(w);
  fmt_const_pool_destroy(p);
}

/* A weights file of 4096 bytes: byte i is i * 7. */
static const char *make_file(char *path) {
  snprintf(path, 64, "/tmp/smelt-test-weights-%d.bin", (int)getpid());
  FILE *f = fopen(path, "wb");
  for (int i = 0; i < 4096; i++) fputc((i * 7) & 0xff, f);
  fclose(f);
  return path;
}

static void expect_decode_fail(const FmtWeights *w, const char *want, int line) {
  void *buf;
  size_t len;
  CHECK_OK(fmt_weights_encode(w, &buf, &len));
  FmtWeights *d = NULL;
  smelt_status st = fmt_weights_decode(buf, len, &d);
  if (!st || !strstr(st_message(st), want)) {
    fprintf(stderr, "%s:%d: expected '%s', got '%s'\n", __FILE__, line, want, st ? st_message(st) : "success");
    check_failures++;
  }
  CHECK(!d);
  st_free(st);
  free(buf);
}
#define EXPECT_DECODE_FAIL(w, want) expect_decode_fail((w), (want), __LINE__)

static void test_weights(void) {
  char path[64];
  make_file(path);
  uint64_t size;
  uint32_t crc;
  CHECK_OK(fmt_weights_hash_file(path, &size, &crc));
  CHECK(size == 4096);
  FmtWeightsFile file = {"w.bin", path, size, crc};
  /* tensor 0: bytes 64..128 as they are (aligned: used in place);
   * tensor 1: two "weights" of 4 rows x 8 bytes interleaved row by row */
  FmtWeightsCopy copies[3] = {
      {.file = 0, .src = 64, .rows = 1, .cols = 1, .elem = 64},
      {.file = 0, .src = 1000, .dst = 0, .rows = 4, .cols = 1, .elem = 8, .src_row = 8, .dst_row = 16},
      {.file = 0, .src = 2001, .dst = 8, .rows = 4, .cols = 1, .elem = 8, .src_row = 8, .dst_row = 16},
  };
  FmtWeightsTensor tensors[2] = {{64, 0, 1}, {64, 1, 2}};
  FmtWeights w = {&file, 1, tensors, 2, copies, 3};
  void *buf;
  size_t len;
  CHECK_OK(fmt_weights_encode(&w, &buf, &len));
  FmtWeights *d = NULL;
  CHECK_OK(fmt_weights_decode(buf, len, &d));
  CHECK(d && d->nfiles == 1 && d->ntensors == 2 && d->ncopies == 3 && strcmp(d->files[0].name, "w.bin") == 0);
  int accepted = 0;
  for (size_t n = 0; n < len; n++) {
    unsigned char *b = malloc(n ? n : 1);
    memcpy(b, buf, n);
    FmtWeights *t = NULL;
    smelt_status st = fmt_weights_decode(b, n, &t);
    if (!st) accepted++;
    fmt_weights_free(t);
    st_free(st);
    free(b);
  }
  CHECK(accepted == 0);
  free(buf);
  if (d) {
    FmtWeightsSet *s = NULL;
    CHECK_OK(fmt_weights_open(d, "/nowhere/bundle.smelt", &s));
    if (s) {
      const unsigned char *t0 = fmt_weights_set_data(s)[0], *t1 = fmt_weights_set_data(s)[1];
      CHECK((uintptr_t)t0 % 64 == 0 && (uintptr_t)t1 % 64 == 0);
      CHECK(fmt_weights_set_copied_bytes(s) == 64); /* tensor 0 in place */
      for (int i = 0; i < 64; i++) CHECK(t0[i] == (unsigned char)((64 + i) * 7));
      for (int r = 0; r < 4; r++)
        for (int k = 0; k < 8; k++) {
          CHECK(t1[16 * r + k] == (unsigned char)((1000 + 8 * r + k) * 7));
          CHECK(t1[16 * r + 8 + k] == (unsigned char)((2001 + 8 * r + k) * 7));
        }
      fmt_weights_close(s);
    }
    /* another content, same size: refused by name */
    d->files[0].crc ^= 1;
    FmtWeightsSet *s2 = NULL;
    smelt_status st = fmt_weights_open(d, "b.smelt", &s2);
    CHECK(st && strstr(st_message(st), path) && strstr(st_message(st), "not the one the bundle was compiled with"));
    st_free(st);
    d->files[0].crc ^= 1;
    d->files[0].size += 1;
    st = fmt_weights_open(d, "b.smelt", &s2);
    CHECK(st && strstr(st_message(st), "4096 bytes"));
    st_free(st);
    d->files[0].size -= 1;
    unlink(path);
    st = fmt_weights_open(d, "b.smelt", &s2);
    CHECK(st && strstr(st_message(st), "not found") && strstr(st_message(st), "w.bin"));
    st_free(st);
    CHECK(!s2);
  }
  /* a zero-byte tensor is the only one to assemble: no region is mapped,
   * and its pointer must still be a valid one (UBSan: NULL + 0; fuzz_bundle_crc) */
  if (d) {
    FmtWeightsTensor empty = {0, 0, 0};
    FmtWeights z = {d->files, 1, &empty, 1, d->copies, 0};
    make_file(path);
    FmtWeightsSet *s = NULL;
    CHECK_OK(fmt_weights_open(&z, "/nowhere/bundle.smelt", &s));
    CHECK(s && fmt_weights_set_count(s) == 1 && fmt_weights_set_data(s)[0] != NULL && fmt_weights_set_sizes(s)[0] == 0);
    fmt_weights_close(s);
    fmt_weights_free(d);
  }
  unlink(path);

  /* hostile tables */
  FmtWeightsCopy c = {.file = 0, .src = 4000, .rows = 1, .cols = 1, .elem = 97};
  FmtWeightsTensor t = {128, 0, 1};
  FmtWeights h = {&file, 1, &t, 1, &c, 1};
  EXPECT_DECODE_FAIL(&h, "reads past the end of 'w.bin'");
  c = (FmtWeightsCopy){.file = 0, .src = 0, .dst = 100, .rows = 1, .cols = 1, .elem = 64};
  EXPECT_DECODE_FAIL(&h, "writes past the tensor's 128 bytes");
  c = (FmtWeightsCopy){.file = 1, .rows = 1, .cols = 1, .elem = 4};
  EXPECT_DECODE_FAIL(&h, "file 1 of 1");
  c = (FmtWeightsCopy){.file = 0, .rows = UINT64_MAX / 2, .cols = 4, .elem = 1, .src_row = 1};
  EXPECT_DECODE_FAIL(&h, "write more than");
  c = (FmtWeightsCopy){.file = 0, .rows = 2, .cols = 1, .elem = 1, .src_row = UINT64_MAX / 2 + 1};
  EXPECT_DECODE_FAIL(&h, "reads past the end");
  c = (FmtWeightsCopy){.file = 0, .rows = 1, .cols = 1, .elem = 8};
  t = (FmtWeightsTensor){128, 0, 2};
  EXPECT_DECODE_FAIL(&h, "copies 0..2 of 1");
  /* two copies each within bounds but writing more than the tensor holds */
  FmtWeightsCopy two[2] = {{.file = 0, .rows = 1, .cols = 1, .elem = 100}, {.file = 0, .rows = 1, .cols = 1, .elem = 100}};
  FmtWeightsTensor t2 = {128, 0, 2};
  FmtWeights h2 = {&file, 1, &t2, 1, two, 2};
  EXPECT_DECODE_FAIL(&h2, "write more than its 128 bytes");
}

int main(void) {
  test_crc();
  test_pool();
  test_weights();
  return check_done("test_weights");
}
