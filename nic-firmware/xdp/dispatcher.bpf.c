// SPDX-License-Identifier: Apache-2.0
/*
 * The XDP Packet Dispatcher (driver and generic mode): for every frame, key extraction
 * (common/), classification by tuple-space search over BPF maps, the scheduler step of
 * Algorithm 1 (common/) over the Tenant Table and Worker Table, tagging (DSCP for
 * tenant slots <= 63, and a 32-bit tenant slot in the XDP metadata), and an XSKMAP
 * redirect to the chosen worker's AF_XDP socket on the frame's receive queue (key
 * rx_queue_index * BF_XDP_XSK_STRIDE + worker: see buffet_xdp.h). Migrations and overload reports go to
 * a BPF ring buffer for the control plane.
 *
 * Classification has the semantics of buffet-dispatch's Classifier: the loader expands
 * every rule into (mask, value) pairs over the same 7-word key (prefixes as masks, port
 * ranges as aligned power-of-two blocks), one tuple per distinct mask; the rules map
 * holds, per (tuple, masked key), the best rule there (lowest priority, then earliest
 * insertion). The program probes every tuple and keeps the best hit, so overlapping
 * rules resolve exactly as in Rust.
 *
 * The tuples and entries are held in two rule banks (buffet_xdp.h, bf_xdp_banks). A
 * packet is classified against the one bank that was active when its classification
 * began, and that bank is held (a per-CPU reader count) until the search is over; the
 * loader only writes a bank that is not active and that no run holds. So a rule change
 * (the loader writes the inactive bank, flips the active word, waits for the old bank's
 * holders to go, then repeats the change there) is seen by a packet entirely or not at
 * all.
 *
 * Time is bpf_ktime_get_ns(), except in test mode (BF_XDP_F_TEST in the config map):
 * then the timestamp is the config's test_ts, written by the host before each
 * BPF_PROG_TEST_RUN, and the program records its decision in the decision map and
 * returns XDP_PASS for a pass instead of redirecting. Test mode exists so that
 * `buffet trace --engine xdp` can replay a trace's timestamps.
 *
 * What it does not do: admit tenants, place them, evacuate workers (the loader writes
 * the tables), or lock: the scheduler state is one shared map value updated without a
 * lock, so with several RX queues on several CPUs concurrent updates of the same rows
 * can lose counts (a decision is never invalid: worker ids are bounds-checked).
 */
#include <stdbool.h>
#include <stdint.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define BF_STATIC_DEFS
#define BF_FN static __always_inline
#define BF_SCAN_WORKERS_EXTERNAL
#include "buffet_core_impl.h"
#include "buffet_xdp.h"

_Static_assert(sizeof(struct bf_tenant_row) == 32, "tenant row");
_Static_assert(sizeof(struct bf_worker_row) == 40, "worker row");
_Static_assert(sizeof(struct bf_xdp_config) == 32, "config");
_Static_assert(sizeof(struct bf_xdp_rule_key) == 64, "rule key");
_Static_assert(sizeof(struct bf_xdp_rule_val) == 16, "rule value");
_Static_assert(sizeof(struct bf_xdp_banks) == 16, "banks");
_Static_assert(sizeof(struct bf_xdp_decision) == 40, "decision");
_Static_assert(sizeof(struct bf_xdp_event) == 24, "event");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, uint32_t);
    __type(value, struct bf_xdp_config);
} bf_config SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __uint(map_flags, BPF_F_MMAPABLE);
    __type(key, uint32_t);
    __type(value, struct bf_xdp_state);
} bf_state SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, BF_XDP_BANKS * BF_XDP_MAX_TUPLES);
    __type(key, uint32_t);
    __type(value, struct bf_xdp_tuple);
} bf_tuples SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, BF_XDP_BANKS * BF_XDP_MAX_RULE_ENTRIES);
    __type(key, struct bf_xdp_rule_key);
    __type(value, struct bf_xdp_rule_val);
} bf_rules SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_XSKMAP);
    __uint(max_entries, BF_XDP_XSK_ENTRIES);
    __type(key, uint32_t);
    __type(value, uint32_t);
} bf_xsks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 1 << 16);
} bf_events SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, uint32_t);
    __type(value, struct bf_xdp_decision);
} bf_decision SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, BF_XDP_ST_COUNT);
    __type(key, uint32_t);
    __type(value, uint64_t);
} bf_stats SEC(".maps");

