/* SPDX-License-Identifier: Apache-2.0
 *
 * reject_uninit.c — rejected: uses a stack slot it never wrote on some paths (the
 * program would act on whatever the stack held). A load of uninitialised stack has no
 * type for the verifier, so its first use fails: `buffet nf check` prints
 * "... Invalid type ...".
 */
#include "buffet_ebpf.h"

BUFFET_PROGRAM int leak(struct buffet_ctx *ctx)
{
	volatile __u64 slot[2];
	if (ctx->l4_kind == 6)
		slot[0] = BUFFET_PASS;
	return slot[0] == BUFFET_PASS ? BUFFET_PASS : BUFFET_DROP;
}
