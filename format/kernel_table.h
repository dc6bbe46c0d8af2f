/* The kernel table section of a bundle (format/kernel_table.c has the
 * encoding): the Kernels (format/kernel.h) in run order.  Written by the
 * compiler, read by the runtime, which trusts nothing in it. */
#ifndef SMELT_FMT_KERNEL_TABLE_H
#define SMELT_FMT_KERNEL_TABLE_H

#include <stddef.h>

#include "format/kernel.h"
#include "ir/status.h"

/* The version of the kernel-table encoding; the loader accepts exactly it. */
#define FMT_KERNEL_TABLE_VERSION 2

/* Encodes n kernels into a malloc'd buffer (free()). */
smelt_status fmt_kernel_table_encode(const Kernel *k, int n, void **out_buf, size_t *out_len) SMELT_MUST_USE;
/* Decodes and validates a kernel table against the graph it runs: names,
 * groups, argument ids, that every kernel reads only values that exist by
 * then and writes only node results nobody else writes, that every graph
 * output is written, and that planned offsets lie inside the arena.
 * Messages start with "kernel table: ".  Release with fmt_kernel_table_free. */
smelt_status fmt_kernel_table_decode(const void *buf, size_t len, const Graph *g, Kernel **out_kernels,
                                     int *out_n) SMELT_MUST_USE;
void fmt_kernel_table_free(Kernel *k, int n);

#endif