/* Packets policed (over the tenant's MAX_NB), per tenant slot and CPU: the run reports
 * them under each tenant, as the software dispatcher does. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, BF_XDP_MAX_TENANTS);
    __type(key, uint32_t);
    __type(value, uint64_t);
} bf_policed SEC(".maps");

/* Program runs holding each rule bank, per CPU (index: the bank). A run adds 1 before it
 * trusts the bank it read and takes it back when its search is over; the loader writes
 * a bank only once it is inactive and every CPU's count for it was seen at 0. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, BF_XDP_BANKS);
    __type(key, uint32_t);
    __type(value, uint64_t);
} bf_bank_readers SEC(".maps");

/* Scratch space: the copied header bytes (per CPU, so no stack pressure). */
struct bf_scratch {
    uint8_t hdr[BF_XDP_HDR_COPY];
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, uint32_t);
    __type(value, struct bf_scratch);
} bf_scratch SEC(".maps");

static __always_inline void bf_count(uint32_t stat)
{
    uint64_t *c = bpf_map_lookup_elem(&bf_stats, &stat);
    if (c)
        *c += 1;
}

static __always_inline uint64_t bf_mac64(const uint8_t *m)
{
    return ((uint64_t)m[0] << 40) | ((uint64_t)m[1] << 32) | ((uint64_t)m[2] << 24) |
           ((uint64_t)m[3] << 16) | ((uint64_t)m[4] << 8) | (uint64_t)m[5];
}

static __always_inline uint64_t bf_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

/* The classifier key, as buffet-dispatch's Key::of builds it. */
static __always_inline void bf_key_words(const struct bf_key *k, uint64_t *w)
{
    w[0] = (uint64_t)k->in_port | ((uint64_t)k->proto << 32) | ((uint64_t)(k->dscp & 0x3f) << 40);
    if (k->has_vlan)
        w[0] |= (1ull << 28) | ((uint64_t)(k->vlan & 0xfff) << 16);
    if (k->is_v6)
        w[0] |= 1ull << 29;
    w[1] = bf_mac64(k->src_mac) << 16;
    w[2] = bf_mac64(k->dst_mac) << 16;
    if (k->has_ports) {
        w[0] |= 1ull << 30;
        w[1] |= k->src_port;
        w[2] |= k->dst_port;
    }
    w[3] = bf_be64(k->src_addr);
    w[4] = bf_be64(k->src_addr + 8);
    w[5] = bf_be64(k->dst_addr);
    w[6] = bf_be64(k->dst_addr + 8);
}

/*
 * SCTP ports, which the common core leaves to the program: buffet-sdk's Packet::parse
 * reads SCTP's 12-byte common header (first fragment only) and reports a truncated
 * one as TruncatedL4. Returns an enum bf_parse_error.
 */
static __always_inline int bf_sctp_ports(const uint8_t *h, uint32_t len, struct bf_key *k)
{
    uint32_t l3 = k->l3_offset, end, l4 = k->l4_offset;
    if (k->proto != 132 || k->has_ports || l3 > 18 || l4 > 18 + 60)
        return BF_PARSE_OK;
    if (!k->is_v6) {
        if ((((uint32_t)h[l3 + 6] << 8 | h[l3 + 7]) & 0x1fff) != 0)
            return BF_PARSE_OK; /* not the first fragment */
        end = l3 + ((uint32_t)h[l3 + 2] << 8 | h[l3 + 3]);
    } else {
        end = l3 + 40 + ((uint32_t)h[l3 + 4] << 8 | h[l3 + 5]);
    }
    (void)len;
    if (end < l4 || end - l4 < 12)
        return BF_PARSE_TRUNCATED_L4;
    k->has_ports = 1;
    k->src_port = (uint16_t)((h[l4] << 8) | h[l4 + 1]);
    k->dst_port = (uint16_t)((h[l4 + 2] << 8) | h[l4 + 3]);
    return BF_PARSE_OK;
}

