/*
 * The baseline of the sliced-scroll pagination paper, as the paper runs it:
 * two POSIX threads, each fread()s page-sized chunks of its share of the
 * pages and parses each chunk with Jansson's json_loadb, then iterates the
 * hits (reading each hit's _id and _source).
 *
 *   fread_jansson FILE OFFSET_BYTES PAGE_BYTES PAGES [THREADS]
 *
 * FILE holds PAGES pages of PAGE_BYTES each from OFFSET_BYTES on; a page is
 * a JSON array of {"_id","_source"} hits followed by whitespace (the layout
 * `sluice bench read` writes). Prints one JSON line: pages, docs, bytes,
 * seconds. Exits 1 naming the page when a page does not parse.
 *
 * Build: cc -O2 -pthread fread_jansson.c -ljansson -o fread_jansson
 * (Debian: libjansson-dev).
 */
#define _FILE_OFFSET_BITS 64
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_THREADS 64

struct task {
    const char *path;
    uint64_t offset_bytes;
    uint64_t page_bytes;
    uint64_t first_page;
    uint64_t pages;
    uint64_t docs;
    uint64_t id_bytes;
    int failed;
};

static void *run(void *arg) {
    struct task *t = arg;
    FILE *f = fopen(t->path, "rb");
    if (!f) {
        perror(t->path);
        t->failed = 1;
        return NULL;
    }
    char *page = malloc(t->page_bytes);
    if (!page || fseeko(f, (off_t)(t->offset_bytes + t->first_page * t->page_bytes), SEEK_SET)) {
        fprintf(stderr, "cannot allocate or seek\n");
        t->failed = 1;
        return NULL;
    }
    for (uint64_t p = 0; p < t->pages; p++) {
        if (fread(page, 1, t->page_bytes, f) != t->page_bytes) {
            fprintf(stderr, "short read at page %llu\n", (unsigned long long)(t->first_page + p));
            t->failed = 1;
            break;
        }
        json_error_t error;
        json_t *hits = json_loadb(page, t->page_bytes, 0, &error);
        if (!hits || !json_is_array(hits)) {
            fprintf(stderr, "page %llu is not a JSON array of hits: %s (line %d)\n",
                    (unsigned long long)(t->first_page + p), error.text, error.line);
            t->failed = 1;
            json_decref(hits);
            break;
        }
        size_t i;
        json_t *hit;
        json_array_foreach(hits, i, hit) {
            json_t *id = json_object_get(hit, "_id");
            json_t *source = json_object_get(hit, "_source");
            if (!json_is_string(id) || !source) {
                fprintf(stderr, "page %llu: hit %zu has no _id or _source\n",
                        (unsigned long long)(t->first_page + p), i);
                t->failed = 1;
                break;
            }
            t->id_bytes += json_string_length(id);
            t->docs++;
        }
        json_decref(hits);
        if (t->failed)
            break;
    }
    free(page);
    fclose(f);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: %s FILE OFFSET_BYTES PAGE_BYTES PAGES [THREADS]\n", argv[0]);
        return 2;
    }
    uint64_t offset = strtoull(argv[2], NULL, 10);
    uint64_t page_bytes = strtoull(argv[3], NULL, 10);
    uint64_t pages = strtoull(argv[4], NULL, 10);
    int threads = argc == 6 ? atoi(argv[5]) : 2;
    if (page_bytes == 0 || threads < 1 || threads > MAX_THREADS) {
        fprintf(stderr, "PAGE_BYTES must be positive and THREADS 1..%d\n", MAX_THREADS);
        return 2;
    }
    struct task tasks[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    uint64_t first = 0;
    for (int t = 0; t < threads; t++) {
        uint64_t share = pages / threads + ((uint64_t)t < pages % threads);
        tasks[t] = (struct task){argv[1], offset, page_bytes, first, share, 0, 0, 0};
        first += share;
        pthread_create(&ids[t], NULL, run, &tasks[t]);
    }
    uint64_t docs = 0, id_bytes = 0;
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        docs += tasks[t].docs;
        id_bytes += tasks[t].id_bytes;
        failed |= tasks[t].failed;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double seconds = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
    printf("{\"pages\":%llu,\"docs\":%llu,\"bytes\":%llu,\"id_bytes\":%llu,\"seconds\":%.6f}\n",
           (unsigned long long)pages, (unsigned long long)docs,
           (unsigned long long)(pages * page_bytes), (unsigned long long)id_bytes, seconds);
    return failed;
}
