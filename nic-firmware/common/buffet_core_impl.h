/*
 * Definitions of the functions declared in buffet_core.h. Included once by
 * buffet_core.c (external linkage, the host build), or by a program that defines
 * BF_STATIC_DEFS first (definitions local to it; BF_FN, default `static inline`, is
 * their storage class, e.g. `static __always_inline` in a BPF program).
 *
 * Freestanding: no libc call, no allocation, loops bounded by the table sizes.
 */
#ifndef BUFFET_CORE_IMPL_H
#define BUFFET_CORE_IMPL_H

#ifdef BF_STATIC_DEFS
#ifndef BF_FN
#define BF_FN static inline
#endif
#else
#undef BF_FN
#define BF_FN
#endif

#include "buffet_core.h"

/* ---- timeslots and the Worker Table ---------------------------------------------- */

BF_FN uint64_t bf_timeslot(uint64_t ts_ns, uint32_t shift)
{
    return shift >= 64 ? 0 : ts_ns >> shift;
}

static inline uint64_t bf_sat_add(uint64_t a, uint64_t b)
{
    uint64_t r = a + b;
    return r < a ? UINT64_MAX : r;
}

/* prev(x): the row's current timeslot is the one just before `slot`. */
static inline bool bf_is_prev(uint8_t has_slot, uint64_t cur_slot, uint64_t slot)
{
    return has_slot && slot != 0 && cur_slot == slot - 1;
}

/* Rolls a worker row into `slot`: last_nb = prev ? pkt_nb : 0, pkt_nb = 0. */
static inline void bf_roll(struct bf_worker_row *w, uint64_t slot)
{
    if (!(w->has_slot && w->cur_slot == slot)) {
        w->last_nb = bf_is_prev(w->has_slot, w->cur_slot, slot) ? w->pkt_nb : 0;
        w->has_slot = 1;
        w->cur_slot = slot;
        w->pkt_nb = 0;
    }
}

/* ---- the scheduler step ---------------------------------------------------------- */

/*
 * The overload branch's scan of the Worker Table: rolls every row of the first
 * `n_workers` into `slot` and returns the live worker with the lowest last_nb, ties to
 * the lowest id; `dflt` when none is live.
 *
 * A program whose checker walks this loop once per (worker, best so far) pair — the
 * XDP program under the kernel verifier — defines BF_SCAN_WORKERS_EXTERNAL and gives its
 * own definition after including this file (there: one bpf_loop callback, checked once,
 * so the Worker Table's size no longer bounds what the verifier accepts).
 */
#ifdef BF_SCAN_WORKERS_EXTERNAL
BF_FN uint32_t bf_scan_workers(struct bf_sched *s, uint32_t n_workers, uint64_t slot,
                               uint32_t dflt);
#else
static inline uint32_t bf_scan_workers(struct bf_sched *s, uint32_t n_workers, uint64_t slot,
                                       uint32_t dflt)
{
    uint32_t i, mig = dflt;
    uint64_t best = 0;
    bool found = false;
    for (i = 0; i < n_workers; i++) {
        struct bf_worker_row *c = &s->workers[i];
        bf_roll(c, slot);
        if (c->live && (!found || c->last_nb < best)) {
            mig = i;
            best = c->last_nb;
            found = true;
        }
    }
    return mig;
}
#endif

