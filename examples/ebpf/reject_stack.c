/* SPDX-License-Identifier: Apache-2.0
 *
 * reject_stack.c — REJECTED: a 384-byte buffer on the stack. A program's frame is
 * 256 bytes (two frames of 256 make rbpf's 512-byte stack, one per bpf-to-bpf call
 * level), so clang compiles it but the verifier refuses the first access below r10-256:
 *
 *   rejected by the verifier: 105: Lower bound must be at least r10.stack_offset -
 *   subprogram_stack_size (valid_access(r10.offset-264, width=8) for write)
 *
 * Fix: keep large buffers in a BUFFET_SCRATCH map (up to 16 KiB, zeroed per packet) —
 * see dns_blocklist.c — or in a per-tenant BUFFET_ARRAY when they must survive packets.
 */
#include "buffet_ebpf.h"

BUFFET_PROGRAM int reject_stack(struct buffet_ctx *ctx)
{
	__u64 buf[48]; /* 384 bytes */
	__u8 *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (data + 1 > end)
		return BUFFET_DROP_MALFORMED;
#pragma unroll
	for (int i = 0; i < 48; i++)
		buf[i] = data[0] + i;
	__u64 k = data[0] % 48;
	return buf[k] & 1;
}
