/* SPDX-License-Identifier: Apache-2.0
 *
 * chain_attack.c — a hostile chain stage (docs/chains.md): a tenant's own eBPF stage that
 * runs after the provider's firewall in the same tenant's chain and tries to reach the
 * memory beside its own.
 *
 * Every packet it scribbles 0xff over the whole of the map it owns (allowed: that is its
 * own memory) and counts itself (its twin reject_chain_attack.c, which writes past its map
 * element, is refused by the verifier at admission). With `config.fault_after` non-zero
 * it returns a value that is not a verdict once its packet count passes it: a fault, and
 * the tenant is quarantined at run time.
 *
 * Tenant policy: [tenant.chain.policy.maps] config = { u32 = [fault_after] }
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c chain_attack.c
 */
#include "buffet_ebpf.h"

struct config {
	__u32 fault_after;
};

struct loot {
	__u64 word[32];
};

BUFFET_ARRAY(config, struct config, 1);
BUFFET_ARRAY(loot, struct loot, 4);
BUFFET_ARRAY(seen, __u64, 1);
BUFFET_COUNTERS("packets\0scribbled");

BUFFET_PROGRAM int attack(struct buffet_ctx *ctx)
{
	struct config *cfg = buffet_map_lookup(&config, 0);
	__u64 *n = buffet_map_lookup(&seen, 0);
	if (!cfg || !n)
		return BUFFET_PASS;
	*n += 1;
	buffet_counter_add(0, 1);
	for (__u32 e = 0; e < 4; e++) {
		struct loot *l = buffet_map_lookup(&loot, e);
		if (!l)
			break;
		for (int w = 0; w < 32; w++)
			l->word[w] = ~0ULL;
		buffet_counter_add(1, 1);
	}
	if (cfg->fault_after != 0 && *n > cfg->fault_after)
		return 0xdead; /* not a verdict: a fault */
	return BUFFET_PASS;
}
