/* A pool of T - 1 worker threads that help the caller run fn(arg, c, C) for the C chunks
 * c = 0 .. C - 1 of a job; the w4a8 kernel splits its output rows (and the rows it quantizes)
 * into such chunks.
 *
 * A call of the kernel lasts tens of microseconds (SmolLM2's 576 x 576 int4 matrix is 170 kB),
 * so starting threads for each call, or waking sleeping ones, would cost as much as the call:
 * the workers stay between calls and spin (a pause instruction in a loop) for SPIN_NS after
 * each job, catching the next call of the same step; past that they sleep on a condition
 * variable, so an idle server does not burn its cores. libgomp (OpenMP) does the same.
 *
 * Chunks are claimed from a shared counter by whoever runs: the caller too, so a job never
 * waits for a worker the OS has not scheduled (a machine busier than its cores): the caller
 * then runs every chunk itself, and waits only for chunks a worker has begun. A worker counts
 * itself in (`users`) before it looks at the job and out after, and the caller closes the job
 * before it waits for `users` to reach 0: a worker that wakes late finds it closed. Which
 * thread runs a chunk changes nothing in its result. One caller at a time: a second
 * caller (another Python thread) and a caller in a forked child (the workers are the parent's)
 * get -1 from pool_run and run the job another way. POSIX only (threads, clock_gettime's
 * CLOCK_MONOTONIC, sched_yield): Linux, macOS and the BSDs alike. Built with w4a8.c by
 * llminfra/kernels/build.py; chapter 08.
 */
#include "simd.h"               /* first, as in every file of the library: CPU_RELAX */
#include "llminfra_kernels.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SPIN_NS 50000L         /* 50 us: the gap between two matmuls of a decode step */
#define MAX_POOL_THREADS 1024

typedef struct {
    pthread_mutex_t lock;      /* guards the sleep and the wake-up */
    pthread_cond_t wake;
    pthread_mutex_t busy;      /* one job at a time */
    atomic_uint generation;    /* bumped once per job: wakes the workers */
    atomic_int open;           /* the job may still be joined */
    atomic_int next_chunk;     /* the next chunk to claim */
    atomic_int users;          /* workers inside the job */
    int chunks;
    atomic_int sleepers;
    atomic_int stop;
    pool_fn fn;
    void *arg;
    int size;                  /* T: the caller and size - 1 workers */
    pid_t pid;                 /* the process the workers belong to */
    int started;
    pthread_t *workers;
} pool_t;

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Wait until the generation is no longer `seen` (or the pool stops): spin, then sleep. */
static unsigned wait_for_job(pool_t *p, unsigned seen) {
    long until = now_ns() + SPIN_NS;
    for (int i = 0;; i++) {
        unsigned g = atomic_load(&p->generation);
        if (g != seen || atomic_load(&p->stop)) return g;
        CPU_RELAX();
        if ((i & 255) == 255) {
            if (now_ns() > until) break;
            sched_yield();     /* a thread of torch's own pool may be waiting for this core */
        }
    }
    pthread_mutex_lock(&p->lock);
    atomic_fetch_add(&p->sleepers, 1);
    while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->wake, &p->lock);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->lock);
    return atomic_load(&p->generation);
}

static void *worker(void *a) {
    pool_t *p = (pool_t *)a;
    unsigned seen = 0;         /* not the generation now: a job may be posted before we run */
    for (;;) {
        seen = wait_for_job(p, seen);
        if (atomic_load(&p->stop)) return NULL;
        atomic_fetch_add(&p->users, 1);
        if (atomic_load(&p->open)) {
            pool_fn fn = p->fn;
            void *arg = p->arg;
            int C = p->chunks;
            for (int c; (c = atomic_fetch_add(&p->next_chunk, 1)) < C;) fn(arg, c, C);
        }
        atomic_fetch_sub(&p->users, 1);
    }
}

/* A pool running jobs on `threads` threads (the caller's included); NULL where threads < 2 or
   a thread cannot be started. */
