// `lockwatch status`, `lockwatch ls` and `lockwatch release --force`: an
// operator's tools, over Runtime::inspect, Runtime::list and
// Runtime::force_release.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "commands.hpp"

namespace lockwatch::cli {
namespace {

Options options_for(const std::optional<std::string>& redis_url, bool verbose) {
  Options o = Options::from_env();
  if (redis_url) o.store_url = *redis_url;
  o.runtime.threads = 1;  // no locked work runs here
  o.observability.log = library_log(verbose);
  return o;
}

// A time point as ISO 8601 in UTC, to the millisecond ("" for none).
std::string utc_text(std::chrono::system_clock::time_point t) {
  if (t == std::chrono::system_clock::time_point{}) return "";
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                     tm.tm_hour, tm.tm_min, tm.tm_sec, ms % 1000);
}

// A duration for a person: "850ms", "12.3s", "4m05s", "3h02m".
std::string short_duration(std::chrono::milliseconds d) {
  const long long ms = d.count();
  if (ms < 1000) return fmt::format("{}ms", ms);
  if (ms < 60'000) return fmt::format("{}.{}s", ms / 1000, ms % 1000 / 100);
  if (ms < 3'600'000) return fmt::format("{}m{:02}s", ms / 60'000, ms / 1000 % 60);
  return fmt::format("{}h{:02}m", ms / 3'600'000, ms / 60'000 % 60);
}

// `s` as a JSON string (quotes included).
std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04x}", c);
        else
          out.push_back(static_cast<char>(c));
    }
  }
  return out + "\"";
}

std::string json_of(const LockState& s) {
  std::string holders;
  for (const auto& h : s.holders)
    holders += fmt::format("{}{{\"owner\":{},\"since\":{},\"held_for_ms\":{},\"token\":{}}}", holders.empty() ? "" : ",",
                           json_string(h.owner), json_string(utc_text(h.since)), h.held_for.count(),
                           json_string(h.token));
  return fmt::format(
      "{{\"key\":{},\"kind\":{},\"owner\":{},\"since\":{},\"held_for_ms\":{},\"ttl_ms\":{},\"fencing_token\":{},"
      "\"holders\":[{}]}}",
      json_string(s.key), json_string(s.kind.describe()), json_string(s.owner), json_string(utc_text(s.since)),
      s.held_for.count(), s.ttl.count(), s.fencing_token, holders);
}

}  // namespace

int status_command(const std::optional<std::string>& redis_url, const std::string& key, bool verbose) {
  Runtime rt(options_for(redis_url, verbose));
  LockState s = rt.inspect(key).get();  // bounded: every request ends by reply or command timeout
  fmt::print("key={}\nstate={}\nttl_ms={}\nfencing_token={}\n", s.key, s.held ? "held" : "free", s.ttl.count(),
             s.fencing_token);
  if (!s.held) return 0;
  fmt::print("kind={}\nowner={}\nsince={}\nheld_for_ms={}\n", s.kind.describe(), s.owner, utc_text(s.since),
             s.held_for.count());
  // The owner name last: it may hold spaces.
  for (const auto& h : s.holders) fmt::print("holder={} {} {}\n", h.held_for.count(), h.token, h.owner);
  return 0;
}

int ls_command(const std::optional<std::string>& store_url, const std::string& prefix, std::size_t limit, bool json,
               bool verbose) {
  Runtime rt(options_for(store_url, verbose));
  std::vector<LockState> locks = rt.list(prefix, limit).get();  // bounded: pages, each by reply or timeout
  std::sort(locks.begin(), locks.end(), [](const LockState& a, const LockState& b) { return a.key < b.key; });
  if (json) {
    std::string out = "[";
    for (const auto& s : locks) out += (out.size() > 1 ? "," : "") + json_of(s);
    fmt::print("{}]\n", out);
  } else {
    // One line per holder; the owner name last (it may hold spaces).
    struct Row {
      std::string key, kind, held_for, ttl, token, owner;
    };
    std::vector<Row> rows{{"KEY", "KIND", "HELD_FOR", "TTL", "TOKEN", "OWNER"}};
    for (const auto& s : locks) {
      if (s.holders.empty()) {
        rows.push_back({s.key, s.kind.describe(), "-", short_duration(s.ttl), std::to_string(s.fencing_token), "-"});
        continue;
      }
      for (const auto& h : s.holders)
        rows.push_back({s.key, s.kind.describe(), short_duration(h.held_for), short_duration(s.ttl),
                        std::to_string(s.fencing_token), h.owner.empty() ? "-" : h.owner});
    }
    std::size_t w[5] = {};
    for (const auto& r : rows) {
      w[0] = std::max(w[0], r.key.size());
      w[1] = std::max(w[1], r.kind.size());
      w[2] = std::max(w[2], r.held_for.size());
      w[3] = std::max(w[3], r.ttl.size());
      w[4] = std::max(w[4], r.token.size());
    }
    for (const auto& r : rows)
      fmt::print("{:<{}}  {:<{}}  {:>{}}  {:>{}}  {:>{}}  {}\n", r.key, w[0], r.kind, w[1], r.held_for, w[2], r.ttl,
                 w[3], r.token, w[4], r.owner);
  }
  if (locks.size() >= limit)
    std::fprintf(stderr, "lockwatch: the first %zu locks; more may be held (narrow PREFIX or raise --limit)\n", limit);
  return 0;
}

int release_command(const std::optional<std::string>& redis_url, const std::string& key, bool verbose) {
  Runtime rt(options_for(redis_url, verbose));
  bool was_held = rt.force_release(key).get();
  fmt::print("key={}\nwas_held={}\n", key, was_held ? "yes" : "no");
  return 0;
}

}  // namespace lockwatch::cli
