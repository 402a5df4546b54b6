/*
 * portblock.c — a per-tenant packet/byte counter and port blocker, as a Buffet C NF.
 *
 * Policy (JSON, from the tenant's [tenant.policy] table):
 *   { "blocked_ports": [22, 23], "canary": 12345 }
 * blocked_ports: TCP/UDP destination ports to drop (at most 64); canary: any number the
 * NF stores and reports back unchanged (tests use it to prove nobody wrote the state).
 *
 * Counters (buffet_summary): packets, bytes, dropped, canary.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffet.h"

#define MAX_BLOCKED 64

struct state {
    uint64_t packets;
    uint64_t bytes;
    uint64_t dropped;
    uint64_t canary;
    uint32_t nblocked;
    uint16_t blocked[MAX_BLOCKED];
};

const char *buffet_nf_name(void) { return "portblock"; }
uint32_t buffet_abi_version(void) { return BUFFET_ABI_VERSION; }
size_t buffet_mem_register(void) { return sizeof(struct state); }

/* The value of "key" in a flat JSON object: a pointer just past the colon, or NULL. */
static const char *json_value(const char *json, const char *key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *p = strstr(json, quoted);
    if (p == NULL) {
        return NULL;
    }
    p = strchr(p + strlen(quoted), ':');
    return p ? p + 1 : NULL;
}

int buffet_state_init(const char *policy, void *mem, size_t len, char *err, size_t errlen) {
    struct state *s = mem;
    if (len < sizeof *s) {
        snprintf(err, errlen, "region of %zu bytes is too small", len);
        return 1;
    }
    const char *c = json_value(policy, "canary");
    if (c != NULL) {
        s->canary = strtoull(c, NULL, 10);
    }
    const char *p = json_value(policy, "blocked_ports");
    if (p == NULL) {
        return 0;
    }
    p = strchr(p, '[');
    if (p == NULL) {
        snprintf(err, errlen, "blocked_ports must be an array of port numbers");
        return 1;
    }
    for (p++;;) {
        while (*p == ' ' || *p == ',') {
            p++;
        }
        if (*p == ']') {
            return 0;
        }
        char *end;
        long port = strtol(p, &end, 10);
        if (end == p || port < 0 || port > 65535) {
            snprintf(err, errlen, "blocked_ports: not a port number at \"%.8s\"", p);
            return 1;
        }
        if (s->nblocked == MAX_BLOCKED) {
            snprintf(err, errlen, "blocked_ports: at most %d ports", MAX_BLOCKED);
            return 1;
        }
        s->blocked[s->nblocked++] = (uint16_t)port;
        p = end;
    }
}

buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *mem, size_t len) {
    struct state *s = mem;
    (void)len;
    s->packets++;
    s->bytes += pkt->len;
    if (pkt->ip_proto == 6 || pkt->ip_proto == 17) {
        for (uint32_t i = 0; i < s->nblocked; i++) {
            if (s->blocked[i] == pkt->dst_port) {
                s->dropped++;
                return BUFFET_DROP_POLICY;
            }
        }
    }
    return BUFFET_PASS;
}

size_t buffet_summary(const void *mem, size_t len, struct buffet_counter *out, size_t max) {
    const struct state *s = mem;
    (void)len;
    if (max < 4) {
        return 0;
    }
    out[0] = (struct buffet_counter){"packets", s->packets};
    out[1] = (struct buffet_counter){"bytes", s->bytes};
    out[2] = (struct buffet_counter){"dropped", s->dropped};
    out[3] = (struct buffet_counter){"canary", s->canary};
    return 4;
}
