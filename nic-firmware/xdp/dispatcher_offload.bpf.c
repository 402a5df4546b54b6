// SPDX-License-Identifier: Apache-2.0
/*
 * The Packet Dispatcher subset that Netronome's nfp JIT offloads to the NIC
 * (drivers/net/ethernet/netronome/nfp/bpf/{verifier,jit,offload}.c are the reference):
 * parse, classify by exact match, count, tag DSCP, and select the worker's RX queue by
 * writing ctx->rx_queue_index (one queue per worker).
 *
 * What the nfp accepts, and so all this program uses:
 *   - maps: ARRAY and HASH only, map_flags 0, small keys and values (legacy `maps`
 *     section, so the check in crates/buffet-xdp/tests/nfp_subset.rs can read them);
 *   - helpers: bpf_map_lookup_elem only (of the nfp's lookup/update/delete,
 *     get_prandom_u32, perf_event_output, xdp_adjust_head/tail);
 *   - map writes: atomic add (BPF_ATOMIC | BPF_ADD without fetch) and nothing else;
 *   - no clock, no redirect, no ring buffer, no loop over variable map offsets, no
 *     division by a variable, no modulo; return codes XDP_DROP and XDP_PASS.
 *
 * What it does not do, compared with dispatcher.bpf.c (the decisions differ there):
 *   - no timeslots: it counts packets per tenant and per worker, and the host reads the
 *     counters at every slot boundary and runs the rebalancing step of Algorithm 1
 *     itself (buffet-xdp's offload module), writing the new tenant -> worker rows back;
 *     a tenant therefore moves at the boundary, not on its first packet of the slot,
 *     and every packet of a slot goes to the worker chosen at its start;
 *   - no per-tenant policing (MAX_NB) in the NIC: the host reads the tenant's counter
 *     within the timeslot and, once it is over MAX_NB, sets the row's `policed` flag
 *     (the NIC drops the tenant's packets until the boundary clears it); what arrives
 *     before the host looks passes;
 *   - exact-match classification only (destination address, protocol and destination
 *     port; or the destination address alone): prefix and port-range rules are refused
 *     when the offloaded tables are built;
 *   - no metadata: the tenant reaches the worker in DSCP only, which holds slots 0..=63
 *     (the tables hold 64 tenant slots).
 *
 * The host half (buffet-xdp's offload module, OffloadDispatcher) writes bf_off_exact,
 * bf_off_addr and bf_off_tenants, reads the counters, polices (sets `policed` once a
 * tenant's count in the slot passes its MAX_NB, clears it at the boundary) and runs the
 * boundary step. Built with -DBF_OFFLOAD_HOST_BUILD the same program loads on any
 * interface or under BPF_PROG_TEST_RUN, without the queue-select store.
 */
#include <stdbool.h>
#include <stdint.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define BF_STATIC_DEFS
#define BF_FN static __always_inline
#include "buffet_core_impl.h"

/* Legacy map definition: what the nfp check reads from the object. */
struct bf_map_def {
    unsigned int type;
    unsigned int key_size;
    unsigned int value_size;
    unsigned int max_entries;
    unsigned int map_flags;
};

#define BF_OFF_MAX_TENANTS 64
#define BF_OFF_MAX_WORKERS 16

/* Exact-match key: destination address (IPv4 mapped into ::ffff:0:0/96), protocol,
 * destination port (0 in the address-only table). */
struct bf_off_key {
    uint8_t dst_addr[16];
    uint16_t dst_port;
    uint8_t proto;
    uint8_t is_v6;
};

/* A tenant's row, written by the host at slot boundaries. */
struct bf_off_tenant {
    uint32_t worker;  /* RX queue of its worker */
    uint32_t policed; /* 1: drop its packets until the next boundary */
};

/* Counters (atomic add only). */
struct bf_off_count {
    uint64_t packets;
};

enum bf_off_stat { BF_OFF_ST_MALFORMED = 0, BF_OFF_ST_UNMATCHED = 1, BF_OFF_ST_POLICED = 2 };

struct bf_map_def SEC("maps") bf_off_exact = {
    .type = BPF_MAP_TYPE_HASH,
    .key_size = sizeof(struct bf_off_key),
    .value_size = sizeof(uint32_t), /* tenant slot */
    .max_entries = 4096,
};

struct bf_map_def SEC("maps") bf_off_addr = {
    .type = BPF_MAP_TYPE_HASH,
    .key_size = sizeof(struct bf_off_key),
    .value_size = sizeof(uint32_t),
    .max_entries = 4096,
};

struct bf_map_def SEC("maps") bf_off_tenants = {
    .type = BPF_MAP_TYPE_ARRAY,
    .key_size = sizeof(uint32_t),
    .value_size = sizeof(struct bf_off_tenant),
    .max_entries = BF_OFF_MAX_TENANTS,
};

struct bf_map_def SEC("maps") bf_off_tenant_pkts = {
    .type = BPF_MAP_TYPE_ARRAY,
    .key_size = sizeof(uint32_t),
    .value_size = sizeof(struct bf_off_count),
    .max_entries = BF_OFF_MAX_TENANTS,
};

struct bf_map_def SEC("maps") bf_off_worker_pkts = {
    .type = BPF_MAP_TYPE_ARRAY,
    .key_size = sizeof(uint32_t),
    .value_size = sizeof(struct bf_off_count),
    .max_entries = BF_OFF_MAX_WORKERS,
};

