/*
 * ring-pingpong: what a ring's separate head word costs a batch-1 round trip.
 *
 * Two threads, pinned to CPUs 0 and 1, play request/reply through a pair of
 * single-producer/single-consumer byte rings, as a shared-memory client and
 * server do (a 40-byte request, a 106-byte reply: a GET of a 100-byte value).
 *
 * Frames are whole cache lines (64 and 128 bytes).
 *
 *   mode 0  head words: the producer copies the bytes, then release-stores
 *           the ring's head counter in its own cache line; the consumer
 *           polls that line, then reads the bytes (Sluice's rings today:
 *           two dependent cache-line transfers per direction);
 *   mode 1  stamped frames: an 8-byte header (length, lap) in front of the
 *           bytes, release-stored last, the next header zeroed before it;
 *           the consumer polls the header where the next frame will start
 *           (one transfer per direction for a frame in one line).
 *
 * Both sides do a sequentially consistent fence after each publish, as
 * Sluice's wake-up check does. Prints round trips per second.
 *
 *   cc -O2 -o /tmp/ring-pingpong scripts/ring-pingpong.c -lpthread
 *   /tmp/ring-pingpong MODE [SECONDS]
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RING_BYTES (1 << 20)
#define REQUEST_BYTES 40
#define REPLY_BYTES 106

struct ring {
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) unsigned char data[RING_BYTES];
};

static struct ring *requests, *replies;
static int mode;
static atomic_int stop;

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
        fprintf(stderr, "cannot pin to CPU %d\n", cpu);
        exit(1);
    }
}

/* Every publish starts on a cache line in both modes, and the ring's size is
 * a multiple of every frame's, so no frame straddles the ring's end. */
static uint64_t line_bytes(uint64_t n) { return (n + 63) & ~63ull; }
static uint64_t frame_bytes(int n) { return line_bytes(8 + (uint64_t)n); }

static void put(struct ring *r, uint64_t *at, const unsigned char *bytes, int n) {
    uint64_t p = *at;
    if (mode == 0) {
        memcpy(r->data + p % RING_BYTES, bytes, n);
        *at = p + line_bytes(n);
        atomic_store_explicit(&r->head, *at, memory_order_release);
        return;
    }
    uint64_t len = frame_bytes(n);
    memcpy(r->data + p % RING_BYTES + 8, bytes, n);
    *(uint64_t *)(r->data + (p + len) % RING_BYTES) = 0;
    uint64_t stamp = (uint64_t)n | ((p / RING_BYTES + 1) << 32);
    atomic_store_explicit((_Atomic uint64_t *)(r->data + p % RING_BYTES), stamp,
                          memory_order_release);
    *at = p + len;
}

static int get(struct ring *r, uint64_t *at, unsigned char *into) {
    uint64_t p = *at;
    if (mode == 0) {
        uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
        if (head == p) return 0;
        int n = (int)(head - p);
        memcpy(into, r->data + p % RING_BYTES, n);
        *at = head;
        atomic_store_explicit(&r->tail, head, memory_order_release);
        return n;
    }
    uint64_t stamp = atomic_load_explicit((_Atomic uint64_t *)(r->data + p % RING_BYTES),
                                          memory_order_acquire);
    if (stamp >> 32 != p / RING_BYTES + 1) return 0;
    int n = (int)(stamp & 0xffffffff);
    memcpy(into, r->data + p % RING_BYTES + 8, n);
    *at = p + frame_bytes(n);
    atomic_store_explicit(&r->tail, *at, memory_order_release);
    return n;
}

static void *server(void *unused) {
    (void)unused;
    pin(0);
    unsigned char in[4096], reply[REPLY_BYTES];
    memset(reply, 'x', sizeof reply);
    uint64_t read_at = 0, write_at = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        if (get(requests, &read_at, in)) {
            put(replies, &write_at, reply, REPLY_BYTES);
            atomic_thread_fence(memory_order_seq_cst);
        } else {
            _mm_pause();
        }
    }
    return NULL;
}

static double seconds_since(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - start->tv_sec) + (now.tv_nsec - start->tv_nsec) / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2 || (atoi(argv[1]) != 0 && atoi(argv[1]) != 1)) {
        fprintf(stderr, "usage: %s MODE(0 head words, 1 stamped frames) [SECONDS]\n", argv[0]);
        return 2;
    }
    mode = atoi(argv[1]);
    double length = argc > 2 ? atof(argv[2]) : 1.0;
    size_t ring_alloc_bytes = (sizeof(struct ring) + 4095) & ~(size_t)4095;
    requests = aligned_alloc(4096, ring_alloc_bytes);
    replies = aligned_alloc(4096, ring_alloc_bytes);
    if (requests == NULL || replies == NULL) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(requests, 0, sizeof(struct ring));
    memset(replies, 0, sizeof(struct ring));
    pthread_t echo;
    pthread_create(&echo, NULL, server, NULL);
    pin(1);
    unsigned char request[REQUEST_BYTES], in[4096];
    memset(request, 'q', sizeof request);
    uint64_t read_at = 0, write_at = 0, trips = 0;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (seconds_since(&start) < length) {
        for (int i = 0; i < 1000; i++) {
            put(requests, &write_at, request, REQUEST_BYTES);
            atomic_thread_fence(memory_order_seq_cst);
            while (!get(replies, &read_at, in)) _mm_pause();
        }
        trips += 1000;
    }
    double elapsed = seconds_since(&start);
    atomic_store(&stop, 1);
    pthread_join(echo, NULL);
    printf("mode %d (%s): %.2fM round trips/s\n", mode, mode ? "stamped frames" : "head words",
           trips / elapsed / 1e6);
    return 0;
}
