/*
 * What a lock costs ET at batch 1 on this machine: the floor under `daqflow bench et`'s batch-1
 * figure (docs/performance.md, "What batch 1 is made of").
 *
 * Two processes share one mapping. Events circulate as in ET with one producer and one consumer
 * on one station: the producer takes a free event from one queue (GrandCentral's), writes its
 * descriptor and puts it into another (the station's); the consumer takes it from there, reads
 * the descriptor and puts it back into the first. One event per operation (batch 1), so every
 * event costs each side one pop and one push. The producer writes an event's descriptor (its
 * length, as ET's producer does), the consumer reads it. Every lock is taken the same way: a
 * look at the queue without the lock, then tries, each after a look at the lock word (or a
 * failed try) and a CPU pause. The queues are the same rings with five ways of guarding them:
 *
 *   lock-free   single-producer single-consumer rings, no lock (the rings alone: none of ET's
 *               other shared lines, its owner marks, counts and sleepers' word)
 *   spin        a compare-and-swap lock released by a plain store (no sleeping, not robust)
 *   futex       a compare-and-swap lock released by an atomic exchange (what a lock that lets
 *               waiters sleep must do to see them; here nobody sleeps, so it is an upper bound
 *               for such a lock; not robust)
 *   pthread     glibc's process-shared mutex (not robust)
 *   robust      glibc's process-shared robust mutex (what daqflow's ET and Jefferson Lab's use)
 *
 * and two more that also keep an owner word per event (where it is: in a queue or held by a
 * side, as ET's owners) and return the consumer's events to the free list in groups of 32, as
 * daqflow's ET does:
 *
 *   robust-et   the robust mutex, the owner words written under it (daqflow's ET, layout 3)
 *   owner-cas   no lock: the owner word is the authority. A slot is one 64-bit word, its
 *               position and the event (or "empty"), filled and emptied by compare-and-swap;
 *               a pusher marks its event "being pushed", fills a slot, then marks it queued; a
 *               popper claims an event by compare-and-swap on its owner (queued -> held) and only
 *               then empties the slot, and a slot whose event is no longer queued there is stale
 *               and emptied by whoever passes. Whatever the point at which a process dies, each
 *               event is where its owner word says (docs/performance.md, "A queue without a
 *               lock").
 *   split-id    two compare-and-swap locks per queue, one for pushers and one for poppers, each
 *               on a line only its side writes, holding the locker's id (what a recovery would
 *               read instead of glibc's robust list); owner words and slots written plainly
 *   split-slot  split-id's two locks with owner-cas's one-word slots: a popper finds events by
 *               reading the slot at its head (position and event in one word), not the pushers'
 *               tail; owner words and slots written plainly under each side's lock
 *
 *   cc -O2 -o /tmp/et-lock-floor scripts/et-lock-floor.c -lpthread
 *   /tmp/et-lock-floor [SECONDS] [REPETITIONS] [BATCH]   # events/s per way, median of repetitions;
 *                                                        # BATCH (1 to 128): events per pop and push, robust-et on
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#define cpu_pause() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_pause() __asm__ __volatile__("yield")
#else
#define cpu_pause() ((void)0)
#endif

#define CAP 4096
#define POOL 3000
enum way { LOCK_FREE, SPIN, FUTEX, PTHREAD, ROBUST, ROBUST_ET, OWNER_CAS, SPLIT_ID, SPLIT_SLOT, WAYS };
static const char *names[WAYS] = {"lock-free", "spin", "futex", "pthread", "robust", "robust-et", "owner-cas", "split-id", "split-slot"};
#define GROUP 32                        /* robust-et, owner-cas: the consumer's returns */
#define EMPTY 0xFFFFFFu                 /* owner-cas: a slot's "no event" */
#define HELD(side) (0x40000000u + (side)) /* owner words: 0 free list, 1 station, or these */
#define PUSHING(side) (0x60000000u + (side))
#define IS_PUSHING(owner) (((owner) & 0xF0000000u) == PUSHING(0))

