// The `lockwatch` command as a user runs it: the real binary (its path in
// LOCKWATCH_CLI), real child processes, a real redis-server (mariadbd and
// postgres for the SQL stores).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "lockwatch/lockwatch.hpp"
#if LOCKWATCH_WITH_SQL
#include "support/mariadb_server.hpp"
#endif
#if LOCKWATCH_WITH_POSTGRESQL
#include "support/postgres_server.hpp"
#endif
#include "test_util.hpp"

namespace lockwatch::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::string cli_path() {
  const char* p = std::getenv("LOCKWATCH_CLI");
  if (p == nullptr) throw std::runtime_error("LOCKWATCH_CLI is not set (tests/meson.build sets it)");
  return p;
}

std::string test_key(const std::string& suffix = "") {
  return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + suffix;
}

// lockwatch with its standard error joined to its standard output, so the
// test reads both.
std::vector<std::string> cli_argv(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", cli_path()};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

struct Outcome {
  int code = -1;
  std::string output;
  Clock::duration took{};
};

// Reads what `p` prints until it closes its output, then its exit status;
// bounded by kBound.
Outcome finish(ChildProcess& p, Clock::time_point started) {
  Outcome out;
  auto until = started + kBound;
  while (Clock::now() < until) {
    auto line = p.read_line(std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()));
    if (!line) break;
    out.output += *line + "\n";
  }
  out.code = p.wait(
      std::max<std::chrono::milliseconds>(std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()), 100ms));
  out.took = Clock::now() - started;
  return out;
}

// Reads lines until one equals `want` (bounded); returns those before it
// joined, or nullopt if it never came.
std::optional<std::string> read_until(ChildProcess& p, const std::string& want) {
  std::string seen;
  auto until = Clock::now() + kBound;
  while (Clock::now() < until) {
    auto line = p.read_line(std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()));
    if (!line) return std::nullopt;
    if (*line == want) return seen;
    seen += *line + "\n";
  }
  return std::nullopt;
}

// A process that is gone or a zombie runs nothing.
bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  char state = text[close + 2];
  return state != 'Z' && state != 'X';
}

