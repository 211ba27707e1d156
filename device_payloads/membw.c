/* devicelab roofline payload: streaming-read memory bandwidth and a simple FMA compute peak.
 * usage: membw [-m MiB] [-t threads] [-r reps]     (defaults: 512 MiB, all CPUs, 5 reps)
 * Prints one JSON line: best-of-reps read bandwidth (B/s) over a buffer far larger than the last-level
 * cache, and the FLOP/s of an FMA loop on independent accumulators (a lower bound on peak compute). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

typedef struct { const uint64_t *p; size_t n; uint64_t sum; double flops_acc; long iters; } job_t;

static void *readj(void *a) {
    job_t *j = a; uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) { s0 += j->p[i]; s1 += j->p[i + 1]; s2 += j->p[i + 2]; s3 += j->p[i + 3]; }
    j->sum = s0 + s1 + s2 + s3; return NULL;
}

#define NACC 128
static void *fmaj(void *a) {
    job_t *j = a; float acc[NACC]; const float m = 0.999999f, c = 1e-7f;
    for (int k = 0; k < NACC; k++) acc[k] = (float)k;
    for (long it = 0; it < j->iters; it++)
        for (int k = 0; k < NACC; k++) acc[k] = acc[k] * m + c;
    double s = 0; for (int k = 0; k < NACC; k++) s += acc[k];
    j->flops_acc = s; return NULL;
}

int main(int argc, char **argv) {
    size_t mib = 512; int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), reps = 5, opt;
    while ((opt = getopt(argc, argv, "m:t:r:")) != -1) {
        if (opt == 'm') mib = strtoul(optarg, 0, 10); else if (opt == 't') threads = atoi(optarg);
        else if (opt == 'r') reps = atoi(optarg); else { fprintf(stderr, "usage: membw [-m MiB] [-t N] [-r N]\n"); return 2; }
    }
    if (threads < 1) threads = 1;
    size_t bytes = mib << 20, n = bytes / 8;
    uint64_t *buf = malloc(bytes);
    if (!buf) { fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib); return 1; }
    for (size_t i = 0; i < n; i++) buf[i] = i;            /* touch every page */
    pthread_t th[256]; job_t jobs[256]; if (threads > 256) threads = 256;
    double best = 0; uint64_t check = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int k = 0; k < threads; k++) {
            size_t lo = n / threads * k, hi = k == threads - 1 ? n : n / threads * (k + 1);
            jobs[k].p = buf + lo; jobs[k].n = hi - lo; pthread_create(&th[k], 0, readj, &jobs[k]);
        }
        for (int k = 0; k < threads; k++) { pthread_join(th[k], 0); check += jobs[k].sum; }
        double bw = bytes / (now() - t0); if (bw > best) best = bw;
    }
    long iters = 5000000; double bestf = 0, facc = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = now();
        for (int k = 0; k < threads; k++) { jobs[k].iters = iters; pthread_create(&th[k], 0, fmaj, &jobs[k]); }
        for (int k = 0; k < threads; k++) { pthread_join(th[k], 0); facc += jobs[k].flops_acc; }
        double f = 2.0 * NACC * iters * threads / (now() - t0); if (f > bestf) bestf = f;
    }
    printf("{\"buffer_bytes\": %zu, \"threads\": %d, \"reps\": %d, \"read_bytes_per_s\": %.6e, "
           "\"fma_flops_per_s\": %.6e, \"check\": %llu, \"facc\": %.3f}\n",
           bytes, threads, reps, best, bestf, (unsigned long long)(check & 0xff), facc);
    free(buf); return 0;
}
