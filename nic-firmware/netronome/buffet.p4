/*
 * Buffet Packet Dispatcher for Netronome Agilio SmartNICs (P4_16, v1model as the Agilio
 * SDK's nfp4build takes it). The parser extracts Ethernet, one VLAN tag, IPv4/IPv6 and
 * TCP/UDP/SCTP ports (not after IPv4 options, and without Buffet's length checks: see
 * README.md for where it differs from buffet-dispatch); the classifier table maps them
 * to a tenant slot (the control plane
 * fills it from the tenants' rules: exact, LPM and ternary fields); the Micro-C plugin
 * pif_plugin_buffet_dispatch (buffet_plugin.c) runs Algorithm 1 from ../common on the
 * ingress timestamp and picks the worker; the DSCP action tags the tenant slot.
 *
 * Not compiled here (no Agilio SDK); see README.md.
 */
#include <core.p4>
#include <v1model.p4>

header ethernet_t { bit<48> dst; bit<48> src; bit<16> ether_type; }
header vlan_t { bit<3> pcp; bit<1> dei; bit<12> vid; bit<16> ether_type; }
header ipv4_t {
    bit<4> version; bit<4> ihl; bit<6> dscp; bit<2> ecn; bit<16> total_len;
    bit<16> id; bit<3> flags; bit<13> frag_offset; bit<8> ttl; bit<8> protocol;
    bit<16> checksum; bit<32> src; bit<32> dst;
}
header ipv6_t {
    bit<4> version; bit<6> dscp; bit<2> ecn; bit<20> flow_label; bit<16> payload_len;
    bit<8> next_header; bit<8> hop_limit; bit<128> src; bit<128> dst;
}
header ports_t { bit<16> src; bit<16> dst; }

struct headers_t {
    ethernet_t ethernet; vlan_t vlan; ipv4_t ipv4; ipv6_t ipv6; ports_t ports;
}

/* What the table and the plugin hand each other. */
struct buffet_meta_t {
    bit<32> tenant;   /* tenant slot (from the classifier) */
    bit<16> worker;   /* chosen by the plugin */
    bit<8> verdict;   /* 0 pass, 1 policed, 2 no live worker, 3 unknown tenant */
}
struct metadata_t { buffet_meta_t buffet; }

/* The plugin: Algorithm 1 over the Tenant Table and Worker Table (buffet_plugin.c). */
extern void buffet_dispatch();

parser BuffetParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t std) {
    state start {
        pkt.extract(hdr.ethernet);
        transition select(hdr.ethernet.ether_type) {
            0x8100: vlan; 0x88a8: vlan; 0x0800: ipv4; 0x86dd: ipv6; default: accept;
        }
    }
    state vlan {
        pkt.extract(hdr.vlan);
        transition select(hdr.vlan.ether_type) { 0x0800: ipv4; 0x86dd: ipv6; default: accept; }
    }
    state ipv4 {
        pkt.extract(hdr.ipv4);
        /* Ports on first fragments without options, as the offload subset. */
        transition select(hdr.ipv4.ihl, hdr.ipv4.frag_offset, hdr.ipv4.protocol) {
            (5, 0, 6): ports; (5, 0, 17): ports; (5, 0, 132): ports; default: accept;
        }
    }
    state ipv6 {
        pkt.extract(hdr.ipv6);
        transition select(hdr.ipv6.next_header) { 6: ports; 17: ports; 132: ports; default: accept; }
    }
    state ports { pkt.extract(hdr.ports); transition accept; }
}

control BuffetVerify(inout headers_t hdr, inout metadata_t meta) { apply { } }

control BuffetIngress(inout headers_t hdr, inout metadata_t meta,
                      inout standard_metadata_t std) {
    /* Per-tenant and per-worker packet counters the control plane reads. */
    register<bit<64>>(16384) tenant_packets;
    register<bit<64>>(64) worker_packets;

    action set_tenant(bit<32> tenant) { meta.buffet.tenant = tenant; }
    action unmatched() { mark_to_drop(std); }

    table classifier {
        key = {
            std.ingress_port: ternary;
            hdr.vlan.vid: ternary;
            hdr.ipv4.src: lpm;
            hdr.ipv4.dst: ternary;
            hdr.ipv6.src: ternary;
            hdr.ipv6.dst: ternary;
            hdr.ipv4.protocol: ternary;
            hdr.ports.src: range;
            hdr.ports.dst: range;
        }
        actions = { set_tenant; unmatched; }
        default_action = unmatched();
        size = 16384;
    }

    action tag_dscp() {
        hdr.ipv4.dscp = (bit<6>) meta.buffet.tenant;
        hdr.ipv6.dscp = (bit<6>) meta.buffet.tenant;
    }

    apply {
        if (classifier.apply().hit) {
            buffet_dispatch();
            if (meta.buffet.verdict != 0) {
                mark_to_drop(std);
            } else {
                bit<64> n;
                tenant_packets.read(n, meta.buffet.tenant);
                tenant_packets.write(meta.buffet.tenant, n + 1);
                worker_packets.read(n, (bit<32>) meta.buffet.worker);
                worker_packets.write((bit<32>) meta.buffet.worker, n + 1);
                if (meta.buffet.tenant <= 63) { tag_dscp(); }
                /* One host queue (VF) per worker. */
                std.egress_spec = (bit<9>) meta.buffet.worker;
            }
        }
    }
}

control BuffetEgress(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t std) { apply { } }

control BuffetChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.dscp, hdr.ipv4.ecn, hdr.ipv4.total_len,
              hdr.ipv4.id, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src, hdr.ipv4.dst },
            hdr.ipv4.checksum, HashAlgorithm.csum16);
    }
}

control BuffetDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.ethernet); pkt.emit(hdr.vlan); pkt.emit(hdr.ipv4);
        pkt.emit(hdr.ipv6); pkt.emit(hdr.ports);
    }
}

V1Switch(BuffetParser(), BuffetVerify(), BuffetIngress(), BuffetEgress(),
         BuffetChecksum(), BuffetDeparser()) main;
