/*
 * guard.c — fault containment for C NFs: run a tenant's C code so that a fault, a stack
 * overflow, a forbidden system call or a runaway loop returns to the caller instead of
 * killing or hanging the process.
 *
 * How: each guarded call does a setjmp (GCC's __builtin_setjmp: a few stores, about 1 ns,
 * against 2.5 ns for glibc's sigsetjmp), arms a thread-local pointer to its buffer and
 * calls the NF's function — for packets, buffet_guard_batch loops over a whole chunk of
 * one tenant's group in C, so one setjmp covers up to 32 packets. The NF runs on the
 * thread's own NF stack (NF_STACK_BYTES, mapped once per thread), below which lies a
 * PROT_NONE guard of NF_GUARD_BYTES: unbounded recursion or a huge alloca hits the guard
 * instead of whatever memory lies below. Our handlers run on a per-thread alternate signal
 * stack (SA_ONSTACK), so they run even when the NF's stack is exhausted.
 *
 * The SIGSEGV handler recovers only if the faulting thread is armed — it is inside an NF
 * call — and the fault is one a tenant causes:
 *   - si_code == SEGV_PKUERR (4): the access hit a region whose protection key this
 *     thread's PKRU closes: another tenant's region;
 *   - si_code == SEGV_ACCERR inside a tenant arena: a guard page between regions, or free
 *     arena space (buffet_cnf_in_arena, atomic loads only, answers that);
 *   - an access to the guard below the NF stack: a stack overflow.
 * A SIGSYS from seccomp (SYS_SECCOMP: the worker thread's filter trapped a system call, see
 * buffet_seccomp_confine) inside an NF call is a tenant's fault too. Without contain_all,
 * every other SIGSEGV goes to the handler that was installed before ours (Rust's stack
 * overflow handler, or the default action).
 *
 * A call armed with contain_all (every NF call at the mpk and trusted-native levels, and
 * every buffet_state_init, whose crash refuses the admission) recovers from every SIGSEGV,
 * SIGBUS, SIGFPE and SIGILL its thread raises inside the call: a NULL write, a wild
 * pointer, a division by zero quarantine the tenant instead of killing the process.
 * Outside any guarded call every signal goes to the previous handler, so the framework's
 * own bugs still crash.
 *
 * Watchdog: a call armed with a budget starts (once, then leaves running) a POSIX timer on
 * the thread's CPU-time clock, SIGEV_THREAD_ID to this thread, firing every `budget` of CPU
 * time with BUFFET_WATCHDOG_SIGNAL. Each call increments a thread-local call counter; a
 * tick that finds the thread inside the same call as at the previous tick interrupts it:
 * a call is stopped after between one and two budgets of CPU time, and no call pays a
 * system call to arm or disarm anything. A tick that finds the thread idle for a whole
 * interval stops the timer (the next guarded call starts it again). CPU time, not wall
 * time: a worker descheduled by the OS is not mistaken for a runaway NF.
 *
 * Recovering does not jump out of the handler: it redirects the interrupted context to a
 * landing pad (`landing`, near the top of the thread's NF stack, whose frames are being
 * abandoned; or, without an NF stack, below the faulting frame and its red zone) and
 * returns. The kernel's sigreturn then restores what the handler must not leave behind:
 * the signal mask (the signal unblocked again) and PKRU — a signal handler runs with the
 * kernel's default PKRU, and a longjmp out of it would keep that; sigreturn puts back the
 * PKRU of the interrupted context, which is the one the guarded call started with (the
 * tenant's key open). The landing pad then longjmps to the guarded call, which returns 1.
 * The frames that longjmp skips are the NF's own C frames and buffet_run_on_stack only:
 * no Rust frame sits between the setjmp and the NF.
 *
 * What this does not make safe: NF code that faults or is interrupted while holding a
 * lock of its own or of libc (a longjmp leaves it held), NF code that calls back into
 * Rust, and NF code that jumps into libc's code to block BUFFET_WATCHDOG_SIGNAL with
 * rt_sigprocmask or disarm the timer (on a confined thread, the seccomp filter traps the
 * NF's own raw system calls, not libc's; see buffet_seccomp_confine).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "buffet.h"

#ifndef SEGV_PKUERR
#define SEGV_PKUERR 4
#endif
#ifndef SYS_SECCOMP
#define SYS_SECCOMP 1
#endif

/* Where a recovered fault happened (struct buffet_fault.place). */
#define PLACE_OTHER 0
#define PLACE_ARENA 1     /* a tenant arena: guard page or free space */
#define PLACE_NF_STACK 2  /* the guard below the thread's NF stack */
#define PLACE_WATCHDOG 3  /* not a fault: the watchdog interrupted the call */

