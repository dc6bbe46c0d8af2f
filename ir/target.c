/* Target facts (ir/target.h).  Arch names are parsed by hand: "sm_" or
 * "compute_", at least two digits, and an optional 'a'/'f' suffix, which is
 * what NVRTC's --gpu-architecture takes. */
#include <ctype.h>
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
