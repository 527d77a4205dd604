// A scheduled job run by several processes: one leads and runs every
// period; kill it and another takes over.
//   lockwatch-sample-leader-job [REDIS_URL] [PERIOD_MS]
// Start it in three terminals, then kill -9 the one printing "ran".
#include <lockwatch/lockwatch.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

int main(int argc, char** argv) {
  lockwatch::Options o = lockwatch::Options::from_env();
  if (argc > 1) o.store_url = argv[1];
  auto period = std::chrono::milliseconds(argc > 2 ? std::atoi(argv[2]) : 1000);
  lockwatch::Runtime rt(o);
  lockwatch::Scheduler jobs(rt);
  lockwatch::JobOptions jo;
  jo.lease = std::chrono::seconds(3);
  auto h = jobs.every(period, "sample:leader-job", [](const lockwatch::JobRun& run) {
    std::printf("pid %d ran period %lld (fencing token %llu)\n", static_cast<int>(getpid()),
                static_cast<long long>(run.period()), static_cast<unsigned long long>(run.fencing_token()));
    std::fflush(stdout);
  }, jo);
  std::printf("pid %d declared job 'sample:leader-job'; waiting to lead\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  bool was_leader = false;
  for (;;) {  // report leadership changes; the job itself runs on its own
    bool leader = h.is_leader();
    if (leader != was_leader) std::printf("pid %d %s\n", static_cast<int>(getpid()), leader ? "leads" : "stands by");
    std::fflush(stdout);
    was_leader = leader;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}