struct queue {
    _Alignas(64) _Atomic uint32_t lock;
    _Atomic uint64_t head, tail; /* guarded by the lock, except in LOCK_FREE */
    pthread_mutex_t mutex;
    _Alignas(64) _Atomic uint64_t lf_head; /* LOCK_FREE: the consumer's line */
    _Alignas(64) _Atomic uint64_t lf_tail; /* LOCK_FREE: the producer's line */
    _Alignas(64) uint32_t slot[CAP];
    _Alignas(64) _Atomic uint64_t word[CAP];
    _Alignas(64) _Atomic uint32_t pop_lock; _Atomic uint64_t s_head; /* split-id: poppers' line */
    _Alignas(64) _Atomic uint32_t push_lock; _Atomic uint64_t s_tail; /* split-id: pushers' line */ /* owner-cas: position << 24 | event or EMPTY */
};
struct shared {
    struct queue station, free_list;
    _Alignas(64) _Atomic int stop;
    _Alignas(64) _Atomic uint32_t owner[POOL]; /* robust-et, owner-cas */
    _Alignas(64) uint64_t descriptor[POOL * 8]; /* one line per event */
};

static enum way way;
static int batch = 1; /* robust-et and after: events per pop and push */
static struct shared *sh;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void lock(struct queue *q) {
    if (way >= PTHREAD) {
        while (pthread_mutex_trylock(&q->mutex) != 0)
            cpu_pause();
        return;
    }
    for (;;) {
        uint32_t free = 0;
        if (atomic_compare_exchange_weak_explicit(&q->lock, &free, 1, memory_order_acquire, memory_order_relaxed))
            return;
        while (atomic_load_explicit(&q->lock, memory_order_relaxed))
            cpu_pause();
    }
}

static void unlock(struct queue *q) {
    if (way >= PTHREAD)
        pthread_mutex_unlock(&q->mutex);
    else if (way == FUTEX)
        (void)atomic_exchange_explicit(&q->lock, 0, memory_order_release);
    else
        atomic_store_explicit(&q->lock, 0, memory_order_release);
}

/* One event out of `q`, or -1 if it is empty. `seen` caches the other side's index (LOCK_FREE). */
static int64_t pop(struct queue *q, uint64_t *seen) {
    if (way == LOCK_FREE) {
        uint64_t h = atomic_load_explicit(&q->lf_head, memory_order_relaxed);
        if (h == *seen) {
            *seen = atomic_load_explicit(&q->lf_tail, memory_order_acquire);
            if (h == *seen)
                return -1;
        }
        uint32_t e = q->slot[h % CAP];
        atomic_store_explicit(&q->lf_head, h + 1, memory_order_release);
        return e;
    }
    /* A look without the lock first, as a spinning popper does. */
    if (atomic_load_explicit(&q->head, memory_order_relaxed) == atomic_load_explicit(&q->tail, memory_order_relaxed))
        return -1;
    lock(q);
    int64_t e = -1;
    uint64_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
    if (h != atomic_load_explicit(&q->tail, memory_order_relaxed)) {
        e = q->slot[h % CAP];
        atomic_store_explicit(&q->head, h + 1, memory_order_relaxed);
    }
    unlock(q);
    return e;
}

static void push(struct queue *q, uint32_t e) {
    if (way == LOCK_FREE) {
        uint64_t t = atomic_load_explicit(&q->lf_tail, memory_order_relaxed);
        q->slot[t % CAP] = e;
        atomic_store_explicit(&q->lf_tail, t + 1, memory_order_release);
        return;
    }
    lock(q);
    uint64_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
    q->slot[t % CAP] = e;
    atomic_store_explicit(&q->tail, t + 1, memory_order_relaxed);
    unlock(q);
}

static inline uint64_t word(uint64_t position, uint32_t e) { return position << 24 | e; }

