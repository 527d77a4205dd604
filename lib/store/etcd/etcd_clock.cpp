#include "store/etcd/etcd_clock.hpp"

#include <strings.h>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <ctime>
#include <utility>

#include "core/loop.hpp"
#include "core/tls.hpp"

namespace lockwatch::detail {

using std::chrono::duration_cast;
using std::chrono::milliseconds;
using std::chrono::steady_clock;
using std::chrono::system_clock;

namespace {

// "Wed, 25 Nov 2026 09:35:30 GMT" (RFC 7231's IMF-fixdate, the only form
// Go writes) as seconds since the epoch; nothing if it is not one.
std::optional<std::int64_t> parse_http_date(std::string_view s) {
  std::tm tm{};
  if (::strptime(std::string(s).c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm) == nullptr || tm.tm_year < 70)
    return std::nullopt;
  return static_cast<std::int64_t>(::timegm(&tm));
}

// The value of header `name` (case-insensitive) in `head`, trimmed.
std::optional<std::string_view> header(std::string_view head, std::string_view name) {
  for (std::size_t at = head.find("\r\n"); at != std::string_view::npos && at + 2 < head.size();) {
    const std::size_t start = at + 2;
    at = std::min(head.find("\r\n", start), head.size());
    std::string_view line = head.substr(start, at - start);
    auto colon = line.find(':');
    if (colon == name.size() && ::strncasecmp(line.data(), name.data(), name.size()) == 0) {
      const auto first = std::min(line.find_first_not_of(" \t", colon + 1), line.size());
      return line.substr(first, line.find_last_not_of(" \t") + 1 - first);
    }
  }
  return std::nullopt;
}

enum class Answer { kMore, kOk, kBad };

// Gives up an answer with `text` as the reason.
Answer bad(std::string& why, std::string text) {
  why = std::move(text);
  return Answer::kBad;
}

// etcd's answer to GET /version at the front of `in` (consumed once whole):
// the Date's second, and whether the connection may be used again. kBad
// with `why` for anything but etcd's answer.
Answer version_answer(std::string& in, std::int64_t& second, bool& keep, std::string& why) {
  const std::size_t end = in.find("\r\n\r\n");
  if (end == std::string::npos) return in.size() > 64 * 1024 ? bad(why, "an answer that is not HTTP") : Answer::kMore;
  const std::string_view head(in.data(), end);
  if (!head.starts_with("HTTP/1.") || head.size() < 12) return bad(why, "an answer that is not HTTP");
  if (head.substr(9, 3) != "200")
    return bad(why, "GET /version answered " + std::string(head.substr(9, head.find("\r\n") - 9)));
  auto date = header(head, "Date");
  auto parsed = date ? parse_http_date(*date) : std::nullopt;
  if (!parsed) return bad(why, "GET /version answered without a Date header");
  std::size_t length = 0;
  auto cl = header(head, "Content-Length");
  if (!cl || std::from_chars(cl->data(), cl->data() + cl->size(), length).ec != std::errc() || length > 64 * 1024)
    return bad(why, "GET /version answered without a usable Content-Length");
  if (in.size() < end + 4 + length) return Answer::kMore;
  if (std::string_view(in).substr(end + 4, length).find("\"etcdserver\"") == std::string_view::npos)
    return bad(why, "GET /version answered, but not as etcd does");
  auto connection = header(head, "Connection");
  keep = !(connection && (*connection == "close" || *connection == "Close"));
  second = *parsed;
  in.erase(0, end + 4 + length);
  return Answer::kOk;
}

}  // namespace

EtcdClock::EtcdClock(Loop& loop, EtcdTarget target, const StoreSettings& settings, LocalClock local)
    : loop_(loop),
      target_(std::move(target)),
      connect_timeout_(settings.connection.connect_timeout),
      command_timeout_(settings.connection.command_timeout),
      local_(local ? std::move(local) : LocalClock([] { return system_clock::now(); })) {
  if (target_.tls) {
    try {
      tls_ = TlsContext::make(settings.tls);
    } catch (const std::exception& e) {
      tls_error_ = e.what();
    }
  }
}

std::optional<system_clock::time_point> EtcdClock::estimate() const {
  if (!have_ || steady_clock::now() - measured_at_ > kMaxAge) return std::nullopt;
  return local_() + offset_;
}

void EtcdClock::now(Done done) {
  const auto age = steady_clock::now() - measured_at_;
  if (*closed_ || (have_ && age <= kMaxAge)) {
    if (!*closed_ && age > kRefresh) want_measure();
    // On the loop's next turn: the clock, or that the store is closed.
    loop_.post([closed = closed_, t = local_() + offset_, name = target_.name(), done = std::move(done)] {
      if (!*closed) return done(t, nullptr);
      const auto e = StoreError::unavailable(name, "the store is closed");
      done({}, &e);
    });
    return;
  }
  waiting_.push_back(std::move(done));
  want_measure();
}

void EtcdClock::warm() {
  if (!have_ && !*closed_) want_measure();
}

void EtcdClock::want_measure() {
  if (step_ != Step::kIdle) return;  // measuring already
  if (!timer_made_) {
    uv_timer_init(loop_.uv(), &timer_);
    timer_.data = this;
    timer_made_ = true;
  }
  member_ = 0;
  whys_.clear();
  have_prev_ = false;
  step_ = Step::kGap;
  arm(milliseconds(0));  // the loop's next turn: never inside now()
}

void EtcdClock::close() {
  *closed_ = true;
  drop_stream();
  step_ = Step::kIdle;
  if (timer_made_ && !uv_is_closing(reinterpret_cast<uv_handle_t*>(&timer_)))
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
  const auto e = StoreError::unavailable(target_.name(), "the store is closed");
  for (auto& done : std::exchange(waiting_, {})) done({}, &e);
}

void EtcdClock::arm(milliseconds after) {
  uv_timer_start(
      &timer_, [](uv_timer_t* t) { static_cast<EtcdClock*>(t->data)->on_timer(); },
      static_cast<std::uint64_t>(std::max(after, milliseconds(0)).count()), 0);
}

void EtcdClock::on_timer() {
  switch (std::exchange(step_, Step::kIdle)) {
    case Step::kGap:
      return sample();
    case Step::kConnecting:
    case Step::kAwaiting:
      return stream_failed("no answer in time");
    case Step::kIdle:
      return;
  }
}

void EtcdClock::sample() {
  if (stream_ != nullptr) return stream_ready();
  if (target_.tls && !tls_) {
    const auto e = StoreError::invalid(target_.name(), "cannot read the members' clock over TLS: " + tls_error_);
    return finish(&e);
  }
  in_.clear();
  step_ = Step::kConnecting;
  arm(connect_timeout_);
  stream_ = Stream::make(loop_.uv(), *this, "etcds://");
  const auto& m = target_.members[member_];
  stream_->connect(m.host, m.port, tls_.get());
}

void EtcdClock::stream_ready() {
  step_ = Step::kAwaiting;
  arm(command_timeout_);
  const std::string request = "GET /version HTTP/1.1\r\nHost: " + target_.members[member_].address() +
                              "\r\nUser-Agent: lockwatch\r\nAccept: application/json\r\n\r\n";
  now_.sent = local_();
  // The next sample a gap after this one's start, or at once after a slow answer.
  next_at_ = steady_clock::now() + kSampleGap;
  stream_->write(request);
}

void EtcdClock::stream_data(const char* data, std::size_t n) {
  in_.append(data, n);
  if (step_ != Step::kAwaiting) return;  // read with the next answer
  std::int64_t second = 0;
  bool keep = true;
  std::string why;
  switch (version_answer(in_, second, keep, why)) {
    case Answer::kMore:
      return;
    case Answer::kBad:
      return stream_failed(why);
    case Answer::kOk:
      return answered(second, keep);
  }
}

void EtcdClock::answered(std::int64_t second, bool keep) {
  now_.answered = local_();
  now_.second = second;
  step_ = Step::kIdle;
  if (!keep) drop_stream();
  if (!have_prev_) {
    // Until the second changes, within the span from here.
    have_prev_ = true;
    until_ = steady_clock::now() + kSampleSpan;
  } else if (second == prev_.second + 1) {
    // The change lies between the sending of the last request that saw
    // the old second and the answer of the first that saw the new one.
    const auto span = now_.answered - prev_.sent;
    const auto change = prev_.sent + span / 2;
    const system_clock::time_point start{std::chrono::seconds(second)};
    return finish(nullptr, duration_cast<milliseconds>(start - change),
                  duration_cast<milliseconds>(span / 2) + milliseconds(1));
  }
  prev_ = now_;  // the same second, or a jump (a slow answer, a clock stepped): from here
  if (steady_clock::now() >= until_)
    return stream_failed(fmt::format("the Date it answers did not change within {} ms", kSampleSpan.count()));
  step_ = Step::kGap;
  arm(duration_cast<milliseconds>(next_at_ - steady_clock::now()));
}

void EtcdClock::stream_failed(const std::string& why) {
  drop_stream();
  const auto& m = target_.members[member_];
  const std::string endpoint = (target_.tls ? "https://" : "http://") + m.address();
  whys_ += (whys_.empty() ? "" : "; ") + endpoint + ": " + why;
  if (++member_ == target_.members.size()) {
    const auto e = StoreError::unavailable(target_.name(), "no member's clock could be read: " + whys_);
    return finish(&e);
  }
  have_prev_ = false;
  step_ = Step::kGap;
  arm(milliseconds(0));
}

void EtcdClock::finish(const StoreError* error, milliseconds offset, milliseconds uncertainty) {
  drop_stream();
  step_ = Step::kIdle;
  uv_timer_stop(&timer_);
  if (error == nullptr) {
    have_ = true;
    offset_ = offset;
    uncertainty_ = uncertainty;
    measured_at_ = steady_clock::now();
  }
  // A background refresh that failed keeps the offset until kMaxAge.
  for (auto& done : std::exchange(waiting_, {})) error == nullptr ? done(local_() + offset_, nullptr) : done({}, error);
}

void EtcdClock::drop_stream() {
  if (stream_ != nullptr) std::exchange(stream_, nullptr)->close();
}

}  // namespace lockwatch::detail
