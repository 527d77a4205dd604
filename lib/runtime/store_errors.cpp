#include "runtime/store_errors.hpp"

#include <charconv>

#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

std::exception_ptr to_exception(const StoreError& e) {
  using Kind = StoreError::Kind;
  switch (e.kind) {
    case Kind::kUnavailable:
      return std::make_exception_ptr(ConnectionError(e.endpoint, e.message));
    case Kind::kAuth:
      return std::make_exception_ptr(AuthError(e.endpoint, e.message));
    case Kind::kInvalid:
      return std::make_exception_ptr(InvalidArgument(e.message));
    case Kind::kRefused:
    case Kind::kRetryLater:
    case Kind::kRedirect:
      break;
  }
  if (e.origin == StoreError::Origin::kZooKeeper) {
    int code = 0;
    std::from_chars(e.code.data(), e.code.data() + e.code.size(), code);
    return std::make_exception_ptr(ZooKeeperError(e.endpoint, code, e.message));
  }
  if (e.origin == StoreError::Origin::kEtcd) return std::make_exception_ptr(EtcdError(e.endpoint, e.code, e.message));
  if (e.origin == StoreError::Origin::kPostgres) return std::make_exception_ptr(SqlError(e.endpoint, e.code, e.message));
  if (e.origin == StoreError::Origin::kSql) {
    unsigned code = 0;
    std::from_chars(e.code.data(), e.code.data() + e.code.size(), code);
    return std::make_exception_ptr(SqlError(e.endpoint, code, e.message));
  }
  return std::make_exception_ptr(RedisError(e.endpoint, e.message));
}

}  // namespace lockwatch::detail