/* The overload scan's state, carried through bpf_loop. */
struct bf_scan {
    uint64_t slot;
    uint64_t best; /* last_nb of `mig`, once found */
    uint32_t mig;
    uint32_t found;
};

/* One Worker Table row of the overload scan (a bpf_loop callback, checked once). */
static long bf_scan_one(uint32_t i, void *arg)
{
    struct bf_scan *sc = arg;
    uint32_t zero = 0;
    struct bf_xdp_state *st = bpf_map_lookup_elem(&bf_state, &zero);
    struct bf_worker_row *c;
    uint64_t row = i;

    /* Opaque to the compiler, so the bounded register is the one used as the index. */
    asm volatile("" : "+r"(row));
    if (!st || row >= BF_XDP_MAX_WORKERS)
        return 1;
    c = &st->workers[row];
    bf_roll(c, sc->slot);
    if (c->live && (!sc->found || c->last_nb < sc->best)) {
        sc->mig = (uint32_t)row;
        sc->best = c->last_nb;
        sc->found = 1;
    }
    return 0;
}

/* The common core's overload scan (see buffet_core_impl.h) as one bpf_loop: the same
 * rows rolled in the same order and the same choice as the host's loop. `s->workers` is
 * the state map's Worker Table, which the callback looks up itself. */
BF_FN uint32_t bf_scan_workers(struct bf_sched *s, uint32_t n_workers, uint64_t slot,
                               uint32_t dflt)
{
    struct bf_scan sc = {.slot = slot, .mig = dflt};

    (void)s;
    if (n_workers > BF_XDP_MAX_WORKERS)
        n_workers = BF_XDP_MAX_WORKERS;
    bpf_loop(n_workers, bf_scan_one, &sc, 0);
    /* Bounded for the verifier: a row index of the Worker Table. */
    return sc.mig < BF_XDP_MAX_WORKERS ? sc.mig : dflt;
}

/* Tuple-space search state, carried through bpf_loop. */
struct bf_search {
    uint64_t words[BF_XDP_KEY_WORDS];
    uint32_t len;   /* frame length */
    uint32_t l3;    /* IP header offset (14 or 18) */
    uint32_t is_v6;
    struct bf_xdp_rule_key rk;
    uint64_t best_seq;
    uint32_t best_prio;
    uint32_t tenant;
    uint32_t found;
    uint32_t bank; /* the rule bank searched (0 or 1) */
};

/* One tuple of the search (a bpf_loop callback, so the verifier checks it once). */
static long bf_probe_tuple(uint32_t t, void *arg)
{
    struct bf_search *s = arg;
    struct bf_xdp_tuple *tp;
    struct bf_xdp_rule_val *v;
    uint32_t bank = s->bank & 1, index = bank * BF_XDP_MAX_TUPLES + t;

    tp = bpf_map_lookup_elem(&bf_tuples, &index);
    if (!tp)
        return 1;
    s->rk.tuple = t;
    s->rk.bank = bank;
    for (int i = 0; i < BF_XDP_KEY_WORDS; i++)
        s->rk.bits[i] = s->words[i] & tp->mask[i];
    v = bpf_map_lookup_elem(&bf_rules, &s->rk);
    if (v && (!s->found || v->priority < s->best_prio ||
              (v->priority == s->best_prio && v->seq < s->best_seq))) {
        s->found = 1;
        s->best_prio = v->priority;
        s->best_seq = v->seq;
        s->tenant = v->tenant;
    }
    return 0;
}

/* Tuple-space search: the best (priority, seq) over every tuple in use. */
static __always_inline bool bf_classify(struct bf_search *s, uint32_t n_tuples)
{
    s->found = 0;
    if (n_tuples > BF_XDP_MAX_TUPLES)
        n_tuples = BF_XDP_MAX_TUPLES;
    bpf_loop(n_tuples, bf_probe_tuple, s, 0);
    return s->found != 0;
}

/* A fully ordered atomic add (BPF_ATOMIC with BPF_FETCH: `lock xadd` on x86-64,
 * `ldaddal` on arm64): neither earlier nor later loads and stores move across it. */
