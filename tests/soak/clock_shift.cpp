// A server's wall clock stepped, or run at another rate, for the fault
// soak's --nemesis server_clock (tests/soak/soak.py): preloaded into
// redis-server, mariadbd or postgres (LD_PRELOAD), it moves
// CLOCK_REALTIME, gettimeofday() and time() by what the file named by
// LOCKWATCH_CLOCK_SHIFT holds, which the soak rewrites while the server
// runs. Five native int64s:
//
//   offset_ns  added to the real wall clock, for good (a step)
//   rate_ppm   the wall clock's rate, in millionths, from start_ns to
//              end_ns (0: none; 2000000 runs it at 2x, 500000 at 0.5x)
//   start_ns   when the rate begins, on the real CLOCK_MONOTONIC
//   end_ns     when it ends, by itself: after that the clock runs at the
//              real rate again, from where the rate took it (no step)
//   seq        odd while the soak writes the others (a seqlock)
//
// so the wall clock reads real + offset + (rate - 1) * (the time spent
// in [start, end]); and it never reads less than it read before, in this
// process. The monotonic clocks are left alone: an NTP step moves the
// wall clock only, and none of Redis 7.0, MariaDB and PostgreSQL times a
// key's or a row's expiry on a monotonic clock (docs/guarantees.md).
// libfaketime does the same but redis-server 7.0 (jemalloc) does not start
// under it ("unexpected recursive calls to clock_gettime()"); this shim
// allocates nothing and reads the real clocks by system call, so it
// cannot recurse.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

namespace {

struct Shift {
  std::int64_t offset_ns;
  std::int64_t rate_ppm;
  std::int64_t start_ns;
  std::int64_t end_ns;
  std::int64_t seq;
};

const volatile Shift* shared_shift = nullptr;
std::int64_t last_wall_ns = 0;  // the latest wall time returned (atomically)

__attribute__((constructor)) void map_shift() {
  const char* path = std::getenv("LOCKWATCH_CLOCK_SHIFT");
  if (path == nullptr) return;
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  void* p = ::mmap(nullptr, sizeof(Shift), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p != MAP_FAILED) shared_shift = static_cast<const volatile Shift*>(p);
}

int real_clock(clockid_t id, struct timespec* ts) {
  return static_cast<int>(::syscall(SYS_clock_gettime, id, ts));
}

std::int64_t ns_of(const struct timespec& ts) {
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A consistent copy of the file's fields: retried while the soak writes
// them (it writes seq odd, the fields, seq even); after many tries, what
// was read last (the writer is gone or stuck, which the soak never is).
Shift read_shift() {
  Shift s{};
  if (shared_shift == nullptr) return s;
  for (int tries = 0; tries < 10000; ++tries) {
    std::int64_t seq = shared_shift->seq;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    s.offset_ns = shared_shift->offset_ns;
    s.rate_ppm = shared_shift->rate_ppm;
    s.start_ns = shared_shift->start_ns;
    s.end_ns = shared_shift->end_ns;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if ((seq & 1) == 0 && shared_shift->seq == seq) break;
  }
  return s;
}

// What the shift adds to the real wall clock now.
std::int64_t shift_now() {
  Shift s = read_shift();
  std::int64_t add = s.offset_ns;
  if (s.rate_ppm > 0 && s.end_ns > s.start_ns) {
    struct timespec mono;
    if (real_clock(CLOCK_MONOTONIC, &mono) == 0) {
      std::int64_t t = ns_of(mono);
      std::int64_t in = (t < s.start_ns ? s.start_ns : t > s.end_ns ? s.end_ns : t) - s.start_ns;
      // Truncated toward zero, as the soak folds it into offset_ns once
      // the rate is over. At most (rate - 1) * a few seconds: no overflow.
      add += (s.rate_ppm - 1000000) * in / 1000000;
    }
  }
  return add;
}

// Never less than what this process was told before: the real clock and
// the monotonic one are read apart, and a rate below 1 could otherwise
// take a few nanoseconds back.
std::int64_t not_back(std::int64_t ns) {
  std::int64_t last = __atomic_load_n(&last_wall_ns, __ATOMIC_RELAXED);
  while (ns > last) {
    if (__atomic_compare_exchange_n(&last_wall_ns, &last, ns, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return ns;
  }
  return ns > last ? ns : last;
}

void set_ns(struct timespec* ts, std::int64_t t) {
  ts->tv_sec = static_cast<time_t>(t / 1000000000);
  ts->tv_nsec = static_cast<long>(t % 1000000000);
  if (ts->tv_nsec < 0) {
    ts->tv_nsec += 1000000000;
    ts->tv_sec -= 1;
  }
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int clock_gettime(clockid_t id, struct timespec* ts) {
  int rc = real_clock(id, ts);
  if (rc != 0 || shared_shift == nullptr) return rc;
  if (id == CLOCK_REALTIME) {
    set_ns(ts, not_back(ns_of(*ts) + shift_now()));
  } else if (id == CLOCK_REALTIME_COARSE) {
    set_ns(ts, ns_of(*ts) + shift_now());
  }
  return rc;
}

__attribute__((visibility("default"))) int gettimeofday(struct timeval* tv, void*) {
  struct timespec ts;
  int rc = clock_gettime(CLOCK_REALTIME, &ts);
  if (rc == 0) {  // glibc declares tv nonnull
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = static_cast<suseconds_t>(ts.tv_nsec / 1000);
  }
  return rc;
}

__attribute__((visibility("default"))) time_t time(time_t* out) {
  struct timespec ts;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return static_cast<time_t>(-1);
  if (out != nullptr) *out = ts.tv_sec;
  return ts.tv_sec;
}

}  // extern "C"
