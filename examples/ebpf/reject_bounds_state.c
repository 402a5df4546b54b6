/* SPDX-License-Identifier: Apache-2.0
 *
 * reject_bounds_state.c — rejected: indexes its tenant state with a packet byte without
 * a bound, so it could write past the map element into the rest of the tenant region.
 * `buffet nf check` prints "... Upper bound must be at most r0.shared_region_size ...".
 */
#include "buffet_ebpf.h"

struct table {
	__u64 slot[16];
};

BUFFET_ARRAY(state, struct table, 1);

BUFFET_PROGRAM int overflow(struct buffet_ctx *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;
	struct table *t = buffet_map_lookup(&state, 0);
	if (!t || data + 1 > end)
		return BUFFET_PASS;
	t->slot[data[0]] += 1; /* data[0] may be up to 255 */
	return BUFFET_PASS;
}
