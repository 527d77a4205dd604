#include "ops/metrics_server.hpp"

#include <fmt/format.h>

#include <cstring>

#include "core/loop.hpp"
#include "core/net.hpp"
#include "core/whole_number.hpp"
#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

namespace {

constexpr std::size_t kMaxHead = 8192;
constexpr int kMaxClients = 64;
constexpr std::uint64_t kClientTimeoutMs = 5000;

struct HostPort {
  std::string host;
  int port = -1;
};

HostPort parse(const std::string& listen) {
  HostPort hp;
  std::string_view s(listen);
  std::string_view port;
  if (!s.empty() && s.front() == '[') {
    auto close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') return hp;
    hp.host = std::string(s.substr(1, close - 1));
    port = s.substr(close + 2);
  } else {
    auto colon = s.rfind(':');
    if (colon == std::string_view::npos) return hp;
    hp.host = std::string(s.substr(0, colon));
    port = s.substr(colon + 1);
  }
  const auto p = whole_number<int>(port);
  if (!p || *p < 0 || *p > 65535 || hp.host.empty()) return hp;
  hp.port = *p;
  return hp;
}

}  // namespace

struct MetricsServer::Client {
  MetricsServer* server;
  uv_tcp_t tcp{};
  uv_timer_t timer{};
  uv_write_t write_req{};
  char buf[4096]{};
  std::string head{};
  std::string response{};
  int open_handles = 2;
  bool closing = false;
  Client* prev = nullptr;
  Client* next = nullptr;

  void close() {
    if (closing) return;
    closing = true;
    if (prev) prev->next = next; else server->first_ = next;
    if (next) next->prev = prev;
    server->clients_--;
    auto done = [](uv_handle_t* h) {
      auto* c = static_cast<Client*>(h->data);
      if (--c->open_handles == 0) delete c;
    };
    uv_close(reinterpret_cast<uv_handle_t*>(&tcp), done);
    uv_close(reinterpret_cast<uv_handle_t*>(&timer), done);
  }
};

void MetricsServer::check_address(const std::string& listen) {
  HostPort hp = parse(listen);
  sockaddr_storage addr{};
  if (hp.port < 0 || !socket_address(hp.host, hp.port, addr))
    throw InvalidArgument(
        fmt::format("Options::observability.metrics_listen must be \"ip:port\" (e.g. \"127.0.0.1:9464\" or "
                    "\"[::1]:9464\"), got '{}'",
                    listen));
}

MetricsServer::MetricsServer(Loop& loop, const std::string& listen, std::function<std::string()> render)
    : loop_(loop), render_(std::move(render)) {
  check_address(listen);
  HostPort hp = parse(listen);
  sockaddr_storage addr{};
  socket_address(hp.host, hp.port, addr);
  uv_tcp_init(loop_.uv(), &server_);
  server_.data = this;
  int rc = uv_tcp_bind(&server_, reinterpret_cast<const sockaddr*>(&addr), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(&server_), 64, &MetricsServer::on_connection);
  if (rc != 0) {
    closed_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&server_), nullptr);
    throw ListenError(listen, uv_strerror(rc));
  }
  sockaddr_storage bound{};
  int len = sizeof bound;
  uv_tcp_getsockname(&server_, reinterpret_cast<sockaddr*>(&bound), &len);
  char ip[64] = {};
  int port = 0;
  if (bound.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&bound);
    uv_ip6_name(a, ip, sizeof ip);
    port = ntohs(a->sin6_port);
    address_ = fmt::format("[{}]:{}", ip, port);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&bound);
    uv_ip4_name(a, ip, sizeof ip);
    port = ntohs(a->sin_port);
    address_ = fmt::format("{}:{}", ip, port);
  }
}

MetricsServer::~MetricsServer() = default;

void MetricsServer::on_connection(uv_stream_t* s, int status) {
  auto* self = static_cast<MetricsServer*>(s->data);
  if (status != 0 || self->closed_) return;
  auto* c = new Client{self};
  uv_tcp_init(self->loop_.uv(), &c->tcp);
  uv_timer_init(self->loop_.uv(), &c->timer);
  c->tcp.data = c;
  c->timer.data = c;
  c->next = self->first_;
  if (self->first_) self->first_->prev = c;
  self->first_ = c;
  self->clients_++;
  if (uv_accept(s, reinterpret_cast<uv_stream_t*>(&c->tcp)) != 0 || self->clients_ > kMaxClients) {
    c->close();
    return;
  }
  uv_timer_start(&c->timer, [](uv_timer_t* t) { static_cast<Client*>(t->data)->close(); }, kClientTimeoutMs, 0);
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&c->tcp),
      [](uv_handle_t* h, size_t, uv_buf_t* buf) {
        auto* c = static_cast<Client*>(h->data);
        *buf = uv_buf_init(c->buf, sizeof c->buf);
      },
      [](uv_stream_t* st, ssize_t n, const uv_buf_t* buf) {
        auto* c = static_cast<Client*>(st->data);
        if (n < 0) {
          c->close();
          return;
        }
        c->head.append(buf->base, static_cast<std::size_t>(n));
        if (c->head.find("\r\n\r\n") != std::string::npos || c->head.find("\n\n") != std::string::npos ||
            c->head.size() >= kMaxHead) {
          uv_read_stop(st);
          c->server->answer(c);
        }
      });
}

void MetricsServer::answer(Client* c) {
  // "GET /metrics HTTP/1.1": the method and the path, queries ignored. HEAD
  // gets the head GET would get (scrapers and probes check with it).
  std::string_view line(c->head);
  line = line.substr(0, line.find_first_of("\r\n"));
  bool head_only = line.starts_with("HEAD ");
  bool ok = false;
  if (line.starts_with("GET ") || head_only) {
    std::string_view target = line.substr(line.find(' ') + 1);
    target = target.substr(0, target.find(' '));
    target = target.substr(0, target.find('?'));
    ok = target == "/metrics";
  }
  std::string body;
  if (ok) {
    try {
      body = render_();
    } catch (...) {
      ok = false;
    }
  }
  if (!ok) body = "not found: GET /metrics\n";
  c->response = fmt::format("HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            ok ? "200 OK" : "404 Not Found", ok ? "text/plain; version=0.0.4" : "text/plain",
                            body.size());
  if (!head_only) c->response += body;
  uv_buf_t buf = uv_buf_init(c->response.data(), static_cast<unsigned>(c->response.size()));
  c->write_req.data = c;
  if (uv_write(&c->write_req, reinterpret_cast<uv_stream_t*>(&c->tcp), &buf, 1,
               [](uv_write_t* req, int) { static_cast<Client*>(req->data)->close(); }) != 0)
    c->close();
}

void MetricsServer::close() {
  if (closed_) return;
  closed_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&server_), nullptr);
  while (first_) first_->close();
}

}  // namespace lockwatch::detail
