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

// Something the completion queue reports on: a unary call's answer or one
// step of a stream. completed() runs on the queue's thread.
struct Tag {
  virtual void completed(bool ok) = 0;

 protected:
  ~Tag() = default;
};

// One step of a stream, reported to its owner on the queue's thread.
template <class Owner>
struct Step final : Tag {
  Owner* owner = nullptr;
  int kind = 0;
  void completed(bool ok) override { owner->step(kind, ok); }
};

enum StepKind { kStart, kWrite, kRead, kWritesDone, kFinish };

// A PEM file's text (checked readable by EtcdStore::check_options).
std::string read_file(const std::string& path) {
  if (path.empty()) return {};
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
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth;
};

// A call or a stream, as the loop thread tracks it until it is answered.
struct EtcdClient::Call : std::enable_shared_from_this<EtcdClient::Call> {
  virtual ~Call() = default;
  // Loop thread: answer with `error` now (close(), which marks it
  // answered); the queue's later answer is then dropped.
  virtual void fail(const StoreError& error) = 0;
  // Loop thread: the answer, once the queue's last step came back.
  virtual void answer() = 0;

  // Queue thread, the call's last step: answer() runs on the loop, unless
  // close() answered first.
  void answer_on_loop() {
    auto me = std::move(self);
    EtcdClient* c = client;
    c->loop_.post([me] {
      if (me->answered) return;
      me->answered = true;
      me->client->live_.erase(me);
      me->answer();
    });
    me.reset();
    // Nothing of the call is left in the queue (the destructor waits for
    // every one before shutting it): the last use of the client here.
    std::lock_guard lock(c->in_queue_mu_);
    if (--c->in_queue_ == 0) c->in_queue_cv_.notify_all();
  }

  // Loop thread: how a stream ended, as an error (`why` when the server
  // ended it without one); a member that did not answer is passed over.
  StoreError stream_error(const grpc::Status& status, const char* why) {
    if (no_answer(status.error_code())) client->member_failed(member);
    // A token the cluster no longer takes (it expired, or the member that
    // issued it restarted): the next call authenticates again.
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) client->token_.clear();
    return status.ok() ? StoreError::unavailable(client->endpoint(member), why) : client->error_of(status, member);
  }

  EtcdClient* client = nullptr;
  grpc::ClientContext context;
  std::size_t member = 0;
  bool answered = false;       // loop thread
  std::shared_ptr<Call> self;  // kept until the queue's last answer
};

template <class Request, class Response>
struct EtcdClient::Unary final : Call, Tag {
  Response response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader;
  std::function<void(const Response&, const grpc::Status*)> done;

  void completed(bool) override { answer_on_loop(); }
  void answer() override { done(response, &status); }
  void fail(const StoreError&) override { done(Response{}, nullptr); }
};

// ---- construction

EtcdClient::EtcdClient(Loop& loop, EtcdTarget target, const StoreSettings& settings)
    : loop_(loop),
      target_(std::move(target)),
      name_(target_.name()),
      connect_timeout_(settings.connection.connect_timeout),
      command_timeout_(settings.connection.command_timeout) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (target_.tls) {
    // The members' certificates checked against tls.ca_file (else gRPC's
    // roots); a client certificate when the members ask for one.
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = read_file(settings.tls.ca_file);
    ssl.pem_cert_chain = read_file(settings.tls.cert_file);
    ssl.pem_private_key = read_file(settings.tls.key_file);
    credentials = grpc::SslCredentials(ssl);
  }
  for (const auto& m : target_.members) {
    auto member = std::make_unique<Member>();
    member->address = m.address();
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
    member->channel = grpc::CreateCustomChannel(member->address, credentials, args);
    member->kv = etcdserverpb::KV::NewStub(member->channel);
    member->lease = etcdserverpb::Lease::NewStub(member->channel);
    member->watch = etcdserverpb::Watch::NewStub(member->channel);
    member->auth = etcdserverpb::Auth::NewStub(member->channel);
    members_.push_back(std::move(member));
  }
  member_down_.assign(members_.size(), false);
  queue_thread_ = std::thread([this] { run_queue(); });
}

