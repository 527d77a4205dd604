// A build without the `tls` feature (no OpenSSL): the TLS schemes are
// refused when the options are checked, so no connection ever has a
// TlsContext.
#include "core/tls.hpp"

#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

namespace {
[[noreturn]] void no_tls() {
  throw Unsupported(
      "rediss://, rediss-sentinel:// and rediss-cluster:// need lockwatch built with the Meson feature 'tls' "
      "(OpenSSL), which this build left out");
}
}  // namespace

std::shared_ptr<const TlsContext> TlsContext::make(const TlsOptions&) { no_tls(); }
TlsContext::~TlsContext() = default;
SSL* TlsContext::new_session(const std::string&, std::string& error) const {
  error = "TLS is not built in";
  return nullptr;
}
void check_tls_options(const TlsOptions&) { no_tls(); }
std::string tls_error_text(const SSL*) { return {}; }

}  // namespace lockwatch::detail
