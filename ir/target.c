/* Target facts (ir/target.h).  Arch names are parsed by hand: "sm_" or
 * "compute_", at least two digits, and an optional 'a'/'f' suffix, which is
 * what NVRTC's --gpu-architecture takes.  The limits are the CUDA
 * programming guide's table of compute capabilities; the CPU's L2 comes
 * from sysfs, the one place Linux reports it without cpuid parsing. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/target.h"

bool ir_cuda_parse_arch(const char *arch, int *out_cc, bool *out_specific) {
  const char *p = NULL;
  if (strncmp(arch, "sm_", 3) == 0) p = arch + 3;
  else if (strncmp(arch, "compute_", 8) == 0) p = arch + 8;
  if (!p || !isdigit((unsigned char)p[0]) || !isdigit((unsigned char)p[1])) return false;
  int cc = 0;
  while (isdigit((unsigned char)*p)) cc = cc * 10 + (*p++ - '0');
  bool specific = false;
  if (*p == 'a' || *p == 'f') specific = true, p++;
  if (*p || cc < 10 || cc > 1000) return false;
  if (out_cc) *out_cc = cc;
  if (out_specific) *out_specific = specific;
  return true;
}

void ir_cuda_arch_limits(const char *arch, IrCudaArchLimits *out) {
  int cc = 0;
  if (!arch || !ir_cuda_parse_arch(arch, &cc, NULL)) cc = 0;
  int64_t kib;
  switch (cc) {
  case 70: case 72: kib = 96; break;
  case 75: kib = 64; break;
  case 80: case 87: kib = 163; break;
  case 86: case 89: case 120: case 121: kib = 99; break;
  case 90: case 100: case 101: case 103: case 110: kib = 227; break;
  default: kib = 48; break;
  }
  out->smem_per_block = kib * 1024;
  out->smem_default = 48 * 1024;
  out->regs_per_sm = 65536;
  out->regs_per_thread = 255;
}

int64_t ir_cuda_onchip_budget(const char *arch) {
  IrCudaArchLimits l;
  ir_cuda_arch_limits(arch, &l);
  return l.smem_per_block;
}

int64_t ir_cpu_l2_bytes(void) {
  for (int i = 0; i < 16; i++) {
    char path[96], buf[64];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    FILE *fl = fopen(path, "r");
    if (!fl) continue;
    int level = 0;
    if (fscanf(fl, "%d", &level) != 1) level = 0;
    fclose(fl);
    if (level != 2) continue;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    FILE *fs = fopen(path, "r");
    if (!fs) continue;
    bool ok = fgets(buf, sizeof buf, fs) != NULL;
    fclose(fs);
    if (!ok) continue;
    char *end;
    long long n = strtoll(buf, &end, 10);
    int64_t unit = *end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : *end == 'G' ? 1024 * 1024 * 1024 : 1;
    if (n > 0) return (int64_t)n * unit;
  }
  return 0;
}
