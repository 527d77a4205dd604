#include "connection.hpp"

#include <sys/socket.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <exception>
#include <utility>

#include "core/guarded.hpp"
#include "core/loop.hpp"
#include "core/option_checks.hpp"
#include "store/redis/redis_error.hpp"

namespace lockwatch::detail {

// Callbacks cross C code: nothing may unwind through libuv.
constexpr const char* kReplyCallback = "a reply callback";

namespace {

// Appends a RESP header: `kind` ('*' an array, '$' a bulk string) and its
// count, to a connection's output or a script call's text.
template <class Out>
void append_header(Out& out, char kind, std::size_t n) {
  char digits[24];
  out.push_back(kind);
  auto end = std::to_chars(digits, digits + sizeof digits, n).ptr;
  out.insert(out.end(), digits, end);
  out.insert(out.end(), {'\r', '\n'});
}

// Appends one request in RESP (an array of bulk strings) to `out`.
template <class Strings>
void append_resp(std::string& out, const Strings& argv) {
  std::size_t total = 16;
  for (const auto& a : argv) total += a.size() + 16;
  // Grown geometrically: the requests of one turn pile up in `out`, and an
  // exact reserve per request would copy the whole buffer each time.
  if (const std::size_t need = out.size() + total; need > out.capacity())
    out.reserve(std::max(need, 2 * out.capacity()));
  append_header(out, '*', argv.size());
  for (const auto& a : argv) {
    append_header(out, '$', a.size());
    out.append(a.data(), a.size());
    out.append("\r\n", 2);
  }
}

// A write the socket did not take at once (flush): its buffers, whole.
struct RedisWrite final : Stream::Write {
  std::string data;
  std::vector<LargeCall> wholes;  // the large calls among data's bytes
};
// The pieces of `out` with `wholes` between its bytes, in order, less the
// first `from` bytes: a write's buffers (a heap block only with wholes).
struct Pieces {
  uv_buf_t one{};
  std::vector<uv_buf_t> many;
  const uv_buf_t* bufs() const noexcept { return many.empty() ? &one : many.data(); }
  unsigned count() const noexcept { return many.empty() ? 1 : static_cast<unsigned>(many.size()); }
};
Pieces pieces(std::string& out, const std::vector<LargeCall>& wholes, std::size_t from) {
  Pieces p;
  if (wholes.empty()) {
    p.one = uv_buf_init(out.data() + from, static_cast<unsigned>(out.size() - from));
    return p;
  }
  p.many.reserve(2 * wholes.size() + 1);
  auto add = [&](const char* at, std::size_t n) {
    if (from >= n) {
      from -= n;
      return;
    }
    p.many.push_back(uv_buf_init(const_cast<char*>(at) + from, static_cast<unsigned>(n - from)));
    from = 0;
  };
  std::size_t at = 0;
  for (const auto& w : wholes) {
    add(out.data() + at, w.at - at);
    at = w.at;
    add(w.text->data(), w.text->size());
  }
  add(out.data() + at, out.size() - at);
  return p;
}

// A script call this large is written from its own buffer (LargeCall):
// a copy would cost more than the write call it saves.
constexpr std::size_t kWholeWrite = 32 * 1024;

// Pushes reach on_message (pubsub mode); anything else answers a request.
bool is_push(const redisReply* r) {
  static constexpr std::string_view kKinds[] = {"message",      "subscribe", "unsubscribe", "smessage",    "ssubscribe",
                                                "sunsubscribe", "pmessage",  "psubscribe",  "punsubscribe"};
  return r->type == REDIS_REPLY_ARRAY && r->elements >= 2 && is_string(r->element[0]) &&
         std::find(std::begin(kKinds), std::end(kKinds), text_of(r->element[0])) != std::end(kKinds);
}

}  // namespace

RedisConnection::RedisConnection(Loop& loop, Endpoint endpoint, const StoreSettings& settings, Mode mode, Hooks hooks)
    : loop_(loop),
      endpoint_(std::move(endpoint)),
      name_(endpoint_.name()),
      connection_(settings.connection),
      owner_(connection_owner_name(settings.owner_name)),
      hooks_(std::move(hooks)) {
  if (mode != Mode::kCommands)
    subs_ = std::make_unique<Subscriptions>(mode == Mode::kShardedPubSub, *this);
  if (endpoint_.tls) {
    // Options::validate() read the same files already; if one went away
    // since, every attempt fails saying so.
    try {
      tls_ = TlsContext::make(settings.tls);
    } catch (const std::exception& e) {
      tls_error_ = e.what();
    }
  }
}

void RedisConnection::start() {
  uv_prepare_init(loop_.uv(), &flush_);
  flush_.data = this;
  // Adaptive polling waits for the replies of requests; pushes come unasked.
  if (!subs_) demand_id_ = loop_.add_demand([this] { return awaited_; });
  request_timer_.start();
  reconnector_.start();
}

void RedisConnection::attempt() {
  auth_refusal_.reset();
  select_failed_ = false;
  // Port 0: the master's address is not known yet. Wait for set_endpoint(),
  // bounded like a connect: an attempt with no link.
  if (endpoint_.port == 0) return;
  if (endpoint_.tls && tls_ == nullptr) {
    link_failed("TLS is not usable: " + tls_error_);
    return;
  }
  reader_.reset(redisReaderCreate());
  if (reader_ == nullptr) {
    link_failed("out of memory");
    return;
  }
  Stream* link = Stream::make(loop_.uv(), *this, "rediss://");
  {
    std::lock_guard lk(lane_mu_);
    link_ = link;
  }
  write_handshake();
  link->connect(endpoint_.host, endpoint_.port, tls_.get());
  if (link_ != link || handshake_pending_ > 0) return;
  send_waiting();
}

void RedisConnection::send_waiting() {
  for (auto& q : std::exchange(waiting_, {})) send(std::move(q));
}

void RedisConnection::write_handshake() {
  // The handshake goes first in the pipeline; what waits is sent once it
  // was answered (at once if there is none).
  handshake_pending_ = 0;
  handshake_error_.clear();
  // A user without a password (redis://user:@host) is still that user:
  // AUTH with an empty password logs in an ACL user that has nopass.
  if (!endpoint_.user.empty())
    send_handshake(Handshake::kAuth, {"AUTH", endpoint_.user, endpoint_.password});
  else if (!endpoint_.password.empty())
    send_handshake(Handshake::kAuth, {"AUTH", endpoint_.password});
  if (endpoint_.db != 0 && !subs_) send_handshake(Handshake::kSelect, {"SELECT", std::to_string(endpoint_.db)});
  if (hooks_.named) send_handshake(Handshake::kName, {"CLIENT", "SETNAME", "lockwatch:" + owner_});
  if (require_master_) send_handshake(Handshake::kRole, {"ROLE"});
  if (subs_) subs_->resubscribe();
  if (!hooks_.on_connect_command.empty()) append_resp(out_, hooks_.on_connect_command);
}

void RedisConnection::stream_ready() {
  reconnector_.connected();
  if (handshake_pending_ == 0) became_usable();
  want_flush();
}

void RedisConnection::send_handshake(Handshake step, std::vector<std::string> argv) {
  append_resp(out_, argv);
  push_pending(Pending{step, kUnwritten, {}});
  handshake_pending_++;
  request_timer_.watch();
}

void RedisConnection::write(const std::vector<std::string_view>& argv) {
  append_resp(out_, argv);
  want_flush();
}

void RedisConnection::command(std::vector<std::string> argv, ReplyCallback cb) {
  send(Queued{std::move(argv), {}, std::move(cb)});
}

EvalRequest::EvalRequest(const Script& script, std::size_t keys, std::size_t args, std::size_t bytes_hint)
    : script_(&script), expected_(args) {
  resp_.reserve(96 + script.sha1.size() + bytes_hint + 16 * args);
  auto put = [this](std::string_view text) { resp_.insert(resp_.end(), text.begin(), text.end()); };
  append_header(resp_, '*', args + 3);
  put("$7\r\nEVALSHA\r\n");
  append_header(resp_, '$', script.sha1.size());
  put(script.sha1);
  put("\r\n");
  body_at_ = resp_.size();
  used_ = resp_.size();
  resp_.resize(resp_.capacity());  // the estimate's room
  const std::string count = std::to_string(keys);
  copy(count, open(count.size()));
  if (expected_ == 0) resp_.resize(used_);
}

char* EvalRequest::open(std::size_t n) {
  // Most arguments (names, tokens, ttls) are under 100 bytes: their length
  // is written without to_chars.
  char digits[24];
  std::size_t len;
  if (n < 10) {
    digits[0] = static_cast<char>('0' + n);
    len = 1;
  } else if (n < 100) {
    digits[0] = static_cast<char>('0' + n / 10);
    digits[1] = static_cast<char>('0' + n % 10);
    len = 2;
  } else {
    len = static_cast<std::size_t>(std::to_chars(digits, digits + sizeof digits, n).ptr - digits);
  }
  const std::size_t need = 1 + len + 2 + n + 2;
  if (used_ + need > resp_.size()) resp_.resize(std::max(used_ + need, 2 * resp_.size()));
  char* at = resp_.data() + used_;
  used_ += need;
  *at++ = '$';
  at = copy(std::string_view(digits, len), at);
  *at++ = '\r';
  *at++ = '\n';
  at[n] = '\r';
  at[n + 1] = '\n';
  return at;
}

void RedisConnection::eval(EvalRequest request, ReplyCallback cb) {
  // A miscounted request would desynchronise the connection's replies: it
  // is not sent.
  if (request.written_ != request.expected_) {
    fail_later(std::move(cb), StoreError::invalid(name_, fmt::format("{} request with {} of its {} arguments",
                                                                     running(*request.script_), request.written_,
                                                                     request.expected_)));
    return;
  }
  send(queued(request, std::move(cb)));
}

RedisConnection::Queued RedisConnection::queued(EvalRequest& request, ReplyCallback cb) {
  return Queued{{}, std::move(request.resp_), std::move(cb), request.script_, request.body_at_};
}

void RedisConnection::fail_later(ReplyCallback cb, StoreError err) {
  auto fail = [cb = std::make_shared<ReplyCallback>(std::move(cb)),
               err = std::make_shared<const StoreError>(std::move(err))] {
    guarded(kReplyCallback, [&] { (*cb)(nullptr, err.get()); });
  };
  if (!loop_.post(fail)) fail();
}

void RedisConnection::send(Queued q) {
  if (std::exchange(ask_next_, false)) q.asking = true;
  if (closed()) {
    fail_later(std::move(q.cb), StoreError::unavailable(name_, "connection closed"));
    return;
  }
  if (link_ == nullptr || handshake_pending_ > 0) {
    waiting_.push_back(std::move(q));
    reconnector_.want_attempt();
    return;
  }
  // Written in RESP straight into the link's output, which the flush hands
  // to the socket once per loop iteration with everything else queued; a
  // large script call goes from its own buffer, in its place (LargeCall).
  // An ASKING goes first, a command of its own: its reply (OK) matters to
  // nobody; it only has to come first.
  if (q.asking) send(Queued{{"ASKING"}, {}, [](const redisReply*, const StoreError*) {}});
  if (q.resp.size() >= kWholeWrite && tls_ == nullptr) {  // TLS encrypts a copy anyway
    q.whole = std::make_shared<const RespText>(std::move(q.resp));
    q.resp.clear();
    wholes_.push_back(LargeCall{out_.size(), q.whole});
  } else if (!q.resp.empty()) {
    out_.append(q.resp.data(), q.resp.size());
  } else {
    append_resp(out_, q.argv);
  }
  push_pending(Pending{Handshake::kNone, kUnwritten, std::move(q)});
  request_timer_.watch();
  want_flush();
}

void RedisConnection::push_pending(Pending p) {
  p.awaited = !Loop::background();
  if (p.awaited) ++awaited_;
  std::lock_guard lk(lane_mu_);
  pending_.push_back(std::move(p));
  lane_idle_.store(false, std::memory_order_relaxed);
}

void RedisConnection::want_flush() {
  if (link_ != nullptr && link_->ready() && (!out_.empty() || !wholes_.empty()))
    uv_prepare_start(&flush_, &RedisConnection::on_flush);
}

void RedisConnection::on_flush(uv_prepare_t* p) {
  uv_prepare_stop(p);
  static_cast<RedisConnection*>(p->data)->flush();
}

void RedisConnection::flush() {
  Stream* link = link_;
  if (link == nullptr || !link->ready()) return;
  if (tls_ != nullptr) {
    // TLS encrypts a copy: what the session produced goes out in one write.
    if (out_.empty() || !link->write(out_)) return;  // failed: the link and what was pending are gone
    std::lock_guard lk(lane_mu_);
    written(out_.size());
    return;
  }
  std::unique_lock lk(lane_mu_);
  if (out_.empty() && wholes_.empty() && lane_rest_.empty()) return;
  // A direct request the socket took only part of goes on first.
  if (!lane_rest_.empty()) {
    out_.insert(0, lane_rest_);
    for (auto& w : wholes_) w.at += lane_rest_.size();
    lane_rest_.clear();
  }
  // A write of libuv's still under way: what is queued waits for it, and
  // then goes out in one write from a buffer kept, not behind it in
  // another made anew (a burst of a million leases' renewals). Its command
  // timeout starts then.
  if (link->writes_queued() > 0) return;
  // Under the lane's lock: no direct request comes between these bytes.
  // The large calls go in their places from their own buffers.
  const Pieces all = pieces(out_, wholes_, 0);
  std::size_t total = out_.size();
  for (const auto& w : wholes_) total += w.text->size();
  const int n = link->try_write(all.bufs(), all.count());
  if (n < 0) {
    lk.unlock();
    link->fail(std::string("write failed: ") + uv_strerror(n));
    return;
  }
  const auto done = static_cast<std::size_t>(n);
  const std::size_t used = out_.size();
  std::unique_ptr<RedisWrite> rest;
  if (done < total) {
    // The socket is full: the rest goes out with a write of libuv's, and
    // the lane waits for it. The buffers go with it whole, nothing
    // copied; out_ goes on in the one a finished write gave back.
    rest = std::make_unique<RedisWrite>();
    rest->data.swap(out_);
    out_.swap(spare_);
    rest->wholes.swap(wholes_);
    ++writes_in_flight_;
  }
  wholes_.clear();
  written(used);
  note_lane();
  lk.unlock();
  if (rest) {
    const Pieces left = pieces(rest->data, rest->wholes, done);
    link->write_later(std::move(rest), left.bufs(), left.count());
  }
}

void RedisConnection::written(std::size_t used) {
  // What was just written starts its command timeout now. Only written
  // requests are answered (dispatch), so the unwritten are all still
  // pending, the last of it (a direct request goes only on an empty
  // pending_, and each flush writes all that is queued).
  const auto now = std::chrono::steady_clock::now();
  for (auto it = pending_.rbegin(); it != pending_.rend() && it->sent_at == kUnwritten; ++it)
    it->sent_at = now;
  out_.clear();
  // Kept while bursts fill it: a tick's renewals of a million leases take
  // about a MiB, and a buffer made anew is paged in anew. One huge key, or
  // bursts that are over (64 writes in a row far smaller), do not pin it.
  const std::size_t cap = std::max(out_.capacity(), spare_.capacity());
  small_writes_ = used < cap / 4 ? small_writes_ + 1 : 0;
  if (cap > (std::size_t{256} << 10) && small_writes_ >= 64) {
    std::string().swap(out_);
    std::string().swap(spare_);
  }
}

void RedisConnection::stream_wrote(std::unique_ptr<Stream::Write> done) {
  auto& w = static_cast<RedisWrite&>(*done);
  if (w.data.capacity() > spare_.capacity()) {
    w.data.clear();
    spare_.swap(w.data);  // out_'s next buffer (flush)
  }
  {
    std::lock_guard lk(lane_mu_);  // flush()'s writes are counted for the lane
    --writes_in_flight_;
    note_lane();
  }
  if (link_->writes_queued() == 0) want_flush();  // what waited for it (flush)
}

void RedisConnection::stream_data(const char* data, std::size_t n) {
  loop_.note_event();
  // When this read's replies came: one clock read for all of them.
  read_at_ = std::chrono::steady_clock::now();
  if (redisReaderFeed(reader_.get(), data, n) != REDIS_OK) {
    link_failed(std::string("cannot read the reply: ") + reader_->errstr);
    return;
  }
  for (Stream* link = link_; link_ == link;) {
    void* reply = nullptr;
    if (redisReaderGetReply(reader_.get(), &reply) != REDIS_OK) {
      link_failed(std::string("protocol error: ") + reader_->errstr);
      return;
    }
    if (reply == nullptr) return;
    std::unique_ptr<redisReply, ReplyFree> r(static_cast<redisReply*>(reply));
    dispatch(r.get());
  }
}

void RedisConnection::dispatch(const redisReply* r) {
  if (subs_ && is_push(r)) {
    on_push(r);
    return;
  }
  // A reply answers the oldest request written; one that is not written
  // yet (made by a callback of this read) cannot have been answered.
  std::unique_lock lk(lane_mu_);
  if (pending_.empty() || pending_.front().sent_at == kUnwritten) {
    lk.unlock();
    // Pubsub mode: an error answering a subscription, which nothing waits
    // for. In command mode replies and requests no longer match: start
    // afresh.
    if (subs_ && r->type == REDIS_REPLY_ERROR) subs_->error(error_for(r));
    if (!subs_) link_failed("a reply to no request: the connection is out of step");
    return;
  }
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  note_lane();
  lk.unlock();
  // A whole reply: bytes trickling in without ever making one are no answer.
  answered_at_ = read_at_;
  if (p.awaited) --awaited_;
  if (p.step == Handshake::kNone) {
    on_request_reply(std::move(p.q), r);
  } else {
    on_handshake_reply(p.step, r);
  }
}

StoreError RedisConnection::error_for(const redisReply* r) const {
  // After a refused AUTH every answer is NOAUTH: say what AUTH answered.
  if (auth_refusal_) return *auth_refusal_;
  return redis_reply_error(name_, std::string_view(r->str ? r->str : "", r->str ? r->len : 0));
}

void RedisConnection::on_request_reply(Queued q, const redisReply* r) {
  guarded(kReplyCallback, [&] {
    if (r->type == REDIS_REPLY_ERROR) {
      if (q.body_at != 0 && std::string_view(r->str, r->len).starts_with("NOSCRIPT")) {
        // The server lost its script cache (restart, SCRIPT FLUSH): EVAL
        // runs the source and caches it again. Same arguments: the array
        // header and the key count onwards stay.
        const RespText& text = q.whole ? *q.whole : q.resp;
        const std::string_view was(text.data(), text.size());
        const std::string eval = fmt::format("{}$4\r\nEVAL\r\n${}\r\n{}\r\n{}", was.substr(0, was.find("\r\n") + 2),
                                             q.script->source.size(), q.script->source, was.substr(q.body_at));
        q.resp.assign(eval.begin(), eval.end());
        q.whole.reset();
        q.body_at = 0;
        send(std::move(q));
      } else {
        StoreError err = error_for(r);
        // Redis names the command at best, never the script or what it
        // calls: say what was sent.
        if (redis_acl_refusal(err) && !auth_refusal_) err.message += " (sent: " + sent(q) + ")";
        q.cb(nullptr, &err);
      }
    } else {
      q.cb(r, nullptr);
    }
  });
}

std::string RedisConnection::sent(const Queued& q) {
  if (q.script != nullptr) return running(*q.script);
  auto arg = [&](std::size_t i) { return i < q.argv.size() ? std::string_view(q.argv[i]) : std::string_view(); };
  std::string out(arg(0));
  // Commands whose subcommand the ACL decides on.
  if (out == "CLUSTER" || out == "SENTINEL") out.append(" ").append(arg(1));
  return out;
}

void RedisConnection::on_handshake_reply(Handshake step, const redisReply* r) {
  handshake_pending_--;
  // The first refusal says what is wrong (after a refused AUTH the rest
  // answer NOAUTH, which would only hide it).
  if (handshake_error_.empty() && step != Handshake::kName) {
    if (r->type == REDIS_REPLY_ERROR) {
      std::string msg(r->str, r->len);
      handshake_error_ = step == Handshake::kAuth     ? "authentication failed: " + msg
                         : step == Handshake::kSelect ? fmt::format("SELECT {} was refused: {}", endpoint_.db, msg)
                                                      : "ROLE was refused: " + msg;
      // No such database ("DB index is out of range"): the URL is wrong,
      // and no retry makes it right.
      if (step == Handshake::kSelect) select_failed_ = true;
      const StoreError refusal = redis_reply_error(name_, msg);
      if (step == Handshake::kAuth || redis_acl_refusal(refusal)) {
        // AUTH refused, or the user may not SELECT or ask ROLE: refused
        // credentials, not a node to wait for.
        auth_refusal_ = StoreError::auth(name_, step == Handshake::kAuth ? msg : handshake_error_, refusal.code);
      }
    } else if (step == Handshake::kRole) {
      std::string role;
      if (r->type == REDIS_REPLY_ARRAY && r->elements > 0 && is_string(r->element[0])) role = text_of(r->element[0]);
      if (role != "master")
        handshake_error_ =
            fmt::format("{} is not a master (ROLE says '{}'): the failover has not reached it", name_, role);
    }
  }
  if (handshake_pending_ > 0) return;
  if (!handshake_error_.empty()) {
    // What waited fails with the reason; the connection is dropped and
    // tried again after the back-off (a sentinel's answer may catch up).
    link_failed(handshake_error_);
    return;
  }
  if (up()) became_usable();
  send_waiting();
}

void RedisConnection::on_push(const redisReply* r) {
  const std::string_view kind = text_of(r->element[0]);
  // pmessage: pattern, channel, payload; the others: channel[, payload].
  const std::size_t at = kind == "pmessage" ? 2 : 1;
  if (r->elements <= at || !is_string(r->element[at])) return;
  const std::string_view channel = text_of(r->element[at]);
  const std::string_view payload = r->elements > at + 1 && is_string(r->element[at + 1]) ? text_of(r->element[at + 1])
                                                                                        : std::string_view();
  if (subs_->handled(kind, channel)) return;
  if (hooks_.on_message) guarded(kReplyCallback, [&] { hooks_.on_message(kind, channel, payload); });
}

void RedisConnection::became_usable() {
  // The lane opens on a plaintext link, in commands mode.
  if (lane_enabled_ && !subs_ && link_ != nullptr && !link_->tls() && link_->fd() >= 0) {
    std::lock_guard lk(lane_mu_);
    lane_fd_ = link_->fd();
    note_lane();
  }
  reconnector_.usable();
}

void RedisConnection::note_lane() noexcept {
  lane_idle_.store(lane_fd_ >= 0 && pending_.empty() && writes_in_flight_ == 0 && lane_rest_.empty(),
                   std::memory_order_relaxed);
}

bool RedisConnection::send_direct(EvalRequest& request, ReplyCallback& cb) {
  if (request.written_ != request.expected_) return false;  // the loop's way says why
  bool watch = false;
  {
    std::lock_guard lk(lane_mu_);
    // Closed, or bytes of the loop's before it: not now. Nor while requests
    // are in flight: the loop wakes for their replies anyway, and sends
    // what comes meanwhile together, one script call for many.
    if (lane_fd_ < 0 || !pending_.empty() || writes_in_flight_ != 0 || !lane_rest_.empty()) return false;
    const RespText& data = request.resp_;
    const ssize_t n = ::send(lane_fd_, data.data(), data.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) return false;  // full, or broken (the loop's read will tell): the loop's way
    const auto now = std::chrono::steady_clock::now();
    if (static_cast<std::size_t>(n) < data.size())
      lane_rest_.assign(data.data() + n, data.size() - static_cast<std::size_t>(n));
    // The loop does not poll for it (not awaited): it sleeps until the
    // reply wakes it.
    pending_.push_back(Pending{Handshake::kNone, now, queued(request, std::move(cb)), false});
    lane_idle_.store(false, std::memory_order_relaxed);
    lane_sent_ = now;
    watch = !lane_watched_ || !lane_rest_.empty();
    lane_watched_ = true;
  }
  // The request timer (and, for a part not written, the flush) is the
  // loop's: it is woken for them only when they are not under way.
  if (watch)
    (void)loop_.post([this] {
      if (closed()) return;
      request_timer_.watch();
      if (link_ != nullptr) uv_prepare_start(&flush_, &RedisConnection::on_flush);
    });
  return true;
}

void RedisConnection::drop_link(const std::string& why) {
  Stream* link = link_;
  if (link == nullptr) return;
  std::deque<Pending> pending;
  {
    std::lock_guard lk(lane_mu_);
    link_ = nullptr;
    // The lane closes: the link goes, its writes in flight with it.
    lane_fd_ = -1;
    writes_in_flight_ = 0;
    lane_rest_.clear();
    lane_watched_ = false;
    note_lane();
    pending = std::exchange(pending_, {});
    out_.clear();
    wholes_.clear();
  }
  link->close();  // cancels the connect and the writes in flight
  handshake_pending_ = 0;
  // What was sent on it fails; what those callbacks send again waits for
  // the next attempt.
  awaited_ = 0;
  const StoreError err = StoreError::unavailable(name_, why);
  for (auto& p : pending) {
    if (p.step == Handshake::kNone) guarded(kReplyCallback, [&] { p.q.cb(nullptr, &err); });
  }
}

void RedisConnection::link_failed(const std::string& why) {
  // Requests wait only while the handshake is unanswered: they were
  // waiting for this attempt, and fail with it, as refused credentials, a
  // database the server lacks, or the node unavailable.
  auto waited = std::exchange(waiting_, {});
  drop_link(why);
  constexpr const char* kNoDb = "{}: {} (the URL's /db names a database the server does not have)";
  const StoreError err = auth_refusal_    ? StoreError::auth(name_, why, auth_refusal_->code)
                         : select_failed_ ? StoreError::invalid(name_, fmt::format(kNoDb, name_, why))
                                          : StoreError::unavailable(name_, why);
  for (auto& q : waited) guarded(kReplyCallback, [&] { q.cb(nullptr, &err); });
  went_down(why);  // not once closed
}

void RedisConnection::went_down(const std::string& why) {
  if (closed()) return;
  request_timer_.stop();
  if (hooks_.on_down) guarded(kReplyCallback, [&] { hooks_.on_down(); });
  // What was sent on the dead link has failed through its callbacks; what
  // those callbacks queued since waits for the next attempt, and fails if
  // that one fails: a caller learns within back-off + connect_timeout.
  reconnector_.down(why);
}

void RedisConnection::attempt_timed_out() {
  // An attempt's link goes only with the attempt (link_failed()): none, it
  // waited for the master's address.
  if (link_ == nullptr) {
    link_failed("the master's address is not known (no sentinel answered)");
    return;
  }
  const std::string ms = std::to_string(connection_.connect_timeout.count());
  // Connected, but no TLS answer: typically a plaintext port.
  link_failed(link_->tls()
                  ? "the TLS handshake did not complete within " + ms + " ms (is TLS enabled on that port?)"
                  : "connect timed out after " + ms + " ms");
}

RequestTimer::Clock::time_point RedisConnection::unanswered_since() const {
  std::lock_guard lk(lane_mu_);
  if (pending_.empty() && lane_fd_ >= 0 && std::chrono::steady_clock::now() - lane_sent_ < connection_.command_timeout)
    return RequestTimer::kUnwritten;  // the lane is in use: a look a quarter timeout later
  if (pending_.empty() || link_ == nullptr) {
    lane_watched_ = false;  // the timer stops: the next direct request starts it
    return RequestTimer::kNone;
  }
  // Replies come in order: one still coming for an earlier request is a
  // server at work, however long the queue behind it. An unwritten one is
  // kUnwritten, later than any answer.
  return std::max(pending_.front().sent_at, answered_at_);
}

void RedisConnection::overdue() {
  // Replies may be waiting unread: timers run before the loop reads, and a
  // loop kept busy past the timeout is no server's delay. What the kernel
  // holds is read first.
  poll_replies();
  if (!request_timer_.is_overdue()) return;
  // The server (or the path to it) is not answering. Reset; everything
  // pending fails.
  link_failed("the server answered nothing for " + std::to_string(connection_.command_timeout.count()) +
              " ms (the command timeout)");
}

void RedisConnection::poll_replies() {
  if (link_ == nullptr || !link_->ready() || !up()) return;
  {
    std::lock_guard lk(lane_mu_);
    if (pending_.empty()) return;
  }
  link_->read_now();
}

void RedisConnection::set_endpoint(const Endpoint& endpoint) {
  if (endpoint.host == endpoint_.host && endpoint.port == endpoint_.port) return;
  endpoint_.host = endpoint.host;
  endpoint_.port = endpoint.port;
  name_ = endpoint_.name();
  if (closed()) return;
  if (link_ == nullptr && reconnector_.state() == Reconnector::State::kConnecting) {  // waits for it
    reconnector_.attempt_now();
    return;
  }
  if (link_ != nullptr) {
    // What waits for the handshake goes to the new master instead.
    const std::string why = "the master moved to " + name_;
    drop_link(why);
    went_down(why);
  }
  // Down (in back-off): the next attempt uses the new address; make it now.
  reconnector_.retry_now();
}

void RedisConnection::subscribe(const std::string& channel) {
  if (!subs_ || !subs_->want(channel)) return;
  if (link_ != nullptr && !closed())
    subs_->write(true, channel);
  else
    reconnector_.want_attempt();
}

void RedisConnection::unsubscribe(const std::string& channel) {
  if (!subs_ || !subs_->unwant(channel)) return;
  if (can_write()) subs_->write(false, channel);
}

void RedisConnection::close() {
  if (closed()) return;
  reconnector_.close();
  if (demand_id_ != 0) loop_.remove_demand(std::exchange(demand_id_, 0));
  // What is pending and what waits fail; nothing waits any more (a request
  // made from their callbacks fails, as the connection is closed).
  link_failed("connection closed");
  request_timer_.close();
  uv_close(reinterpret_cast<uv_handle_t*>(&flush_), nullptr);
}

}  // namespace lockwatch::detail