/* robust-et and owner-cas: up to `max` events out of queue `q` (number `qn`) for `side`. */
static void id_lock(_Atomic uint32_t *l, uint32_t id) {
    for (;;) {
        uint32_t free = 0;
        if (atomic_compare_exchange_weak_explicit(l, &free, id, memory_order_acquire, memory_order_relaxed))
            return;
        while (atomic_load_explicit(l, memory_order_relaxed))
            cpu_pause();
    }
}
static int pop_marked(struct queue *q, uint32_t qn, uint32_t side, uint32_t *out, int max) {
    int n = 0;
    if (way == SPLIT_SLOT) {
        uint64_t h = atomic_load_explicit(&q->s_head, memory_order_relaxed);
        uint64_t w0 = atomic_load_explicit(&q->word[h % CAP], memory_order_acquire);
        if (w0 != word(h, w0 & EMPTY) || (w0 & EMPTY) == EMPTY)
            return 0;
        id_lock(&q->pop_lock, side);
        h = atomic_load_explicit(&q->s_head, memory_order_relaxed);
        for (; n < max; h++) {
            uint64_t w = atomic_load_explicit(&q->word[h % CAP], memory_order_acquire);
            uint32_t e = w & EMPTY;
            if (w != word(h, e) || e == EMPTY)
                break;
            atomic_store_explicit(&sh->owner[e], HELD(side), memory_order_relaxed);
            atomic_store_explicit(&q->word[h % CAP], word(h + CAP, EMPTY), memory_order_relaxed);
            out[n++] = e;
        }
        atomic_store_explicit(&q->s_head, h, memory_order_relaxed);
        atomic_store_explicit(&q->pop_lock, 0, memory_order_release);
        return n;
    }
    if (way == SPLIT_ID) {
        uint64_t h = atomic_load_explicit(&q->s_head, memory_order_relaxed);
        uint64_t t = atomic_load_explicit(&q->s_tail, memory_order_acquire);
        if (h == t)
            return 0;
        id_lock(&q->pop_lock, side);
        h = atomic_load_explicit(&q->s_head, memory_order_relaxed);
        t = atomic_load_explicit(&q->s_tail, memory_order_acquire);
        for (; h != t && n < max; h++) {
            out[n] = q->slot[h % CAP];
            atomic_store_explicit(&sh->owner[out[n++]], HELD(side), memory_order_relaxed);
        }
        atomic_store_explicit(&q->s_head, h, memory_order_release);
        atomic_store_explicit(&q->pop_lock, 0, memory_order_release);
        return n;
    }
    if (way == ROBUST_ET) {
        if (atomic_load_explicit(&q->head, memory_order_relaxed) == atomic_load_explicit(&q->tail, memory_order_relaxed))
            return 0;
        lock(q);
        uint64_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
        uint64_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
        for (; h != t && n < max; h++) {
            out[n] = q->slot[h % CAP];
            atomic_store_explicit(&sh->owner[out[n++]], HELD(side), memory_order_relaxed);
        }
        atomic_store_explicit(&q->head, h, memory_order_relaxed);
        unlock(q);
        return n;
    }
    uint64_t h = atomic_load_explicit(&q->lf_head, memory_order_relaxed);
    while (n < max) {
        uint64_t w = atomic_load_explicit(&q->word[h % CAP], memory_order_acquire);
        uint32_t e = w & EMPTY;
        if (w == word(h + CAP, EMPTY)) { /* emptied, the head not yet moved past it: help */
            if (!atomic_compare_exchange_strong(&q->lf_head, &h, h + 1))
                continue; /* h now holds the head another popper moved */
            h++;
            continue;
        }
        if (w != word(h, e) || e == EMPTY)
            break; /* nothing queued at the head (or the head moved on: look again next call) */
        uint32_t o = atomic_load_explicit(&sh->owner[e], memory_order_acquire);
        if (IS_PUSHING(o))
            break; /* its pusher has not marked it queued yet */
        if (o == qn) {
            if (!atomic_compare_exchange_strong_explicit(&sh->owner[e], &o, HELD(side), memory_order_acq_rel, memory_order_relaxed))
                continue; /* another popper took it: look again */
            out[n++] = e;
        }
        /* taken now, or stale (its event is no longer queued here): empty the slot, move on */
        atomic_compare_exchange_strong_explicit(&q->word[h % CAP], &w, word(h + CAP, EMPTY), memory_order_acq_rel, memory_order_relaxed);
        if (!atomic_compare_exchange_strong(&q->lf_head, &h, h + 1))
            continue;
        h++;
    }
    return n;
}

