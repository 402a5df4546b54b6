/* SPDX-License-Identifier: Apache-2.0
 *
 * dpi_scan.c — the NSX DPI (see dpi.c) with every byte scanned by the program itself: no
 * scanning or normalising helper, only buffet_strset_lookup for the blacklist. Same
 * verdicts and counters as dpi.c and as the native `buffet_nfs::Dpi`; slower (the JIT
 * runs a dozen instructions per payload byte), kept to show that the verifier handles a
 * real byte-level parser: every loop walks one range once with a counter bounded by a
 * constant, host normalisation is folded into the byte loop (no nested loops), and the
 * parent-domain walk is done by buffet_strset_lookup.
 *
 * Tenant policy: as dpi.c.
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c dpi_scan.c -o dpi_scan.o
 */
#include "buffet_ebpf.h"

#define MAX_HOST_LEN 253
#define MAX_DOMAINS 256
#define MAX_PORTS 16
#define SCAN_LIMIT 65535 /* no frame is longer: every scan covers the whole payload */
#define NONE 0x10000 /* "not found": above every offset (a small sentinel keeps the verifier fast) */

struct port_list {
	__u16 port[MAX_PORTS]; /* 0 ends the list; an empty list inspects every port */
};

BUFFET_STRSET(blacklist, MAX_HOST_LEN, MAX_DOMAINS);
BUFFET_ARRAY(ports, struct port_list, 1);
BUFFET_ARRAY(hits, __u64, MAX_DOMAINS); /* blocked requests per blacklist entry */

BUFFET_COUNTERS("packets\0http_requests\0blocked\0no_host\0truncated_headers\0malformed");
enum { C_PACKETS, C_HTTP, C_BLOCKED, C_NO_HOST, C_TRUNCATED, C_MALFORMED };

/* What a host lookup found (the native NF's HostLookup). */
enum { H_MISSING, H_CLEAN, H_BLOCKED, H_TOO_LONG };

/* Streaming host normalisation: fed one byte at a time, finished once. */
struct host_scan {
	__u64 v0;    /* first non-blank byte */
	__u64 v1;    /* one past the last non-blank byte */
	__u64 at;    /* last '@' */
	__u64 colon; /* first ':' after the last '@' */
	__u64 rb;    /* first ']' after the last '@' */
};

BUFFET_INLINE void host_start(struct host_scan *h)
{
	h->v0 = NONE;
	h->v1 = NONE;
	h->at = NONE;
	h->colon = NONE;
	h->rb = NONE;
}

