// lib/core/tls.hpp: TLS for the connections lockwatch makes itself (Redis's,
// and the etcd store's clock), with OpenSSL.
//
// A TlsContext holds what every TLS connection of a store shares: the CA to
// verify servers against, the client certificate and key for mutual TLS,
// and whether to verify at all. It is built once per connection object from
// the TLS options (Options::tls; reading the files then, not per connection attempt). Each
// attempt makes an SSL session from it, bound to the name the server's
// certificate must carry (Options::tls.server_name, else the node's host;
// an IP address is matched against the certificate's IP addresses).
//
// The sessions run over memory BIOs: the connection's stream
// (core/stream.hpp) feeds them what libuv read and writes what they
// produce, all on the loop thread, so OpenSSL never touches a socket and
// never blocks.
//
// Threading: a TlsContext is immutable once built and may be shared; a
// session belongs to one stream, on the loop thread.
#pragma once


#include <memory>
#include <string>

#include "lockwatch/options.hpp"

// OpenSSL's own names for its types, so that this header (and the
// connection's) builds without OpenSSL's headers when the `tls` feature is
// off; then tls_off.cpp stands in: making a context or checking the
// options throws Unsupported.
typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace lockwatch::detail {

class TlsContext {
 public:
  // Reads the CA, certificate and key files the options name. Throws
  // InvalidArgument naming the option and the file when one is missing,
  // unreadable or not usable (a key that does not match its certificate).
  static std::shared_ptr<const TlsContext> make(const TlsOptions& options);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // A client session for `host`, set up for SNI and name verification.
  // Null with `error` set when OpenSSL cannot make one.
  SSL* new_session(const std::string& host, std::string& error) const;

 private:
  TlsContext() = default;
  SSL_CTX* ctx_ = nullptr;
  std::string server_name_;
  bool verify_ = true;
};

// Throws InvalidArgument when the TLS options cannot work (see make()).
void check_tls_options(const TlsOptions& options);
// Throws InvalidArgument when the options name a certificate without its
// key (or a key without one) or a file that cannot be read: the checks
// that need no TLS library, so built with or without the `tls` feature
// (core/options.cpp). make() makes them first; etcds://, whose TLS is
// gRPC's, makes them alone.
void check_tls_files(const TlsOptions& options);

// What went wrong in a session, for an error message: OpenSSL's reasons and,
// after a failed verification, why the certificate was refused. Empties the
// thread's OpenSSL error queue.
std::string tls_error_text(const SSL* ssl);

}  // namespace lockwatch::detail
