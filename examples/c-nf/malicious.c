/*
 * malicious.c — a C NF that misbehaves on purpose for the tenants whose policy says so,
 * to prove fault containment. Every tenant counts packets and bytes (like portblock.c);
 * an attacking tenant, once it has seen `attack_after` packets, reaches out of its own
 * region. Under MPK tenant regions are laid out one after another in the arena, each
 * followed by one guard page and each starting with Buffet's 64-byte header, so the next
 * tenant's C state begins at (char *)state + len + PAGE + 64. (Without MPK the C states
 * have no header in front, so the same address is 64 bytes into the next one.)
 *
 * Policy: { "attack": "read-write", "attack_after": 100, "canary": 7 }
 *   attack = "none" (default)  behave;
 *            "read-write"      read the next tenant's first counter, then overwrite it;
 *            "write"           overwrite it without reading first;
 *            "overrun"         write one byte past the end of its own region (guard page);
 *            "null"            write through a NULL pointer (a plain bug: contained at
 *                              every guarded level, like every fault inside an NF call);
 *            "sleep"           never return from the handler, asleep in the kernel (a raw
 *                              pause(2) on x86-64, elsewhere a spin: no CPU time, so the
 *                              watchdog, on the thread's CPU-time clock, never fires; at
 *                              `mpk` seccomp traps the raw system call). The worker is
 *                              found stuck after half a timeslot (at least 500 ms), the
 *                              tenant quarantined, and the worker's other tenants moved
 *                              to live workers.
 *   canary: a number kept in the state and reported back (proves nobody wrote it).
 *
 * Under MPK the first stray access faults — the next tenant's protection key is closed on
 * this thread — Buffet quarantines the attacker and the next tenant's state is untouched.
 * Counters: packets, bytes, canary, stolen.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "buffet.h"

enum attack { NONE, READ_WRITE, WRITE, OVERRUN, NULL_DEREF, SLEEP };

struct state {
    uint64_t packets;
    uint64_t bytes;
    uint64_t canary;
    uint64_t stolen;
    uint64_t attack_after;
    uint32_t attack;
};

const char *buffet_nf_name(void) { return "malicious"; }
uint32_t buffet_abi_version(void) { return BUFFET_ABI_VERSION; }
size_t buffet_mem_register(void) { return sizeof(struct state); }

static const char *json_value(const char *json, const char *key) {
    const char *p = strstr(json, key);
    return p ? strchr(p, ':') : NULL;
}

int buffet_state_init(const char *policy, void *mem, size_t len, char *err, size_t errlen) {
    struct state *s = mem;
    (void)len, (void)err, (void)errlen;
    const char *v;
    s->attack_after = 100;
    if ((v = json_value(policy, "\"attack_after\"")) != NULL) {
        s->attack_after = strtoull(v + 1, NULL, 10);
    }
    if ((v = json_value(policy, "\"canary\"")) != NULL) {
        s->canary = strtoull(v + 1, NULL, 10);
    }
    if ((v = json_value(policy, "\"attack\"")) != NULL) {
        for (v++; *v == ' '; v++) {
        }
        static const struct {
            const char *name;
            enum attack attack;
        } modes[] = {{"\"read-write\"", READ_WRITE},
                     {"\"write\"", WRITE},
                     {"\"overrun\"", OVERRUN},
                     {"\"null\"", NULL_DEREF},
                     {"\"sleep\"", SLEEP}};
        for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
            if (strncmp(v, modes[i].name, strlen(modes[i].name)) == 0) {
                s->attack = modes[i].attack;
            }
        }
    }
    return 0;
}

buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *mem, size_t len) {
    struct state *s = mem;
    s->packets++;
    s->bytes += pkt->len;
    if (s->attack == NONE || s->packets <= s->attack_after) {
        return BUFFET_PASS;
    }
    long page = getpagesize();
    volatile uint64_t *next = (volatile uint64_t *)((char *)mem + len + page + 64);
    switch (s->attack) {
    case READ_WRITE:
        s->stolen = *next;  /* read ...           */
        *next = 0xdeadbeef; /* ... then write      */
        break;
    case WRITE:
        *next = 0xdeadbeef;
        break;
    case OVERRUN:
        ((volatile char *)mem)[len] = 1; /* one past the region: its guard page */
        break;
    case SLEEP:
        for (;;) {
#if defined(__x86_64__)
            long ret;
            __asm__ volatile("syscall" : "=a"(ret) : "a"((long)SYS_pause) : "rcx", "r11", "memory");
#else
            ((volatile struct state *)s)->bytes++; /* no raw call here: spin instead */
#endif
        }
    default:
        *(volatile uint64_t *)(uintptr_t)s->stolen = 1; /* stolen is 0: NULL */
        break;
    }
    return BUFFET_PASS;
}

size_t buffet_summary(const void *mem, size_t len, struct buffet_counter *out, size_t max) {
    const struct state *s = mem;
    (void)len;
    if (max < 4) {
        return 0;
    }
    out[0] = (struct buffet_counter){"packets", s->packets};
    out[1] = (struct buffet_counter){"bytes", s->bytes};
    out[2] = (struct buffet_counter){"canary", s->canary};
    out[3] = (struct buffet_counter){"stolen", s->stolen};
    return 4;
}
