/* The `.smelt` bundle container: writer and validating reader.
 *
 * The format is described in bundle.h.  Writing lays the sections out after
 * the table, each at the next multiple of 64 bytes, then streams "the body"
 * (table, padding, payloads) through one emitter into the file (or a memory
 * buffer) after the header.  Each payload's CRC is taken once, when it is
 * added; the file checksum combines them with the CRC of the bytes between
 * (fmt_crc32c_combine), so writing a 700 MB bundle reads its weights once
 * for checksums, not three times.  A section may be made of pieces that
 * stay the caller's (the constants blob: pointers into the graphs' data),
 * so the weights are not copied into the writer either.  Files are written to
 * a temporary name in the same directory and renamed over the target, so a
 * reader never sees half a bundle.  They are not fsync'ed unless the writer
 * is made durable (fmt_writer_set_durable): like a C compiler's output, a
 * bundle can be made again, and syncing 700 MB of weights took most of a
 * W4 compile (17 s of 18 on this project's VM); a file torn by a crash is
 * refused by the loader's checksums, never half-used.
 *
 * Reading maps the file (a memory image is copied into a 64-byte-aligned
 * buffer), so payloads keep the alignment they have in the file, and checks
 * it in the order that
 * gives the most useful message: the header (size, magic, version, declared
 * size against the real one, section count against the room for its table),
 * then each table entry (kind, NUL-terminated name, flags, alignment, extent
 * inside the file), then overlaps and duplicate names (after sorting, so a
 * hostile table of 65536 entries costs n log n, not n^2), then each
 * section's checksum (naming the section) and last the file's checksum.
 * Structural checks come before checksums so that a damaged table is
 * reported as what it is rather than as a checksum mismatch.
 *
 * CRC-32C is used for both checksums: it catches every burst error up to 32
 * bits and runs at several GB/s with the SSE4.2 crc32 instruction, which
 * matters because a bundle carries its weights.  Elsewhere a byte-at-a-time
 * table does the work. */
#define _DEFAULT_SOURCE /* MAP_POPULATE, realpath */
#include "format/bundle.h"
#include "format/parallel.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>
#define RT_HAVE_SSE42_PATH 1
#endif

/* ---------------------------------------------------------------- CRC-32C */

/* crc_table[i] = CRC of byte i for the reflected polynomial 0x82f63b78:
 *   for (c = i, k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78 : c >> 1; */
static const uint32_t crc_table[256] = {
    0x00000000u, 0xf26b8303u, 0xe13b70f7u, 0x1350f3f4u, 0xc79a971fu, 0x35f1141cu,
    0x26a1e7e8u, 0xd4ca64ebu, 0x8ad958cfu, 0x78b2dbccu, 0x6be22838u, 0x9989ab3bu,
    0x4d43cfd0u, 0xbf284cd3u, 0xac78bf27u, 0x5e133c24u, 0x105ec76fu, 0xe235446cu,
    0xf165b798u, 0x030e349bu, 0xd7c45070u, 0x25afd373u, 0x36ff2087u, 0xc494a384u,
    0x9a879fa0u, 0x68ec1ca3u, 0x7bbcef57u, 0x89d76c54u, 0x5d1d08bfu, 0xaf768bbcu,
    0xbc267848u, 0x4e4dfb4bu, 0x20bd8edeu, 0xd2d60dddu, 0xc186fe29u, 0x33ed7d2au,
    0xe72719c1u, 0x154c9ac2u, 0x061c6936u, 0xf477ea35u, 0xaa64d611u, 0x580f5512u,
    0x4b5fa6e6u, 0xb93425e5u, 0x6dfe410eu, 0x9f95c20du, 0x8cc531f9u, 0x7eaeb2fau,
    0x30e349b1u, 0xc288cab2u, 0xd1d83946u, 0x23b3ba45u, 0xf779deaeu, 0x05125dadu,
    0x1642ae59u, 0xe4292d5au, 0xba3a117eu, 0x4851927du, 0x5b016189u, 0xa96ae28au,
    0x7da08661u, 0x8fcb0562u, 0x9c9bf696u, 0x6ef07595u, 0x417b1dbcu, 0xb3109ebfu,
    0xa0406d4bu, 0x522bee48u, 0x86e18aa3u, 0x748a09a0u, 0x67dafa54u, 0x95b17957u,
    0xcba24573u, 0x39c9c670u, 0x2a993584u, 0xd8f2b687u, 0x0c38d26cu, 0xfe53516fu,
    0xed03a29bu, 0x1f682198u, 0x5125dad3u, 0xa34e59d0u, 0xb01eaa24u, 0x42752927u,
    0x96bf4dccu, 0x64d4cecfu, 0x77843d3bu, 0x85efbe38u, 0xdbfc821cu, 0x2997011fu,
    0x3ac7f2ebu, 0xc8ac71e8u, 0x1c661503u, 0xee0d9600u, 0xfd5d65f4u, 0x0f36e6f7u,
    0x61c69362u, 0x93ad1061u, 0x80fde395u, 0x72966096u, 0xa65c047du, 0x5437877eu,
    0x4767748au, 0xb50cf789u, 0xeb1fcbadu, 0x197448aeu, 0x0a24bb5au, 0xf84f3859u,
    0x2c855cb2u, 0xdeeedfb1u, 0xcdbe2c45u, 0x3fd5af46u, 0x7198540du, 0x83f3d70eu,
    0x90a324fau, 0x62c8a7f9u, 0xb602c312u, 0x44694011u, 0x5739b3e5u, 0xa55230e6u,
    0xfb410cc2u, 0x092a8fc1u, 0x1a7a7c35u, 0xe811ff36u, 0x3cdb9bddu, 0xceb018deu,
    0xdde0eb2au, 0x2f8b6829u, 0x82f63b78u, 0x709db87bu, 0x63cd4b8fu, 0x91a6c88cu,
    0x456cac67u, 0xb7072f64u, 0xa457dc90u, 0x563c5f93u, 0x082f63b7u, 0xfa44e0b4u,
    0xe9141340u, 0x1b7f9043u, 0xcfb5f4a8u, 0x3dde77abu, 0x2e8e845fu, 0xdce5075cu,
    0x92a8fc17u, 0x60c37f14u, 0x73938ce0u, 0x81f80fe3u, 0x55326b08u, 0xa759e80bu,
    0xb4091bffu, 0x466298fcu, 0x1871a4d8u, 0xea1a27dbu, 0xf94ad42fu, 0x0b21572cu,
    0xdfeb33c7u, 0x2d80b0c4u, 0x3ed04330u, 0xccbbc033u, 0xa24bb5a6u, 0x502036a5u,
    0x4370c551u, 0xb11b4652u, 0x65d122b9u, 0x97baa1bau, 0x84ea524eu, 0x7681d14du,
    0x2892ed69u, 0xdaf96e6au, 0xc9a99d9eu, 0x3bc21e9du, 0xef087a76u, 0x1d63f975u,
    0x0e330a81u, 0xfc588982u, 0xb21572c9u, 0x407ef1cau, 0x532e023eu, 0xa145813du,
    0x758fe5d6u, 0x87e466d5u, 0x94b49521u, 0x66df1622u, 0x38cc2a06u, 0xcaa7a905u,
    0xd9f75af1u, 0x2b9cd9f2u, 0xff56bd19u, 0x0d3d3e1au, 0x1e6dcdeeu, 0xec064eedu,
    0xc38d26c4u, 0x31e6a5c7u, 0x22b65633u, 0xd0ddd530u, 0x0417b1dbu, 0xf67c32d8u,
    0xe52cc12cu, 0x1747422fu, 0x49547e0bu, 0xbb3ffd08u, 0xa86f0efcu, 0x5a048dffu,
    0x8ecee914u, 0x7ca56a17u, 0x6ff599e3u, 0x9d9e1ae0u, 0xd3d3e1abu, 0x21b862a8u,
    0x32e8915cu, 0xc083125fu, 0x144976b4u, 0xe622f5b7u, 0xf5720643u, 0x07198540u,
    0x590ab964u, 0xab613a67u, 0xb831c993u, 0x4a5a4a90u, 0x9e902e7bu, 0x6cfbad78u,
    0x7fab5e8cu, 0x8dc0dd8fu, 0xe330a81au, 0x115b2b19u, 0x020bd8edu, 0xf0605beeu,
    0x24aa3f05u, 0xd6c1bc06u, 0xc5914ff2u, 0x37faccf1u, 0x69e9f0d5u, 0x9b8273d6u,
    0x88d28022u, 0x7ab90321u, 0xae7367cau, 0x5c18e4c9u, 0x4f48173du, 0xbd23943eu,
    0xf36e6f75u, 0x0105ec76u, 0x12551f82u, 0xe03e9c81u, 0x34f4f86au, 0xc69f7b69u,
    0xd5cf889du, 0x27a40b9eu, 0x79b737bau, 0x8bdcb4b9u, 0x988c474du, 0x6ae7c44eu,
    0xbe2da0a5u, 0x4c4623a6u, 0x5f16d052u, 0xad7d5351u,
};

