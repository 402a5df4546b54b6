/*
 * pif_plugin_buffet_dispatch: the Micro-C plugin of buffet.p4. It runs Algorithm 1 --
 * bf_schedule from ../common, unchanged -- over a Tenant Table and a Worker Table kept
 * in the NIC's external memory, on the packet's ingress timestamp, and returns the
 * worker and the verdict in the buffet metadata. The control plane writes the rows
 * (admission, MAX_NB, worker liveness) through the same memory symbols.
 *
 * Not compiled here (no Agilio SDK); see README.md. The C core it includes is what the
 * Buffet tests exercise (host build, XDP program).
 */
#include <stdint.h>
#include <nfp.h>
#include <nfp/mem_atomic.h>
#include <pif_plugin.h>

#define BF_STATIC_DEFS
#define BF_FN static __inline
#include "../common/buffet_core_impl.h"

#define BUFFET_MAX_TENANTS 16384
#define BUFFET_MAX_WORKERS 64

/* The tables, shared by all MEs; one semaphore makes each scheduling step atomic. */
__export __emem struct bf_tenant_row buffet_tenants[BUFFET_MAX_TENANTS];
__export __emem struct bf_worker_row buffet_workers[BUFFET_MAX_WORKERS];
__export __emem uint32_t buffet_params[3]; /* n_workers, shift, threshold */
__declspec(emem shared scope(global)) SEMAPHORE_T buffet_lock = 1;

int pif_plugin_buffet_dispatch(EXTRACTED_HEADERS_T *headers, MATCH_DATA_T *match_data)
{
    struct bf_sched s;
    struct bf_outcome out;
    uint64_t ts;
    uint32_t tenant = pif_plugin_meta_get__buffet__tenant(headers);

    /* The ingress timestamp (ns), from the intrinsic metadata. */
    ts = ((uint64_t)pif_plugin_meta_get__intrinsic_metadata__ingress_global_timestamp__1(headers) << 32) |
         pif_plugin_meta_get__intrinsic_metadata__ingress_global_timestamp__0(headers);

    s.tenants = buffet_tenants;
    s.n_tenants = BUFFET_MAX_TENANTS;
    s.workers = buffet_workers;
    s.n_workers = buffet_params[0] < BUFFET_MAX_WORKERS ? buffet_params[0] : BUFFET_MAX_WORKERS;
    s.shift = buffet_params[1];
    s.threshold = buffet_params[2];

    semaphore_down(&buffet_lock);
    bf_schedule(&s, ts, tenant, &out);
    semaphore_up(&buffet_lock);

    pif_plugin_meta_set__buffet__worker(headers, out.worker);
    pif_plugin_meta_set__buffet__verdict(headers, out.kind);
    /* Overload reports: the host polls the Worker Table's `times` (no ring buffer). */
    return PIF_PLUGIN_RETURN_FORWARD;
}
