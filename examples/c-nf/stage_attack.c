/*
 * stage_attack.c — a C NF for one tenant's chain that attacks the stage before it, to
 * prove per-stage protection keys (docs/chains.md, "Memory and isolation").
 *
 * A chain gives each stage its own part of the tenant's region, page-aligned and all of
 * one size, one after another with a guard page after each; buffet_state_init and
 * buffet_pkt_handler get that part as (state, len). So the state of the stage just before
 * this one starts at (char *)state - len - one page. As a victim (the default) it counts packets and keeps a canary; as
 * an attacker, once it has seen `attack_after` packets, it reads the previous stage's
 * first counter and overwrites it.
 *
 * Policy: { "attack": "read-write", "attack_after": 40, "canary": 7 }
 *   attack = "none" (default)  behave;
 *            "read-write"      read the previous stage's packet counter, then overwrite it.
 *
 * Under MPK with per-stage keys (a run at `mpk`) the read faults: the previous stage's
 * part carries its own key, closed while this stage runs; Buffet quarantines the tenant
 * and the previous stage's counter is what its traffic made it. Without per-stage keys
 * the attack would succeed (same tenant, same key). Counters: packets, canary, stolen.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buffet.h"

struct state {
    uint64_t packets;
    uint64_t canary;
    uint64_t stolen;
    uint64_t attack_after;
    uint32_t attack;
};

const char *buffet_nf_name(void) { return "stage_attack"; }
uint32_t buffet_abi_version(void) { return BUFFET_ABI_VERSION; }
size_t buffet_mem_register(void) { return sizeof(struct state); }

static const char *json_value(const char *json, const char *key) {
    const char *p = strstr(json, key);
    return p ? strchr(p, ':') : NULL;
}

int buffet_state_init(const char *policy, void *mem, size_t len, char *err, size_t errlen) {
    struct state *s = mem;
    (void)len, (void)err, (void)errlen;
    const char *v;
    s->attack_after = 100;
    if ((v = json_value(policy, "\"attack_after\"")) != NULL) {
        s->attack_after = strtoull(v + 1, NULL, 10);
    }
    if ((v = json_value(policy, "\"canary\"")) != NULL) {
        s->canary = strtoull(v + 1, NULL, 10);
    }
    if ((v = json_value(policy, "\"attack\"")) != NULL) {
        for (v++; *v == ' '; v++) {
        }
        s->attack = strncmp(v, "\"read-write\"", 12) == 0;
    }
    return 0;
}

buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *mem, size_t len) {
    struct state *s = mem;
    (void)pkt;
    s->packets++;
    if (!s->attack || s->packets <= s->attack_after) {
        return BUFFET_PASS;
    }
    volatile uint64_t *previous = (volatile uint64_t *)((char *)mem - len - getpagesize());
    s->stolen = *previous;  /* read ...      */
    *previous = 0xdeadbeef; /* ... then write */
    return BUFFET_PASS;
}

size_t buffet_summary(const void *mem, size_t len, struct buffet_counter *out, size_t max) {
    const struct state *s = mem;
    (void)len;
    if (max < 3) {
        return 0;
    }
    out[0] = (struct buffet_counter){"packets", s->packets};
    out[1] = (struct buffet_counter){"canary", s->canary};
    out[2] = (struct buffet_counter){"stolen", s->stolen};
    return 3;
}
