#include "connection.hpp"

#include <hiredis/adapters/libuv.h>

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "lockwatch/errors.hpp"
#include "core/loop.hpp"

namespace lockwatch::detail {

struct RedisConnection::Request {
  RedisConnection* conn;
  Queued q;
};

namespace {

template <class Strings>
std::vector<const char*> argv_ptrs(const Strings& argv, std::vector<size_t>& lens) {
  std::vector<const char*> ptrs;
  ptrs.reserve(argv.size());
  lens.clear();
  lens.reserve(argv.size());
  for (const auto& a : argv) {
    ptrs.push_back(a.data());
    lens.push_back(a.size());
  }
  return ptrs;
}

// Appends one request in RESP (an array of bulk strings) to `out`.
template <class Strings>
void append_resp(std::string& out, const Strings& argv) {
  std::size_t total = 16;
  for (const auto& a : argv) total += a.size() + 16;
  out.reserve(out.size() + total);
  char digits[24];
  auto header = [&](char kind, std::size_t n) {
    out.push_back(kind);
    auto end = std::to_chars(digits, digits + sizeof digits, n).ptr;
    out.append(digits, end);
    out.append("\r\n", 2);
  };
  header('*', argv.size());
  for (const auto& a : argv) {
    header('$', a.size());
    out.append(a.data(), a.size());
    out.append("\r\n", 2);
  }
}

bool starts_with(const redisReply* r, const char* prefix) {
  std::size_t n = std::strlen(prefix);
  return r->str != nullptr && r->len >= n && std::memcmp(r->str, prefix, n) == 0;
}

// Callbacks cross C code: nothing may unwind through hiredis.
template <class F>
void guarded(F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockwatch: unexpected exception in a reply callback: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "lockwatch: unexpected exception in a reply callback\n");
  }
}

}  // namespace

RedisConnection::RedisConnection(Loop& loop, Endpoint endpoint, const Options& options, Mode mode, Hooks hooks)
    : loop_(loop),
      endpoint_(std::move(endpoint)),
      name_(endpoint_.name()),
      options_(options),
      pubsub_(mode == Mode::kPubSub),
      hooks_(std::move(hooks)) {}

RedisConnection::~RedisConnection() = default;

void RedisConnection::start() {
  uv_timer_init(loop_.uv(), &connect_timer_);
  connect_timer_.data = this;
  uv_timer_init(loop_.uv(), &check_timer_);
  check_timer_.data = this;
  connect();
}

void RedisConnection::connect() {
  reconnect_scheduled_ = false;
  auth_failed_ = false;
  if (endpoint_.port == 0) {
    // The master's address is not known yet: wait for set_endpoint(),
    // bounded like a connect.
    awaiting_endpoint_ = true;
    state_ = State::kConnecting;
    uv_timer_start(&connect_timer_, &RedisConnection::on_connect_timeout,
                   static_cast<uint64_t>(options_.connect_timeout.count()), 0);
    return;
  }
  awaiting_endpoint_ = false;
  redisAsyncContext* ac = redisAsyncConnect(endpoint_.host.c_str(), endpoint_.port);
  if (ac == nullptr || ac->err) {
    std::string why = ac ? ac->errstr : "out of memory";
    if (ac) redisAsyncFree(ac);
    fail_queued(why);  // they were waiting for this attempt
    went_down(why);
    return;
  }
  ac->data = this;
  redisLibuvAttach(ac, loop_.uv());
  redisAsyncSetConnectCallback(ac, &RedisConnection::on_connect);
  redisAsyncSetDisconnectCallback(ac, &RedisConnection::on_disconnect);
  ac_ = ac;
  state_ = State::kConnecting;
  uv_timer_start(&connect_timer_, &RedisConnection::on_connect_timeout,
                 static_cast<uint64_t>(options_.connect_timeout.count()), 0);

  // The handshake goes first in the pipeline; what waits is sent once it
  // was answered (at once if there is none).
  handshake_pending_ = 0;
  handshake_error_.clear();
  if (!endpoint_.password.empty()) {
    std::vector<std::string> auth{"AUTH"};
    if (!endpoint_.user.empty()) auth.push_back(endpoint_.user);
    auth.push_back(endpoint_.password);
    send_handshake(Handshake::kAuth, std::move(auth));
  }
  if (endpoint_.db != 0 && !pubsub_) send_handshake(Handshake::kSelect, {"SELECT", std::to_string(endpoint_.db)});
  if (require_master_) send_handshake(Handshake::kRole, {"ROLE"});
  if (pubsub_) {
    for (const auto& ch : channels_) redisAsyncCommand(ac_, &RedisConnection::on_pubsub, this, "SUBSCRIBE %b", ch.data(), ch.size());
  }
  if (!hooks_.on_connect_command.empty()) {
    std::vector<size_t> lens;
    auto ptrs = argv_ptrs(hooks_.on_connect_command, lens);
    redisAsyncCommandArgv(ac_, &RedisConnection::on_pubsub, this, static_cast<int>(ptrs.size()), ptrs.data(),
                          lens.data());
  }
  if (handshake_pending_ > 0) return;
  auto waiting = std::move(waiting_);
  waiting_.clear();
  for (auto& q : waiting) send(std::move(q));
}