static __always_inline void bf_atomic_add(uint64_t *p, uint64_t v)
{
    uint64_t old = __sync_fetch_and_add(p, v);
    /* The old value is used, so the compiler emits the fetching (ordered) form. */
    asm volatile("" : : "r"(old) : "memory");
}

/* The active rule bank, read from memory now (the loader flips it at any time). */
static __always_inline uint32_t bf_active_bank(struct bf_xdp_state *st)
{
    return *(volatile uint32_t *)&st->banks.active & 1;
}

/*
 * Tuple-space search against one rule bank, held throughout: the bank read from the
 * active word counts as held only once this run's reader count for it is visible and the
 * active word, read again after that, still names it. Should a flip come in between,
 * the run holds both banks, reads the word a third time and lets the other bank go:
 * either way, when the run read the bank it searches, the bank was active and already
 * held, so the loader (which writes a bank only after flipping away from it and seeing
 * no holder) cannot write it until this run lets it go. Returns 1 when a rule matched, 0
 * when none did, -1 when a map is missing. On 1 the run still holds the bank, through
 * `*held_out`, and lets it go with bf_bank_let_go once the schedule step has read the
 * matched tenant's Tenant Table row: a loader that removes a tenant waits for the old
 * bank's holders before it clears the row, so no run reads a row cleared (or reused by
 * another tenant) after it was classified to it.
 */
static __always_inline int bf_classify_held(struct bf_search *s, uint64_t **held_out)
{
    uint32_t zero = 0, one = 1, b;
    struct bf_xdp_state *st = bpf_map_lookup_elem(&bf_state, &zero);
    uint64_t *held0 = bpf_map_lookup_elem(&bf_bank_readers, &zero);
    uint64_t *held1 = bpf_map_lookup_elem(&bf_bank_readers, &one);
    uint64_t *held;
    bool found;

    if (!st || !held0 || !held1)
        return -1;
    b = bf_active_bank(st);
    held = b ? held1 : held0;
    bf_atomic_add(held, 1);
    if (bf_active_bank(st) != b) {
        bf_atomic_add(b ? held0 : held1, 1);
        b = bf_active_bank(st);
        held = b ? held1 : held0;
        bf_atomic_add(b ? held0 : held1, (uint64_t)-1);
    }
    s->bank = b;
    found = bf_classify(s, st->banks.n_tuples[b & 1]);
    if (!found) {
        bf_atomic_add(held, (uint64_t)-1);
        return 0;
    }
    *held_out = held;
    return 1;
}

/* Lets go of the bank bf_classify_held returned held. */
static __always_inline void bf_bank_let_go(uint64_t *held)
{
    bf_atomic_add(held, (uint64_t)-1);
}

static __always_inline void bf_emit(const struct bf_xdp_event *ev)
{
    if (bpf_ringbuf_output(&bf_events, (void *)ev, sizeof(*ev), 0) != 0)
        bf_count(BF_XDP_ST_EVENTS_LOST);
}

/*
 * Parse stage (a global function, so the verifier checks it once, apart from the
 * scheduler): copies the headers into the per-CPU scratch buffer and extracts the
 * classifier key. Returns an enum bf_parse_error, or -1 when the frame could not be
 * read.
 */
__attribute__((noinline)) int bf_xdp_parse(struct xdp_md *ctx, struct bf_search *p)
{
    uint32_t zero = 0, len;
    uint64_t n;
    struct bf_xdp_config *cfg;
    struct bf_scratch *sc;
    struct bf_key key;
    int rc;

    if (!p)
        return -1;
    cfg = bpf_map_lookup_elem(&bf_config, &zero);
    sc = bpf_map_lookup_elem(&bf_scratch, &zero);
    if (!cfg || !sc)
        return -1;
    len = (uint32_t)(ctx->data_end - ctx->data);
    n = len < BF_XDP_HDR_COPY ? len : BF_XDP_HDR_COPY;
    p->len = len;
    if (n == 0)
        return BF_PARSE_TRUNCATED_ETHERNET;
    /* Keep the bound visible to the verifier (clang may fold the min above). */
    asm volatile("" : "+r"(n));
    if (n > BF_XDP_HDR_COPY)
        return -1;
    if (bpf_xdp_load_bytes(ctx, 0, sc->hdr, n) != 0)
        return -1;
    rc = bf_extract_key(sc->hdr, len, cfg->in_port, &key);
    if (rc == BF_PARSE_OK)
        rc = bf_sctp_ports(sc->hdr, len, &key);
    if (rc != BF_PARSE_OK)
        return rc;
    bf_key_words(&key, p->words);
    p->l3 = key.l3_offset;
    p->is_v6 = key.is_v6;
    return BF_PARSE_OK;
}

