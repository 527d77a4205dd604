// A resource that protects itself with fencing tokens: a write carries the
// writer's lease token and is refused when a newer token has written
// before. A holder paused past its lease (GC, SIGSTOP, a slow disk) cannot
// overwrite the work of the holder that came after it, whatever it
// believes about its lock.
//
// The store keeps the value and the highest token seen in one Redis hash,
// updated by one script, so the check and the write are atomic.
#pragma once

#include <hiredis/hiredis.h>

#include <cstdint>
#include <stdexcept>
#include <string>

class FencedStore {
 public:
  FencedStore(const std::string& host, int port) {
    timeval tv{2, 0};
    c_ = redisConnectWithTimeout(host.c_str(), port, tv);
    if (c_ == nullptr || c_->err) throw std::runtime_error("FencedStore: cannot connect");
  }
  ~FencedStore() { redisFree(c_); }
  FencedStore(const FencedStore&) = delete;
  FencedStore& operator=(const FencedStore&) = delete;

  // Writes `value` under `name` if `token` is at least the highest token
  // that wrote there; returns whether it was accepted.
  bool write(const std::string& name, const std::string& value, std::uint64_t token) {
    static const char* kScript =
        "local t = tonumber(redis.call('hget', KEYS[1], 'token') or '0') "
        "if tonumber(ARGV[2]) < t then return 0 end "
        "redis.call('hset', KEYS[1], 'token', ARGV[2], 'value', ARGV[1]) return 1";
    std::string t = std::to_string(token);
    std::string key = "fenced:" + name;
    auto* r = static_cast<redisReply*>(redisCommand(c_, "EVAL %s 1 %b %b %b", kScript, key.data(), key.size(),
                                                    value.data(), value.size(), t.data(), t.size()));
    if (r == nullptr) throw std::runtime_error("FencedStore: write failed");
    bool ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    freeReplyObject(r);
    return ok;
  }

 private:
  redisContext* c_ = nullptr;
};
