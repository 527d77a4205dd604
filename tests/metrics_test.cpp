// Metrics, the /metrics endpoint, observers and the log, on an in-memory
// store: parsed as a Prometheus scraper would, and checked against what the
// test did.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <mutex>
#include <sstream>
#include <type_traits>

#include "loopback_http.hpp"
#include "memory_runtime.hpp"

namespace lockwatch::testing {
namespace {

// One scrape: sample name with its labels ("name{a=\"b\"}") -> value, and
// the TYPE of each family.
struct Scrape {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> types;
  std::vector<std::string> errors;

  double at(const std::string& sample) const {
    auto it = samples.find(sample);
    if (it == samples.end()) {
      ADD_FAILURE() << "no sample " << sample;
      return -1;
    }
    return it->second;
  }
};

Scrape parse(const std::string& text) {
  Scrape s;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.starts_with("# TYPE ")) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      if (type != "counter" && type != "gauge" && type != "histogram") s.errors.push_back("bad type: " + line);
      s.types[name] = type;
      continue;
    }
    if (line.starts_with("#")) continue;
    auto sp = line.rfind(' ');
    if (sp == std::string::npos) {
      s.errors.push_back("no value: " + line);
      continue;
    }
    std::string name = line.substr(0, sp), value = line.substr(sp + 1);
    double v = value == "+Inf" ? std::numeric_limits<double>::infinity() : std::stod(value);
    std::string family = name.substr(0, name.find('{'));
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (family.ends_with(suffix) && s.types.count(family.substr(0, family.size() - std::strlen(suffix))))
        family = family.substr(0, family.size() - std::strlen(suffix));
    }
    if (!s.types.count(family)) s.errors.push_back("sample before its TYPE: " + line);
    if (!s.samples.emplace(name, v).second) s.errors.push_back("duplicate sample: " + line);
  }
  return s;
}

// GET `path` from 127.0.0.1:port over a plain socket; returns the whole
// response (head and body).
std::string http_get(const std::string& address, const std::string& request) {
  return loopback_exchange(std::stoi(address.substr(address.rfind(':') + 1)), request);
}

class Recorder : public Observer {
 public:
  void on_acquired(std::string_view key, std::uint64_t, Duration) override { add("acquired " + std::string(key)); }
  void on_busy(std::string_view key, Duration) override { add("busy " + std::string(key)); }
  void on_acquire_failed(std::string_view key, std::string_view) override { add("failed " + std::string(key)); }
  void on_renewed(std::string_view key, Duration slack) override {
    if (slack > Duration::zero()) add("renewed " + std::string(key));
  }
  void on_renewal_failed(std::string_view key, std::string_view) override { add("renewal_failed " + std::string(key)); }
  void on_lost(std::string_view key, LostReason r, std::string_view) override {
    add("lost " + std::string(key) + (r == LostReason::kStoreUnreachable ? " unreachable" : " other"));
  }
  void on_released(std::string_view key, Duration) override { add("released " + std::string(key)); }
  void on_connection(std::string_view, bool up, std::string_view) override { add(up ? "up" : "down"); }
  void on_held_long(std::string_view key, Duration) override { add("held_long " + std::string(key)); }

  std::vector<std::string> events() {
    std::lock_guard lk(mu_);
    return events_;
  }
  bool wait_for(const std::string& e) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, kBound, [&] { return std::find(events_.begin(), events_.end(), e) != events_.end(); });
  }
  std::thread::id thread() {
    std::lock_guard lk(mu_);
    return thread_;
  }

 private:
  void add(std::string e) {
    std::lock_guard lk(mu_);
    thread_ = std::this_thread::get_id();
    events_.push_back(std::move(e));
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> events_;
  std::thread::id thread_;
};

// A W3C traceparent, as a caller would attach it.
constexpr std::string_view kTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// A span event as told, its views copied.
struct Span {
  SpanKind kind;
  std::string key, context, detail;
  std::chrono::system_clock::time_point at;
  SpanEvent::Duration duration;
  std::uint64_t fencing_token;
  bool acquired;
  LostReason reason;
};

class SpanRecorder : public Observer {
 public:
  void on_span(const SpanEvent& e) override {
    std::lock_guard lk(mu_);
    spans_.push_back(Span{e.kind, std::string(e.key), std::string(e.context), std::string(e.detail), e.at, e.duration,
                          e.fencing_token, e.acquired, e.reason});
    cv_.notify_all();
  }
  // Waits (at most kBound) for a span of `kind` on `key`; then the spans
  // told on `key` so far, in order.
  std::vector<Span> wait_for(const std::string& key, SpanKind kind) {
    std::unique_lock lk(mu_);
    const bool told = cv_.wait_for(lk, kBound, [&] {
      return std::any_of(spans_.begin(), spans_.end(), [&](const Span& s) { return s.key == key && s.kind == kind; });
    });
    EXPECT_TRUE(told) << "no " << to_string(kind) << " span on " << key;
    std::vector<Span> on_key;
    for (const auto& s : spans_)
      if (s.key == key) on_key.push_back(s);
    return on_key;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Span> spans_;
};

std::vector<SpanKind> kinds_of(const std::vector<Span>& spans) {
  std::vector<SpanKind> kinds;
  for (const auto& s : spans) kinds.push_back(s.kind);
  return kinds;
}

class MetricsTest : public ::testing::Test {
 protected:
  void start(Options o = memory_options()) { rt_ = memory_runtime(backend_, script_, std::move(o)); }
  void TearDown() override { rt_.reset(); }

