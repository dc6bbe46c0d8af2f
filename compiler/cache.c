/* The compile cache (compiler/cache.h).
 *
 * The key material is assembled as NUL-terminated "name=value" fields in
 * one buffer and hashed once (the material is small: the model text, a
 * few hashes and options).  Entries are whole bundle files: a hit is a
 * hard link to the entry (as ccache's hard-link mode: no bytes copied, so
 * a 700 MB bundle comes back in milliseconds), else a copy done in the
 * kernel (FICLONE where the file system can share extents, else
 * copy_file_range), to a temporary name renamed over the output, like every
 * bundle write.  Storing is the same in the other direction: a large
 * fresh bundle is linked into the cache (and so made read-only, like a
 * hit's output), a small one copied.  Only bundles of SC_CACHE_LINK_BYTES or more are linked
 * (smaller ones copy in well under the 0.2 s a hit may take, and stay
 * independent files).  A linked output shares the entry's inode: both are
 * made read-only (0444), and every writer of bundles replaces the file by
 * rename rather than writing into it, so recompiling never changes the
 * entry; a bundle damaged in place anyway is caught by the loader's
 * checksums. */
#define _GNU_SOURCE /* dladdr, copy_file_range */
#include "compiler/cache.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/cuda/cg_cuda.h"
#include "compiler/cpu_target.h"
#include "format/bundle.h"
#include "format/weights.h"
#include "frontend/frontend.h"
#include "ir/bytes.h"
#include "ir/serialize.h"

#ifndef SMELT_LLVM_VERSION
#define SMELT_LLVM_VERSION "none"
#endif

#ifndef FICLONE
#define FICLONE _IOW(0x94, 9, int)
#endif

static void field(ByteBuf *b, const char *name, const char *value) {
  bb_printf(b, "%s=", name);
  if (value) bb_put(b, value, strlen(value));
  else bb_put(b, "\x01(null)", 7); /* NULL and "" differ */
  bb_put(b, "", 1);
}

static void field_int(ByteBuf *b, const char *name, long long v) {
  char num[32];
  snprintf(num, sizeof num, "%lld", v);
  field(b, name, num);
}

/* A file's size and CRC as a field; ST_IO when it cannot be read. */
static smelt_status field_file(ByteBuf *b, const char *name, const char *path) {
  uint64_t size;
  uint32_t crc;
  RETURN_IF_ERROR(fmt_weights_hash_file(path, &size, &crc));
  char buf[64];
  snprintf(buf, sizeof buf, "%llu:%08x", (unsigned long long)size, crc);
  field(b, name, buf);
  return NULL;
}

/* The file holding this code (the smelt tool, or libsmelt.so). */
static smelt_status field_self(ByteBuf *b) {
  Dl_info info;
  if (!dladdr((void *)&sc_cache_key, &info) || !info.dli_fname || !info.dli_fname[0])
    return st_error(ST_UNSUPPORTED, "cannot tell which file the compiler is");
  const char *self = info.dli_fname;
  /* the executable itself may be reported by its name on the command line */
  char exe[PATH_MAX];
  ssize_t n = strchr(self, '/') ? -1 : readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) exe[n] = 0, self = exe;
  return field_file(b, "compiler", self);
}