/* Filled by the handler when it recovers a fault. Mirrored in src/lib.rs (RawFault). */
struct buffet_fault {
    int32_t signo; /* SIGSEGV, SIGSYS, the watchdog signal, or (contain_all) SIGBUS/FPE/ILL */
    int32_t code;  /* si_code: SEGV_PKUERR, SEGV_ACCERR, SEGV_MAPERR, FPE_INTDIV, ... */
    int32_t aux;   /* si_pkey for SEGV_PKUERR, the system call number for SIGSYS, else -1 */
    int32_t place; /* PLACE_* */
    uint64_t addr; /* the faulting address; the budget in ns for the watchdog */
};

/* Exported by the Rust side (buffet_memory::in_tenant_arena): async-signal-safe. */
extern int buffet_cnf_in_arena(uintptr_t addr);

/* Calls fn(arg) with the stack pointer at `top` (16-byte aligned) and returns on the
 * caller's stack. Defined in assembly below. */
__attribute__((visibility("hidden"))) void buffet_run_on_stack(void (*fn)(void *), void *arg,
                                                                void *top);
__asm__(".text\n"
        ".p2align 4\n"
        ".globl buffet_run_on_stack\n"
        ".hidden buffet_run_on_stack\n"
        ".type buffet_run_on_stack, @function\n"
        "buffet_run_on_stack:\n"
        "    push %rbp\n"
        "    mov %rsp, %rbp\n"
        "    mov %rdx, %rsp\n"
        "    mov %rdi, %rax\n"
        "    mov %rsi, %rdi\n"
        "    call *%rax\n"
        "    mov %rbp, %rsp\n"
        "    pop %rbp\n"
        "    ret\n"
        ".size buffet_run_on_stack, .-buffet_run_on_stack\n");

#define TLS __thread __attribute__((tls_model("initial-exec")))

/* The setjmp buffer of the guarded call running on this thread, or NULL. */
static TLS void **armed;
/* Whether that call recovers from every fault (trusted-native, init), not only a tenant's. */
static TLS int armed_all;
/* Its watchdog budget in ns (0: none). */
static TLS uint64_t armed_budget;
/* Set by the handler for the landing pad: where to jump back to. */
static TLS void **jump_to;
/* The last fault the handler recovered on this thread. */
static TLS struct buffet_fault last_fault;
static TLS int thread_ready;
/* The NF stack: [nf_guard_lo, nf_stack_lo) is the guard, nf_stack_top its top. */
static TLS uintptr_t nf_guard_lo, nf_stack_lo, nf_stack_top;
/* Watchdog: calls started on this thread, the count the last tick saw, the timer. */
static TLS uint64_t call_gen, seen_gen;
static TLS timer_t wd_timer;
static TLS int wd_created, wd_running;
static TLS uint64_t wd_interval_ns;

/* The signals the fault handler is installed for, and the handlers that were there
 * before. */
static const int contained_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGSYS};
#define NSIGNALS (sizeof contained_signals / sizeof contained_signals[0])
static struct sigaction previous[NSIGNALS];
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_error;
static pthread_key_t thread_key;

