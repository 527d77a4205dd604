// lib/store/redis/caller_line.hpp: a connection a blocking caller uses for
// its own round trip. Runtime::lock() and LockHandle::unlock() write their
// script call and read the reply on the calling thread, as raw hiredis does:
// no other thread wakes for it. The loop's connections are not touched.
//
// One caller at a time: a caller that finds it in use, down, or not yet
// worth trying again goes the loop's way. Plain TCP only (rediss:// goes the
// loop's way). It connects on first use, within the connect timeout, with
// AUTH and SELECT as the loop's connections do; after a failure it is not
// tried again for the reconnect back-off's delay (reconnect_min, doubling
// up to reconnect_max). Before each call it checks that the server has not
// closed it meanwhile, so an idle connection's end is found before a
// request is written on it, not by losing the request's answer; such a
// connection is made again at once.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "lockwatch/options.hpp"
#include "core/backoff.hpp"
#include "store/redis/connection.hpp"
#include "store/store_error.hpp"

namespace lockwatch::detail {

class CallerLine {
 public:
  CallerLine(Endpoint endpoint, ConnectionOptions options);

  enum class Outcome : std::uint8_t {
    kNotSent,   // nothing ran: in use, down, or a script the server does not have (NOSCRIPT)
    kAnswered,  // `done` ran with the reply (an error reply classified, as the loop's are)
    kUnknown,   // `done` ran with kUnavailable: written, and no answer within the command timeout
  };
  using Done = std::function<void(const redisReply* reply, const StoreError* error)>;
  // Any thread: writes `request` and reads its answer. `done` runs on this
  // thread before the return, unless kNotSent. An ACL refusal says what was
  // sent, as the loop's connections say it. `undo` (for a lock's request,
  // its release; made only when needed): written behind a request that was
  // sent and had no answer, on the same connection, so that the server, if
  // it runs the request late, runs the undo right after it; a give-back
  // sent on another connection could run before it.
  using Undo = std::function<EvalRequest()>;
  Outcome call(const EvalRequest& request, const Done& done, const Undo& undo = {});
  const std::string& name() const noexcept { return name_; }

 private:
  bool open();   // under mu_: connected and past the handshake
  // Under mu_. After a failure (no connection, a refused handshake, no
  // answer) it is not tried again for the back-off's next delay.
  void close(bool failed);
  bool write_all();  // under mu_: the output buffer written whole
  bool handshake(void* reply);  // under mu_: redisCommand()'s reply, freed: whether it is no error

  const Endpoint endpoint_;
  const ConnectionOptions options_;
  const std::string name_;  // endpoint_.name()
  std::mutex mu_;
  std::unique_ptr<redisContext, decltype(&redisFree)> ctx_{nullptr, &redisFree};  // under mu_
  std::chrono::steady_clock::time_point closed_until_;  // under mu_: not tried again before then
  Backoff backoff_;                                     // under mu_
};

}  // namespace lockwatch::detail
