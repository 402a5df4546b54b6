/* SPDX-License-Identifier: Apache-2.0
 *
 * reject_oob.c — rejected by the verifier: reads the IPv4 protocol byte (offset 23)
 * after checking only that the Ethernet header (14 bytes) is there.
 * `buffet nf check` prints: "... Upper bound must be at most packet_size ..."
 */
#include "buffet_ebpf.h"

BUFFET_PROGRAM int oob(struct buffet_ctx *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;

	if (data + 14 > end)
		return BUFFET_DROP_MALFORMED;
	return data[23] == 6 ? BUFFET_PASS : BUFFET_DROP; /* out of bounds for short frames */
}
