/* SPDX-License-Identifier: Apache-2.0
 *
 * reject_loop.c — rejected by the verifier: a loop whose termination cannot be proven
 * (the Collatz iteration on the arrival time). `buffet nf check` prints:
 * "... Loop counter is too large ..."
 */
#include "buffet_ebpf.h"

BUFFET_PROGRAM int spin(struct buffet_ctx *ctx)
{
	__u64 x = ctx->ts_ns | 1;
	__u64 steps = 0;
	while (x != 1) {
		x = (x & 1) ? 3 * x + 1 : x / 2;
		steps++;
	}
	return steps & 1;
}