#define ALTSTACK_BYTES (64 * 1024)
#define NF_STACK_BYTES (1024 * 1024)
#define NF_GUARD_BYTES (64 * 1024 * 1024)
/* The watchdog's signal: a real-time signal nothing else in Buffet uses. */
#define BUFFET_WATCHDOG_SIGNAL (SIGRTMAX - 2)

static TLS void *own_altstack;

/* Hands a fault that is not ours to whoever handled the signal before us. */
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
     * instruction, which now kills the process with the signal as it should. A trapped
     * system call is not re-executed: raise the signal again, now with its default action. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    if (sig == SIGSYS) {
        syscall(SYS_tgkill, getpid(), gettid(), SIGSYS);
    }
}

/* Where a recovered fault resumes, after sigreturn: back into the guarded call. */
__attribute__((noreturn, noinline, used)) static void landing(void) {
    void **jb = jump_to;
    jump_to = NULL;
    __builtin_longjmp(jb, 1);
}

/* Disarms the guarded call and redirects the interrupted context to `landing`. */
static void recover(void **jb, int sig, int code, int aux, int place, uint64_t addr,
                    ucontext_t *uc) {
    armed = NULL;
    jump_to = jb;
    last_fault.signo = sig;
    last_fault.code = code;
    last_fault.aux = aux;
    last_fault.place = place;
    last_fault.addr = addr;
    uintptr_t sp;
    if (nf_stack_top != 0) {
        /* The NF's frames are abandoned: land near the top of its stack. */
        sp = ((nf_stack_top - 512) & ~(uintptr_t)15) - 8;
    } else {
        /* Below the interrupted stack pointer and the 128-byte red zone, 16-byte aligned
         * before the call's return address (which landing never uses). */
        sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
        sp = ((sp - 256) & ~(uintptr_t)15) - 8;
    }
    uc->uc_mcontext.gregs[REG_RSP] = (greg_t)sp;
    uc->uc_mcontext.gregs[REG_RIP] = (greg_t)(uintptr_t)landing;
}

static void on_fault(int sig, siginfo_t *si, void *ucv) {
    void **jb = armed;
    int segv = sig == SIGSEGV;
    uintptr_t addr = (uintptr_t)si->si_addr;
    int place = PLACE_OTHER;
    if (segv && nf_guard_lo != 0 && addr >= nf_guard_lo && addr < nf_stack_lo) {
        place = PLACE_NF_STACK;
    } else if (segv && buffet_cnf_in_arena(addr)) {
        place = PLACE_ARENA;
    }
    int tenants = (segv && (si->si_code == SEGV_PKUERR ||
                            (si->si_code == SEGV_ACCERR && place != PLACE_OTHER))) ||
                  (sig == SIGSYS && si->si_code == SYS_SECCOMP);
    if (jb != NULL && (armed_all || tenants)) {
        int aux = -1;
        if (segv && si->si_code == SEGV_PKUERR) {
            aux = (int32_t)si->si_pkey;
        } else if (sig == SIGSYS) {
            aux = si->si_syscall;
            addr = (uintptr_t)si->si_call_addr;
        }
        recover(jb, sig, si->si_code, aux, place, (uint64_t)addr, ucv);
        return;
    }
    chain(sig, si, ucv);
}

static void stop_timer(void) {
    struct itimerspec off;
    memset(&off, 0, sizeof off);
    timer_settime(wd_timer, 0, &off, NULL);
    wd_running = 0;
}

/* A watchdog tick: interrupt the call if it is the one the previous tick saw. */
static void on_tick(int sig, siginfo_t *si, void *ucv) {
    if (si->si_code != SI_TIMER || !wd_created) {
        return;
    }
    void **jb = armed;
    uint64_t gen = call_gen;
    if (jb == NULL) {
        if (gen == seen_gen) {
            stop_timer(); /* idle for a whole interval */
        }
        seen_gen = gen;
        return;
    }
    if (gen != seen_gen || armed_budget == 0) {
        seen_gen = gen;
        return;
    }
    recover(jb, sig, SI_TIMER, -1, PLACE_WATCHDOG, armed_budget, ucv);
}

