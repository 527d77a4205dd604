#include "store/etcd/etcd_client.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <utility>

#include "core/loop.hpp"
#include "store/etcd/etcd_error.hpp"

namespace lockwatch::detail {

namespace {

// A PEM file's text (checked readable with the options, etcd_kind.cpp);
// none named (or unreadable), an empty one.
std::string read_file(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// No answer from that member: the next calls go to another.
bool no_answer(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// etcd names its errors by their text alone (its own client's rpctypes
// table matches these exact strings): those about credentials, which
// etcd sends with codes that also mean other things.
bool credentials_refused(const grpc::Status& status) {
  static constexpr std::string_view kAuthErrors[] = {
      "etcdserver: user name is empty",
      "etcdserver: authentication failed, invalid user ID or password",
      "etcdserver: invalid auth token",
      "etcdserver: permission denied",
      "etcdserver: user name not found",
      "etcdserver: authentication is not enabled",
  };
  return std::ranges::find(kAuthErrors, status.error_message()) != std::end(kAuthErrors);
}

}  // namespace

struct EtcdClient::Member {
  std::string address;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  bool down = false;  // loop thread: as last reported
};

// A call or a stream, as the loop thread tracks it until it is answered.
struct EtcdClient::Call : std::enable_shared_from_this<EtcdClient::Call> {
  virtual ~Call() = default;
  // Loop thread: answer with `error` now (close(), which marks it
  // answered); gRPC's later answer is then dropped.
  virtual void fail(const StoreError& error) = 0;
  // Loop thread: the answer, once gRPC ended the call.
  virtual void answer() = 0;

  // gRPC's thread, the call's last callback (`end` its status): answer()
  // runs on the loop, unless close() answered first.
  void answer_on_loop(const grpc::Status& end) {
    status = end;
    EtcdClient* c = client;
    c->loop_.post([me = std::move(self)] {
      if (me->answered) return;
      me->answered = true;
      me->client->live_.erase(me);
      me->answer();
    });
    // Nothing of the call is left with gRPC (the destructor waits for
    // every one): the last use of the client here.
    std::lock_guard lock(c->in_flight_mu_);
    if (--c->in_flight_ == 0) c->in_flight_cv_.notify_all();
  }

  // Loop thread: how a stream ended, as an error (`why` when the server
  // ended it without one); a member that did not answer is passed over.
  StoreError stream_error(const char* why) {
    if (no_answer(status.error_code())) client->member_failed(member);
    // A token the cluster no longer takes (it expired, or the member that
    // issued it restarted): the next call authenticates again.
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) client->token_.clear();
    return status.ok() ? StoreError::unavailable(client->endpoint(member), why) : client->error_of(status, member);
  }

  EtcdClient* client = nullptr;
  grpc::ClientContext context;
  grpc::Status status;  // set by answer_on_loop()
  std::size_t member = 0;
  bool answered = false;       // loop thread
  std::shared_ptr<Call> self;  // kept until gRPC's last callback
};

// A unary call; `done` gets its status, or (null) the error close() failed
// it with, and reads `response` (and `request`, to make the call again).
template <class Request, class Response>
struct EtcdClient::Unary final : Call {
  Request request;
  Response response;
  std::function<void(const grpc::Status*, const StoreError* closed)> done;

