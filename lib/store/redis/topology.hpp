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

}  // namespace lockwatch::detail
