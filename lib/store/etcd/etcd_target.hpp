// lib/store/etcd/etcd_target.hpp: where an etcd lock store lives, parsed
// from its URL (docs/etcd.md, "The URL"):
//
//   etcd://[user[:password]@]host:port[,host:port...]
//   etcds://...                         the same over TLS (Options::tls_*)
//
// Value type; any thread.
#pragma once

#include <string>
#include <vector>

namespace lockwatch::detail {

struct EtcdTarget {
  struct Member {
    std::string host;  // no brackets
    int port = 2379;
    // "host:port" ("[::1]:2379"), as gRPC and messages take it.
    std::string address() const;
  };
  std::vector<Member> members;  // never empty
  bool tls = false;             // etcds://
  std::string user;             // empty: no authentication
  std::string password;

  // Throws InvalidArgument naming what is wrong (never showing the password).
  static EtcdTarget parse(const std::string& url);
  // "etcd://host:port,host:port" (or etcds://), for messages: never the
  // credentials.
  std::string name() const;
};

}  // namespace lockwatch::detail
