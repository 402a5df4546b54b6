/*
 * policer.c — a per-tenant token bucket, as a Buffet C NF: the C twin of
 * buffet_nfs::Policer (same arithmetic: tokens kept in token-nanoseconds, the bucket
 * full at the tenant's first packet, time from the packet's timestamp, never a clock).
 *
 * Policy (JSON): { "rate": 1250000, "burst": 15000, "unit": "bytes" }
 *   rate: tokens per second (>= 1); burst: bucket depth in tokens (>= 1);
 *   unit: "bytes" (a packet costs its length, the default) or "packets" (one token).
 * Counters (buffet_summary): passed, passed_bytes, dropped.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffet.h"

#define NS_PER_SEC 1000000000ull

struct state {
    uint64_t rate;
    uint64_t burst;
    int packets_unit;
    int started;
    unsigned __int128 level; /* tokens x ns */
    uint64_t last_ns;
    uint64_t passed;
    uint64_t passed_bytes;
    uint64_t dropped;
};

const char *buffet_nf_name(void) { return "policer"; }
uint32_t buffet_abi_version(void) { return BUFFET_ABI_VERSION; }
size_t buffet_mem_register(void) { return sizeof(struct state); }

static const char *json_value(const char *json, const char *key) {
    char quoted[32];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *p = strstr(json, quoted);
    if (p == NULL) {
        return NULL;
    }
    p = strchr(p + strlen(quoted), ':');
    return p ? p + 1 : NULL;
}

static int number(const char *policy, const char *key, uint64_t *out, char *err, size_t errlen) {
    const char *v = json_value(policy, key);
    char *end;
    if (v == NULL) {
        snprintf(err, errlen, "missing field `%s`", key);
        return 1;
    }
    *out = strtoull(v, &end, 10);
    if (end == v || *out == 0) {
        snprintf(err, errlen, "`%s` must be a number of at least 1", key);
        return 1;
    }
    return 0;
}

int buffet_state_init(const char *policy, void *mem, size_t len, char *err, size_t errlen) {
    struct state *s = mem;
    if (len < sizeof *s) {
        snprintf(err, errlen, "region of %zu bytes is too small", len);
        return 1;
    }
    if (number(policy, "rate", &s->rate, err, errlen) ||
        number(policy, "burst", &s->burst, err, errlen)) {
        return 1;
    }
    const char *u = json_value(policy, "unit");
    s->packets_unit = u != NULL && strstr(u, "\"packets\"") == u + strspn(u, " ");
    return 0;
}

buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *mem, size_t len) {
    struct state *s = mem;
    (void)len;
    unsigned __int128 full = (unsigned __int128)s->burst * NS_PER_SEC;
    if (!s->started) {
        s->started = 1;
        s->level = full;
        s->last_ns = pkt->ts_ns;
    } else if (pkt->ts_ns > s->last_ns) {
        unsigned __int128 add = (unsigned __int128)(pkt->ts_ns - s->last_ns) * s->rate;
        s->level = s->level + add > full ? full : s->level + add;
        s->last_ns = pkt->ts_ns;
    }
    unsigned __int128 cost = (unsigned __int128)(s->packets_unit ? 1 : pkt->len) * NS_PER_SEC;
    if (s->level < cost) {
        s->dropped++;
        return BUFFET_DROP_RATE;
    }
    s->level -= cost;
    s->passed++;
    s->passed_bytes += pkt->len;
    return BUFFET_PASS;
}

size_t buffet_summary(const void *mem, size_t len, struct buffet_counter *out, size_t max) {
    const struct state *s = mem;
    (void)len;
    if (max < 3) {
        return 0;
    }
    out[0] = (struct buffet_counter){"passed", s->passed};
    out[1] = (struct buffet_counter){"passed_bytes", s->passed_bytes};
    out[2] = (struct buffet_counter){"dropped", s->dropped};
    return 3;
}