void RedisConnection::send_handshake(Handshake step, std::vector<std::string> argv) {
  std::vector<size_t> lens;
  auto ptrs = argv_ptrs(argv, lens);
  void* privdata = reinterpret_cast<void*>(static_cast<std::uintptr_t>(step));
  if (redisAsyncCommandArgv(ac_, &RedisConnection::on_handshake, privdata, static_cast<int>(ptrs.size()),
                            ptrs.data(), lens.data()) != REDIS_OK)
    return;
  handshake_pending_++;
  sent_at_.push_back(std::chrono::steady_clock::now());
  start_timeout_check();
}

void RedisConnection::command(std::vector<std::string> argv, ReplyCallback cb) {
  send(Queued{std::move(argv), {}, std::move(cb), nullptr, nullptr, {}});
}

void RedisConnection::eval(const Script& script, std::vector<std::string> keys_then_args, int num_keys,
                           ReplyCallback cb) {
  std::vector<std::string> argv;
  argv.reserve(keys_then_args.size() + 3);
  argv.emplace_back("EVALSHA");
  argv.push_back(script.sha1);
  argv.push_back(std::to_string(num_keys));
  for (auto& a : keys_then_args) argv.push_back(std::move(a));
  send(Queued{std::move(argv), {}, std::move(cb), &script, nullptr, {}});
}

void RedisConnection::eval_views(const Script& script, const std::vector<std::string_view>& keys_then_args,
                                 int num_keys, std::shared_ptr<const void> keepalive, ReplyCallback cb) {
  Queued q{{}, {}, std::move(cb), &script, std::move(keepalive), std::to_string(num_keys)};
  q.views.reserve(keys_then_args.size() + 3);
  q.views.emplace_back("EVALSHA");
  q.views.emplace_back(script.sha1);
  q.views.emplace_back();  // the count, pointed at q.num_keys once q is in place
  q.views.insert(q.views.end(), keys_then_args.begin(), keys_then_args.end());
  send(std::move(q));
}

void RedisConnection::send(Queued q) {
  if (state_ == State::kClosed) {
    // Never inside the caller's call: it may hold state across it.
    auto err = std::make_exception_ptr(ConnectionError(name_, "connection closed"));
    auto cb = std::make_shared<ReplyCallback>(std::move(q.cb));
    if (!loop_.post([cb, err] { guarded([&] { (*cb)(nullptr, err); }); })) {
      guarded([&] { (*cb)(nullptr, err); });
    }
    return;
  }
  if (ac_ == nullptr || handshake_pending_ > 0) {
    waiting_.push_back(std::move(q));
    if (!reconnect_scheduled_ && state_ == State::kDown) schedule_reconnect();
    return;
  }
  auto* req = new Request{this, std::move(q)};
  if (!submit(req)) {
    // The context is being torn down (we are inside its failure callbacks):
    // the request waits for the next connection instead.
    waiting_.push_back(std::move(req->q));
    delete req;
  }
}

bool RedisConnection::submit(Request* req) {
  // The request is written in RESP here, into a buffer the connection
  // keeps: hiredis's own formatting goes through a printf-like routine per
  // argument, which a renewal batch of a thousand arguments feels.
  format_buf_.clear();
  if (req->q.views.empty()) {
    append_resp(format_buf_, req->q.argv);
  } else {
    req->q.views[2] = req->q.num_keys;  // the string lives in the request now
    append_resp(format_buf_, req->q.views);
  }
  const int rc =
      redisAsyncFormattedCommand(ac_, &RedisConnection::on_reply, req, format_buf_.data(), format_buf_.size());
  // A renewal batch needs tens of KiB; one huge key must not pin its size.
  if (format_buf_.capacity() > (std::size_t{256} << 10)) std::string().swap(format_buf_);
  if (rc != REDIS_OK) return false;
  sent_at_.push_back(std::chrono::steady_clock::now());
  start_timeout_check();
  return true;
}

