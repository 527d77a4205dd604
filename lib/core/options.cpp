#include "lockwatch/options.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <unistd.h>

#include "core/option_checks.hpp"
#include "core/tls.hpp"
#include "core/url.hpp"
#include "core/whole_number.hpp"
#include "lockwatch/errors.hpp"

namespace lockwatch {

namespace detail {

namespace {

// `shown` with the value of every query parameter whose name ends in
// "password" (Sentinel's sentinel_password) as ***.
std::string without_query_passwords(std::string shown) {
  auto q = shown.find('?');
  if (q == std::string::npos) return shown;
  std::size_t at = q + 1;
  while (at < shown.size()) {
    auto amp = shown.find('&', at);
    if (amp == std::string::npos) amp = shown.size();
    const auto eq = shown.find('=', at);
    if (eq != std::string::npos && eq < amp && std::string_view(shown).substr(at, eq - at).ends_with("password")) {
      shown.replace(eq + 1, amp - eq - 1, "***");
      amp = eq + 4;
    }
    at = amp + 1;
  }
  return shown;
}

}  // namespace

std::string url_for_messages(const std::string& url) {
  // The URL may hold a password: show the scheme given and only the part
  // after the last '@', and no password given in its query.
  auto at = url.rfind('@');
  if (at == std::string::npos) return without_query_passwords(url);
  auto sep = url.find("://");
  std::string scheme = (sep != std::string::npos && sep < at) ? url.substr(0, sep + 3) : std::string();
  return without_query_passwords(scheme + "***@" + url.substr(at + 1));
}

void throw_bad_url(const std::string& url, const char* why) {
  throw InvalidArgument(fmt::format("malformed URL '{}': {}", url_for_messages(url), why));
}

namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::string percent_decode(const std::string& url, std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) throw_bad_url(url, "truncated %-escape");
    int hi = hex_value(s[i + 1]);
    int lo = hex_value(s[i + 2]);
    if (hi < 0 || lo < 0) throw_bad_url(url, "bad %-escape");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

namespace {

int url_port(const std::string& url, std::string_view text) {
  const auto port = whole_number<int>(text);
  if (!port) throw_bad_url(url, "bad port");
  if (*port <= 0 || *port > 65535) throw_bad_url(url, "port out of range");
  return *port;
}

}  // namespace

bool take_credentials(const std::string& url, std::string_view& rest, std::string& user, std::string& password) {
  auto at = rest.rfind('@');
  if (at == std::string_view::npos) return false;
  std::string_view cred = rest.substr(0, at);
  rest.remove_prefix(at + 1);
  auto colon = cred.find(':');
  user = percent_decode(url, cred.substr(0, colon));
  if (colon != std::string_view::npos) password = percent_decode(url, cred.substr(colon + 1));
  return true;
}

std::string_view split_host_port(const std::string& url, std::string_view hostport, int& port) {
  if (!hostport.empty() && hostport.front() == '[') {  // [::1]:5432
    auto close = hostport.find(']');
    if (close == std::string_view::npos) throw_bad_url(url, "unclosed '[' in host");
    std::string_view after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') throw_bad_url(url, "bad port");
      port = url_port(url, after.substr(1));
    }
    return hostport.substr(1, close - 1);
  }
  if (auto colon = hostport.rfind(':'); colon != std::string_view::npos) {
    port = url_port(url, hostport.substr(colon + 1));
    return hostport.substr(0, colon);
  }
  return hostport;
}

std::string host_port(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

DatabaseUrl split_database_url(const std::string& url, std::string_view rest, std::string_view shape) {
  DatabaseUrl d;
  std::string_view query;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  take_credentials(url, rest, d.user, d.password);
  if (d.user.empty()) throw_bad_url(url, fmt::format("no user: {}", shape).c_str());
  auto slash = rest.find('/');
  if (slash == std::string_view::npos || slash + 1 >= rest.size())
    throw_bad_url(url, fmt::format("no database: {}", shape).c_str());
  d.database = percent_decode(url, rest.substr(slash + 1));
  d.host = percent_decode(url, split_host_port(url, rest.substr(0, slash), d.port));
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    auto eq = param.find('=');
    d.params.emplace_back(std::string(param.substr(0, eq)),
                          eq == std::string_view::npos ? std::string() : percent_decode(url, param.substr(eq + 1)));
  }
  return d;
}

}  // namespace detail