uint32_t fmt_crc32c_portable(uint32_t crc, const void *data, size_t n) {
  const unsigned char *p = data;
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

/* Combining CRCs (zlib's crc32_combine, for the Castagnoli polynomial):
 * the CRC register after n zero bytes is the register times x^(8n) modulo
 * the polynomial, so crc(A B) = crc(A) * x^(8|B|) + crc(B) in GF(2)[x].
 * Polynomials are in the reflected bit order, x^0 in the top bit. */
#define CRC32C_POLY 0x82f63b78u

static uint32_t multmodp(uint32_t a, uint32_t b) {
  uint32_t m = (uint32_t)1 << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
  }
  return p;
}

/* x^(n * 2^k) modulo the polynomial: x^(8n) for k = 3. */
static uint32_t x2nmodp(uint64_t n, unsigned k) {
  uint32_t sq = (uint32_t)1 << 30; /* x^1 */
  for (unsigned i = 0; i < k; i++) sq = multmodp(sq, sq);
  uint32_t p = (uint32_t)1 << 31; /* x^0 */
  while (n) {
    if (n & 1) p = multmodp(sq, p);
    n >>= 1;
    sq = multmodp(sq, sq);
  }
  return p;
}

uint32_t fmt_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
  return multmodp(x2nmodp(len2, 3), crc1) ^ crc2;
}

#ifdef RT_HAVE_SSE42_PATH
/* One crc32 instruction has a latency of 3 cycles and a throughput of 1, so
 * a single dependency chain runs at a third of the possible speed: large
 * buffers are cut into blocks of three lanes, each lane with its own
 * register, and the lanes joined by shifting (multmodp) per block.  About
 * 3x the single-chain speed; a 700 MB bundle checks in tens of ms. */
enum { CRC_LANE = 8192 };

__attribute__((target("sse4.2"))) static uint64_t crc32c_words(uint64_t c, const unsigned char *p, size_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  for (; n; n--) c = _mm_crc32_u8((uint32_t)c, *p++);
  return c;
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *data, size_t n) {
  const unsigned char *p = data;
  uint64_t c = ~crc;
  for (; n && ((uintptr_t)p & 7); n--) c = _mm_crc32_u8((uint32_t)c, *p++);
  if (n >= 3 * CRC_LANE) {
    uint32_t shift = x2nmodp(CRC_LANE, 3);
    for (; n >= 3 * CRC_LANE; n -= 3 * CRC_LANE, p += 3 * CRC_LANE) {
      uint64_t c0 = c, c1 = 0, c2 = 0;
      for (size_t i = 0; i < CRC_LANE; i += 8) {
        uint64_t w0, w1, w2;
        memcpy(&w0, p + i, 8);
        memcpy(&w1, p + CRC_LANE + i, 8);
        memcpy(&w2, p + 2 * CRC_LANE + i, 8);
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
      }
      /* registers, not finished CRCs: no inversion between the lanes */
      c = multmodp(shift, multmodp(shift, (uint32_t)c0) ^ (uint32_t)c1) ^ (uint32_t)c2;
    }
  }
  c = crc32c_words(c, p, n);
  return ~(uint32_t)c;
}
#endif

