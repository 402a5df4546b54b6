/*
 * flowmon.c — per-flow packet/byte counters, as a Buffet C NF: the C twin of
 * buffet_nfs::Monitor (same table shape: open addressing, an 8-slot probe window, the
 * least recently seen flow of the window evicted when it is full), kept entirely in the
 * tenant's region.
 *
 * Policy: { "flow_capacity": 1024 }  (a power of two is used; at most FLOWS)
 * Counters: flows, flow_evictions, monitored_packets, monitored_bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buffet.h"

#define FLOWS 1024u
#define PROBE_WINDOW 8u

struct flow_key {
    uint8_t src[16];
    uint8_t dst[16];
    uint16_t sport, dport;
    uint8_t proto, used;
    uint8_t pad[2];
};

struct flow {
    struct flow_key key;
    uint64_t packets, bytes, first_ns, last_ns;
};

struct state {
    uint64_t packets, bytes, evictions, len;
    uint32_t mask;
    uint32_t pad;
    struct flow flows[FLOWS];
};

const char *buffet_nf_name(void) { return "flowmon"; }
uint32_t buffet_abi_version(void) { return BUFFET_ABI_VERSION; }
size_t buffet_mem_register(void) { return sizeof(struct state); }

int buffet_state_init(const char *policy, void *mem, size_t len, char *err, size_t errlen) {
    struct state *s = mem;
    (void)err, (void)errlen;
    if (len < sizeof *s) {
        return 1;
    }
    uint32_t cap = FLOWS;
    const char *c = strstr(policy, "\"flow_capacity\"");
    if (c != NULL && (c = strchr(c, ':')) != NULL) {
        unsigned long want = strtoul(c + 1, NULL, 10);
        cap = PROBE_WINDOW;
        while (cap < want && cap < FLOWS) {
            cap <<= 1;
        }
    }
    s->mask = cap - 1;
    return 0;
}

static uint64_t hash(const struct flow_key *k) {
    /* FxHash-like: rotate, xor, multiply, over the key's 8-byte words. */
    uint64_t h = 0, w;
    const uint8_t *p = (const uint8_t *)k;
    for (size_t i = 0; i + 8 <= sizeof *k; i += 8) {
        memcpy(&w, p + i, 8);
        h = ((h << 5) | (h >> 59)) ^ w;
        h *= 0x517cc1b727220a95ull;
    }
    return h;
}

buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *mem, size_t len) {
    struct state *s = mem;
    (void)len;
    struct flow_key key;
    memset(&key, 0, sizeof key);
    const uint8_t *l3 = pkt->data + pkt->l3_off;
    if (pkt->l3_kind == BUFFET_L3_IPV4) {
        memcpy(key.src, l3 + 12, 4);
        memcpy(key.dst, l3 + 16, 4);
    } else {
        memcpy(key.src, l3 + 8, 16);
        memcpy(key.dst, l3 + 24, 16);
    }
    key.sport = pkt->src_port;
    key.dport = pkt->dst_port;
    key.proto = pkt->ip_proto;
    key.used = 1;
    s->packets++;
    s->bytes += pkt->len;
    uint32_t start = (uint32_t)hash(&key) & s->mask, victim = start;
    uint64_t oldest = UINT64_MAX;
    for (uint32_t i = 0; i < PROBE_WINDOW; i++) {
        uint32_t idx = (start + i) & s->mask;
        struct flow *f = &s->flows[idx];
        if (!f->key.used) {
            victim = idx;
            s->len++;
            goto insert;
        }
        if (memcmp(&f->key, &key, sizeof key) == 0) {
            f->packets++;
            f->bytes += pkt->len;
            f->last_ns = pkt->ts_ns;
            return BUFFET_PASS;
        }
        if (f->last_ns < oldest) {
            oldest = f->last_ns;
            victim = idx;
        }
    }
    s->evictions++;
insert:
    s->flows[victim] = (struct flow){key, 1, pkt->len, pkt->ts_ns, pkt->ts_ns};
    return BUFFET_PASS;
}

size_t buffet_summary(const void *mem, size_t len, struct buffet_counter *out, size_t max) {
    const struct state *s = mem;
    (void)len;
    if (max < 4) {
        return 0;
    }
    out[0] = (struct buffet_counter){"flows", s->len};
    out[1] = (struct buffet_counter){"flow_evictions", s->evictions};
    out[2] = (struct buffet_counter){"monitored_packets", s->packets};
    out[3] = (struct buffet_counter){"monitored_bytes", s->bytes};
    return 4;
}