namespace {

[[noreturn]] void bad_url(const std::string& url, const char* why) { detail::throw_bad_url(url, why); }


}  // namespace

Endpoint Endpoint::parse(const std::string& url) {
  constexpr std::string_view kScheme = "redis://";
  constexpr std::string_view kTlsScheme = "rediss://";
  Endpoint ep;
  std::string_view rest(url);
  if (url.compare(0, kScheme.size(), kScheme) == 0) {
    rest.remove_prefix(kScheme.size());
  } else if (url.compare(0, kTlsScheme.size(), kTlsScheme) == 0) {
    rest.remove_prefix(kTlsScheme.size());
    ep.tls = true;
  } else {
    bad_url(url, "expected redis[s]://[user:password@]host:port[/db]");
  }

  if (auto at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view cred = rest.substr(0, at);
    rest.remove_prefix(at + 1);
    auto colon = cred.find(':');
    if (colon == std::string_view::npos) {
      ep.password = detail::percent_decode(url, cred);  // redis://password@host
    } else {
      ep.user = detail::percent_decode(url, cred.substr(0, colon));
      ep.password = detail::percent_decode(url, cred.substr(colon + 1));
    }
  }
  std::string_view hostport = rest;
  if (auto slash = rest.find('/'); slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!detail::whole_number(db, ep.db) || ep.db < 0))
      bad_url(url, "the database must be a number >= 0");
  }
  std::string_view host = hostport;
  if (!hostport.empty() && hostport.front() == '[') {  // [::1]:6379
    auto close = hostport.find(']');
    if (close == std::string_view::npos) bad_url(url, "unclosed '[' in host");
    host = hostport.substr(1, close - 1);
    std::string_view after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':' || !detail::whole_number(after.substr(1), ep.port)) bad_url(url, "bad port");
    }
  } else if (auto colon = hostport.rfind(':'); colon != std::string_view::npos) {
    host = hostport.substr(0, colon);
    if (!detail::whole_number(hostport.substr(colon + 1), ep.port)) bad_url(url, "bad port");
  }
  if (host.empty()) bad_url(url, "no host");
  if (ep.port <= 0 || ep.port > 65535) bad_url(url, "port out of range");
  ep.host = std::string(host);
  return ep;
}

