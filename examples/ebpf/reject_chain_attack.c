/* SPDX-License-Identifier: Apache-2.0
 *
 * reject_chain_attack.c — rejected by the verifier: a hostile chain stage (docs/chains.md)
 * that writes past the end of its own map element, towards the memory beside it, with
 * an offset taken from the packet. Refused at admission; nothing of the tenant runs.
 * `buffet nf check` prints "... Upper bound must be at most ...".
 */
#include "buffet_ebpf.h"

struct loot {
	__u64 word[4];
};

BUFFET_ARRAY(loot, struct loot, 1);

BUFFET_PROGRAM int reach(struct buffet_ctx *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;
	struct loot *l = buffet_map_lookup(&loot, 0);
	if (!l || data + 1 > end)
		return BUFFET_PASS;
	/* data[0] is up to 255: up to 2 KiB past a 32-byte element. */
	l->word[data[0]] = ~0ULL;
	return BUFFET_PASS;
}
