/* libFuzzer target: opening a `.smelt` bundle (format/bundle.c, then
 * runtime/loader.c: manifest, constants, external weights table, the
 * serialised graph and its verifier, the kernel table, specialisations, the
 * CPU object through the ELF loader, the CUDA launch table), through
 * rt_bundle_check_bytes, which runs none of the bundle's code.
 *
 * Built twice.  fuzz_bundle takes the input as it is, so almost every
 * mutation stops at a checksum.  fuzz_bundle_crc (FUZZ_FIX_CHECKSUMS) first
 * makes the container consistent again, as a writer would (bundle.h): the
 * magic, the version and the declared size; each section's CRC-32C where
 * its table entry lies inside the file; then the file's CRC over every byte
 * but its own field.  A mutation then reaches the structure behind the
 * checksums: the graph, the tables, the object code. */
#include "format/bundle.h"
#include "fuzz.h"
#include "runtime/runtime.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef FUZZ_FIX_CHECKSUMS
static void put_le(unsigned char *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_le(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void fix_checksums(unsigned char *b, size_t len) {
  if (len < FMT_BUNDLE_HEADER_BYTES) return;
  memcpy(b, FMT_BUNDLE_MAGIC, 8);
  put_le(b + 8, FMT_BUNDLE_VERSION, 4);
  put_le(b + 16, len, 8);
  uint64_t count = get_le(b + 12, 4);
  if (count <= FMT_BUNDLE_MAX_SECTIONS && count * FMT_BUNDLE_ENTRY_BYTES <= len - FMT_BUNDLE_HEADER_BYTES) {
    for (uint64_t i = 0; i < count; i++) {
      unsigned char *e = b + FMT_BUNDLE_HEADER_BYTES + i * FMT_BUNDLE_ENTRY_BYTES;
      uint64_t off = get_le(e + 64, 8), sz = get_le(e + 72, 8);
      if (off <= len && sz <= len - off) put_le(e + 80, fmt_crc32c(0, b + off, (size_t)sz), 8);
    }
  }
  uint32_t crc = fmt_crc32c(0, b, 24);
  crc = fmt_crc32c(crc, b + FMT_BUNDLE_HEADER_BYTES, len - FMT_BUNDLE_HEADER_BYTES);
  put_le(b + 24, crc, 8);
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* the tests run in the source tree: a bundle with external weights
   * finds tests/fuzz/weights.safetensors beside it */
  const char *name = "tests/fuzz/fuzz.smelt";
#ifdef FUZZ_FIX_CHECKSUMS
  unsigned char *copy = malloc(size ? size : 1);
  if (!copy) abort();
  memcpy(copy, data, size);
  fix_checksums(copy, size);
  smelt_status st = rt_bundle_check_bytes(copy, size, name);
  free(copy);
#else
  smelt_status st = rt_bundle_check_bytes(data, size, name);
#endif
  fuzz_check_error(st, name);
  return 0;
}
