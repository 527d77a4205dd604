// lib/store/redis/topology.hpp: what a Redis URL describes.
#pragma once

#include <string>
#include <vector>

#include "lockwatch/options.hpp"

namespace lockwatch::detail {

// One master, several independent masters (Redlock), or a master found
// through Redis Sentinel.
struct Topology {
  std::vector<Endpoint> masters;    // one, or several for Redlock; empty with sentinels
  std::vector<Endpoint> sentinels;  // redis-sentinel://host:port[,host:port...]/master-name
  std::string master_name;
  Endpoint master;  // with sentinels: credentials and db for the master (host/port found at run time)

  // `redis[s]://...[,redis[s]://...]` or `redis[s]-sentinel://...`; throws
  // InvalidArgument naming what is wrong.
  static Topology parse(const std::string& redis_url);
};

// A redis[s]-sentinel:// or redis[s]-cluster:// URL after its scheme,
// "[user:password@]host:port[,host:port...][/path]", in its parts; each
// host is then read by the redis:// parser.
struct HostList {
  std::string scheme;  // each host's: "rediss://" for a rediss-... URL, else "redis://"
  std::string credentials, path;  // "user:password@" or empty; from the '/' on, or empty
  std::vector<std::string> hosts;  // as written between the commas (one, empty, for none)
  explicit HostList(const std::string& url);
};

}  // namespace lockwatch::detail
