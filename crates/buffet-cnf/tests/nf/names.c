/*
 * names.c — a C NF whose strings are hostile: what Buffet reads from a pointer the NF
 * hands over (a counter's name, buffet_nf_name's result), and a crash at load.
 *
 * Built with one of (none: a well-behaved NF named "names"):
 *   -DNAME_BADPTR     buffet_nf_name returns (const char *)0x1234
 *   -DNAME_LONG       buffet_nf_name returns a 100-character name
 *   -DMEMREG_CRASH    buffet_mem_register writes through a NULL pointer
 *   -DABI_CRASH       buffet_abi_version writes through a NULL pointer
 *
 * Policy: { "summary": "<mode>" } for buffet_summary, for that tenant only:
 *   "badptr"  counter 1's name is (const char *)0x1234   (unreadable)
 *   "arena"   counter 1's name points one page past the tenant's state (a guard page)
 *   "long"    counter 1's name is 100 characters without a NUL in its first 63 bytes
 *   "null"    counter 1's name is NULL                     (the counter is left out)
 *   "crash"   buffet_summary writes through a NULL pointer
 * Counters: packets, canary (the policy's "canary"), and counter 1 as above ("second").
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buffet.h"

enum mode { OK, BADPTR, ARENA, LONG_NAME, NULL_NAME, CRASH };

struct state {
    uint64_t packets;
    uint64_t canary;
    uint32_t mode;
};

static const char long_name[] = "a_counter_name_that_goes_on_and_on_well_past_the_sixty_three_"
                                "bytes_buffet_takes_for_one";

size_t buffet_mem_register(void) {
#ifdef MEMREG_CRASH
    *(volatile int *)0 = 1;
#endif
    return sizeof(struct state);
}

#if defined(NAME_BADPTR) || defined(NAME_LONG)
const char *buffet_nf_name(void) {
#ifdef NAME_BADPTR
    return (const char *)0x1234;
#else
    return long_name;
#endif
}
#else
const char *buffet_nf_name(void) { return "names"; }
#endif

uint32_t buffet_abi_version(void) {
#ifdef ABI_CRASH
    *(volatile int *)0 = 1;
#endif
    return BUFFET_ABI_VERSION;
}

int buffet_state_init(const char *policy, void *mem, size_t len, char *err, size_t errlen) {
    struct state *s = mem;
    (void)len;
    (void)err;
    (void)errlen;
    const char *v = strstr(policy, "\"canary\":");
    if (v != NULL) {
        s->canary = strtoull(v + 9, NULL, 10);
    }
    static const struct {
        const char *name;
        enum mode mode;
    } modes[] = {{"\"badptr\"", BADPTR},   {"\"arena\"", ARENA}, {"\"long\"", LONG_NAME},
                 {"\"null\"", NULL_NAME}, {"\"crash\"", CRASH}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        if (strstr(policy, modes[i].name) != NULL) {
            s->mode = modes[i].mode;
        }
    }
    return 0;
}

buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *mem, size_t len) {
    struct state *s = mem;
    (void)pkt;
    (void)len;
    s->packets++;
    return BUFFET_PASS;
}

size_t buffet_summary(const void *mem, size_t len, struct buffet_counter *out, size_t max) {
    const struct state *s = mem;
    if (max < 3) {
        return 0;
    }
    out[0] = (struct buffet_counter){"packets", s->packets};
    out[1] = (struct buffet_counter){"second", 2};
    out[2] = (struct buffet_counter){"canary", s->canary};
    switch (s->mode) {
    case BADPTR:
        out[1].name = (const char *)0x1234;
        break;
    case ARENA:
        /* The region is whole pages; the page after it is its guard. */
        out[1].name = (const char *)mem + ((len + 4095) & ~(size_t)4095);
        break;
    case LONG_NAME:
        out[1].name = long_name;
        break;
    case NULL_NAME:
        out[1].name = NULL;
        break;
    case CRASH:
        *(volatile int *)0 = 1;
        break;
    default:
        break;
    }
    return 3;
}
