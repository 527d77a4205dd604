// lib/core/net.hpp: host names and addresses, looked up off the loop thread.
#pragma once

#include <netdb.h>
#include <uv.h>

#include <functional>
#include <string>

namespace lockwatch::detail {

// True when `host` is a numeric IPv4 or IPv6 address: nothing to look up.
bool numeric_host(const std::string& host) noexcept;

// The socket address of a numeric IPv4 or IPv6 `host` and `port` in
// `out`; false when `host` is not one.
bool socket_address(const std::string& host, int port, sockaddr_storage& out) noexcept;

// Looks `host` up on libuv's thread pool (getaddrinfo blocks) and calls
// `done` on the loop thread with the address to connect to as text: the
// first IPv4 address (a server bound to 127.0.0.1 for "localhost" expects
// it), else the first; no port), or with an empty one and `status` saying why (a libuv error;
// 0 when the name has no address; UV_ECANCELED when the loop was closing).
// Returns uv_getaddrinfo()'s result: below 0, `done` is never called.
// With `request`, it is set to the lookup's request, which uv_cancel() may
// cancel until `done` runs (`done` then runs with UV_ECANCELED, or with the
// answer when the lookup had begun): loop thread.
using ResolveDone = std::function<void(int status, std::string address)>;
int resolve_host(uv_loop_t* loop, const std::string& host, ResolveDone done, uv_req_t** request = nullptr);

}  // namespace lockwatch::detail