EtcdClient::~EtcdClient() {
  // close() cancelled every call; anything left (a client never closed)
  // is cancelled here. A cancelled call's steps come back at once, and a
  // stream may start its last one (Finish) from there: the queue is shut
  // only once every call is back for good. The bound is for a gRPC that
  // would break that promise: better a report than a hang.
  for (const auto& call : live_) call->context.TryCancel();
  live_.clear();
  {
    std::unique_lock lock(in_queue_mu_);
    if (!in_queue_cv_.wait_for(lock, std::chrono::seconds(30), [this] { return in_queue_ == 0; }))
      std::fprintf(stderr, "lockwatch: %d etcd calls still in gRPC's queue after 30 s\n", in_queue_);
  }
  queue_.Shutdown();
  queue_thread_.join();
}

void EtcdClient::run_queue() {
  void* tag = nullptr;
  bool ok = false;
  while (queue_.Next(&tag, &ok)) static_cast<Tag*>(tag)->completed(ok);
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
  if (member_down_[member] == down) return;
  member_down_[member] = down;
  if (state_hook_) state_hook_(endpoint(member), !down, down ? error_of(status, member).message : std::string());
}

void EtcdClient::member_failed(std::size_t member) {
  if (member == current_ && members_.size() > 1) current_ = (current_ + 1) % members_.size();
}

void EtcdClient::prepare(grpc::ClientContext& context, std::chrono::milliseconds timeout) const {
  if (timeout.count() > 0) context.set_deadline(std::chrono::system_clock::now() + timeout);
  if (!token_.empty()) context.AddMetadata("token", token_);
}

void EtcdClient::track(std::shared_ptr<Call> call) {
  {
    std::lock_guard lock(in_queue_mu_);
    ++in_queue_;
  }
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
  using U = Unary<etcdserverpb::AuthenticateRequest, etcdserverpb::AuthenticateResponse>;
  auto call = std::make_shared<U>();
  track(call);
  const std::size_t member = call->member;
  prepare(call->context, connect_timeout_);
  etcdserverpb::AuthenticateRequest request;
  request.set_name(target_.user);
  request.set_password(target_.password);
  call->done = [this, member](const etcdserverpb::AuthenticateResponse& response, const grpc::Status* status) {
    authenticating_ = false;
    auto waiting = std::exchange(waiting_for_token_, {});
    std::optional<StoreError> error;
    if (!status) {
      error = StoreError::unavailable(name_, "the store is closed");
    } else if (!status->ok()) {
      if (no_answer(status->error_code())) member_failed(member);
      error = error_of(*status, member, /*authenticating=*/true);
    } else if (response.token().empty()) {
      error = StoreError::auth(endpoint(member),
                               "authentication is not enabled on the cluster, yet the URL names a user");
    } else {
      token_ = response.token();
    }
    for (auto& start : waiting) start(error ? &*error : nullptr);
  };
  Member& m = *members_[member];
  call->reader = m.auth->PrepareAsyncAuthenticate(&call->context, request, &queue_);
  call->reader->StartCall();
  call->reader->Finish(&call->response, &call->status, static_cast<Tag*>(call.get()));
}

// ---- unary calls

template <class Request, class Response, class Prepare>
void EtcdClient::unary(Request request, Done<Response> done, Prepare prepare_call, int attempt,
                       std::chrono::steady_clock::time_point deadline, bool reauthenticated) {
  if (attempt == 1) deadline = std::chrono::steady_clock::now() + command_timeout_;
  with_token([this, request = std::move(request), done = std::move(done), prepare_call, attempt, deadline,
              reauthenticated](const StoreError* auth_error) mutable {
    if (auth_error) return done(Response{}, auth_error);
    auto call = std::make_shared<Unary<Request, Response>>();
    track(call);
    const std::size_t member = call->member;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    prepare(call->context, std::max(left, std::chrono::milliseconds(1)));
    call->reader = prepare_call(*members_[member], &call->context, request, &queue_);
    call->done = [this, member, attempt, request = std::move(request), done = std::move(done), prepare_call, deadline,
                  reauthenticated](const Response& response, const grpc::Status* status) mutable {
      if (!status) {
        auto closed = StoreError::unavailable(name_, "the store is closed");
        return done(Response{}, &closed);
      }
      member_answered(member, *status);
      if (status->ok()) return done(response, nullptr);
      if (no_answer(status->error_code())) member_failed(member);
      // Unavailable (a member down, without a leader, or refusing the
      // connection): the next member, within the same deadline. Every
      // call the store makes may be made twice (a repeated acquisition
      // finds its own token).
      if (status->error_code() == grpc::StatusCode::UNAVAILABLE && attempt < static_cast<int>(members_.size()) &&
          std::chrono::steady_clock::now() < deadline && !closed_) {
        return unary(std::move(request), std::move(done), prepare_call, attempt + 1, deadline, reauthenticated);
      }
      // A token the cluster no longer takes (it expired): once more with a
      // new one.
      if (status->error_code() == grpc::StatusCode::UNAUTHENTICATED && !target_.user.empty() && !reauthenticated &&
          !closed_) {
        token_.clear();
        return unary(std::move(request), std::move(done), prepare_call, attempt + 1, deadline,
                     /*reauthenticated=*/true);
      }
      StoreError error = error_of(*status, member);
      done(Response{}, &error);
    };
    call->reader->StartCall();
    call->reader->Finish(&call->response, &call->status, static_cast<Tag*>(call.get()));
  });
}