uint32_t fmt_crc32c(uint32_t crc, const void *data, size_t n) {
#ifdef RT_HAVE_SSE42_PATH
  if (__builtin_cpu_supports("sse4.2")) return crc32c_sse42(crc, data, n);
#endif
  return fmt_crc32c_portable(crc, data, n);
}

/* ---------------------------------------------------------------- common */

const char *fmt_section_kind_name(uint32_t kind) {
  switch (kind) {
#define X(id, num, name) \
  case num: return name;
    FMT_SECTION_KINDS(X)
#undef X
  }
  return NULL;
}

static void put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static uint64_t align_up(uint64_t x) { return (x + FMT_BUNDLE_ALIGN - 1) & ~(uint64_t)(FMT_BUNDLE_ALIGN - 1); }

/* Field offsets inside the header and a table entry. */
enum { H_MAGIC = 0, H_VERSION = 8, H_COUNT = 12, H_SIZE = 16, H_CHECKSUM = 24 };
enum { E_KIND = 0, E_FLAGS = 4, E_NAME = 8, E_OFFSET = 64, E_SIZE = 72, E_CHECKSUM = 80 };
_Static_assert(E_CHECKSUM + 8 == FMT_BUNDLE_ENTRY_BYTES, "table entry layout");
_Static_assert(H_CHECKSUM + 8 == FMT_BUNDLE_HEADER_BYTES, "header layout");
_Static_assert(E_OFFSET - E_NAME == FMT_SECTION_NAME_BYTES, "name field size");

/* ---------------------------------------------------------------- writer */

typedef struct {
  FmtSectionKind kind;
  uint32_t flags;
  char name[FMT_SECTION_NAME_BYTES];
  unsigned char *owned; /* the writer's copy (or taken buffer); NULL for a section of pieces */
  FmtPiece *pieces;     /* what the payload is made of, in order (malloc'd) */
  int npieces;
  size_t size;
  uint32_t crc;
  uint64_t offset; /* set by layout() */
} WSection;

struct FmtWriter {
  WSection *sec;
  int nsec, cap;
  bool durable; /* fsync the file and its directory */
  FmtWriteWay way;
};

void fmt_writer_set_durable(FmtWriter *w, bool durable) { w->durable = durable; }
void fmt_writer_set_way(FmtWriter *w, FmtWriteWay way) { w->way = way; }

smelt_status fmt_writer_create(FmtWriter **out_writer) {
  *out_writer = calloc(1, sizeof **out_writer);
  return *out_writer ? NULL : st_error(ST_NO_MEMORY, "out of memory");
}

void fmt_writer_destroy(FmtWriter *w) {
  if (!w) return;
  for (int i = 0; i < w->nsec; i++) {
    free(w->sec[i].owned);
    free(w->sec[i].pieces);
  }
  free(w->sec);
  free(w);
}

/* Checks kind and name and makes room for one more section; returns the
 * new (zeroed, named) entry in *out, not yet counted in w->nsec. */
static smelt_status new_section(FmtWriter *w, FmtSectionKind kind, const char *name, WSection **out) {
  if (!name) name = "";
  const char *kname = fmt_section_kind_name((uint32_t)kind);
  if (!kname) return st_error(ST_INTERNAL, "bundle writer: unknown section kind %d", (int)kind);
  if (strlen(name) >= FMT_SECTION_NAME_BYTES)
    return st_error(ST_INVALID_INPUT, "bundle writer: %s section name '%s' is longer than %d bytes", kname, name,
                    FMT_SECTION_NAME_BYTES - 1);
  for (int i = 0; i < w->nsec; i++)
    if (w->sec[i].kind == kind && strcmp(w->sec[i].name, name) == 0)
      return st_error(ST_INVALID_INPUT, "bundle writer: two %s sections named '%s'", kname, name);
  if (w->nsec == FMT_BUNDLE_MAX_SECTIONS)
    return st_error(ST_INVALID_INPUT, "bundle writer: more than %d sections", FMT_BUNDLE_MAX_SECTIONS);
  if (w->nsec == w->cap) {
    int cap = w->cap ? 2 * w->cap : 8;
    WSection *s = realloc(w->sec, sizeof *s * (size_t)cap);
    if (!s) return st_error(ST_NO_MEMORY, "out of memory");
    w->sec = s;
    w->cap = cap;
  }
  WSection *s = &w->sec[w->nsec];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  strcpy(s->name, name); /* fits: checked above; the rest of the field stays zero */
  *out = s;
  return NULL;
}

/* Adds a section whose bytes are `data` (taken over when owned, else
 * copied). */
static smelt_status add_section(FmtWriter *w, FmtSectionKind kind, const char *name, void *data, size_t len,
                                bool owned) {
  WSection *s;
  RETURN_IF_ERROR(new_section(w, kind, name, &s));
  unsigned char *copy = owned ? data : malloc(len ? len : 1);
  FmtPiece *piece = malloc(sizeof *piece);
  if (!copy || !piece) {
    if (!owned) free(copy);
    free(piece);
    return st_error(ST_NO_MEMORY, "bundle writer: out of memory for a %zu-byte section", len);
  }
  if (len && !owned) memcpy(copy, data, len);
  *piece = (FmtPiece){.data = copy, .len = len};
  s->owned = copy;
  s->pieces = piece;
  s->npieces = 1;
  s->size = len;
  s->crc = fmt_crc32c_parallel(copy, len);
  w->nsec++;
  return NULL;
}

smelt_status fmt_writer_add(FmtWriter *w, FmtSectionKind kind, const char *name, const void *data,
                                  size_t len) {
  return add_section(w, kind, name, (void *)data, len, false);
}

smelt_status fmt_writer_take(FmtWriter *w, FmtSectionKind kind, const char *name, void **data, size_t len) {
  smelt_status st = add_section(w, kind, name, *data, len, *data != NULL);
  if (!st) *data = NULL;
  return st;
}

