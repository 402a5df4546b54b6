/* SPDX-License-Identifier: Apache-2.0
 *
 * dpi.c — the NSX DPI test case as an eBPF NF: drop HTTP requests whose host is on the
 * tenant's domain blacklist. Same verdicts and counters as the native `buffet_nfs::Dpi`
 * (crates/buffet-nfs/src/dpi.rs) for the same packets and (normalised) blacklists:
 *
 *  - a TCP payload starting with `METHOD SP` (GET HEAD POST PUT DELETE CONNECT OPTIONS
 *    TRACE PATCH) and a complete request line is a request;
 *  - its host is the request target for CONNECT, the authority of an http:// or https://
 *    absolute target, or else every `Host:` header (name case-insensitive) before the
 *    blank line; any blacklisted one blocks the request;
 *  - a host is trimmed, loses user info (`u@`), `:port` and one trailing dot; an IPv6
 *    literal `[...]` is kept whole; longer than 253 bytes is malformed (dropped);
 *  - it is blocked when it or a parent domain is in the blacklist (ASCII case ignored).
 *
 * The program parses HTTP; the helpers do what the NSX paper suggests native helpers for
 * (loops over bytes): buffet_pkt_find (memchr) finds line ends and separators, and
 * buffet_strset_lookup normalises a host and looks it and its parent domains up in the
 * tenant's blacklist. dpi_scan.c is the same NF scanning every byte itself.
 *
 * Tenant policy:
 *   [tenant.policy.maps]
 *   blacklist = { strings = ["example.com", "ads.tracker.net"] }   # normalised domains
 *   ports = { u16 = [80, 8080] }                                    # optional
 *
 * Build: clang -O2 -target bpf -mcpu=v3 -I crates/buffet-ebpf/include -c dpi.c -o dpi.o
 */
#include "buffet_ebpf.h"

#define MAX_HOST_LEN 253
#define MAX_DOMAINS 256
#define MAX_PORTS 16
#define MAX_OFFSET 65535 /* no frame is longer */

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

/* The packet byte at offset i (0 past the frame). */
BUFFET_INLINE __u8 byte_at(__u8 *data, __u8 *end, __u64 i)
{
	BUFFET_OPAQUE(i);
	if (i >= MAX_OFFSET)
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

/* Looks the host written at [off, off + len) up (normalised by the helper). */
BUFFET_INLINE int host(__u64 off, __u64 len)
{
	long r = buffet_strset_lookup(&blacklist, off, len,
				      BUFFET_STRSET_SUFFIXES | BUFFET_STRSET_HOST);
	if (r == -1)
		return H_CLEAN;
	if (r == BUFFET_STRSET_HOST_TOO_LONG)
		return H_TOO_LONG;
	if (r < 0)
		return H_MISSING;
	__u64 *hit = buffet_map_lookup(&hits, (__u32)r);
	if (hit)
		*hit += 1;
	return H_BLOCKED;
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

/* `len` bytes from `off` are "http://" or "https://" (any case): the scheme's length, or 0. */
BUFFET_INLINE __u64 http_scheme(__u8 *data, __u8 *end, __u64 off, __u64 len)
{
	if (len < 7 || lower(byte_at(data, end, off)) != 'h' ||
	    lower(byte_at(data, end, off + 1)) != 't' || lower(byte_at(data, end, off + 2)) != 't' ||
	    lower(byte_at(data, end, off + 3)) != 'p')
		return 0;
	__u64 s = 4;
	if (lower(byte_at(data, end, off + 4)) == 's') {
		if (len < 8)
			return 0;
		s = 5;
	}
	if (byte_at(data, end, off + s) == ':' && byte_at(data, end, off + s + 1) == '/' &&
	    byte_at(data, end, off + s + 2) == '/')
		return s;
	return 0;
}

/* The first of '/', '?', '#' in [from, to), or `to`. */
BUFFET_INLINE __u64 authority_end(__u64 from, __u64 to)
{
	__u64 e = to;
	long r = buffet_pkt_find(from, to - from, '/');
	if (r >= 0 && (__u64)r < e)
		e = r;
	r = buffet_pkt_find(from, e - from, '?');
	if (r >= 0 && (__u64)r < e)
		e = r;
	r = buffet_pkt_find(from, e - from, '#');
	if (r >= 0 && (__u64)r < e)
		e = r;
	return e;
}

BUFFET_PROGRAM int dpi(struct buffet_ctx *ctx)
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
	__u64 sp = 8;
#pragma unroll
	for (__u64 k = 0; k < 8; k++) {
		if (sp == 8 && p + k < pe) {
			__u8 c = byte_at(data, end, p + k);
			if (c == ' ')
				sp = k;
			m[k] = c;
		}
	}
	if (sp == 8 || !is_method(m, sp))
		return BUFFET_PASS;

	/* The request line: the target runs from ts to the first space (or the line end). */
	__u64 ts = p + sp + 1;
	long eol = buffet_pkt_find(ts, pe - ts, '\n');
	if (eol < 0)
		return BUFFET_PASS; /* not a complete request line: not a request */
	__u64 le = eol;
	if (le > ts && byte_at(data, end, le - 1) == '\r')
		le--;
	long space = buffet_pkt_find(ts, le - ts, ' ');
	__u64 te = space >= 0 ? (__u64)space : le;

	buffet_counter_add(C_HTTP, 1);
	if (sp == 7 && m[0] == 'C') /* CONNECT host:port */
		return verdict(host(ts, te - ts));
	__u64 scheme = http_scheme(data, end, ts, te - ts);
	if (scheme) {
		__u64 a = ts + scheme + 3;
		return verdict(host(a, authority_end(a, te) - a));
	}

	/* Header lines up to the blank line; every Host header counts. */
	int found = H_MISSING;
	__u64 pos = (__u64)eol + 1;
	for (__u64 n = 0; n < MAX_OFFSET; n++) {
		if (pos >= pe)
			break;
		long nl = buffet_pkt_find(pos, pe - pos, '\n');
		if (nl < 0)
			break;
		__u64 lend = nl;
		if (lend > pos && byte_at(data, end, lend - 1) == '\r')
			lend--;
		if (lend == pos)
			return verdict(found); /* blank line: end of the headers */
		if (lend - pos >= 5 && byte_at(data, end, pos + 4) == ':' &&
		    lower(byte_at(data, end, pos)) == 'h' &&
		    lower(byte_at(data, end, pos + 1)) == 'o' &&
		    lower(byte_at(data, end, pos + 2)) == 's' &&
		    lower(byte_at(data, end, pos + 3)) == 't') {
			int r = host(pos + 5, lend - (pos + 5));
			if (r == H_CLEAN)
				found = H_CLEAN;
			else if (r != H_MISSING)
				return verdict(r);
		}
		pos = (__u64)nl + 1;
	}
	/* The payload ended inside the header block (a cut-off last line is not evaluated). */
	buffet_counter_add(C_TRUNCATED, 1);
	return verdict(found);
}
