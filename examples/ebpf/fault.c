/* SPDX-License-Identifier: Apache-2.0
 *
 * fault.c — a program the verifier accepts and that still faults at run time, on the one
 * path the verifier does not close: its return value. Buffet maps the return value to a
 * verdict; a value outside the ABI is a fault and quarantines the tenant.
 *
 * It counts its tenant's packets and, once the count exceeds `config.fault_after`
 * (0 = never), returns 0xdead. Tenant policy: [tenant.policy.maps] config = { u32 = [100] }
 *
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c fault.c -o fault.o
 */
#include "buffet_ebpf.h"

struct config {
	__u32 fault_after;
};

BUFFET_ARRAY(config, struct config, 1);
BUFFET_ARRAY(seen, __u64, 1);
BUFFET_COUNTERS("packets");

BUFFET_PROGRAM int faulty(struct buffet_ctx *ctx)
{
	struct config *cfg = buffet_map_lookup(&config, 0);
	__u64 *n = buffet_map_lookup(&seen, 0);
	if (!cfg || !n)
		return BUFFET_PASS;
	*n += 1;
	buffet_counter_add(0, 1);
	if (cfg->fault_after != 0 && *n > cfg->fault_after)
		return 0xdead; /* not a verdict */
	return BUFFET_PASS;
}