smelt_status fmt_writer_add_pieces(FmtWriter *w, FmtSectionKind kind, const char *name, const FmtPiece *pieces,
                                   int npieces) {
  WSection *s;
  RETURN_IF_ERROR(new_section(w, kind, name, &s));
  FmtPiece *copy = malloc(sizeof *copy * (size_t)(npieces > 0 ? npieces : 1));
  if (!copy) return st_error(ST_NO_MEMORY, "out of memory");
  uint32_t crc = 0;
  size_t size = 0;
  static const unsigned char zeros[4096];
  for (int i = 0; i < npieces; i++) {
    copy[i] = pieces[i];
    if (pieces[i].len > SIZE_MAX - size) {
      free(copy);
      return st_error(ST_INVALID_INPUT, "bundle writer: section '%s' is too large", s->name);
    }
    size += pieces[i].len;
    if (pieces[i].data && pieces[i].has_crc) {
      crc = fmt_crc32c_combine(crc, pieces[i].crc, pieces[i].len);
    } else if (pieces[i].data) {
      crc = fmt_crc32c_combine(crc, fmt_crc32c_parallel(pieces[i].data, pieces[i].len), pieces[i].len);
    } else {
      for (size_t k = 0; k < pieces[i].len; k += sizeof zeros)
        crc = fmt_crc32c(crc, zeros, pieces[i].len - k < sizeof zeros ? pieces[i].len - k : sizeof zeros);
    }
  }
  s->pieces = copy;
  s->npieces = npieces;
  s->size = size;
  s->crc = crc;
  w->nsec++;
  return NULL;
}

/* Places the payloads after the table; returns the file size. */
static uint64_t layout(const FmtWriter *w, WSection *sec) {
  uint64_t end = FMT_BUNDLE_HEADER_BYTES + (uint64_t)w->nsec * FMT_BUNDLE_ENTRY_BYTES;
  for (int i = 0; i < w->nsec; i++) {
    sec[i].offset = align_up(end);
    end = sec[i].offset + sec[i].size;
  }
  return end;
}

/* Where emitted bytes go: a CRC, a memory buffer, a file descriptor. */
typedef struct {
  uint32_t crc;
  bool no_crc;        /* the bytes only go to mem or fd */
  unsigned char *mem; /* when non-NULL, bytes are copied here at mem_pos */
  size_t mem_pos;
  int fd;             /* when >= 0, bytes are written here */
  int err;            /* errno of the first failed write */
} Sink;

static void emit(Sink *s, const void *data, size_t n) {
  static const unsigned char zeros[4096];
  if (!data) { /* n zero bytes */
    for (size_t k = 0; k < n; k += sizeof zeros) emit(s, zeros, n - k < sizeof zeros ? n - k : sizeof zeros);
    return;
  }
  if (!s->no_crc) s->crc = fmt_crc32c(s->crc, data, n);
  if (s->mem) {
    memcpy(s->mem + s->mem_pos, data, n);
    s->mem_pos += n;
  }
  const unsigned char *p = data;
  while (s->fd >= 0 && !s->err && n > 0) {
    ssize_t k = write(s->fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      s->err = k < 0 ? errno : EIO;
      break;
    }
    p += k;
    n -= (size_t)k;
  }
}

/* The section table as it is written. */
static unsigned char *encode_table(const FmtWriter *w, const WSection *sec, size_t *out_len) {
  size_t tbytes = (size_t)w->nsec * FMT_BUNDLE_ENTRY_BYTES;
  unsigned char *table = calloc(1, tbytes ? tbytes : 1);
  if (!table) return NULL;
  for (int i = 0; i < w->nsec; i++) {
    unsigned char *e = table + (size_t)i * FMT_BUNDLE_ENTRY_BYTES;
    put_le(e + E_KIND, (uint64_t)sec[i].kind, 4);
    put_le(e + E_FLAGS, sec[i].flags, 4);
    memcpy(e + E_NAME, sec[i].name, FMT_SECTION_NAME_BYTES);
    put_le(e + E_OFFSET, sec[i].offset, 8);
    put_le(e + E_SIZE, sec[i].size, 8);
    put_le(e + E_CHECKSUM, sec[i].crc, 8);
  }
  *out_len = tbytes;
  return table;
}

/* Everything after the header: table, then padding and payloads in order.
 * With s->no_crc unset the payloads are not read again: their CRCs, known
 * since they were added, are combined into s->crc. */
static smelt_status emit_body(const FmtWriter *w, const WSection *sec, Sink *s) {
  size_t tbytes;
  unsigned char *table = encode_table(w, sec, &tbytes);
  if (!table) return st_error(ST_NO_MEMORY, "out of memory");
  emit(s, table, tbytes);
  free(table);
  uint64_t pos = FMT_BUNDLE_HEADER_BYTES + tbytes;
  for (int i = 0; i < w->nsec; i++) {
    emit(s, NULL, (size_t)(sec[i].offset - pos));
    if (!s->no_crc) {
      s->crc = fmt_crc32c_combine(s->crc, sec[i].crc, sec[i].size);
      Sink raw = *s;
      raw.no_crc = true;
      for (int k = 0; k < sec[i].npieces; k++) emit(&raw, sec[i].pieces[k].data, sec[i].pieces[k].len);
      s->mem_pos = raw.mem_pos;
      s->err = raw.err;
    } else {
      for (int k = 0; k < sec[i].npieces; k++) emit(s, sec[i].pieces[k].data, sec[i].pieces[k].len);
    }
    pos = sec[i].offset + sec[i].size;
  }
  return NULL;
}

