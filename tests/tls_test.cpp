// TLS to Redis: mutual TLS, the server name, and every way it can go wrong,
// each a typed error within the connect timeout. (The lock suites run over
// TLS too: locked_test and faults_test are instantiated for both transports.)
#include <gtest/gtest.h>

#include <fstream>

#include "lockwatch/lockwatch.hpp"
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

constexpr auto kConnectTimeout = 500ms;
// What a failed attempt may take: the connect timeout and some slack.
constexpr auto kFailBound = 3s;

class TlsTest : public ::testing::Test {
 protected:
  static const TestCertificates& certs() { return test_certificates(); }
  static RedisServer tls_server(RedisTls t = {}) {
    RedisServerOptions o;
    o.tls = std::move(t);
    return RedisServer(std::move(o));
  }
  static Options options_to(const RedisServer& server) {
    Options o = options_for(server);
    o.connection.connect_timeout = kConnectTimeout;
    return o;
  }
  // One lock cycle through `o`: its fencing token, or throws what failed.
  static std::uint64_t cycle(const Options& o) {
    Runtime rt(o);
    auto f = locked("tls", 2s, 0).on(rt)([] { return this_lease().fencing_token(); });
    auto fut = f();
    return get_bounded(fut);
  }
  // The ConnectionError a lock cycle through `o` fails with, checked to
  // come within kFailBound.
  static std::string connection_error(const Options& o) {
    Runtime rt(o);
    auto f = locked("tls", 2s, 0).on(rt)([] { return 1; });
    auto t0 = std::chrono::steady_clock::now();
    auto fut = f();
    auto err = error_of<ConnectionError>(fut);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, kFailBound);
    if (!err) {
      ADD_FAILURE() << "no ConnectionError";
      return {};
    }
    return err->what();
  }
};

TEST_F(TlsTest, MutualTlsWorksWithAClientCertificate) {
  RedisServer server = tls_server({.cert_file = {}, .key_file = {}, .auth_clients = true});
  Options o = options_to(server);
  o.tls.cert_file = certs().client_cert;
  o.tls.key_file = certs().client_key;
  EXPECT_GE(cycle(o), 1u);
}

TEST_F(TlsTest, AServerRequiringAClientCertificateRefusesAClientWithoutOne) {
  RedisServer server = tls_server({.cert_file = {}, .key_file = {}, .auth_clients = true});
  std::string what = connection_error(options_to(server));
  EXPECT_NE(what.find("TLS"), std::string::npos) << what;
}

TEST_F(TlsTest, ACertificateFromAnUntrustedCaIsRefused) {
  RedisServer server = tls_server({.cert_file = certs().untrusted_cert, .key_file = certs().untrusted_key});
  std::string what = connection_error(options_to(server));
  EXPECT_NE(what.find("certificate verify failed"), std::string::npos) << what;
}

TEST_F(TlsTest, ACertificateForAnotherNameIsRefused) {
  RedisServer server = tls_server({.cert_file = certs().wrong_name_cert, .key_file = certs().wrong_name_key});
  std::string what = connection_error(options_to(server));
  EXPECT_NE(what.find("mismatch"), std::string::npos) << what;
}

TEST_F(TlsTest, TheServerNameOptionIsWhatTheCertificateMustCarry) {
  RedisServer wrong = tls_server({.cert_file = certs().wrong_name_cert, .key_file = certs().wrong_name_key});
  Options o = options_to(wrong);
  o.tls.server_name = "wrong.example";
  EXPECT_GE(cycle(o), 1u);
  // A DNS name (and SNI) against the usual certificate, which has localhost.
  RedisServer server = tls_server();
  Options named = options_to(server);
  named.tls.server_name = "localhost";
  EXPECT_GE(cycle(named), 1u);
  named.tls.server_name = "elsewhere.example";
  std::string what = connection_error(named);
  EXPECT_NE(what.find("mismatch"), std::string::npos) << what;
}

TEST_F(TlsTest, AnExpiredCertificateIsRefused) {
  RedisServer server = tls_server({.cert_file = certs().expired_cert, .key_file = certs().expired_key});
  std::string what = connection_error(options_to(server));
  EXPECT_NE(what.find("expired"), std::string::npos) << what;
}

TEST_F(TlsTest, WithoutVerificationAnUntrustedCertificateIsAccepted) {
  RedisServer server = tls_server({.cert_file = certs().untrusted_cert, .key_file = certs().untrusted_key});
  Options o = options_to(server);
  o.tls.verify = false;
  EXPECT_GE(cycle(o), 1u);
}

TEST_F(TlsTest, APlaintextClientOnATlsPortFailsClearly) {
  RedisServer server = tls_server();
  Options o = options_to(server);
  o.redis_url = "redis://127.0.0.1:" + std::to_string(server.port());
  std::string what = connection_error(o);
  EXPECT_FALSE(what.empty());
}

TEST_F(TlsTest, ATlsClientOnAPlaintextPortFailsClearly) {
  RedisServer plain;
  Options o = options_to(plain);
  o.redis_url = "rediss://127.0.0.1:" + std::to_string(plain.port());
  o.tls.ca_file = certs().ca_cert;
  std::string what = connection_error(o);
  EXPECT_NE(what.find("TLS"), std::string::npos) << what;
}

TEST_F(TlsTest, MissingOrUnusableFilesAreInvalidArgumentsAtOnce) {
  Options o;
  o.redis_url = "rediss://127.0.0.1:1";
  o.tls.ca_file = certs().dir + "/no-such-ca.crt";
  EXPECT_THROW(o.validate(), InvalidArgument);
  EXPECT_THROW(Runtime{o}, InvalidArgument);
  o.tls.ca_file = certs().dir;  // a directory, not a PEM file
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.tls.ca_file = certs().ca_cert;
  o.tls.cert_file = certs().client_cert;  // without its key
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.tls.key_file = certs().dir + "/no-such.key";
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.tls.key_file = certs().server_key;  // another certificate's key
  EXPECT_THROW(o.validate(), InvalidArgument);
  const std::string garbage = certs().dir + "/garbage.key";
  std::ofstream(garbage) << "not a key\n";
  o.tls.key_file = garbage;
  try {
    o.validate();
    ADD_FAILURE() << "a garbage key was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tls.key_file"), std::string::npos) << e.what();
  }
  o.tls.key_file = certs().client_key;
  EXPECT_NO_THROW(o.validate());
}

TEST_F(TlsTest, TheFilesComeFromTheEnvironment) {
  ::setenv("LOCKWATCH_TLS_CA_FILE", "/ca.pem", 1);
  ::setenv("LOCKWATCH_TLS_CERT_FILE", "/cert.pem", 1);
  ::setenv("LOCKWATCH_TLS_KEY_FILE", "/key.pem", 1);
  Options o = Options::from_env();
  ::unsetenv("LOCKWATCH_TLS_CA_FILE");
  ::unsetenv("LOCKWATCH_TLS_CERT_FILE");
  ::unsetenv("LOCKWATCH_TLS_KEY_FILE");
  EXPECT_EQ(o.tls.ca_file, "/ca.pem");
  EXPECT_EQ(o.tls.cert_file, "/cert.pem");
  EXPECT_EQ(o.tls.key_file, "/key.pem");
  EXPECT_TRUE(o.tls.verify);
}

}  // namespace
}  // namespace lockwatch::testing