/* Scheduler stage input and output. */
struct bf_step {
    uint64_t ts;
    uint32_t tenant;
    uint32_t pad;
    struct bf_outcome out;
};

/*
 * Scheduler stage (a global function, checked once): Algorithm 1 from common/ over the
 * state map's Tenant Table and Worker Table. Returns 0, or -1 when a map is missing.
 */
__attribute__((noinline)) int bf_xdp_schedule(struct bf_step *io)
{
    uint32_t zero = 0;
    struct bf_xdp_config *cfg;
    struct bf_xdp_state *st;

    if (!io)
        return -1;
    cfg = bpf_map_lookup_elem(&bf_config, &zero);
    st = bpf_map_lookup_elem(&bf_state, &zero);
    if (!cfg || !st)
        return -1;
    struct bf_sched s = {
        .tenants = st->tenants,
        .n_tenants = BF_XDP_MAX_TENANTS,
        .shift = cfg->shift,
        .workers = st->workers,
        .n_workers = cfg->n_workers < BF_XDP_MAX_WORKERS ? cfg->n_workers : BF_XDP_MAX_WORKERS,
        .threshold = cfg->threshold,
    };
    bf_schedule(&s, io->ts, io->tenant, &io->out);
    return 0;
}

/*
 * Tagging stage (global, checked once): the tenant slot into DSCP (slots <= 63, when
 * BF_XDP_F_TAG_DSCP) from the scratch copy back into the frame, and into the XDP
 * metadata (when BF_XDP_F_META and the driver supports it). Returns 0, or -1 when the
 * frame could not be written.
 */
__attribute__((noinline)) int bf_xdp_tag(struct xdp_md *ctx, struct bf_search *p, uint32_t tenant)
{
    uint32_t zero = 0, l3;
    struct bf_xdp_config *cfg;
    struct bf_scratch *sc;

    if (!p)
        return -1;
    cfg = bpf_map_lookup_elem(&bf_config, &zero);
    sc = bpf_map_lookup_elem(&bf_scratch, &zero);
    if (!cfg || !sc)
        return -1;
    l3 = p->l3;
    if ((cfg->flags & BF_XDP_F_TAG_DSCP) && tenant <= 63 && l3 <= 18 &&
        bf_tag_dscp(sc->hdr, p->len, l3, !p->is_v6, (uint8_t)tenant) == BF_TAG_OK) {
        /* The tag changes bytes 0, 1, 10 and 11 of the IP header at most. */
        if (bpf_xdp_store_bytes(ctx, l3, sc->hdr + l3, 12) != 0)
            return -1;
    }
    /* A driver without metadata support leaves the frame without its metadata here;
     * the frame still goes to its worker's socket, whose reader finds no tenant there
     * and drops it as untagged (it never guesses one). */
    if ((cfg->flags & BF_XDP_F_META) && bpf_xdp_adjust_meta(ctx, -(int)sizeof(uint32_t)) == 0) {
        void *data = (void *)(long)ctx->data;
        uint32_t *meta = (void *)(long)ctx->data_meta;
        if ((void *)(meta + 1) > data)
            return -1;
        *meta = tenant;
    }
    return 0;
}

/* The XSKMAP key of `worker`'s socket on receive queue `queue` (buffet_xdp.h); a queue
 * or worker beyond the map gives a key past its end, for which bpf_redirect_map returns
 * its fallback, as for a key with no socket. */
static __always_inline uint32_t bf_xsk_key(uint32_t queue, uint32_t worker)
{
    if (queue >= BF_XDP_MAX_QUEUES || worker >= BF_XDP_XSK_STRIDE)
        return BF_XDP_XSK_ENTRIES;
    return queue * BF_XDP_XSK_STRIDE + worker;
}

