/* SPDX-License-Identifier: Apache-2.0
 *
 * reject_loop_budget.c — REJECTED: "Loop counter is too large", the message an author
 * meets most. loops.c with its last shape written as a loop instead of one helper call:
 * a counter to 64, opaque, with two more exits computed from the helper's result. That
 * loop verifies when it is the only one in a program; here, after three other loops,
 * PREVAIL cannot bound its head's counter:
 *
 *   rejected by the verifier: 183 (counter): Loop counter is too large (pc[183] < 100000)
 *
 * The counter is per loop head over the whole run, and the analysis loses precision at
 * loop heads after earlier loops (and after clang's loop rotation moves the exit tests).
 * Fix, as in loops.c: let the helper do the walk (one buffet_pkt_find call, or
 * buffet_dns_lookup / a suffix lookup for names) — no loop at all; or keep one loop per
 * program walking the range once.
 */
#include "buffet_ebpf.h"

BUFFET_COUNTERS("counted\0to_end\0unrolled\0helper");

#define LIMIT 64

BUFFET_PROGRAM int reject_loop_budget(struct buffet_ctx *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;
	__u64 n, hits;

	/* 0: counted loop; the counter is the only thing that decides the exit. */
	hits = 0;
	for (n = 0; n < LIMIT; n++) {
		BUFFET_OPAQUE(n);
		if (data + n + 1 > end)
			break;
		hits += data[n] == 0x45;
	}
	buffet_counter_add(0, hits);

	/* 1: bounded by the packet end, through an opaque counter. */
	hits = 0;
	for (n = 0; n < 0xffff; n++) {
		BUFFET_OPAQUE(n);
		if (n >= 0xffff || data + n + 1 > end)
			break;
		hits += data[n] == 0x45;
	}
	buffet_counter_add(1, hits);

	/* 2: unrolled: a constant trip count, each access checked. */
	hits = 0;
	if (data + 16 <= end) {
#pragma unroll
		for (int i = 0; i < 16; i++)
			hits += data[i] == 0x45;
	}
	buffet_counter_add(2, hits);

	/* 3, as a loop: find every 0x45 with the helper, at most 64 of them. Verifies on
	 * its own; after the loops above it does not (see the top of the file). */
	hits = 0;
	__u32 len = ctx->data_end - ctx->data;
	__u32 at = 0;
	for (n = 0; n < LIMIT; n++) {
		BUFFET_OPAQUE(n);
		long f = buffet_pkt_find(at, len - at, 0x45);
		if (f < 0)
			break;
		hits++;
		at = f + 1;
		if (at >= len)
			break;
	}
	buffet_counter_add(3, hits);
	return BUFFET_PASS;
}