std::exception_ptr RedisConnection::error_for(const redisReply* r) const {
  std::string msg(r->str ? r->str : "", r->str ? r->len : 0);
  if (auth_failed_ || starts_with(r, "NOAUTH") || starts_with(r, "WRONGPASS"))
    return std::make_exception_ptr(AuthError(name_, auth_failed_ ? auth_error_ : msg));
  return std::make_exception_ptr(RedisError(name_, std::move(msg)));
}

void RedisConnection::on_reply(redisAsyncContext* ac, void* reply, void* privdata) {
  auto* req = static_cast<Request*>(privdata);
  RedisConnection* self = req->conn;
  auto* r = static_cast<redisReply*>(reply);
  if (!self->sent_at_.empty()) self->sent_at_.pop_front();
  guarded([&] {
    if (r == nullptr) {
      // A failing context has copied its error by now; our own resets set
      // last_error_ before freeing it.
      std::string why = (ac != nullptr && ac->errstr[0] != '\0') ? std::string(ac->errstr) : self->last_error_;
      req->q.cb(nullptr, std::make_exception_ptr(ConnectionError(self->name_, why)));
    } else if (r->type == REDIS_REPLY_ERROR) {
      if (req->q.script != nullptr && starts_with(r, "NOSCRIPT")) {
        // The server lost its script cache (restart, SCRIPT FLUSH): EVAL
        // runs the source and caches it again.
        Queued q = std::move(req->q);
        if (q.views.empty()) {
          q.argv[0] = "EVAL";
          q.argv[1] = std::string(q.script->source);
        } else {
          q.views[0] = "EVAL";
          q.views[1] = q.script->source;  // static storage
        }
        q.script = nullptr;
        self->send(std::move(q));
      } else {
        req->q.cb(nullptr, self->error_for(r));
      }
    } else {
      req->q.cb(r, nullptr);
    }
  });
  delete req;
}

void RedisConnection::on_handshake(redisAsyncContext* ac, void* reply, void* privdata) {
  auto* self = static_cast<RedisConnection*>(ac->data);
  auto* r = static_cast<redisReply*>(reply);
  if (self == nullptr || self->ac_ != ac) return;  // torn down: went_down() took over
  if (!self->sent_at_.empty()) self->sent_at_.pop_front();
  if (r == nullptr) return;  // the connection is failing: went_down() follows
  self->handshake_pending_--;
  const auto step = static_cast<Handshake>(reinterpret_cast<std::uintptr_t>(privdata));
  // The first refusal says what is wrong (after a refused AUTH the rest
  // answer NOAUTH, which would only hide it).
  if (self->handshake_error_.empty()) {
    if (r->type == REDIS_REPLY_ERROR) {
      std::string msg(r->str, r->len);
      switch (step) {
        case Handshake::kAuth:
          self->auth_failed_ = true;
          self->auth_error_ = msg;
          self->handshake_error_ = "authentication failed: " + msg;
          break;
        case Handshake::kSelect:
          self->handshake_error_ = fmt::format("SELECT {} was refused: {}", self->endpoint_.db, msg);
          break;
        case Handshake::kRole:
          self->handshake_error_ = "ROLE was refused: " + msg;
          break;
      }
    } else if (step == Handshake::kRole) {
      std::string role;
      if (r->type == REDIS_REPLY_ARRAY && r->elements > 0 && r->element[0]->type == REDIS_REPLY_STRING)
        role.assign(r->element[0]->str, r->element[0]->len);
      if (role != "master")
        self->handshake_error_ =
            fmt::format("{} is not a master (ROLE says '{}'): the failover has not reached it", self->name_, role);
    }
  }
  if (self->handshake_pending_ > 0) return;
  if (!self->handshake_error_.empty()) {
    // What waited fails with the reason; the connection is dropped and
    // tried again after the back-off (a sentinel's answer may catch up).
    self->last_error_ = self->handshake_error_;
    self->fail_queued(self->handshake_error_);
    redisAsyncDisconnect(ac);
    return;
  }
  if (self->state_ == State::kConnected) self->became_usable();
  auto waiting = std::move(self->waiting_);
  self->waiting_.clear();
  for (auto& q : waiting) self->send(std::move(q));
}