/* Frees what prepare_thread set up, when the thread exits. */
static void release_thread(void *unused) {
    (void)unused;
    if (wd_created) {
        timer_delete(wd_timer);
        wd_created = 0;
        wd_running = 0;
    }
    if (nf_guard_lo != 0) {
        munmap((void *)nf_guard_lo, NF_GUARD_BYTES + NF_STACK_BYTES);
        nf_guard_lo = nf_stack_lo = nf_stack_top = 0;
    }
    if (own_altstack != NULL) {
        stack_t off;
        memset(&off, 0, sizeof off);
        off.ss_flags = SS_DISABLE;
        sigaltstack(&off, NULL);
        munmap(own_altstack, ALTSTACK_BYTES);
        own_altstack = NULL;
    }
}

static void install(void) {
    if ((install_error = pthread_key_create(&thread_key, release_thread)) != 0) {
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    /* A watchdog tick must not interrupt the fault handler: recovering from there would
     * redirect the handler's own context and skip its sigreturn. */
    sigaddset(&sa.sa_mask, BUFFET_WATCHDOG_SIGNAL);
    for (size_t i = 0; i < NSIGNALS; i++) {
        if (sigaction(contained_signals[i], &sa, &previous[i]) != 0) {
            install_error = errno;
            return;
        }
    }
    struct sigaction tick;
    memset(&tick, 0, sizeof tick);
    tick.sa_sigaction = on_tick;
    tick.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&tick.sa_mask);
    if (sigaction(BUFFET_WATCHDOG_SIGNAL, &tick, NULL) != 0) {
        install_error = errno;
    }
}

/* Installs the handlers once per process. 0, or an errno value. */
int buffet_guard_install(void) {
    pthread_once(&install_once, install);
    return install_error;
}

/* Gives this thread what guarded calls need, once: an alternate signal stack unless it has
 * one (Rust threads usually do: the handler must run even if the stack is exhausted), the
 * NF stack with its guard, and the watchdog timer. 0, or an errno value; on failure the
 * calls still work, on the thread's own stack and without a watchdog. */
int buffet_guard_prepare_thread(void) {
    int err = 0;
    if (thread_ready) {
        return 0;
    }
    thread_ready = 1;
    pthread_once(&install_once, install);
    pthread_setspecific(thread_key, &thread_ready);
    stack_t cur;
    if (sigaltstack(NULL, &cur) != 0 || (cur.ss_flags & SS_DISABLE)) {
        void *mem = mmap(NULL, ALTSTACK_BYTES, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem != MAP_FAILED) {
            stack_t ss;
            memset(&ss, 0, sizeof ss);
            ss.ss_sp = mem;
            ss.ss_size = ALTSTACK_BYTES;
            if (sigaltstack(&ss, NULL) != 0) {
                err = errno;
                munmap(mem, ALTSTACK_BYTES);
            } else {
                own_altstack = mem;
            }
        } else {
            err = errno;
        }
    }
    void *stack = mmap(NULL, NF_GUARD_BYTES + NF_STACK_BYTES, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stack != MAP_FAILED) {
        uintptr_t lo = (uintptr_t)stack;
        if (mprotect((void *)(lo + NF_GUARD_BYTES), NF_STACK_BYTES, PROT_READ | PROT_WRITE) ==
            0) {
            nf_guard_lo = lo;
            nf_stack_lo = lo + NF_GUARD_BYTES;
            nf_stack_top = nf_stack_lo + NF_STACK_BYTES;
        } else {
            err = errno;
            munmap(stack, NF_GUARD_BYTES + NF_STACK_BYTES);
        }
    } else {
        err = errno;
    }
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = BUFFET_WATCHDOG_SIGNAL;
    sev._sigev_un._tid = gettid();
    if (timer_create(CLOCK_THREAD_CPUTIME_ID, &sev, &wd_timer) == 0) {
        wd_created = 1;
    } else {
        err = errno;
    }
    return err;
}

