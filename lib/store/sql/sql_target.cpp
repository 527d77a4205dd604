#include "store/sql/sql_target.hpp"

#include <fmt/format.h>

#include <charconv>
#include <string_view>

#include "core/url.hpp"
#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

namespace {

constexpr std::string_view kScheme = "mysql://";
constexpr std::size_t kMaxIdentifier = 64;  // MariaDB's limit for database and table names

// Identifiers are put into statements as `name`: letters, digits, '_' and
// '$' only, so nothing a URL carries can change a statement.
bool plain_identifier(std::string_view s) {
  if (s.empty() || s.size() > kMaxIdentifier) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

SqlTarget SqlTarget::parse(const std::string& url) {
  if (url.compare(0, kScheme.size(), kScheme) != 0)
    throw_bad_url(url, "expected mysql://user:password@host[:port]/database");
  std::string_view rest(url);
  rest.remove_prefix(kScheme.size());

  SqlTarget t;
  std::string_view query;
  if (auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (auto at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view cred = rest.substr(0, at);
    rest.remove_prefix(at + 1);
    auto colon = cred.find(':');
    t.user = percent_decode(url, cred.substr(0, colon));
    if (colon != std::string_view::npos) t.password = percent_decode(url, cred.substr(colon + 1));
  }
  if (t.user.empty()) throw_bad_url(url, "no user: expected mysql://user:password@host[:port]/database");
  auto slash = rest.find('/');
  if (slash == std::string_view::npos || slash + 1 >= rest.size())
    throw_bad_url(url, "no database: expected mysql://user:password@host[:port]/database");
  t.database = percent_decode(url, rest.substr(slash + 1));
  if (!plain_identifier(t.database))
    throw_bad_url(url, "the database name must be 1 to 64 letters, digits, '_' or '$'");
  std::string_view hostport = rest.substr(0, slash);
  std::string_view host = hostport;
  if (!hostport.empty() && hostport.front() == '[') {  // [::1]:3306
    auto close = hostport.find(']');
    if (close == std::string_view::npos) throw_bad_url(url, "unclosed '[' in host");
    host = hostport.substr(1, close - 1);
    hostport = hostport.substr(close + 1);
    if (!hostport.empty() && hostport.front() != ':') throw_bad_url(url, "bad port");
    hostport = hostport.empty() ? hostport : hostport.substr(1);
    if (!hostport.empty()) {
      auto [p, ec] = std::from_chars(hostport.data(), hostport.data() + hostport.size(), t.port);
      if (ec != std::errc() || p != hostport.data() + hostport.size()) throw_bad_url(url, "bad port");
    }
  } else if (auto colon = hostport.rfind(':'); colon != std::string_view::npos) {
    host = hostport.substr(0, colon);
    std::string_view port = hostport.substr(colon + 1);
    auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), t.port);
    if (port.empty() || ec != std::errc() || p != port.data() + port.size()) throw_bad_url(url, "bad port");
  }
  if (host.empty()) throw_bad_url(url, "no host");
  if (t.port <= 0 || t.port > 65535) throw_bad_url(url, "port out of range");
  t.host = std::string(host);

  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    auto eq = param.find('=');
    std::string_view key = param.substr(0, eq);
    std::string value = eq == std::string_view::npos ? std::string() : percent_decode(url, param.substr(eq + 1));
    if (key == "socket") {
      if (value.empty() || value.front() != '/') throw_bad_url(url, "socket= must be an absolute path");
      t.socket = std::move(value);
    } else if (key == "table") {
      if (!plain_identifier(value)) throw_bad_url(url, "table= must be 1 to 64 letters, digits, '_' or '$'");
      t.table = std::move(value);
    } else {
      throw InvalidArgument(fmt::format("malformed URL '{}': unknown parameter '{}' (mysql:// takes socket= and table=)",
                                        url_for_messages(url), key));
    }
  }
  return t;
}

std::string SqlTarget::name() const {
  if (!socket.empty()) return fmt::format("mysql://localhost/{}?socket={}", database, socket);
  if (host.find(':') != std::string::npos) return fmt::format("mysql://[{}]:{}/{}", host, port, database);
  return fmt::format("mysql://{}:{}/{}", host, port, database);
}

}  // namespace lockwatch::detail
