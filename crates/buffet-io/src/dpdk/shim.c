/*
 * The DPDK calls of buffet-io's DPDK port, as plain functions over opaque pointers.
 *
 * DPDK's fast path (rte_eth_rx_burst, rte_eth_tx_burst, rte_pktmbuf_alloc/free, the
 * mbuf accessors) is `static inline` in its headers, and the structures it takes
 * (struct rte_eth_conf, struct rte_mbuf) change between releases. This file is compiled
 * by build.rs against the installed headers (pkg-config libdpdk, Debian's 22.11), so the
 * Rust side sees only these functions and never a DPDK structure layout.
 *
 * Built only with the cargo feature `io-dpdk`.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

int buffet_dpdk_eal_init(int argc, char **argv) { return rte_eal_init(argc, argv); }

int buffet_dpdk_eal_cleanup(void) { return rte_eal_cleanup(); }

int buffet_dpdk_errno(void) { return rte_errno; }

const char *buffet_dpdk_strerror(int err) { return rte_strerror(err); }

uint16_t buffet_dpdk_port_count(void) { return rte_eth_dev_count_avail(); }

/* The first available port, or -ENODEV. */
int buffet_dpdk_first_port(void)
{
    uint16_t port;
    RTE_ETH_FOREACH_DEV(port) { return port; }
    return -ENODEV;
}

/* The port of the device called `name`, or a negative errno. */
int buffet_dpdk_port_by_name(const char *name)
{
    uint16_t port;
    int rc = rte_eth_dev_get_port_by_name(name, &port);
    return rc < 0 ? rc : port;
}

/* Writes the device name of `port` into `name` (`len` bytes, NUL-terminated). */
int buffet_dpdk_port_name(uint16_t port, char *name, size_t len)
{
    char buf[RTE_ETH_NAME_MAX_LEN];
    int rc = rte_eth_dev_get_name_by_port(port, buf);
    if (rc < 0)
        return rc;
    if (len == 0)
        return -EINVAL;
    strncpy(name, buf, len - 1);
    name[len - 1] = 0;
    return 0;
}

int buffet_dpdk_socket_id(uint16_t port) { return rte_eth_dev_socket_id(port); }

struct rte_mempool *buffet_dpdk_pool_create(const char *name, unsigned n, unsigned cache,
                                            uint16_t data_room, int socket)
{
    return rte_pktmbuf_pool_create(name, n, cache, 0, data_room, socket);
}

void buffet_dpdk_pool_free(struct rte_mempool *pool) { rte_mempool_free(pool); }

/* Configures `port` with `rxq` receive and `txq` transmit queues, no offloads, and
 * adjusts the descriptor counts to what the device accepts. */
int buffet_dpdk_configure(uint16_t port, uint16_t rxq, uint16_t txq, uint16_t *nb_rxd,
                          uint16_t *nb_txd)
{
    struct rte_eth_conf conf;
    memset(&conf, 0, sizeof(conf));
    int rc = rte_eth_dev_configure(port, rxq, txq, &conf);
    if (rc < 0)
        return rc;
    return rte_eth_dev_adjust_nb_rx_tx_desc(port, nb_rxd, nb_txd);
}

int buffet_dpdk_rx_queue_setup(uint16_t port, uint16_t queue, uint16_t nb_desc, int socket,
                               struct rte_mempool *pool)
{
    return rte_eth_rx_queue_setup(port, queue, nb_desc, (unsigned)socket, NULL, pool);
}

int buffet_dpdk_tx_queue_setup(uint16_t port, uint16_t queue, uint16_t nb_desc, int socket)
{
    return rte_eth_tx_queue_setup(port, queue, nb_desc, (unsigned)socket, NULL);
}

int buffet_dpdk_start(uint16_t port) { return rte_eth_dev_start(port); }

int buffet_dpdk_promiscuous_enable(uint16_t port) { return rte_eth_promiscuous_enable(port); }

int buffet_dpdk_stop(uint16_t port) { return rte_eth_dev_stop(port); }

int buffet_dpdk_close(uint16_t port) { return rte_eth_dev_close(port); }

/* The device's counters: ipackets, opackets, imissed, ierrors, oerrors, rx_nombuf. */
int buffet_dpdk_stats(uint16_t port, uint64_t out[6])
{
    struct rte_eth_stats s;
    int rc = rte_eth_stats_get(port, &s);
    if (rc < 0)
        return rc;
    out[0] = s.ipackets;
    out[1] = s.opackets;
    out[2] = s.imissed;
    out[3] = s.ierrors;
    out[4] = s.oerrors;
    out[5] = s.rx_nombuf;
    return 0;
}

uint16_t buffet_dpdk_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts,
                              uint16_t n)
{
    return rte_eth_rx_burst(port, queue, pkts, n);
}

uint16_t buffet_dpdk_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts,
                              uint16_t n)
{
    return rte_eth_tx_burst(port, queue, pkts, n);
}

struct rte_mbuf *buffet_dpdk_mbuf_alloc(struct rte_mempool *pool)
{
    return rte_pktmbuf_alloc(pool);
}

void buffet_dpdk_mbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }

/* The first segment's data (rte_pktmbuf_mtod), its length, the bytes from the data's
 * start to the end of the data room, and the number of segments. */
uint8_t *buffet_dpdk_mbuf_view(const struct rte_mbuf *m, uint32_t *data_len, uint32_t *room,
                               uint32_t *segs)
{
    *data_len = m->data_len;
    *room = (uint32_t)m->buf_len - m->data_off;
    *segs = m->nb_segs;
    return rte_pktmbuf_mtod(m, uint8_t *);
}

/* Makes a single-segment mbuf `len` bytes long (its data stays where it is); -1 when the
 * data room is too small or the mbuf has several segments. */
int buffet_dpdk_mbuf_set_len(struct rte_mbuf *m, uint32_t len)
{
    if (m->nb_segs != 1 || len > (uint32_t)m->buf_len - m->data_off)
        return -1;
    m->data_len = (uint16_t)len;
    m->pkt_len = len;
    return 0;
}