// Each unary call: its stub's PrepareAsync<Rpc>, through unary().
void EtcdClient::range(etcdserverpb::RangeRequest request,
                       Done<etcdserverpb::RangeResponse> done) {
  unary(std::move(request), std::move(done),
        [](Member& m, auto&&... a) { return m.kv->PrepareAsyncRange(a...); });
}
void EtcdClient::txn(etcdserverpb::TxnRequest request,
                     Done<etcdserverpb::TxnResponse> done) {
  unary(std::move(request), std::move(done),
        [](Member& m, auto&&... a) { return m.kv->PrepareAsyncTxn(a...); });
}
void EtcdClient::lease_grant(etcdserverpb::LeaseGrantRequest request,
                             Done<etcdserverpb::LeaseGrantResponse> done) {
  unary(std::move(request), std::move(done),
        [](Member& m, auto&&... a) { return m.lease->PrepareAsyncLeaseGrant(a...); });
}
void EtcdClient::lease_revoke(etcdserverpb::LeaseRevokeRequest request,
                              Done<etcdserverpb::LeaseRevokeResponse> done) {
  unary(std::move(request), std::move(done),
        [](Member& m, auto&&... a) { return m.lease->PrepareAsyncLeaseRevoke(a...); });
}
void EtcdClient::lease_time_to_live(etcdserverpb::LeaseTimeToLiveRequest request,
                                    Done<etcdserverpb::LeaseTimeToLiveResponse> done) {
  unary(std::move(request), std::move(done),
        [](Member& m, auto&&... a) { return m.lease->PrepareAsyncLeaseTimeToLive(a...); });
}

// ---- streams

// What both streams share: their steps, each counted while it is in the
// queue (next() hands its tag out), and their end: Finish once no step
// is left, then the answer on the loop. Queue thread only, from
// StartCall on.
template <class Owner, class Request, class Response>
struct EtcdClient::Stream : Call {
  std::unique_ptr<grpc::ClientAsyncReaderWriter<Request, Response>> stream;
  grpc::Status status;
  Request request;
  Response response;
  int outstanding = 0;
  bool finishing = false;
  Step<Owner> steps[5];

  Tag* next(int kind) {
    ++outstanding;
    return &steps[kind];
  }
  void begin() {
    for (int k = 0; k < 5; ++k) {
      steps[k].owner = static_cast<Owner*>(this);
      steps[k].kind = k;
    }
    stream->StartCall(next(kStart));
  }
  void end() {
    if (!finishing) {
      finishing = true;
      return stream->Finish(&status, next(kFinish));
    }
    answer_on_loop();
  }
};

// One batch of keep-alives on a stream of its own: every id written, an
// answer read for each, then the stream closed. Its steps run on the
// queue's thread only; the result goes to the loop.
struct EtcdClient::KeepAlive final
    : Stream<KeepAlive, etcdserverpb::LeaseKeepAliveRequest, etcdserverpb::LeaseKeepAliveResponse> {
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> ttls;  // -1: no answer (yet)
  KeepAliveDone done;
  // Queue thread only, from StartCall on.
  std::size_t written = 0, read = 0;
  bool writing = true, reading = true;

  void write_next() {
    if (written < ids.size()) {
      request.set_id(ids[written]);
      stream->Write(request, next(kWrite));
    } else {
      writing = false;
      stream->WritesDone(next(kWritesDone));
    }
  }
  void read_next() { stream->Read(&response, next(kRead)); }
  void step(int kind, bool ok) {
    --outstanding;
    if (!ok) {  // a failed start ends both sides
      if (kind == kStart || kind == kWrite) writing = false;
      if (kind == kStart || kind == kRead) reading = false;
    } else if (kind == kStart) {
      write_next();
      read_next();
    } else if (kind == kWrite) {
      ++written;
      write_next();
    } else if (kind == kRead) {
      // Answers come in order; matched by id all the same.
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == response.id() && ttls[i] == -1) {
          ttls[i] = response.ttl();
          break;
        }
      }
      if (++read >= ids.size())
        reading = false;
      else
        read_next();
    }
    if (outstanding > 0 || (!finishing && reading)) return;
    if (!finishing && writing) {
      writing = false;
      return stream->WritesDone(next(kWritesDone));
    }
    end();
  }
  void answer() override {
    bool all = read >= ids.size();
    if (!all || status.ok()) client->member_answered(member, status);
    if (all) return done(ttls, nullptr);
    StoreError error = stream_error(status, "the keep-alive stream ended without every answer");
    done(ttls, &error);
  }
  void fail(const StoreError& error) override { done(std::vector<std::int64_t>(ids.size(), -1), &error); }
};

