/*
 * macswap.c — swaps the Ethernet source and destination addresses and sends the frame
 * back out of its input port, as a Buffet C NF: the C twin of buffet_nfs::MacSwap (the
 * minimal NF of FastPaas's protection figures).
 *
 * Policy: none (any JSON object is accepted).
 * Counters (buffet_summary): packets, malformed.
 */
#include <stdint.h>
#include <string.h>

#include "buffet.h"

struct state {
    uint64_t packets;
    uint64_t malformed;
};

const char *buffet_nf_name(void) { return "macswap"; }
uint32_t buffet_abi_version(void) { return BUFFET_ABI_VERSION; }
size_t buffet_mem_register(void) { return sizeof(struct state); }

int buffet_state_init(const char *policy, void *mem, size_t len, char *err, size_t errlen) {
    (void)policy;
    (void)mem;
    (void)err;
    (void)errlen;
    return len < sizeof(struct state);
}

buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *mem, size_t len) {
    struct state *s = mem;
    (void)len;
    if (pkt->len < 14) {
        s->malformed++;
        return BUFFET_DROP_MALFORMED;
    }
    uint8_t tmp[6];
    memcpy(tmp, pkt->data, 6);
    memcpy(pkt->data, pkt->data + 6, 6);
    memcpy(pkt->data + 6, tmp, 6);
    s->packets++;
    return BUFFET_TX;
}

size_t buffet_summary(const void *mem, size_t len, struct buffet_counter *out, size_t max) {
    const struct state *s = mem;
    (void)len;
    if (max < 2) {
        return 0;
    }
    out[0] = (struct buffet_counter){"packets", s->packets};
    out[1] = (struct buffet_counter){"malformed", s->malformed};
    return 2;
}
