/* The CUDA launch table: encoding and the untrusted decoder (the format is
 * described in format/cuda_launch.h).  The decoder checks every field
 * against the limits of the hardware the runtime can launch on (at most
 * 1024 threads a block, 256 KiB of shared memory, grid limits), so a
 * corrupted table is refused here rather than by the driver. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/cuda_launch.h"
#include "ir/bytes.h"
#include "ir/dtype.h"

void fmt_cuda_module_free(FmtCudaModule *m) {
  if (!m) return;
  for (int u = 0; u < m->nunits && m->units; u++) free(m->units[u]);
  free(m->units);
  free(m->kernels);
  free(m);
}

int fmt_cuda_module_find(const FmtCudaModule *m, const char *name) {
  for (int i = 0; i < m->nkernels; i++)
    if (strcmp(m->kernels[i].symbol, name) == 0 || strcmp(m->kernels[i].name, name) == 0) return i;
  return -1;
}

/* ---- the launch table ---- */

static const char *const kinds[] = {"elementwise", "reduction", "matmul", "conv2d", "attention", "pool", "collective"};

smelt_status fmt_cuda_launch_encode(const FmtCudaModule *m, char **out_text, size_t *out_len) {
  ByteBuf b = {0};
  bb_printf(&b, "smelt-cuda-launch 3\nunits %d\nkernels %d\n", m->nunits, m->nkernels);
  for (int i = 0; i < m->nkernels; i++) {
    const FmtCudaLaunch *l = &m->kernels[i];
    bb_printf(&b, "kernel %s %d %d %u %u %u %u %u %u %u %s %d %s %llu %d %d %s\n", l->symbol, l->unit, l->nargs,
                  l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2], l->smem,
                  l->kind ? l->kind : "elementwise", l->vectorised ? 1 : 0, l->variant[0] ? l->variant : "-",
                  (unsigned long long)l->workspace, l->ntmaps, l->pdl ? 1 : 0, l->name);
    /* a TMA descriptor: arg dtype rank, then dims, strides, box (rank, rank-1, rank numbers) and swizzle */
    for (int t = 0; t < l->ntmaps; t++) {
      const FmtCudaTmap *tm = &l->tmaps[t];
      bb_printf(&b, "tmap %d %d %d", tm->arg, tm->dtype, tm->rank);
      for (int d = 0; d < tm->rank; d++) bb_printf(&b, " %llu", (unsigned long long)tm->dims[d]);
      for (int d = 0; d + 1 < tm->rank; d++) bb_printf(&b, " %llu", (unsigned long long)tm->strides[d]);
      for (int d = 0; d < tm->rank; d++) bb_printf(&b, " %u", tm->box[d]);
      bb_printf(&b, " %d\n", tm->swizzle);
    }
  }
  bb_u8(&b, 0);
  if (b.oom) {
    free(b.p);
    return st_error(ST_NO_MEMORY, "out of memory encoding the CUDA launch table");
  }
  *out_len = b.len - 1;
  *out_text = (char *)b.p;
  return NULL;
}

static bool is_ident(const char *s) {
  if (!isalpha((unsigned char)s[0]) && s[0] != '_') return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '_') return false;
  return true;
}

/* "tmap ARG DTYPE RANK dims.. strides.. box.. SWIZZLE", every number checked. */
static bool decode_tmap(const char *line, int nargs, FmtCudaTmap *tm) {
  const char *p = line;
  if (strncmp(p, "tmap ", 5) != 0) return false;
  p += 5;
  long long v[3 + 5 + 4 + 5 + 1];
  int nv = 0;
  while (*p && nv < (int)(sizeof v / sizeof *v)) {
    char *end;
    v[nv] = strtoll(p, &end, 10);
    if (end == p) return false;
    nv++;
    p = end;
    while (*p == ' ') p++;
  }
  if (*p || nv < 3) return false;
  int rank = (int)v[2];
  if (rank < 1 || rank > 5 || nv != 3 + rank + (rank - 1) + rank + 1) return false;
  tm->arg = (int)v[0], tm->dtype = (int)v[1], tm->rank = rank;
  if (v[0] < 0 || v[0] >= nargs || v[1] < 0 || v[1] >= DT_COUNT) return false;
  const long long *d = v + 3, *st = d + rank, *bx = st + rank - 1;
  for (int i = 0; i < rank; i++) {
    if (d[i] < 1 || d[i] > ((long long)1 << 32) || bx[i] < 1 || bx[i] > 256) return false;
    tm->dims[i] = (uint64_t)d[i];
    tm->box[i] = (uint32_t)bx[i];
  }
  for (int i = 0; i + 1 < rank; i++) {
    if (st[i] < 16 || st[i] % 16 != 0 || st[i] >= ((long long)1 << 40)) return false;
    tm->strides[i] = (uint64_t)st[i];
  }
  long long sw = bx[rank];
  if (sw != 0 && sw != 32 && sw != 64 && sw != 128) return false;
  tm->swizzle = (int)sw;
  return true;
}

