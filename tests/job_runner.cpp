// A process that declares one scheduled job and runs it while it leads,
// for the multi-process tests. Each run appends the line
// "<period> <pid> <fence>" to RUNS_FILE (one O_APPEND write, so lines of
// several processes never mix) and prints "run <period> <fence>"; it
// prints "ready" once the job is declared. With
// LOCKWATCH_TEST_CLOCK_SKEW_MS its local clock is off by that much (as on
// a machine with a wrong clock).
//   job_runner STORE_URL JOB PERIOD_MS LEASE_MS RUNS_FILE
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "jobs/scheduler_impl.hpp"
#include "lockwatch/lockwatch.hpp"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: job_runner STORE_URL JOB PERIOD_MS LEASE_MS RUNS_FILE\n");
    return 2;
  }
  std::string url = argv[1];
  lockwatch::Options o;
  o.redis_url = url;
  o.runtime.threads = 1;
  lockwatch::Runtime rt(o);
  lockwatch::Scheduler jobs(rt);
  if (const char* skew = std::getenv("LOCKWATCH_TEST_CLOCK_SKEW_MS"))
    lockwatch::detail::SchedulerAccess::set_clock_skew(jobs, std::chrono::milliseconds(std::atoll(skew)));
  int runs = ::open(argv[5], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (runs < 0) return 3;
  lockwatch::JobOptions jo;
  jo.lease = std::chrono::milliseconds(std::atoi(argv[4]));
  jobs.every(std::chrono::milliseconds(std::atoi(argv[3])), argv[2],
             [&](const lockwatch::JobRun& run) {
               auto line = std::to_string(run.period()) + " " + std::to_string(getpid()) + " " +
                           std::to_string(run.fencing_token()) + "\n";
               if (::write(runs, line.data(), line.size()) != static_cast<ssize_t>(line.size())) std::abort();
               std::printf("run %lld %llu\n", static_cast<long long>(run.period()),
                           static_cast<unsigned long long>(run.fencing_token()));
               std::fflush(stdout);
             },
             jo);
  std::printf("ready\n");
  std::fflush(stdout);
  // Runs until killed (the tests send SIGKILL or SIGTERM).
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}
