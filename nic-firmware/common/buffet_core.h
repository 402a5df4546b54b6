/*
 * Buffet dispatcher core in portable C: key extraction, timeslot, the scheduler step
 * (the Buffet paper's Algorithm 1 over Tenant Table and Worker Table arrays) and the
 * DSCP tag with the RFC 1624 incremental checksum fix.
 *
 * What it does not do: classify (rule lookup is the XDP program's maps or the P4
 * table), allocate, read a clock, lock, or print. It needs only <stdint.h> and
 * <stdbool.h>, so it builds freestanding (-ffreestanding, no libc), for BPF and for
 * the Netronome Micro-C plugin.
 *
 * Semantics are those of docs/scheduler.md and of buffet-dispatch's scheduler module
 * (its "literal consequences" included), bit for bit; the trace vectors under
 * tests/vectors/ check that.
 *
 * Two ways to use it:
 *   - include this header and link buffet_core.c (the host build; functions have
 *     external linkage);
 *   - define BF_STATIC_DEFS (and optionally BF_FN, default `static inline`; e.g.
 *     `static __always_inline` in a BPF program) and include buffet_core_impl.h to get
 *     the definitions in the including file, with no object file.
 */
#ifndef BUFFET_CORE_H
#define BUFFET_CORE_H

#include <stdbool.h>
#include <stdint.h>

/* Upper bound on worker ids (16-bit); also bounds the loops for verifiers. */
#define BF_MAX_WORKERS 65536u

/* One tenant's row of the Tenant Table (paper Fig. 4a), indexed by tenant slot. */
struct bf_tenant_row {
    uint64_t cur_slot; /* valid when has_slot */
    uint64_t pkt_nb;   /* packets (passed and policed) in cur_slot */
    uint64_t max_nb;   /* packets allowed per timeslot; 0 = unlimited */
    uint16_t worker;   /* the worker its packets go to */
    uint8_t has_slot;  /* 0 before the tenant's first packet */
    uint8_t present;   /* 0: no tenant in this slot */
    uint32_t pad;
};

/* One row of the Worker Table (paper Fig. 4b), indexed by worker id. */
struct bf_worker_row {
    uint64_t cur_slot; /* valid when has_slot */
    uint64_t pkt_nb;   /* packets passed to the worker in cur_slot */
    uint64_t last_nb;  /* previous timeslot's packets, as adjusted by migrations */
    uint64_t max_nb;   /* MAX_NB, taken literally: 0 = always overloaded */
    uint32_t times;    /* consecutive overload detections */
    uint8_t has_slot;  /* 0 before the worker is first rolled */
    uint8_t live;      /* only live workers receive packets and tenants */
    uint16_t pad;
};

/* The scheduler: the two tables (owned by the caller) and the parameters. */
struct bf_sched {
    struct bf_tenant_row *tenants;
    uint32_t n_tenants;
    uint32_t shift;     /* timeslot = ts_ns >> shift; shift >= 64 gives timeslot 0 */
    struct bf_worker_row *workers;
    uint32_t n_workers;
    uint32_t threshold; /* overload report while times > threshold */
};

enum bf_outcome_kind {
    BF_PASS = 0,
    BF_POLICED = 1,
    BF_NO_LIVE_WORKER = 2,
    BF_UNKNOWN_TENANT = 3,
};

/* What the scheduler decided for one packet. */
struct bf_outcome {
    uint64_t overload_slot; /* valid when overload */
    uint8_t kind;           /* enum bf_outcome_kind */
    uint8_t migrated;       /* the packet moved its tenant from `from` to `worker` */
    uint8_t overload;       /* an overload report (overload_worker, overload_slot) */
    uint8_t pad;
    uint16_t worker;        /* valid on BF_PASS */
    uint16_t from;          /* valid when migrated */
    uint16_t overload_worker;
    uint16_t pad2[3];
};

/* Errors of bf_tag_dscp (0 is success). */
enum bf_tag_error {
    BF_TAG_OK = 0,
    BF_TAG_DSCP_RANGE = 1,   /* dscp > 63 */
    BF_TAG_TRUNCATED = 2,    /* the IP header does not fit at l3_offset */
    BF_TAG_WRONG_VERSION = 3 /* version nibble disagrees with is_v4 */
};

/* Errors of bf_extract_key (0 is success); 1 + the index of buffet-sdk's ParseError. */
enum bf_parse_error {
    BF_PARSE_OK = 0,
    BF_PARSE_TRUNCATED_ETHERNET = 1,
    BF_PARSE_TRUNCATED_VLAN = 2,
    BF_PARSE_UNSUPPORTED_ETHERTYPE = 3,
    BF_PARSE_TRUNCATED_IP = 4,
    BF_PARSE_BAD_IP_VERSION = 5,
    BF_PARSE_BAD_IHL = 6,
    BF_PARSE_LENGTH_BEYOND_BUFFER = 7,
    BF_PARSE_TRUNCATED_L4 = 8,
    BF_PARSE_BAD_TCP_OFFSET = 9,
};

/* The classification key of a frame (the fields buffet-dispatch's Classifier matches). */
struct bf_key {
    uint8_t src_mac[6];
    uint8_t dst_mac[6];
    uint16_t in_port;
    uint16_t vlan;      /* valid when has_vlan (12 bits) */
    uint16_t l3_offset; /* byte offset of the IP header */
    uint16_t l4_offset; /* byte offset of the IP payload */
    uint16_t src_port;  /* valid when has_ports */
    uint16_t dst_port;
    uint8_t has_vlan;
    uint8_t is_v6;
    uint8_t has_ports;  /* TCP or UDP header parsed (first fragment only) */
    uint8_t proto;      /* IPv4 protocol / IPv6 first next-header */
    uint8_t dscp;
    uint8_t pad[3];
    uint8_t src_addr[16]; /* IPv4 mapped into ::ffff:0:0/96 */
    uint8_t dst_addr[16];
};

#ifndef BF_STATIC_DEFS
/* The timeslot of a timestamp: ts_ns >> shift, 0 when shift >= 64. */
uint64_t bf_timeslot(uint64_t ts_ns, uint32_t shift);
/* One scheduling step for a packet of the tenant in slot `tenant` at `ts_ns`. */
void bf_schedule(struct bf_sched *s, uint64_t ts_ns, uint32_t tenant, struct bf_outcome *out);
/* RFC 1624 eqn. 3: checksum `hc` after one 16-bit word changed from `old` to `new`. */
uint16_t bf_checksum_update(uint16_t hc, uint16_t old_word, uint16_t new_word);
/* Writes `dscp` into the IP header at l3_offset (ECN kept, IPv4 checksum fixed).
 * Returns an enum bf_tag_error; on error the bytes are unchanged. */
int bf_tag_dscp(uint8_t *bytes, uint32_t len, uint32_t l3_offset, bool is_v4, uint8_t dscp);
/* Parses Ethernet / one VLAN tag / IPv4 or IPv6 / TCP or UDP ports into `key`.
 * Returns an enum bf_parse_error (the same checks, in the same order, as buffet-sdk's
 * Packet::parse); `key` is meaningful only on BF_PARSE_OK. */
int bf_extract_key(const uint8_t *data, uint32_t len, uint16_t in_port, struct bf_key *key);
#endif

#endif /* BUFFET_CORE_H */