/* Lays the bundle out, checksums the body and fills the header. */
static smelt_status prepare(const FmtWriter *w, WSection **out_sec, unsigned char header[FMT_BUNDLE_HEADER_BYTES],
                            uint64_t *out_size) {
  WSection *sec = malloc(sizeof *sec * (size_t)(w->nsec ? w->nsec : 1));
  if (!sec) return st_error(ST_NO_MEMORY, "out of memory");
  if (w->nsec) memcpy(sec, w->sec, sizeof *sec * (size_t)w->nsec);
  uint64_t size = layout(w, sec);
  memset(header, 0, FMT_BUNDLE_HEADER_BYTES);
  memcpy(header + H_MAGIC, FMT_BUNDLE_MAGIC, 8);
  put_le(header + H_VERSION, FMT_BUNDLE_VERSION, 4);
  put_le(header + H_COUNT, (uint64_t)w->nsec, 4);
  put_le(header + H_SIZE, size, 8);
  Sink crc = {.crc = fmt_crc32c(0, header, H_CHECKSUM), .fd = -1};
  smelt_status st = emit_body(w, sec, &crc);
  if (st) {
    free(sec);
    return st;
  }
  put_le(header + H_CHECKSUM, crc.crc, 8);
  *out_sec = sec;
  *out_size = size;
  return NULL;
}

smelt_status fmt_writer_to_memory(const FmtWriter *w, void **out_buf, size_t *out_len) {
  *out_buf = NULL;
  *out_len = 0;
  WSection *sec;
  unsigned char header[FMT_BUNDLE_HEADER_BYTES];
  uint64_t size;
  RETURN_IF_ERROR(prepare(w, &sec, header, &size));
  unsigned char *buf = size <= SIZE_MAX ? malloc((size_t)size) : NULL;
  if (!buf) {
    free(sec);
    return st_error(ST_NO_MEMORY, "bundle writer: out of memory for %llu bytes", (unsigned long long)size);
  }
  memcpy(buf, header, FMT_BUNDLE_HEADER_BYTES);
  Sink s = {.no_crc = true, .mem = buf, .mem_pos = FMT_BUNDLE_HEADER_BYTES, .fd = -1};
  smelt_status st = emit_body(w, sec, &s);
  free(sec);
  if (st) {
    free(buf);
    return st;
  }
  *out_buf = buf;
  *out_len = (size_t)size;
  return NULL;
}

/* fsync of the directory holding path, so the rename itself is durable.
 * Some file systems cannot fsync a directory (EINVAL); that is not an error. */
static int sync_dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return ENOMEM;
  int fd = open(dir, O_RDONLY);
  free(dir);
  if (fd < 0) return errno;
  int err = fsync(fd) < 0 && errno != EINVAL ? errno : 0;
  close(fd);
  return err;
}

/* Gives the finished temporary file its mode, flushes it to disk and closes
 * it; returns 0 or an errno, with *step naming what failed. */
static int sync_and_close(int fd, bool durable, const char **step) {
  int err = 0;
  if (fchmod(fd, 0644) < 0) {
    err = errno;
    *step = "set the mode of";
  } else if (durable && fsync(fd) < 0) {
    err = errno;
    *step = "sync";
  }
  if (close(fd) < 0 && !err) {
    err = errno;
    *step = "close";
  }
  return err;
}

/* Bundles from this size on, on a machine of 4 cores or more, are written
 * through a shared mapping of the file, their payloads copied in on several
 * threads: write() of a 700 MB model is one thread copying into the page
 * cache.  A mapped page is zero-filled by the kernel before it is written,
 * so on one or two cores write() is the faster way and is kept. */
#define MAPPED_WRITE_BYTES ((uint64_t)64 << 20)
#define MAPPED_PIECE ((size_t)2 << 20)

typedef struct {
  size_t dst; /* offset in the file */
  const unsigned char *src;
  size_t len;
} CopyChunk;

typedef struct {
  unsigned char *map;
  const CopyChunk *chunk;
} MappedJob;

static void copy_chunk(void *ctx, int i) {
  const MappedJob *j = ctx;
  memcpy(j->map + j->chunk[i].dst, j->chunk[i].src, j->chunk[i].len);
}

/* Writes header, table and payloads of a laid-out bundle of `size` bytes
 * into fd through a mapping.  The file's blocks are allocated first
 * (posix_fallocate), so a full disk is ENOSPC here, never a SIGBUS while
 * copying; gaps and zero pieces are the file's own zeros.  Returns 0, an
 * errno, or -1 when this way is not open (too large for the address space,
 * no mapping): the caller then writes the usual way. */
static int write_mapped(int fd, const unsigned char *header, const FmtWriter *w, const WSection *sec, uint64_t size) {
  if (size > SIZE_MAX / 2) return -1;
  size_t tbytes;
  unsigned char *table = encode_table(w, sec, &tbytes);
  if (!table) return ENOMEM;
  size_t nchunk = 2;
  for (int i = 0; i < w->nsec; i++)
    for (int k = 0; k < sec[i].npieces; k++) nchunk += sec[i].pieces[k].len / MAPPED_PIECE + 1;
  CopyChunk *chunk = malloc(nchunk * sizeof *chunk);
  if (!chunk || nchunk > INT32_MAX) {
    free(table);
    free(chunk);
    return ENOMEM;
  }
  int err = posix_fallocate(fd, 0, (off_t)size);
  if (err) {
    free(table);
    free(chunk);
    return err == ENOSPC || err == EFBIG || err == EIO ? err : -1;
  }
  unsigned char *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    free(table);
    free(chunk);
    return -1;
  }
  size_t n = 0;
  chunk[n++] = (CopyChunk){0, header, FMT_BUNDLE_HEADER_BYTES};
  chunk[n++] = (CopyChunk){FMT_BUNDLE_HEADER_BYTES, table, tbytes};
  for (int i = 0; i < w->nsec; i++) {
    size_t at = (size_t)sec[i].offset;
    for (int k = 0; k < sec[i].npieces; k++) {
      const FmtPiece *p = &sec[i].pieces[k];
      for (size_t o = 0; p->data && o < p->len; o += MAPPED_PIECE)
        chunk[n++] = (CopyChunk){at + o, (const unsigned char *)p->data + o, p->len - o < MAPPED_PIECE ? p->len - o : MAPPED_PIECE};
      at += p->len;
    }
  }
  MappedJob job = {map, chunk};
  fmt_parallel_for(fmt_parallel_threads(size), (int)n, copy_chunk, &job);
  err = munmap(map, (size_t)size) != 0 ? errno : 0;
  free(table);
  free(chunk);
  return err;
}

