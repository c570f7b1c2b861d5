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
 *   cc -O2 -o /tmp/et-lock-floor scripts/et-lock-floor.c -lpthread
 *   /tmp/et-lock-floor [SECONDS] [REPETITIONS]      # events/s per way, median of repetitions
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
enum way { LOCK_FREE, SPIN, FUTEX, PTHREAD, ROBUST, WAYS };
static const char *names[WAYS] = {"lock-free", "spin", "futex", "pthread", "robust"};

struct queue {
    _Alignas(64) _Atomic uint32_t lock;
    _Atomic uint64_t head, tail; /* guarded by the lock, except in LOCK_FREE */
    pthread_mutex_t mutex;
    _Alignas(64) _Atomic uint64_t lf_head; /* LOCK_FREE: the consumer's line */
    _Alignas(64) _Atomic uint64_t lf_tail; /* LOCK_FREE: the producer's line */
    _Alignas(64) uint32_t slot[CAP];
};
struct shared {
    struct queue station, free_list;
    _Alignas(64) _Atomic int stop;
    _Alignas(64) uint64_t descriptor[POOL * 8]; /* one line per event */
};

static enum way way;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void lock(struct queue *q) {
    if (way == PTHREAD || way == ROBUST) {
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
    if (way == PTHREAD || way == ROBUST)
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

static double measure(double seconds) {
    struct shared *s = mmap(0, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (way == ROBUST)
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->station.mutex, &a);
    pthread_mutex_init(&s->free_list.mutex, &a);
    for (uint32_t i = 0; i < POOL; i++)
        s->free_list.slot[i] = i;
    atomic_store(&s->free_list.tail, POOL);
    atomic_store(&s->free_list.lf_tail, POOL);
    pid_t consumer = fork();
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
        int64_t e = pop(&s->free_list, &seen);
        if (e < 0)
            continue;
        s->descriptor[e * 8] = n;
        push(&s->station, (uint32_t)e);
        if ((++n & 1023) == 0 && (t1 = now()) - t0 > seconds)
            break;
    }
    atomic_store(&s->stop, 1);
    waitpid(consumer, 0, 0);
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