struct bf_map_def SEC("maps") bf_off_stats = {
    .type = BPF_MAP_TYPE_ARRAY,
    .key_size = sizeof(uint32_t),
    .value_size = sizeof(struct bf_off_count),
    .max_entries = 4,
};

static __always_inline void bf_off_count(void *map, uint32_t index)
{
    struct bf_off_count *c = bpf_map_lookup_elem(map, &index);
    if (c)
        __sync_fetch_and_add(&c->packets, 1);
}

SEC("xdp")
int buffet_dispatch_offload(struct xdp_md *ctx)
{
    uint8_t *data = (uint8_t *)(long)ctx->data;
    uint8_t *end = (uint8_t *)(long)ctx->data_end;
    uint8_t *ip;
    uint16_t ether_type;
    uint32_t *tenant;
    struct bf_off_tenant *row;
    struct bf_off_key key = {};
    uint32_t l4_ok = 0, hlen = 20;

    if (data + 14 > end)
        goto malformed;
    ether_type = (uint16_t)((data[12] << 8) | data[13]);
    ip = data + 14;
    if (ether_type == 0x8100 || ether_type == 0x88a8) {
        if (data + 18 > end)
            goto malformed;
        ether_type = (uint16_t)((data[16] << 8) | data[17]);
        ip = data + 18;
    }
    if (ether_type == 0x0800) {
        if (ip + 20 > end || (ip[0] >> 4) != 4 || (ip[0] & 0x0f) < 5)
            goto malformed;
        key.proto = ip[9];
        key.dst_addr[10] = key.dst_addr[11] = 0xff;
        key.dst_addr[12] = ip[16];
        key.dst_addr[13] = ip[17];
        key.dst_addr[14] = ip[18];
        key.dst_addr[15] = ip[19];
        /* Ports only without IP options and on a first fragment (constant offsets). */
        l4_ok = (ip[0] & 0x0f) == 5 && ((ip[6] & 0x1f) | ip[7]) == 0;
    } else if (ether_type == 0x86dd) {
        if (ip + 40 > end || (ip[0] >> 4) != 6)
            goto malformed;
        key.is_v6 = 1;
        key.proto = ip[6];
        __builtin_memcpy(key.dst_addr, ip + 24, 16);
        hlen = 40;
        l4_ok = 1;
    } else {
        goto malformed;
    }
    if (l4_ok && (key.proto == 6 || key.proto == 17)) {
        uint8_t *l4 = ip + hlen;
        if (l4 + 4 > end)
            goto malformed;
        key.dst_port = (uint16_t)((l4[2] << 8) | l4[3]);
    }

    tenant = bpf_map_lookup_elem(&bf_off_exact, &key);
    if (!tenant) {
        key.dst_port = 0;
        key.proto = 0;
        tenant = bpf_map_lookup_elem(&bf_off_addr, &key);
    }
    if (!tenant) {
        bf_off_count(&bf_off_stats, BF_OFF_ST_UNMATCHED);
        return XDP_DROP;
    }
    {
        uint32_t t = *tenant;
        row = bpf_map_lookup_elem(&bf_off_tenants, &t);
        if (!row) {
            bf_off_count(&bf_off_stats, BF_OFF_ST_UNMATCHED);
            return XDP_DROP;
        }
        /* The tenant's count includes its policed packets (`tmp` of Algorithm 1 does,
         * docs/scheduler.md); the worker's only what reaches it. */
        bf_off_count(&bf_off_tenant_pkts, t);
        if (row->policed) {
            bf_off_count(&bf_off_stats, BF_OFF_ST_POLICED);
            return XDP_DROP;
        }
        bf_off_count(&bf_off_worker_pkts, row->worker);
        /* DSCP tag (IPv4: checksum fixed as in common/, RFC 1624). */
        if (t <= 63) {
            if (!key.is_v6) {
                uint16_t old_word = (uint16_t)((ip[0] << 8) | ip[1]);
                uint16_t new_word, hc, fixed;
                ip[1] = (uint8_t)((t << 2) | (ip[1] & 0x03));
                new_word = (uint16_t)((ip[0] << 8) | ip[1]);
                hc = (uint16_t)((ip[10] << 8) | ip[11]);
                fixed = bf_checksum_update(hc, old_word, new_word);
                ip[10] = (uint8_t)(fixed >> 8);
                ip[11] = (uint8_t)fixed;
            } else {
                uint8_t tc = (uint8_t)(((ip[0] << 4) | (ip[1] >> 4)) & 0x03);
                tc = (uint8_t)((t << 2) | tc);
                ip[0] = (uint8_t)((ip[0] & 0xf0) | (tc >> 4));
                ip[1] = (uint8_t)((tc << 4) | (ip[1] & 0x0f));
            }
        }
#ifndef BF_OFFLOAD_HOST_BUILD
        /* Queue select: the worker's RX queue. The kernel accepts this store only from a
         * program bound to an offload device; the host build (buffet-xdp's build.rs, for
         * BPF_PROG_TEST_RUN) leaves it out, and the worker counter above says where the
         * packet went. */
        ctx->rx_queue_index = row->worker;
#endif
    }
    return XDP_PASS;

malformed:
    bf_off_count(&bf_off_stats, BF_OFF_ST_MALFORMED);
    return XDP_DROP;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