/* Starts (or re-times) this thread's watchdog timer: a tick every `ns` of CPU time. */
static void start_timer(uint64_t ns) {
    if (!wd_created) {
        return;
    }
    struct itimerspec it;
    it.it_value.tv_sec = (time_t)(ns / 1000000000u);
    it.it_value.tv_nsec = (long)(ns % 1000000000u);
    it.it_interval = it.it_value;
    seen_gen = call_gen - 1; /* the running call is new to the first tick */
    if (timer_settime(wd_timer, 0, &it, NULL) == 0) {
        wd_running = 1;
        wd_interval_ns = ns;
    }
}

/* The guarded calls. Each returns 0 when the NF's function returned, 1 when a fault was
 * recovered or the watchdog interrupted it (then buffet_guard_last_fault says what and
 * where). `all` non-zero: recover from every fault of the call, not only a tenant's.
 * `budget_ns` non-zero: the watchdog's budget for the call. */

typedef buffet_verdict (*pkt_fn)(struct buffet_pkt *, void *, size_t);
typedef int (*init_fn)(const char *, void *, size_t, char *, size_t);
typedef size_t (*summary_fn)(const void *, size_t, struct buffet_counter *, size_t);

__attribute__((noinline)) static int guarded(int all, uint64_t budget_ns, void (*thunk)(void *),
                                             void *arg) {
    void *jb[5];
    if (__builtin_expect(!thread_ready, 0)) {
        buffet_guard_prepare_thread();
    }
    if (__builtin_setjmp(jb) != 0) {
        /* Back from `landing`: PKRU and the signal mask were restored by sigreturn. */
        return 1;
    }
    call_gen++;
    armed_all = all;
    armed_budget = budget_ns;
    armed = jb;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    /* After `armed`: a tick that stops the timer can only come before this check. */
    if (budget_ns != 0 && (!wd_running || wd_interval_ns != budget_ns)) {
        start_timer(budget_ns);
    }
    if (nf_stack_top != 0) {
        buffet_run_on_stack(thunk, arg, (void *)nf_stack_top);
    } else {
        thunk(arg);
    }
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    armed = NULL;
    return 0;
}

struct pkt_call {
    pkt_fn f;
    struct buffet_pkt *pkts;
    size_t n;
    void *state;
    size_t len;
    buffet_verdict *verdicts;
    size_t *done;
};

static void pkt_thunk(void *p) {
    struct pkt_call *c = p;
    for (size_t i = 0; i < c->n; i++) {
        *c->done = i;
        c->verdicts[i] = c->f(&c->pkts[i], c->state, c->len);
    }
    *c->done = c->n;
}

/* A chunk of one tenant's packets under one setjmp: verdicts[i] for pkts[i]. *done is
 * the index of the packet being handled, so after a fault it names the faulting one (the
 * verdicts before it are valid); n when all returned. */
int buffet_guard_batch(int all, uint64_t budget_ns, pkt_fn f, struct buffet_pkt *pkts, size_t n,
                       void *state, size_t len, buffet_verdict *verdicts, size_t *done) {
    struct pkt_call c = {f, pkts, n, state, len, verdicts, done};
    return guarded(all, budget_ns, pkt_thunk, &c);
}

struct init_call {
    init_fn f;
    const char *policy;
    void *state;
    size_t len;
    char *err;
    size_t errlen;
    int *rc;
};

static void init_thunk(void *p) {
    struct init_call *c = p;
    *c->rc = c->f(c->policy, c->state, c->len, c->err, c->errlen);
}

