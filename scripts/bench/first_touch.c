/* How fast this machine hands out memory: maps SIZE_MIB of anonymous memory, advises huge pages
 * (THP=1) or not (THP=0), writes one byte per 4 KiB page and prints the rate. On the project's
 * VM the first run after boot is 0.4-0.6 GB/s with huge pages; a second run, which gets memory
 * the VM has handed out before, 4-7 GB/s (docs/benchmarks.md, the daemon's cold sweep).
 *
 *   cc -O2 scripts/bench/first_touch.c -o first_touch && ./first_touch 2048 1
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SIZE_MIB THP(0|1)\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) << 20;
    int thp = atoi(argv[2]);
    char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    madvise(p, n, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    double t = now();
    for (size_t i = 0; i < n; i += 4096) p[i] = 1;
    double d = now() - t;
    printf("%zu MiB, huge pages %s: first touch %.3f s = %.2f GB/s\n", n >> 20, thp ? "advised" : "off", d, n / d / 1e9);
    return 0;
}