bool stops_running(pid_t pid) {
  auto until = Clock::now() + kBound;
  while (running(pid) && Clock::now() < until) std::this_thread::sleep_for(5ms);  // the kill is asynchronous
  return !running(pid);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

class CliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Ignored dispositions are inherited down to the commands (a test run
    // started in the background has SIGINT ignored), and the forwarding
    // test needs commands that die of the signals it forwards.
    for (int sig : {SIGINT, SIGHUP, SIGQUIT, SIGTERM, SIGUSR1}) ::signal(sig, SIG_DFL);
    server_ = new RedisServer();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  // Waits (bounded) until someone listens on the test key's release
  // channel: a waiting run has subscribed.
  static bool wait_for_subscriber() {
    auto until = Clock::now() + kBound;
    while (server_->command({"PUBSUB", "NUMSUB", lock_key(test_key()) + ":rel"}).elements.at(1).integer == 0) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(5ms);  // polling the server's subscriber count
    }
    return true;
  }
  void SetUp() override {
    char tmpl[] = "/tmp/lockwatch-cli-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::string> env() const { return {"LOCKWATCH_STORE_URL=" + server_->url(), "D=" + dir_}; }

  // Starts lockwatch with `args`, against this suite's server.
  std::unique_ptr<ChildProcess> start(const std::vector<std::string>& args) const {
    return std::make_unique<ChildProcess>(cli_argv(args), env());
  }
  // Runs lockwatch to its end.
  Outcome run(const std::vector<std::string>& args) const {
    auto started = Clock::now();
    auto p = start(args);
    return finish(*p, started);
  }

  static RedisServer* server_;
  std::string dir_;
};
RedisServer* CliTest::server_ = nullptr;

TEST_F(CliTest, RacingRunsNeverOverlap) {
  // Each run checks that it is alone (mkdir fails if another is inside)
  // and does a deliberately racy read, pause, write of a counter.
  const std::string body =
      "mkdir \"$D/inside\" || exit 99; n=$(cat \"$D/count\" 2>/dev/null || echo 0); sleep 0.05; "
      "echo $((n + 1)) > \"$D/count\"; rmdir \"$D/inside\"";
  constexpr int kRuns = 6;
  auto started = Clock::now();
  std::vector<std::unique_ptr<ChildProcess>> runs;
  for (int i = 0; i < kRuns; ++i) runs.push_back(start({"run", "--key", test_key(), "--wait", "20s", "-c", body}));
  for (auto& p : runs) {
    Outcome o = finish(*p, started);
    EXPECT_EQ(o.code, 0) << o.output;
  }
  std::ifstream count(dir_ + "/count");
  int n = 0;
  count >> n;
  EXPECT_EQ(n, kRuns);
}

TEST_F(CliTest, TheCommandsExitStatusPassesThrough) {
  EXPECT_EQ(run({"run", "--key", test_key(), "--", "sh", "-c", "exit 3"}).code, 3);
  EXPECT_EQ(run({"run", "--key", test_key(), "-c", "exit 0"}).code, 0);
  EXPECT_EQ(run({"run", "--key", test_key(), "-c", "exit 255"}).code, 255);
  EXPECT_EQ(run({"run", "--key", test_key(), "-c", "kill -KILL $$"}).code, 128 + SIGKILL);
  EXPECT_FALSE(exists(*server_, test_key())) << "released after each run";
}

TEST_F(CliTest, TheLockIsHeldUntilEverythingTheCommandStartedHasEnded) {
  auto started = Clock::now();
  auto p =
      start({"run", "--key", test_key(), "-c",
             "(while [ ! -e \"$D/go\" ]; do sleep 0.01; done; echo background-done) & echo foreground-done; exit 3"});
  ASSERT_TRUE(read_until(*p, "foreground-done"));
  EXPECT_TRUE(exists(*server_, test_key())) << "a background job the command left still runs under the lock";
  std::ofstream(dir_ + "/go") << "go\n";
  Outcome o = finish(*p, started);
  EXPECT_EQ(o.code, 3) << "the command's own status, not its background job's";
  EXPECT_EQ(o.output, "background-done\n");
  EXPECT_FALSE(exists(*server_, test_key()));
}

TEST_F(CliTest, TheCommandSeesTheLockInItsEnvironment) {
  Outcome o = run({"run", "--key", test_key(), "--ttl", "5s", "-c",
                   "echo \"$LOCKWATCH_KEY $LOCKWATCH_FENCING_TOKEN $LOCKWATCH_TTL_MS\""});
  EXPECT_EQ(o.code, 0);
  EXPECT_EQ(o.output, test_key() + " 1 5000\n");
  Outcome again = run({"run", "--key", test_key(), "-c", "echo $LOCKWATCH_FENCING_TOKEN"});
  EXPECT_EQ(again.output, "2\n") << "fencing tokens rise from run to run";
}

TEST_F(CliTest, ABusyLockExits75AtOnceWithoutRunningTheCommand) {
  Runtime holder(options_for(*server_, 1));
  auto acquired = holder.acquire(test_key(), 30s);
  LockHandle h = get_bounded(acquired);

  Outcome busy = run({"run", "--key", test_key(), "-c", "echo ran"});
  EXPECT_EQ(busy.code, 75);
  EXPECT_LT(busy.took, 3s);
  EXPECT_TRUE(contains(busy.output, "held by another owner")) << busy.output;
  EXPECT_FALSE(contains(busy.output, "ran")) << busy.output;

  EXPECT_EQ(run({"run", "--key", test_key(), "-E", "42", "--", "true"}).code, 42);
  Outcome quiet = run({"run", "--key", test_key(), "-q", "--", "true"});
  EXPECT_EQ(quiet.code, 0);
  EXPECT_EQ(quiet.output, "");
  // -E 0 says a busy lock is no failure: silent, as -q.
  Outcome zero = run({"run", "--key", test_key(), "-E", "0", "--", "true"});
  EXPECT_EQ(zero.code, 0);
  EXPECT_EQ(zero.output, "");

  Outcome waited = run({"run", "--key", test_key(), "--wait", "300ms", "--", "true"});
  EXPECT_EQ(waited.code, 75);
  EXPECT_GE(waited.took, 300ms);
  EXPECT_FALSE(h.lease().lost());
}

TEST_F(CliTest, AWaitingRunGetsTheLockWhenItIsReleased) {
  Runtime holder(options_for(*server_, 1));
  auto acquired = holder.acquire(test_key(), 30s);
  LockHandle h = get_bounded(acquired);
  auto started = Clock::now();
  auto p = start({"run", "--key", test_key(), "--wait", "20s", "-c", "echo ran"});
  // Released once the run waits on the release channel (it subscribed).
  ASSERT_TRUE(wait_for_subscriber());
  auto released = h.release();
  get_bounded(released);
  Outcome o = finish(*p, started);
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_EQ(o.output, "ran\n");
  EXPECT_LT(o.took, 10s) << "woken by the release, not the holder's ttl";
}

TEST_F(CliTest, AStolenLeaseKillsTheCommandAndItsChildrenAndExits76) {
  auto started = Clock::now();
  auto p = start({"run", "--key", test_key(), "--ttl", "1s", "-c", "sleep 1000 & echo \"$! $$\"; wait"});
  auto line = p->read_line(kBound);
  ASSERT_TRUE(line);
  pid_t grandchild = 0, child = 0;
  std::istringstream(*line) >> grandchild >> child;
  ASSERT_GT(grandchild, 0);
  ASSERT_GT(child, 0);
  ASSERT_TRUE(running(grandchild));

  server_->command({"SET", lock_key(test_key()), "thief", "PX", "60000"});
  Outcome o = finish(*p, started);
  EXPECT_EQ(o.code, 76) << o.output;
  EXPECT_TRUE(contains(o.output, "taken by another owner")) << o.output;
  EXPECT_TRUE(stops_running(child));
  EXPECT_TRUE(stops_running(grandchild));
  EXPECT_EQ(server_->command({"GET", lock_key(test_key())}).str, "thief") << "the thief's lock is left alone";
}

TEST_F(CliTest, ALostLeaseSendsSigtermBeforeTheKillGraceEnds) {
  auto started = Clock::now();
  auto p = start({"run", "--key", test_key(), "--ttl", "1s", "--kill-grace", "10s", "-c",
                  "trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.1; done"});
  auto before = read_until(*p, "ready");
  ASSERT_TRUE(before);
  EXPECT_TRUE(contains(*before, "warning: --kill-grace 10s is longer")) << *before;
  server_->command({"DEL", lock_key(test_key())});
  Outcome o = finish(*p, started);
  EXPECT_EQ(o.code, 76) << "never the command's 0 after a loss; " << o.output;
  EXPECT_TRUE(contains(o.output, "got-term")) << o.output;
  EXPECT_LT(o.took, 10s) << "the command ended on SIGTERM; no need to wait for the SIGKILL";
}

TEST_F(CliTest, ALeaseLostWithRedisExits76AsSoonAsTheCommandIsGone) {
  RedisServer dying;
  auto started = Clock::now();
  auto p = std::make_unique<ChildProcess>(
      cli_argv({"run", "--redis", dying.url(), "--key", test_key(), "--ttl", "3s", "-c", "echo ready; exec sleep 1000"}),
      env());
  ASSERT_TRUE(read_until(*p, "ready"));
  dying.kill();
  // The loss is declared at the local deadline, up to a ttl from now; then
  // the command gets SIGTERM and dies of it at once.
  std::string before;
  std::optional<Clock::time_point> stopping;
  for (auto until = Clock::now() + kBound; !stopping && Clock::now() < until;) {
    auto line = p->read_line(std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()));
    if (!line) break;
    before += *line + "\n";
    if (contains(*line, "stopping the command")) stopping = Clock::now();
  }
  ASSERT_TRUE(stopping) << before;
  Outcome o = finish(*p, started);
  EXPECT_EQ(o.code, 76) << before << o.output;
  // The key expires on its own: lockwatch does not wait for that (it did,
  // up to a ttl, 2.7 s here) once nothing of the command runs.
  EXPECT_LT(started + o.took - *stopping, 1500ms) << before << o.output;
  EXPECT_FALSE(contains(before + o.output, "reconnecting")) << "the library's log is left out: " << before;
}

