#include "store/postgresql/pg_target.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string_view>
#include <utility>

#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

namespace {

constexpr std::string_view kSchemes[] = {"postgresql://", "postgres://"};
constexpr std::string_view kShape = "expected postgresql://user[:password]@host[:port]/database";
constexpr std::size_t kMaxPgName = 63;  // NAMEDATALEN - 1

// The table goes into statements as "name": lower-case letters, digits and
// '_' only (PostgreSQL's own spelling of an unquoted name, so that the
// table reads the same quoted or not), and nothing a URL carries can
// change a statement.
bool lower_case_identifier(std::string_view s) {
  if (s.empty() || s.size() > kMaxPgName || (s.front() >= '0' && s.front() <= '9')) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

constexpr std::string_view kSslModes[] = {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"};

// `table` + `suffix` as an identifier of at most 63 bytes: a long name
// keeps its start and gains a hash of the whole instead.
std::string derived_name(const std::string& table, std::string_view suffix) {
  std::string name = table + std::string(suffix);
  if (name.size() <= kMaxPgName) return name;
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : table) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{}_{:016x}", table.substr(0, kMaxPgName - 17), h);
}

}  // namespace

PgTarget PgTarget::parse(const std::string& url) {
  if (std::none_of(std::begin(kSchemes), std::end(kSchemes), [&](std::string_view s) { return url.starts_with(s); }))
    throw_bad_url(url, kShape.data());
  PgTarget t{split_database_url(url, std::string_view(url).substr(url.find("://") + 3), kShape)};
  if (t.database.find('\0') != std::string::npos || t.database.size() > kMaxPgName)
    throw_bad_url(url, "the database name must be 1 to 63 bytes, without NUL");
  if (t.port == 0) t.port = 5432;
  for (auto& [key, value] : std::exchange(t.params, {})) {
    auto absolute_path = [&](const char* why) {
      if (value.empty() || value.front() != '/' || value.find('\0') != std::string::npos) throw_bad_url(url, why);
      return std::move(value);
    };
    if (key == "table") {
      if (!lower_case_identifier(value))
        throw_bad_url(url, "table= must be 1 to 63 lower-case letters, digits or '_', not starting with a digit");
      t.table = std::move(value);
    } else if (key == "host") {
      t.socket_dir = absolute_path("host= must be an absolute path (a unix socket directory)");
    } else if (key == "sslmode") {
      if (std::ranges::find(kSslModes, value) == std::end(kSslModes))
        throw_bad_url(url, "sslmode= must be disable, allow, prefer, require, verify-ca or verify-full");
      t.sslmode = std::move(value);
    } else if (std::string* file = key == "sslrootcert" ? &t.sslrootcert
                                   : key == "sslcert"   ? &t.sslcert
                                   : key == "sslkey"    ? &t.sslkey
                                   : key == "sslcrl"    ? &t.sslcrl
                                                        : nullptr) {
      *file = absolute_path(fmt::format("{}= must be an absolute path", key).c_str());
    } else {
      throw InvalidArgument(fmt::format(
          "malformed URL '{}': unknown parameter '{}' (postgresql:// takes table=, host=, sslmode=, sslrootcert=, "
          "sslcert=, sslkey= and sslcrl=)",
          url_for_messages(url), key));
    }
  }
  if (t.host.empty()) {
    if (t.socket_dir.empty()) throw_bad_url(url, "no host");
    t.host = "localhost";  // postgresql://user@/db?host=/dir: a name for messages only
  }
  if (t.socket_dir.empty() && (t.host.find('/') != std::string::npos || t.host.find('\0') != std::string::npos))
    throw_bad_url(url, "bad host (a unix socket directory goes in ?host=/path)");
  return t;
}

std::string PgTarget::name() const {
  if (!socket_dir.empty()) return fmt::format("postgresql://{}/{}?host={}", host, database, socket_dir);
  return fmt::format("postgresql://{}/{}", host_port(host, port), database);
}

std::string PgTarget::channel() const {
  // Notices are per database: the table's name tells the stores of one
  // database apart.
  return derived_name(table, "_released");
}

std::string PgTarget::holders_table() const {
  // A hashed long name must not be the channel's: the suffix goes into
  // the hash too.
  if (table.size() + 8 <= kMaxPgName) return table + "_holders";
  return derived_name(table + "_holders", "_");
}

}  // namespace lockwatch::detail
