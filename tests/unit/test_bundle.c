/* Unit tests of the bundle container (runtime/bundle.c).
 *
 * CRC-32C against its published check value, the hardware path against the
 * portable one.  A bundle with several sections (text, binary, an empty one,
 * two cubins told apart by name) is written to a fresh directory under /tmp,
 * read back from the file and from memory, and compared section by section;
 * the write must be atomic (no temporary file left, an existing file
 * replaced).  Then the image is damaged in every way the loader promises to
 * catch, and each damage must be rejected with its own message, checked by
 * substring: truncations, an extra byte, bad magic, a newer version, an
 * absurd section count, offsets past the end, misaligned and overlapping
 * sections, names without NUL, unknown kinds and flags, duplicate names,
 * flipped payload, padding and checksum bytes, an empty file and garbage.
 * Finally every single-byte change and every truncation of the image must be
 * rejected: every byte of a bundle is either checked or checksummed. */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/bundle.h"
#include "tests/unit/check.h"

/* Field offsets, as documented in bundle.h. */
enum { H_VERSION = 8, H_COUNT = 12, H_SIZE = 16, H_CHECKSUM = 24 };
enum { E_KIND = 0, E_FLAGS = 4, E_NAME = 8, E_OFFSET = 64, E_SIZE = 72, E_CHECKSUM = 80 };

static uint64_t rng_state = 0x243f6a8885a308d3u;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static void put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void test_crc(void) {
  CHECK(fmt_crc32c(0, "123456789", 9) == 0xe3069283u);
  CHECK(fmt_crc32c_portable(0, "123456789", 9) == 0xe3069283u);
  CHECK(fmt_crc32c(0, "", 0) == 0);
  unsigned char buf[1100];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)rng();
  int bad = 0;
  /* every start alignment and many lengths, and chaining in two parts */
  for (size_t off = 0; off < 9; off++)
    for (size_t n = 0; n + off <= sizeof buf; n += 1 + n / 7) {
      uint32_t want = fmt_crc32c_portable(0, buf + off, n);
      if (fmt_crc32c(0, buf + off, n) != want) bad++;
      size_t cut = n / 3;
      if (fmt_crc32c(fmt_crc32c(0, buf + off, cut), buf + off + cut, n - cut) != want) bad++;
    }
  CHECK(bad == 0);
}

/* The sections of the sample bundle. */
typedef struct {
  FmtSectionKind kind;
  const char *name;
  unsigned char *data;
  size_t len;
} Sec;

enum { NSEC = 7 };
static Sec sample[NSEC];

static void make_sample(void) {
  static const char manifest[] = "smelt=0.1.0\noptions=--target cpu\nllvm=18.1.8\n";
  static const char ir[] = "graph tiny {\n  input x: f32[4]\n  output x\n}\n";
  size_t sizes[NSEC] = {sizeof manifest - 1, sizeof ir - 1, 700, 0, 1000, 333, 64};
  FmtSectionKind kinds[NSEC] = {FMT_SEC_MANIFEST, FMT_SEC_IR_TEXT,    FMT_SEC_GRAPH, FMT_SEC_PTX,
                               FMT_SEC_CUBIN,    FMT_SEC_CPU_OBJECT, FMT_SEC_CUBIN};
  const char *names[NSEC] = {"", "", "model-graph", "empty", "sm_90a", "x86_64-unknown-linux-gnu/znver4", "sm_80"};
  for (int i = 0; i < NSEC; i++) {
    sample[i] = (Sec){kinds[i], names[i], malloc(sizes[i] + 1), sizes[i]};
    for (size_t k = 0; k < sizes[i]; k++) sample[i].data[k] = (unsigned char)rng();
  }
  memcpy(sample[0].data, manifest, sizes[0]);
  memcpy(sample[1].data, ir, sizes[1]);
}

static FmtWriter *sample_writer(void) {
  FmtWriter *w = NULL;
  CHECK_OK(fmt_writer_create(&w));
  for (int i = 0; w && i < NSEC; i++)
    CHECK_OK(fmt_writer_add(w, sample[i].kind, sample[i].name, sample[i].data, sample[i].len));
  return w;
}