TEST_F(CliTest, ACommandThatIgnoresSigtermIsKilledWhenTheGraceEnds) {
  auto started = Clock::now();
  auto p = start({"run", "--key", test_key(), "--ttl", "1s", "--kill-grace", "300ms", "-c",
                  "trap '' TERM; echo pid $$; exec sleep 1000"});
  pid_t child = 0;
  while (child == 0) {
    auto line = p->read_line(kBound);
    if (!line) break;
    if (line->starts_with("pid ")) child = std::stoi(line->substr(4));  // after the --kill-grace warning
  }
  ASSERT_GT(child, 0);
  server_->command({"DEL", lock_key(test_key())});
  std::string before;
  std::optional<Clock::time_point> stopping;
  for (auto until = Clock::now() + kBound; !stopping && Clock::now() < until;) {
    auto l = p->read_line(std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()));
    if (!l) break;
    before += *l + "\n";
    if (contains(*l, "stopping the command")) stopping = Clock::now();
  }
  ASSERT_TRUE(stopping) << before;
  Outcome o = finish(*p, started);
  EXPECT_EQ(o.code, 76) << before << o.output;
  EXPECT_GE(started + o.took - *stopping, 250ms) << "SIGKILL only once the grace is over";
  EXPECT_TRUE(stops_running(child));
}

TEST_F(CliTest, KillingLockwatchKillsTheCommandAndTheLockExpiresAfterItsTtl) {
  auto p = start({"run", "--key", test_key(), "--ttl", "1s", "-c", "sleep 1000 & echo \"$! $$\"; wait"});
  auto line = p->read_line(kBound);
  ASSERT_TRUE(line);
  pid_t grandchild = 0, child = 0;
  std::istringstream(*line) >> grandchild >> child;
  ASSERT_GT(grandchild, 0);
  ASSERT_GT(child, 0);

  p->kill(SIGKILL);
  EXPECT_EQ(p->wait(kBound), 128 + SIGKILL);
  auto killed = Clock::now();
  EXPECT_TRUE(stops_running(child));
  EXPECT_TRUE(stops_running(grandchild)) << "a grandchild does not outlive lockwatch either";

  // Nobody renews it any more: the key ends with its ttl.
  while (exists(*server_, test_key()) && Clock::now() < killed + kBound) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(exists(*server_, test_key()));
  EXPECT_LT(Clock::now() - killed, 1s + 500ms);
  EXPECT_EQ(run({"run", "--key", test_key(), "--", "true"}).code, 0);
}

TEST_F(CliTest, SignalsAreForwardedToTheCommand) {
  for (int sig : {SIGINT, SIGHUP, SIGUSR1}) {
    auto started = Clock::now();
    auto p = start({"run", "--key", test_key(), "-c", "echo ready; exec sleep 1000"});
    ASSERT_TRUE(read_until(*p, "ready"));
    p->kill(sig);
    EXPECT_EQ(finish(*p, started).code, 128 + sig) << "signal " << sig;
  }
  // Short sleeps: a child the shell forks has the shell's trap handler
  // for a moment, and a SIGTERM then is lost to it (a long background sleep
  // would keep the run waiting).
  auto started = Clock::now();
  auto p = start(
      {"run", "--key", test_key(), "-c", "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.1; done"});
  ASSERT_TRUE(read_until(*p, "ready"));
  p->kill(SIGTERM);
  Outcome o = finish(*p, started);
  EXPECT_EQ(o.code, 7);
  // The whole group gets it: the shell may also report its `sleep` child
  // as "Terminated" before its trap runs.
  EXPECT_NE(o.output.find("got-term\n"), std::string::npos) << o.output;
  EXPECT_FALSE(exists(*server_, test_key()));
}

TEST_F(CliTest, ASignalWhileWaitingGivesUpAndLeavesTheHolderAlone) {
  Runtime holder(options_for(*server_, 1));
  auto acquired = holder.acquire(test_key(), 30s);
  LockHandle h = get_bounded(acquired);
  auto started = Clock::now();
  auto p = start({"run", "--key", test_key(), "--wait", "60s", "-c", "echo ran"});
  ASSERT_TRUE(wait_for_subscriber());
  p->kill(SIGTERM);
  Outcome o = finish(*p, started);
  EXPECT_EQ(o.code, 128 + SIGTERM);
  EXPECT_FALSE(contains(o.output, "ran"));
  EXPECT_LT(o.took, 10s);
  EXPECT_FALSE(h.lease().lost());
  EXPECT_TRUE(exists(*server_, test_key()));
}

