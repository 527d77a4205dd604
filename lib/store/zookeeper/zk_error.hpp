// lib/store/zookeeper/zk_error.hpp: ZooKeeper's return codes as error codes.
//
// A return code (ZBADARGUMENTS, ZCONNECTIONLOSS, ...; negative) travels as a
// StoreError's `code`, of the category "lockwatch.zookeeper"
// (zookeeper_category()): its value is the return code, its message() the
// client library's text for it (zerror()). Threading: the category is a
// constant.
#pragma once

#include <system_error>

#include "store/store_error.hpp"

namespace lockwatch::detail {

const StoreCategory& zookeeper_category() noexcept;
// The return code `rc` as a code of zookeeper_category() (empty for ZOK).
inline std::error_code zookeeper_code(int rc) noexcept { return {rc, zookeeper_category()}; }

}  // namespace lockwatch::detail