smelt_status fmt_writer_write(const FmtWriter *w, const char *path) {
  WSection *sec;
  unsigned char header[FMT_BUNDLE_HEADER_BYTES];
  uint64_t size;
  RETURN_IF_ERROR(prepare(w, &sec, header, &size));
  size_t n = strlen(path);
  char *tmp = malloc(n + 16);
  if (!tmp) {
    free(sec);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  snprintf(tmp, n + 16, "%s.tmp-XXXXXX", path);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int err = errno;
    free(sec);
    free(tmp);
    return st_error(ST_IO, "%s: error: cannot create a temporary file next to it: %s", path, strerror(err));
  }
  const char *step = "write";
  smelt_status st = NULL;
  bool mapped = w->way == FMT_WRITE_MAPPED ||
                (w->way == FMT_WRITE_AUTO && size >= MAPPED_WRITE_BYTES && fmt_parallel_threads(size) >= 4);
  int err = mapped ? write_mapped(fd, header, w, sec, size) : -1;
  if (err < 0) {
    Sink s = {.no_crc = true, .fd = fd};
    emit(&s, header, sizeof header);
    st = emit_body(w, sec, &s);
    err = s.err;
  }
  free(sec);
  if (st || err) {
    close(fd);
  } else {
    err = sync_and_close(fd, w->durable, &step);
  }
  if (!st && !err && rename(tmp, path) < 0) {
    err = errno;
    step = "rename the temporary file to";
  }
  if (!st && !err) {
    free(tmp);
    int derr = w->durable ? sync_dir_of(path) : 0;
    if (derr) return st_error(ST_IO, "%s: error: cannot sync its directory: %s", path, strerror(derr));
    return NULL;
  }
  unlink(tmp);
  free(tmp);
  if (st) return st;
  return st_error(ST_IO, "%s: error: cannot %s the file: %s", path, step, strerror(err));
}

/* ---------------------------------------------------------------- reader */

struct FmtFile {
  unsigned char *buf; /* the whole file, 64-byte aligned: mapped, or a malloc'd copy */
  size_t len;
  bool mapped;        /* buf is a read-only mapping of len bytes */
  char *path;
  FmtSection *sec;
  uint32_t *stored;   /* per section: its checksum as the table has it */
  int nsec;
  uint32_t defer_kind; /* sections of this kind are checksummed on request (0: none) */
  pthread_mutex_t lock; /* for the deferred check, which sessions on several threads may ask for */
  int deferred;        /* 0: not checked yet, 1: good, -1: corrupted (deferred_error says how) */
  char *deferred_error;
};

void fmt_file_close(FmtFile *b) {
  if (!b) return;
  if (b->mapped) munmap(b->buf, b->len);
  else free(b->buf);
  free(b->path);
  free(b->sec);
  free(b->stored);
  free(b->deferred_error);
  pthread_mutex_destroy(&b->lock);
  free(b);
}

int fmt_file_section_count(const FmtFile *b) { return b->nsec; }
const FmtSection *fmt_file_section_at(const FmtFile *b, int i) { return i >= 0 && i < b->nsec ? &b->sec[i] : NULL; }
const char *fmt_file_path(const FmtFile *b) { return b->path; }

bool fmt_file_find(const FmtFile *b, FmtSectionKind kind, const char *name, const void **out_data, size_t *out_len) {
  *out_data = NULL;
  *out_len = 0;
  for (int i = 0; i < b->nsec; i++) {
    const FmtSection *s = &b->sec[i];
    if (s->kind == kind && (!name || strcmp(s->name, name) == 0)) {
      *out_data = s->data;
      *out_len = s->size;
      return true;
    }
  }
  return false;
}

static smelt_status invalid(const char *fmt, ...) SMELT_PRINTF(1, 2);
static smelt_status invalid(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  smelt_status st = st_errorv(ST_INVALID_INPUT, fmt, ap);
  va_end(ap);
  return st;
}

/* A section's extent and table index, for the overlap check. */
typedef struct {
  uint64_t begin, end;
  int index;
} Extent;

