// lib/store/zookeeper/zk_target.hpp: where a ZooKeeper lock store lives,
// parsed from its URL.
//
//   zookeeper://[user:password@]host:port[,host:port...][/chroot]
//
// Port 2181 by default; hosts are names, IPv4 addresses or bracketed IPv6
// ones. user:password (%-escaped where needed) is ZooKeeper's digest
// authentication: the store's nodes are then created with the creator's
// ACL, so that other identities cannot touch them. The chroot is a path
// every node of the store lives under ("/a/b"; no empty, "." or ".."
// segment). No query parameters: anything after '?' is refused.
//
// Value type; any thread.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace lockwatch::detail {

struct ZkTarget {
  std::vector<std::pair<std::string, int>> hosts;  // host (no brackets), port
  std::string chroot;                              // "" or "/a/b"
  std::string user;
  std::string password;

  // Throws InvalidArgument naming what is wrong (never showing the password).
  static ZkTarget parse(const std::string& url);
  // What zookeeper_init() takes: "h:p,h:p/chroot".
  std::string connect_string() const;
  // "zookeeper://h:p,h:p/chroot", for messages: never the credentials.
  std::string name() const;
  bool digest() const { return !user.empty(); }
};

}  // namespace lockwatch::detail