  void answer() override { done(&status, nullptr); }
  void fail(const StoreError& closed) override { done(nullptr, &closed); }
};

// ---- construction

EtcdClient::EtcdClient(Loop& loop, EtcdTarget target, const StoreSettings& settings)
    : loop_(loop),
      target_(std::move(target)),
      name_(target_.name()),
      connect_timeout_(settings.connection.connect_timeout),
      command_timeout_(settings.connection.command_timeout) {
  // With TLS, the members' certificates checked against tls.ca_file (else
  // gRPC's roots); a client certificate when the members ask for one.
  const auto credentials = target_.tls ? grpc::SslCredentials({.pem_root_certs = read_file(settings.tls.ca_file),
                                                               .pem_private_key = read_file(settings.tls.key_file),
                                                               .pem_cert_chain = read_file(settings.tls.cert_file)})
                                       : grpc::InsecureChannelCredentials();
  for (const auto& m : target_.members) {
    grpc::ChannelArguments args;
    // A member killed and back is found again within a second.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // A hung member's connection is given up on (watch streams have no
    // deadline of their own); etcd refuses pings more often than 5 s.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(std::max<long long>(command_timeout_.count(), 1000)));
    if (target_.tls && !settings.tls.server_name.empty()) args.SetSslTargetNameOverride(settings.tls.server_name);
    // The stubs keep the channel.
    auto channel = grpc::CreateCustomChannel(m.address(), credentials, args);
    members_.push_back(
        std::make_unique<Member>(m.address(), etcdserverpb::KV::NewStub(channel), etcdserverpb::Lease::NewStub(channel),
                                 etcdserverpb::Watch::NewStub(channel), etcdserverpb::Auth::NewStub(channel)));
  }
}

EtcdClient::~EtcdClient() {
  // close() cancelled every call; anything left (a client never closed)
  // is cancelled here. A cancelled call ends at once; the client goes only
  // once gRPC ran every call's last callback. The bound is for a gRPC that
  // would break that promise: better a report than a hang.
  for (const auto& call : live_) call->context.TryCancel();
  live_.clear();
  std::unique_lock lock(in_flight_mu_);
  if (!in_flight_cv_.wait_for(lock, std::chrono::seconds(30), [this] { return in_flight_ == 0; }))
    std::fprintf(stderr, "lockwatch: %d etcd calls still with gRPC after 30 s\n", in_flight_);
}

// ---- errors, members

StoreError EtcdClient::error_of(const grpc::Status& status, std::size_t member, bool authenticating) const {
  using Code = grpc::StatusCode;
  const Code code = status.error_code();
  StoreError e;
  e.kind = StoreError::Kind::kRefused;
  if (code == Code::UNAVAILABLE || code == Code::DEADLINE_EXCEEDED || code == Code::CANCELLED || code == Code::ABORTED)
    e.kind = StoreError::Kind::kUnavailable;
  else if (code == Code::UNAUTHENTICATED || code == Code::PERMISSION_DENIED)
    e.kind = StoreError::Kind::kAuth;
  // Authenticate answers refused credentials so; other calls a missing user.
  else if ((code == Code::INVALID_ARGUMENT || code == Code::FAILED_PRECONDITION) &&
           (authenticating || credentials_refused(status)))
    e.kind = StoreError::Kind::kAuth;
  else if (code == Code::RESOURCE_EXHAUSTED)
    e.kind = StoreError::Kind::kRetryLater;
  e.endpoint = endpoint(member);
  e.code = etcd_code(status.error_code());
  e.message = status.error_message().empty() ? e.code.message() : status.error_message();
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
    e.message = fmt::format("no answer within the {} ms command timeout", command_timeout_.count());
  return e;
}

std::string EtcdClient::endpoint(std::size_t member) const {
  return (target_.tls ? "etcds://" : "etcd://") + members_[member]->address;
}

void EtcdClient::member_answered(std::size_t member, const grpc::Status& status) {
  const bool down = no_answer(status.error_code());
  if (std::exchange(members_[member]->down, down) == down) return;
  if (state_hook_) state_hook_(endpoint(member), !down, down ? error_of(status, member).message : std::string());
}

void EtcdClient::member_failed(std::size_t member) {
  if (member == current_ && members_.size() > 1) current_ = (current_ + 1) % members_.size();
}

void EtcdClient::track(std::shared_ptr<Call> call, std::chrono::milliseconds timeout) {
  {
    std::lock_guard lock(in_flight_mu_);
    ++in_flight_;
  }
  if (timeout.count() > 0) call->context.set_deadline(std::chrono::system_clock::now() + timeout);
  if (!token_.empty()) call->context.AddMetadata("token", token_);
  call->client = this;
  call->member = current_;
  call->self = call;
  live_.insert(std::move(call));
}

// ---- authentication

void EtcdClient::with_token(std::function<void(const StoreError*)> start) {
  if (closed_) {
    auto closed = StoreError::unavailable(name_, "the store is closed");
    loop_.post([start = std::move(start), closed] { start(&closed); });
    return;
  }
  if (target_.user.empty() || !token_.empty()) return start(nullptr);
  waiting_for_token_.push_back(std::move(start));
  if (!authenticating_) authenticate();
}

void EtcdClient::authenticate() {
  authenticating_ = true;
  auto call = std::make_shared<Unary<etcdserverpb::AuthenticateRequest, etcdserverpb::AuthenticateResponse>>();
  track(call, connect_timeout_);
  const std::size_t member = call->member;
  call->request.set_name(target_.user);
  call->request.set_password(target_.password);
  call->done = [this, member, u = call.get()](const grpc::Status* status, const StoreError* closed) {
    authenticating_ = false;
    std::optional<StoreError> error;
    if (!status) {
      error = *closed;
    } else if (!status->ok()) {
      if (no_answer(status->error_code())) member_failed(member);
      error = error_of(*status, member, /*authenticating=*/true);
    } else if (u->response.token().empty()) {
      error = StoreError::auth(endpoint(member),
                               "authentication is not enabled on the cluster, yet the URL names a user");
    } else {
      token_ = u->response.token();
    }
    for (auto& start : std::exchange(waiting_for_token_, {})) start(error ? &*error : nullptr);
  };
  members_[member]->auth->async()->Authenticate(&call->context, &call->request, &call->response,
                                                [u = call.get()](grpc::Status end) { u->answer_on_loop(end); });
}

// ---- unary calls

template <class Request, class Response, class Rpc>
void EtcdClient::unary(Request request, Done<Response> done, Rpc rpc, int attempt,
                       std::chrono::steady_clock::time_point deadline, bool reauthenticated) {
  if (attempt == 1) deadline = std::chrono::steady_clock::now() + command_timeout_;
  with_token([this, request = std::move(request), done = std::move(done), rpc, attempt, deadline,
              reauthenticated](const StoreError* auth_error) mutable {
    if (auth_error) return done(Response{}, auth_error);
    auto call = std::make_shared<Unary<Request, Response>>();
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    track(call, std::max(left, std::chrono::milliseconds(1)));
    const std::size_t member = call->member;
    call->request = std::move(request);
    call->done = [this, u = call.get(), member, attempt, done = std::move(done), rpc, deadline,
                  reauthenticated](const grpc::Status* status, const StoreError* closed) mutable {
      if (!status) return done(Response{}, closed);
      member_answered(member, *status);
      if (status->ok()) return done(u->response, nullptr);
      if (no_answer(status->error_code())) member_failed(member);
      // Unavailable (a member down, without a leader, or refusing the
      // connection): the next member, within the same deadline. Every
      // call the store makes may be made twice (a repeated acquisition
      // finds its own token).
      const bool next_member = status->error_code() == grpc::StatusCode::UNAVAILABLE &&
                               attempt < static_cast<int>(members_.size()) &&
                               std::chrono::steady_clock::now() < deadline;
      // A token the cluster no longer takes (it expired): once more with a
      // new one.
      const bool reauthenticate =
          status->error_code() == grpc::StatusCode::UNAUTHENTICATED && !target_.user.empty() && !reauthenticated;
      if ((next_member || reauthenticate) && !closed_) {
        if (reauthenticate) token_.clear();
        return unary(std::move(u->request), std::move(done), rpc, attempt + 1, deadline,
                     reauthenticated || reauthenticate);
      }
      StoreError error = error_of(*status, member);
      done(Response{}, &error);
    };
    rpc(*members_[member], &call->context, &call->request, &call->response,
        [u = call.get()](grpc::Status end) { u->answer_on_loop(end); });
  });
}

// Each unary call: its stub's callback method, through unary().
void EtcdClient::range(std::string key, std::string end, std::int64_t limit, Done<etcdserverpb::RangeResponse> done) {
  etcdserverpb::RangeRequest request;
  request.set_key(std::move(key));
  request.set_range_end(std::move(end));
  request.set_limit(limit);
  unary(std::move(request), std::move(done), [](Member& m, auto&&... a) { m.kv->async()->Range(a...); });
}
void EtcdClient::txn(etcdserverpb::TxnRequest request, Done<etcdserverpb::TxnResponse> done) {
  unary(std::move(request), std::move(done), [](Member& m, auto&&... a) { m.kv->async()->Txn(a...); });
}
void EtcdClient::lease_grant(std::int64_t ttl, Done<etcdserverpb::LeaseGrantResponse> done) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(ttl);
  unary(std::move(request), std::move(done), [](Member& m, auto&&... a) { m.lease->async()->LeaseGrant(a...); });
}
void EtcdClient::lease_revoke(std::int64_t id, Done<etcdserverpb::LeaseRevokeResponse> done) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(id);
  unary(std::move(request), std::move(done), [](Member& m, auto&&... a) { m.lease->async()->LeaseRevoke(a...); });
}
void EtcdClient::lease_time_to_live(std::int64_t id, Done<etcdserverpb::LeaseTimeToLiveResponse> done) {
  etcdserverpb::LeaseTimeToLiveRequest request;
  request.set_id(id);
  unary(std::move(request), std::move(done),
        [](Member& m, auto&&... a) { m.lease->async()->LeaseTimeToLive(a...); });
}

