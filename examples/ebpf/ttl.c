/* SPDX-License-Identifier: Apache-2.0
 *
 * ttl.c — a router-like eBPF NF that rewrites the packet: decrements the IPv4 TTL,
 * fixes the header checksum with buffet_csum_replace (RFC 1624), and sends the packet
 * back (BUFFET_TX). TTL 0 or 1 is dropped; non-IPv4 passes untouched.
 *
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c ttl.c -o ttl.o
 */
#include "buffet_ebpf.h"

BUFFET_COUNTERS("forwarded\0expired");

BUFFET_PROGRAM int ttl(struct buffet_ctx *ctx)
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
	if (ip[8] <= 1) {
		buffet_counter_add(1, 1);
		return BUFFET_DROP;
	}
	/* The 16-bit word holding TTL (high byte) and protocol (low byte). */
	__u64 old = (__u64)ip[8] << 8 | ip[9];
	ip[8] -= 1;
	__u64 new = (__u64)ip[8] << 8 | ip[9];
	buffet_csum_replace(l3 + 10, old, new, 2);
	buffet_counter_add(0, 1);
	return BUFFET_TX;
}
