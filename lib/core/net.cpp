#include "core/net.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <memory>

namespace lockwatch::detail {

bool numeric_host(const std::string& host) noexcept {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

bool socket_address(const std::string& host, int port, sockaddr_storage& out) noexcept {
  out = sockaddr_storage{};
  return uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&out)) == 0 ||
         uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&out)) == 0;
}

namespace {

// Of getaddrinfo's answers, the one to connect to (resolve_host()).
const addrinfo* preferred_address(const addrinfo* answers) noexcept {
  for (const addrinfo* a = answers; a != nullptr; a = a->ai_next)
    if (a->ai_family == AF_INET) return a;
  return answers;
}

struct Lookup {
  uv_getaddrinfo_t req{};
  ResolveDone done;
};

std::string address_text(const addrinfo* a) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a->ai_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof text);
  else if (a->ai_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr, text, sizeof text);
  return text;
}

}  // namespace

int resolve_host(uv_loop_t* loop, const std::string& host, ResolveDone done, uv_req_t** request) {
  auto lookup = std::make_unique<Lookup>();
  lookup->done = std::move(done);
  lookup->req.data = lookup.get();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = uv_getaddrinfo(
      loop, &lookup->req,
      [](uv_getaddrinfo_t* req, int status, addrinfo* res) {
        std::unique_ptr<Lookup> lookup(static_cast<Lookup*>(req->data));
        std::string address;
        if (status == 0 && res != nullptr) address = address_text(preferred_address(res));
        if (res != nullptr) uv_freeaddrinfo(res);
        lookup->done(status, std::move(address));
      },
      host.c_str(), nullptr, &hints);
  if (rc == 0) {
    if (request != nullptr) *request = reinterpret_cast<uv_req_t*>(&lookup->req);
    lookup.release();  // the callback owns it now
  }
  return rc;
}

}  // namespace lockwatch::detail