int buffet_guard_init(int all, uint64_t budget_ns, init_fn f, const char *policy, void *state,
                      size_t len, char *err, size_t errlen, int *rc) {
    struct init_call c = {f, policy, state, len, err, errlen, rc};
    return guarded(all, budget_ns, init_thunk, &c);
}

struct summary_call {
    summary_fn f;
    const void *state;
    size_t len;
    struct buffet_counter *out;
    size_t max;
    size_t *n;
    const struct summary_names *names;
};

/* Copies the NUL-terminated string at `src` into dst[0 .. cap): its length, or
 * BUFFET_NAME_NULL for a null pointer, BUFFET_NAME_LONG when no NUL comes within cap - 1
 * bytes. Runs inside the guarded call: a pointer the NF handed over is read with the NF's
 * own access rights, and an unreadable one is the NF's fault, contained like any other. */
#define BUFFET_NAME_NULL (-1)
#define BUFFET_NAME_LONG (-2)
static int32_t copy_name(const char *src, char *dst, size_t cap) {
    if (src == NULL) {
        return BUFFET_NAME_NULL;
    }
    const volatile char *s = (const volatile char *)src;
    for (size_t i = 0; i < cap; i++) {
        char ch = s[i];
        dst[i] = ch;
        if (ch == 0) {
            return (int32_t)i;
        }
    }
    dst[cap - 1] = 0;
    return BUFFET_NAME_LONG;
}

struct summary_names {
    char *buf; /* max * cap bytes: counter i's name at buf + i * cap */
    size_t cap;
    int32_t *lens; /* copy_name's result per counter */
};

static void summary_thunk(void *p) {
    struct summary_call *c = p;
    size_t n = c->f(c->state, c->len, c->out, c->max);
    *c->n = n;
    const struct summary_names *names = c->names;
    if (n > c->max) {
        n = c->max;
    }
    /* The names are read here, still inside the guarded call, never by the caller. */
    for (size_t i = 0; i < n; i++) {
        names->lens[i] = copy_name(c->out[i].name, names->buf + i * names->cap, names->cap);
    }
}

/* `names`: where the counters' names are copied (see copy_name), inside the call. */
int buffet_guard_summary(int all, uint64_t budget_ns, summary_fn f, const void *state, size_t len,
                         struct buffet_counter *out, size_t max, size_t *n, char *name_buf,
                         size_t name_cap, int32_t *name_lens) {
    struct summary_names names = {name_buf, name_cap, name_lens};
    struct summary_call c = {f, state, len, out, max, n, &names};
    return guarded(all, budget_ns, summary_thunk, &c);
}

/* The functions an NF answers at load: each through the same containment as its other
 * calls, so a crash or an endless loop there refuses the NF instead of ending the
 * process. */
typedef size_t (*size_fn)(void);
typedef uint32_t (*u32_fn)(void);
typedef const char *(*name_fn)(void);

struct load_call {
    size_fn size_f;
    u32_fn u32_f;
    name_fn name_f;
    size_t *size_out;
    uint32_t *u32_out;
    char *name_buf;
    size_t name_cap;
    int32_t *name_len;
};

static void size_thunk(void *p) {
    struct load_call *c = p;
    *c->size_out = c->size_f();
}

static void u32_thunk(void *p) {
    struct load_call *c = p;
    *c->u32_out = c->u32_f();
}

static void name_thunk(void *p) {
    struct load_call *c = p;
    *c->name_len = copy_name(c->name_f(), c->name_buf, c->name_cap);
}

int buffet_guard_size(int all, uint64_t budget_ns, size_fn f, size_t *out) {
    struct load_call c = {.size_f = f, .size_out = out};
    return guarded(all, budget_ns, size_thunk, &c);
}

int buffet_guard_u32(int all, uint64_t budget_ns, u32_fn f, uint32_t *out) {
    struct load_call c = {.u32_f = f, .u32_out = out};
    return guarded(all, budget_ns, u32_thunk, &c);
}

