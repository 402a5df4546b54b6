/* SPDX-License-Identifier: Apache-2.0
 *
 * macswap.c — swaps the Ethernet source and destination addresses and sends the frame
 * back out of its input port, as an eBPF NF: the eBPF twin of buffet_nfs::MacSwap and
 * examples/c-nf/macswap.c (the protection benchmark's minimal NF).
 *
 * Tenant policy: none. Counters: packets.
 *
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c macswap.c -o macswap.o
 */
#include "buffet_ebpf.h"

BUFFET_COUNTERS("packets");

BUFFET_PROGRAM int macswap(struct buffet_ctx *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;

	if (data + 12 > end)
		return BUFFET_DROP_MALFORMED;
	__u32 d0 = *(__u32 *)data;
	__u16 d1 = *(__u16 *)(data + 4);
	*(__u32 *)data = *(__u32 *)(data + 6);
	*(__u16 *)(data + 4) = *(__u16 *)(data + 10);
	*(__u32 *)(data + 6) = d0;
	*(__u16 *)(data + 10) = d1;
	buffet_counter_add(0, 1);
	return BUFFET_TX;
}
