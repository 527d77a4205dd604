#include "core/stream.hpp"

#if LOCKWATCH_WITH_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#endif
#include <sys/socket.h>

#include <fmt/format.h>

#include <utility>

#include "core/net.hpp"

namespace lockwatch::detail {

namespace {

// A copy of what the socket did not take (write()).
struct Copy final : Stream::Write {
  std::string data;
};

}  // namespace

Stream* Stream::make(uv_loop_t* loop, Events& events, const char* tls_scheme) {
  return new Stream(loop, events, tls_scheme);
}

Stream::Stream(uv_loop_t* loop, Events& events, const char* tls_scheme)
    : loop_(loop), events_(events), tls_scheme_(tls_scheme) {
  uv_tcp_init(loop_, &tcp_);
  tcp_.data = this;
}

Stream::~Stream() {
#if LOCKWATCH_WITH_TLS
  if (ssl_ != nullptr) SSL_free(ssl_);  // and its BIOs
#endif
}

int Stream::fd() const noexcept {
  uv_os_fd_t fd;
  return uv_fileno(reinterpret_cast<const uv_handle_t*>(&tcp_), &fd) == 0 ? fd : -1;
}

void Stream::connect(const std::string& host, int port, const TlsContext* tls) {
  host_ = host;
  port_ = port;
  tls_ = tls;
  // A numeric address connects at once; a name is looked up on libuv's
  // threads (getaddrinfo blocks), within the owner's connect timeout.
  if (start_tcp(host_)) return;
  int rc = resolve_host(
      loop_, host_,
      [this](int status, std::string address) {
        resolve_req_ = nullptr;
        if (closed_) return free_when_done();
        if (!start_tcp(address))
          fail(fmt::format("cannot resolve {}: {}", host_, status == 0 ? "no address" : uv_strerror(status)));
      },
      &resolve_req_);
  if (rc < 0) fail(fmt::format("cannot resolve {}: {}", host_, uv_strerror(rc)));
}

bool Stream::start_tcp(const std::string& address) {
  sockaddr_storage addr{};
  if (!socket_address(address, port_, addr)) return false;
  connect_req_.data = this;
  const auto* to = reinterpret_cast<const sockaddr*>(&addr);
  int rc = uv_tcp_connect(&connect_req_, &tcp_, to, [](uv_connect_t* req, int status) {
    auto* s = static_cast<Stream*>(req->data);
    if (s->closed_ || status == UV_ECANCELED) return;
    if (status < 0) return s->fail(std::string("connect failed: ") + uv_strerror(status));
    s->connected();
  });
  if (rc < 0) fail(std::string("connect failed: ") + uv_strerror(rc));
  return true;
}

void Stream::connected() {
  uv_tcp_nodelay(&tcp_, 1);
  int rc = uv_read_start(
      reinterpret_cast<uv_stream_t*>(&tcp_),
      [](uv_handle_t* h, std::size_t, uv_buf_t* buf) {
        auto* s = static_cast<Stream*>(h->data);
        *buf = uv_buf_init(s->in_, sizeof s->in_);
      },
      [](uv_stream_t* h, ssize_t nread, const uv_buf_t*) {
        auto* s = static_cast<Stream*>(h->data);
        if (s->closed_ || nread == 0) return;
        if (nread < 0) return s->read_failed(static_cast<long>(nread));
        s->received(s->in_, static_cast<std::size_t>(nread));
      });
  if (rc < 0) return fail(std::string("cannot read: ") + uv_strerror(rc));
  if (tls_ == nullptr) {
    ready_ = true;
    return events_.stream_ready();
  }
  std::string error;
  ssl_ = tls_->new_session(host_, error);
  if (ssl_ == nullptr) return report(error);
  handshake();  // the owner's connect timer keeps running until it is done
}

void Stream::read_failed(long nread) {
  if (nread != UV_EOF) return fail(std::string("connection lost: ") + uv_strerror(static_cast<int>(nread)));
  // No alert to read: the reason is the end itself.
  report(ssl_ != nullptr && !ready_
             ? "the server closed the connection during the TLS handshake (is TLS enabled on that port?)"
         : ssl_ == nullptr && !got_bytes_
             ? fmt::format("the server closed the connection without answering (a TLS port? use {})", tls_scheme_)
             : std::string("the server closed the connection"));
}

int Stream::try_write(const uv_buf_t* bufs, unsigned count) noexcept {
  const int n = uv_try_write(reinterpret_cast<uv_stream_t*>(&tcp_), bufs, count);
  return n == UV_EAGAIN ? 0 : n;
}

bool Stream::write_later(std::unique_ptr<Write> w, const uv_buf_t* bufs, unsigned count) {
  w->req.data = w.get();
  // libuv keeps its own copy of the list; the bytes stay in w's buffers.
  int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&tcp_), bufs, count, [](uv_write_t* req, int status) {
    std::unique_ptr<Write> w(static_cast<Write*>(req->data));
    auto* s = static_cast<Stream*>(req->handle->data);
    --s->writes_queued_;
    if (s->closed_) return;
    if (!w->own) s->events_.stream_wrote(std::move(w));
    if (status < 0 && status != UV_ECANCELED && !s->closed_)
      s->fail(std::string("write failed: ") + uv_strerror(status));
  });
  if (rc < 0) {
    fail(std::string("write failed: ") + uv_strerror(rc));
    return false;
  }
  w.release();  // the callback owns it now
  ++writes_queued_;
  return true;
}