/* buffet_nf_name(), its string copied into buf[0 .. cap) inside the call (copy_name). */
int buffet_guard_name(int all, uint64_t budget_ns, name_fn f, char *buf, size_t cap,
                      int32_t *len) {
    struct load_call c = {.name_f = f, .name_buf = buf, .name_cap = cap, .name_len = len};
    return guarded(all, budget_ns, name_thunk, &c);
}

/* What the last recovered fault on this thread was. */
void buffet_guard_last_fault(struct buffet_fault *out) { *out = last_fault; }

/*
 * seccomp: confines the calling thread (only it: no SECCOMP_FILTER_FLAG_TSYNC) for running
 * NF code. The filter traps (SECCOMP_RET_TRAP: SIGSYS, which the fault handler turns into a
 * contained fault inside an NF call, and which kills the process outside one):
 *   - mmap, mprotect and pkey_mprotect with PROT_EXEC (no new executable memory);
 *   - pkey_alloc and pkey_free (no key games; pkey_mprotect without PROT_EXEC stays
 *     allowed: the key cache re-tags regions from the worker thread);
 *   - clone, clone3, fork, vfork, execve, execveat (no threads, no processes);
 *   - kill, tkill, tgkill, exit_group (no signals to anyone, no ending the process);
 *   - ptrace, process_vm_readv, process_vm_writev;
 *   - rt_sigaction (the handlers that contain faults stay in place);
 *   - any x32 system call, and kills the process for a non-x86-64 one;
 *   - and every other system call whose `syscall` instruction is not in libc's or the
 *     vDSO's code: the worker's own calls all go through libc (Rust's std included), while
 *     an NF's raw `syscall` instruction is in the NF's code — so a raw exit, munmap, mmap,
 *     rt_sigprocmask or timer_settime from the NF traps too. (An NF that jumps into libc's
 *     code at an address it computed passes this check; the list above still holds then.)
 * The thread must not create threads or processes after this. Sets PR_SET_NO_NEW_PRIVS on
 * the thread (required without CAP_SYS_ADMIN). Prepares the thread (NF stack, alternate
 * signal stack, watchdog timer) first. 0, or an errno value.
 */
#include <dlfcn.h>
#include <link.h>
#include <sys/auxv.h>

#define MAX_TRUSTED_RANGES 8

struct code_ranges {
    uintptr_t libc_fn;   /* an address in libc's code */
    uintptr_t vdso_base; /* the vDSO's load address (AT_SYSINFO_EHDR), or 0 */
    size_t n;
    uintptr_t lo[MAX_TRUSTED_RANGES], hi[MAX_TRUSTED_RANGES];
};

static void add_range(struct code_ranges *r, uintptr_t lo, uintptr_t hi) {
    /* The filter compares the two 32-bit halves: split at 4 GiB boundaries. */
    while (lo < hi && r->n < MAX_TRUSTED_RANGES) {
        uintptr_t cut = (lo | 0xffffffffu) + 1;
        uintptr_t end = hi < cut ? hi : cut;
        r->lo[r->n] = lo;
        r->hi[r->n] = end;
        r->n++;
        lo = end;
    }
}

/* Collects the executable segments of libc and of the vDSO. */
static int find_code(struct dl_phdr_info *info, size_t size, void *data) {
    struct code_ranges *r = data;
    (void)size;
    int is_vdso = r->vdso_base != 0 && info->dlpi_phdr != NULL &&
                  (uintptr_t)info->dlpi_addr + info->dlpi_phdr[0].p_vaddr -
                          info->dlpi_phdr[0].p_offset ==
                      r->vdso_base;
    int is_libc = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && r->libc_fn >= lo &&
            r->libc_fn < lo + ph->p_memsz) {
            is_libc = 1;
        }
    }
    if (!is_libc && !is_vdso) {
        return 0;
    }
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            uintptr_t lo = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
            add_range(r, lo, lo + ph->p_memsz);
        }
    }
    return 0;
}

