// lib/core/url.hpp: what every store URL parser shares.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockwatch/options.hpp"

namespace lockwatch::detail {

// Where the locks live: Options::store_url, else Options::redis_url.
inline const std::string& store_url(const Options& options) noexcept {
  return options.store_url.empty() ? options.redis_url : options.store_url;
}
// Options::redis_url's default.
inline constexpr std::string_view kDefaultRedisUrl = "redis://127.0.0.1:6379";
// The warning for Options::redis_url (and LOCKWATCH_REDIS_URL), the
// deprecated name of store_url, set beside it to another URL: store_url is
// used. Empty when there is nothing to warn of. Names no URL (they may
// carry passwords).
inline std::string deprecated_url_warning(const Options& options) {
  if (options.store_url.empty() || options.redis_url == kDefaultRedisUrl || options.redis_url == options.store_url)
    return {};
  return "Options::redis_url (LOCKWATCH_REDIS_URL) is the deprecated name of Options::store_url "
         "(LOCKWATCH_STORE_URL); both are set, to different URLs: store_url is used";
}
// The scheme of `url` ("mysql" for "mysql://..."), empty when it has none.
inline std::string_view scheme_of(std::string_view url) noexcept {
  auto sep = url.find("://");
  return sep == std::string_view::npos ? std::string_view() : url.substr(0, sep);
}

// The URL as error messages show it: the scheme given, never a password.
std::string url_for_messages(const std::string& url);
// Throws InvalidArgument("malformed URL '<url>': <why>").
[[noreturn]] void throw_bad_url(const std::string& url, const char* why);
// Decodes %XX escapes of a part of `url` (credentials, paths); a bad escape
// is throw_bad_url().
std::string percent_decode(const std::string& url, std::string_view part);
// Takes "user[:password]@" off the front of `rest` (a part of `url`, up to
// its last '@'), decoded into `user` and `password`; false, and nothing
// taken, without an '@'.
bool take_credentials(const std::string& url, std::string_view& rest, std::string& user, std::string& password);
// The host of `hostport` ("host", "host:port", "[v6]" or "[v6]:port", a
// part of `url`), without brackets and not decoded; its port goes to
// `port`, kept when none is given (a bad one is throw_bad_url()).
std::string_view split_host_port(const std::string& url, std::string_view hostport, int& port);
// "host:port" for a client to connect to, an IPv6 address in brackets.
std::string host_port(const std::string& host, int port);

// A database URL's parts: `user[:password]@host[:port]/database[?k=v&...]`,
// credentials, host and values decoded. Each store checks what it needs
// of them (a host, the database name's spelling, the parameters it knows).
struct DatabaseUrl {
  std::string user;      // never empty
  std::string password;
  std::string host;      // no brackets; may be empty
  int port = 0;          // 0: none given; else 1..65535
  std::string database;  // never empty
  std::vector<std::pair<std::string, std::string>> params;  // in order
};
// Splits `rest`, the part of `url` after its scheme; `shape` is how the URL
// should look ("expected mysql://user:password@host[:port]/database"), for
// the messages of a URL without a user or a database.
DatabaseUrl split_database_url(const std::string& url, std::string_view rest, std::string_view shape);

}  // namespace lockwatch::detail
