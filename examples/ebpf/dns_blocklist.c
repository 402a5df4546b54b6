/* SPDX-License-Identifier: Apache-2.0
 *
 * dns_blocklist.c — drops DNS queries (UDP to port 53) for a blocked domain or any of its
 * subdomains, counts per-domain hits, passes everything else. The question name is walked
 * and looked up by buffet_dns_lookup (no loop in the program); the blocklist is a STRSET
 * map normalised like the native NFs' lists (case and a trailing dot ignored). The copy
 * of the DNS header kept in the BUFFET_SCRATCH map shows per-packet scratch memory.
 *
 * Tenant policy:
 *   [tenant.policy.maps]
 *   blocked = { strings = ["ads.example", "Tracker.NET."] }   # at most 1024 names
 * Counters: queries, blocked, malformed.
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c dns_blocklist.c
 */
#include "buffet_ebpf.h"

struct scratch {
	__u8 dns_header[12];
	__u8 room[1012]; /* more than a stack frame could hold next to it */
};

BUFFET_STRSET(blocked, 253, 1024);
BUFFET_ARRAY(hits, __u64, 1024);
BUFFET_SCRATCH(tmp, struct scratch);
BUFFET_COUNTERS("queries\0blocked\0malformed");

BUFFET_PROGRAM int dns_blocklist(struct buffet_ctx *ctx)
{
	__u8 *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (ctx->l4_kind != 17)
		return BUFFET_PASS;
	__u64 l4 = ctx->l4_off;
	BUFFET_OPAQUE(l4);
	if (l4 > 0xffff)
		return BUFFET_PASS;
	__u8 *udp = data + l4;
	if (udp + 8 + 12 > end)
		return BUFFET_PASS;
	if (udp[2] != 0 || udp[3] != 53) /* destination port 53 */
		return BUFFET_PASS;
	struct scratch *s = buffet_map_lookup(&tmp, 0);
	if (!s)
		return BUFFET_PASS;
	__u8 *dns = udp + 8;
#pragma unroll
	for (int i = 0; i < 12; i++)
		s->dns_header[i] = dns[i];
	/* A query (QR = 0) with at least one question. */
	if ((s->dns_header[2] & 0x80) || (s->dns_header[4] | s->dns_header[5]) == 0)
		return BUFFET_PASS;
	buffet_counter_add(0, 1);
	long i = buffet_dns_lookup(&blocked, l4 + 8 + 12, BUFFET_STRSET_SUFFIXES);
	if (i == -1)
		return BUFFET_PASS;
	if (i < 0) {
		buffet_counter_add(2, 1);
		return BUFFET_DROP_MALFORMED;
	}
	buffet_counter_add(1, 1);
	__u64 *h = buffet_map_lookup(&hits, i);
	if (h)
		*h += 1;
	return BUFFET_DROP;
}
