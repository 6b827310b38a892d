/* clockshift: an LD_PRELOAD shim that offsets a process's wall clock, and nothing else.
 *
 * Contract (the harness side is injectors/clock/shim.py):
 * - MLCHAOS_CLOCK_DIR names a folder; a file there named "<scope>@<tag>" holds a signed integer number of
 *   nanoseconds. This process's offset is the sum over the files whose scope is its own: "all", "rank-<RANK>"
 *   (RANK as torchrun sets it) and "replica-<CHAOS_REPLICA>" (as a roles target sets it). Names starting with a
 *   dot are ignored (a writer's temporary file before its atomic rename). A missing folder or file, or an
 *   empty or unparseable one, counts as 0.
 * - Shifted: clock_gettime of CLOCK_REALTIME, CLOCK_REALTIME_COARSE and CLOCK_TAI, gettimeofday, time and
 *   timespec_get(TIME_UTC). An absolute CLOCK_REALTIME/CLOCK_TAI deadline given to
 *   clock_nanosleep is shifted back, so it ends when the shifted clock reaches it. Every other clock
 *   (MONOTONIC, BOOTTIME, CPU clocks) and every relative sleep is passed through untouched.
 * - The folder is read again at most every REFRESH_NS of monotonic time, by one thread at a time, with raw
 *   open/getdents64/read (no malloc, no stdio: safe in a signal handler); other threads use the last sum.
 * - Only dynamically linked code calling libc's functions is affected: a static binary, or code issuing the
 *   clock_gettime syscall itself, sees the true clock.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define REFRESH_NS 50000000LL /* 50 ms */
#define NS_PER_S 1000000000LL
#define MAX_OFFSET_NS (3650LL * 86400LL * NS_PER_S) /* ten years: a sum beyond that is clamped */
#define MAX_SCOPES 3
#define SCOPE_LEN 96

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef int (*gettimeofday_fn)(struct timeval *, void *);
typedef int (*clock_nanosleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);

static clock_gettime_fn real_clock_gettime;
static gettimeofday_fn real_gettimeofday;
static clock_nanosleep_fn real_clock_nanosleep;

static char clock_dir[4096];
static char scopes[MAX_SCOPES][SCOPE_LEN];
static int scope_count;
static int configured; /* 1 once the environment was read */

static int64_t offset_ns;       /* atomic: the last sum read */
static int64_t next_refresh_ns; /* atomic: monotonic time of the next read (0: read now) */
static int refreshing;          /* atomic: a thread is reading the folder */

/* libc's own functions behind ours (the next definitions after this library). */
static void resolve(void) {
    if (real_clock_gettime == NULL)
        real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    if (real_gettimeofday == NULL)
        real_gettimeofday = (gettimeofday_fn)dlsym(RTLD_NEXT, "gettimeofday");
    if (real_clock_nanosleep == NULL)
        real_clock_nanosleep = (clock_nanosleep_fn)dlsym(RTLD_NEXT, "clock_nanosleep");
}

/* Adds the scope "<prefix><value>" (value "" for "all"); a value with a slash or too long is left out. */
static void add_scope(const char *prefix, const char *value) {
    if (value == NULL || scope_count >= MAX_SCOPES)
        return;
    size_t a = strlen(prefix), b = strlen(value);
    if (a + b + 1 > SCOPE_LEN || memchr(value, '/', b) != NULL)
        return;
    memcpy(scopes[scope_count], prefix, a);
    memcpy(scopes[scope_count] + a, value, b + 1);
    scope_count++;
}

static void configure(void) {
    if (__atomic_load_n(&configured, __ATOMIC_ACQUIRE))
        return;
    const char *dir = getenv("MLCHAOS_CLOCK_DIR");
    size_t len = dir == NULL ? 0 : strlen(dir);
    if (len > 0 && len < sizeof(clock_dir)) {
        memcpy(clock_dir, dir, len + 1);
        const char *rank = getenv("RANK"), *replica = getenv("CHAOS_REPLICA");
        add_scope("all", "");
        if (rank != NULL && rank[0] != '\0')
            add_scope("rank-", rank);
        if (replica != NULL && replica[0] != '\0')
            add_scope("replica-", replica);
    }
    __atomic_store_n(&configured, 1, __ATOMIC_RELEASE);
}

