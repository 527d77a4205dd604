/// @file
/// lockwatch/lockwatch.hpp: everything a user of lockwatch includes.
#pragma once

#include "lockwatch/election.hpp"
#include "lockwatch/errors.hpp"
#include "lockwatch/key_pattern.hpp"
#include "lockwatch/lease.hpp"
#include "lockwatch/lock_handle.hpp"
#include "lockwatch/lock_key.hpp"
#include "lockwatch/lock_kind.hpp"
#include "lockwatch/lock_request.hpp"
#include "lockwatch/locked.hpp"
#include "lockwatch/locked_work.hpp"
#include "lockwatch/mutex.hpp"
#include "lockwatch/observer.hpp"
#include "lockwatch/options.hpp"
#include "lockwatch/runtime.hpp"
#include "lockwatch/scheduler.hpp"
#include "lockwatch/thread_pool.hpp"
#include "lockwatch/timer_wheel.hpp"
