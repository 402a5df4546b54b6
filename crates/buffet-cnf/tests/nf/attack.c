/*
 * attack.c — a C NF that attacks the process it runs in, for the tenants whose policy
 * says so; every other tenant counts packets and bytes and keeps a canary (like
 * examples/c-nf/malicious.c). It passes inspection: it imports only allowlisted string functions,
 * and makes its system calls with a raw `syscall` instruction, which no import check sees.
 *
 * Policy: { "attack": "<mode>", "attack_after": 20, "canary": 7 }
 *   In buffet_state_init (the tenant is never admitted):
 *     "init-null"      write through a NULL pointer        (SIGSEGV)
 *     "init-fpe"       divide by zero                      (SIGFPE)
 *     "init-ud2"       execute ud2                         (SIGILL)
 *     "init-overflow"  recurse without end                 (stack overflow)
 *     "init-loop"      never return                        (watchdog)
 *   In buffet_pkt_handler, once the tenant has seen `attack_after` packets:
 *     "recurse"        recurse without end                 (stack overflow)
 *     "alloca"         alloca 8 MiB and touch it           (stack overflow past the stack)
 *     "loop"           never return                        (watchdog)
 *     "mprotect-exec"  mprotect its own state page RWX     (seccomp: SIGSYS)
 *     "exit-group"     exit_group(0), ending the process   (seccomp: SIGSYS)
 *     "tgkill"         send SIGKILL to a thread            (seccomp: SIGSYS)
 *     "exit-thread"    exit(0): end the worker thread      (seccomp, caller check: SIGSYS)
 *     "mmap"           map 1 GiB more, read-write          (seccomp, caller check: SIGSYS)
 *     "block-signals"  block every signal (the watchdog's) (seccomp, caller check: SIGSYS)
 *   Counters: packets, bytes, canary.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buffet.h"

enum attack {
    NONE,
    INIT_NULL,
    INIT_FPE,
    INIT_UD2,
    INIT_OVERFLOW,
    INIT_LOOP,
    RECURSE,
    ALLOCA,
    LOOP,
    MPROTECT_EXEC,
    EXIT_GROUP,
    TGKILL,
    EXIT_THREAD,
    MMAP,
    BLOCK_SIGNALS,
};

static const struct {
    const char *name;
    enum attack attack;
} modes[] = {
    {"\"init-null\"", INIT_NULL},      {"\"init-fpe\"", INIT_FPE},
    {"\"init-ud2\"", INIT_UD2},        {"\"init-overflow\"", INIT_OVERFLOW},
    {"\"init-loop\"", INIT_LOOP},      {"\"recurse\"", RECURSE},
    {"\"alloca\"", ALLOCA},            {"\"loop\"", LOOP},
    {"\"mprotect-exec\"", MPROTECT_EXEC}, {"\"exit-group\"", EXIT_GROUP},
    {"\"tgkill\"", TGKILL},          {"\"exit-thread\"", EXIT_THREAD},
    {"\"mmap\"", MMAP},              {"\"block-signals\"", BLOCK_SIGNALS},
};

struct state {
    uint64_t packets;
    uint64_t bytes;
    uint64_t canary;
    uint64_t attack_after;
    uint64_t depth_limit; /* never reached: keeps the recursion from looking endless */
    uint32_t attack;
};

const char *buffet_nf_name(void) { return "attack"; }
uint32_t buffet_abi_version(void) { return BUFFET_ABI_VERSION; }
size_t buffet_mem_register(void) { return sizeof(struct state); }

static long raw_syscall3(long nr, long a, long b, long c) {
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return ret;
}

static long raw_syscall6(long nr, long a, long b, long c, long d, long e, long f) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

static const char *json_value(const char *json, const char *key) {
    const char *p = strstr(json, key);
    if (p == NULL) {
        return NULL;
    }
    p = strstr(p, ":");
    return p == NULL ? NULL : p + 1;
}

