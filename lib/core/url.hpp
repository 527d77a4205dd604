// lib/core/url.hpp: what every store URL parser shares.
#pragma once

#include <string>

namespace lockwatch::detail {

// The URL as error messages show it: the scheme given, never a password.
std::string url_for_messages(const std::string& url);
// Throws InvalidArgument("malformed URL '<url>': <why>").
[[noreturn]] void throw_bad_url(const std::string& url, const char* why);

}  // namespace lockwatch::detail