BF_FN void bf_schedule(struct bf_sched *s, uint64_t ts_ns, uint32_t tenant, struct bf_outcome *out)
{
    uint64_t slot = bf_timeslot(ts_ns, s->shift);
    uint32_t n_workers = s->n_workers < BF_MAX_WORKERS ? s->n_workers : BF_MAX_WORKERS;
    struct bf_tenant_row *t;
    struct bf_worker_row *w;
    uint32_t wid, chosen;

    out->kind = BF_UNKNOWN_TENANT;
    out->migrated = 0;
    out->overload = 0;
    out->pad = 0;
    out->worker = 0;
    out->from = 0;
    out->overload_worker = 0;
    out->overload_slot = 0;
    out->pad2[0] = out->pad2[1] = out->pad2[2] = 0;

    if (tenant >= s->n_tenants || !s->tenants[tenant].present)
        return;
    t = &s->tenants[tenant];
    wid = t->worker;
    if (wid >= n_workers || !s->workers[wid].live) {
        /* Only when no worker is live: dead workers hand their tenants over. */
        out->kind = BF_NO_LIVE_WORKER;
        return;
    }
    chosen = wid;
    if (t->has_slot && t->cur_slot == slot) {
        /* Step 2: same timeslot. */
        t->pkt_nb = bf_sat_add(t->pkt_nb, 1);
        if (t->max_nb != 0 && t->pkt_nb > t->max_nb) {
            out->kind = BF_POLICED;
            return;
        }
    } else {
        /* Step 3: the tenant's first packet in this timeslot. */
        uint64_t tmp = bf_is_prev(t->has_slot, t->cur_slot, slot) ? t->pkt_nb : 0;
        t->has_slot = 1;
        t->cur_slot = slot;
        t->pkt_nb = 1;
        w = &s->workers[wid];
        bf_roll(w, slot);
        if (w->last_nb < w->max_nb) {
            w->times = 0;
        } else {
            /* Overloaded: roll every worker; mig = live worker with the lowest
             * last_nb, ties to the lowest id. `wid` is live, so one exists. */
            uint32_t mig = bf_scan_workers(s, n_workers, slot, wid);
            if (mig != wid &&
                bf_sat_add(s->workers[mig].last_nb, tmp) < s->workers[mig].max_nb) {
                t->worker = (uint16_t)mig;
                w->last_nb = w->last_nb > tmp ? w->last_nb - tmp : 0;
                s->workers[mig].last_nb += tmp; /* < max_nb: cannot overflow */
                chosen = mig;
                out->migrated = 1;
                out->from = (uint16_t)wid;
            }
            if (w->times != UINT32_MAX)
                w->times++;
            if (w->times > s->threshold) {
                out->overload = 1;
                out->overload_worker = (uint16_t)wid;
                out->overload_slot = slot;
            }
        }
    }
    /* Step 4. */
    w = &s->workers[chosen];
    bf_roll(w, slot);
    w->pkt_nb = bf_sat_add(w->pkt_nb, 1);
    out->kind = BF_PASS;
    out->worker = (uint16_t)chosen;
}

/* ---- DSCP tagging ---------------------------------------------------------------- */

BF_FN uint16_t bf_checksum_update(uint16_t hc, uint16_t old_word, uint16_t new_word)
{
    uint32_t sum = (uint32_t)(uint16_t)~hc + (uint32_t)(uint16_t)~old_word + (uint32_t)new_word;
    /* Two folds suffice: the sum of three 16-bit values is below 2^18. */
    sum = (sum & 0xffffu) + (sum >> 16);
    sum = (sum & 0xffffu) + (sum >> 16);
    return (uint16_t)~sum;
}

BF_FN int bf_tag_dscp(uint8_t *bytes, uint32_t len, uint32_t l3_offset, bool is_v4, uint8_t dscp)
{
    uint64_t need = is_v4 ? 20 : 40;
    uint8_t *h;
    if (dscp > 63)
        return BF_TAG_DSCP_RANGE;
    if ((uint64_t)l3_offset + need > (uint64_t)len)
        return BF_TAG_TRUNCATED;
    h = bytes + l3_offset;
    if ((h[0] >> 4) != (is_v4 ? 4 : 6))
        return BF_TAG_WRONG_VERSION;
    if (is_v4) {
        uint16_t old_word = (uint16_t)((h[0] << 8) | h[1]);
        uint16_t new_word, hc, fixed;
        h[1] = (uint8_t)((dscp << 2) | (h[1] & 0x03));
        new_word = (uint16_t)((h[0] << 8) | h[1]);
        hc = (uint16_t)((h[10] << 8) | h[11]);
        fixed = bf_checksum_update(hc, old_word, new_word);
        h[10] = (uint8_t)(fixed >> 8);
        h[11] = (uint8_t)fixed;
    } else {
        /* Traffic class = low nibble of byte 0 (its upper 4 bits) + high nibble of byte 1. */
        uint8_t tc = (uint8_t)((h[0] << 4) | (h[1] >> 4));
        tc = (uint8_t)((dscp << 2) | (tc & 0x03));
        h[0] = (uint8_t)((h[0] & 0xf0) | (tc >> 4));
        h[1] = (uint8_t)((tc << 4) | (h[1] & 0x0f));
    }
    return BF_TAG_OK;
}

/* ---- key extraction -------------------------------------------------------------- */

