/*
 * guard.c — fault containment for C NFs: run a tenant's C code so that a protection-key
 * fault (or a hit on a tenant arena's guard page) returns to the caller instead of killing
 * the process.
 *
 * How: each guarded call does a setjmp (GCC's __builtin_setjmp: a few stores, about 1 ns,
 * against 2.5 ns for glibc's sigsetjmp), arms a thread-local pointer to its buffer and
 * calls the NF's function — for packets, buffet_guard_batch loops over a whole chunk of
 * one tenant's group in C, so one setjmp covers up to 32 packets. Our SIGSEGV handler (SA_SIGINFO | SA_ONSTACK, on a per-thread
 * alternate stack) recovers only if the faulting thread is armed — it is inside an NF
 * call — and the fault is one a tenant causes:
 *   - si_code == SEGV_PKUERR (4): the access hit a region whose protection key this
 *     thread's PKRU closes: another tenant's region;
 *   - si_code == SEGV_ACCERR inside a tenant arena: a guard page between regions, or free
 *     arena space (buffet_cnf_in_arena, atomic loads only, answers that).
 * Every other SIGSEGV goes to the handler that was installed before ours (Rust's stack
 * overflow handler, or the default action), so real bugs still crash.
 *
 * A call armed with contain_all (the trusted-native isolation level, on CPUs without
 * protection keys: no hardware confines the NF, so its bugs are not "a tenant's" fault in
 * the sense above) recovers from every SIGSEGV, SIGBUS, SIGFPE and SIGILL its thread
 * raises inside the call: a NULL write, a wild pointer, a division by zero quarantine the
 * tenant instead of killing the process. The handler is installed for all four signals;
 * outside a contain_all call, SIGBUS, SIGFPE and SIGILL always go to the previous handler.
 *
 * Recovering does not jump out of the handler: it redirects the interrupted context to a
 * landing pad (`landing`, on the faulting thread's own stack, below the NF's frames and
 * their red zone) and returns. The kernel's sigreturn then restores what the handler must
 * not leave behind: the signal mask (SIGSEGV unblocked again) and PKRU — a signal handler
 * runs with the kernel's default PKRU, and a longjmp out of it would keep that; sigreturn
 * puts back the PKRU of the faulting context, which is the one the guarded call started
 * with (the tenant's key open). The landing pad then longjmps to the guarded call, which
 * returns 1. The frames that longjmp skips are the NF's own C frames only: the trampolines
 * below are C and call the NF's function pointer directly; no Rust frame sits between the
 * setjmp and the fault.
 *
 * What this does not make safe: NF code that faults while holding a lock of its own or of
 * libc (a longjmp leaves it held), and NF code that calls back into Rust.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include "buffet.h"

#ifndef SEGV_PKUERR
#define SEGV_PKUERR 4
#endif

/* Filled by the handler when it recovers a fault. Mirrored in src/lib.rs (RawFault). */
struct buffet_fault {
    int32_t signo;    /* SIGSEGV, or (contain_all only) SIGBUS, SIGFPE, SIGILL */
    int32_t code;     /* si_code: SEGV_PKUERR, SEGV_ACCERR, SEGV_MAPERR, FPE_INTDIV, ... */
    int32_t pkey;     /* si_pkey for SEGV_PKUERR, else -1 */
    int32_t in_arena; /* 1 when the address lies in a tenant arena */
    uint64_t addr;
};

/* Exported by the Rust side (buffet_memory::in_tenant_arena): async-signal-safe. */
extern int buffet_cnf_in_arena(uintptr_t addr);

#define TLS __thread __attribute__((tls_model("initial-exec")))

/* The setjmp buffer of the guarded call running on this thread, or NULL. */
static TLS void **armed;
/* Whether that call recovers from every fault (trusted-native), not only a tenant's. */
static TLS int armed_all;
/* Set by the handler for the landing pad: where to jump back to. */
static TLS void **jump_to;
/* The last fault the handler recovered on this thread. */
static TLS struct buffet_fault last_fault;
static TLS int altstack_ready;

/* The signals the handler is installed for, and the handlers that were there before. */
static const int contained_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
#define NSIGNALS (sizeof contained_signals / sizeof contained_signals[0])
static struct sigaction previous[NSIGNALS];
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_error;
static pthread_key_t altstack_key;

#define ALTSTACK_BYTES (64 * 1024)