TEST_F(CliTest, BadArgumentsExit64WithAClearMessage) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "A subcommand is required"},
      {{"frobnicate"}, "not expected: frobnicate"},
      {{"run", "--", "true"}, "--key is required"},
      {{"run", "--key", "k"}, "needs a command"},
      {{"run", "--key", "k", "-c", "true", "--", "true"}, "excludes"},
      {{"run", "--key", "k", "--ttl", "30", "--", "true"}, "'30' is not a duration: it needs a unit"},
      {{"run", "--key", "k", "--ttl", "5x", "--", "true"}, "unknown unit 'x'"},
      {{"run", "--key", "k", "--wait", "-1s", "--", "true"}, "not a duration"},
      {{"run", "--key", "k", "--kill-grace", "1.5s", "--", "true"}, "not a duration"},
      {{"run", "--key", "k", "--retries", "often", "--", "true"}, "'often' is not a number of renewals"},
      {{"run", "--key", "k", "-E", "300", "--", "true"}, "300 not in range 0 to 255"},
      {{"run", "--key", "k", "--ttl", "10ms", "--", "true"}, "ttl 10 ms is too short"},
      {{"run", "--key", "", "--", "true"}, "lock key is empty"},
      {{"run", "--redis", "http://127.0.0.1", "--key", "k", "--", "true"}, "unsupported URL scheme 'http://'"},
      {{"status"}, "KEY is required"},
      {{"release", "k"}, "--force is required"},
  };
  for (const auto& [args, message] : cases) {
    std::string shown;
    for (const auto& a : args) shown += " '" + a + "'";
    Outcome o = run(args);
    EXPECT_EQ(o.code, 64) << shown << "\n" << o.output;
    EXPECT_TRUE(contains(o.output, message)) << shown << ": expected '" << message << "' in\n" << o.output;
  }
  Outcome help = run({"run", "--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(contains(help.output, "76")) << "the exit codes are in --help";
}

TEST_F(CliTest, AnUnreachableOrRefusingStoreExits69) {
  const std::string nowhere = "redis://127.0.0.1:" + std::to_string(free_loopback_port());
  Outcome o = run({"run", "--redis", nowhere, "--key", test_key(), "-c", "echo ran"});
  EXPECT_EQ(o.code, 69) << o.output;
  EXPECT_TRUE(contains(o.output, "cannot reach the store")) << o.output;
  EXPECT_FALSE(contains(o.output, "ran"));
  EXPECT_EQ(run({"status", "--redis", nowhere, test_key()}).code, 69);
  EXPECT_EQ(run({"release", "--redis", nowhere, "--force", test_key()}).code, 69);

  RedisServerOptions with_password;
  with_password.password = "right";
  RedisServer guarded(with_password);
  std::string wrong = "redis://:wrong@127.0.0.1:" + std::to_string(guarded.port());
  Outcome refused = run({"run", "--redis", wrong, "--key", test_key(), "--", "true"});
  EXPECT_EQ(refused.code, 69) << refused.output;
  EXPECT_TRUE(contains(refused.output, "refused the credentials")) << refused.output;
  EXPECT_FALSE(contains(refused.output, "wrong")) << "no password in messages";
}

TEST_F(CliTest, ReconnectWarningsAreLeftOutUnlessVerbose) {
  const std::string nowhere = "redis://127.0.0.1:" + std::to_string(free_loopback_port());
  const std::vector<std::vector<std::string>> commands = {{"status", "--redis", nowhere, test_key()},
                                                          {"release", "--redis", nowhere, "--force", test_key()},
                                                          {"run", "--redis", nowhere, "--key", test_key(), "--", "true"}};
  for (const auto& args : commands) {
    Outcome o = run(args);
    EXPECT_EQ(o.code, 69) << args.front() << ": " << o.output;
    EXPECT_TRUE(contains(o.output, "cannot reach the store")) << args.front() << ": " << o.output;
    EXPECT_FALSE(contains(o.output, "reconnecting")) << args.front() << ": " << o.output;
    EXPECT_FALSE(contains(o.output, "warning:")) << args.front() << ": " << o.output;

    std::vector<std::string> verbose = args;
    verbose.insert(verbose.begin() + 1, "--verbose");
    Outcome v = run(verbose);
    EXPECT_EQ(v.code, 69) << args.front() << " --verbose: " << v.output;
    EXPECT_TRUE(contains(v.output, "warning: connection to 127.0.0.1:")) << args.front() << " --verbose: " << v.output;
    EXPECT_TRUE(contains(v.output, "cannot reach the store")) << args.front() << " --verbose: " << v.output;
  }
}

TEST_F(CliTest, AMissingCommandExits127AndNeverTakesTheLock) {
  Outcome missing = run({"run", "--key", test_key(), "--", "lockwatch-test-no-such-command"});
  EXPECT_EQ(missing.code, 127);
  EXPECT_TRUE(contains(missing.output, "lockwatch-test-no-such-command: command not found")) << missing.output;
  EXPECT_EQ(run({"run", "--key", test_key(), "--", dir_ + "/absent"}).code, 127);

  std::string plain = dir_ + "/not-executable";
  std::ofstream(plain) << "echo hi\n";
  ::chmod(plain.c_str(), 0644);
  Outcome denied = run({"run", "--key", test_key(), "--", plain});
  EXPECT_EQ(denied.code, 126);
  EXPECT_TRUE(contains(denied.output, "Permission denied")) << denied.output;
  EXPECT_EQ(server_->command({"EXISTS", fence_key(test_key())}).integer, 0) << "no lock was taken";

  std::string garbage = dir_ + "/not-a-program";
  std::ofstream(garbage) << "\x7f"
                         << "ELF but not really\n";
  ::chmod(garbage.c_str(), 0755);
  Outcome unrunnable = run({"run", "--key", test_key(), "--", garbage});
  EXPECT_EQ(unrunnable.code, 126) << unrunnable.output;
  EXPECT_TRUE(contains(unrunnable.output, "cannot run")) << unrunnable.output;
  EXPECT_FALSE(exists(*server_, test_key())) << "released";

  // Through the shell, the shell's own code.
  EXPECT_EQ(run({"run", "--key", test_key(), "-c", "lockwatch-test-no-such-command"}).code, 127);
}

TEST_F(CliTest, StatusAndReleaseSpeakInLinesForScripts) {
  const std::string k = test_key();
  Outcome free_status = run({"status", k});
  EXPECT_EQ(free_status.code, 0);
  EXPECT_EQ(free_status.output, "key=" + k + "\nstate=free\nttl_ms=0\nfencing_token=0\n");

  auto started = Clock::now();
  auto holder = start({"run", "--key", k, "--ttl", "2s", "-c", "echo ready; exec sleep 1000"});
  ASSERT_TRUE(read_until(*holder, "ready"));
  Outcome held = run({"status", k});
  EXPECT_EQ(held.code, 0);
  std::istringstream lines(held.output);
  std::string l1, l2, l3, l4;
  std::getline(lines, l1);
  std::getline(lines, l2);
  std::getline(lines, l3);
  std::getline(lines, l4);
  EXPECT_EQ(l1, "key=" + k);
  EXPECT_EQ(l2, "state=held");
  ASSERT_EQ(l3.rfind("ttl_ms=", 0), 0u) << l3;
  long ttl_ms = std::stol(l3.substr(7));
  EXPECT_GT(ttl_ms, 0);
  EXPECT_LE(ttl_ms, 2000);
  EXPECT_EQ(l4, "fencing_token=1");

  Outcome released = run({"release", "--force", k});
  EXPECT_EQ(released.code, 0);
  EXPECT_EQ(released.output, "key=" + k + "\nwas_held=yes\n");
  // The holder finds its lease gone at its next renewal and stops.
  Outcome o = finish(*holder, started);
  EXPECT_EQ(o.code, 76) << o.output;

  EXPECT_EQ(run({"status", k}).output, "key=" + k + "\nstate=free\nttl_ms=0\nfencing_token=1\n");
  EXPECT_EQ(run({"release", "--force", k}).output, "key=" + k + "\nwas_held=no\n");
}

// Who holds a lock and since when, from status and ls; the
// holder's connections carry its owner name.
TEST_F(CliTest, StatusNamesTheOwnerAndLsListsTheLocksHeld) {
  const std::string k = test_key();
  std::vector<std::string> holder_env = env();
  holder_env.push_back("LOCKWATCH_OWNER_NAME=batch host-7");
  auto holder = std::make_unique<ChildProcess>(
      cli_argv({"run", "--key", k + ":a", "--ttl", "5s", "-c", "echo ready; exec sleep 1000"}), holder_env);
  ASSERT_TRUE(read_until(*holder, "ready"));
  auto other = start({"run", "--key", k + ":b", "--ttl", "5s", "-c", "echo ready; exec sleep 1000"});
  ASSERT_TRUE(read_until(*other, "ready"));

  Outcome status = run({"status", k + ":a"});
  EXPECT_EQ(status.code, 0) << status.output;
  EXPECT_TRUE(contains(status.output, "\nkind=exclusive\nowner=batch host-7\nsince=20")) << status.output;
  auto held_for = status.output.find("\nheld_for_ms=");
  ASSERT_NE(held_for, std::string::npos) << status.output;
  EXPECT_LT(std::stol(status.output.substr(held_for + 13)), 5000) << status.output;
  EXPECT_TRUE(contains(status.output, "\nholder=")) << status.output;
  EXPECT_TRUE(contains(status.output, " batch host-7\n")) << "the holder line ends in the owner: " << status.output;

  Outcome ls = run({"ls", k + ":"});
  EXPECT_EQ(ls.code, 0) << ls.output;
  std::istringstream lines(ls.output);
  std::string header, a, b, extra;
  std::getline(lines, header);
  std::getline(lines, a);
  std::getline(lines, b);
  EXPECT_FALSE(std::getline(lines, extra)) << ls.output;
  EXPECT_EQ(header.rfind("KEY", 0), 0u) << ls.output;
  EXPECT_EQ(a.rfind(k + ":a ", 0), 0u) << ls.output;
  EXPECT_TRUE(contains(a, " exclusive ") && a.ends_with(" batch host-7")) << a;
  EXPECT_EQ(b.rfind(k + ":b ", 0), 0u) << ls.output;
  EXPECT_TRUE(b.ends_with(":lockwatch")) << "host:pid:program by default: " << b;

  Outcome json = run({"ls", "--json", k + ":"});
  EXPECT_EQ(json.code, 0) << json.output;
  EXPECT_EQ(json.output.rfind("[{\"key\":\"" + k + ":a\",\"kind\":\"exclusive\",\"owner\":\"batch host-7\"", 0), 0u)
      << json.output;
  EXPECT_TRUE(contains(json.output, "},{\"key\":\"" + k + ":b\"")) << json.output;
  // Bounded: the store's first lock (SCAN's order), and the limit reached is said.
  Outcome one = run({"ls", "--json", "--limit", "1", k + ":"});
  EXPECT_EQ(one.code, 0) << one.output;
  EXPECT_NE(contains(one.output, k + ":a"), contains(one.output, k + ":b")) << "--limit 1: " << one.output;
  EXPECT_TRUE(contains(one.output, "more may be held")) << one.output;

  // The connections name their owner (no spaces in a Redis client name).
  const Reply clients = server_->command({"CLIENT", "LIST"});
  EXPECT_TRUE(contains(clients.str, "name=lockwatch:batch_host-7 ")) << clients.str;

  holder->kill(SIGTERM);
  other->kill(SIGTERM);
  finish(*holder, Clock::now());
  finish(*other, Clock::now());
}

TEST_F(CliTest, ARunWhoseLockIsRemovedByReleaseForceGetsTheDefaultKillGrace) {
  const std::string k = test_key();
  auto started = Clock::now();
  // ttl 2 s: the default grace is half the drift allowance (2 s x 1% +
  // 2 ms), 11 ms; the key is found gone at the renewal 1.8 s on.
  auto holder = start({"run", "--key", k, "--ttl", "2s", "-c", "echo ready; exec sleep 1000"});
  ASSERT_TRUE(read_until(*holder, "ready"));
  EXPECT_EQ(run({"release", "--force", k}).code, 0);
  Outcome o = finish(*holder, started);
  EXPECT_EQ(o.code, 76) << o.output;
  EXPECT_TRUE(contains(o.output, "SIGKILL after 11ms")) << "not 0 s: " << o.output;
}

TEST_F(CliTest, TheStoreUrlHasOneNameAndTheRedisNamesAreDeprecatedAliases) {
  const std::string k = test_key();
  const std::string nowhere = "redis://127.0.0.1:" + std::to_string(free_loopback_port());
  const std::string free_lines = "key=" + k + "\nstate=free\nttl_ms=0\nfencing_token=0\n";
  // LOCKWATCH_STORE_URL (the suite's) wins over LOCKWATCH_REDIS_URL, with a warning when they differ.
  auto both = std::make_unique<ChildProcess>(cli_argv({"status", k}),
                                             std::vector<std::string>{"LOCKWATCH_STORE_URL=" + server_->url(),
                                                                      "LOCKWATCH_REDIS_URL=" + nowhere});
  Outcome o = finish(*both, Clock::now());
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_TRUE(contains(o.output, "warning: LOCKWATCH_REDIS_URL is the deprecated name of LOCKWATCH_STORE_URL"))
      << o.output;
  EXPECT_TRUE(contains(o.output, free_lines)) << o.output;
  EXPECT_FALSE(contains(o.output, nowhere)) << "no URL in messages (they may hold passwords)";
  // The old variable alone still works, silently.
  auto old_env = std::make_unique<ChildProcess>(cli_argv({"status", k}),
                                                std::vector<std::string>{"LOCKWATCH_STORE_URL=",
                                                                         "LOCKWATCH_REDIS_URL=" + server_->url()});
  o = finish(*old_env, Clock::now());
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_EQ(o.output, free_lines);
  // --store wins over --redis, with a warning when they differ.
  o = run({"status", "--store", server_->url(), "--redis", nowhere, k});
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_TRUE(contains(o.output, "warning: --redis is the deprecated name of --store")) << o.output;
  EXPECT_TRUE(contains(o.output, free_lines)) << o.output;
  o = run({"status", "--store", server_->url(), "--redis", server_->url(), k});
  EXPECT_EQ(o.output, free_lines) << "the same URL under both names: no warning";
  o = run({"status", "--redis", server_->url(), k});
  EXPECT_EQ(o.output, free_lines) << "the old option alone still works";
  // --help speaks of stores, not of Redis only.
  Outcome help = run({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_FALSE(contains(help.output, "on Redis")) << help.output;
  EXPECT_TRUE(contains(help.output, "PostgreSQL")) << help.output;
}

TEST_F(CliTest, ADatabaseTheServerDoesNotHaveIsAConfigurationErrorAtOnce) {
  // redis-server has 16 databases (0..15) by default.
  const std::string url = server_->url() + "/99";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"status", "--store", url, test_key()},
        std::vector<std::string>{"run", "--store", url, "--key", test_key(), "--wait", "10s", "--", "true"}}) {
    Outcome o = run(args);
    EXPECT_EQ(o.code, 64) << o.output;
    EXPECT_TRUE(contains(o.output, "SELECT 99 was refused")) << o.output;
    EXPECT_LT(o.took, 1500ms) << "not retried as unreachable for the connect timeout: " << o.output;
  }
  EXPECT_EQ(run({"status", "--store", server_->url() + "/15", test_key()}).code, 0) << "a database it has";
}