void RedisConnection::on_pubsub(redisAsyncContext*, void* reply, void* privdata) {
  auto* self = static_cast<RedisConnection*>(privdata);
  auto* r = static_cast<redisReply*>(reply);
  if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements < 2) return;
  const redisReply* kind = r->element[0];
  const redisReply* channel = r->element[1];
  if (kind->type != REDIS_REPLY_STRING || channel->type != REDIS_REPLY_STRING) return;
  std::string_view payload;
  if (r->elements >= 3 && r->element[2]->type == REDIS_REPLY_STRING)
    payload = std::string_view(r->element[2]->str, r->element[2]->len);
  if (self->hooks_.on_message)
    guarded([&] {
      self->hooks_.on_message(std::string_view(kind->str, kind->len), std::string_view(channel->str, channel->len),
                              payload);
    });
}

void RedisConnection::on_connect(const redisAsyncContext* ac, int status) {
  auto* self = static_cast<RedisConnection*>(ac->data);
  if (self == nullptr || self->ac_ != ac) return;
  uv_timer_stop(&self->connect_timer_);
  if (status != REDIS_OK) {
    // hiredis frees the context after this callback; pending callbacks
    // have already been told.
    self->ac_ = nullptr;
    self->went_down(ac->errstr[0] ? ac->errstr : "connect failed");
    return;
  }
  self->state_ = State::kConnected;
  self->backoff_ = std::chrono::milliseconds(0);
  if (self->handshake_pending_ == 0) self->became_usable();
}

void RedisConnection::became_usable() {
  if (!reported_down_) return;
  reported_down_ = false;
  if (state_hook_) guarded([&] { state_hook_(true, std::string()); });
}

void RedisConnection::on_disconnect(const redisAsyncContext* ac, int status) {
  auto* self = static_cast<RedisConnection*>(ac->data);
  if (self == nullptr || self->ac_ != ac) return;
  self->ac_ = nullptr;
  self->went_down(status == REDIS_OK ? "connection closed" : (ac->errstr[0] ? ac->errstr : "connection lost"));
}

void RedisConnection::went_down(const std::string& why) {
  // An attempt that never became usable (refused, timed out, dropped
  // before the handshake's answers): what waited for it fails now.
  const bool attempt_failed = state_ == State::kConnecting || handshake_pending_ > 0;
  last_error_ = why;
  sent_at_.clear();
  handshake_pending_ = 0;
  if (state_ == State::kClosed) return;
  state_ = State::kDown;
  uv_timer_stop(&check_timer_);
  if (hooks_.on_down) guarded([&] { hooks_.on_down(); });
  if (!reported_down_) {
    reported_down_ = true;
    if (state_hook_) guarded([&] { state_hook_(false, why); });
  }
  // What was sent on the dead context has failed through its callbacks;
  // what those callbacks queued since waits for the next attempt, and fails
  // if that one fails: a caller learns within back-off + connect_timeout.
  if (attempt_failed) fail_queued(why);
  schedule_reconnect();
}

void RedisConnection::fail_queued(const std::string& why) {
  auto waiting = std::move(waiting_);
  waiting_.clear();
  auto err = down_error(why);
  for (auto& q : waiting) {
    guarded([&] { q.cb(nullptr, err); });
  }
}

std::exception_ptr RedisConnection::down_error(const std::string& why) const {
  if (auth_failed_) return std::make_exception_ptr(AuthError(name_, why));
  return std::make_exception_ptr(ConnectionError(name_, why));
}

void RedisConnection::schedule_reconnect() {
  if (state_ == State::kClosed || reconnect_scheduled_) return;
  reconnect_scheduled_ = true;
  backoff_ = backoff_.count() == 0 ? options_.reconnect_min : std::min(backoff_ * 2, options_.reconnect_max);
  uv_timer_start(&connect_timer_, &RedisConnection::on_reconnect_timer, static_cast<uint64_t>(backoff_.count()), 0);
}

void RedisConnection::on_reconnect_timer(uv_timer_t* t) {
  auto* self = static_cast<RedisConnection*>(t->data);
  if (self->state_ == State::kClosed) return;
  self->connect();
}

