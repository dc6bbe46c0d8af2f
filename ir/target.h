/* Facts about the machines smelt compiles for, which the passes, the code
 * generators and the runtime all need: CUDA arch names and limits, the
 * CPU's caches.  A leaf: it depends on nothing but libc. */
#ifndef SMELT_IR_TARGET_H
#define SMELT_IR_TARGET_H

#include <stdbool.h>
#include <stdint.h>

/* Parses "sm_90a" / "compute_80" into 90 / 80 (major*10+minor) and whether
 * it is an arch-specific ('a' or 'f') target; false when it is not an arch
 * name. */
bool ir_cuda_parse_arch(const char *arch, int *out_cc, bool *out_specific);

typedef struct {
  int64_t smem_per_block;   /* bytes of shared memory one block may use (opt-in maximum) */
  int64_t smem_default;     /* without the opt-in attribute: 48 KiB everywhere */
  int64_t regs_per_sm;      /* 32-bit registers */
  int64_t regs_per_thread;  /* the most one thread may use */
} IrCudaArchLimits;

/* Limits of "sm_90a", "sm_90", "sm_80", "compute_86", ... (the number is
 * what matters); an unknown arch (or NULL) gets conservative values
 * (48 KiB). */
void ir_cuda_arch_limits(const char *arch, IrCudaArchLimits *out);
/* The fuse pass's on-chip budget for --target cuda: shared memory per block
 * of the arch (227 KiB on sm_90, 163 KiB on sm_80). */
int64_t ir_cuda_onchip_budget(const char *arch);

/* The L2 cache of cpu0 in bytes, read from
 * /sys/devices/system/cpu/cpu0/cache; 0 when it cannot be found (not
 * Linux, no sysfs).  Read again on every call. */
int64_t ir_cpu_l2_bytes(void);

#endif
