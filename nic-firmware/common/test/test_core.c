/*
 * Host unit tests of the dispatcher core (gcc, libc allowed here only). Every scheduler
 * expectation is derived by hand in a comment, from docs/scheduler.md. Run by
 * `cargo test -p buffet-nicfw` (tests/c_unit.rs compiles and runs this file) or by
 * `make -C nic-firmware test`.
 */
#include <stdio.h>
#include <string.h>

#include "../buffet_core.h"

static int failures;

#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);    \
            failures++;                                                                \
        }                                                                              \
    } while (0)

#define NT 8
#define NW 4

static struct bf_tenant_row tenants[NT];
static struct bf_worker_row workers[NW];
static struct bf_sched sched;

static void setup(uint32_t n_workers, uint64_t worker_max, uint32_t shift, uint32_t threshold)
{
    memset(tenants, 0, sizeof tenants);
    memset(workers, 0, sizeof workers);
    for (uint32_t i = 0; i < n_workers; i++) {
        workers[i].live = 1;
        workers[i].max_nb = worker_max;
    }
    sched.tenants = tenants;
    sched.n_tenants = NT;
    sched.workers = workers;
    sched.n_workers = n_workers;
    sched.shift = shift;
    sched.threshold = threshold;
}

static void tenant(uint32_t slot, uint16_t worker, uint64_t max_nb)
{
    tenants[slot].present = 1;
    tenants[slot].worker = worker;
    tenants[slot].max_nb = max_nb;
}

/* Schedules one packet; returns the worker on a pass, -1 on policing, -2 otherwise. */
static int step(uint64_t ts, uint32_t slot, struct bf_outcome *o)
{
    struct bf_outcome tmp;
    if (!o)
        o = &tmp;
    bf_schedule(&sched, ts, slot, o);
    if (o->kind == BF_PASS)
        return o->worker;
    return o->kind == BF_POLICED ? -1 : -2;
}

static void test_timeslot(void)
{
    CHECK(bf_timeslot(1u << 30, 30) == 1);
    CHECK(bf_timeslot((1u << 30) - 1, 30) == 0);
    CHECK(bf_timeslot(UINT64_MAX, 63) == 1);
    CHECK(bf_timeslot(UINT64_MAX, 64) == 0);
    CHECK(bf_timeslot(UINT64_MAX, 1000) == 0);
    CHECK(bf_timeslot(7, 0) == 7);
}

static void test_same_slot_and_policing(void)
{
    setup(1, 100, 0, 3);
    tenant(0, 0, 2);
    /* First packet: no current slot, tmp 0; w0 rolled from none, last 0 < 100. */
    CHECK(step(5, 0, NULL) == 0);
    CHECK(step(5, 0, NULL) == 0);  /* pkt_nb 2 <= 2 */
    CHECK(step(5, 0, NULL) == -1); /* 3 > 2: policed, worker not charged */
    CHECK(tenants[0].pkt_nb == 3);
    CHECK(workers[0].pkt_nb == 2);
    /* Unknown tenant slots. */
    CHECK(step(5, 1, NULL) == -2);
    CHECK(step(5, NT + 3, NULL) == -2);
}

static void test_migration_and_reports(void)
{
    struct bf_outcome o;
    /* K = 2, worker MAX_NB 4, threshold 0; tenants 0 and 1 on w0 (budget 2 and
     * unlimited), tenant 2 on w1. The same trace as buffet-config's hand vector. */
    setup(2, 4, 0, 0);
    tenant(0, 0, 2);
    tenant(1, 0, 0);
    tenant(2, 1, 0);
    CHECK(step(0, 0, NULL) == 0);
    CHECK(step(0, 0, NULL) == 0);
    CHECK(step(0, 0, NULL) == -1);
    CHECK(step(0, 1, NULL) == 0);
    CHECK(step(0, 1, NULL) == 0); /* w0.pkt 4 */
    CHECK(step(0, 2, NULL) == 1); /* w1.pkt 1 */
    /* Slot 1, tenant 0: tmp 3 (policed counted); w0.last 4 >= 4: overloaded. w1.last 1
     * lowest; 1 + 3 < 4 fails: stays; times 1 > 0: report (w0, 1). */
    CHECK(step(1, 0, &o) == 0);
    CHECK(!o.migrated && o.overload && o.overload_worker == 0 && o.overload_slot == 1);
    /* Tenant 1: tmp 2; 1 + 2 < 4: migrates to w1 (w0.last 2, w1.last 3); times 2. */
    CHECK(step(1, 1, &o) == 1);
    CHECK(o.migrated && o.from == 0 && o.overload && o.overload_worker == 0);
    CHECK(tenants[1].worker == 1 && workers[0].last_nb == 2 && workers[1].last_nb == 3);
    /* Tenant 2: tmp 1; w1.last 3 < 4: times 0, pass on w1. */
    CHECK(step(1, 2, &o) == 1);
    CHECK(!o.overload && workers[1].times == 0);
    /* Slot 3 (slot 2 idle): tenant 0 tmp 0, w0 last 0 < 4. */
    CHECK(step(3, 0, &o) == 0);
    CHECK(!o.overload && workers[0].last_nb == 0 && workers[0].times == 0);
}