static void push_marked(struct queue *q, uint32_t qn, uint32_t side, const uint32_t *in, int n) {
    if (way == SPLIT_SLOT) {
        id_lock(&q->push_lock, side);
        uint64_t t = atomic_load_explicit(&q->s_tail, memory_order_relaxed);
        for (int i = 0; i < n; i++)
            atomic_store_explicit(&sh->owner[in[i]], qn, memory_order_relaxed);
        for (int i = 0; i < n; i++)
            atomic_store_explicit(&q->word[(t + i) % CAP], word(t + i, in[i]), memory_order_release);
        atomic_store_explicit(&q->s_tail, t + n, memory_order_relaxed);
        atomic_store_explicit(&q->push_lock, 0, memory_order_release);
        return;
    }
    if (way == SPLIT_ID) {
        id_lock(&q->push_lock, side);
        uint64_t t = atomic_load_explicit(&q->s_tail, memory_order_relaxed);
        for (int i = 0; i < n; i++) {
            q->slot[(t + i) % CAP] = in[i];
            atomic_store_explicit(&sh->owner[in[i]], qn, memory_order_relaxed);
        }
        atomic_store_explicit(&q->s_tail, t + n, memory_order_release);
        atomic_store_explicit(&q->push_lock, 0, memory_order_release);
        return;
    }
    if (way == ROBUST_ET) {
        lock(q);
        uint64_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
        for (int i = 0; i < n; i++)
            q->slot[t++ % CAP] = in[i];
        atomic_store_explicit(&q->tail, t, memory_order_relaxed);
        for (int i = 0; i < n; i++)
            atomic_store_explicit(&sh->owner[in[i]], qn, memory_order_relaxed);
        unlock(q);
        return;
    }
    for (int i = 0; i < n; i++)
        atomic_store_explicit(&sh->owner[in[i]], PUSHING(side), memory_order_relaxed);
    uint64_t t = atomic_load_explicit(&q->lf_tail, memory_order_relaxed);
    for (int i = 0; i < n;) {
        uint64_t empty = word(t, EMPTY);
        if (atomic_compare_exchange_strong_explicit(&q->word[t % CAP], &empty, word(t, in[i]), memory_order_acq_rel, memory_order_relaxed))
            i++;
        /* filled now, or by another pusher who has not moved the tail yet: move it, helping */
        if (atomic_compare_exchange_strong(&q->lf_tail, &t, t + 1))
            t++;
    }
    for (int i = 0; i < n; i++)
        atomic_store_explicit(&sh->owner[in[i]], qn, memory_order_release);
}

/* robust-et and owner-cas: the consumer takes one event per call and returns them in groups. It
 * checks that the events come exactly once and in order: the producer wrote 0, 1, 2, ... */
static void consume_marked(struct shared *s) {
    uint32_t e, group[GROUP];
    int kept = 0;
    uint64_t expected = 0;
    while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
        uint32_t got[128];
        int k = pop_marked(&s->station, 1, 2, got, batch);
        for (int j = 0; j < k; j++) {
            e = got[j];
            uint64_t made = *(volatile uint64_t *)&s->descriptor[e * 8]; /* the length, read */
            if (made != expected++) {
                fprintf(stderr, "%s: event %u carries %llu where %llu was due\n", names[way], e,
                        (unsigned long long)made, (unsigned long long)expected - 1);
                atomic_store(&s->stop, 2); /* the producer stops too */
                _exit(1);
            }
            group[kept++] = e;
            if (kept == GROUP) {
                push_marked(&s->free_list, 0, 2, group, kept);
                kept = 0;
            }
        }
        if (k == 0 && kept > 0) {
            push_marked(&s->free_list, 0, 2, group, kept);
            kept = 0;
        }
    }
}

