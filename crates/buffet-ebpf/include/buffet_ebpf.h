/* SPDX-License-Identifier: Apache-2.0
 *
 * buffet_ebpf.h — what an eBPF network function for Buffet is written against.
 *
 * Build:  clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c nf.c -o nf.o
 * Check:  buffet nf check nf.o
 *
 * The contract (docs/ebpf.md has the long form):
 *
 *  - The program is the function in section "buffet" (BUFFET_PROGRAM). It is called once
 *    per packet with a `struct buffet_ctx *`. The packet is [ctx->data, ctx->data_end):
 *    every access must be bounds-checked against data_end, or the verifier rejects the
 *    program. Buffet has already parsed L2-L4: the offsets below are valid (and
 *    ip_end <= data_end - data), but the verifier still wants the check.
 *  - Per-tenant state lives in maps (BUFFET_MAP). Every tenant gets its own copy of every
 *    map, zeroed, then filled from the tenant's policy; the program reaches it only
 *    through buffet_map_lookup() (ARRAY maps) or buffet_strset_lookup() (STRSET maps).
 *  - The return value is the verdict (BUFFET_PASS, BUFFET_DROP, ...). Any other value
 *    is a fault: the tenant is quarantined.
 *  - No global variables, no string literals (they live in .rodata/.data, which Buffet
 *    does not load): compare bytes with character constants. Bounded loops are fine;
 *    the verifier proves they terminate.
 */
#ifndef BUFFET_EBPF_H
#define BUFFET_EBPF_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef signed long long __s64;

#define BUFFET_SEC(name) __attribute__((section(name), used))
/* The entry point: `BUFFET_PROGRAM int my_nf(struct buffet_ctx *ctx) { ... }` */
#define BUFFET_PROGRAM BUFFET_SEC("buffet")
#define BUFFET_INLINE static inline __attribute__((always_inline))

/* Makes `var` opaque to the optimiser, so that the bounds check written after it is done
 * on the very value (register) the access then uses. The verifier follows registers,
 * not C: without this, clang may check `i - 1` and then access `data + i - 1` computed
 * from `i`, which the verifier cannot relate to the check. (libbpf's barrier_var.) */
#define BUFFET_OPAQUE(var) asm volatile("" : "+r"(var))

/* ---- the context (r1), 48 bytes, rewritten by Buffet before every packet ---------- */
struct buffet_ctx {
	__u64 data;        /*  0: first byte of the frame (read-only) */
	__u64 data_end;    /*  8: one past its last byte (read-only) */
	__u64 ts_ns;       /* 16: arrival time, ns */
	__u32 tenant;      /* 24: the tenant's id */
	__u16 in_port;     /* 28: input port */
	__u8 l3_kind;      /* 30: 4 (IPv4) or 6 (IPv6) */
	__u8 l4_kind;      /* 31: 6 (TCP header parsed), 17 (UDP), 132 (SCTP), 0 (other or non-first fragment) */
	__u16 l3_off;      /* 32: offset of the IP header */
	__u16 l4_off;      /* 34: offset of the L4 header (or of the IP payload) */
	__u16 payload_off; /* 36: offset of the L4 payload */
	__u16 ip_end;      /* 38: one past the last byte the IP header accounts for */
	__u8 ip_proto;     /* 40: IP protocol (IPv6: first next-header) */
	__u8 _reserved[7];
};

/* ---- verdicts (the program's return value) ---------------------------------------- */
#define BUFFET_PASS 0
#define BUFFET_DROP 1                /* dropped, counted as "policy" */
#define BUFFET_TX 2                  /* sent back out of its input port */
#define BUFFET_DROP_MALFORMED 3
#define BUFFET_DROP_RATE_LIMITED 4
#define BUFFET_DROP_TABLE_FULL 5
#define BUFFET_DROP_INTEGRITY 6
#define BUFFET_DROP_REPLAY 7
#define BUFFET_FORWARD(port) (0x10000 + ((port) & 0xffff))

/* ---- maps --------------------------------------------------------------------------- */
#define BUFFET_MAP_ARRAY 2   /* max_entries elements of value_size bytes; key_size 4 */
#define BUFFET_MAP_STRSET 40 /* up to max_entries byte strings of at most key_size bytes */
#define BUFFET_MAP_SCRATCH 41 /* one element of value_size (<= 16 KiB) bytes, zeroed per packet */

struct buffet_map_def {
	__u32 type;
	__u32 key_size;
	__u32 value_size;
	__u32 max_entries;
	__u32 flags; /* 0 */
};

#define BUFFET_ARRAY(name, value_type, entries)                                  \
	BUFFET_SEC("maps") struct buffet_map_def name = {                           \
		.type = BUFFET_MAP_ARRAY, .key_size = 4,                                 \
		.value_size = sizeof(value_type), .max_entries = (entries) }