static inline uint16_t bf_be16(const uint8_t *p)
{
    return (uint16_t)((p[0] << 8) | p[1]);
}

BF_FN int bf_extract_key(const uint8_t *data, uint32_t len, uint16_t in_port, struct bf_key *k)
{
    uint32_t l3 = 14, rest, hlen, total, l4, end, i;
    uint16_t ether_type;
    bool l4_parsable = true;

    for (i = 0; i < sizeof(*k); i++)
        ((uint8_t *)k)[i] = 0;
    k->in_port = in_port;
    if (len < 14)
        return BF_PARSE_TRUNCATED_ETHERNET;
    for (i = 0; i < 6; i++) {
        k->dst_mac[i] = data[i];
        k->src_mac[i] = data[6 + i];
    }
    ether_type = bf_be16(data + 12);
    if (ether_type == 0x8100 || ether_type == 0x88a8) {
        if (len < 18)
            return BF_PARSE_TRUNCATED_VLAN;
        k->has_vlan = 1;
        k->vlan = bf_be16(data + 14) & 0x0fff;
        ether_type = bf_be16(data + 16);
        l3 = 18;
    }
    rest = len - l3;
    k->l3_offset = (uint16_t)l3;
    if (ether_type == 0x0800) {
        const uint8_t *ip = data + l3;
        if (rest < 20)
            return BF_PARSE_TRUNCATED_IP;
        if ((ip[0] >> 4) != 4)
            return BF_PARSE_BAD_IP_VERSION;
        if ((ip[0] & 0x0f) < 5)
            return BF_PARSE_BAD_IHL;
        hlen = (uint32_t)(ip[0] & 0x0f) * 4;
        if (rest < hlen)
            return BF_PARSE_TRUNCATED_IP;
        total = bf_be16(ip + 2);
        if (total > rest)
            return BF_PARSE_LENGTH_BEYOND_BUFFER;
        if (total < hlen)
            return BF_PARSE_TRUNCATED_IP;
        k->proto = ip[9];
        k->dscp = ip[1] >> 2;
        k->src_addr[10] = k->src_addr[11] = 0xff;
        k->dst_addr[10] = k->dst_addr[11] = 0xff;
        for (i = 0; i < 4; i++) {
            k->src_addr[12 + i] = ip[12 + i];
            k->dst_addr[12 + i] = ip[16 + i];
        }
        l4_parsable = (bf_be16(ip + 6) & 0x1fff) == 0;
        l4 = l3 + hlen;
        end = l3 + total;
    } else if (ether_type == 0x86dd) {
        const uint8_t *ip = data + l3;
        if (rest < 40)
            return BF_PARSE_TRUNCATED_IP;
        if ((ip[0] >> 4) != 6)
            return BF_PARSE_BAD_IP_VERSION;
        total = 40 + (uint32_t)bf_be16(ip + 4);
        if (total > rest)
            return BF_PARSE_LENGTH_BEYOND_BUFFER;
        k->is_v6 = 1;
        k->proto = ip[6];
        k->dscp = (uint8_t)(((ip[0] << 4) | (ip[1] >> 4)) & 0xff) >> 2;
        for (i = 0; i < 16; i++) {
            k->src_addr[i] = ip[8 + i];
            k->dst_addr[i] = ip[24 + i];
        }
        l4 = l3 + 40;
        end = l3 + total;
    } else {
        return BF_PARSE_UNSUPPORTED_ETHERTYPE;
    }
    if (end > 0xffff)
        return BF_PARSE_LENGTH_BEYOND_BUFFER;
    k->l4_offset = (uint16_t)l4;
    if (l4_parsable && k->proto == 6) {
        uint32_t off;
        if (end - l4 < 20)
            return BF_PARSE_TRUNCATED_L4;
        off = (uint32_t)(data[l4 + 12] >> 4) * 4;
        if (off < 20 || off > end - l4)
            return BF_PARSE_BAD_TCP_OFFSET;
        k->has_ports = 1;
    } else if (l4_parsable && k->proto == 17) {
        if (end - l4 < 8)
            return BF_PARSE_TRUNCATED_L4;
        k->has_ports = 1;
    }
    if (k->has_ports) {
        k->src_port = bf_be16(data + l4);
        k->dst_port = bf_be16(data + l4 + 2);
    }
    return BF_PARSE_OK;
}

#endif /* BUFFET_CORE_IMPL_H */
