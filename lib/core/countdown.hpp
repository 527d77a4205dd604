// lib/core/countdown.hpp: a step that sends n requests at once and goes on
// once the last of them answered, with the first failure any of them met
// (a store's reads of several nodes, deletions, inspections of a page).
//
// The requests' callbacks share it (make()); each calls answered() once.
// `State` is what they gather meanwhile (the Countdown derives from it), and
// `done` reads it, with `failure`, after the last answer.
//
// Threading: the thread its requests answer on (the loop's). Costs: one
// allocation per step.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <variant>

namespace lockwatch::detail {

template <class Failure, class State = std::monostate>
struct Countdown : State {
  using Done = std::function<void(Countdown&)>;

  // For n > 0 requests.
  static std::shared_ptr<Countdown> make(std::size_t n, State state, Done done) {
    return std::make_shared<Countdown>(std::move(state), n, std::move(done));
  }
  Countdown(State state, std::size_t n, Done then) : State(std::move(state)), left(n), done(std::move(then)) {}

  // One request answered, with its failure (null: none); after the last, `done` runs.
  void answered(const Failure* f = nullptr) {
    if (f != nullptr && !failure) failure = *f;
    if (--left == 0) done(*this);
  }

  std::size_t left;
  std::optional<Failure> failure;  // the first
  Done done;
};

}  // namespace lockwatch::detail
