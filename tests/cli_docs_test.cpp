// The man page lockwatch(1) and the bash completion, as built (their paths
// in LOCKWATCH_MAN, LOCKWATCH_BASH_COMPLETION), against what `lockwatch
// --help` lists: every option of every subcommand is in both, the
// completion completes, the man page renders without warnings, and the
// page on the command (docs/cli.md) names every option and exit status.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "exit_codes.hpp"

namespace {

std::string env_path(const char* name) {
  const char* p = std::getenv(name);
  if (p == nullptr) throw std::runtime_error(std::string(name) + " is not set (tests/meson.build sets it)");
  return p;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct Result {
  int code = -1;
  std::string output;
};

// Runs `command` with /bin/sh, its standard output read whole.
Result shell(const std::string& command) {
  Result r;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed");
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string sh_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The options `lockwatch ARGS --help` lists under "Options:": -h, --help, ...
std::set<std::string> options_in_help(const std::string& args) {
  Result help = shell(sh_quoted(env_path("LOCKWATCH_CLI")) + " " + args + " --help");
  EXPECT_EQ(help.code, 0) << args;
  std::set<std::string> out;
  std::istringstream lines(help.output);
  bool in_options = false;
  static const std::regex kOption(R"(^  (-[^ ]+))");
  for (std::string line; std::getline(lines, line);) {
    if (line == "Options:") {
      in_options = true;
      continue;
    }
    if (!in_options) continue;
    if (line.empty() || line[0] != ' ') {
      in_options = false;  // the section ends at a blank line or the next heading
      continue;
    }
    std::smatch m;
    if (!std::regex_search(line, m, kOption)) continue;
    std::string names = m[1];
    std::istringstream parts(names);
    for (std::string n; std::getline(parts, n, ',');) {
      auto brace = n.find('{');
      out.insert(brace == std::string::npos ? n : n.substr(0, brace));
    }
  }
  return out;
}

const char* const kHelpScopes[] = {"", "run", "status", "release", "ls"};

// How troff writes an option: every hyphen escaped.
std::string in_roff(const std::string& option) {
  std::string out;
  for (char c : option) out += c == '-' ? std::string("\\-") : std::string(1, c);
  return out;
}

TEST(CliDocsTest, HelpListsTheOptionsItShould) {
  auto run = options_in_help("run");
  for (const char* o : {"-h", "--help", "--redis", "--key", "--once-per", "-q", "-c", "--command"})
    EXPECT_TRUE(run.count(o)) << o << " not found in run --help";
  EXPECT_TRUE(options_in_help("").count("--version"));
}

TEST(CliDocsTest, EveryOptionHelpListsIsInTheManPage) {
  const std::string man = read_file(env_path("LOCKWATCH_MAN"));
  for (const char* scope : kHelpScopes) {
    for (const auto& option : options_in_help(scope)) {
      EXPECT_NE(man.find("\\fB" + in_roff(option) + "\\fR"), std::string::npos)
          << "lockwatch " << scope << " " << option << " is not in the man page";
    }
  }
  for (const auto& row : lockwatch::cli::kRunExitStatus) {
    std::string status = row.label ? row.label : std::to_string(row.code);
    EXPECT_NE(man.find(".TP\n\\fB" + in_roff(status) + "\\fR"), std::string::npos) << "exit status " << status;
  }
  EXPECT_NE(man.find("lockwatch " LOCKWATCH_TEST_VERSION), std::string::npos) << "the version is in the header";
}

TEST(CliDocsTest, EveryOptionHelpListsIsInTheCompletion) {
  const std::string completion = read_file(env_path("LOCKWATCH_BASH_COMPLETION"));
  for (const char* scope : kHelpScopes) {
    for (const auto& option : options_in_help(scope)) {
      std::regex word("[' ]" + std::regex_replace(option, std::regex("-"), "\\-") + "[' ]");
      EXPECT_TRUE(std::regex_search(completion, word)) << "lockwatch " << scope << " " << option
                                                       << " is not in the completion";
    }
  }
}

// What the completion offers for the words of a command line, the last
// being completed.
std::string complete(const std::vector<std::string>& words) {
  std::string array;
  for (const auto& w : words) array += " " + sh_quoted(w);
  std::string script = "source " + sh_quoted(env_path("LOCKWATCH_BASH_COMPLETION")) + "; COMP_WORDS=(" + array +
                       "); COMP_CWORD=" + std::to_string(words.size() - 1) +
                       "; _lockwatch; for w in \"${COMPREPLY[@]}\"; do echo \"$w\"; done | LC_ALL=C sort | tr '\\n' ' '";
  Result r = shell("bash --norc --noprofile -c " + sh_quoted(script));
  EXPECT_EQ(r.code, 0) << script;
  return r.output;
}

TEST(CliDocsTest, TheCompletionCompletesSubcommandsOptionsAndTheCommand) {
  EXPECT_EQ(complete({"lockwatch", ""}), "--help --version -h ls release run status ");
  EXPECT_EQ(complete({"lockwatch", "st"}), "status ");
  EXPECT_EQ(complete({"lockwatch", "run", "--once"}), "--once-per ");
  EXPECT_EQ(complete({"lockwatch", "release", "--f"}), "--force ");
  EXPECT_EQ(complete({"lockwatch", "run", "--key", ""}), "") << "a value is the user's";
  EXPECT_NE(complete({"lockwatch", "run", "--key", "k", "--", "bas"}).find("bash "), std::string::npos)
      << "after --, the command";
  EXPECT_NE(complete({"lockwatch", "run", "-c", "bas"}).find("bash "), std::string::npos);
}

TEST(CliDocsTest, TheManPageRendersWithoutWarnings) {
  Result r = shell("MANWIDTH=80 man --warnings -E UTF-8 -l " + sh_quoted(env_path("LOCKWATCH_MAN")) +
                   " 2>&1 >/dev/null");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "") << "man's warnings";
  Result text = shell("MANWIDTH=80 man -E UTF-8 -l " + sh_quoted(env_path("LOCKWATCH_MAN")) + " 2>/dev/null");
  EXPECT_NE(text.output.find("EXIT STATUS"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("--once-per PERIOD"), std::string::npos) << text.output;
}

TEST(CliDocsTest, TheCommandsPageNamesEveryOptionAndExitStatusOfTheCommand) {
  const std::string section = read_file(env_path("LOCKWATCH_CLI_DOC"));
  ASSERT_NE(section.find("# The `lockwatch` command"), std::string::npos);
  for (const char* scope : kHelpScopes) {
    for (const auto& option : options_in_help(scope)) {
      if (option == "-h") continue;  // --help stands for both
      EXPECT_NE(section.find("`" + option), std::string::npos) << "lockwatch " << scope << " " << option;
    }
  }
  for (const auto& row : lockwatch::cli::kRunExitStatus) {
    std::string status = row.label ? row.label : std::to_string(row.code);
    EXPECT_NE(section.find("| " + status + " |"), std::string::npos) << "exit status " << status;
  }
}

}  // namespace