static int cmp_extent(const void *a, const void *b) {
  const Extent *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int cmp_kind_name(const void *a, const void *b) {
  const FmtSection *x = *(const FmtSection *const *)a, *y = *(const FmtSection *const *)b;
  if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* Header checks; on success *out_count is the section count. */
static smelt_status check_header(const unsigned char *buf, size_t len, uint32_t *out_count) {
  if (len == 0) return invalid("empty file (0 bytes), not a smelt bundle");
  if (len < FMT_BUNDLE_HEADER_BYTES)
    return invalid("too short to be a smelt bundle: %zu bytes, the header alone is %d", len, FMT_BUNDLE_HEADER_BYTES);
  if (memcmp(buf + H_MAGIC, FMT_BUNDLE_MAGIC, 8) != 0) return invalid("not a smelt bundle (bad magic)");
  uint32_t version = (uint32_t)get_le(buf + H_VERSION, 4);
  if (version != FMT_BUNDLE_VERSION)
    return invalid("unsupported bundle format version %u (this smelt reads version %d)", version, FMT_BUNDLE_VERSION);
  uint64_t declared = get_le(buf + H_SIZE, 8);
  if (declared > len) return invalid("truncated: header says %llu bytes, file has %zu", (unsigned long long)declared, len);
  if (declared < len)
    return invalid("trailing data: header says %llu bytes, file has %zu", (unsigned long long)declared, len);
  uint32_t count = (uint32_t)get_le(buf + H_COUNT, 4);
  uint64_t table = (uint64_t)count * FMT_BUNDLE_ENTRY_BYTES;
  if (count > FMT_BUNDLE_MAX_SECTIONS || table > len - FMT_BUNDLE_HEADER_BYTES)
    return invalid("section count %u is absurd: its table needs %llu bytes, the file has %zu after the header", count,
                   (unsigned long long)table, len - FMT_BUNDLE_HEADER_BYTES);
  *out_count = count;
  return NULL;
}

/* Decodes and checks table entry i into *s (data still pointing into buf). */
static smelt_status check_entry(const unsigned char *buf, size_t len, uint32_t count, int i, FmtSection *s,
                                uint64_t *out_offset) {
  const unsigned char *e = buf + FMT_BUNDLE_HEADER_BYTES + (size_t)i * FMT_BUNDLE_ENTRY_BYTES;
  uint32_t kind = (uint32_t)get_le(e + E_KIND, 4);
  const char *kname = fmt_section_kind_name(kind);
  if (!kname) return invalid("section %d: unknown kind %u", i, kind);
  const char *name = (const char *)e + E_NAME;
  size_t nlen = strnlen(name, FMT_SECTION_NAME_BYTES);
  if (nlen == FMT_SECTION_NAME_BYTES) return invalid("section %d (%s): name is not NUL-terminated", i, kname);
  for (size_t k = nlen; k < FMT_SECTION_NAME_BYTES; k++)
    if (name[k]) return invalid("section %d (%s '%s'): bytes after the name's NUL are not zero", i, kname, name);
  uint32_t flags = (uint32_t)get_le(e + E_FLAGS, 4);
  if (flags) return invalid("section %d (%s '%s'): unknown flags 0x%x", i, kname, name, flags);
  uint64_t off = get_le(e + E_OFFSET, 8), size = get_le(e + E_SIZE, 8);
  uint64_t table_end = FMT_BUNDLE_HEADER_BYTES + (uint64_t)count * FMT_BUNDLE_ENTRY_BYTES;
  if (off % FMT_BUNDLE_ALIGN)
    return invalid("section %d (%s '%s'): offset %llu is not a multiple of %d", i, kname, name, (unsigned long long)off,
                   FMT_BUNDLE_ALIGN);
  if (off < table_end)
    return invalid("section %d (%s '%s'): offset %llu lies inside the header or section table (they end at %llu)", i,
                   kname, name, (unsigned long long)off, (unsigned long long)table_end);
  if (off > len || size > len - off)
    return invalid("section %d (%s '%s'): bytes %llu..%llu lie beyond the end of the file (%zu bytes)", i, kname, name,
                   (unsigned long long)off, (unsigned long long)off + size, len);
  s->kind = (FmtSectionKind)kind;
  s->flags = flags;
  s->name = name;
  s->data = buf + off;
  s->size = (size_t)size;
  *out_offset = off;
  return NULL;
}

/* No two sections share bytes, and no two share kind and name. */
static smelt_status check_overlaps(const FmtSection *sec, const uint64_t *offset, int n) {
  Extent *ext = malloc(sizeof *ext * (size_t)(n ? n : 1));
  const FmtSection **by_name = malloc(sizeof *by_name * (size_t)(n ? n : 1));
  if (!ext || !by_name) {
    free(ext), free(by_name);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  for (int i = 0; i < n; i++) {
    ext[i] = (Extent){offset[i], offset[i] + sec[i].size, i};
    by_name[i] = &sec[i];
  }
  qsort(ext, (size_t)n, sizeof *ext, cmp_extent);
  qsort(by_name, (size_t)n, sizeof *by_name, cmp_kind_name);
  smelt_status st = NULL;
  for (int i = 1; i < n && !st; i++) {
    const Extent *a = &ext[i - 1], *b = &ext[i];
    if (b->begin < a->end)
      st = invalid("sections %d ('%s') and %d ('%s') overlap: bytes %llu..%llu and %llu..%llu", a->index,
                   sec[a->index].name, b->index, sec[b->index].name, (unsigned long long)a->begin,
                   (unsigned long long)a->end, (unsigned long long)b->begin, (unsigned long long)b->end);
  }
  for (int i = 1; i < n && !st; i++)
    if (cmp_kind_name(&by_name[i - 1], &by_name[i]) == 0)
      st = invalid("two %s sections are named '%s'", fmt_section_kind_name(by_name[i]->kind), by_name[i]->name);
  free(ext);
  free(by_name);
  return st;
}

/* Each section's checksum, then the file's.  The file's CRC is not a
 * second pass over the payloads: the CRC of the bytes between them (table,
 * padding) is combined with the payloads' CRCs just computed, so a bundle's
 * weights are read once. */
static smelt_status check_checksums(const unsigned char *buf, size_t len, const FmtSection *sec, const uint64_t *offset,
                                    int n, uint32_t defer_kind, uint32_t *stored_out) {
  uint32_t *crc = malloc(sizeof *crc * (size_t)(n ? n : 1));
  Extent *ext = malloc(sizeof *ext * (size_t)(n ? n : 1));
  if (!crc || !ext) {
    free(crc), free(ext);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  smelt_status st = NULL;
  for (int i = 0; i < n && !st; i++) {
    const unsigned char *e = buf + FMT_BUNDLE_HEADER_BYTES + (size_t)i * FMT_BUNDLE_ENTRY_BYTES;
    uint64_t stored = get_le(e + E_CHECKSUM, 8);
    stored_out[i] = (uint32_t)stored;
    /* a deferred section enters the file's CRC with its stored checksum: the
     * table and everything else are still checked now */
    bool defer = defer_kind && sec[i].kind == defer_kind && stored <= UINT32_MAX;
    crc[i] = defer ? (uint32_t)stored : fmt_crc32c_parallel(sec[i].data, sec[i].size);
    if (stored != crc[i])
      st = invalid("section %d (%s '%s'): checksum mismatch (stored 0x%llx, computed 0x%08x): the section is corrupted",
                   i, fmt_section_kind_name(sec[i].kind), sec[i].name, (unsigned long long)stored, crc[i]);
    ext[i] = (Extent){offset[i], offset[i] + sec[i].size, i};
  }
  if (!st) {
    /* in file order; check_overlaps has made sure they do not overlap */
    qsort(ext, (size_t)n, sizeof *ext, cmp_extent);
    uint32_t got = fmt_crc32c(0, buf, H_CHECKSUM);
    uint64_t pos = FMT_BUNDLE_HEADER_BYTES;
    for (int i = 0; i < n; i++) {
      got = fmt_crc32c(got, buf + pos, (size_t)(ext[i].begin - pos));
      got = fmt_crc32c_combine(got, crc[ext[i].index], ext[i].end - ext[i].begin);
      pos = ext[i].end;
    }
    got = fmt_crc32c(got, buf + pos, len - (size_t)pos);
    uint64_t stored = get_le(buf + H_CHECKSUM, 8);
    if (stored != got)
      st = invalid("file checksum mismatch (stored 0x%llx, computed 0x%08x): the file is corrupted",
                   (unsigned long long)stored, got);
  }
  free(crc);
  free(ext);
  return st;
}

/* Validates b->buf and fills b->sec. */
static smelt_status parse(FmtFile *b) {
  uint32_t count = 0;
  RETURN_IF_ERROR(check_header(b->buf, b->len, &count));
  b->sec = calloc(count ? count : 1, sizeof *b->sec);
  uint64_t *offset = malloc(sizeof *offset * (count ? count : 1));
  if (!b->sec || !offset) {
    free(offset);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  smelt_status st = NULL;
  for (uint32_t i = 0; i < count && !st; i++) st = check_entry(b->buf, b->len, count, (int)i, &b->sec[i], &offset[i]);
  if (!st) st = check_overlaps(b->sec, offset, (int)count);
  b->stored = calloc(count ? count : 1, sizeof *b->stored);
  if (!st && !b->stored) st = st_error(ST_NO_MEMORY, "out of memory");
  if (!st) st = check_checksums(b->buf, b->len, b->sec, offset, (int)count, b->defer_kind, b->stored);
  free(offset);
  if (!st) b->nsec = (int)count;
  return st;
}

/* A bundle around buf (taken over), with the given name for messages. */
static smelt_status finish_open(unsigned char *buf, size_t len, bool mapped, const char *name, uint32_t defer_kind,
                                FmtFile **out_bundle) {
  FmtFile *b = calloc(1, sizeof *b);
  char *path = strdup(name);
  if (!b || !path) {
    free(b), free(path);
    if (mapped) munmap(buf, len);
    else free(buf);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  b->buf = buf;
  b->len = len;
  b->mapped = mapped;
  b->defer_kind = defer_kind;
  pthread_mutex_init(&b->lock, NULL);
  b->path = path;
  smelt_status st = parse(b);
  if (st) {
    fmt_file_close(b);
    return st_prefix(st, "%s: error", name);
  }
  *out_bundle = b;
  return NULL;
}

/* aligned_alloc wants a size that is a multiple of the alignment. */
static unsigned char *alloc_aligned(size_t len) {
  size_t cap = len > SIZE_MAX - FMT_BUNDLE_ALIGN ? 0 : (size_t)align_up(len ? len : 1);
  return cap ? aligned_alloc(FMT_BUNDLE_ALIGN, cap) : NULL;
}

smelt_status fmt_file_open_memory(const void *data, size_t len, const char *name, FmtFile **out_bundle) {
  *out_bundle = NULL;
  if (!name) name = "<memory>";
  unsigned char *buf = alloc_aligned(len);
  if (!buf) return st_error(ST_NO_MEMORY, "%s: error: out of memory for %zu bytes", name, len);
  if (len) memcpy(buf, data, len);
  return finish_open(buf, len, false, name, 0, out_bundle);
}

smelt_status fmt_file_open(const char *path, FmtFile **out_bundle) { return fmt_file_open_deferred(path, 0, out_bundle); }

smelt_status fmt_file_open_deferred(const char *path, FmtSectionKind defer_kind, FmtFile **out_bundle) {
  *out_bundle = NULL;
  int fd = open(path, O_RDONLY);
  if (fd < 0) return st_error(ST_IO, "%s: error: cannot open: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) < 0) {
    int err = errno;
    close(fd);
    return st_error(ST_IO, "%s: error: cannot stat: %s", path, strerror(err));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return st_error(ST_IO, "%s: error: not a regular file", path);
  }
  if ((uintmax_t)sb.st_size > SIZE_MAX - FMT_BUNDLE_ALIGN) {
    close(fd);
    return st_error(ST_IO, "%s: error: file too large", path);
  }
  size_t len = (size_t)sb.st_size;
  if (len == 0) { /* mmap refuses 0 bytes; the checks name the fault */
    close(fd);
    return finish_open(alloc_aligned(1), 0, false, path, 0, out_bundle);
  }
  /* Mapped, not read: a bundle holds its weights, and they are used where
   * they lie (the graph's constants point into the mapping).  Pages come in
   * as the checksums read them; MAP_POPULATE does that in one go, which is
   * cheaper than a fault per page.  The mapping is private and read-only:
   * a bundle is replaced by rename (fmt_writer_write), never rewritten in
   * place, and the mapping keeps the old file alive. */
  void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  int err = map == MAP_FAILED ? errno : 0;
  close(fd);
  if (err) return st_error(ST_IO, "%s: error: cannot map: %s", path, strerror(err));
  return finish_open(map, len, true, path, (uint32_t)defer_kind, out_bundle);
}

smelt_status fmt_file_check_deferred(FmtFile *b) {
  pthread_mutex_lock(&b->lock);
  if (b->deferred == 0) {
    b->deferred = 1;
    for (int i = 0; i < b->nsec && b->deferred == 1; i++) {
      const FmtSection *s = &b->sec[i];
      if (!b->defer_kind || s->kind != b->defer_kind) continue;
      uint32_t got = fmt_crc32c_parallel(s->data, s->size);
      if (got == b->stored[i]) continue;
      b->deferred = -1;
      size_t n = strlen(b->path) + strlen(s->name) + 200;
      if ((b->deferred_error = malloc(n)))
        snprintf(b->deferred_error, n, "%s: error: section %d (%s '%s'): checksum mismatch (stored 0x%08x, computed "
                 "0x%08x): the section is corrupted", b->path, i, fmt_section_kind_name(s->kind), s->name,
                 b->stored[i], got);
    }
  }
  smelt_status st = b->deferred < 0 ? st_error(ST_INVALID_INPUT, "%s", b->deferred_error ? b->deferred_error
                                                                                           : "a section is corrupted")
                                    : NULL;
  pthread_mutex_unlock(&b->lock);
  return st;
}
