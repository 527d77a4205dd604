#include "jobs/cron.hpp"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "core/whole_number.hpp"
#include "lockwatch/errors.hpp"

namespace lockwatch::detail {

using namespace std::chrono;

namespace {

constexpr const char* kFieldNames[] = {"minute", "hour", "day-of-month", "month", "day-of-week"};

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    auto pos = s.find(sep, start);
    out.push_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) return out;
    start = pos + 1;
  }
}

int number(std::string_view s, const char* field, std::string_view text) {
  const auto v = whole_number<int>(s);
  if (!v) throw InvalidArgument(fmt::format("cron expression '{}': {} field: '{}' is not a number", text, field, s));
  return *v;
}

// Sets the bits of one field; returns whether it was a lone `*` (or `*/n`).
template <std::size_t N>
bool parse_field(std::string_view f, int lo, int hi, std::bitset<N>& bits, const char* field, std::string_view text) {
  if (f.empty()) throw InvalidArgument(fmt::format("cron expression '{}': empty {} field", text, field));
  auto items = split(f, ',');
  bool star = items.size() == 1 && !items[0].empty() && items[0][0] == '*';
  for (auto item : items) {
    auto parts = split(item, '/');
    if (parts.size() > 2) throw InvalidArgument(fmt::format("cron expression '{}': {} field: bad step in '{}'", text, field, item));
    int step = 1;
    if (parts.size() == 2) {
      step = number(parts[1], field, text);
      if (step <= 0) throw InvalidArgument(fmt::format("cron expression '{}': {} field: step must be positive", text, field));
    }
    int a = lo, b = hi;
    std::string_view base = parts[0];
    if (base != "*") {
      auto range = split(base, '-');
      if (range.size() > 2) throw InvalidArgument(fmt::format("cron expression '{}': {} field: bad range '{}'", text, field, base));
      a = number(range[0], field, text);
      b = range.size() == 2 ? number(range[1], field, text) : (parts.size() == 2 ? hi : a);
      if (a < lo || b > hi || a > b)
        throw InvalidArgument(
            fmt::format("cron expression '{}': {} field: '{}' is outside {}-{} or reversed", text, field, base, lo, hi));
    }
    for (int v = a; v <= b; v += step) bits.set(static_cast<std::size_t>(v));
  }
  return star;
}

}  // namespace

CronExpr CronExpr::parse(std::string_view text) {
  std::vector<std::string_view> fields;
  std::size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    std::size_t start = i;
    while (i < text.size() && text[i] != ' ' && text[i] != '\t') ++i;
    if (i > start) fields.push_back(text.substr(start, i - start));
  }
  if (fields.size() != 5)
    throw InvalidArgument(fmt::format(
        "cron expression '{}' has {} fields; expected 5 (minute hour day-of-month month day-of-week)", text,
        fields.size()));
  CronExpr c;
  parse_field(fields[0], 0, 59, c.minute_, kFieldNames[0], text);
  parse_field(fields[1], 0, 23, c.hour_, kFieldNames[1], text);
  c.dom_star_ = parse_field(fields[2], 1, 31, c.dom_, kFieldNames[2], text);
  parse_field(fields[3], 1, 12, c.month_, kFieldNames[3], text);
  std::bitset<8> dow;
  c.dow_star_ = parse_field(fields[4], 0, 7, dow, kFieldNames[4], text);
  for (std::size_t d = 0; d < 7; ++d) c.dow_[d] = dow[d];
  if (dow[7]) c.dow_[0] = true;
  // 2000-01-01 onwards covers every leap-day pattern within the horizon.
  if (!c.next_after(sys_days(year(2000) / January / 1)))
    throw InvalidArgument(fmt::format("cron expression '{}' never fires", text));
  return c;
}

bool CronExpr::month_ok(const year_month_day& d) const { return month_[static_cast<unsigned>(d.month())]; }

bool CronExpr::day_ok(const year_month_day& d) const {
  bool dom = dom_[static_cast<unsigned>(d.day())];
  bool dow = dow_[weekday(sys_days(d)).c_encoding()];
  if (dom_star_ || dow_star_) return dom && dow;
  return dom || dow;
}

bool CronExpr::matches(Minutes t) const {
  auto day = floor<days>(t);
  year_month_day d(day);
  auto h = duration_cast<hours>(t - day).count();
  auto m = (t - floor<hours>(t)).count();
  return month_ok(d) && day_ok(d) && hour_[static_cast<std::size_t>(h)] && minute_[static_cast<std::size_t>(m)];
}

std::optional<CronExpr::Minutes> CronExpr::next_after(system_clock::time_point after) const {
  Minutes t = floor<minutes>(after) + minutes(1);
  const Minutes limit = t + kHorizon;
  while (t <= limit) {
    auto day = floor<days>(t);
    year_month_day d(day);
    if (!month_ok(d)) {
      auto ym = year_month(d.year(), d.month()) + months(1);
      t = Minutes(sys_days(ym / 1));
      continue;
    }
    if (!day_ok(d)) {
      t = Minutes(day + days(1));
      continue;
    }
    auto h = static_cast<std::size_t>(duration_cast<hours>(t - day).count());
    if (!hour_[h]) {
      t = floor<hours>(t) + hours(1);
      continue;
    }
    auto m = static_cast<std::size_t>((t - floor<hours>(t)).count());
    if (!minute_[m]) {
      t += minutes(1);
      continue;
    }
    return t;
  }
  return std::nullopt;
}

std::optional<CronExpr::Minutes> CronExpr::latest_at(system_clock::time_point at) const {
  Minutes t = floor<minutes>(at);
  const Minutes limit = t - kHorizon;
  while (t >= limit) {
    auto day = floor<days>(t);
    year_month_day d(day);
    if (!month_ok(d)) {
      t = Minutes(sys_days(year_month(d.year(), d.month()) / 1)) - minutes(1);
      continue;
    }
    if (!day_ok(d)) {
      t = Minutes(day) - minutes(1);
      continue;
    }
    auto h = static_cast<std::size_t>(duration_cast<hours>(t - day).count());
    if (!hour_[h]) {
      t = floor<hours>(t) - minutes(1);
      continue;
    }
    auto m = static_cast<std::size_t>((t - floor<hours>(t)).count());
    if (!minute_[m]) {
      t -= minutes(1);
      continue;
    }
    return t;
  }
  return std::nullopt;
}

}  // namespace lockwatch::detail
