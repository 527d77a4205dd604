// A small Asio TCP service whose handlers take locks with co_await: one
// thread, one io_context, any number of connections, and no thread ever
// blocks on a lock.
//
//   LOCKWATCH_STORE_URL=redis://127.0.0.1:6379 ./lockwatch-sample-asio-service 7000
//   printf 'take 42 3\nfenced 42\n' | nc -q1 127.0.0.1 7000
//   ./lockwatch-sample-asio-service --demo     # 16 clients of its own, then the final stock
//
// Lines in, lines out:
//   take SKU N     LOCKED("sku:{0}"): read the stock, "write" it after a
//                  simulated 2 ms I/O while holding the lock -> "ok SKU left=L"
//   fenced SKU     async_lock + the handle's fencing token -> "token SKU T"
// Several processes serving the same SKUs stay consistent: the lock, not
// the process, serialises each SKU (the stock here is per process, to keep
// the sample small; a real one keeps it in the fenced store).
#include <asio.hpp>
#include <lockwatch/asio.hpp>

#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <system_error>

using namespace std::chrono_literals;
using asio::ip::tcp;

namespace {

std::map<int, int> g_stock;  // touched on the io_context's thread only

asio::awaitable<std::string> take(int sku, int n) {
  int have = g_stock.try_emplace(sku, 1000).first->second;
  asio::steady_timer io(co_await asio::this_coro::executor, 2ms);  // the store's round trip
  co_await io.async_wait(asio::use_awaitable);
  g_stock[sku] = have - n;  // read, suspend, write: safe only under the lock
  co_return "ok " + std::to_string(sku) + " left=" + std::to_string(have - n);
}

asio::awaitable<void> serve(tcp::socket socket, lockwatch::Runtime& rt) {
  // Waits up to 5 s for a busy SKU; renewed every 9/10 of 5 s while held.
  auto locked_take = lockwatch::locked("sku:{0}", 5s, lockwatch::forever).on(rt).wait(5s)(take);
  asio::streambuf buf;
  try {
    for (;;) {
      co_await asio::async_read_until(socket, buf, '\n', asio::use_awaitable);
      std::istream in(&buf);
      std::string line, verb;
      std::getline(in, line);
      std::istringstream words(line);
      words >> verb;
      std::string reply;
      try {
        if (int sku = 0, n = 0; verb == "take" && (words >> sku >> n)) {
          reply = co_await locked_take(sku, n);
        } else if (verb == "fenced" && (words >> sku)) {
          // Named before the co_await (GCC 12: see lockwatch/asio.hpp).
          const lockwatch::LockRequest request{.key = "sku:" + std::to_string(sku), .ttl = 5s, .wait = 5s};
          lockwatch::LockHandle h = co_await lockwatch::async_lock(rt, request, asio::use_awaitable);
          reply = "token " + std::to_string(sku) + " " + std::to_string(h.lease().fencing_token());
          co_await h.async_release(asio::use_awaitable);
        } else if (verb == "quit") {
          co_return;
        } else {
          reply = "err usage: take SKU N | fenced SKU | quit";
        }
      } catch (const lockwatch::Error& e) {
        reply = std::string("err ") + e.what();  // LOCKED: LockNotAcquired, LeaseLost, ConnectionError...
      } catch (const std::system_error& e) {
        reply = std::string("err ") + e.what();  // async_lock: the error code (lockwatch::errc::busy, ...)
      }
      reply += '\n';
      co_await asio::async_write(socket, asio::buffer(reply), asio::use_awaitable);
    }
  } catch (const std::system_error&) {
    // The client went away.
  }
}

asio::awaitable<void> listen(tcp::acceptor& acceptor, lockwatch::Runtime& rt) {
  for (;;) {
    tcp::socket s = co_await acceptor.async_accept(asio::use_awaitable);
    asio::co_spawn(acceptor.get_executor(), serve(std::move(s), rt), asio::detached);
  }
}

// --demo: clients in the same io_context, each taking 1 five times.
asio::awaitable<void> client(unsigned short port, int& finished) {
  tcp::socket s(co_await asio::this_coro::executor);
  co_await s.async_connect({asio::ip::address_v4::loopback(), port}, asio::use_awaitable);
  asio::streambuf buf;
  for (int i = 0; i < 5; ++i) {
    std::string req = "take 42 1\n";
    co_await asio::async_write(s, asio::buffer(req), asio::use_awaitable);
    co_await asio::async_read_until(s, buf, '\n', asio::use_awaitable);
    buf.consume(buf.size());
  }
  ++finished;
}

}  // namespace

int main(int argc, char** argv) {
  bool demo = argc > 1 && std::strcmp(argv[1], "--demo") == 0;
  unsigned short port = (!demo && argc > 1) ? static_cast<unsigned short>(std::atoi(argv[1])) : 0;
  try {
    lockwatch::Runtime rt;  // LOCKWATCH_STORE_URL
    asio::io_context ctx(1);
    tcp::acceptor acceptor(ctx, {asio::ip::address_v4::loopback(), port});
    port = acceptor.local_endpoint().port();
    std::printf("listening on 127.0.0.1:%u\n", static_cast<unsigned>(port));
    std::fflush(stdout);
    asio::co_spawn(ctx, listen(acceptor, rt), asio::detached);
    asio::signal_set signals(ctx, SIGINT, SIGTERM);
    signals.async_wait([&](auto, auto) { ctx.stop(); });
    constexpr int kClients = 16;
    int finished = 0;
    if (demo) {
      for (int i = 0; i < kClients; ++i) asio::co_spawn(ctx, client(port, finished), asio::detached);
      while (finished < kClients && !ctx.stopped()) ctx.run_for(100ms);
      std::printf("stock of sku 42: %d (expected %d)\n", g_stock[42], 1000 - kClients * 5);
      return g_stock[42] == 1000 - kClients * 5 ? 0 : 1;
    }
    ctx.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "asio_service: %s\n", e.what());
    return 1;
  }
  return 0;
}