TEST_F(CliTest, RunsOverRedlock) {
  std::array<std::unique_ptr<RedisServer>, 3> nodes;
  std::string url;
  for (auto& n : nodes) {
    n = std::make_unique<RedisServer>();
    url += (url.empty() ? "" : ",") + n->url();
  }
  auto started = Clock::now();
  auto p = start({"run", "--redis", url, "--key", test_key(), "-c", "echo ready; exec sleep 1000"});
  ASSERT_TRUE(read_until(*p, "ready"));
  Outcome status = run({"status", "--redis", url, test_key()});
  EXPECT_TRUE(contains(status.output, "state=held")) << status.output;
  for (auto& n : nodes) EXPECT_EQ(n->command({"EXISTS", lock_key(test_key())}).integer, 1);
  p->kill(SIGTERM);
  EXPECT_EQ(finish(*p, started).code, 128 + SIGTERM);
  for (auto& n : nodes) EXPECT_EQ(n->command({"EXISTS", lock_key(test_key())}).integer, 0);
}

TEST_F(CliTest, RunsOverTlsWithTheCaFromTheEnvironment) {
  RedisServerOptions tls;
  tls.tls = RedisTls{};
  RedisServer secure(tls);
  std::vector<std::string> e = env();
  e.push_back("LOCKWATCH_TLS_CA_FILE=" + test_certificates().ca_cert);
  auto started = Clock::now();
  ChildProcess p(cli_argv({"run", "--redis", secure.url(), "--key", test_key(), "-c", "echo token=$LOCKWATCH_FENCING_TOKEN"}), e);
  Outcome o = finish(p, started);
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_TRUE(contains(o.output, "token=1")) << o.output;
  // Without the CA the server's certificate is not trusted: the store
  // cannot be reached, and the command does not run.
  Outcome untrusted = run({"run", "--redis", secure.url(), "--key", test_key(), "-c", "echo ran"});
  EXPECT_EQ(untrusted.code, 69) << untrusted.output;
  EXPECT_FALSE(contains(untrusted.output, "ran\n")) << untrusted.output;
}

