// lib/store/zookeeper/zk_target.hpp: where a ZooKeeper lock store lives,
// parsed from its URL (docs/zookeeper.md, "The URL"):
//
//   zookeeper://[user:password@]host:port[,host:port...][/chroot]
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
  // "zookeeper://h:p,h:p/chroot", for messages: never the credentials.
  std::string name() const;
  bool digest() const { return !user.empty(); }
};

}  // namespace lockwatch::detail
