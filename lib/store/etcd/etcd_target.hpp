// lib/store/etcd/etcd_target.hpp: where an etcd lock store lives, parsed
// from its URL.
//
//   etcd://[user[:password]@]host:port[,host:port...]
//   etcds://...                         the same over TLS (Options::tls_*)
//
// One or more members of one cluster; the port may be left out (2379).
// A host is a name, an IPv4 address or a bracketed IPv6 one. With a user,
// the store authenticates (etcd's Authenticate) and sends the token it
// gets with every call. Credentials may be %-escaped. The URL has no path
// and no parameters: anything after the members is refused, so that a
// typo is not silently ignored.
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