void RedisConnection::on_connect_timeout(uv_timer_t* t) {
  auto* self = static_cast<RedisConnection*>(t->data);
  if (self->awaiting_endpoint_) {
    self->awaiting_endpoint_ = false;
    std::string why = "the master's address is not known (no sentinel answered)";
    self->fail_queued(why);
    self->went_down(why);
    return;
  }
  if (self->state_ != State::kConnecting || self->ac_ == nullptr) return;
  redisAsyncContext* ac = self->ac_;
  self->ac_ = nullptr;
  self->last_error_ = "connect timed out after " + std::to_string(self->options_.connect_timeout.count()) + " ms";
  redisAsyncFree(ac);  // pending callbacks get null replies: ConnectionError
  self->went_down(self->last_error_);
}

void RedisConnection::start_timeout_check() {
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&check_timer_))) return;
  auto period = std::max<uint64_t>(1, static_cast<uint64_t>(options_.command_timeout.count()) / 4);
  uv_timer_start(&check_timer_, &RedisConnection::on_command_check, period, period);
}

void RedisConnection::on_command_check(uv_timer_t* t) {
  auto* self = static_cast<RedisConnection*>(t->data);
  if (self->sent_at_.empty() || self->ac_ == nullptr) {
    uv_timer_stop(t);
    return;
  }
  if (std::chrono::steady_clock::now() - self->sent_at_.front() < self->options_.command_timeout) return;
  // Replies come in order: the oldest request is overdue, so the server (or
  // the path to it) is not answering. Reset; everything pending fails.
  redisAsyncContext* ac = self->ac_;
  self->ac_ = nullptr;
  self->last_error_ = "no reply within " + std::to_string(self->options_.command_timeout.count()) + " ms";
  std::string why = self->last_error_;
  ac->data = nullptr;  // our disconnect callback must not run for it
  redisAsyncFree(ac);
  self->went_down(why);
}

void RedisConnection::poll_replies() {
  if (ac_ != nullptr && state_ == State::kConnected && !sent_at_.empty()) redisAsyncHandleRead(ac_);
}

void RedisConnection::set_endpoint(const Endpoint& endpoint) {
  if (endpoint.host == endpoint_.host && endpoint.port == endpoint_.port) return;
  endpoint_.host = endpoint.host;
  endpoint_.port = endpoint.port;
  name_ = endpoint_.name();
  if (state_ == State::kClosed) return;
  if (awaiting_endpoint_) {
    uv_timer_stop(&connect_timer_);
    connect();
    return;
  }
  backoff_ = std::chrono::milliseconds(0);
  if (ac_ != nullptr) {
    redisAsyncContext* ac = ac_;
    ac_ = nullptr;
    ac->data = nullptr;
    last_error_ = "the master moved to " + name_;
    redisAsyncFree(ac);
    went_down(last_error_);
  }
  // Down (in back-off): the next attempt uses the new address; make it now.
  if (reconnect_scheduled_) {
    uv_timer_stop(&connect_timer_);
    connect();
  }
}

void RedisConnection::subscribe(const std::string& channel) {
  if (!channels_.insert(channel).second) return;
  if (ac_ != nullptr && state_ != State::kClosed)
    redisAsyncCommand(ac_, &RedisConnection::on_pubsub, this, "SUBSCRIBE %b", channel.data(), channel.size());
  else if (!reconnect_scheduled_ && state_ == State::kDown)
    schedule_reconnect();
}

void RedisConnection::unsubscribe(const std::string& channel) {
  if (channels_.erase(channel) == 0) return;
  if (ac_ != nullptr && state_ == State::kConnected)
    redisAsyncCommand(ac_, &RedisConnection::on_pubsub, this, "UNSUBSCRIBE %b", channel.data(), channel.size());
}

void RedisConnection::close() {
  if (state_ == State::kClosed) return;
  state_ = State::kClosed;
  if (ac_ != nullptr) {
    redisAsyncContext* ac = ac_;
    ac_ = nullptr;
    last_error_ = "connection closed";
    redisAsyncFree(ac);
  }
  fail_queued("connection closed");
  auto on_closed = [](uv_handle_t* h) { static_cast<RedisConnection*>(h->data)->closed_handles_++; };
  uv_close(reinterpret_cast<uv_handle_t*>(&connect_timer_), on_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&check_timer_), on_closed);
}

}  // namespace lockwatch::detail
