/* SPDX-License-Identifier: Apache-2.0
 *
 * flowmon.c — per-flow packet/byte counters as an eBPF NF: the eBPF twin of
 * examples/c-nf/flowmon.c and of buffet_nfs::Monitor's table shape (open addressing, an
 * 8-slot probe window, the least recently seen flow of the window evicted when it is
 * full), kept in one ARRAY element of the tenant's region (the `monitor` logic of the
 * isolation benchmark).
 *
 * Tenant policy:
 *   [tenant.policy.maps]
 *   config = { u32 = [1024] }     # flow capacity: a power of two, 8..1024 (default 1024)
 * Counters: flows, flow_evictions, monitored_packets, monitored_bytes.
 *
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c flowmon.c -o flowmon.o
 */
#include "buffet_ebpf.h"

#define FLOWS 1024
#define PROBE_WINDOW 8

struct flow_key {
	__u64 w[5]; /* src[16], dst[16], sport, dport, proto, used, 2 bytes of padding */
};

struct flow {
	struct flow_key key;
	__u64 packets, bytes, first_ns, last_ns;
};

struct table {
	struct flow flows[FLOWS];
};

struct config {
	__u32 capacity;
};

BUFFET_ARRAY(table, struct table, 1);
BUFFET_ARRAY(config, struct config, 1);
BUFFET_COUNTERS("flows\0flow_evictions\0monitored_packets\0monitored_bytes");
enum { C_FLOWS, C_EVICTIONS, C_PACKETS, C_BYTES };

BUFFET_INLINE __u64 load64(__u8 *p)
{
	__u64 v = 0;
#pragma unroll
	for (int i = 0; i < 8; i++)
		v |= (__u64)p[i] << (8 * i);
	return v;
}

BUFFET_PROGRAM int flowmon(struct buffet_ctx *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;
	__u64 len = ctx->data_end - ctx->data;

	struct flow_key key = {};
	__u64 l3 = ctx->l3_off;
	BUFFET_OPAQUE(l3);
	if (l3 > 64)
		return BUFFET_PASS;
	__u8 *ip = data + l3;
	if (ctx->l3_kind == 4) {
		if (ip + 20 > end)
			return BUFFET_PASS;
		key.w[0] = (__u64)ip[12] | (__u64)ip[13] << 8 | (__u64)ip[14] << 16 |
			   (__u64)ip[15] << 24;
		key.w[2] = (__u64)ip[16] | (__u64)ip[17] << 8 | (__u64)ip[18] << 16 |
			   (__u64)ip[19] << 24;
	} else {
		if (ip + 40 > end)
			return BUFFET_PASS;
		key.w[0] = load64(ip + 8);
		key.w[1] = load64(ip + 16);
		key.w[2] = load64(ip + 24);
		key.w[3] = load64(ip + 32);
	}
	__u64 ports = 0;
	if (ctx->l4_kind == 6 || ctx->l4_kind == 17) {
		__u64 l4 = ctx->l4_off;
		BUFFET_OPAQUE(l4);
		if (l4 > 0xffff)
			return BUFFET_PASS;
		__u8 *th = data + l4;
		if (th + 4 > end)
			return BUFFET_PASS;
		ports = (__u64)(th[0] << 8 | th[1]) | (__u64)(th[2] << 8 | th[3]) << 16;
	}
	key.w[4] = ports | (__u64)ctx->ip_proto << 32 | (__u64)1 << 40;

	buffet_counter_add(C_PACKETS, 1);
	buffet_counter_add(C_BYTES, len);

	struct config *cfg = buffet_map_lookup(&config, 0);
	struct table *t = buffet_map_lookup(&table, 0);
	if (!cfg || !t)
		return BUFFET_PASS;
	__u64 mask = FLOWS - 1;
	if (cfg->capacity >= PROBE_WINDOW && cfg->capacity <= FLOWS)
		mask = cfg->capacity - 1;

	/* FxHash-like over the key's words. */
	__u64 h = 0;
#pragma unroll
	for (int i = 0; i < 5; i++) {
		h = ((h << 5) | (h >> 59)) ^ key.w[i];
		h *= 0x517cc1b727220a95ull;
	}
	__u64 start = h & mask, victim = start, oldest = ~0ull;
#pragma unroll
	for (int i = 0; i < PROBE_WINDOW; i++) {
		__u64 idx = (start + i) & mask & (FLOWS - 1);
		struct flow *f = &t->flows[idx];
		if (!(f->key.w[4] >> 40 & 1)) {
			buffet_counter_add(C_FLOWS, 1);
			victim = idx;
			goto insert;
		}
		if (f->key.w[0] == key.w[0] && f->key.w[1] == key.w[1] &&
		    f->key.w[2] == key.w[2] && f->key.w[3] == key.w[3] &&
		    f->key.w[4] == key.w[4]) {
			f->packets += 1;
			f->bytes += len;
			f->last_ns = ctx->ts_ns;
			return BUFFET_PASS;
		}
		if (f->last_ns < oldest) {
			oldest = f->last_ns;
			victim = idx;
		}
	}
	buffet_counter_add(C_EVICTIONS, 1);
insert:;
	struct flow *v = &t->flows[victim & (FLOWS - 1)];
	v->key = key;
	v->packets = 1;
	v->bytes = len;
	v->first_ns = ctx->ts_ns;
	v->last_ns = ctx->ts_ns;
	return BUFFET_PASS;
}
