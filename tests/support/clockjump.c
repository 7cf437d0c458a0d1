/* A wall clock that jumps, for one process tree: LD_PRELOAD this library and name a file in
 * MTGPU_TEST_CLOCK_FILE holding an offset in seconds (e.g. "3600" or "-3600"). CLOCK_REALTIME
 * (clock_gettime, gettimeofday, time) then reads the machine's time plus that offset; the file
 * is read again at most every 100 ms, so writing it makes the process's wall clock jump as a
 * `date -s` would, while CLOCK_MONOTONIC and every other clock stay untouched (as they do
 * when a real wall clock is set). The tests use it instead of setting the machine's clock,
 * which would move every process on this shared machine. Built by tests/support/clockjump.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static int64_t offset_ns;            /* what the file said last */
static int64_t next_read_ns;         /* monotonic moment of the next read */

static clock_gettime_fn real_clock_gettime(void) {
    static clock_gettime_fn fn;
    if (!fn)
        fn = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    return fn;
}

static int64_t current_offset_ns(void) {
    struct timespec mono;
    if (real_clock_gettime()(CLOCK_MONOTONIC, &mono) != 0)
        return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
    int64_t now = (int64_t)mono.tv_sec * 1000000000LL + mono.tv_nsec;
    if (now >= __atomic_load_n(&next_read_ns, __ATOMIC_RELAXED)) {
        __atomic_store_n(&next_read_ns, now + 100000000LL, __ATOMIC_RELAXED);
        const char *path = getenv("MTGPU_TEST_CLOCK_FILE");
        FILE *f = path ? fopen(path, "re") : NULL;
        if (f) {
            double seconds;
            if (fscanf(f, "%lf", &seconds) == 1)
                __atomic_store_n(&offset_ns, (int64_t)(seconds * 1e9), __ATOMIC_RELAXED);
            fclose(f);
        }
    }
    return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
}

static void shift(struct timespec *ts) {
    int64_t ns = (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec + current_offset_ns();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000LL;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = real_clock_gettime()(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        shift(ts);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
