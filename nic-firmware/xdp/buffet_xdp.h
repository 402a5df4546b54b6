/*
 * The layout shared by the XDP Packet Dispatcher (dispatcher.bpf.c) and its loader
 * (crates/buffet-xdp): map sizes, the config record, the classifier's tuple-space
 * entries, the per-packet decision record of test mode and the reports it emits.
 *
 * Every struct here has a `#[repr(C)]` twin in crates/buffet-xdp/src/maps.rs; sizes are
 * checked on both sides (static asserts here, const asserts there).
 */
#ifndef BUFFET_XDP_H
#define BUFFET_XDP_H

#include "buffet_core.h"

/* Tenant Table rows the program holds (tenant slots 0 .. BF_XDP_MAX_TENANTS-1). */
#define BF_XDP_MAX_TENANTS 16384u
/* Worker Table rows, and XSKMAP entries (one AF_XDP socket per worker): as many as
 * `buffet run --workers` accepts. The overload branch's scan of the Worker Table runs
 * as a bpf_loop callback, which the verifier checks once whatever the size (unrolled,
 * it walked the scan once per (worker, candidate so far) pair and 32 workers exceeded
 * its 1M instructions). */
#define BF_XDP_MAX_WORKERS 256u
/* Receive queues the XSKMAP has room for. A socket receives an XSKMAP redirect only for
 * frames of its own (interface, queue), so a worker has one socket per queue: the
 * program redirects a frame to key rx_queue_index * BF_XDP_XSK_STRIDE + worker, and the
 * map has BF_XDP_MAX_QUEUES * BF_XDP_XSK_STRIDE entries. A frame on a queue beyond them
 * (or on a queue where its worker has no socket) is dropped (XDP_DROP), never handed to
 * the host stack past its tenant's NF, and counted in BF_XDP_ST_NO_SOCKET. */
#define BF_XDP_MAX_QUEUES 64u
#define BF_XDP_XSK_STRIDE BF_XDP_MAX_WORKERS
#define BF_XDP_XSK_ENTRIES (BF_XDP_MAX_QUEUES * BF_XDP_XSK_STRIDE)
/* Distinct masks (tuples) of the tuple-space search, probed for every packet. */
#define BF_XDP_MAX_TUPLES 64u
/* (tuple, masked key) entries of the tuple-space search, per rule bank. */
#define BF_XDP_MAX_RULE_ENTRIES 65536u
/* Rule banks: the classifier's tuples and entries are held twice, the program reads the
 * active bank, the loader writes the other one and then flips (see bf_xdp_banks). */
#define BF_XDP_BANKS 2u
/* Words of the classification key (buffet-dispatch's classifier key). */
#define BF_XDP_KEY_WORDS 7
/* Bytes of the frame copied for key extraction: the deepest header byte read is at
 * 18 (Ethernet + VLAN) + 60 (IPv4 with options) + 20 (TCP) = 98. */
#define BF_XDP_HDR_COPY 128u

/* bf_xdp_config.flags */
#define BF_XDP_F_TEST 1u     /* timestamp from test_ts; decision record; XDP_PASS on pass */
#define BF_XDP_F_TAG_DSCP 2u /* write the tenant slot into DSCP (slots <= 63) */
#define BF_XDP_F_META 4u     /* write the tenant slot into the XDP metadata (32 bits) */

/* The single entry of the config map. */
struct bf_xdp_config {
    uint64_t test_ts;   /* the timestamp of the next packet, in test mode */
    uint32_t flags;     /* BF_XDP_F_* */
    uint32_t shift;     /* timeslot = ts_ns >> shift */
    uint32_t threshold; /* overload report while times > threshold */
    uint32_t n_workers; /* Worker Table rows in use (<= BF_XDP_MAX_WORKERS) */
    uint32_t reserved;  /* 0 (the tuple counts are per bank: bf_xdp_banks) */
    uint16_t in_port;   /* the Port id of the interface the program is attached to */
    uint16_t pad;
};

