/* SPDX-License-Identifier: Apache-2.0
 *
 * cost_attack.c — verified, yet built to be expensive: a loop the verifier proves runs at
 * most 65,535 times calls a suffix lookup over the whole frame in every iteration. Without
 * a cost budget one 2,000-byte packet would cost about a minute on either engine. With the
 * budget, the helpers stop working once the packet's budget is spent and the packet is a
 * fault (the tenant is quarantined) after a few milliseconds.
 */
#include "buffet_ebpf.h"

BUFFET_STRSET(names, 4096, 16);

BUFFET_PROGRAM int cost_attack(struct buffet_ctx *ctx)
{
	__u32 len = ctx->data_end - ctx->data;
	long acc = 0;
	for (__u64 n = 0; n < 65535; n++) {
		BUFFET_OPAQUE(n);
		acc += buffet_strset_lookup(&names, 0, len, BUFFET_STRSET_SUFFIXES);
	}
	return acc == 12345 ? BUFFET_DROP : BUFFET_PASS;
}
