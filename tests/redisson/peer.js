// The other side of tests/redisson_test.cpp: node-redisson's RLock, driven
// one line at a time through stdin, answering one line per command on
// stdout (commands run concurrently; answers carry the command's id).
//
//   node peer.js single PORT | cluster PORT[,PORT...]   [WATCHDOG_MS]
//
//   lock ID NAME LEASE_MS       lock() (LEASE_MS 0: the watchdog renews)
//                               -> "locked ID"
//   try ID NAME WAIT_MS LEASE_MS
//                               tryLock() -> "try ID true|false"
//   unlock ID NAME              unlock() -> "unlocked ID" | "unlock-error ID ..."
//   quit                        disconnects and exits
//
// Besides the answers: "listening CHANNEL" when a waiter's listener for a
// lock's channel is in place (below).
//
// One lock object per name, so a second lock on a name is a reentrant one
// (the same owner field). Prints "ready" once connected.
'use strict';
const readline = require('node:readline');
const { Redisson, TimeUnit } = require('node-redisson');

const [mode, ports, watchdog] = process.argv.slice(2);
const nodes = ports.split(',').map((p) => ({ host: '127.0.0.1', port: Number(p) }));
const redis = mode === 'cluster' ? { clusters: nodes, options: {} } : { options: nodes[0] };
const redisson = new Redisson({ redis, lockWatchdogTimeout: BigInt(watchdog || 30000) });
const locks = new Map();
const lockOf = (name) => {
  if (!locks.has(name)) locks.set(name, redisson.getLock(name));
  return locks.get(name);
};
const say = (line) => process.stdout.write(line + '\n');
// A waiter's listener for its lock's channel is in place: "listening
// CHANNEL". node-redisson adds it only once its SUBSCRIBE's answer is read,
// and misses an unlock message that comes before: a test releases after
// this line, not after the server counts the subscriber.
redisson.commandExecutor.eventEmitter.on('newListener', (channel) => say(`listening ${String(channel)}`));
const lease = (ms) => (Number(ms) > 0 ? Number(ms) : true);

async function run(words) {
  const [cmd, id, name] = words;
  try {
    if (cmd === 'lock') {
      await lockOf(name).lock(lease(words[3]), TimeUnit.MILLISECONDS);
      say(`locked ${id}`);
    } else if (cmd === 'try') {
      const got = await lockOf(name).tryLock(Number(words[3]), lease(words[4]), TimeUnit.MILLISECONDS);
      say(`try ${id} ${got}`);
    } else if (cmd === 'unlock') {
      await lockOf(name).unlock();
      say(`unlocked ${id}`);
    } else if (cmd === 'quit') {
      await redisson.quit();
      process.exit(0);
    } else {
      say(`error ${id} unknown command ${cmd}`);
    }
  } catch (e) {
    say(`${cmd}-error ${id} ${String(e && e.message).replace(/\s+/g, ' ')}`);
  }
}

(async () => {
  await redisson.redis.ping();
  await redisson.commandExecutor.subscribeRedis.ping();
  say('ready');
  const rl = readline.createInterface({ input: process.stdin });
  const pending = new Set();
  rl.on('line', (line) => {
    const words = line.trim().split(/\s+/);
    if (!words[0]) return;
    const p = run(words).finally(() => pending.delete(p));
    pending.add(p);
  });
  // The test closing stdin (or dying) ends the peer once what it asked
  // for is answered.
  rl.on('close', async () => {
    await Promise.allSettled([...pending]);
    await redisson.quit();
    process.exit(0);
  });
})().catch((e) => {
  say(`fatal ${String(e && e.message)}`);
  process.exit(1);
});