std::vector<Endpoint> Endpoint::parse_list(const std::string& urls) {
  std::vector<Endpoint> out;
  std::size_t start = 0;
  while (true) {
    std::size_t comma = urls.find(',', start);
    std::string one = urls.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    auto first = one.find_first_not_of(" \t");
    auto last = one.find_last_not_of(" \t");
    one = first == std::string::npos ? std::string() : one.substr(first, last - first + 1);
    out.push_back(parse(one));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string Endpoint::name() const {
  if (port == 0) return "(master not yet known)";
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

Options Options::from_env() {
  Options o;
  if (const char* url = std::getenv("LOCKWATCH_STORE_URL"); url && *url) o.store_url = url;
  if (const char* url = std::getenv("LOCKWATCH_REDIS_URL"); url && *url) o.redis_url = url;
  if (const char* name = std::getenv("LOCKWATCH_OWNER_NAME"); name && *name) o.runtime.owner_name = name;
  if (const char* f = std::getenv("LOCKWATCH_TLS_CA_FILE"); f && *f) o.tls.ca_file = f;
  if (const char* f = std::getenv("LOCKWATCH_TLS_CERT_FILE"); f && *f) o.tls.cert_file = f;
  if (const char* f = std::getenv("LOCKWATCH_TLS_KEY_FILE"); f && *f) o.tls.key_file = f;
  return o;
}

std::string detail::owner_name(const Options& o) {
  if (!o.runtime.owner_name.empty()) return o.runtime.owner_name;
  static const std::string fallback = [] {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
    std::string program = "unknown";
    if (std::ifstream comm("/proc/self/comm"); comm) std::getline(comm, program);
    std::string name = fmt::format("{}:{}:{}", host[0] ? host : "unknown-host", static_cast<long>(::getpid()), program);
    for (char& c : name)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '_';
    if (name.size() > Options::kMaxOwnerName) name.resize(Options::kMaxOwnerName);
    return name;
  }();
  return fallback;
}

std::string detail::connection_owner_name(std::string_view owner) {
  std::string out(owner);
  for (char& c : out)
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '_';
  return out;
}

void detail::check_runtime_options(const Options& o) {
  if (o.runtime.owner_name.size() > Options::kMaxOwnerName)
    throw InvalidArgument(fmt::format("Options::runtime.owner_name must be at most {} bytes, got {}",
                                      Options::kMaxOwnerName, o.runtime.owner_name.size()));
  for (char c : o.runtime.owner_name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      throw InvalidArgument("Options::runtime.owner_name must not contain control characters");
  if (o.watchdog.tick < std::chrono::milliseconds(1))
    throw InvalidArgument("Options::watchdog.tick must be at least 1 ms");
  if (o.runtime.queue_timeout.count() <= 0) throw InvalidArgument("Options::runtime.queue_timeout must be positive");
  if (o.observability.wait_warning.count() < 0)
    throw InvalidArgument("Options::observability.wait_warning must not be negative");
  if (o.observability.hold_warning.count() < 0)
    throw InvalidArgument("Options::observability.hold_warning must not be negative (0: off)");
  if (o.watchdog.wheel_size == 0 || o.watchdog.wheel_size > (std::size_t{1} << 20))
    throw InvalidArgument("Options::watchdog.wheel_size must be in 1..1048576");
  if (!(o.watchdog.renew_weight > 0.0 && o.watchdog.renew_weight < 1.0))
    throw InvalidArgument("Options::watchdog.renew_weight must be in (0, 1)");
  if (!(o.watchdog.drift_factor >= 0.0 && o.watchdog.drift_factor < 0.5))
    throw InvalidArgument("Options::watchdog.drift_factor must be in [0, 0.5)");
  if (o.watchdog.drift_floor.count() < 0) throw InvalidArgument("Options::watchdog.drift_floor must not be negative");
  if (o.watchdog.min_renewal_window.count() < 0)
    throw InvalidArgument("Options::watchdog.min_renewal_window must not be negative");
  if (o.connection.connect_timeout.count() <= 0 || o.connection.command_timeout.count() <= 0)
    throw InvalidArgument("Options::connection.connect_timeout and command_timeout must be positive");
  if (o.connection.reconnect_min.count() <= 0 || o.connection.reconnect_max < o.connection.reconnect_min)
    throw InvalidArgument("Options::connection.reconnect_min must be positive and not above reconnect_max");
  if (o.runtime.max_key_bytes == 0) throw InvalidArgument("Options::runtime.max_key_bytes must be positive");
  if (o.handoff.max_streak == 0 || o.handoff.max_streak >= (std::uint32_t{1} << 20))
    throw InvalidArgument("Options::handoff.max_streak must be in 1..1048575");
  if (o.handoff.max_time.count() <= 0) throw InvalidArgument("Options::handoff.max_time must be positive");
  if ((o.runtime.busy_poll.count() < 0 && o.runtime.busy_poll != kBusyPollAdaptive) ||
      o.runtime.busy_poll > std::chrono::milliseconds(10))
    throw InvalidArgument(
        fmt::format("Options::runtime.busy_poll must be kBusyPollAdaptive, 0 (off) or up to 10 ms, got {} us",
                    o.runtime.busy_poll.count()));
}

void detail::check_tls_files(const TlsOptions& o) {
  if (o.cert_file.empty() != o.key_file.empty())
    throw InvalidArgument("Options::tls.cert_file and tls.key_file go together (a client certificate needs its key)");
  for (const auto& [option, path] : {std::pair{"tls.ca_file", &o.ca_file}, std::pair{"tls.cert_file", &o.cert_file},
                                     std::pair{"tls.key_file", &o.key_file}}) {
    if (path->empty()) continue;
    // A clear message for a file that cannot even be opened, before a TLS
    // library's less direct one.
    std::ifstream f(*path);
    if (!f)
      throw InvalidArgument(fmt::format("Options::{}: cannot read '{}': {}", option, *path, std::strerror(errno)));
  }
}

}  // namespace lockwatch
