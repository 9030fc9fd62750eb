/* A host clock that is wrong by INTENTS_CLOCK_SKEW seconds, for one process.
 *
 * Preloaded (LD_PRELOAD) into a worker by bench/skew.py. It moves the wall
 * clock only (CLOCK_REALTIME, gettimeofday, time), as a host whose clock is
 * set wrong would; the monotonic clock, which timed waits and sleeps use, is
 * left alone. libfaketime moves both, and Python's timed waits then hang.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long skew_ns(void) {
    static int read;
    static long long skew;
    if (!read) {
        const char *text = getenv("INTENTS_CLOCK_SKEW");
        skew = text ? (long long)(atof(text) * 1e9) : 0;
        read = 1;
    }
    return skew;
}

static void shift(struct timespec *tp) {
    long long ns = tp->tv_sec * 1000000000LL + tp->tv_nsec + skew_ns();
    tp->tv_sec = ns / 1000000000LL;
    tp->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t clock, struct timespec *tp) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int result = real(clock, tp);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shift(tp);
    return result;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec now;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) return -1;
    tv->tv_sec = now.tv_sec;
    tv->tv_usec = now.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (out) *out = now.tv_sec;
    return now.tv_sec;
}
