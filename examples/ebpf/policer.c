/* SPDX-License-Identifier: Apache-2.0
 *
 * policer.c — a per-tenant token bucket, as an eBPF NF: the eBPF twin of
 * buffet_nfs::Policer and examples/c-nf/policer.c. Tokens are kept in token-nanoseconds
 * in 64 bits, so `burst` must stay below 18,446,744,073 tokens (2^64 / 10^9); the
 * bucket is full at the tenant's first packet and refills with packet time.
 *
 * Tenant policy:
 *   [tenant.policy.maps]
 *   bucket = { u64 = [1250000, 15000, 0] }   # rate (tokens/s), burst, unit (0 bytes, 1 packets)
 * Counters: passed, passed_bytes, dropped.
 *
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c policer.c -o policer.o
 */
#include "buffet_ebpf.h"

#define NS_PER_SEC 1000000000ull

struct bucket {
	__u64 rate;    /* from the policy */
	__u64 burst;   /* from the policy */
	__u64 packets; /* from the policy: 1 when a token is a packet */
	__u64 started;
	__u64 level;   /* tokens x ns */
	__u64 last_ns;
};

BUFFET_ARRAY(bucket, struct bucket, 1);
BUFFET_COUNTERS("passed\0passed_bytes\0dropped");

BUFFET_PROGRAM int policer(struct buffet_ctx *ctx)
{
	struct bucket *b = buffet_map_lookup(&bucket, 0);
	if (!b)
		return BUFFET_PASS;
	__u64 len = ctx->data_end - ctx->data;
	__u64 rate = b->rate ? b->rate : 1;
	__u64 full = b->burst * NS_PER_SEC;
	if (!b->started) {
		b->started = 1;
		b->level = full;
		b->last_ns = ctx->ts_ns;
	} else if (ctx->ts_ns > b->last_ns) {
		__u64 dt = ctx->ts_ns - b->last_ns;
		/* Past this long the bucket is full whatever it held (and dt * rate could wrap). */
		__u64 cap = full / rate + 1;
		if (dt > cap)
			dt = cap;
		__u64 level = b->level + dt * rate;
		b->level = level > full ? full : level;
		b->last_ns = ctx->ts_ns;
	}
	__u64 cost = (b->packets ? 1 : len) * NS_PER_SEC;
	if (b->level < cost) {
		buffet_counter_add(2, 1);
		return BUFFET_DROP_RATE_LIMITED;
	}
	b->level -= cost;
	buffet_counter_add(0, 1);
	buffet_counter_add(1, len);
	return BUFFET_PASS;
}
