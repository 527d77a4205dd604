// The alerting rules and the Grafana dashboard lockwatch installs
// (ops/prometheus, ops/grafana): every metric they name is one the library
// exports (Runtime::metrics_text()), and a real Prometheus server scraping
// a runtime's /metrics endpoint fires the lost-lease alert when a lease is
// lost. (`promtool check rules` and `promtool test rules` run as their own
// test: tests/meson.build.)
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "loopback_http.hpp"
#include "memory_runtime.hpp"
#include "support/redis_server.hpp"

namespace lockwatch::testing {
namespace {

std::string read_file(const char* env) {
  const char* path = std::getenv(env);
  if (path == nullptr) throw std::runtime_error(std::string(env) + " is not set (tests/meson.build sets it)");
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot read ") + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The families metrics_text() renders (from its TYPE lines) with their types.
std::map<std::string, std::string> exported_families() {
  auto backend = std::make_shared<MemoryBackend>();
  auto script = std::make_shared<StoreScript>();
  auto rt = memory_runtime(backend, script);
  // A scheduled job's families have samples only once a job is declared;
  // their TYPE lines are there from the start.
  std::map<std::string, std::string> out;
  std::istringstream in(rt->metrics_text());
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("# TYPE ")) continue;
    std::istringstream t(line.substr(7));
    std::string name, type;
    t >> name >> type;
    out[name] = type;
  }
  return out;
}

// The lockwatch_* names in a PromQL expression, a histogram's series
// (_bucket, _sum, _count) named by their family.
std::set<std::string> metric_names(const std::string& expr, const std::map<std::string, std::string>& families) {
  static const std::regex name(R"(lockwatch_[a-z_]+)");
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), name); it != std::sregex_iterator(); ++it) {
    std::string n = it->str();
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string family = n.substr(0, n.size() - std::min(n.size(), std::strlen(suffix)));
      if (n.ends_with(suffix) && families.count(family) && families.at(family) == "histogram") n = family;
    }
    out.insert(n);
  }
  return out;
}

// Every "expr" string of the dashboard's JSON, unescaped.
std::vector<std::string> dashboard_exprs(const std::string& json) {
  static const std::regex expr(R"re("expr"\s*:\s*"((?:[^"\\]|\\.)*)")re");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(json.begin(), json.end(), expr); it != std::sregex_iterator(); ++it) {
    std::string raw = (*it)[1].str(), text;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '\\' && i + 1 < raw.size()) ++i;
      text.push_back(raw[i]);
    }
    out.push_back(text);
  }
  return out;
}

// The `expr:` of each rule of a rules file: the value on its line, or the
// folded (`>`) lines indented below it.
std::vector<std::string> rule_exprs(const std::string& yaml) {
  std::vector<std::string> out;
  std::istringstream in(yaml);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    auto at = lines[i].find("expr:");
    if (at == std::string::npos || lines[i].find_first_not_of(' ') != at) continue;
    std::string value = lines[i].substr(at + 5);
    if (value.find_first_not_of(" >|-") == std::string::npos) {
      value.clear();
      for (std::size_t j = i + 1; j < lines.size() && lines[j].find_first_not_of(' ') > at; ++j) value += lines[j];
    }
    out.push_back(value);
  }
  return out;
}

TEST(OpsFiles, EveryDashboardQueryNamesMetricsTheLibraryExports) {
  const auto families = exported_families();
  ASSERT_TRUE(families.count("lockwatch_leases_lost_total"));
  const auto exprs = dashboard_exprs(read_file("LOCKWATCH_DASHBOARD"));
  ASSERT_GE(exprs.size(), 10u);
  std::set<std::string> shown;
  for (const auto& e : exprs) {
    auto names = metric_names(e, families);
    EXPECT_FALSE(names.empty()) << "a query names no lockwatch metric: " << e;
    for (const auto& n : names) {
      EXPECT_TRUE(families.count(n)) << "the dashboard queries " << n << ", which the library does not export: " << e;
      shown.insert(n);
    }
  }
  // What an operator is on call for is on the dashboard.
  for (const char* needed : {"lockwatch_leases_lost_total", "lockwatch_renewal_slack_seconds", "lockwatch_waiting",
                             "lockwatch_waits_long", "lockwatch_holds_long_total", "lockwatch_loop_lag_seconds"})
    EXPECT_TRUE(shown.count(needed)) << needed << " is on no panel";
}