smelt_status fmt_cuda_launch_decode(const void *text, size_t len, FmtCudaModule **out_module) {
  *out_module = NULL;
  char *s = malloc(len + 1);
  if (!s) return st_error(ST_NO_MEMORY, "out of memory reading the CUDA launch table");
  memcpy(s, text, len);
  s[len] = 0;
  if (strlen(s) != len) {
    free(s);
    return st_error(ST_INVALID_INPUT, "CUDA launch table: contains a NUL byte");
  }
  FmtCudaModule *m = calloc(1, sizeof *m);
  smelt_status st = NULL;
  char *save = NULL, *line = strtok_r(s, "\n", &save);
  int nunits = -1, nk = -1, got = 0, version = 0;
  if (!m) st = st_error(ST_NO_MEMORY, "out of memory reading the CUDA launch table");
  else if (line && strcmp(line, "smelt-cuda-launch 2") == 0) version = 2;
  else if (line && strcmp(line, "smelt-cuda-launch 3") == 0) version = 3;
  else st = st_error(ST_INVALID_INPUT, "CUDA launch table: bad header");
  if (!st) {
    line = strtok_r(NULL, "\n", &save);
    if (!line || sscanf(line, "units %d", &nunits) != 1 || nunits < 1 || nunits > 4096)
      st = st_error(ST_INVALID_INPUT, "CUDA launch table: bad unit count");
  }
  if (!st) {
    line = strtok_r(NULL, "\n", &save);
    if (!line || sscanf(line, "kernels %d", &nk) != 1 || nk < 0 || nk > 1000000)
      st = st_error(ST_INVALID_INPUT, "CUDA launch table: bad kernel count");
  }
  if (!st) {
    m->nunits = nunits;
    m->units = calloc((size_t)nunits, sizeof(char *));
    m->nkernels = nk;
    m->kernels = calloc((size_t)(nk ? nk : 1), sizeof *m->kernels);
    if (!m->units || !m->kernels) st = st_error(ST_NO_MEMORY, "out of memory reading the CUDA launch table");
  }
  while (!st && (line = strtok_r(NULL, "\n", &save)) != NULL) {
    if (got >= nk) {
      st = st_error(ST_INVALID_INPUT, "CUDA launch table: more kernels than announced");
      break;
    }
    FmtCudaLaunch *l = &m->kernels[got];
    char sym[256], kind[32], name[256], variant[256];
    int vec, pdl = 0, consumed = 0;
    unsigned long long ws = 0;
    /* the fields up to NTMAPS, then (version 3) PDL, then NAME */
    int at = 0, tail = 0;
    bool ok = sscanf(line, "kernel %255s %d %d %u %u %u %u %u %u %u %31s %d %255s %llu %d%n", sym, &l->unit, &l->nargs,
                     &l->grid[0], &l->grid[1], &l->grid[2], &l->block[0], &l->block[1], &l->block[2], &l->smem, kind,
                     &vec, variant, &ws, &l->ntmaps, &at) == 15;
    if (ok && version >= 3) {
      ok = sscanf(line + at, " %d%n", &pdl, &tail) == 1 && (pdl == 0 || pdl == 1);
      at += tail;
    }
    tail = 0;
    ok = ok && sscanf(line + at, " %255s%n", name, &tail) == 1;
    consumed = at + tail;
    unsigned long long threads = (unsigned long long)l->block[0] * l->block[1] * l->block[2];
    const char *k = NULL;
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
      if (ok && strcmp(kind, kinds[i]) == 0) k = kinds[i];
    if (!ok || line[consumed] != 0 || strlen(sym) >= sizeof l->symbol || !is_ident(sym) ||
        strlen(name) >= sizeof l->name || l->unit < 0 || l->unit >= nunits || l->nargs < 0 || l->nargs > 4096 ||
        threads == 0 || threads > 1024 || l->grid[0] == 0 || l->grid[0] > 0x7fffffffu || l->grid[1] == 0 ||
        l->grid[1] > 65535 || l->grid[2] == 0 || l->grid[2] > 65535 || l->smem > 256 * 1024 || !k ||
        (vec != 0 && vec != 1) || strlen(variant) >= sizeof l->variant || ws > ((unsigned long long)1 << 40) ||
        l->ntmaps < 0 || l->ntmaps > FMT_MAX_TMAPS) {
      st = st_error(ST_INVALID_INPUT, "CUDA launch table: bad kernel line %d", got + 1);
      break;
    }
    memcpy(l->symbol, sym, strlen(sym) + 1); /* lengths checked above */
    memcpy(l->name, name, strlen(name) + 1);
    if (strcmp(variant, "-") != 0) memcpy(l->variant, variant, strlen(variant) + 1);
    l->workspace = ws;
    l->kind = k;
    l->vectorised = vec == 1;
    l->pdl = pdl == 1;
    for (int t = 0; t < l->ntmaps && !st; t++) {
      line = strtok_r(NULL, "\n", &save);
      if (!line || !decode_tmap(line, l->nargs, &l->tmaps[t]))
        st = st_error(ST_INVALID_INPUT, "CUDA launch table: bad TMA descriptor %d of kernel line %d", t, got + 1);
    }
    if (st) break;
    got++;
  }
  if (!st && got != nk) st = st_error(ST_INVALID_INPUT, "CUDA launch table: %d kernels, announced %d", got, nk);
  free(s);
  if (st) {
    fmt_cuda_module_free(m);
    return st;
  }
  *out_module = m;
  return NULL;
}