#if LOCKWATCH_WITH_SQL
TEST_F(CliTest, RunsOverSql) {
  MariaDbServer db;
  auto started = Clock::now();
  auto p = start({"run", "--redis", db.url(), "--key", test_key(), "-c", "echo ready; exec sleep 1000"});
  ASSERT_TRUE(read_until(*p, "ready"));
  Outcome status = run({"status", "--redis", db.url(), test_key()});
  EXPECT_TRUE(contains(status.output, "state=held")) << status.output;
  EXPECT_TRUE(contains(status.output, "fencing_token=1")) << status.output;
  EXPECT_TRUE(contains(status.output, ":lockwatch\nsince=")) << "the owner name: " << status.output;
  Outcome ls = run({"ls", "--store", db.url(), test_key()});
  EXPECT_TRUE(contains(ls.output, "\n" + test_key() + " ")) << ls.output;
  p->kill(SIGTERM);
  EXPECT_EQ(finish(*p, started).code, 128 + SIGTERM);
  Outcome after = run({"status", "--redis", db.url(), test_key()});
  EXPECT_TRUE(contains(after.output, "state=free")) << after.output;
}
#endif

#if LOCKWATCH_WITH_POSTGRESQL
// --store is the store-neutral name of --redis: either takes any URL.
TEST_F(CliTest, RunsOverPostgresqlWithRedisOrStore) {
  PostgresServer db;
  auto started = Clock::now();
  auto p = start({"run", "--redis", db.url(), "--key", test_key(), "-c", "echo ready; exec sleep 1000"});
  ASSERT_TRUE(read_until(*p, "ready"));
  Outcome status = run({"status", "--store", db.url(), test_key()});
  EXPECT_TRUE(contains(status.output, "state=held")) << status.output;
  EXPECT_TRUE(contains(status.output, "fencing_token=1")) << status.output;
  EXPECT_TRUE(contains(status.output, ":lockwatch\nsince=")) << "the owner name: " << status.output;
  Outcome ls = run({"ls", "--store", db.url(), test_key()});
  EXPECT_TRUE(contains(ls.output, "\n" + test_key() + " ")) << ls.output;
  Outcome busy = run({"run", "--store", db.url(), "--key", test_key(), "-c", "echo ran"});
  EXPECT_EQ(busy.code, 75) << busy.output;
  EXPECT_FALSE(contains(busy.output, "ran\n")) << busy.output;
  p->kill(SIGTERM);
  EXPECT_EQ(finish(*p, started).code, 128 + SIGTERM);
  Outcome next = run({"run", "--store", db.url(), "--key", test_key(), "-c", "echo token=$LOCKWATCH_FENCING_TOKEN"});
  EXPECT_EQ(next.code, 0) << next.output;
  EXPECT_TRUE(contains(next.output, "token=2")) << next.output;
  Outcome after = run({"status", "--store", db.url(), test_key()});
  EXPECT_TRUE(contains(after.output, "state=free")) << after.output;
}
#endif