/* The bundle holds exactly the sample's sections, aligned. */
static void check_contents(const FmtFile *b) {
  CHECK(fmt_file_section_count(b) == NSEC);
  for (int i = 0; i < NSEC && i < fmt_file_section_count(b); i++) {
    const FmtSection *s = fmt_file_section_at(b, i);
    CHECK(s->kind == sample[i].kind && strcmp(s->name, sample[i].name) == 0 && s->flags == 0);
    CHECK(s->size == sample[i].len && memcmp(s->data, sample[i].data, s->size) == 0);
    CHECK((uintptr_t)s->data % FMT_BUNDLE_ALIGN == 0);
  }
  CHECK(fmt_file_section_at(b, NSEC) == NULL && fmt_file_section_at(b, -1) == NULL);
  const void *p;
  size_t n;
  CHECK(fmt_file_find(b, FMT_SEC_CUBIN, NULL, &p, &n) && n == sample[4].len); /* first of kind */
  CHECK(fmt_file_find(b, FMT_SEC_CUBIN, "sm_80", &p, &n) && n == 64 && memcmp(p, sample[6].data, 64) == 0);
  CHECK(fmt_file_find(b, FMT_SEC_PTX, "empty", &p, &n) && n == 0);
  CHECK(!fmt_file_find(b, FMT_SEC_CUBIN, "sm_70", &p, &n) && p == NULL && n == 0);
  CHECK(!fmt_file_find(b, FMT_SEC_TUNING, NULL, &p, &n));
}

static char tmpdir[64];
static char path[128];

static int count_dir_entries(void) {
  DIR *d = opendir(tmpdir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  if (d) closedir(d);
  return n;
}

static unsigned char *read_file(const char *p, size_t *len) {
  FILE *f = fopen(p, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)n + 1);
  *len = fread(buf, 1, (size_t)n, f);
  fclose(f);
  return buf;
}

static void write_file(const char *p, const void *data, size_t len) {
  FILE *f = fopen(p, "wb");
  CHECK(f != NULL);
  if (!f) return;
  CHECK(fwrite(data, 1, len, f) == len);
  fclose(f);
}

