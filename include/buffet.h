/*
 * buffet.h — the C ABI of a Buffet network function (ABI version 1).
 *
 * A C NF is a shared object exporting the Buffet paper's three functions:
 *
 *   buffet_mem_register   how many bytes of state one tenant needs;
 *   buffet_state_init     build one tenant's state from its policy, in its region;
 *   buffet_pkt_handler    process one packet of one tenant.
 *
 * and, optionally, buffet_nf_name, buffet_abi_version and buffet_summary.
 *
 * Buffet loads it once (`buffet replay --nf-lib nf.so --isolation mpk`) and calls it for
 * every tenant, each with its own state region. Under MPK isolation the region carries an
 * Intel protection key that only the worker running that tenant's packets has open: a
 * read or write into another tenant's region (or a guard page around any region) faults,
 * Buffet quarantines the faulting tenant and every other tenant carries on.
 *
 * The rules an NF must follow:
 *  - keep all per-tenant data inside [state, state + len); never keep pointers to it in
 *    globals (the region is only accessible while that tenant runs);
 *  - the packet's bytes are [data, data + len) and may be rewritten in place; ABI v1 does
 *    not change a frame's length;
 *  - no blocking calls, no longjmp, no threads; the handler runs on a worker core with
 *    thousands of other tenants behind it.
 *
 * Build:  cc -O2 -fPIC -shared -nostartfiles -fno-stack-protector -fstack-clash-protection \
 *            -U_FORTIFY_SOURCE -I include -o nf.so nf.c
 * At the mpk level Buffet inspects the object before loading it: no initialisers (hence
 * -nostartfiles), only pure libc imports (no malloc: the region is the tenant's memory),
 * no WRPKRU/XRSTOR bytes, no thread-local storage (docs/nf-authors.md, "C NFs").
 */
#ifndef BUFFET_H
#define BUFFET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI this header describes; an NF may export buffet_abi_version() returning it. */
#define BUFFET_ABI_VERSION 1u

/* ---- verdicts: what buffet_pkt_handler returns ------------------------------------ */

typedef int32_t buffet_verdict;

#define BUFFET_PASS 0             /* let the packet continue (default output) */
#define BUFFET_TX 1               /* send it back out of the port it came in on */
#define BUFFET_DROP_POLICY 2      /* drop: the tenant's policy said so */
#define BUFFET_DROP_MALFORMED 3   /* drop: the NF could not make sense of it */
#define BUFFET_DROP_RATE 4        /* drop: a rate limit was exceeded */
#define BUFFET_DROP_INTEGRITY 5   /* drop: an integrity check failed */
#define BUFFET_DROP_REPLAY 6      /* drop: replayed or too old */
#define BUFFET_DROP_TABLE_FULL 7  /* drop: a per-tenant table is full */
/* send it out of `port` (0..65535) */
#define BUFFET_FORWARD(port) ((buffet_verdict)(0x10000 | ((uint32_t)(port)&0xffffu)))
/* Any other value is a broken NF: the tenant is quarantined. */

/* ---- the packet ------------------------------------------------------------------ */

/* Offsets are from `data`; BUFFET_NO_OFFSET when the layer is absent. */
#define BUFFET_NO_OFFSET 0xffffu

#define BUFFET_L3_NONE 0
#define BUFFET_L3_IPV4 4
#define BUFFET_L3_IPV6 6

struct buffet_pkt {
    uint8_t *data;        /* the Ethernet frame; writable in place */
    uint32_t len;         /* its length in bytes (read-only in ABI v1) */
    uint32_t tenant;      /* the tenant's id */
    uint64_t ts_ns;       /* arrival timestamp, ns */
    uint16_t in_port;     /* input port */
    uint16_t l3_off;      /* IPv4/IPv6 header */
    uint16_t l4_off;      /* TCP/UDP/ICMP... header */
    uint16_t payload_off; /* L4 payload (== len when empty) */
    uint16_t src_port;    /* TCP/UDP/SCTP source port, host order; 0 otherwise */
    uint16_t dst_port;    /* TCP/UDP/SCTP destination port, host order; 0 otherwise */
    uint8_t ip_proto;     /* IP protocol (6 TCP, 17 UDP, ...); 0 without IP */
    uint8_t l3_kind;      /* BUFFET_L3_* */
    uint8_t reserved[2];
};

/* ---- optional: named counters for stats output ------------------------------------ */

struct buffet_counter {
    const char *name; /* a string with static storage duration (a literal), at most 63
                         bytes; one Buffet cannot read, or longer, quarantines the tenant;
                         NULL leaves the counter out */
    uint64_t value;
};

/* ---- the functions an NF exports -------------------------------------------------- */

/*
 * Bytes of state one tenant needs. Called once, when the NF is loaded. Buffet rounds the
 * region up to whole pages; `len` in the calls below is at least this much.
 */
size_t buffet_mem_register(void);

/*
 * Build one tenant's state. `policy_json` is the tenant's policy as a NUL-terminated JSON
 * object ("{}" when the tenant has none); [state, state + len) is the tenant's region,
 * zero-filled. Return 0 to admit the tenant; anything else refuses it, optionally with a
 * NUL-terminated reason written into err[0 .. errlen).
 */
int buffet_state_init(const char *policy_json, void *state, size_t len, char *err,
                      size_t errlen);

/* Process one packet of the tenant whose state is [state, state + len). */
buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *state, size_t len);

/* Optional: a short, stable NF name ("portblock", at most 63 bytes); default: the file
 * name. A name Buffet cannot read, or a longer one, refuses the NF at load. */
const char *buffet_nf_name(void);

/* Optional: BUFFET_ABI_VERSION the NF was built against; checked at load. */
uint32_t buffet_abi_version(void);

/* Optional: write up to `max` counters summarising one tenant's state; return how many. */
size_t buffet_summary(const void *state, size_t len, struct buffet_counter *out, size_t max);

#ifdef __cplusplus
}
#endif

#endif /* BUFFET_H */