  std::shared_ptr<MemoryBackend> backend_ = std::make_shared<MemoryBackend>();
  std::shared_ptr<StoreScript> script_ = std::make_shared<StoreScript>();
  std::unique_ptr<Runtime> rt_;
};

TEST_F(MetricsTest, EveryFamilyIsThereFromTheStartWithZeros) {
  start();
  auto s = parse(rt_->metrics_text());
  EXPECT_TRUE(s.errors.empty()) << s.errors.front();
  for (const char* family :
       {"lockwatch_acquisitions_total", "lockwatch_acquire_duration_seconds", "lockwatch_hold_duration_seconds",
        "lockwatch_renewals_total", "lockwatch_renewal_failures_total", "lockwatch_leases_lost_total",
        "lockwatch_leases_held", "lockwatch_renewal_slack_seconds", "lockwatch_loop_lag_seconds",
        "lockwatch_cluster_redirects_total", "lockwatch_waiting", "lockwatch_waits_long",
        "lockwatch_oldest_wait_seconds", "lockwatch_holds_long_total"})
    EXPECT_TRUE(s.types.count(family)) << family;
  EXPECT_EQ(s.types["lockwatch_acquire_duration_seconds"], "histogram");
  EXPECT_EQ(s.types["lockwatch_leases_held"], "gauge");
  for (const char* result : {"acquired", "busy", "error"})
    EXPECT_EQ(s.at(fmt::format("lockwatch_acquisitions_total{{result=\"{}\"}}", result)), 0) << result;
  for (const char* reason : {"expired", "taken_by_other", "renewals_exhausted", "unreachable", "not_started", "removed"})
    EXPECT_EQ(s.at(fmt::format("lockwatch_leases_lost_total{{reason=\"{}\"}}", reason)), 0) << reason;
  for (const char* kind : {"moved", "ask"})
    EXPECT_EQ(s.at(fmt::format("lockwatch_cluster_redirects_total{{kind=\"{}\"}}", kind)), 0) << kind;
  EXPECT_EQ(s.at("lockwatch_renewal_slack_seconds"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(s.at("lockwatch_hold_duration_seconds_count"), 0);
}

TEST_F(MetricsTest, CountsMatchWhatTheCallsDid) {
  start();
  for (int i = 0; i < 5; ++i) {
    auto f = locked("counted", 1s, forever).on(*rt_)([] {})();
    get_bounded(f);
  }
  backend_->set_owner(memory_name("busy-one"), "other", 10s);
  auto busy = rt_->acquire("busy-one", 1s);
  EXPECT_TRUE(error_of<LockNotAcquired>(busy));
  script_->set_down(true);
  auto failed = rt_->acquire("down-one", 1s);
  EXPECT_TRUE(error_of<ConnectionError>(failed));
  script_->set_down(false);
  auto held = rt_->acquire("held-one", 300ms);
  auto h = get_bounded(held);
  ASSERT_TRUE(renewed_again(h.lease(), 1));

  auto s = parse(rt_->metrics_text());
  EXPECT_TRUE(s.errors.empty());
  EXPECT_EQ(s.at("lockwatch_acquisitions_total{result=\"acquired\"}"), 6);
  EXPECT_EQ(s.at("lockwatch_acquisitions_total{result=\"busy\"}"), 1);
  EXPECT_EQ(s.at("lockwatch_acquisitions_total{result=\"error\"}"), 1);
  // Acquired and busy, waiting included: the handles' without a pattern,
  // the LOCKED calls' under theirs.
  EXPECT_EQ(s.at("lockwatch_acquire_duration_seconds_count"), 2);
  EXPECT_EQ(s.at("lockwatch_acquire_duration_seconds_count{pattern=\"counted\"}"), 5);
  EXPECT_EQ(s.at("lockwatch_hold_duration_seconds_count{pattern=\"counted\"}"), 5);
  EXPECT_EQ(s.at("lockwatch_hold_duration_seconds_count"), 0);
  EXPECT_EQ(s.at("lockwatch_leases_held"), 1);
  EXPECT_GE(s.at("lockwatch_renewals_total"), 1);
  EXPECT_GT(s.at("lockwatch_renewal_slack_seconds"), 0);
  EXPECT_LT(s.at("lockwatch_renewal_slack_seconds"), 0.3);
  // Buckets are cumulative and end at the count.
  EXPECT_EQ(s.at("lockwatch_hold_duration_seconds_bucket{pattern=\"counted\",le=\"+Inf\"}"),
            s.at("lockwatch_hold_duration_seconds_count{pattern=\"counted\"}"));
  EXPECT_LE(s.at("lockwatch_hold_duration_seconds_bucket{pattern=\"counted\",le=\"0.001\"}"),
            s.at("lockwatch_hold_duration_seconds_bucket{pattern=\"counted\",le=\"0.01\"}"));
  EXPECT_GE(s.at("lockwatch_loop_lag_seconds_count"), 1);
  h.release().get();
}

// The acquisition and hold histograms carry the LOCKED key pattern as
// written, never a key: one series per pattern however many keys it makes.
TEST_F(MetricsTest, HistogramsAreLabelledByKeyPatternNeverByKey) {
  start();
  auto reserve = LOCKED("sku:{0}", 1s, forever, .on(*rt_))[](int) {};
  auto transfer = LOCKED(all_of("acct:{0}", "acct:{1}"), 1s, forever, .on(*rt_))[](int, int) {};
  for (int i = 0; i < 3; ++i) {
    auto f = reserve(i);
    get_bounded(f);
  }
  auto t = transfer(1, 2);
  get_bounded(t);
  auto s = parse(rt_->metrics_text());
  EXPECT_TRUE(s.errors.empty()) << s.errors.front();
  EXPECT_EQ(s.at("lockwatch_acquire_duration_seconds_count{pattern=\"sku:{0}\"}"), 3);
  EXPECT_EQ(s.at("lockwatch_hold_duration_seconds_count{pattern=\"sku:{0}\"}"), 3);
  // A set's keys count each under the set's pattern.
  EXPECT_EQ(s.at("lockwatch_acquire_duration_seconds_count{pattern=\"all_of(\\\"acct:{0}\\\", \\\"acct:{1}\\\")\"}"), 2);
  EXPECT_EQ(s.at("lockwatch_hold_duration_seconds_count{pattern=\"all_of(\\\"acct:{0}\\\", \\\"acct:{1}\\\")\"}"), 2);
  const std::string text = rt_->metrics_text();
  EXPECT_EQ(text.find("sku:1"), std::string::npos);
  EXPECT_EQ(text.find("acct:1\""), std::string::npos);
}

TEST_F(MetricsTest, LossesAreCountedByReason) {
  start();
  // A 2 s ttl leaves its renewal 178 ms before the local deadline: enough
  // for the "someone else's" answer to arrive in time on a slow (TSan) run.
  auto a = rt_->acquire("steal-me", 2s);
  auto ha = get_bounded(a);
  backend_->set_owner(memory_name("steal-me"), "thief", 5s);
  auto b = locked("spend", 150ms, 0).on(*rt_)([] {
    stopped_within_bound(this_lease().stop_token());
  })();
  EXPECT_TRUE(error_of<LeaseLost>(b));
  ASSERT_TRUE(stopped_within_bound(ha.lease().stop_token()));
  auto s = parse(rt_->metrics_text());
  EXPECT_EQ(s.at("lockwatch_leases_lost_total{reason=\"taken_by_other\"}"), 1);
  EXPECT_EQ(s.at("lockwatch_leases_lost_total{reason=\"renewals_exhausted\"}"), 1);
  EXPECT_EQ(s.at("lockwatch_leases_lost_total{reason=\"expired\"}"), 0);
  EXPECT_THROW(ha.release().get(), LeaseLost);
}

TEST_F(MetricsTest, TheEndpointServesWhatMetricsTextSays) {
  Options o = memory_options();
  o.observability.metrics_listen = "127.0.0.1:0";
  start(o);
  auto f = locked("scraped", 1s, forever).on(*rt_)([] {})();
  get_bounded(f);
  std::string address = rt_->metrics_address();
  ASSERT_FALSE(address.empty());
  EXPECT_TRUE(address.starts_with("127.0.0.1:"));
  std::string response = http_get(address, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(response.starts_with("HTTP/1.1 200 OK\r\n")) << response.substr(0, 80);
  EXPECT_NE(response.find("Content-Type: text/plain; version=0.0.4\r\n"), std::string::npos);
  auto body = response.substr(response.find("\r\n\r\n") + 4);
  auto s = parse(body);
  EXPECT_TRUE(s.errors.empty());
  EXPECT_EQ(s.at("lockwatch_acquisitions_total{result=\"acquired\"}"), 1);
  EXPECT_EQ(s.at("lockwatch_hold_duration_seconds_count{pattern=\"scraped\"}"), 1);
}

TEST_F(MetricsTest, AnythingButGetMetricsIsNotFound) {
  Options o = memory_options();
  o.observability.metrics_listen = "127.0.0.1:0";
  start(o);
  for (const char* request : {"GET / HTTP/1.1\r\n\r\n", "POST /metrics HTTP/1.1\r\n\r\n",
                              "GET /metricsx HTTP/1.0\r\n\r\n", "garbage\r\n\r\n"}) {
    std::string response = http_get(rt_->metrics_address(), request);
    EXPECT_TRUE(response.starts_with("HTTP/1.1 404 Not Found\r\n")) << request;
  }
  EXPECT_TRUE(http_get(rt_->metrics_address(), "GET /metrics?x=1 HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
}

TEST_F(MetricsTest, ASilentClientDoesNotStallTheLoop) {
  Options o = memory_options();
  o.observability.metrics_listen = "127.0.0.1:0";
  start(o);
  // Connect and say nothing: the loop goes on serving locks and scrapes.
  auto address = rt_->metrics_address();
  int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::vector<int> silent;
  for (int i = 0; i < 5; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    (void)!::write(fd, "GET /met", 8);  // half a request, never finished
    silent.push_back(fd);
  }
  auto t0 = std::chrono::steady_clock::now();
  auto f = locked("while-silent", 1s, forever).on(*rt_)([] { return 1; })();
  EXPECT_EQ(get_bounded(f), 1);
  EXPECT_TRUE(http_get(address, "GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
  EXPECT_LT(ms_between(t0, std::chrono::steady_clock::now()), 1s);
  for (int fd : silent) ::close(fd);
}

TEST_F(MetricsTest, ABadListenAddressIsInvalid) {
  Options o = memory_options();
  for (const char* bad : {"9464", "localhost:9464", "127.0.0.1:99999", "127.0.0.1:"}) {
    o.observability.metrics_listen = bad;
    EXPECT_THROW(o.validate(), InvalidArgument) << bad;
  }
}

TEST_F(MetricsTest, AnAddressInUseIsAListenErrorThatSaysMetrics) {
  Options o = memory_options();
  o.observability.metrics_listen = "127.0.0.1:0";
  start(o);
  Options again = memory_options();
  again.observability.metrics_listen = rt_->metrics_address();
  try {
    memory_runtime(backend_, script_, again);
    ADD_FAILURE() << "a second runtime listened on " << again.observability.metrics_listen;
  } catch (const ListenError& e) {
    EXPECT_EQ(e.address(), again.observability.metrics_listen);
    std::string what = e.what();
    EXPECT_NE(what.find("metrics"), std::string::npos) << what;
    EXPECT_NE(what.find(again.observability.metrics_listen), std::string::npos) << what;
    EXPECT_NE(what.find("address already in use"), std::string::npos) << what;
    EXPECT_EQ(what.find("redis"), std::string::npos) << "the store is not involved: " << what;
  }
  static_assert(!std::is_base_of_v<ConnectionError, ListenError>, "a busy port is no store error");
}

TEST_F(MetricsTest, HeadMetricsGetsTheHeadOfGetWithoutTheBody) {
  Options o = memory_options();
  o.observability.metrics_listen = "127.0.0.1:0";
  start(o);
  std::string get = http_get(rt_->metrics_address(), "GET /metrics HTTP/1.1\r\n\r\n");
  std::string head = http_get(rt_->metrics_address(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(head.starts_with("HTTP/1.1 200 OK\r\n")) << head.substr(0, 80);
  EXPECT_NE(head.find("Content-Type: text/plain; version=0.0.4\r\n"), std::string::npos) << head;
  auto end = head.find("\r\n\r\n");
  ASSERT_NE(end, std::string::npos) << head;
  EXPECT_EQ(head.size(), end + 4) << "no body after the head: " << head;
  // The length GET's body has (nothing changed in between).
  auto length_of = [](const std::string& r) {
    auto at = r.find("Content-Length: ");
    return at == std::string::npos ? -1 : std::stol(r.substr(at + 16));
  };
  EXPECT_EQ(length_of(head), length_of(get));
  EXPECT_GT(length_of(head), 0);
  std::string missing = http_get(rt_->metrics_address(), "HEAD /other HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(missing.starts_with("HTTP/1.1 404 Not Found\r\n")) << missing;
  EXPECT_EQ(missing.size(), missing.find("\r\n\r\n") + 4) << missing;
}

// The names of this process's threads, from /proc (what ps -L shows).
std::multiset<std::string> thread_names() {
  std::multiset<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.insert(name);
  }
  return names;
}

TEST_F(MetricsTest, TheRuntimesThreadsAreNamed) {
  start(memory_options(2));
  auto names = thread_names();
  for (const char* name : {"lw-loop", "lw-notify", "lw-events", "lw-pool-0", "lw-pool-1"})
    EXPECT_EQ(names.count(name), 1u) << name;
  // Observers run on the event thread, locked work on the pool.
  struct NameOfEventThread : Observer {
    std::promise<std::string> name;
    void on_acquired(std::string_view, std::uint64_t, Duration) override {
      char buf[16] = {};
      ::pthread_getname_np(::pthread_self(), buf, sizeof buf);
      name.set_value(buf);
    }
  };
  auto observer = std::make_shared<NameOfEventThread>();
  auto told = observer->name.get_future();
  rt_->add_observer(observer);
  auto f = locked("named", 1s, forever).on(*rt_)([] {
    char buf[16] = {};
    ::pthread_getname_np(::pthread_self(), buf, sizeof buf);
    return std::string(buf);
  })();
  EXPECT_TRUE(get_bounded(f).starts_with("lw-pool-"));
  ASSERT_EQ(told.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(told.get(), "lw-events");
}

TEST_F(MetricsTest, ObserversHearEveryEventOffTheLoopInOrder) {
  start();
  auto rec = std::make_shared<Recorder>();
  rt_->add_observer(rec);
  auto f = locked("observed", 300ms, forever).on(*rt_)([] { return renewed_again(this_lease(), 1); })();
  EXPECT_TRUE(get_bounded(f));
  ASSERT_TRUE(rec->wait_for("released observed"));
  backend_->set_owner(memory_name("observed-busy"), "other", 10s);
  auto busy = rt_->acquire("observed-busy", 1s);
  EXPECT_TRUE(error_of<LockNotAcquired>(busy));
  ASSERT_TRUE(rec->wait_for("busy observed-busy"));
  auto ev = rec->events();
  auto pos = [&](const std::string& e) { return std::find(ev.begin(), ev.end(), e) - ev.begin(); };
  EXPECT_LT(pos("acquired observed"), pos("renewed observed"));
  EXPECT_LT(pos("renewed observed"), pos("released observed"));
  EXPECT_NE(rec->thread(), std::this_thread::get_id());
}

TEST_F(MetricsTest, ObserversHearOfLossesAndFailedRenewals) {
  start();
  auto rec = std::make_shared<Recorder>();
  rt_->add_observer(rec);
  script_->script_renew([](const std::string&) -> std::optional<detail::Renewed> { return detail::Renewed::kTransient; });
  auto h = get_bounded(*std::make_unique<std::future<LockHandle>>(rt_->acquire("doomed", 200ms)));
  ASSERT_TRUE(rec->wait_for("renewal_failed doomed"));
  ASSERT_TRUE(rec->wait_for("lost doomed unreachable"));
  EXPECT_THROW(h.release().get(), LeaseLost);
}

TEST_F(MetricsTest, TheLogSinkGetsLossesAndNothingOnTheHappyPath) {
  auto lines = std::make_shared<std::vector<std::pair<LogLevel, std::string>>>();
  auto mu = std::make_shared<std::mutex>();
  Options o = memory_options();
  o.observability.log = [lines, mu](LogLevel level, std::string_view line) {
    std::lock_guard lk(*mu);
    lines->emplace_back(level, std::string(line));
  };
  start(o);
  auto ok = locked("happy", 300ms, forever).on(*rt_)([] { return 1; })();
  EXPECT_EQ(get_bounded(ok), 1);
  auto h = get_bounded(*std::make_unique<std::future<LockHandle>>(rt_->acquire("unhappy", 300ms)));
  backend_->set_owner(memory_name("unhappy"), "thief", 5s);
  EXPECT_THROW(h.release().get(), LeaseLost);
  rt_.reset();  // the event thread has told everything by now
  std::lock_guard lk(*mu);
  ASSERT_EQ(lines->size(), 1u);
  EXPECT_EQ(lines->front().first, LogLevel::kWarning);
  EXPECT_NE(lines->front().second.find("'unhappy'"), std::string::npos) << lines->front().second;
  EXPECT_NE(lines->front().second.find("taken by another owner"), std::string::npos) << lines->front().second;
}

// Scrapes until `ok` holds for the scrape, at most kBound; the last scrape.
template <class F>
Scrape scrape_until(Runtime& rt, F&& ok) {
  const auto until = std::chrono::steady_clock::now() + kBound;
  for (;;) {
    Scrape s = parse(rt.metrics_text());
    if (ok(s) || std::chrono::steady_clock::now() > until) return s;
    std::this_thread::sleep_for(5ms);  // polling a gauge: no event to await
  }
}

TEST_F(MetricsTest, WaitingCallsAreCountedWhileTheyWait) {
  Options o = memory_options();
  o.observability.wait_warning = 150ms;
  start(o);
  auto s = parse(rt_->metrics_text());
  EXPECT_EQ(s.types["lockwatch_waiting"], "gauge");
  EXPECT_EQ(s.types["lockwatch_waits_long"], "gauge");
  EXPECT_EQ(s.at("lockwatch_waiting"), 0);
  EXPECT_EQ(s.at("lockwatch_oldest_wait_seconds"), 0);
  backend_->set_owner(memory_name("contended"), "other", 60s);
  auto a = rt_->acquire({.key = "contended", .ttl = 1s, .retries = forever, .wait = 30s});
  auto b = rt_->acquire({.key = "contended", .ttl = 1s, .retries = forever, .wait = 30s});
  auto once = rt_->acquire("contended", 1s);  // tries once: never waiting
  EXPECT_TRUE(error_of<LockNotAcquired>(once));
  s = scrape_until(*rt_, [](const Scrape& s) { return s.at("lockwatch_waiting") == 2; });
  ASSERT_EQ(s.at("lockwatch_waiting"), 2);
  // Seen while they wait, not only once they end.
  s = scrape_until(*rt_, [](const Scrape& s) { return s.at("lockwatch_waits_long") == 2; });
  EXPECT_EQ(s.at("lockwatch_waits_long"), 2);
  EXPECT_GE(s.at("lockwatch_oldest_wait_seconds"), 0.15);
  EXPECT_EQ(s.at("lockwatch_acquire_duration_seconds_count"), 1);  // the one that tried once
  backend_->release_as_other(memory_name("contended"));
  auto ha = get_bounded(a);
  ha.release().get();
  auto hb = get_bounded(b);
  s = parse(rt_->metrics_text());
  EXPECT_EQ(s.at("lockwatch_waiting"), 0);
  EXPECT_EQ(s.at("lockwatch_waits_long"), 0);
  EXPECT_EQ(s.at("lockwatch_oldest_wait_seconds"), 0);
  hb.release().get();
}

TEST_F(MetricsTest, ALeaseHeldPastHoldWarningIsToldOnce) {
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  Options o = memory_options();
  o.observability.hold_warning = 200ms;
  o.observability.log = [lines, mu](LogLevel level, std::string_view line) {
    std::lock_guard lk(*mu);
    if (level == LogLevel::kWarning) lines->emplace_back(line);
  };
  start(o);
  auto rec = std::make_shared<Recorder>();
  rt_->add_observer(rec);
  // Released before the warning: not counted.
  auto quick = locked("quick", 1s, forever).on(*rt_)([] { return 1; })();
  EXPECT_EQ(get_bounded(quick), 1);
  auto h = get_bounded(*std::make_unique<std::future<LockHandle>>(rt_->acquire("slow-job", 150ms)));
  ASSERT_TRUE(rec->wait_for("held_long slow-job"));
  // Held on through more renewals: still told once.
  ASSERT_TRUE(renewed_again(h.lease(), 3));
  auto s = parse(rt_->metrics_text());
  EXPECT_EQ(s.at("lockwatch_holds_long_total"), 1);
  h.release().get();
  rt_.reset();  // the event thread has told everything by now
  auto ev = rec->events();
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "held_long slow-job"), 1);
  EXPECT_EQ(std::count(ev.begin(), ev.end(), "held_long quick"), 0);
  std::lock_guard lk(*mu);
  ASSERT_EQ(lines->size(), 1u);
  EXPECT_NE(lines->front().find("'slow-job'"), std::string::npos) << lines->front();
  EXPECT_NE(lines->front().find(std::to_string(::getpid())), std::string::npos) << lines->front();
  EXPECT_NE(lines->front().find(":metrics_test"), std::string::npos) << "the owner name: " << lines->front();
}

TEST_F(MetricsTest, RedisUrlBesideADifferentStoreUrlIsWarnedOfAsDeprecated) {
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  auto runtime_with = [&](std::string store_url, std::string redis_url) {
    Options o = memory_options();
    o.store_url = std::move(store_url);
    o.redis_url = std::move(redis_url);
    o.observability.log = [lines, mu](LogLevel level, std::string_view line) {
      std::lock_guard lk(*mu);
      if (level == LogLevel::kWarning) lines->emplace_back(line);
    };
    start(o);
    rt_.reset();  // the event thread has told everything by now
  };
  runtime_with("memory://a", "redis://:secret@127.0.0.2:6390");
  {
    std::lock_guard lk(*mu);
    ASSERT_EQ(lines->size(), 1u);
    EXPECT_NE(lines->front().find("redis_url (LOCKWATCH_REDIS_URL) is the deprecated name"), std::string::npos)
        << lines->front();
    EXPECT_EQ(lines->front().find("secret"), std::string::npos) << "no URL in the log";
    lines->clear();
  }
  runtime_with("memory://a", "redis://127.0.0.1:6379");  // the default: not set
  runtime_with("", "redis://127.0.0.2:6390");            // the old name alone
  runtime_with("memory://a", "memory://a");              // the same URL
  std::lock_guard lk(*mu);
  EXPECT_TRUE(lines->empty()) << lines->front();
}

TEST_F(MetricsTest, HoldWarningIsOffByDefaultAndNegativeWarningsAreInvalid) {
  EXPECT_EQ(Options().observability.hold_warning, 0ms);
  Options o;
  o.observability.hold_warning = -1ms;
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.observability.hold_warning = 0ms;
  o.observability.wait_warning = -1ms;
  EXPECT_THROW(o.validate(), InvalidArgument);
}

}  // namespace
}  // namespace lockwatch::testing

namespace lockwatch::testing {
namespace {

TEST_F(MetricsTest, SpansFollowAGrantedCallFromItsWaitToItsReleaseWithItsContext) {
  start();
  auto rec = std::make_shared<SpanRecorder>();
  rt_->add_observer(rec);
  const auto before = std::chrono::system_clock::now();
  auto f = rt_->acquire({.key = "traced", .ttl = 1s, .context = std::string(kTraceparent)});
  auto h = get_bounded(f);
  const auto token = h.lease().fencing_token();
  auto released = h.release();
  get_bounded(released);
  auto spans = rec->wait_for("traced", SpanKind::kReleased);
  ASSERT_EQ(kinds_of(spans), (std::vector<SpanKind>{SpanKind::kWaitStarted, SpanKind::kWaitEnded, SpanKind::kHeld,
                                                    SpanKind::kReleased}));
  for (const auto& s : spans) {
    EXPECT_EQ(s.context, kTraceparent) << to_string(s.kind);
    EXPECT_GE(s.at, before - 1s) << to_string(s.kind);
    EXPECT_LE(s.at, std::chrono::system_clock::now()) << to_string(s.kind);
  }
  for (std::size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].at, spans[i].at) << i;
  EXPECT_TRUE(spans[1].acquired);
  EXPECT_GE(spans[1].duration, SpanEvent::Duration::zero());
  EXPECT_LT(spans[1].duration, kBound);
  for (std::size_t i = 1; i < 4; ++i) EXPECT_EQ(spans[i].fencing_token, token) << to_string(spans[i].kind);
  EXPECT_GT(spans[3].duration, SpanEvent::Duration::zero());
  EXPECT_LT(spans[3].duration, kBound);
}

TEST_F(MetricsTest, ABusyCallEndsItsWaitSpanWithoutTheLock) {
  start();
  auto rec = std::make_shared<SpanRecorder>();
  rt_->add_observer(rec);
  backend_->set_owner(memory_name("traced-busy"), "other", 10s);
  auto f = rt_->acquire({.key = "traced-busy", .ttl = 1s, .wait = 20ms, .context = std::string(kTraceparent)});
  EXPECT_TRUE(error_of<LockNotAcquired>(f));
  auto spans = rec->wait_for("traced-busy", SpanKind::kWaitEnded);
  ASSERT_EQ(kinds_of(spans), (std::vector<SpanKind>{SpanKind::kWaitStarted, SpanKind::kWaitEnded}));
  EXPECT_FALSE(spans[1].acquired);
  EXPECT_EQ(spans[1].detail, "busy");
  EXPECT_EQ(spans[1].context, kTraceparent);
  EXPECT_GE(spans[1].duration, 20ms);
  EXPECT_LT(spans[1].duration, kBound);
  EXPECT_EQ(spans[1].fencing_token, 0u);
}

TEST_F(MetricsTest, ACancelledWaitEndsItsWaitSpan) {
  start();
  auto rec = std::make_shared<SpanRecorder>();
  rt_->add_observer(rec);
  backend_->set_owner(memory_name("traced-cancel"), "other", 30s);
  std::promise<std::error_code> told;
  auto code = told.get_future();
  auto ticket = rt_->async_acquire({.key = "traced-cancel", .ttl = 1s, .wait = 10s, .context = "cancel-me"},
                                   [&told](std::error_code ec, LockHandle) { told.set_value(ec); });
  (void)rec->wait_for("traced-cancel", SpanKind::kWaitStarted);
  EXPECT_TRUE(ticket.cancel());
  ASSERT_EQ(code.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(code.get(), errc::cancelled);
  auto spans = rec->wait_for("traced-cancel", SpanKind::kWaitEnded);
  ASSERT_EQ(kinds_of(spans), (std::vector<SpanKind>{SpanKind::kWaitStarted, SpanKind::kWaitEnded}));
  EXPECT_FALSE(spans[1].acquired);
  EXPECT_EQ(spans[1].detail, "cancelled");
  EXPECT_EQ(spans[1].context, "cancel-me");
  EXPECT_LT(spans[1].duration, 10s);
}

TEST_F(MetricsTest, ALostLeaseEndsItsHoldSpanWithTheReasonAndNoRelease) {
  start();
  auto rec = std::make_shared<SpanRecorder>();
  rt_->add_observer(rec);
  auto f = locked("traced-lost", 300ms, forever).on(*rt_).context(kTraceparent)([this] {
    backend_->erase(memory_name("traced-lost"));
    return stopped_within_bound(this_lease().stop_token());
  })();
  auto err = error_of<LeaseLost>(f);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->reason(), LostReason::kRemoved);
  (void)rec->wait_for("traced-lost", SpanKind::kLost);
  // Events are told in order: once a later call's spans are told, any
  // release span of the lost lease would have been.
  auto later = rt_->acquire("traced-later", 1s);
  auto h = get_bounded(later);
  (void)rec->wait_for("traced-later", SpanKind::kHeld);
  auto spans = rec->wait_for("traced-lost", SpanKind::kLost);
  ASSERT_EQ(kinds_of(spans), (std::vector<SpanKind>{SpanKind::kWaitStarted, SpanKind::kWaitEnded, SpanKind::kHeld,
                                                    SpanKind::kLost}));
  EXPECT_EQ(spans[3].reason, LostReason::kRemoved);
  EXPECT_EQ(spans[3].context, kTraceparent);
  EXPECT_GT(spans[3].duration, SpanEvent::Duration::zero());
  EXPECT_LT(spans[3].duration, kBound);
  EXPECT_EQ(spans[3].fencing_token, spans[2].fencing_token);
  EXPECT_GT(spans[3].fencing_token, 0u);
  auto s = parse(rt_->metrics_text());
  EXPECT_EQ(s.at("lockwatch_leases_lost_total{reason=\"removed\"}"), 1);
  EXPECT_EQ(s.at("lockwatch_leases_lost_total{reason=\"expired\"}"), 0);
}

TEST_F(MetricsTest, EachCallCarriesTheContextItsFunctionGaveIt) {
  start();
  auto rec = std::make_shared<SpanRecorder>();
  rt_->add_observer(rec);
  std::atomic<int> calls{0};
  auto work = locked("traced-call:{0}", 1s, forever).on(*rt_).context_from([&calls] {
    return "call-" + std::to_string(++calls);
  })([](int) { return 1; });
  auto one = work(1);
  EXPECT_EQ(get_bounded(one), 1);
  auto two = work(2);
  EXPECT_EQ(get_bounded(two), 1);
  auto first = rec->wait_for("traced-call:1", SpanKind::kReleased);
  auto second = rec->wait_for("traced-call:2", SpanKind::kReleased);
  ASSERT_EQ(first.size(), 4u);
  ASSERT_EQ(second.size(), 4u);
  for (const auto& s : first) EXPECT_EQ(s.context, "call-1") << to_string(s.kind);
  for (const auto& s : second) EXPECT_EQ(s.context, "call-2") << to_string(s.kind);
  // A set's keys each carry the set's context.
  auto set = rt_->acquire({.key = all_of("traced-set:a", "traced-set:b"), .ttl = 1s, .context = "set"});
  auto h = get_bounded(set);
  for (const char* key : {"traced-set:a", "traced-set:b"}) {
    auto spans = rec->wait_for(key, SpanKind::kHeld);
    ASSERT_FALSE(spans.empty()) << key;
    for (const auto& s : spans) EXPECT_EQ(s.context, "set") << key;
  }
}

TEST_F(MetricsTest, ABadContextIsInvalidArgumentBeforeAnythingStarts) {
  start();
  auto rec = std::make_shared<SpanRecorder>();
  rt_->add_observer(rec);
  const std::string too_long(max_context_bytes + 1, 'x');
  for (const std::string& bad : {too_long, std::string("00-abc\n"), std::string("tab\there"), std::string(1, '\x7f')}) {
    EXPECT_THROW((void)rt_->acquire({.key = "ctx", .ttl = 1s, .context = bad}), InvalidArgument);
    std::promise<std::error_code> told;
    auto code = told.get_future();
    auto ticket = rt_->async_acquire({.key = "ctx", .ttl = 1s, .context = bad},
                                     [&told](std::error_code ec, LockHandle) { told.set_value(ec); });
    EXPECT_FALSE(ticket);
    ASSERT_EQ(code.wait_for(kBound), std::future_status::ready);
    EXPECT_EQ(code.get(), errc::invalid_argument);
    EXPECT_THROW((void)locked("ctx", 1s, 0).context(bad), InvalidArgument);
    auto call = locked("ctx", 1s, 0).on(*rt_).context_from([&bad] { return bad; })([] { return 1; })();
    EXPECT_TRUE(error_of<InvalidArgument>(call));
  }
  // The longest is taken, and nothing was started for the bad ones.
  auto f = rt_->acquire({.key = "ctx", .ttl = 1s, .context = std::string(max_context_bytes, 'x')});
  auto h = get_bounded(f);
  auto spans = rec->wait_for("ctx", SpanKind::kHeld);
  ASSERT_EQ(kinds_of(spans), (std::vector<SpanKind>{SpanKind::kWaitStarted, SpanKind::kWaitEnded, SpanKind::kHeld}));
  EXPECT_EQ(spans[0].context.size(), max_context_bytes);
}

TEST(SpanKindTest, EachKindHasItsWord) {
  EXPECT_STREQ(to_string(SpanKind::kWaitStarted), "wait_started");
  EXPECT_STREQ(to_string(SpanKind::kWaitEnded), "wait_ended");
  EXPECT_STREQ(to_string(SpanKind::kHeld), "held");
  EXPECT_STREQ(to_string(SpanKind::kReleased), "released");
  EXPECT_STREQ(to_string(SpanKind::kLost), "lost");
  EXPECT_NE(std::string(to_string(LostReason::kRemoved)).find("removed"), std::string::npos);
}

}  // namespace
}  // namespace lockwatch::testing