TEST(OpsFiles, EveryAlertNamesMetricsTheLibraryExports) {
  const auto families = exported_families();
  const std::string rules = read_file("LOCKWATCH_RULES");
  const auto exprs = rule_exprs(rules);
  ASSERT_EQ(exprs.size(), 5u);
  for (const auto& e : exprs) {
    auto names = metric_names(e, families);
    EXPECT_FALSE(names.empty()) << "a rule names no lockwatch metric: " << e;
    for (const auto& n : names)
      EXPECT_TRUE(families.count(n)) << "a rule uses " << n << ", which the library does not export: " << e;
  }
  for (const char* alert : {"LockwatchLeaseLost", "LockwatchRenewalSlackLow", "LockwatchHeldTooLong",
                            "LockwatchWaitingTooLong", "LockwatchLoopLag"})
    EXPECT_NE(rules.find("alert: " + std::string(alert)), std::string::npos) << alert;
}

// GET `path` from 127.0.0.1:port; the body ("" on any failure).
std::string http_body(int port, const std::string& path) {
  const std::string out = loopback_exchange(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  auto body = out.find("\r\n\r\n");
  return out.starts_with("HTTP/1.") && out.find(" 200 ") != std::string::npos && body != std::string::npos
             ? out.substr(body + 4)
             : std::string();
}

// Polls `path` until its body holds `text`, at most `bound`.
bool body_comes_to_hold(int port, const std::string& path, const std::string& text, std::chrono::seconds bound) {
  const auto until = std::chrono::steady_clock::now() + bound;
  while (std::chrono::steady_clock::now() < until) {
    if (http_body(port, path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(100ms);  // Prometheus has no event to await
  }
  return false;
}

TEST(PrometheusAlert, TheLeaseLostAlertFiresWhenALeaseIsLost) {
  const std::string prometheus = find_program("prometheus", "prometheus");
  auto backend = std::make_shared<MemoryBackend>();
  auto script = std::make_shared<StoreScript>();
  Options o = memory_options(1);
  o.observability.metrics_listen = "127.0.0.1:0";
  auto rt = memory_runtime(backend, script, o);

  const std::string dir = make_temp_dir("lockwatch-prometheus");
  {
    std::ofstream cfg(dir + "/prometheus.yml");
    cfg << "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n  evaluation_interval: 200ms\n"
        << "rule_files:\n  - " << std::getenv("LOCKWATCH_RULES") << "\n"
        << "scrape_configs:\n  - job_name: lockwatch\n    static_configs:\n      - targets: ['"
        << rt->metrics_address() << "']\n";
  }
  const int port = free_loopback_port();
  ChildProcess server({prometheus, "--config.file=" + dir + "/prometheus.yml", "--storage.tsdb.path=" + dir + "/data",
                       fmt::format("--web.listen-address=127.0.0.1:{}", port), "--log.level=warn"});
  ASSERT_TRUE(body_comes_to_hold(port, "/-/ready", "Ready", 15s)) << "prometheus did not start";
  // Scraped once with no loss, so that the loss is an increase.
  ASSERT_TRUE(body_comes_to_hold(port, "/api/v1/query?query=lockwatch_leases_lost_total", "taken_by_other", 10s));
  EXPECT_EQ(http_body(port, "/api/v1/alerts").find("LockwatchLeaseLost"), std::string::npos);

  auto h = get_bounded(*std::make_unique<std::future<LockHandle>>(rt->acquire("nightly", 300ms)));
  backend->set_owner(memory_name("nightly"), "thief", 10s);  // someone else's at the next renewal
  ASSERT_TRUE(stopped_within_bound(h.lease().stop_token()));
  EXPECT_TRUE(body_comes_to_hold(port, "/api/v1/alerts", "\"state\":\"firing\"", 15s));
  const std::string alerts = http_body(port, "/api/v1/alerts");
  EXPECT_NE(alerts.find("\"alertname\":\"LockwatchLeaseLost\""), std::string::npos) << alerts;
  EXPECT_NE(alerts.find("\"reason\":\"taken_by_other\""), std::string::npos) << alerts;
  EXPECT_THROW(h.release().get(), LeaseLost);
  server.kill(SIGTERM);
  server.wait(10s);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lockwatch::testing