SEC("xdp")
int buffet_dispatch(struct xdp_md *ctx)
{
    uint32_t zero = 0, verdict, tenant = 0, flags;
    struct bf_xdp_config *cfg;
    struct bf_xdp_decision *dec;
    struct bf_search search = {};
    struct bf_step step = {};
    int rc;

    cfg = bpf_map_lookup_elem(&bf_config, &zero);
    if (!cfg)
        return XDP_ABORTED;
    flags = cfg->flags;
    bf_count(BF_XDP_ST_PACKETS);
    step.ts = (flags & BF_XDP_F_TEST) ? cfg->test_ts : bpf_ktime_get_ns();

    rc = bf_xdp_parse(ctx, &search);
    if (rc < 0)
        return XDP_ABORTED;
    if (rc != BF_PARSE_OK) {
        verdict = BF_XDP_MALFORMED;
        bf_count(BF_XDP_ST_MALFORMED);
    } else {
        uint64_t *held = NULL;
        int hit = bf_classify_held(&search, &held);
        if (hit < 0)
            return XDP_ABORTED;
        if (hit == 0) {
            verdict = BF_XDP_UNMATCHED;
            bf_count(BF_XDP_ST_UNMATCHED);
        } else {
            tenant = search.tenant;
            step.tenant = tenant;
            rc = bf_xdp_schedule(&step);
            if (held)
                bf_bank_let_go(held);
            if (rc != 0)
                return XDP_ABORTED;
            switch (step.out.kind) {
            case BF_PASS:
                verdict = BF_XDP_PASS;
                bf_count(BF_XDP_ST_PASSED);
                break;
            case BF_POLICED: {
                uint32_t slot = tenant;
                uint64_t *c = bpf_map_lookup_elem(&bf_policed, &slot);
                if (c)
                    *c += 1;
                verdict = BF_XDP_POLICED;
                bf_count(BF_XDP_ST_POLICED);
                break;
            }
            case BF_NO_LIVE_WORKER:
                verdict = BF_XDP_NO_WORKER;
                bf_count(BF_XDP_ST_NO_WORKER);
                break;
            default:
                verdict = BF_XDP_UNKNOWN;
                bf_count(BF_XDP_ST_UNMATCHED);
                break;
            }
            if (step.out.migrated) {
                struct bf_xdp_event ev = {
                    .slot = bf_timeslot(step.ts, cfg->shift),
                    .kind = BF_XDP_EV_MIGRATION,
                    .tenant = tenant,
                    .worker = step.out.worker,
                    .from = step.out.from,
                };
                bf_emit(&ev);
            }
            if (step.out.overload) {
                struct bf_xdp_event ev = {
                    .slot = step.out.overload_slot,
                    .kind = BF_XDP_EV_OVERLOAD,
                    .tenant = tenant,
                    .worker = step.out.overload_worker,
                };
                bf_emit(&ev);
            }
        }
    }

    if (verdict == BF_XDP_PASS && bf_xdp_tag(ctx, &search, tenant) != 0)
        return XDP_ABORTED;

    if (flags & BF_XDP_F_TEST) {
        dec = bpf_map_lookup_elem(&bf_decision, &zero);
        if (dec) {
            dec->seq += 1;
            dec->verdict = verdict;
            dec->tenant = tenant;
            dec->parse_error = (uint32_t)rc;
            dec->worker = step.out.worker;
            dec->from = step.out.from;
            dec->migrated = step.out.migrated;
            dec->overload = step.out.overload;
            dec->overload_worker = step.out.overload_worker;
            dec->pad = 0;
            dec->overload_slot = step.out.overload_slot;
        }
        return verdict == BF_XDP_PASS ? XDP_PASS : XDP_DROP;
    }
    if (verdict != BF_XDP_PASS)
        return XDP_DROP;
    /* No socket of the worker on this queue (a queue the run does not read): dropped and
     * counted, never handed to the host stack past the tenant's NF. */
    long act = bpf_redirect_map(&bf_xsks, bf_xsk_key(ctx->rx_queue_index, step.out.worker),
                                XDP_DROP);
    if (act != XDP_REDIRECT)
        bf_count(BF_XDP_ST_NO_SOCKET);
    return (int)act;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