/* Hands a fault that is not ours to whoever handled SIGSEGV before us. */
static void chain(int sig, siginfo_t *si, void *uc) {
    const struct sigaction *prev = NULL;
    for (size_t i = 0; i < NSIGNALS; i++) {
        if (contained_signals[i] == sig) {
            prev = &previous[i];
        }
    }
    if (prev != NULL && (prev->sa_flags & SA_SIGINFO)) {
        if (prev->sa_sigaction) {
            prev->sa_sigaction(sig, si, uc);
            return;
        }
    } else if (prev != NULL && prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
        prev->sa_handler(sig);
        return;
    }
    /* Default action: uninstall ourselves; returning re-executes the faulting
     * instruction, which now kills the process with SIGSEGV as it should. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
}

/* Where a recovered fault resumes, after sigreturn: back into the guarded call. */
__attribute__((noreturn, noinline, used)) static void landing(void) {
    void **jb = jump_to;
    jump_to = NULL;
    __builtin_longjmp(jb, 1);
}

static void on_fault(int sig, siginfo_t *si, void *ucv) {
    void **jb = armed;
    int segv = sig == SIGSEGV;
    int in_arena = segv && buffet_cnf_in_arena((uintptr_t)si->si_addr);
    if (jb != NULL &&
        (armed_all || (segv && (si->si_code == SEGV_PKUERR ||
                                (si->si_code == SEGV_ACCERR && in_arena))))) {
        armed = NULL;
        jump_to = jb;
        last_fault.signo = sig;
        last_fault.code = si->si_code;
        last_fault.pkey = segv && si->si_code == SEGV_PKUERR ? (int32_t)si->si_pkey : -1;
        last_fault.in_arena = in_arena;
        last_fault.addr = (uint64_t)(uintptr_t)si->si_addr;
        /* Resume in `landing` as if the faulting code had called it: below its stack
         * pointer and the 128-byte red zone, 16-byte aligned before the call's return
         * address (which landing never uses). */
        ucontext_t *uc = ucv;
        uintptr_t sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
        sp = ((sp - 256) & ~(uintptr_t)15) - 8;
        uc->uc_mcontext.gregs[REG_RSP] = (greg_t)sp;
        uc->uc_mcontext.gregs[REG_RIP] = (greg_t)(uintptr_t)landing;
        return;
    }
    chain(sig, si, ucv);
}

static void free_altstack(void *mem) {
    stack_t off;
    memset(&off, 0, sizeof off);
    off.ss_flags = SS_DISABLE;
    sigaltstack(&off, NULL);
    munmap(mem, ALTSTACK_BYTES);
}

static void install(void) {
    if ((install_error = pthread_key_create(&altstack_key, free_altstack)) != 0) {
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < NSIGNALS; i++) {
        if (sigaction(contained_signals[i], &sa, &previous[i]) != 0) {
            install_error = errno;
            return;
        }
    }
}

/* Installs the fault handler once per process. 0, or an errno value. */
int buffet_guard_install(void) {
    pthread_once(&install_once, install);
    return install_error;
}

/* Gives this thread an alternate signal stack unless it has one (Rust threads usually
 * do): the handler must run even if the fault was a stack overflow. */
static void ensure_altstack(void) {
    stack_t cur;
    altstack_ready = 1;
    if (sigaltstack(NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE)) {
        return;
    }
    void *mem = mmap(NULL, ALTSTACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (mem == MAP_FAILED) {
        return;
    }
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_sp = mem;
    ss.ss_size = ALTSTACK_BYTES;
    if (sigaltstack(&ss, NULL) != 0) {
        munmap(mem, ALTSTACK_BYTES);
        return;
    }
    pthread_setspecific(altstack_key, mem);
}

/* The guarded calls. Each returns 0 when the NF's function returned, 1 when a tenant
 * fault was recovered (then buffet_guard_last_fault says what and where). `all` non-zero:
 * recover from every fault of the call (trusted-native), not only a tenant's. */

typedef buffet_verdict (*pkt_fn)(struct buffet_pkt *, void *, size_t);
typedef int (*init_fn)(const char *, void *, size_t, char *, size_t);
typedef size_t (*summary_fn)(const void *, size_t, struct buffet_counter *, size_t);

#define GUARDED(call)                                                                       \
    do {                                                                                    \
        void *jb[5];                                                                        \
        if (__builtin_expect(!altstack_ready, 0)) {                                         \
            ensure_altstack();                                                              \
        }                                                                                   \
        if (__builtin_setjmp(jb) != 0) {                                                    \
            /* Back from `landing`: PKRU and the signal mask were restored by sigreturn. */ \
            return 1;                                                                       \
        }                                                                                   \
        armed_all = all;                                                                    \
        armed = jb;                                                                         \
        __atomic_signal_fence(__ATOMIC_SEQ_CST);                                            \
        call;                                                                               \
        __atomic_signal_fence(__ATOMIC_SEQ_CST);                                            \
        armed = NULL;                                                                       \
        return 0;                                                                           \
    } while (0)

int buffet_guard_pkt(int all, pkt_fn f, struct buffet_pkt *pkt, void *state, size_t len,
                     buffet_verdict *verdict) {
    GUARDED(*verdict = f(pkt, state, len));
}

/* A chunk of one tenant's packets under one setjmp: verdicts[i] for pkts[i]. *done is
 * the index of the packet being handled, so after a fault it names the faulting one (the
 * verdicts before it are valid); n when all returned. */
int buffet_guard_batch(int all, pkt_fn f, struct buffet_pkt *pkts, size_t n, void *state,
                       size_t len, buffet_verdict *verdicts, size_t *done) {
    GUARDED(for (size_t i = 0; i < n; i++) {
        *done = i;
        verdicts[i] = f(&pkts[i], state, len);
    } *done = n);
}

int buffet_guard_init(int all, init_fn f, const char *policy, void *state, size_t len,
                      char *err, size_t errlen, int *rc) {
    GUARDED(*rc = f(policy, state, len, err, errlen));
}

int buffet_guard_summary(int all, summary_fn f, const void *state, size_t len,
                         struct buffet_counter *out, size_t max, size_t *n) {
    GUARDED(*n = f(state, len, out, max));
}

/* What the last recovered fault on this thread was. */
void buffet_guard_last_fault(struct buffet_fault *out) { *out = last_fault; }
