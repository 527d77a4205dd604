// lib/ops/metrics_server.hpp: GET /metrics over HTTP/1.x, on the runtime's
// own loop (libuv TCP).
//
// One request per connection: the request head is read (at most 8 KiB,
// within 5 s), `GET /metrics` is answered with the Prometheus text format
// 0.0.4 (`HEAD /metrics` with the same head and no body), anything else
// with 404, and the connection is closed. Writes are
// asynchronous and a connection that stalls is closed by its timer, so a
// slow or broken client never holds the loop; at most 64 connections are
// open at once (more are closed at once).
//
// Threading: constructed, used and closed on the loop thread; address() is
// fixed after construction and may be read from any thread.
#pragma once

#include <uv.h>

#include <functional>
#include <string>

namespace lockwatch::detail {

class Loop;

class MetricsServer {
 public:
  // Listens on "host:port" (port 0: any free one). Throws InvalidArgument
  // for a malformed address and ListenError if it cannot listen.
  MetricsServer(Loop& loop, const std::string& listen, std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:port" actually bound.
  const std::string& address() const noexcept { return address_; }
  // Closes the listener and every open connection.
  void close();

  // Any thread: Throws InvalidArgument unless `listen` is "host:port".
  static void check_address(const std::string& listen);

 private:
  struct Client;
  static void on_connection(uv_stream_t* server, int status);
  void answer(Client* c);

  Loop& loop_;
  uv_tcp_t server_{};
  std::function<std::string()> render_;
  std::string address_;
  int clients_ = 0;
  Client* first_ = nullptr;  // open connections, for close()
  bool closed_ = false;
};

}  // namespace lockwatch::detail