smelt_status sc_cache_key(const char *model_path, const ScCompileOptions *o, char out_key[65]) {
  out_key[0] = 0;
  size_t ml = strlen(model_path);
  if (ml < 5 || (strcmp(model_path + ml - 5, ".yaml") != 0 && (ml < 4 || strcmp(model_path + ml - 4, ".yml") != 0)))
    return st_error(ST_UNSUPPORTED, "the compile cache takes YAML models only");
  ByteBuf b = {0};
  field(&b, "smelt-compile-cache", "1");
  field(&b, "smelt_version", SMELT_LIB_VERSION);
  field_int(&b, "graph_format", IR_SERIAL_VERSION);
  field_int(&b, "bundle_format", FMT_BUNDLE_VERSION);
  field(&b, "llvm", SMELT_LLVM_VERSION);
  smelt_status st = field_self(&b);
  /* the model: its text and the path it is named by (the manifest has it) */
  unsigned char *text = NULL;
  size_t tlen = 0;
  if (!st) {
    FILE *f = fopen(model_path, "rb");
    if (!f) st = st_error(ST_IO, "%s: cannot open", model_path);
    else {
      ByteBuf t = {0};
      char chunk[65536];
      size_t k;
      while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) bb_put(&t, chunk, k);
      fclose(f);
      text = t.p, tlen = t.len;
      if (t.oom) st = st_error(ST_NO_MEMORY, "out of memory");
    }
  }
  if (!st) {
    field(&b, "model", o->model ? o->model : model_path);
    bb_printf(&b, "model_text=%zu:", tlen);
    bb_put(&b, text, tlen);
    bb_put(&b, "", 1);
  }
  free(text);
  char **weights = NULL;
  int nweights = 0;
  if (!st) st = fe_yaml_weights_files(model_path, &weights, &nweights);
  for (int i = 0; i < nweights; i++) {
    char abs[PATH_MAX];
    if (!st) field(&b, "weights", weights[i]);
    if (!st) field(&b, "weights_abs", realpath(weights[i], abs) ? abs : "?");
    if (!st) st = field_file(&b, "weights_content", weights[i]);
    free(weights[i]);
  }
  free(weights);
  bool cpu = false, cuda = false;
  if (!st) st = sc_parse_targets(o->targets, &cpu, &cuda);
  if (!st) {
    field(&b, "targets", o->targets ? o->targets : "cpu");
    field(&b, "dims", o->dims);
    field(&b, "dtype", o->dtype);
    field(&b, "passes", o->passes);
    field_int(&b, "onchip_bytes", (long long)o->onchip_bytes);
    field_int(&b, "threads", o->threads);
    field_int(&b, "external_weights", o->external_weights);
    field_int(&b, "tp", o->tp);
  }
  if (!st && cpu) {
    /* native means this machine: the variants as LLVM will be told them */
    ScCpuTargets t = {0};
    st = sc_cpu_targets_parse(o->cpu, &t);
    for (int i = 0; !st && i < t.n; i++) {
      field(&b, "cpu_variant", t.v[i].name);
      field(&b, "cpu_llvm", t.v[i].llvm_cpu);
      field(&b, "cpu_features", t.v[i].features);
    }
    sc_cpu_targets_free(&t);
  }
  if (!st && cuda) {
    field(&b, "archs", o->archs);
    field_int(&b, "allow_tf32", o->allow_tf32);
    field(&b, "tune_table", o->tune_table);
    if (o->tune_table) st = field_file(&b, "tune_table_content", o->tune_table);
    CgNvrtc *nv = NULL;
    if (!st) st = cg_cuda_nvrtc_open(&nv);
    if (!st) field(&b, "nvrtc", cg_cuda_nvrtc_version(nv));
    cg_cuda_nvrtc_close(nv);
  }
  if (!st && b.oom) st = st_error(ST_NO_MEMORY, "out of memory");
  if (!st) cg_cuda_sha256_hex(b.p, b.len, out_key);
  free(b.p);
  return st;
}

char *sc_cache_dir(void) {
  const char *e = getenv("SMELT_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  char buf[4096];
  if (e && e[0]) snprintf(buf, sizeof buf, "%s/bundles", e);
  else if (x && x[0]) snprintf(buf, sizeof buf, "%s/smelt/bundles", x);
  else if (home && home[0]) snprintf(buf, sizeof buf, "%s/.cache/smelt/bundles", home);
  else return NULL;
  return strdup(buf);
}

/* Copies the file open at in (size bytes) to out: shared extents when the
 * file system can, else an in-kernel copy, else read and write. */
static bool copy_fd(int in, int out, size_t size) {
  if (ioctl(out, FICLONE, in) == 0) return true;
  size_t done = 0;
  while (done < size) {
    ssize_t k = copy_file_range(in, NULL, out, NULL, size - done, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    done += (size_t)k;
  }
  if (done == size) return true;
  if (lseek(in, (off_t)done, SEEK_SET) < 0 || lseek(out, (off_t)done, SEEK_SET) < 0) return false;
  char buf[1 << 16];
  while (done < size) {
    ssize_t k = read(in, buf, sizeof buf);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    for (ssize_t w = 0; w < k;) {
      ssize_t m = write(out, buf + w, (size_t)(k - w));
      if (m < 0 && errno == EINTR) continue;
      if (m <= 0) return false;
      w += m;
    }
    done += (size_t)k;
  }
  return true;
}

/* Whether the file open at fd looks like a whole bundle: its header's
 * magic and declared size (the full check is the loader's). */
static bool whole_bundle(int fd, size_t *out_size) {
  struct stat sb;
  unsigned char h[FMT_BUNDLE_HEADER_BYTES];
  if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode) || pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) return false;
  uint64_t declared = 0;
  for (int i = 0; i < 8; i++) declared |= (uint64_t)h[16 + i] << (8 * i);
  *out_size = (size_t)sb.st_size;
  return memcmp(h, FMT_BUNDLE_MAGIC, 8) == 0 && declared == (uint64_t)sb.st_size;
}

