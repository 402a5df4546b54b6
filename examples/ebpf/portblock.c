/* SPDX-License-Identifier: Apache-2.0
 *
 * portblock.c — per-tenant packet/byte counters and a blocked-port list, as an eBPF NF:
 * the eBPF twin of examples/c-nf/portblock.c (the `firewall` logic of the isolation
 * benchmark). TCP and UDP packets to a blocked destination port are dropped.
 *
 * Tenant policy:
 *   [tenant.policy.maps]
 *   blocked = { u16 = [22, 23] }     # at most 64 ports; port 0 cannot be blocked
 * Counters: packets, bytes, dropped.
 *
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c portblock.c -o portblock.o
 */
#include "buffet_ebpf.h"

#define MAX_BLOCKED 64

struct blocked {
	__u16 port[MAX_BLOCKED]; /* 0 ends the list */
};

BUFFET_ARRAY(blocked, struct blocked, 1);
BUFFET_COUNTERS("packets\0bytes\0dropped");

BUFFET_PROGRAM int portblock(struct buffet_ctx *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;

	buffet_counter_add(0, 1);
	buffet_counter_add(1, ctx->data_end - ctx->data);
	if (ctx->l4_kind != 6 && ctx->l4_kind != 17)
		return BUFFET_PASS;
	__u64 l4 = ctx->l4_off;
	BUFFET_OPAQUE(l4);
	if (l4 > 0xffff)
		return BUFFET_PASS;
	__u8 *th = data + l4;
	if (th + 4 > end)
		return BUFFET_PASS;
	__u16 dport = (__u16)(th[2] << 8 | th[3]);
	struct blocked *b = buffet_map_lookup(&blocked, 0);
	if (!b)
		return BUFFET_PASS;
	for (__u64 i = 0; i < MAX_BLOCKED; i++) {
		/* Opaque, so that clang keeps the `i < 64` test the verifier bounds `i` with
		 * (it would otherwise test `offset != 128`). */
		BUFFET_OPAQUE(i);
		if (i >= MAX_BLOCKED)
			break;
		__u16 p = b->port[i];
		if (p == 0)
			break;
		if (p == dport) {
			buffet_counter_add(2, 1);
			return BUFFET_DROP;
		}
	}
	return BUFFET_PASS;
}