// ------------------------------------------------------- --once-per PERIOD

// The lines of $D/ran: one per run of the command.
int runs_recorded(const std::string& dir) {
  std::ifstream in(dir + "/ran");
  int n = 0;
  for (std::string line; std::getline(in, line);) n++;
  return n;
}

const std::string kRecordRun = "echo ran >> \"$D/ran\"";

TEST_F(CliTest, OncePerRunsTheCommandOncePerPeriodAcrossHosts) {
  Outcome first = run({"run", "--key", test_key(), "--once-per", "1d", "-c", kRecordRun});
  EXPECT_EQ(first.code, 0) << first.output;
  EXPECT_EQ(first.output, "");
  std::this_thread::sleep_for(1s);  // the second host's cron fires a second later
  Outcome second = run({"run", "--key", test_key(), "--once-per", "1d", "-c", kRecordRun});
  EXPECT_EQ(second.code, 79) << second.output;
  EXPECT_TRUE(contains(second.output, "was run already")) << second.output;
  EXPECT_TRUE(contains(second.output, "T00:00:00Z")) << "1d periods start at midnight UTC: " << second.output;
  Outcome quiet = run({"run", "--key", test_key(), "--once-per", "1d", "-q", "-c", kRecordRun});
  EXPECT_EQ(quiet.code, 0);
  EXPECT_EQ(quiet.output, "");
  EXPECT_EQ(runs_recorded(dir_), 1);
  EXPECT_FALSE(exists(*server_, test_key())) << "the lock was given back each time";
}

TEST_F(CliTest, OncePerRunsAgainInTheNextPeriod) {
  // 2 s periods on the server's clock (this machine's); each step starts
  // just after a period begins, so that its two runs fall in one period.
  const auto next_period = [] {
    auto now = std::chrono::system_clock::now();
    auto into = now.time_since_epoch() % 2s;
    std::this_thread::sleep_for(2s - into + 100ms);  // bounded: at most 2.1 s
  };
  next_period();
  EXPECT_EQ(run({"run", "--key", test_key(), "--once-per", "2s", "-c", kRecordRun}).code, 0);
  EXPECT_EQ(run({"run", "--key", test_key(), "--once-per", "2s", "-c", kRecordRun}).code, 79);
  next_period();
  Outcome next = run({"run", "--key", test_key(), "--once-per", "2s", "-c", kRecordRun});
  EXPECT_EQ(next.code, 0) << next.output;
  EXPECT_EQ(runs_recorded(dir_), 2);
}

