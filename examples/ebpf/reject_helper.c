/* SPDX-License-Identifier: Apache-2.0
 *
 * reject_helper.c — rejected: calls helper 6 (Linux's bpf_trace_printk), which Buffet
 * does not provide. `buffet nf check` prints the verifier's "helper function is
 * unavailable on this platform".
 */
#include "buffet_ebpf.h"

static long (*trace_printk)(const char *fmt, __u32 fmt_size, ...) = (void *)6;

BUFFET_PROGRAM int chatty(struct buffet_ctx *ctx)
{
	char fmt[4] = {'h', 'i', '\n', 0};
	trace_printk(fmt, sizeof(fmt));
	return BUFFET_PASS;
}