/* Writes the sample to disk, reads it back both ways; returns the image. */
static unsigned char *test_write_read(size_t *out_len) {
  FmtWriter *w = sample_writer();
  if (!w) return NULL;
  /* the writer refuses duplicates, long names and unknown kinds */
  smelt_status st = fmt_writer_add(w, FMT_SEC_CUBIN, "sm_80", "x", 1);
  CHECK(st && strstr(st_message(st), "two cubin sections named 'sm_80'"));
  st_free(st);
  char longname[80];
  memset(longname, 'n', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  st = fmt_writer_add(w, FMT_SEC_PTX, longname, "x", 1);
  CHECK(st && strstr(st_message(st), "longer than 55 bytes"));
  st_free(st);
  st = fmt_writer_add(w, (FmtSectionKind)99, "x", "x", 1);
  CHECK(st && strstr(st_message(st), "unknown section kind 99"));
  st_free(st);

  write_file(path, "old contents", 12); /* replaced atomically */
  CHECK_OK(fmt_writer_write(w, path));
  CHECK(count_dir_entries() == 1); /* no temporary file left behind */
  void *mem = NULL;
  size_t len = 0;
  CHECK_OK(fmt_writer_to_memory(w, &mem, &len));
  fmt_writer_destroy(w);
  size_t flen = 0;
  unsigned char *file = read_file(path, &flen);
  CHECK(file && mem && flen == len && memcmp(file, mem, len) == 0);
  free(file);
  /* through a shared mapping (what a large bundle on many cores gets), and
   * plainly: the same bytes */
  for (int way = FMT_WRITE_MAPPED; way <= FMT_WRITE_PLAIN; way++) {
    FmtWriter *wm = sample_writer();
    if (!wm) continue;
    fmt_writer_set_way(wm, (FmtWriteWay)way);
    CHECK_OK(fmt_writer_write(wm, path));
    fmt_writer_destroy(wm);
    file = read_file(path, &flen);
    CHECK(file && mem && flen == len && memcmp(file, mem, len) == 0);
    free(file);
    CHECK(count_dir_entries() == 1);
  }

  FmtFile *b = NULL;
  CHECK_OK(fmt_file_open(path, &b));
  if (b) {
    check_contents(b);
    CHECK(strcmp(fmt_file_path(b), path) == 0);
    fmt_file_close(b);
  }
  b = NULL;
  CHECK_OK(fmt_file_open_memory(mem, len, "model.smelt", &b));
  if (b) check_contents(b);
  fmt_file_close(b);

  /* a failed write leaves nothing behind */
  FmtWriter *w2 = NULL;
  CHECK_OK(fmt_writer_create(&w2));
  char badpath[200];
  snprintf(badpath, sizeof badpath, "%s/no-such-dir/x.smelt", tmpdir);
  st = w2 ? fmt_writer_write(w2, badpath) : NULL;
  CHECK(st && st_code(st) == ST_IO && strstr(st_message(st), "no-such-dir/x.smelt: error: "));
  st_free(st);
  /* an empty bundle is valid */
  void *emem = NULL;
  size_t elen = 0;
  CHECK_OK(fmt_writer_to_memory(w2, &emem, &elen));
  CHECK(elen == FMT_BUNDLE_HEADER_BYTES);
  b = NULL;
  CHECK_OK(fmt_file_open_memory(emem, elen, NULL, &b));
  CHECK(b && fmt_file_section_count(b) == 0);
  fmt_file_close(b);
  free(emem);
  fmt_writer_destroy(w2);

  st = fmt_file_open("/nonexistent/model.smelt", &b);
  CHECK(st && st_code(st) == ST_IO && strstr(st_message(st), "/nonexistent/model.smelt: error: cannot open"));
  CHECK(b == NULL);
  st_free(st);
  *out_len = len;
  return mem;
}

/* Expects opening the image to fail with "model.smelt: error: ...want...". */
static void expect_reject(const void *img, size_t len, const char *want, int line) {
  FmtFile *b = (FmtFile *)1;
  smelt_status st = fmt_file_open_memory(img, len, "model.smelt", &b);
  if (!st) {
    fprintf(stderr, "%s:%d: bundle accepted, expected '%s'\n", __FILE__, line, want);
    check_failures++;
    fmt_file_close(b);
    return;
  }
  CHECK(b == NULL && st_code(st) == ST_INVALID_INPUT);
  const char *msg = st_message(st);
  if (strncmp(msg, "model.smelt: error: ", 20) != 0 || !strstr(msg, want)) {
    fprintf(stderr, "%s:%d: message '%s' lacks '%s'\n", __FILE__, line, msg, want);
    check_failures++;
  }
  st_free(st);
}
#define EXPECT_REJECT(img, len, want) expect_reject((img), (len), (want), __LINE__)

static void test_corruptions(const unsigned char *good, size_t len) {
  unsigned char *b = malloc(len + 4096);
  const unsigned char *tab = good + FMT_BUNDLE_HEADER_BYTES;
#define FRESH() memcpy(b, good, len)
#define ENTRY(i) (b + FMT_BUNDLE_HEADER_BYTES + (size_t)(i) * FMT_BUNDLE_ENTRY_BYTES)
  char want[400];

  EXPECT_REJECT(good, 0, "empty file (0 bytes)");
  EXPECT_REJECT(good, 20, "too short to be a smelt bundle: 20 bytes");
  snprintf(want, sizeof want, "truncated: header says %zu bytes, file has 32", len);
  EXPECT_REJECT(good, 32, want); /* header only */
  snprintf(want, sizeof want, "truncated: header says %zu bytes, file has %d", len, 32 + 88 + 40);
  EXPECT_REJECT(good, 32 + 88 + 40, want); /* mid-table */
  snprintf(want, sizeof want, "truncated: header says %zu bytes, file has %zu", len, len - 100);
  EXPECT_REJECT(good, len - 100, want); /* mid-payload */
  FRESH();
  b[len] = 0;
  snprintf(want, sizeof want, "trailing data: header says %zu bytes, file has %zu", len, len + 1);
  EXPECT_REJECT(b, len + 1, want);

  FRESH();
  b[3] ^= 0x20;
  EXPECT_REJECT(b, len, "not a smelt bundle (bad magic)");
  FRESH();
  put_le(b + H_VERSION, 2, 4);
  EXPECT_REJECT(b, len, "unsupported bundle format version 2 (this smelt reads version 1)");
  FRESH();
  put_le(b + H_COUNT, 1000000000, 4);
  EXPECT_REJECT(b, len, "section count 1000000000 is absurd");
  FRESH();
  put_le(b + H_COUNT, 6, 4); /* the last section dropped: only the checksum notices */
  EXPECT_REJECT(b, len, "file checksum mismatch");

  /* table entries: section 2 is "model-graph", 4 is cubin sm_90a */
  uint64_t off2 = get_le(tab + 2 * FMT_BUNDLE_ENTRY_BYTES + E_OFFSET, 8);
  uint64_t off4 = get_le(tab + 4 * FMT_BUNDLE_ENTRY_BYTES + E_OFFSET, 8);
  FRESH();
  put_le(ENTRY(2) + E_OFFSET, (len + 2 * FMT_BUNDLE_ALIGN) & ~(uint64_t)63, 8);
  EXPECT_REJECT(b, len, "section 2 (graph 'model-graph'): bytes ");
  EXPECT_REJECT(b, len, "lie beyond the end of the file");
  FRESH();
  put_le(ENTRY(2) + E_SIZE, UINT64_MAX - 10, 8); /* offset + size wraps around */
  EXPECT_REJECT(b, len, "lie beyond the end of the file");
  FRESH();
  put_le(ENTRY(4) + E_OFFSET, off2, 8);
  EXPECT_REJECT(b, len, "sections 2 ('model-graph') and 4 ('sm_90a') overlap");
  FRESH();
  put_le(ENTRY(2) + E_OFFSET, off2 + 8, 8);
  snprintf(want, sizeof want, "offset %llu is not a multiple of 64", (unsigned long long)off2 + 8);
  EXPECT_REJECT(b, len, want);
  FRESH();
  put_le(ENTRY(2) + E_OFFSET, 64, 8);
  EXPECT_REJECT(b, len, "lies inside the header or section table");
  FRESH();
  memset(ENTRY(2) + E_NAME, 'a', FMT_SECTION_NAME_BYTES);
  EXPECT_REJECT(b, len, "section 2 (graph): name is not NUL-terminated");
  FRESH();
  ENTRY(2)[E_NAME + 40] = 'q';
  EXPECT_REJECT(b, len, "bytes after the name's NUL are not zero");
  FRESH();
  put_le(ENTRY(2) + E_KIND, 99, 4);
  EXPECT_REJECT(b, len, "section 2: unknown kind 99");
  FRESH();
  put_le(ENTRY(2) + E_FLAGS, 4, 4);
  EXPECT_REJECT(b, len, "unknown flags 0x4");
  FRESH();
  memcpy(ENTRY(6) + E_NAME, "sm_90a", 7);
  EXPECT_REJECT(b, len, "two cubin sections are named 'sm_90a'");

  FRESH();
  b[off2 + 100] ^= 1; /* a payload byte */
  EXPECT_REJECT(b, len, "section 2 (graph 'model-graph'): checksum mismatch");
  FRESH();
  ENTRY(4)[E_CHECKSUM] ^= 0x80; /* a stored section checksum */
  EXPECT_REJECT(b, len, "section 4 (cubin 'sm_90a'): checksum mismatch");
  FRESH();
  b[H_CHECKSUM + 1] ^= 0x10; /* the file checksum */
  EXPECT_REJECT(b, len, "file checksum mismatch");
  FRESH();
  b[off4 - 1] ^= 0x01; /* padding before sm_90a (payload 3 is empty, 2 is 700 bytes) */
  EXPECT_REJECT(b, len, "file checksum mismatch");
  FRESH();
  ENTRY(1)[E_SIZE] ^= 0x01; /* a size change that stays in bounds */
  EXPECT_REJECT(b, len, "section 1 (ir-text ''): checksum mismatch");

  /* garbage: random bytes, then random bytes behind a valid-looking header */
  for (size_t i = 0; i < 4096; i++) b[i] = (unsigned char)rng();
  EXPECT_REJECT(b, 4096, "bad magic");
  memcpy(b, good, 16);
  put_le(b + H_SIZE, 4096, 8);
  put_le(b + H_COUNT, 7, 4);
  FmtFile *bb = NULL;
  smelt_status st = fmt_file_open_memory(b, 4096, "model.smelt", &bb);
  CHECK(st && bb == NULL);
  st_free(st);

  /* on disk too: the path leads the message */
  write_file(path, good, len - 1);
  st = fmt_file_open(path, &bb);
  snprintf(want, sizeof want, "%s: error: truncated: header says %zu bytes, file has %zu", path, len, len - 1);
  CHECK(st && st_code(st) == ST_INVALID_INPUT && strcmp(st_message(st), want) == 0);
  st_free(st);
  write_file(path, "", 0);
  st = fmt_file_open(path, &bb);
  CHECK(st && strstr(st_message(st), "error: empty file"));
  st_free(st);
#undef FRESH
#undef ENTRY
  free(b);
}

/* Every byte of a bundle is either checked or covered by a checksum, so
 * every single-byte change and every truncation must be rejected. */
static void test_every_byte(const unsigned char *good, size_t len) {
  int accepted = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char *b = malloc(len);
    memcpy(b, good, len);
    b[i] ^= (unsigned char)(1u << (i % 8));
    FmtFile *bb = NULL;
    smelt_status st = fmt_file_open_memory(b, len, "model.smelt", &bb);
    if (!st) accepted++, fmt_file_close(bb);
    st_free(st);
    /* a truncation to i bytes, in a buffer of exactly that size */
    st = fmt_file_open_memory(good, i, "model.smelt", &bb);
    if (!st) accepted++, fmt_file_close(bb);
    st_free(st);
    free(b);
  }
  CHECK(accepted == 0);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/smelt-test-bundle-XXXXXX");
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path, sizeof path, "%s/model.smelt", tmpdir);
  test_crc();
  make_sample();
  size_t len = 0;
  unsigned char *img = test_write_read(&len);
  if (img) {
    test_corruptions(img, len);
    test_every_byte(img, len);
  }
  free(img);
  for (int i = 0; i < NSEC; i++) free(sample[i].data);
  unlink(path);
  rmdir(tmpdir);
  return check_done("test_bundle");
}