#define BUFFET_STRSET(name, max_len, entries)                                    \
	BUFFET_SEC("maps") struct buffet_map_def name = {                           \
		.type = BUFFET_MAP_STRSET, .key_size = (max_len),                        \
		.value_size = 0, .max_entries = (entries) }

/* Per-invocation scratch memory: one `type` the program reaches with
 * buffet_map_lookup(&name, 0) (test the result for NULL), zeroed before every packet.
 * Room for buffers the 256-byte stack frame cannot hold; a policy cannot fill it. */
#define BUFFET_SCRATCH(name, elem_type)                                             \
	BUFFET_SEC("maps") struct buffet_map_def name = {                           \
		.type = BUFFET_MAP_SCRATCH, .key_size = 4,                               \
		.value_size = sizeof(elem_type), .max_entries = 1 }

/* Names for buffet_counter_add() indices, shown in per-tenant stats:
 * BUFFET_COUNTERS("packets\0blocked") — NUL-separated, in index order. */
#define BUFFET_COUNTERS(names)                                                   \
	BUFFET_SEC(".buffet.counters") const char __buffet_counter_names[] = names
#define BUFFET_MAX_COUNTERS 16

/* ---- helpers (called by number; arguments are checked at run time) ---------------- */

/* Element `index` of an ARRAY map, or NULL when index >= max_entries. */
static void *(*buffet_map_lookup)(void *map, __u32 index) = (void *)1;

/* counters[index] += delta; 0, or -1 when index >= BUFFET_MAX_COUNTERS. */
static long (*buffet_counter_add)(__u32 index, __u64 delta) = (void *)2;

/* RFC 1624 incremental update of the 16-bit Internet checksum at packet offset
 * `csum_off`, for a `size`-byte (2 or 4) field changed from `from` to `to` (both as
 * big-endian values, e.g. the result of reading the field with bpf_ntohs/ntohl).
 * 0, or -1 when csum_off + 2 is beyond the frame or size is not 2 or 4. */
static long (*buffet_csum_replace)(__u32 csum_off, __u64 from, __u64 to, __u32 size) = (void *)3;

/* Cost budget: every packet has one (policy `cost_budget`, default 1 Mi units), charged
 * for instructions (each backward jump: the code it jumps back over; each bpf-to-bpf
 * call: the code from the callee to the end) and for helper work (16 per call plus the
 * bytes scanned, hashed or compared). Over it, helpers return an error value without
 * working, the program is stopped at its next backward jump or call, and the packet is a
 * fault: the tenant is quarantined. */

/* Looks the bytes [off, off + len) of the packet up in a STRSET map, ignoring ASCII case
 * and one trailing '.' (strings in the map are stored the same way).
 * With BUFFET_STRSET_SUFFIXES, also looks up every suffix that follows a '.', longest
 * first (a domain and its parent domains). With BUFFET_STRSET_HOST, the bytes are first
 * reduced to a host name as written in a URL or an HTTP Host header: blanks trimmed,
 * user info up to the last '@' dropped, an IPv6 literal "[...]" kept whole, else cut at
 * the first ':' (the port), one trailing '.' dropped.
 * Returns the index of the first match (in policy order); -1 when nothing matches (a
 * candidate longer than the map's key_size never matches); -2 when the range is outside
 * the frame; with BUFFET_STRSET_HOST, -3 for an empty host and -4 for a host longer than
 * the map's key_size. */
#define BUFFET_STRSET_SUFFIXES 1
#define BUFFET_STRSET_HOST 2
#define BUFFET_STRSET_EMPTY_HOST (-3)
#define BUFFET_STRSET_HOST_TOO_LONG (-4)
static long (*buffet_strset_lookup)(void *map, __u32 off, __u32 len, __u32 flags) = (void *)4;

/* The offset of the first `byte` in the packet's [off, off + len): -1 if there is none,
 * -2 when the range is outside the frame. (memchr: scanning text without a loop in the
 * program.) */
static long (*buffet_pkt_find)(__u32 off, __u32 len, __u32 byte) = (void *)5;

/* Looks the uncompressed DNS name (length-prefixed labels ending with a 0 byte, as in a
 * query's question) at packet offset `off` up in a STRSET map, in presentation form
 * without the root dot ("www.example.com"), ignoring ASCII case; with
 * BUFFET_STRSET_SUFFIXES also its parent domains, longest first. Returns the index of the
 * first match; -1 none (also for the root name); -2 the name runs past the frame;
 * BUFFET_DNS_BAD_NAME (-5) for a compression pointer, a label over 63 bytes or a name over
 * 253 bytes. The name is walked by Buffet: no loop in the program. */
#define BUFFET_DNS_BAD_NAME (-5)
static long (*buffet_dns_lookup)(void *map, __u32 off, __u32 flags) = (void *)6;

#endif /* BUFFET_EBPF_H */
