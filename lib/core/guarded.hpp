// lib/core/guarded.hpp: running a callback where nothing may unwind (libuv's
// C frames, a reply being read): an exception it throws is reported on
// stderr, naming `where` ("a loop task", "a reply callback"), and goes no
// further.
#pragma once

#include <cstdio>
#include <exception>

namespace lockwatch::detail {

template <class F>
void guarded(const char* where, F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockwatch: unexpected exception in %s: %s\n", where, e.what());
  } catch (...) {
    std::fprintf(stderr, "lockwatch: unexpected exception in %s\n", where);
  }
}

}  // namespace lockwatch::detail