/* Copies src to dst through a temporary file beside dst and a rename. */
static bool copy_file_atomic(const char *src, const char *dst, bool check_bundle) {
  int in = open(src, O_RDONLY);
  if (in < 0) return false;
  size_t size = 0;
  if (check_bundle ? !whole_bundle(in, &size) : false) {
    close(in);
    return false;
  }
  if (!check_bundle) {
    struct stat sb;
    if (fstat(in, &sb) < 0) {
      close(in);
      return false;
    }
    size = (size_t)sb.st_size;
  }
  size_t n = strlen(dst) + 16;
  char *tmp = malloc(n);
  if (!tmp) {
    close(in);
    return false;
  }
  snprintf(tmp, n, "%s.tmp-XXXXXX", dst);
  int out = mkstemp(tmp);
  bool ok = out >= 0 && copy_fd(in, out, size) && fchmod(out, 0644) == 0;
  if (out >= 0 && close(out) != 0) ok = false;
  close(in);
  if (ok && rename(tmp, dst) != 0) ok = false;
  if (!ok && out >= 0) unlink(tmp);
  free(tmp);
  return ok;
}

static char *entry_path(const char *key) {
  char *dir = sc_cache_dir();
  if (!dir) return NULL;
  size_t n = strlen(dir) + strlen(key) + 16;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s.smelt", dir, key);
  free(dir);
  return p;
}

/* Links entry to dst through a temporary name and a rename (same file
 * system only). */
#define SC_CACHE_LINK_BYTES ((size_t)64 << 20)
static bool link_file_atomic(const char *entry, const char *dst) {
  int fd = open(entry, O_RDONLY);
  size_t size = 0;
  bool whole = fd >= 0 && whole_bundle(fd, &size);
  if (fd >= 0) close(fd);
  /* SMELT_CACHE_LINK_MIN (bytes) moves the threshold: tests link small bundles */
  const char *min = getenv("SMELT_CACHE_LINK_MIN");
  size_t threshold = min && *min ? (size_t)strtoull(min, NULL, 10) : SC_CACHE_LINK_BYTES;
  if (!whole || size < threshold) return false;
  /* already one file (a hit on the output the entry was linked from):
   * rename() between two links of one inode would do nothing */
  struct stat se, sd;
  if (stat(entry, &se) == 0 && stat(dst, &sd) == 0 && se.st_dev == sd.st_dev && se.st_ino == sd.st_ino)
    return chmod(dst, 0444) == 0;
  size_t n = strlen(dst) + 32;
  char *tmp = malloc(n);
  if (!tmp) return false;
  bool ok = false;
  for (int i = 0; i < 16 && !ok; i++) {
    snprintf(tmp, n, "%s.link-%d-%d", dst, (int)getpid(), i);
    if (link(entry, tmp) == 0) ok = true;
    else if (errno != EEXIST) break;
  }
  if (ok && (chmod(tmp, 0444) != 0 || rename(tmp, dst) != 0)) {
    unlink(tmp);
    ok = false;
  }
  free(tmp);
  return ok;
}

bool sc_cache_fetch(const char *key, const char *out_path) {
  char *entry = entry_path(key);
  bool ok = entry && (link_file_atomic(entry, out_path) || copy_file_atomic(entry, out_path, true));
  free(entry);
  return ok;
}

void sc_cache_store(const char *key, const char *bundle_path) {
  char *dir = sc_cache_dir(), *entry = entry_path(key);
  if (dir && entry) {
    cg_cuda_make_dirs(dir);
    /* a large bundle is linked in, as a hit links it out: writing 700 MB a
     * second time was a third of a cold W4 compile */
    if (!link_file_atomic(bundle_path, entry)) copy_file_atomic(bundle_path, entry, true);
  }
  free(dir);
  free(entry);
}