#define ALLOW BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
#define TRAP BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP)
#define ARG_LO(n) (offsetof(struct seccomp_data, args) + 8 * (n))
#define IP_LO (offsetof(struct seccomp_data, instruction_pointer))
#define IP_HI (offsetof(struct seccomp_data, instruction_pointer) + 4)
/* If nr == `nr`, go to the instruction `to` ahead (counted after this one). */
#define IS(nr, to) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), (to), 0)

int buffet_seccomp_confine(void) {
    buffet_guard_prepare_thread();
    struct code_ranges code;
    memset(&code, 0, sizeof code);
    code.libc_fn = (uintptr_t)&getpid;
    code.vdso_base = (uintptr_t)getauxval(AT_SYSINFO_EHDR);
    dl_iterate_phdr(find_code, &code);
    if (code.n == 0) {
        return ENOENT; /* libc's code not found: the caller check would trap everything */
    }
    struct sock_filter filter[32 + 6 * MAX_TRUSTED_RANGES] = {
        /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        /* 2 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        /* 3 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        /* 4 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 20, 0), /* x32: trap */
        /* 5 */ IS(__NR_mmap, 20),
        /* 6 */ IS(__NR_mprotect, 19),
        /* 7 */ IS(__NR_pkey_mprotect, 18),
        /* 8 */ IS(__NR_pkey_alloc, 16),
        /* 9 */ IS(__NR_pkey_free, 15),
        /* 10 */ IS(__NR_clone, 14),
        /* 11 */ IS(__NR_clone3, 13),
        /* 12 */ IS(__NR_fork, 12),
        /* 13 */ IS(__NR_vfork, 11),
        /* 14 */ IS(__NR_execve, 10),
        /* 15 */ IS(__NR_execveat, 9),
        /* 16 */ IS(__NR_kill, 8),
        /* 17 */ IS(__NR_tkill, 7),
        /* 18 */ IS(__NR_tgkill, 6),
        /* 19 */ IS(__NR_exit_group, 5),
        /* 20 */ IS(__NR_ptrace, 4),
        /* 21 */ IS(__NR_process_vm_readv, 3),
        /* 22 */ IS(__NR_process_vm_writev, 2),
        /* 23 */ IS(__NR_rt_sigaction, 1),
        /* 24 */ BPF_JUMP(BPF_JMP | BPF_JA, 4, 0, 0), /* to the caller check (29) */
        /* 25 */ TRAP,
        /* 26: mmap, mprotect, pkey_mprotect: the prot argument (2) */
        /* 26 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(2)),
        /* 27 */ BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
        /* 28 */ TRAP,
        /* 29.. the caller check: allowed only from libc's or the vDSO's code */
    };
    size_t at = 29;
    for (size_t i = 0; i < code.n; i++) {
        /* Six instructions per range; a miss goes on to the next range. */
        filter[at++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, IP_HI);
        filter[at++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K,
                                                    (uint32_t)(code.lo[i] >> 32), 0, 4);
        filter[at++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, IP_LO);
        filter[at++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K,
                                                    (uint32_t)code.lo[i], 0, 2);
        /* hi is exclusive; a range ending at 4 GiB has hi's low half 0: always below. */
        filter[at++] = (struct sock_filter)BPF_JUMP(
            BPF_JMP | BPF_JGE | BPF_K, (uint32_t)code.hi[i], (uint32_t)code.hi[i] == 0 ? 0 : 1,
            0);
        filter[at++] = (struct sock_filter)ALLOW;
    }
    filter[at++] = (struct sock_filter)TRAP;
    struct sock_fprog prog = {
        .len = (unsigned short)at,
        .filter = filter,
    };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        return errno;
    }
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
        return errno;
    }
    return 0;
}