bool Stream::write(std::string_view data) {
#if LOCKWATCH_WITH_TLS
  if (ssl_ != nullptr) {
    // A memory BIO takes all of it; what it produced goes out in one write.
    ERR_clear_error();
    if (SSL_write(ssl_, data.data(), static_cast<int>(data.size())) <= 0) {
      report("TLS: " + tls_error_text(ssl_));
      return false;
    }
    return send_tls();
  }
#endif
  return send(data);
}

bool Stream::send(std::string_view data) {
  // Usually the socket takes it all at once and nothing is copied.
  uv_buf_t buf = uv_buf_init(const_cast<char*>(data.data()), static_cast<unsigned>(data.size()));
  const int done = try_write(&buf, 1);
  if (done < 0) {
    fail(std::string("write failed: ") + uv_strerror(done));
    return false;
  }
  if (static_cast<std::size_t>(done) == data.size()) return true;
  auto copy = std::make_unique<Copy>();
  copy->own = true;
  copy->data.assign(data.substr(static_cast<std::size_t>(done)));
  buf = uv_buf_init(copy->data.data(), static_cast<unsigned>(copy->data.size()));
  return write_later(std::move(copy), &buf, 1);
}

void Stream::read_now() {
  const int fd = this->fd();
  // What the kernel holds now; an end or an error is left for the loop's
  // own read to report.
  while (fd >= 0 && !closed_) {
    ssize_t n = ::recv(fd, in_, sizeof in_, MSG_DONTWAIT);
    if (n <= 0) return;
    received(in_, static_cast<std::size_t>(n));
    if (static_cast<std::size_t>(n) < sizeof in_) return;
  }
}

void Stream::close() noexcept {
  if (closed_ && handle_closed_) return;
  closed_ = true;
  if (resolve_req_ != nullptr) uv_cancel(resolve_req_);
  if (uv_is_closing(reinterpret_cast<uv_handle_t*>(&tcp_))) return;
  // Closing cancels the connect and the writes in flight.
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), [](uv_handle_t* h) {
    auto* s = static_cast<Stream*>(h->data);
    s->handle_closed_ = true;
    s->free_when_done();
  });
}

void Stream::free_when_done() noexcept {
  if (handle_closed_ && resolve_req_ == nullptr) delete this;
}

// Without the `tls` feature no stream has a session (TlsContext::make()
// throws), so these are never reached.
#if LOCKWATCH_WITH_TLS
void Stream::handshake() {
  ERR_clear_error();
  const int rc = SSL_do_handshake(ssl_);
  const int err = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, rc);
  std::string why = err == SSL_ERROR_NONE || err == SSL_ERROR_WANT_READ ? std::string() : tls_error_text(ssl_);
  if (!send_tls()) return;  // the ClientHello, or an alert
  if (!why.empty()) return report("TLS handshake failed: " + why);
  if (rc != 1) return;  // more from the server first
  ready_ = true;
  events_.stream_ready();
}

bool Stream::send_tls() {
  BIO* wbio = SSL_get_wbio(ssl_);
  char* data = nullptr;
  const long n = BIO_get_mem_data(wbio, &data);
  const bool ok = n <= 0 || send(std::string_view(data, static_cast<std::size_t>(n)));
  (void)BIO_reset(wbio);
  return ok;
}

#else
void Stream::handshake() {}
bool Stream::send_tls() { return true; }
#endif

void Stream::fail(std::string why) {
  if (closed_) return;
#if LOCKWATCH_WITH_TLS
  // A TLS server that refuses us (no client certificate, say) sends an
  // alert and closes; a write can fail on the reset before the loop read
  // the alert, which says what is wrong. Read it now.
  if (const int fd = this->fd(); ssl_ != nullptr && fd >= 0) {
    for (ssize_t n; (n = ::recv(fd, in_, sizeof in_, MSG_DONTWAIT)) > 0;)
      BIO_write(SSL_get_rbio(ssl_), in_, static_cast<int>(n));
    ERR_clear_error();
    const int rc = ready_ ? SSL_read(ssl_, plain_, sizeof plain_) : SSL_do_handshake(ssl_);
    if (rc <= 0 && SSL_get_error(ssl_, rc) == SSL_ERROR_SSL) why = "TLS: " + tls_error_text(ssl_);
    ERR_clear_error();
  }
#endif
  report(std::move(why));
}

void Stream::report(std::string why) {
  if (closed_) return;
  closed_ = true;
  events_.stream_failed(why);
}

void Stream::received(const char* data, std::size_t n) {
  if (ssl_ == nullptr) {
    got_bytes_ = true;
    return events_.stream_data(data, n);
  }
#if LOCKWATCH_WITH_TLS
  if (BIO_write(SSL_get_rbio(ssl_), data, static_cast<int>(n)) != static_cast<int>(n))
    return report("TLS: out of memory");
  if (!ready_) {
    handshake();
    if (closed_ || !ready_) return;
  }
  while (!closed_) {
    ERR_clear_error();
    const int got = SSL_read(ssl_, plain_, sizeof plain_);
    if (got > 0) {
      got_bytes_ = true;
      events_.stream_data(plain_, static_cast<std::size_t>(got));
      continue;
    }
    const int err = SSL_get_error(ssl_, got);
    if (err == SSL_ERROR_WANT_READ) break;
    return report(err == SSL_ERROR_ZERO_RETURN ? "the server closed the TLS session" : "TLS: " + tls_error_text(ssl_));
  }
  if (!closed_) send_tls();  // e.g. an answer to a key update
#endif
}

}  // namespace lockwatch::detail