/* A child forked while another thread was reading the folder must not inherit its "reading" flag forever. */
static void after_fork_in_child(void) {
    __atomic_store_n(&refreshing, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&next_refresh_ns, 0, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void clockshift_init(void) {
    resolve();
    configure();
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* The file's value, or 0 when it is empty or not a whole signed integer (surrounding whitespace allowed). */
static int64_t parse_ns(const char *text) {
    const char *p = text;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    int negative = 0;
    if (*p == '+' || *p == '-')
        negative = *p++ == '-';
    if (*p < '0' || *p > '9')
        return 0;
    int64_t value = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (value > MAX_OFFSET_NS)
            return 0;
        value = value * 10 + (*p - '0');
    }
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    if (*p != '\0' || value > MAX_OFFSET_NS)
        return 0;
    return negative ? -value : value;
}

static int scope_matches(const char *name) {
    for (int i = 0; i < scope_count; i++) {
        size_t len = strlen(scopes[i]);
        if (strncmp(name, scopes[i], len) == 0 && name[len] == '@' && name[len + 1] != '\0')
            return 1;
    }
    return 0;
}

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

/* The sum of this process's offset files now (0 when the folder is missing). */
static int64_t read_offset(void) {
    int dir = open(clock_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return 0;
    int64_t total = 0;
    char entries[4096] __attribute__((aligned(8)));
    for (;;) {
        long got = syscall(SYS_getdents64, dir, entries, sizeof(entries));
        if (got <= 0)
            break;
        for (long at = 0; at < got;) {
            struct linux_dirent64 *entry = (struct linux_dirent64 *)(entries + at);
            at += entry->d_reclen;
            if (entry->d_name[0] == '.' || !scope_matches(entry->d_name))
                continue;
            int fd = openat(dir, entry->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
            if (fd < 0)
                continue;
            char text[64];
            ssize_t n = read(fd, text, sizeof(text) - 1);
            close(fd);
            if (n <= 0)
                continue;
            text[n] = '\0';
            total += parse_ns(text);
        }
    }
    close(dir);
    if (total > MAX_OFFSET_NS)
        total = MAX_OFFSET_NS;
    if (total < -MAX_OFFSET_NS)
        total = -MAX_OFFSET_NS;
    return total;
}

/* This process's offset: the cached sum, read again once REFRESH_NS of monotonic time has passed. */
static int64_t current_offset(void) {
    configure();
    if (clock_dir[0] == '\0')
        return 0;
    struct timespec now;
    if (real_clock_gettime(CLOCK_MONOTONIC_COARSE, &now) != 0)
        return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
    int64_t now_ns = (int64_t)now.tv_sec * NS_PER_S + now.tv_nsec;
    if (now_ns >= __atomic_load_n(&next_refresh_ns, __ATOMIC_ACQUIRE) &&
        !__atomic_exchange_n(&refreshing, 1, __ATOMIC_ACQUIRE)) {
        int saved = errno;
        __atomic_store_n(&offset_ns, read_offset(), __ATOMIC_RELAXED);
        __atomic_store_n(&next_refresh_ns, now_ns + REFRESH_NS, __ATOMIC_RELEASE);
        __atomic_store_n(&refreshing, 0, __ATOMIC_RELEASE);
        errno = saved;
    }
    return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
}

static int shifted_clock(clockid_t clock) {
    return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE || clock == CLOCK_TAI;
}

static void add_ns(struct timespec *ts, int64_t delta) {
    int64_t total = (int64_t)ts->tv_nsec + delta % NS_PER_S;
    ts->tv_sec += (time_t)(delta / NS_PER_S + total / NS_PER_S);
    total %= NS_PER_S;
    if (total < 0) {
        total += NS_PER_S;
        ts->tv_sec -= 1;
    }
    ts->tv_nsec = (long)total;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    resolve();
    int rc = real_clock_gettime(clock, ts);
    if (rc == 0 && shifted_clock(clock)) { /* rc 0: ts was written */
        int64_t offset = current_offset();
        if (offset != 0)
            add_ns(ts, offset);
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    resolve();
    int rc = real_gettimeofday(tv, tz);
    struct timeval *volatile out = tv; /* may be NULL (only tz asked for), whatever glibc's nonnull says */
    if (rc == 0 && out != NULL) {
        int64_t offset = current_offset();
        if (offset != 0) {
            struct timespec ts = {tv->tv_sec, (long)tv->tv_usec * 1000};
            add_ns(&ts, offset);
            tv->tv_sec = ts.tv_sec;
            tv->tv_usec = ts.tv_nsec / 1000;
        }
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return (time_t)-1;
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}

int timespec_get(struct timespec *ts, int base) {
    if (base != TIME_UTC || clock_gettime(CLOCK_REALTIME, ts) != 0)
        return 0;
    return base;
}

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *request, struct timespec *remain) {
    resolve();
    if ((flags & TIMER_ABSTIME) && shifted_clock(clock) && request != NULL) {
        int64_t offset = current_offset();
        if (offset != 0) {
            struct timespec real_deadline = *request;
            add_ns(&real_deadline, -offset);
            return real_clock_nanosleep(clock, flags, &real_deadline, remain);
        }
    }
    return real_clock_nanosleep(clock, flags, request, remain);
}
