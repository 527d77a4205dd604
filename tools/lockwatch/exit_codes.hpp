// tools/lockwatch/exit_codes.hpp: what `lockwatch` exits with, besides the
// command's own status (and 128+N when the command died of signal N). The
// values follow sysexits.h and timeout(1), so scripts and cron can tell a
// busy lock from a failed job. kRunExitStatus is the one text of the table
// that --help, the man page and docs/cli.md show.
#pragma once

namespace lockwatch::cli {

inline constexpr int kExitUsage = 64;           // EX_USAGE: bad arguments
inline constexpr int kExitUnavailable = 69;     // EX_UNAVAILABLE: the store could not be reached, or refused us
inline constexpr int kExitInternal = 70;        // EX_SOFTWARE: lockwatch itself failed
inline constexpr int kExitBusy = 75;            // EX_TEMPFAIL: busy past --wait (-E changes it, -q makes it 0)
inline constexpr int kExitLeaseLost = 76;       // the lease was lost while the command ran
inline constexpr int kExitAlreadyRun = 79;      // --once-per: the period was run already (-q makes it 0)
inline constexpr int kExitCannotExecute = 126;  // the command exists but could not be executed
inline constexpr int kExitNotFound = 127;       // the command was not found

// One row of the table: `code`, or `label` for the rows that are not one
// number (label set, code 0).
struct ExitStatusDoc {
  int code;
  const char* label;
  const char* meaning;
};

inline constexpr ExitStatusDoc kRunExitStatus[] = {
    {0, "the command's own", "it ran and the lease was kept"},
    {0, "128+N", "the command died of signal N"},
    {kExitBusy, nullptr, "busy past --wait (-E CODE changes it, -q makes it 0)"},
    {kExitLeaseLost, nullptr, "the lease was lost while the command ran, and the command was stopped"},
    {kExitAlreadyRun, nullptr, "--once-per: the period was run already, here or on another host (-q makes it 0)"},
    {kExitUnavailable, nullptr, "the store could not be reached, or refused the credentials or the request"},
    {kExitUsage, nullptr, "usage error (also a store this build left out, or one without period claims)"},
    {kExitInternal, nullptr, "internal error"},
    {0, "126 / 127", "the command could not be executed / was not found"},
};

// What the command finds in its environment.
struct EnvironmentDoc {
  const char* name;
  const char* meaning;
};

inline constexpr EnvironmentDoc kCommandEnvironment[] = {
    {"LOCKWATCH_KEY", "the lock's name (--key)"},
    {"LOCKWATCH_FENCING_TOKEN", "the lease's fencing token: pass it to every write the command makes"},
    {"LOCKWATCH_TTL_MS", "the lease's ttl in milliseconds"},
};

}  // namespace lockwatch::cli