BUFFET_INLINE int is_blank(__u8 c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

BUFFET_INLINE void host_feed(struct host_scan *h, __u64 i, __u8 c)
{
	if (!is_blank(c)) {
		if (h->v0 == NONE)
			h->v0 = i;
		h->v1 = i + 1;
	}
	if (c == '@') {
		h->at = i;
		h->colon = NONE;
		h->rb = NONE;
	} else if (c == ':') {
		if (h->colon == NONE)
			h->colon = i;
	} else if (c == ']') {
		if (h->rb == NONE)
			h->rb = i;
	}
}

BUFFET_INLINE __u8 byte_at(__u8 *data, __u8 *end, __u64 i)
{
	BUFFET_OPAQUE(i);
	if (i >= SCAN_LIMIT)
		return 0;
	__u8 *q = data + i;
	if (q + 1 > end)
		return 0;
	return *q;
}

BUFFET_INLINE int lower(__u8 c)
{
	return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* Normalises the scanned host and looks it (and its parent domains) up. */
BUFFET_INLINE int host_finish(struct host_scan *h, __u8 *data, __u8 *end)
{
	if (h->v0 == NONE)
		return H_MISSING;
	__u64 start = h->at != NONE ? h->at + 1 : h->v0;
	__u64 stop = h->v1;
	if (start >= stop)
		return H_MISSING;
	if (byte_at(data, end, start) == '[') {
		/* An IPv6 literal: kept whole, never a domain. */
		if (h->rb != NONE)
			stop = h->rb + 1;
	} else {
		if (h->colon != NONE)
			stop = h->colon;
		if (stop > start && byte_at(data, end, stop - 1) == '.')
			stop--;
	}
	__u64 len = stop - start;
	if (len == 0)
		return H_MISSING;
	if (len > MAX_HOST_LEN)
		return H_TOO_LONG;
	long idx = buffet_strset_lookup(&blacklist, start, len, BUFFET_STRSET_SUFFIXES);
	if (idx < 0)
		return H_CLEAN;
	__u64 *hit = buffet_map_lookup(&hits, (__u32)idx);
	if (hit)
		*hit += 1;
	return H_BLOCKED;
}

BUFFET_INLINE int is_method(__u8 *m, __u64 len)
{
	switch (len) {
	case 3:
		return (m[0] == 'G' && m[1] == 'E' && m[2] == 'T') ||
		       (m[0] == 'P' && m[1] == 'U' && m[2] == 'T');
	case 4:
		return (m[0] == 'H' && m[1] == 'E' && m[2] == 'A' && m[3] == 'D') ||
		       (m[0] == 'P' && m[1] == 'O' && m[2] == 'S' && m[3] == 'T');
	case 5:
		return (m[0] == 'T' && m[1] == 'R' && m[2] == 'A' && m[3] == 'C' && m[4] == 'E') ||
		       (m[0] == 'P' && m[1] == 'A' && m[2] == 'T' && m[3] == 'C' && m[4] == 'H');
	case 6:
		return m[0] == 'D' && m[1] == 'E' && m[2] == 'L' && m[3] == 'E' && m[4] == 'T' &&
		       m[5] == 'E';
	case 7:
		return (m[0] == 'C' && m[1] == 'O' && m[2] == 'N' && m[3] == 'N' && m[4] == 'E' &&
			m[5] == 'C' && m[6] == 'T') ||
		       (m[0] == 'O' && m[1] == 'P' && m[2] == 'T' && m[3] == 'I' && m[4] == 'O' &&
			m[5] == 'N' && m[6] == 'S');
	}
	return 0;
}

BUFFET_INLINE int verdict(int found)
{
	switch (found) {
	case H_BLOCKED:
		buffet_counter_add(C_BLOCKED, 1);
		return BUFFET_DROP;
	case H_TOO_LONG:
		buffet_counter_add(C_MALFORMED, 1);
		return BUFFET_DROP_MALFORMED;
	case H_MISSING:
		buffet_counter_add(C_NO_HOST, 1);
		return BUFFET_PASS;
	}
	return BUFFET_PASS;
}

BUFFET_PROGRAM int dpi_scan(struct buffet_ctx *ctx)
{
	__u8 *data = (void *)(long)ctx->data;
	__u8 *end = (void *)(long)ctx->data_end;

	buffet_counter_add(C_PACKETS, 1);
	if (ctx->l4_kind != 6)
		return BUFFET_PASS;

	struct port_list *pl = buffet_map_lookup(&ports, 0);
	if (!pl)
		return BUFFET_PASS;
	if (pl->port[0] != 0) {
		__u8 *th = data + ctx->l4_off;
		if (th + 4 > end)
			return BUFFET_PASS;
		__u16 dport = (__u16)(th[2] << 8 | th[3]);
		int listed = 0;
#pragma unroll
		for (int k = 0; k < MAX_PORTS; k++)
			if (pl->port[k] != 0 && pl->port[k] == dport)
				listed = 1;
		if (!listed)
			return BUFFET_PASS;
	}

	__u64 p = ctx->payload_off;
	__u64 pe = ctx->ip_end;

	/* The method: the bytes before a space among the first 8 of the payload. */
	__u8 m[8] = {0};
	__u64 sp = NONE;
#pragma unroll
	for (__u64 k = 0; k < 8; k++) {
		if (sp == NONE && p + k < pe) {
			__u8 c = byte_at(data, end, p + k);
			if (c == ' ')
				sp = k;
			m[k] = c;
		}
	}
	if (sp == NONE || !is_method(m, sp))
		return BUFFET_PASS;
	int connect = sp == 7 && m[0] == 'C';

	/* One pass over the rest of the payload: first the request line, then the header
	 * lines. (One loop, not one per part: the verifier then never has to relate the
	 * bounds of one loop to the results of another.) */
	__u64 ts = p + sp + 1; /* the request target starts here */
	__u64 te = NONE;       /* first space after it */
	__u64 css = NONE;      /* first "://" in it */
	__u64 ae = NONE;       /* first '/', '?' or '#' after the "://" */
	__u8 c1 = 0, c2 = 0;   /* the two bytes before the current one */
	int headers = 0;       /* past the request line */
	int found = H_MISSING; /* what the Host headers so far gave */
	__u64 ls = 0;          /* start of the current header line */
	int seen_colon = 0, host_line = 0;
	/* The host being scanned: the target (CONNECT), the authority (absolute form) or
	 * the value of the current Host header. */
	struct host_scan h;
	host_start(&h);
	for (__u64 n = 0; n < SCAN_LIMIT; n++) {
		BUFFET_OPAQUE(n);
		__u64 i = ts + n;
		if (i >= pe)
			break;
		__u8 c = byte_at(data, end, i);
		if (!headers) {
			if (c != '\n') {
				if (te != NONE) {
					/* past the target */
				} else if (c == ' ') {
					te = i;
				} else if (connect) {
					host_feed(&h, i, c);
				} else if (css == NONE) {
					if (c == '/' && c1 == '/' && c2 == ':' && i >= ts + 2)
						css = i - 2;
				} else if (ae == NONE) {
					if (c == '/' || c == '?' || c == '#')
						ae = i;
					else
						host_feed(&h, i, c);
				}
				c2 = c1;
				c1 = c;
				continue;
			}
			/* The request line is complete. */
			buffet_counter_add(C_HTTP, 1);
			if (connect)
				return verdict(host_finish(&h, data, end));
			if (css != NONE) {
				/* Absolute form: the scheme must be http or https (any case). */
				__u64 sl = css - ts;
				int http = (sl == 4 || sl == 5) &&
					   lower(byte_at(data, end, ts)) == 'h' &&
					   lower(byte_at(data, end, ts + 1)) == 't' &&
					   lower(byte_at(data, end, ts + 2)) == 't' &&
					   lower(byte_at(data, end, ts + 3)) == 'p' &&
					   (sl == 4 || lower(byte_at(data, end, ts + 4)) == 's');
				if (http)
					return verdict(host_finish(&h, data, end));
			}
			headers = 1;
			ls = i + 1;
			host_start(&h);
			continue;
		}
		if (c == '\n') {
			__u64 lend = i;
			if (lend > ls && byte_at(data, end, lend - 1) == '\r')
				lend--;
			if (lend == ls)
				return verdict(found); /* blank line: end of the headers */
			if (host_line) {
				int r = host_finish(&h, data, end);
				if (r == H_CLEAN)
					found = H_CLEAN;
				else if (r != H_MISSING)
					return verdict(r);
			}
			ls = i + 1;
			seen_colon = 0;
			host_line = 0;
			host_start(&h);
			continue;
		}
		if (host_line) {
			host_feed(&h, i, c);
		} else if (!seen_colon && c == ':') {
			seen_colon = 1;
			host_line = i == ls + 4 && lower(byte_at(data, end, ls)) == 'h' &&
				    lower(byte_at(data, end, ls + 1)) == 'o' &&
				    lower(byte_at(data, end, ls + 2)) == 's' &&
				    lower(byte_at(data, end, ls + 3)) == 't';
		}
	}
	if (!headers)
		return BUFFET_PASS; /* not a complete request line: not a request */
	/* The payload ended inside the header block. */
	buffet_counter_add(C_TRUNCATED, 1);
	return verdict(found);
}