static double measure(double seconds) {
    struct shared *s = mmap(0, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (way == ROBUST || way == ROBUST_ET)
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->station.mutex, &a);
    pthread_mutex_init(&s->free_list.mutex, &a);
    sh = s;
    for (uint32_t i = 0; i < POOL; i++)
        s->free_list.slot[i] = i;
    for (uint64_t i = 0; i < CAP; i++) {
        s->free_list.word[i] = word(i, i < POOL ? (uint32_t)i : EMPTY);
        s->station.word[i] = word(i, EMPTY);
    }
    atomic_store(&s->free_list.tail, POOL);
    atomic_store(&s->free_list.s_tail, POOL);
    atomic_store(&s->free_list.lf_tail, POOL);
    pid_t consumer = fork();
    if (consumer == 0 && way >= ROBUST_ET) {
        consume_marked(s);
        _exit(0);
    }
    if (consumer == 0) {
        uint64_t seen = 0;
        while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
            int64_t e = pop(&s->station, &seen);
            if (e >= 0) {
                (void)*(volatile uint64_t *)&s->descriptor[e * 8]; /* the length, read */
                push(&s->free_list, (uint32_t)e);
            }
        }
        _exit(0);
    }
    uint64_t n = 0, seen = 0;
    double t0 = now(), t1 = t0;
    for (;;) {
        int64_t e;
        uint32_t marked;
        if (way >= ROBUST_ET) {
            uint32_t got[128];
            int k = pop_marked(&s->free_list, 0, 1, got, batch);
            if (k == 0) {
                if (atomic_load_explicit(&s->stop, memory_order_relaxed))
                    break; /* the consumer failed */
                continue;
            }
            for (int j = 0; j < k; j++)
                s->descriptor[got[j] * 8] = n + j;
            push_marked(&s->station, 1, 1, got, k);
            uint64_t before = n;
            n += k;
            if ((n >> 10) != (before >> 10) && (t1 = now()) - t0 > seconds)
                break;
            continue;
        }
        (void)marked;
        if (0)
            e = -1;
        else
            e = pop(&s->free_list, &seen);
        if (e < 0) {
            if (atomic_load_explicit(&s->stop, memory_order_relaxed))
                break; /* the consumer failed */
            continue;
        }
        s->descriptor[e * 8] = n;
        if (way >= ROBUST_ET)
            push_marked(&s->station, 1, 1, &marked, 1);
        else
            push(&s->station, (uint32_t)e);
        if ((++n & 1023) == 0 && (t1 = now()) - t0 > seconds)
            break;
    }
    atomic_store(&s->stop, 1);
    int status = 0;
    waitpid(consumer, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "%s: the consumer failed\n", names[way]);
        exit(1);
    }
    munmap(s, sizeof *s);
    return n / (t1 - t0);
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    batch = argc > 3 ? atoi(argv[3]) : 1;
    if (batch < 1 || batch > 128) {
        fprintf(stderr, "batch: 1 to 128\n");
        return 2;
    }
    if (!(seconds > 0 && seconds < 3600) || reps < 1 || reps > 99) {
        fprintf(stderr, "usage: %s [SECONDS > 0] [REPETITIONS 1..99]\n", argv[0]);
        return 2;
    }
    double r[WAYS][99];
    /* Interleaved: every repetition runs every way once, so that the host's drift hits all. */
    for (int i = 0; i < reps; i++)
        for (way = 0; way < WAYS; way++)
            r[way][i] = measure(seconds);
    printf("%-10s %12s %12s %12s %8s\n", "way", "median M/s", "min", "max", "ns/event");
    for (way = 0; way < WAYS; way++) {
        qsort(r[way], reps, sizeof(double), by_value);
        double m = reps % 2 ? r[way][reps / 2] : (r[way][reps / 2 - 1] + r[way][reps / 2]) / 2;
        printf("%-10s %12.2f %12.2f %12.2f %8.0f\n", names[way], m / 1e6, r[way][0] / 1e6, r[way][reps - 1] / 1e6, 1e9 / m);
    }
    return 0;
}
