// tools/lockwatch/exit_codes.hpp: what `lockwatch` exits with, besides the
// command's own status (and 128+N when the command died of signal N). The
// values follow sysexits.h and timeout(1), so scripts and cron can tell a
// busy lock from a failed job.
#pragma once

namespace lockwatch::cli {

inline constexpr int kExitUsage = 64;           // EX_USAGE: bad arguments
inline constexpr int kExitUnavailable = 69;     // EX_UNAVAILABLE: the store could not be reached, or refused us
inline constexpr int kExitInternal = 70;        // EX_SOFTWARE: lockwatch itself failed
inline constexpr int kExitBusy = 75;            // EX_TEMPFAIL: busy past --wait (-E changes it, -q makes it 0)
inline constexpr int kExitLeaseLost = 76;       // the lease was lost while the command ran
inline constexpr int kExitCannotExecute = 126;  // the command exists but could not be executed
inline constexpr int kExitNotFound = 127;       // the command was not found

}  // namespace lockwatch::cli
