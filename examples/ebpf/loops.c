/* SPDX-License-Identifier: Apache-2.0
 *
 * loops.c — the loop shapes PREVAIL proves bounded (docs/ebpf.md, "Loops"), one per
 * counter, all in one program:
 *
 *   0. a counted loop: its own counter from 0 to a constant, made opaque so that clang
 *      cannot rotate the exit test onto a derived value;
 *   1. a loop bounded by the packet end: the same shape with the frame's longest length
 *      (65,535) as the constant, re-tested first in the body, and `break` at data_end;
 *   2. a small loop clang fully unrolls (#pragma unroll): no loop left to prove;
 *   3. a scan done by a helper instead of a loop (buffet_pkt_find): no loop at all.
 *      (Written as a loop over the helper's results it is rejected after the loops above:
 *      reject_loop_budget.c.)
 *
 * Counter i gets the value computed by shape i for the packet: 0x45 ('E') bytes in the
 * first 64 bytes (0), the whole frame (1), the first 16 bytes (2); 3 gets the offset of
 * the first one plus one.
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c loops.c -o loops.o
 */
#include "buffet_ebpf.h"

BUFFET_COUNTERS("counted\0to_end\0unrolled\0helper");

#define LIMIT 64

BUFFET_PROGRAM int loops(struct buffet_ctx *ctx)
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

	/* 3: the helper walks the bytes: the first 0x45, as offset + 1 (0: none). */
	long f = buffet_pkt_find(0, ctx->data_end - ctx->data, 0x45);
	hits = f < 0 ? 0 : f + 1;
	buffet_counter_add(3, hits);
	return BUFFET_PASS;
}
