// lib/core/url.hpp: what every store URL parser shares.
#pragma once

#include <string>
#include <string_view>

namespace lockwatch::detail {

// The URL as error messages show it: the scheme given, never a password.
std::string url_for_messages(const std::string& url);
// Throws InvalidArgument("malformed URL '<url>': <why>").
[[noreturn]] void throw_bad_url(const std::string& url, const char* why);
// Decodes %XX escapes of a part of `url` (credentials, paths); a bad escape
// is throw_bad_url().
std::string percent_decode(const std::string& url, std::string_view part);

}  // namespace lockwatch::detail
