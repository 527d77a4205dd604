// lib/core/stream.hpp: the byte stream under the connections lockwatch
// makes itself (Redis's, the etcd store's clock): a host's name looked up
// (core/net.hpp), a libuv TCP connection, optionally a TLS session over
// memory BIOs (core/tls.hpp), and the reasons a failure is given. Its owner
// speaks the protocol on top: it is told when the stream is ready, of the
// bytes that came (decrypted) and of the one failure, through Events.
//
// Writes are the owner's to shape, as they cost the most: try_write() is
// one non-blocking write of the owner's buffers, write_later() hands what
// the socket did not take to libuv in those same buffers (the owner's
// Write, given back by wrote()), uncopied. write() copies instead: what
// TLS encrypts, or a short request.
//
// Threading: loop thread only (fd() lets a connection write on the socket
// from another thread while it arranges that nothing else does). Lifetime:
// made by make(), ended by close(), after which no event comes; the object
// frees itself once libuv is done with its handle and its lookup.
// Costs: one virtual call per read (per TLS record), none per byte; reads
// go through one 64 KiB buffer of the stream's.
#pragma once

#include <uv.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/tls.hpp"

namespace lockwatch::detail {

class Stream {
 public:
  // A write libuv finishes later: the owner's buffers stay in it.
  struct Write {
    virtual ~Write() = default;
    uv_write_t req{};
    bool own = false;  // the stream's copy (write()), not the owner's
  };
  // Each runs on the loop thread, never after close(); a failure may be
  // reported inside connect() or a write.
  class Events {
   public:
    // Connected, and with TLS past the handshake: writes may go.
    virtual void stream_ready() = 0;
    // Bytes that came (with TLS: decrypted); valid during the call.
    virtual void stream_data(const char* data, std::size_t n) = 0;
    // Why the stream cannot go on, once; the owner close()s it.
    virtual void stream_failed(const std::string& why) = 0;
    // One of the owner's write_later() writes is done (a failed one is
    // then reported by stream_failed).
    virtual void stream_wrote(std::unique_ptr<Write>) {}

   protected:
    ~Events() = default;
  };

  // `tls_scheme` ("rediss://") names the URL to use when a plaintext
  // connection is closed unanswered, as a TLS port does.
  static Stream* make(uv_loop_t* loop, Events& events, const char* tls_scheme);
  // Connects to `host` (a name is looked up first) and `port`, with TLS
  // when `tls` is set; the owner bounds it with its connect timeout.
  void connect(const std::string& host, int port, const TlsContext* tls);
  // No event comes after; connects, lookups and writes under way are
  // cancelled.
  void close() noexcept;

  bool ready() const noexcept { return ready_; }
  // A TLS session was begun (after the TCP connect).
  bool tls() const noexcept { return ssl_ != nullptr; }
  // The socket, -1 before the connect: a plaintext stream's other writer.
  int fd() const noexcept;
  int writes_queued() const noexcept { return writes_queued_; }

  // Plaintext: writes what the socket takes of `bufs` now, without
  // waiting. Bytes taken (0: none), or a libuv error for fail().
  int try_write(const uv_buf_t* bufs, unsigned count) noexcept;
  // Plaintext: hands `bufs`, held by `w`, to libuv; stream_wrote() gives
  // `w` back. False once it failed (reported).
  bool write_later(std::unique_ptr<Write> w, const uv_buf_t* bufs, unsigned count);
  // Writes `data` (encrypted with TLS), copying what the socket does not
  // take at once. False once it failed (reported).
  bool write(std::string_view data);
  // Reads what the kernel holds now, without waiting (events as usual).
  void read_now();
  // Reports `why` (what a TLS alert received says instead) through
  // stream_failed: for the owner's own errors too, a write's say.
  void fail(std::string why);

 private:
  Stream(uv_loop_t* loop, Events& events, const char* tls_scheme);
  ~Stream();
  bool start_tcp(const std::string& address);
  void connected();
  void received(const char* data, std::size_t n);
  void read_failed(long nread);
  void handshake();
  // Writes `data` as it is, copying what the socket does not take.
  bool send(std::string_view data);
  bool send_tls();
  // Reports `why` as it is (fail(): after a look for an alert).
  void report(std::string why);
  void free_when_done() noexcept;

  uv_loop_t* loop_;
  Events& events_;
  const char* tls_scheme_;
  const TlsContext* tls_ = nullptr;
  std::string host_;
  int port_ = 0;
  uv_tcp_t tcp_{};
  uv_connect_t connect_req_{};
  uv_req_t* resolve_req_ = nullptr;  // the host's lookup in flight
  bool closed_ = false;              // close() ran: no more events
  bool handle_closed_ = false;       // the handle's close callback ran
  bool ready_ = false;
  bool got_bytes_ = false;  // the peer sent something (with TLS: decrypted)
  int writes_queued_ = 0;   // libuv's writes under way
  SSL* ssl_ = nullptr;      // TLS: the session, over memory BIOs
  char in_[64 * 1024];      // from the socket
  char plain_[16 * 1024];   // TLS: one decrypted record
};

}  // namespace lockwatch::detail
