/* A program that deploys smelt as a user would: it includes <smelt.h>
 * alone and links libsmelt_runtime alone (no compiler, LLVM, libyaml or
 * jansson).  It opens a bundle, fills every input with deterministic data
 * (or reads it), runs once on the CPU (or a GPU), and writes each input and
 * output as raw bytes into a directory, printing one line per tensor:
 *
 *   run_bundle BUNDLE OUTDIR [--device cpu|cuda] [--threads N]
 *   -> "input x f32 4x64" / "output y f32 4x10" lines, OUTDIR/in_x.bin,
 *      OUTDIR/out_y.bin
 *   run_bundle BUNDLE --time-open
 *   -> "open_ms 12.3": how long smelt_bundle_open took (the median of 5)
 *
 * tests/install/test_runtime_alone.py compares those outputs with the
 * compiler-side `smelt run` on the same inputs, and test_install.py builds
 * this file against an installed prefix with pkg-config and with CMake.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <smelt.h>

static size_t dtype_bytes(smelt_dtype dt) {
  switch (dt) {
  case SMELT_F64: case SMELT_I64: return 8;
  case SMELT_F32: case SMELT_I32: return 4;
  case SMELT_F16: case SMELT_BF16: return 2;
  default: return 1;
  }
}

static const char *dtype_name(smelt_dtype dt) {
  static const char *const names[] = {"?", "f32", "f16", "bf16", "f64", "i64", "i32", "i8", "u8", "bool"};
  return dt >= SMELT_F32 && dt <= SMELT_BOOL ? names[dt] : "?";
}

/* Inputs: floats in [-1, 1) from a fixed LCG; integers small and
 * non-negative (token ids, positions); f16/bf16 as their bit patterns of
 * such floats. */
static void fill(void *p, smelt_dtype dt, size_t n, uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    float f = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
    switch (dt) {
    case SMELT_F32: ((float *)p)[i] = f; break;
    case SMELT_F64: ((double *)p)[i] = f; break;
    case SMELT_I64: ((int64_t *)p)[i] = (int64_t)(i % 7); break;
    case SMELT_I32: ((int32_t *)p)[i] = (int32_t)(i % 7); break;
    case SMELT_F16: {
      /* round f to half by hand: sign, 5-bit exponent, 10-bit mantissa */
      uint32_t b;
      memcpy(&b, &f, 4);
      uint32_t sign = (b >> 16) & 0x8000u, e = (b >> 23) & 0xff, m = b & 0x7fffffu;
      uint16_t h = (uint16_t)(e < 103 ? sign : sign | (((e - 112) << 10) + (m >> 13)));
      if (e < 113 && e >= 103) h = (uint16_t)(sign | ((m | 0x800000u) >> (126 - e)));
      ((uint16_t *)p)[i] = h;
      break;
    }
    case SMELT_BF16: {
      uint32_t b;
      memcpy(&b, &f, 4);
      ((uint16_t *)p)[i] = (uint16_t)(b >> 16);
      break;
    }
    default: ((uint8_t *)p)[i] = (uint8_t)(i % 2); break;
    }
  }
}

static void file_name(char *buf, size_t cap, const char *dir, const char *kind, const char *name) {
  int n = snprintf(buf, cap, "%s/%s_", dir, kind);
  for (const char *c = name; *c && (size_t)n + 1 < cap; c++) buf[n++] = *c == '/' ? '~' : *c;
  buf[n] = 0;
  strncat(buf, ".bin", cap - strlen(buf) - 1);
}

static int fail(smelt_status st, const char *what) {
  fprintf(stderr, "run_bundle: %s: %s\n", what, smelt_status_message(st));
  smelt_status_free(st);
  return 1;
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Opens the bundle five times and prints the median time. */
static int time_open(const char *path) {
  double ms[5];
  for (int i = 0; i < 5; i++) {
    smelt_bundle *b = NULL;
    double t0 = now_ms();
    smelt_status st = smelt_bundle_open(path, &b);
    ms[i] = now_ms() - t0;
    if (st) return fail(st, path);
    smelt_bundle_close(b);
  }
  for (int i = 1; i < 5; i++)
    for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
      double t = ms[j];
      ms[j] = ms[j - 1];
      ms[j - 1] = t;
    }
  printf("open_ms %.2f\n", ms[2]);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[2], "--time-open") == 0) return time_open(argv[1]);
  if (argc < 3) {
    fprintf(stderr, "usage: run_bundle BUNDLE OUTDIR [--device cpu|cuda] [--threads N]\n");
    return 2;
  }
  const char *device = "cpu";
  smelt_session_options opt = {.threads = 1};
  for (int i = 3; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--device") == 0) device = argv[i + 1];
    else if (strcmp(argv[i], "--threads") == 0) opt.threads = atoi(argv[i + 1]);
  }
  smelt_bundle *b = NULL;
  smelt_session *s = NULL;
  smelt_status st = smelt_bundle_open(argv[1], &b);
  if (st) return fail(st, argv[1]);
  if ((st = smelt_session_create(b, device, &opt, &s))) {
    smelt_bundle_close(b);
    return fail(st, "session");
  }
  int nin = smelt_session_num_inputs(s), nout = smelt_session_num_outputs(s), rc = 0;
  void **bufs = calloc((size_t)(nin + nout), sizeof *bufs);
  size_t *sizes = calloc((size_t)(nin + nout), sizeof *sizes);
  for (int k = 0; k < nin + nout && !rc; k++) {
    smelt_tensor_info ti;
    if (k < nin) smelt_session_input_info(s, k, &ti);
    else smelt_session_output_info(s, k - nin, &ti);
    size_t n = 1;
    printf("%s %s %s ", k < nin ? "input" : "output", ti.name, dtype_name(ti.dtype));
    for (int d = 0; d < ti.rank; d++) {
      n *= (size_t)ti.dims[d];
      printf("%s%lld", d ? "x" : "", (long long)ti.dims[d]);
    }
    printf(ti.rank ? "\n" : "scalar\n");
    sizes[k] = n * dtype_bytes(ti.dtype);
    bufs[k] = calloc(1, sizes[k] ? sizes[k] : 1);
    if (k < nin) {
      fill(bufs[k], ti.dtype, n, (uint32_t)k);
      st = smelt_session_bind_input(s, ti.name, bufs[k], sizes[k]);
    } else {
      st = smelt_session_bind_output(s, ti.name, bufs[k], sizes[k]);
    }
    if (st) rc = fail(st, ti.name);
  }
  if (!rc && (st = smelt_session_run(s))) rc = fail(st, "run");
  for (int k = 0; k < nin + nout && !rc; k++) {
    smelt_tensor_info ti;
    if (k < nin) smelt_session_input_info(s, k, &ti);
    else smelt_session_output_info(s, k - nin, &ti);
    char path[4096];
    file_name(path, sizeof path, argv[2], k < nin ? "in" : "out", ti.name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bufs[k], 1, sizes[k], f) != sizes[k]) {
      fprintf(stderr, "run_bundle: cannot write %s\n", path);
      rc = 1;
    }
    if (f) fclose(f);
  }
  for (int k = 0; k < nin + nout; k++) free(bufs[k]);
  free(bufs);
  free(sizes);
  smelt_session_destroy(s);
  smelt_bundle_close(b);
  return rc;
}
