#include "store/sql/sql_target.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

namespace {

constexpr std::string_view kScheme = "mysql://";
constexpr std::size_t kMaxIdentifier = 64;  // MariaDB's limit for database and table names
constexpr std::string_view kHoldersSuffix = "_holders";

// Identifiers are put into statements as `name`: letters, digits, '_' and
// '$' only, so nothing a URL carries can change a statement.
bool plain_identifier(std::string_view s) {
  return !s.empty() && s.size() <= kMaxIdentifier && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$';
  });
}

}  // namespace

SqlTarget SqlTarget::parse(const std::string& url) {
  constexpr const char* kShape = "expected mysql://user:password@host[:port]/database";
  if (url.compare(0, kScheme.size(), kScheme) != 0) throw_bad_url(url, kShape);
  SqlTarget t{split_database_url(url, std::string_view(url).substr(kScheme.size()), kShape)};
  if (!plain_identifier(t.database))
    throw_bad_url(url, "the database name must be 1 to 64 letters, digits, '_' or '$'");
  if (t.host.empty()) throw_bad_url(url, "no host");
  if (t.port == 0) t.port = 3306;
  for (auto& [key, value] : std::exchange(t.params, {})) {
    if (key == "socket") {
      if (value.empty() || value.front() != '/') throw_bad_url(url, "socket= must be an absolute path");
      t.socket = std::move(value);
    } else if (key == "table") {
      // The companion table's name (`table`_holders) must fit in 64 too.
      if (!plain_identifier(value) || value.size() > kMaxIdentifier - kHoldersSuffix.size())
        throw_bad_url(url, "table= must be 1 to 56 letters, digits, '_' or '$'");
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
  return fmt::format("mysql://{}/{}", host_port(host, port), database);
}

}  // namespace lockwatch::detail