static void test_older_timestamp_and_max_zero(void)
{
    struct bf_outcome o;
    /* Worker MAX_NB 0 is always overloaded; one worker: mig == wid, no migration. */
    setup(1, 0, 0, 1);
    tenant(0, 0, 0);
    CHECK(step(10, 0, &o) == 0);
    CHECK(!o.overload && workers[0].times == 1); /* 1 > 1 fails */
    /* An older timestamp is a new timeslot for the tenant (equality only). */
    CHECK(step(9, 0, &o) == 0);
    CHECK(o.overload && o.overload_slot == 9 && workers[0].times == 2);
    CHECK(tenants[0].cur_slot == 9 && tenants[0].pkt_nb == 1);
    /* slot 10 again: prev(T) holds (9 == 10 - 1): tmp 1; w0 rolled: cur 9 is prev,
     * last = pkt_nb 1 (the packet of slot 9; slot 10's count was reset when rolling to 9). */
    CHECK(step(10, 0, &o) == 0);
    CHECK(workers[0].last_nb == 1 && workers[0].times == 3);
}

static void test_shift_64(void)
{
    setup(1, 1, 64, 3);
    tenant(0, 0, 1);
    /* Every timestamp is timeslot 0: the second packet is policed. */
    CHECK(step(0, 0, NULL) == 0);
    CHECK(step(UINT64_MAX, 0, NULL) == -1);
}

static void test_dead_worker(void)
{
    setup(2, 10, 0, 3);
    tenant(0, 1, 0);
    workers[1].live = 0;
    CHECK(step(0, 0, NULL) == -2);
    /* Dead workers are never migration candidates. */
    setup(3, 3, 0, 3);
    tenant(0, 0, 0);
    tenant(1, 0, 0);
    workers[1].live = 0;
    CHECK(step(0, 0, NULL) == 0);
    CHECK(step(0, 0, NULL) == 0);
    CHECK(step(0, 1, NULL) == 0);
    /* Slot 1: tenant 0 tmp 2; w0.last 3 >= 3. w1 (last 0, lower id) is dead; w2 last 0:
     * 0 + 2 < 3, so the tenant moves to w2. */
    CHECK(step(1, 0, NULL) == 2);
}

static uint16_t full_checksum(const uint8_t *h)
{
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2)
        if (i != 10)
            sum += (uint32_t)(h[i] << 8 | h[i + 1]);
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)~sum;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void test_tagging(void)
{
    uint8_t b[64];
    for (int n = 0; n < 100000; n++) {
        for (int i = 0; i < 20; i++)
            b[3 + i] = (uint8_t)next();
        b[3] = 0x45;
        uint16_t c = full_checksum(b + 3);
        b[13] = (uint8_t)(c >> 8);
        b[14] = (uint8_t)c;
        uint8_t dscp = (uint8_t)(next() % 64), ecn = b[4] & 3;
        CHECK(bf_tag_dscp(b, 23, 3, true, dscp) == BF_TAG_OK);
        CHECK((b[4] >> 2) == dscp && (b[4] & 3) == ecn);
        CHECK((uint16_t)(b[13] << 8 | b[14]) == full_checksum(b + 3));
    }
    /* RFC 1624's example: HC 0xdd2f, m 0x5555 -> 0x3285 gives HC' 0x0000. */
    CHECK(bf_checksum_update(0xdd2f, 0x5555, 0x3285) == 0x0000);
    /* IPv6: traffic class 0xab -> DSCP 5 keeps ECN 0b11 and the flow label. */
    memset(b, 0, sizeof b);
    b[0] = 0x6a;
    b[1] = 0xbf;
    b[2] = 0xed;
    CHECK(bf_tag_dscp(b, 40, 0, false, 5) == BF_TAG_OK);
    CHECK(b[0] == 0x61 && b[1] == 0x7f && b[2] == 0xed);
    /* Errors leave the bytes unchanged. */
    CHECK(bf_tag_dscp(b, 40, 0, false, 64) == BF_TAG_DSCP_RANGE);
    CHECK(bf_tag_dscp(b, 40, 1, false, 1) == BF_TAG_TRUNCATED);
    CHECK(bf_tag_dscp(b, 40, UINT32_MAX, true, 1) == BF_TAG_TRUNCATED);
    CHECK(bf_tag_dscp(b, 40, 0, true, 1) == BF_TAG_WRONG_VERSION);
    CHECK(b[0] == 0x61 && b[1] == 0x7f);
}