TEST_F(CliTest, OncePerWithALongerPeriodThanTheKeysClaimsIsRefusedClearly) {
  EXPECT_EQ(run({"run", "--key", test_key(), "--once-per", "1h", "-c", kRecordRun}).code, 0);
  // Daily periods are numbered below the hourly one recorded: every day
  // would be found run already. Refused, saying why.
  Outcome longer = run({"run", "--key", test_key(), "--once-per", "1d", "-c", kRecordRun});
  EXPECT_EQ(longer.code, 64) << longer.output;
  EXPECT_TRUE(contains(longer.output, "claimed with another --once-per")) << longer.output;
  EXPECT_TRUE(contains(longer.output, "use a new key")) << longer.output;
  EXPECT_EQ(runs_recorded(dir_), 1);
  EXPECT_FALSE(exists(*server_, test_key())) << "the lock was given back";
  // A shorter period starts its own periods at once.
  Outcome shorter = run({"run", "--key", test_key(), "--once-per", "1m", "-c", kRecordRun});
  EXPECT_EQ(shorter.code, 0) << shorter.output;
  EXPECT_EQ(runs_recorded(dir_), 2);
}

TEST_F(CliTest, OncePerWithACronExpressionClaimsItsLatestFireTime) {
  // Every minute: the current period began at this minute's start. Both
  // runs fall in one minute (started early enough in it).
  auto into = std::chrono::system_clock::now().time_since_epoch() % 60s;
  if (into > 50s) std::this_thread::sleep_for(60s - into + 100ms);  // bounded: at most 10.1 s
  Outcome first = run({"run", "--key", test_key(), "--once-per", "* * * * *", "-c", kRecordRun});
  EXPECT_EQ(first.code, 0) << first.output;
  Outcome again = run({"run", "--key", test_key(), "--once-per", "* * * * *", "-c", kRecordRun});
  EXPECT_EQ(again.code, 79) << again.output;
  EXPECT_TRUE(contains(again.output, ":00Z")) << "a fire time, at a minute's start: " << again.output;
  EXPECT_EQ(runs_recorded(dir_), 1);
}

TEST_F(CliTest, AHostThatWaitsForARunningPeriodFindsItRunAndExits79) {
  auto started = Clock::now();
  auto first = start({"run", "--key", test_key(), "--once-per", "1d", "-c",
                      kRecordRun + "; echo ready; while [ ! -e \"$D/go\" ]; do sleep 0.01; done"});
  ASSERT_TRUE(read_until(*first, "ready"));
  auto second = start({"run", "--key", test_key(), "--once-per", "1d", "--wait", "20s", "-c", kRecordRun});
  ASSERT_TRUE(wait_for_subscriber());
  std::ofstream(dir_ + "/go") << "go\n";
  EXPECT_EQ(finish(*first, started).code, 0);
  Outcome o = finish(*second, started);
  EXPECT_EQ(o.code, 79) << o.output;
  EXPECT_EQ(runs_recorded(dir_), 1);
}

#if LOCKWATCH_WITH_SQL
TEST_F(CliTest, OncePerOverSql) {
  MariaDbServer db;
  Outcome first = run({"run", "--redis", db.url(), "--key", test_key(), "--once-per", "1d", "-c", kRecordRun});
  EXPECT_EQ(first.code, 0) << first.output;
  Outcome second = run({"run", "--redis", db.url(), "--key", test_key(), "--once-per", "1d", "-c", kRecordRun});
  EXPECT_EQ(second.code, 79) << second.output;
  EXPECT_EQ(runs_recorded(dir_), 1);
}
#endif

TEST_F(CliTest, BadPeriodsExit64WithoutRunningTheCommand) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"1x", "unknown unit 'x'"},
      {"0s", "a period must be positive"},
      {"0 3 * *", "it has 4 fields, not 5"},
      {"61 3 * * *", "minute"},
  };
  for (const auto& [period, message] : cases) {
    Outcome o = run({"run", "--key", test_key(), "--once-per", period, "-c", kRecordRun});
    EXPECT_EQ(o.code, 64) << period << ": " << o.output;
    EXPECT_TRUE(contains(o.output, message)) << period << ": expected '" << message << "' in\n" << o.output;
  }
  EXPECT_EQ(runs_recorded(dir_), 0);
}

// --help ends with the store URL forms as the library lists them, one a line.
TEST_F(CliTest, HelpEndsWithEveryStoresUrlFormFromTheLibrary) {
  Outcome o = run({"--help"});
  EXPECT_EQ(o.code, 0);
  const std::vector<std::string> forms = store_url_forms();
  ASSERT_EQ(forms.size(), 7u);
  EXPECT_TRUE(contains(o.output, "\nStore URLs (--store):\n")) << o.output;
  for (const std::string& form : forms) EXPECT_TRUE(contains(o.output, "\n  " + form + "\n")) << form << "\n" << o.output;
}

TEST_F(CliTest, VersionPrintsTheProjectsVersion) {
  Outcome o = run({"--version"});
  EXPECT_EQ(o.code, 0);
  EXPECT_EQ(o.output, std::string("lockwatch ") + LOCKWATCH_VERSION + "\n");
}

}  // namespace
}  // namespace lockwatch::testing
