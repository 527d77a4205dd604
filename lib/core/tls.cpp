#include "core/tls.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <fmt/format.h>

#include "core/net.hpp"
#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

namespace {

// OpenSSL's queued reasons, oldest first, joined; empties the queue.
std::string drain_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    if (!out.empty()) out += "; ";
    out += reason != nullptr ? reason : fmt::format("OpenSSL error {:#x}", e);
  }
  return out;
}

}  // namespace

std::shared_ptr<const TlsContext> TlsContext::make(const TlsOptions& o) {
  check_tls_files(o);
  std::shared_ptr<TlsContext> t(new TlsContext());
  t->server_name_ = o.server_name;
  t->verify_ = o.verify;
  ERR_clear_error();
  t->ctx_ = SSL_CTX_new(TLS_client_method());
  if (t->ctx_ == nullptr) throw InvalidArgument("TLS: cannot create an OpenSSL context: " + drain_errors());
  SSL_CTX_set_min_proto_version(t->ctx_, TLS1_2_VERSION);
  if (!o.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(t->ctx_, o.ca_file.c_str(), nullptr) != 1)
      throw InvalidArgument(
          fmt::format("Options::tls.ca_file: no CA certificate in '{}': {}", o.ca_file, drain_errors()));
  } else if (SSL_CTX_set_default_verify_paths(t->ctx_) != 1) {
    drain_errors();  // no system CAs: verification fails later, clearly
  }
  if (!o.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(t->ctx_, o.cert_file.c_str()) != 1)
      throw InvalidArgument(
          fmt::format("Options::tls.cert_file: no certificate in '{}': {}", o.cert_file, drain_errors()));
    if (SSL_CTX_use_PrivateKey_file(t->ctx_, o.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
      throw InvalidArgument(
          fmt::format("Options::tls.key_file: no usable private key in '{}': {}", o.key_file, drain_errors()));
    if (SSL_CTX_check_private_key(t->ctx_) != 1)
      throw InvalidArgument(fmt::format("Options::tls.key_file: '{}' is not the key of '{}': {}", o.key_file,
                                        o.cert_file, drain_errors()));
  }
  SSL_CTX_set_verify(t->ctx_, t->verify_ ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, nullptr);
  return t;
}

TlsContext::~TlsContext() {
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

SSL* TlsContext::new_session(const std::string& host, std::string& error) const {
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx_);
  BIO* rbio = BIO_new(BIO_s_mem());
  BIO* wbio = BIO_new(BIO_s_mem());
  if (ssl == nullptr || rbio == nullptr || wbio == nullptr) {
    error = "TLS: cannot create a session: " + drain_errors();
    SSL_free(ssl);
    BIO_free(rbio);
    BIO_free(wbio);
    return nullptr;
  }
  // An empty input BIO means "more to come", never end of stream.
  BIO_set_mem_eof_return(rbio, -1);
  SSL_set_bio(ssl, rbio, wbio);
  SSL_set_connect_state(ssl);
  const std::string& name = server_name_.empty() ? host : server_name_;
  const bool ip = numeric_host(name);
  bool ok = true;
  if (!ip) ok = SSL_set_tlsext_host_name(ssl, name.c_str()) == 1;  // SNI takes names only
  if (ok && verify_) {
    ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str()) == 1
            : SSL_set1_host(ssl, name.c_str()) == 1;
  }
  if (!ok) {
    error = fmt::format("TLS: cannot verify against the name '{}': {}", name, drain_errors());
    SSL_free(ssl);
    return nullptr;
  }
  return ssl;
}

void check_tls_options(const TlsOptions& options) { (void)TlsContext::make(options); }

std::string tls_error_text(const SSL* ssl) {
  std::string out = drain_errors();
  long v = SSL_get_verify_result(ssl);
  if (v != X509_V_OK) {
    out += (out.empty() ? "" : ": ");
    out += X509_verify_cert_error_string(v);
  }
  return out.empty() ? "the peer broke off the TLS session" : out;
}

}  // namespace lockwatch::detail
