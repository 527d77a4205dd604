// A server's wall clock stepped, for the fault soak's --nemesis server_clock
// (tests/soak/soak.py): preloaded into redis-server, mariadbd or postgres
// (LD_PRELOAD), it adds the nanoseconds held in the file named by
// LOCKWATCH_CLOCK_SHIFT (8 bytes, a native int64, which the soak rewrites
// while the server runs) to CLOCK_REALTIME, gettimeofday() and time().
// The monotonic clocks are left alone: an NTP step moves the wall clock
// only. libfaketime does the same but redis-server 7.0 (jemalloc) does not
// start under it ("unexpected recursive calls to clock_gettime()"); this
// shim allocates nothing and reads the real clocks by system call, so it
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

const volatile std::int64_t* shift_ns = nullptr;

__attribute__((constructor)) void map_shift() {
  const char* path = std::getenv("LOCKWATCH_CLOCK_SHIFT");
  if (path == nullptr) return;
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  void* p = ::mmap(nullptr, sizeof(std::int64_t), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p != MAP_FAILED) shift_ns = static_cast<const volatile std::int64_t*>(p);
}

std::int64_t shift() { return shift_ns != nullptr ? *shift_ns : 0; }

int real_clock(clockid_t id, struct timespec* ts) {
  return static_cast<int>(::syscall(SYS_clock_gettime, id, ts));
}

void add(struct timespec* ts, std::int64_t ns) {
  std::int64_t t = static_cast<std::int64_t>(ts->tv_sec) * 1000000000 + ts->tv_nsec + ns;
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
  if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) add(ts, shift());
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