__attribute__((noinline)) static uint64_t recurse(volatile struct state *s, uint64_t n) {
    volatile char frame[512];
    frame[n % sizeof frame] = (char)n;
    if (n >= s->depth_limit) {
        return n;
    }
    return recurse(s, n + 1) + (uint64_t)frame[(n + 1) % sizeof frame];
}

__attribute__((noinline)) static void spin(volatile struct state *s) {
    for (;;) {
        s->bytes++;
    }
}

int buffet_state_init(const char *policy, void *mem, size_t len, char *err, size_t errlen) {
    volatile struct state *s = mem;
    (void)len, (void)err, (void)errlen;
    const char *v;
    s->attack_after = 20;
    s->depth_limit = UINT64_MAX;
    if ((v = json_value(policy, "\"attack_after\"")) != NULL) {
        s->attack_after = strtoull(v, NULL, 10);
    }
    if ((v = json_value(policy, "\"canary\"")) != NULL) {
        s->canary = strtoull(v, NULL, 10);
    }
    if ((v = json_value(policy, "\"attack\"")) != NULL) {
        while (*v == ' ') {
            v++;
        }
        for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
            if (strstr(v, modes[i].name) == v) {
                s->attack = modes[i].attack;
            }
        }
    }
    volatile uint64_t zero = 0;
    switch (s->attack) {
    case INIT_NULL:
        *(volatile uint64_t *)(uintptr_t)zero = 1;
        break;
    case INIT_FPE:
        s->canary = s->canary / zero;
        break;
    case INIT_UD2:
        __asm__ volatile("ud2");
        break;
    case INIT_OVERFLOW:
        s->canary = recurse(s, 0);
        break;
    case INIT_LOOP:
        spin(s);
        break;
    default:
        break;
    }
    return 0;
}

buffet_verdict buffet_pkt_handler(struct buffet_pkt *pkt, void *mem, size_t len) {
    volatile struct state *s = mem;
    (void)len;
    s->packets++;
    s->bytes += pkt->len;
    if (s->attack < RECURSE || s->packets <= s->attack_after) {
        return BUFFET_PASS;
    }
    switch (s->attack) {
    case RECURSE:
        s->canary = recurse(s, 0);
        break;
    case ALLOCA: {
        volatile char *p = __builtin_alloca(8u << 20);
        p[0] = 1;
        s->canary = (uint64_t)p[0];
        break;
    }
    case LOOP:
        spin(s);
        break;
    case MPROTECT_EXEC:
        /* mprotect(its own page, 4096, PROT_READ | PROT_WRITE | PROT_EXEC) */
        raw_syscall3(10, (long)((uintptr_t)mem & ~(uintptr_t)4095), 4096, 7);
        break;
    case EXIT_GROUP:
        raw_syscall3(231, 0, 0, 0);
        break;
    case TGKILL:
        /* tgkill(.., .., SIGKILL); no raw getpid/gettid first: the caller check would trap
         * those already. */
        raw_syscall3(234, 0, 0, 9);
        break;
    case EXIT_THREAD:
        raw_syscall3(60, 0, 0, 0);
        break;
    case MMAP:
        /* mmap(NULL, 1 GiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) */
        s->canary = (uint64_t)raw_syscall6(9, 0, 1l << 30, 3, 0x22, -1, 0);
        break;
    case BLOCK_SIGNALS: {
        /* rt_sigprocmask(SIG_BLOCK, all, NULL, 8) */
        volatile uint64_t all = ~(uint64_t)0;
        raw_syscall6(14, 0, (long)&all, 0, 8, 0, 0);
        break;
    }
    default:
        break;
    }
    return BUFFET_PASS;
}

size_t buffet_summary(const void *mem, size_t len, struct buffet_counter *out, size_t max) {
    const struct state *s = mem;
    (void)len;
    if (max < 3) {
        return 0;
    }
    out[0] = (struct buffet_counter){"packets", s->packets};
    out[1] = (struct buffet_counter){"bytes", s->bytes};
    out[2] = (struct buffet_counter){"canary", s->canary};
    return 3;
}