/*
 * The classifier's rule banks. Bank b holds tuples b*BF_XDP_MAX_TUPLES .. +n_tuples[b]-1
 * of the tuples map and the rules map's entries whose key has `bank == b`. The program
 * reads `active` once per packet (and holds that bank, see bf_bank_readers) and classifies
 * the packet against that bank only; the loader writes only the other bank, then flips
 * `active` with one aligned 32-bit store, waits until no program run holds the old bank,
 * and brings the old bank up to date. A rule change is thus seen by a packet entirely or
 * not at all.
 */
struct bf_xdp_banks {
    uint32_t active;                  /* the bank the program classifies against (0 or 1) */
    uint32_t n_tuples[BF_XDP_BANKS];  /* tuples in use per bank (<= BF_XDP_MAX_TUPLES) */
    uint32_t pad;
};

/* The Tenant Table, the Worker Table and the rule banks' header: the single entry of the
 * (mmapable) state map. */
struct bf_xdp_state {
    struct bf_tenant_row tenants[BF_XDP_MAX_TENANTS];
    struct bf_worker_row workers[BF_XDP_MAX_WORKERS];
    struct bf_xdp_banks banks;
};

/* One tuple: the mask applied to the packet key before probing the rules map. */
struct bf_xdp_tuple {
    uint64_t mask[BF_XDP_KEY_WORDS];
};

/* Rules map key: the tuple's index (within its bank), the bank and the masked packet key. */
struct bf_xdp_rule_key {
    uint32_t tuple;
    uint32_t bank;
    uint64_t bits[BF_XDP_KEY_WORDS];
};

/* Rules map value: the best rule under that (mask, value): lowest (priority, seq). */
struct bf_xdp_rule_val {
    uint32_t priority;
    uint32_t tenant; /* tenant slot */
    uint64_t seq;    /* insertion sequence */
};

/* What the program did with a packet (bf_xdp_decision.verdict). */
enum bf_xdp_verdict {
    BF_XDP_PASS = 0,       /* scheduled to `worker` */
    BF_XDP_MALFORMED = 1,  /* parse error `parse_error` */
    BF_XDP_UNMATCHED = 2,  /* no rule matched */
    BF_XDP_POLICED = 3,    /* over the tenant's MAX_NB */
    BF_XDP_NO_WORKER = 4,  /* no live worker */
    BF_XDP_UNKNOWN = 5,    /* the rule named a tenant slot with no row */
};

/* Test mode: the decision for the last packet (single entry of the decision map). */
struct bf_xdp_decision {
    uint64_t seq;          /* packets seen by the program, this one included */
    uint32_t verdict;      /* enum bf_xdp_verdict */
    uint32_t tenant;       /* the tenant slot (valid from UNMATCHED on, i.e. >= 3, and PASS) */
    uint32_t parse_error;  /* enum bf_parse_error when MALFORMED */
    uint16_t worker;       /* valid on PASS */
    uint16_t from;         /* valid when migrated */
    uint8_t migrated;
    uint8_t overload;
    uint16_t overload_worker;
    uint32_t pad;
    uint64_t overload_slot;
};

/* Ring-buffer record: an event for the control plane. */
enum bf_xdp_event_kind {
    BF_XDP_EV_OVERLOAD = 1, /* worker stayed overloaded beyond the threshold */
    BF_XDP_EV_MIGRATION = 2 /* tenant moved from `from` to `worker` */
};

struct bf_xdp_event {
    uint64_t slot;   /* the timeslot */
    uint32_t kind;   /* enum bf_xdp_event_kind */
    uint32_t tenant; /* migration: the tenant slot */
    uint16_t worker; /* overload: the worker; migration: the new worker */
    uint16_t from;   /* migration: the old worker */
    uint32_t pad;
};

/* Per-CPU counters (index into the stats map). */
enum bf_xdp_stat {
    BF_XDP_ST_PACKETS = 0,
    BF_XDP_ST_PASSED = 1,
    BF_XDP_ST_MALFORMED = 2,
    BF_XDP_ST_UNMATCHED = 3,
    BF_XDP_ST_POLICED = 4,
    BF_XDP_ST_NO_WORKER = 5,
    BF_XDP_ST_EVENTS_LOST = 6,
    /* Passed frames dropped for want of their worker's socket on their receive queue. */
    BF_XDP_ST_NO_SOCKET = 7,
    BF_XDP_ST_COUNT = 8
};

#endif /* BUFFET_XDP_H */
