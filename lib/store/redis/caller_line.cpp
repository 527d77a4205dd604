#include "caller_line.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <memory>

#include "redis_error.hpp"
#include "scripts.hpp"

namespace lockwatch::detail {

namespace {
timeval timeval_of(std::chrono::milliseconds ms) {
  return timeval{static_cast<time_t>(ms.count() / 1000), static_cast<suseconds_t>(ms.count() % 1000 * 1000)};
}
}  // namespace

CallerLine::CallerLine(Endpoint endpoint, ConnectionOptions options)
    : endpoint_(std::move(endpoint)),
      options_(options),
      name_(endpoint_.name()),
      backoff_(options_.reconnect_min, options_.reconnect_max) {}

void CallerLine::close(bool failed) {
  ctx_.reset();
  closed_until_ = std::chrono::steady_clock::now();
  if (failed) closed_until_ += backoff_.next();
}

bool CallerLine::handshake(void* reply) {
  const std::unique_ptr<redisReply, ReplyFree> r(static_cast<redisReply*>(reply));
  return r != nullptr && r->type != REDIS_REPLY_ERROR;
}

bool CallerLine::open() {
  if (ctx_ != nullptr) {
    // Readable while idle: the server closed it (or sent what nobody asked
    // for). Either way it is not trusted with a request.
    pollfd p{ctx_->fd, POLLIN, 0};
    if (ctx_->err == 0 && ::poll(&p, 1, 0) == 0) return true;
    close(false);  // connected again at once
  }
  if (endpoint_.tls || endpoint_.port <= 0 || std::chrono::steady_clock::now() < closed_until_) return false;
  ctx_.reset(redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port, timeval_of(options_.connect_timeout)));
  bool ok = ctx_ != nullptr && ctx_->err == 0 &&
            redisSetTimeout(ctx_.get(), timeval_of(options_.command_timeout)) == REDIS_OK;
  // As the loop's connections: AUTH with an empty password logs in an ACL
  // user that has nopass.
  if (ok && !endpoint_.user.empty())
    ok = handshake(redisCommand(ctx_.get(), "AUTH %b %b", endpoint_.user.data(), endpoint_.user.size(),
                                endpoint_.password.data(), endpoint_.password.size()));
  else if (ok && !endpoint_.password.empty())
    ok = handshake(redisCommand(ctx_.get(), "AUTH %b", endpoint_.password.data(), endpoint_.password.size()));
  if (ok && endpoint_.db != 0) ok = handshake(redisCommand(ctx_.get(), "SELECT %d", endpoint_.db));
  if (!ok) {
    close(true);
    return false;
  }
  backoff_.reset();
  return true;
}

bool CallerLine::write_all() {
  for (int written = 0; !written;)
    if (redisBufferWrite(ctx_.get(), &written) != REDIS_OK) return false;
  return true;
}

CallerLine::Outcome CallerLine::call(const EvalRequest& request, const Done& done, const Undo& undo) {
  const std::string_view resp = request.resp();
  std::unique_lock lk(mu_, std::try_to_lock);
  if (resp.empty() || !lk.owns_lock() || !open()) return Outcome::kNotSent;
  redisReply* r = nullptr;
  bool written = false;
  if (redisAppendFormattedCommand(ctx_.get(), resp.data(), resp.size()) != REDIS_OK || !(written = write_all()) ||
      redisGetReply(ctx_.get(), reinterpret_cast<void**>(&r)) != REDIS_OK || r == nullptr) {
    // Perhaps run: the caller counts it as the loop counts a request that
    // timed out. A request written whole may still run once the server
    // reads it, after anything sent on another connection meanwhile; its
    // undo, written behind it here, runs after it if it runs at all. (One
    // not written whole never runs: the server drops a command cut short.)
    if (written && undo) {
      const EvalRequest back = undo();
      (void)::send(ctx_->fd, back.resp().data(), back.resp().size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    const StoreError err = StoreError::unavailable(
        name_, std::string("no answer on the caller's connection: ") + (ctx_->err != 0 ? ctx_->errstr : "closed"));
    close(true);
    lk.unlock();
    done(nullptr, &err);
    return Outcome::kUnknown;
  }
  lk.unlock();
  const std::unique_ptr<redisReply, ReplyFree> free_reply(r);
  if (r->type == REDIS_REPLY_ERROR) {
    const std::string_view text(r->str, r->len);
    // The script did not run: the loop's connection loads it again.
    if (text.starts_with("NOSCRIPT")) return Outcome::kNotSent;
    StoreError err = redis_reply_error(name_, text);
    if (redis_acl_refusal(err)) err.message += " (sent: " + running(request.script()) + ")";
    done(nullptr, &err);
    return Outcome::kAnswered;
  }
  done(r, nullptr);
  return Outcome::kAnswered;
}

}  // namespace lockwatch::detail