// ---- streams

// One batch of keep-alives on a stream of its own: every id written, an
// answer read for each, then the stream closed. Its reactions run on
// gRPC's threads (a write's and a read's may overlap: they share nothing
// but `ids`); the result goes to the loop.
struct EtcdClient::KeepAlive final
    : Call, grpc::ClientBidiReactor<etcdserverpb::LeaseKeepAliveRequest, etcdserverpb::LeaseKeepAliveResponse> {
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> ttls;  // -1: no answer (yet)
  KeepAliveDone done;
  etcdserverpb::LeaseKeepAliveRequest request;
  etcdserverpb::LeaseKeepAliveResponse response;
  std::size_t written = 0;  // OnWriteDone's
  std::size_t read = 0;     // OnReadDone's

  void begin() {
    write_next();
    StartRead(&response);
    StartCall();
  }
  void write_next() {
    if (written == ids.size()) return StartWritesDone();
    request.set_id(ids[written]);
    StartWrite(&request);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return;  // the stream broke: OnDone follows
    ++written;
    write_next();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    // Answers come in order; matched by id all the same.
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == response.id() && ttls[i] == -1) {
        ttls[i] = response.ttl();
        break;
      }
    }
    if (++read < ids.size()) StartRead(&response);
  }
  void OnDone(const grpc::Status& end) override { answer_on_loop(end); }
  void answer() override {
    bool all = read >= ids.size();
    if (!all || status.ok()) client->member_answered(member, status);
    if (all) return done(ttls, nullptr);
    StoreError error = stream_error("the keep-alive stream ended without every answer");
    done(ttls, &error);
  }
  void fail(const StoreError& error) override { done(std::vector<std::int64_t>(ids.size(), -1), &error); }
};

