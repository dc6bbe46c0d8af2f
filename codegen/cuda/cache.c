/* The on-disk cache of NVRTC results, as CuPy and PyTorch keep theirs
 * (FIELD-NOTES.md): one file per (source, options, arch, NVRTC version),
 * named by the SHA-256 of those four, holding the cubin and the PTX.
 *
 *   file   "SMELTCUB" u32 version (1) u32 0 u64 cubin_len u64 ptx_len
 *          u8 sha256[32] of the payload, then cubin bytes, then ptx bytes
 *
 * Writing is atomic: a temporary file in the same directory, renamed over
 * the final name, so a reader sees a whole file or none, and two processes
 * compiling the same kernel at once both succeed.  A file that is short,
 * has the wrong magic or a payload that does not match its hash is ignored
 * (and replaced by the next write): the cache is never trusted for
 * correctness.  Every failure of the cache (no HOME, a read-only directory)
 * only costs a recompilation; it is never an error.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/cuda/cu_cache.h"

/* ---- SHA-256 (FIPS 180-4) ---- */

typedef struct {
  uint32_t h[8];
  uint64_t len;
  uint8_t buf[64];
  size_t nbuf;
} Sha256;

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_block(Sha256 *s, const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
    uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d, s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}

static void sha_init(Sha256 *s) {
  static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, iv, sizeof iv);
  s->len = 0;
  s->nbuf = 0;
}

static void sha_update(Sha256 *s, const void *data, size_t n) {
  const uint8_t *p = data;
  s->len += n;
  while (n) {
    size_t k = 64 - s->nbuf < n ? 64 - s->nbuf : n;
    memcpy(s->buf + s->nbuf, p, k);
    s->nbuf += k, p += k, n -= k;
    if (s->nbuf == 64) {
      sha_block(s, s->buf);
      s->nbuf = 0;
    }
  }
}

static void sha_final(Sha256 *s, uint8_t out[32]) {
  uint64_t bits = s->len * 8;
  uint8_t pad = 0x80;
  sha_update(s, &pad, 1);
  uint8_t zero = 0;
  while (s->nbuf != 56) sha_update(s, &zero, 1);
  uint8_t l[8];
  for (int i = 0; i < 8; i++) l[i] = (uint8_t)(bits >> (56 - 8 * i));
  sha_update(s, l, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->h[i];
  }
}

static void hex(const uint8_t d[32], char out[65]) {
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

void cg_cuda_sha256_hex(const void *data, size_t n, char out[65]) {
  Sha256 s;
  uint8_t d[32];
  sha_init(&s);
  sha_update(&s, data, n);
  sha_final(&s, d);
  hex(d, out);
}

void cu_cache_key(const char *source, const char *const *opts, int nopts, const char *arch, const char *version,
                  char out[65]) {
  Sha256 s;
  uint8_t d[32];
  static const char tag[] = "smelt-cuda-cache 1";
  sha_init(&s);
  /* each field with its terminating NUL: no two field lists hash alike */
  sha_update(&s, tag, sizeof tag);
  sha_update(&s, source, strlen(source) + 1);
  for (int i = 0; i < nopts; i++) sha_update(&s, opts[i], strlen(opts[i]) + 1);
  sha_update(&s, arch, strlen(arch) + 1);
  sha_update(&s, version, strlen(version) + 1);
  sha_final(&s, d);
  hex(d, out);
}

/* ---- the directory ---- */

char *cg_cuda_cache_dir(const CgCudaCompileOptions *o) {
  const char *base = o && o->cache_dir ? o->cache_dir : NULL;
  char buf[4096];
  if (!base) {
    const char *e = getenv("SMELT_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (e && e[0]) base = e;
    else if (x && x[0]) snprintf(buf, sizeof buf, "%s/smelt", x), base = buf;
    else if (home && home[0]) snprintf(buf, sizeof buf, "%s/.cache/smelt", home), base = buf;
    else return NULL;
  }
  char *dir = malloc(strlen(base) + 8);
  if (dir) sprintf(dir, "%s/cuda", base);
  return dir;
}

void cg_cuda_make_dirs(const char *path) {
  char *p = strdup(path);
  if (!p) return;
  for (char *q = p + 1; *q; q++) {
    if (*q != '/') continue;
    *q = 0;
    mkdir(p, 0755);
    *q = '/';
  }
  mkdir(p, 0755);
  free(p);
}

#define CACHE_HEADER 64

static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

bool cu_cache_read(const char *dir, const char *key, CgCudaBinary *out) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s.bin", dir, key);
  FILE *fp = fopen(path, "rb");
  if (!fp) return false;
  bool ok = false;
  uint8_t h[CACHE_HEADER];
  uint8_t *payload = NULL;
  if (fread(h, 1, sizeof h, fp) == sizeof h && memcmp(h, "SMELTCUB", 8) == 0 && h[8] == 1) {
    uint64_t nc = get64(h + 16), np = get64(h + 24);
    if (nc < ((uint64_t)1 << 32) && np < ((uint64_t)1 << 32)) {
      payload = malloc((size_t)(nc + np + 1));
      if (payload && fread(payload, 1, (size_t)(nc + np), fp) == nc + np && fgetc(fp) == EOF) {
        Sha256 s;
        uint8_t d[32];
        sha_init(&s);
        sha_update(&s, payload, (size_t)(nc + np));
        sha_final(&s, d);
        if (memcmp(d, h + 32, 32) == 0) {
          out->cubin = nc ? malloc((size_t)nc) : NULL;
          out->ptx = malloc((size_t)np + 1);
          if ((out->cubin || !nc) && out->ptx) {
            if (nc) memcpy(out->cubin, payload, (size_t)nc);
            memcpy(out->ptx, payload + nc, (size_t)np);
            out->ptx[np] = 0;
            out->cubin_len = (size_t)nc;
            out->ptx_len = (size_t)np;
            ok = true;
          } else {
            free(out->cubin), free(out->ptx);
            out->cubin = NULL, out->ptx = NULL;
          }
        }
      }
    }
  }
  free(payload);
  fclose(fp);
  return ok;
}

void cu_cache_write(const char *dir, const char *key, const CgCudaBinary *b) {
  cg_cuda_make_dirs(dir);
  char tmp[4200], path[4200];
  snprintf(tmp, sizeof tmp, "%s/.tmp-%s-XXXXXX", dir, key);
  snprintf(path, sizeof path, "%s/%s.bin", dir, key);
  int fd = mkstemp(tmp);
  if (fd < 0) return;
  uint8_t h[CACHE_HEADER] = {0};
  memcpy(h, "SMELTCUB", 8);
  h[8] = 1;
  put64(h + 16, b->cubin_len);
  put64(h + 24, b->ptx_len);
  Sha256 s;
  sha_init(&s);
  if (b->cubin_len) sha_update(&s, b->cubin, b->cubin_len);
  sha_update(&s, b->ptx, b->ptx_len);
  sha_final(&s, h + 32);
  FILE *fp = fdopen(fd, "wb");
  if (!fp) {
    close(fd);
    unlink(tmp);
    return;
  }
  bool ok = fwrite(h, 1, sizeof h, fp) == sizeof h;
  if (ok && b->cubin_len) ok = fwrite(b->cubin, 1, b->cubin_len, fp) == b->cubin_len;
  if (ok && b->ptx_len) ok = fwrite(b->ptx, 1, b->ptx_len, fp) == b->ptx_len;
  if (fclose(fp) != 0) ok = false;
  if (!ok || rename(tmp, path) != 0) unlink(tmp);
}
