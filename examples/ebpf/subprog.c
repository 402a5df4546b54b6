/* SPDX-License-Identifier: Apache-2.0
 *
 * subprog.c — a bpf-to-bpf call: the loader links the call to `checksum16` (a separate
 * function in .text), the verifier gives the callee its own 256-byte stack frame, and
 * both engines run it with the callee's frame below the caller's (the caller's stack
 * survives the call). Returns BUFFET_PASS when the IPv4 header checksum is valid,
 * BUFFET_DROP_INTEGRITY otherwise; non-IPv4 passes. Counters: checked, bad.
 *
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c subprog.c -o subprog.o
 */
#include "buffet_ebpf.h"

BUFFET_COUNTERS("checked\0bad");

/* One's-complement sum of the 20-byte header copied into `words` (the caller's stack),
 * through a scratch array of its own (inverted, so that a callee frame overlapping the
 * caller's would visibly corrupt `words`). */
__attribute__((noinline)) static __u64 checksum16(__u16 *words)
{
	volatile __u16 scratch[10];
	__u64 sum = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		scratch[i] = words[i] ^ 0xffff;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += scratch[i] ^ 0xffff;
	/* Ten 16-bit words sum below 2^20: two folds bring it to 16 bits. */
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum;
}

BUFFET_PROGRAM int subprog(struct buffet_ctx *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;

	if (ctx->l3_kind != 4)
		return BUFFET_PASS;
	__u64 l3 = ctx->l3_off;
	BUFFET_OPAQUE(l3);
	if (l3 > 64)
		return BUFFET_PASS;
	__u8 *ip = data + l3;
	if (ip + 20 > end)
		return BUFFET_PASS;
	__u16 words[10];
#pragma unroll
	for (int i = 0; i < 10; i++)
		words[i] = (__u16)(ip[2 * i] << 8 | ip[2 * i + 1]);
	__u64 sum = checksum16(words);
	buffet_counter_add(0, 1);
	/* The caller's copy is intact after the call: its first word is still the
	 * version/IHL/TOS word (read back from the stack). */
	__u16 first = *(volatile __u16 *)&words[0];
	if (first >> 12 != 4 || sum != 0xffff) {
		buffet_counter_add(1, 1);
		return BUFFET_DROP_INTEGRITY;
	}
	return BUFFET_PASS;
}
