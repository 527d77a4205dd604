// lib/jobs/cron.hpp: 5-field cron expressions in UTC.
//
// minute hour day-of-month month day-of-week, each a `*`, a number, a range
// `a-b`, a step `*/n` or `a-b/n` (or `a/n`: from a to the field's end), or a
// comma list of those. Day-of-week 0 and 7 are Sunday. When both day
// fields are restricted a day matching either fires (Vixie cron). No names.
//
// Searches step by the largest unit that does not match (month, day, hour,
// minute), so a yearly expression costs a few hundred steps; a search
// looks at most kHorizon ahead or behind.
//
// Threading: an immutable value once parsed.
#pragma once

#include <bitset>
#include <chrono>
#include <optional>
#include <string_view>

namespace lockwatch::detail {

class CronExpr {
 public:
  using Minutes = std::chrono::sys_time<std::chrono::minutes>;
  static constexpr std::chrono::days kHorizon{366 * 9};

  // Throws InvalidArgument, saying which field is wrong, or if the
  // expression never fires.
  static CronExpr parse(std::string_view text);

  // The first fire time strictly after `t`.
  std::optional<Minutes> next_after(std::chrono::system_clock::time_point t) const;
  // The latest fire time at or before `t`.
  std::optional<Minutes> latest_at(std::chrono::system_clock::time_point t) const;
  bool matches(Minutes t) const;

 private:
  bool month_ok(const std::chrono::year_month_day& d) const;
  bool day_ok(const std::chrono::year_month_day& d) const;

  std::bitset<60> minute_;
  std::bitset<24> hour_;
  std::bitset<32> dom_;    // 1..31
  std::bitset<13> month_;  // 1..12
  std::bitset<7> dow_;     // 0..6, Sunday 0
  bool dom_star_ = false, dow_star_ = false;
};

}  // namespace lockwatch::detail
