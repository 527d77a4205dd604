// Watching the locks: an observer that reports lost leases, the metrics
// endpoint, and the metrics as text.
//
//   LOCKWATCH_STORE_URL=redis://127.0.0.1:6379 ./lockwatch-sample-observe
//   (meanwhile: curl http://127.0.0.1:9464/metrics)
#include <lockwatch/lockwatch.hpp>

#include <cstdio>
#include <string>

using namespace std::chrono_literals;

// Observers run on the runtime's event thread, never on its I/O thread.
struct LossAlarm : lockwatch::Observer {
  void on_lost(std::string_view key, lockwatch::LostReason reason, std::string_view) override {
    std::fprintf(stderr, "ALARM: lease on %.*s lost: %s\n", static_cast<int>(key.size()), key.data(),
                 lockwatch::to_string(reason));
  }
  void on_acquired(std::string_view key, std::uint64_t token, Duration waited) override {
    std::printf("acquired %.*s (token %llu) after %lld us\n", static_cast<int>(key.size()), key.data(),
                static_cast<unsigned long long>(token),
                static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(waited).count()));
  }
};

int main() {
  lockwatch::Options options = lockwatch::Options::from_env();
  options.observability.metrics_listen = "127.0.0.1:0";  // any free port; "127.0.0.1:9464" in production
  try {
    lockwatch::Runtime runtime(options);
    runtime.add_observer(std::make_shared<LossAlarm>());
    std::printf("metrics on http://%s/metrics\n", runtime.metrics_address().c_str());

    auto job = lockwatch::locked("report:{0}", 2s, lockwatch::forever).on(runtime)([](int day) { return day; });
    for (int day = 1; day <= 3; ++day) job(day).get();

    // The same text the endpoint serves; print the acquisitions.
    std::string text = runtime.metrics_text();
    for (std::size_t pos = 0, end; pos < text.size(); pos = end + 1) {
      end = text.find('\n', pos);
      std::string line = text.substr(pos, end - pos);
      if (line.rfind("lockwatch_acquisitions_total", 0) == 0 || line.rfind("lockwatch_leases_held", 0) == 0)
        std::printf("%s\n", line.c_str());
    }
  } catch (const lockwatch::Error& e) {
    std::fprintf(stderr, "lockwatch-sample-observe: %s\n", e.what());
    return 1;
  }
  return 0;
}
