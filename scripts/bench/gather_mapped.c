/* Where a persisted parsed chunk is best read from: loads FILE (e.g. the concatenated entries of
 * state_dir/parsed) one of four ways, then gathers 3,400 minibatches of 256 random 512-byte rows
 * from it (a 128-float dense sample each) and prints the load time and the time per minibatch.
 *
 *   0  read into fresh memory advised MADV_HUGEPAGE (what the cache did before mapping)
 *   1  mmap, pages faulted in by the gather
 *   2  mmap with MAP_POPULATE
 *   3  mmap, then MADV_POPULATE_READ
 *   4  mmap, MADV_HUGEPAGE, then MADV_POPULATE_READ (what the cache does now)
 *
 *   cc -O2 scripts/bench/gather_mapped.c -o gather_mapped
 *   find state/parsed -name '*.mbp' -exec cat {} + > all.bin
 *   for m in 0 1 2 3 4; do ./gather_mapped all.bin $m; done
 *
 * docs/benchmarks.md, "Persisted chunks mapped". Whether a mapping is on huge pages shows in
 * /proc/PID/smaps (FilePmdMapped): the page cache must hold the file in 2 MiB folios, which a
 * file written by `cat` (small writes) and still cached does not: there mode 4 gathers like 1-3.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s FILE MODE(0-4)\n", argv[0]);
        return 2;
    }
    int mode = atoi(argv[2]);
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    size_t len = (size_t)lseek(fd, 0, SEEK_END);
    size_t huge = 2u << 20;
    double t0 = now();
    char *base;
    if (mode == 0) {
        base = aligned_alloc(huge, (len + huge - 1) / huge * huge);
        madvise(base, len, MADV_HUGEPAGE);
        for (size_t off = 0; off < len;) {
            ssize_t r = pread(fd, base + off, len - off > huge ? huge : len - off, (off_t)off);
            if (r <= 0)
                break;
            off += (size_t)r;
        }
    } else {
        base = mmap(NULL, len, PROT_READ, MAP_PRIVATE | (mode == 2 ? MAP_POPULATE : 0), fd, 0);
        if (base == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        if (mode == 4 && madvise(base, len, MADV_HUGEPAGE))
            perror("MADV_HUGEPAGE");
        if (mode >= 3 && madvise(base, len, MADV_POPULATE_READ))
            perror("MADV_POPULATE_READ");
    }
    double t1 = now();
    size_t rows = len / 512;
    uint64_t x = 88172645463325252ull;
    static char out[256 * 512];
    double sum = 0;
    int minibatches = 3400;
    for (int m = 0; m < minibatches; m++) {
        for (int i = 0; i < 256; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            memcpy(out + i * 512, base + (x % rows) * 512, 512);
        }
        sum += out[m % 1000];
    }
    double t2 = now();
    printf("mode %d: load %.3f s, gather %.1f us per minibatch (%g)\n", mode, t1 - t0, (t2 - t1) / minibatches * 1e6, sum);
    return 0;
}