void *w4a8_pool_new(int threads) {
    if (threads < 2 || threads > MAX_POOL_THREADS) return NULL;
    pool_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->workers = calloc((size_t)threads, sizeof(pthread_t));
    if (!p->workers) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->busy, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->size = threads;
    p->pid = getpid();
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&p->workers[t], NULL, worker, p)) {
            w4a8_pool_free(p);
            return NULL;
        }
        p->started = t;
    }
    return p;
}

/* Stop and join the workers, then free the pool (NULL: nothing). In a forked child (its copy
   of a parent's pool, freed when the child's garbage collector finalizes it) the workers do not
   exist and the copied condition still counts them as waiters: destroying it would wait for
   them for ever, so only the memory is freed. */
void w4a8_pool_free(void *handle) {
    pool_t *p = (pool_t *)handle;
    if (!p) return;
    if (p->pid == getpid()) {
        pthread_mutex_lock(&p->lock);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
        for (int t = 1; t <= p->started; t++) pthread_join(p->workers[t], NULL);
        pthread_mutex_destroy(&p->lock);
        pthread_mutex_destroy(&p->busy);
        pthread_cond_destroy(&p->wake);
    }
    free(p->workers);
    free(p);
}

int w4a8_pool_size(const void *handle) { return handle ? ((const pool_t *)handle)->size : 1; }

/* fn(arg, c, C) for every chunk c < C, on this thread and whichever workers join; returns
   when all are done. -1 (nothing run) where another caller holds the pool or this is a forked
   child. */
static int pool_run(void *handle, pool_fn fn, void *arg, int C) {
    pool_t *p = (pool_t *)handle;
    if (p->pid != getpid() || pthread_mutex_trylock(&p->busy)) return -1;
    p->fn = fn;
    p->arg = arg;
    p->chunks = C;
    atomic_store(&p->next_chunk, 0);
    atomic_store(&p->open, 1);                        /* publishes fn, arg and the chunks */
    atomic_fetch_add(&p->generation, 1);
    if (atomic_load(&p->sleepers)) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    for (int c; (c = atomic_fetch_add(&p->next_chunk, 1)) < C;) fn(arg, c, C);
    atomic_store(&p->open, 0);
    for (int i = 0; atomic_load(&p->users); i++) {
        CPU_RELAX();
        if ((i & 1023) == 1023) sched_yield();        /* a worker was preempted: let it run */
    }
    pthread_mutex_unlock(&p->busy);
    return 0;
}

typedef struct {
    pool_fn fn;
    void *arg;
    int t, T;
} once_arg_t;

static void *run_once(void *a) {
    once_arg_t *o = (once_arg_t *)a;
    o->fn(o->arg, o->t, o->T);
    return NULL;
}

/* fn(arg, t, T) for every t < T on threads started for this call (fewer where they cannot be
   started: their parts then run on this thread). */
static void run_threads(int T, pool_fn fn, void *arg) {
    pthread_t th[64];
    once_arg_t args[64];
    int started[64] = {0};
    if (T > 64) T = 64;
    for (int t = 1; t < T; t++) {
        args[t] = (once_arg_t){fn, arg, t, T};
        started[t] = !pthread_create(&th[t], NULL, run_once, &args[t]);
    }
    fn(arg, 0, T);
    for (int t = 1; t < T; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            fn(arg, t, T);
    }
}

/* fn(arg, c, C) for every chunk c < C, on `threads` threads: on the pool where it has that many
   (chunks claimed by whichever thread runs), else one chunk per thread started for this call
   (fn then sees C = threads), else, for one thread or one chunk, here as fn(arg, 0, 1). What
   every kernel of the library splits its work with. */
void pool_for(int threads, void *pool, pool_fn fn, void *arg, int C) {
    if (threads <= 1 || C <= 1)
        fn(arg, 0, 1);
    else if (!pool || w4a8_pool_size(pool) != threads || pool_run(pool, fn, arg, C))
        run_threads(threads, fn, arg);
}