void EtcdClient::keep_alive(std::vector<std::int64_t> ids, KeepAliveDone done) {
  auto call = std::make_shared<KeepAlive>();
  call->ttls.assign(ids.size(), -1);
  call->ids = std::move(ids);
  call->done = std::move(done);
  with_token([this, call](const StoreError* auth_error) {
    if (auth_error) return call->fail(*auth_error);
    track(call, command_timeout_);
    members_[call->member]->lease->async()->LeaseKeepAlive(&call->context, call.get());
    call->begin();
  });
}

// A watch on one key for its deletion. Reactions on gRPC's threads; what
// it reports goes to the loop.
class EtcdClient::Watch final
    : public Call, public grpc::ClientBidiReactor<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse> {
 public:
  WatchHook hook;
  bool cancelled = false;  // loop thread
  etcdserverpb::WatchRequest request;
  etcdserverpb::WatchResponse response;

  void begin() {
    StartWrite(&request);
    StartRead(&response);
    StartCall();
  }
  void report(WatchEvent event) {
    client->loop_.post([me = std::static_pointer_cast<Watch>(shared_from_this()), event] {
      if (!me->cancelled && !me->answered) me->hook(me.get(), event, nullptr);
    });
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone follows
    if (response.created()) report(WatchEvent::kCreated);
    if (std::ranges::any_of(response.events(), [](const auto& e) { return e.type() == mvccpb::Event::DELETE; }))
      report(WatchEvent::kDeleted);
    if (response.canceled())
      context.TryCancel();
    else
      StartRead(&response);
  }
  void OnDone(const grpc::Status& end) override { answer_on_loop(end); }
  void answer() override {
    if (cancelled) return;
    StoreError error = stream_error("the watch was cancelled by the server");
    hook(this, WatchEvent::kEnded, &error);
  }
  void fail(const StoreError&) override { cancelled = true; }
};

std::shared_ptr<EtcdClient::Watch> EtcdClient::watch(std::string key, WatchHook hook) {
  auto call = std::make_shared<Watch>();
  auto* create = call->request.mutable_create_request();
  create->set_key(std::move(key));
  create->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  call->hook = std::move(hook);
  with_token([this, weak = std::weak_ptr<Watch>(call)](const StoreError* auth_error) {
    auto call = weak.lock();
    if (!call || call->cancelled) return;
    if (auth_error) {
      call->answered = true;
      call->hook(call.get(), WatchEvent::kEnded, auth_error);
      return;
    }
    track(call, {});
    members_[call->member]->watch->async()->Watch(&call->context, call.get());
    call->begin();
  });
  return call;
}

void EtcdClient::cancel(const std::shared_ptr<Watch>& watch) {
  watch->cancelled = true;
  watch->context.TryCancel();
}

// ---- closing

void EtcdClient::close() {
  if (closed_) return;
  closed_ = true;
  const auto closed = StoreError::unavailable(name_, "the store is closed");
  for (const auto& call : std::exchange(live_, {})) {
    call->context.TryCancel();
    if (!std::exchange(call->answered, true)) call->fail(closed);
  }
  for (auto& start : std::exchange(waiting_for_token_, {})) start(&closed);
}

}  // namespace lockwatch::detail
