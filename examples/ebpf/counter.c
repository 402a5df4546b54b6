/* SPDX-License-Identifier: Apache-2.0
 *
 * counter.c — a monitor-like eBPF NF: per-tenant packet and byte counters, split by
 * transport, and packets per IP protocol in an ARRAY map. Passes everything.
 *
 * Counters (per tenant, in `buffet replay` stats): packets, bytes, tcp, udp, other.
 * Map `per_proto`: 256 u64, packets by IP protocol number.
 * Map `config` (optional policy): { u32 = [n] } drops every packet longer than n bytes
 * (0 = no limit), to show a policy value read from the tenant's region.
 *
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c counter.c -o counter.o
 */
#include "buffet_ebpf.h"

struct config {
	__u32 max_len;
};

BUFFET_ARRAY(per_proto, __u64, 256);
BUFFET_ARRAY(config, struct config, 1);
BUFFET_COUNTERS("packets\0bytes\0tcp\0udp\0other\0too_long");
enum { C_PACKETS, C_BYTES, C_TCP, C_UDP, C_OTHER, C_TOO_LONG };

BUFFET_PROGRAM int counter(struct buffet_ctx *ctx)
{
	__u64 len = ctx->data_end - ctx->data;

	buffet_counter_add(C_PACKETS, 1);
	buffet_counter_add(C_BYTES, len);
	if (ctx->l4_kind == 6)
		buffet_counter_add(C_TCP, 1);
	else if (ctx->l4_kind == 17)
		buffet_counter_add(C_UDP, 1);
	else
		buffet_counter_add(C_OTHER, 1);

	__u64 *n = buffet_map_lookup(&per_proto, ctx->ip_proto);
	if (n)
		*n += 1;

	struct config *cfg = buffet_map_lookup(&config, 0);
	if (cfg && cfg->max_len != 0 && len > cfg->max_len) {
		buffet_counter_add(C_TOO_LONG, 1);
		return BUFFET_DROP;
	}
	return BUFFET_PASS;
}
