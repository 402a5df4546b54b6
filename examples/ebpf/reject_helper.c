/* SPDX-License-Identifier: Apache-2.0
 *
 * reject_helper.c — rejected: calls helper 113 (Linux's bpf_probe_read_kernel), which
 * Buffet does not provide (Buffet's helpers are 1-6, buffet_ebpf.h). `buffet nf check`
 * prints the verifier's "helper function is unavailable on this platform".
 */
#include "buffet_ebpf.h"

static long (*probe_read_kernel)(void *dst, __u32 size, const void *src) = (void *)113;

BUFFET_PROGRAM int snoop(struct buffet_ctx *ctx)
{
	__u64 v = 0;
	probe_read_kernel(&v, sizeof(v), (void *)(long)ctx->ts_ns);
	return v ? BUFFET_DROP : BUFFET_PASS;
}