static void test_key_extraction(void)
{
    /* Ethernet / VLAN 42 / IPv4 10.0.0.1 -> 10.0.0.2 DSCP 7 / UDP 1000 -> 2000, 4 bytes. */
    uint8_t f[64] = {2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0x81, 0x00, 0x20, 42, 0x08, 0x00,
                     0x45, 7 << 2, 0, 32, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
                     0x03, 0xe8, 0x07, 0xd0, 0, 12, 0, 0, 'd', 'a', 't', 'a'};
    uint32_t len = 18 + 32;
    struct bf_key k;
    CHECK(bf_extract_key(f, len, 3, &k) == BF_PARSE_OK);
    CHECK(k.in_port == 3 && k.has_vlan && k.vlan == 42 && !k.is_v6 && k.proto == 17);
    CHECK(k.dscp == 7 && k.has_ports && k.src_port == 1000 && k.dst_port == 2000);
    CHECK(k.l3_offset == 18 && k.l4_offset == 38 && k.src_mac[0] == 1 && k.dst_mac[5] == 2);
    CHECK(k.src_addr[10] == 0xff && k.src_addr[15] == 1 && k.dst_addr[15] == 2);
    /* A non-first fragment has no ports. */
    f[18 + 7] = 1;
    CHECK(bf_extract_key(f, len, 0, &k) == BF_PARSE_OK && !k.has_ports);
    f[18 + 7] = 0;
    /* Errors, in buffet-sdk's order. */
    CHECK(bf_extract_key(f, 13, 0, &k) == BF_PARSE_TRUNCATED_ETHERNET);
    CHECK(bf_extract_key(f, 17, 0, &k) == BF_PARSE_TRUNCATED_VLAN);
    CHECK(bf_extract_key(f, 37, 0, &k) == BF_PARSE_TRUNCATED_IP);
    CHECK(bf_extract_key(f, 49, 0, &k) == BF_PARSE_LENGTH_BEYOND_BUFFER);
    f[18 + 3] = 27; /* total length 27: 7 bytes of UDP */
    CHECK(bf_extract_key(f, len, 0, &k) == BF_PARSE_TRUNCATED_L4);
    f[18 + 3] = 19; /* below the header length */
    CHECK(bf_extract_key(f, len, 0, &k) == BF_PARSE_TRUNCATED_IP);
    f[18 + 3] = 32;
    f[18] = 0x44;
    CHECK(bf_extract_key(f, len, 0, &k) == BF_PARSE_BAD_IHL);
    f[18] = 0x65;
    CHECK(bf_extract_key(f, len, 0, &k) == BF_PARSE_BAD_IP_VERSION);
    f[18] = 0x45;
    f[16] = 0x08;
    f[17] = 0x06;
    CHECK(bf_extract_key(f, len, 0, &k) == BF_PARSE_UNSUPPORTED_ETHERTYPE);

    /* Ethernet / IPv6 / TCP 80 -> 443 with data offset 4 (bad), then 5. */
    uint8_t g[14 + 40 + 20] = {0};
    g[12] = 0x86;
    g[13] = 0xdd;
    g[14] = 0x60 | 0x0a; /* traffic class 0xab -> DSCP 0x2a */
    g[15] = 0xb0;
    g[14 + 5] = 20;
    g[14 + 6] = 6;
    g[14 + 8] = 0x20;
    g[14 + 39] = 9;
    g[54] = 0;
    g[55] = 80;
    g[56] = 0x01;
    g[57] = 0xbb;
    g[54 + 12] = 4 << 4;
    CHECK(bf_extract_key(g, sizeof g, 0, &k) == BF_PARSE_BAD_TCP_OFFSET);
    g[54 + 12] = 5 << 4;
    CHECK(bf_extract_key(g, sizeof g, 0, &k) == BF_PARSE_OK);
    CHECK(k.is_v6 && !k.has_vlan && k.proto == 6 && k.dscp == 0x2a && k.has_ports);
    CHECK(k.src_port == 80 && k.dst_port == 443 && k.src_addr[0] == 0x20 && k.dst_addr[15] == 9);
    CHECK(bf_extract_key(g, sizeof g - 1, 0, &k) == BF_PARSE_LENGTH_BEYOND_BUFFER);
}

int main(void)
{
    test_timeslot();
    test_same_slot_and_policing();
    test_migration_and_reports();
    test_older_timestamp_and_max_zero();
    test_shift_64();
    test_dead_worker();
    test_tagging();
    test_key_extraction();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("nic-firmware/common: all checks passed\n");
    return 0;
}