void EtcdClient::keep_alive(std::vector<std::int64_t> ids, KeepAliveDone done) {
  with_token([this, ids = std::move(ids), done = std::move(done)](const StoreError* auth_error) mutable {
    if (auth_error) return done(std::vector<std::int64_t>(ids.size(), -1), auth_error);
    auto call = std::make_shared<KeepAlive>();
    track(call);
    prepare(call->context, command_timeout_);
    call->ttls.assign(ids.size(), -1);
    call->ids = std::move(ids);
    call->done = std::move(done);
    call->stream = members_[call->member]->lease->PrepareAsyncLeaseKeepAlive(&call->context, &queue_);
    call->begin();
  });
}

// A watch on one key for its deletion. Steps on the queue's thread; what
// it reports goes to the loop.
class EtcdClient::Watch final : public Stream<Watch, etcdserverpb::WatchRequest, etcdserverpb::WatchResponse> {
 public:
  WatchHooks hooks;
  bool cancelled = false;  // loop thread
  bool reading = true;     // queue thread only

  void report(std::function<void()> WatchHooks::*hook) {
    auto me = std::static_pointer_cast<Watch>(shared_from_this());
    client->loop_.post([me, hook] {
      if (!me->cancelled && !me->answered && me->hooks.*hook) (me->hooks.*hook)();
    });
  }
  void step(int kind, bool ok) {
    --outstanding;
    if (!ok) {
      if (kind == kStart || kind == kRead) reading = false;
    } else if (kind == kStart) {
      stream->Write(request, next(kWrite));
      stream->Read(&response, next(kRead));
    } else if (kind == kRead) {
      if (response.created()) report(&WatchHooks::created);
      if (std::ranges::any_of(response.events(), [](const auto& e) { return e.type() == mvccpb::Event::DELETE; }))
        report(&WatchHooks::deleted);
      if (response.canceled()) {
        reading = false;
        context.TryCancel();
      } else {
        stream->Read(&response, next(kRead));
      }
    }
    if (outstanding > 0 || reading) return;
    end();
  }
  void answer() override {
    if (cancelled) return;
    StoreError error = stream_error(status, "the watch was cancelled by the server");
    if (hooks.ended) hooks.ended(error);
  }
  void fail(const StoreError&) override { cancelled = true; }
};

std::shared_ptr<EtcdClient::Watch> EtcdClient::watch(std::string key, WatchHooks hooks) {
  auto call = std::make_shared<Watch>();
  auto* create = call->request.mutable_create_request();
  create->set_key(std::move(key));
  create->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  call->hooks = std::move(hooks);
  std::weak_ptr<Watch> weak = call;
  with_token([this, weak](const StoreError* auth_error) {
    auto call = weak.lock();
    if (!call || call->cancelled) return;
    if (auth_error) {
      call->answered = true;
      if (call->hooks.ended) call->hooks.ended(*auth_error);
      return;
    }
    track(call);
    prepare(call->context, {});
    call->stream = members_[call->member]->watch->PrepareAsyncWatch(&call->context, &queue_);
    call->begin();
  });
  return call;
}

void EtcdClient::cancel(const std::shared_ptr<Watch>& watch) {
  if (!watch) return;
  watch->cancelled = true;
  watch->context.TryCancel();
}

// ---- closing

void EtcdClient::close() {
  if (closed_) return;
  closed_ = true;
  auto live = std::exchange(live_, {});
  const auto closed = StoreError::unavailable(name_, "the store is closed");
  for (const auto& call : live) {
    call->context.TryCancel();
    if (!std::exchange(call->answered, true)) call->fail(closed);
  }
  for (auto& start : std::exchange(waiting_for_token_, {})) start(&closed);
}

}  // namespace lockwatch::detail
