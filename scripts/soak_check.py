#!/usr/bin/env python3
"""Checks the history a fault soak recorded (scripts/soak).

  scripts/soak_check.py DIR          check a run; the last line is
                                     "soak: <ops> ops, <faults> faults, <violations> violations"
                                     and the exit status is 0 only with no violation
  scripts/soak_check.py --self-test  show that each kind of violation is caught,
                                     on hand-made histories

DIR is what tests/soak/soak.py leaves: meta.json, hist/<process>.jsonl (the
workers' histories), procs.jsonl, faults.jsonl, resource.json,
locks_end.json and locks_later.json.

The resource is a redis-server no fault touches. Every read and write
there takes the key's next operation number (#n); a write carries the
writer's fencing token and its lease deadline on the wall clock, and is
refused if it arrives after that deadline ("late": a holder paused past
its lease; expected) or with a token below the highest accepted
("stale"). The resource logs accepted writes and refusals itself. Each
lease (one locked call) reads the counter, sleeps, writes it plus one.

Violations, and why each means the library broke a promise:
  interleave      two leases' accepted read/write pairs overlap in the
                  resource's order (a lease read before another's write and
                  wrote after it), or a lease wrote again after another
                  lease wrote. Both writes arrived within their writers'
                  lease deadlines, so two leases were valid at once.
  stale-write     a write made within its lease deadline was refused: a
                  higher token had written while this lease was valid.
  two-holders     two calls on one key that both ended well (never lost,
                  released while the key was still theirs on a majority)
                  overlapped between being handed the lease and their work
                  returning. A key cannot come back once gone (renewal and
                  release check the owner), so each held it throughout.
  token-order     the resource accepted a lower token after a higher one;
                  two leases of one key got the same token; or a call that
                  started after another lease had been granted got a token
                  no higher than that lease's.
  rw-overlap      on the read-write key "rw", a writer that ended well
                  overlapped another holder that ended well (a reader or
                  a writer), between being handed its lease and its work
                  returning. Readers may overlap each other.
  over-admission  on the semaphore key "sem", more holders that ended well
                  held a permit at one time than there are permits.
  lost-increment  the counter differs from the number of accepted writes.
  history         the workers' record of a write disagrees with the
                  resource's log (the checker's inputs are not coherent).
  unended         a call began in a process that was not killed and never
                  ended; hang: a worker gave up on a call or on exiting.
  over-bound      a call took longer than its bound (wait + acquire,
                  work and release timeouts + ttl), not counting the time
                  its process was stopped by the soak.
  worker          a worker process crashed, or had to be killed at the end.
  released-held   a release reported done, yet the owner token was still
                  in Redis right after it (on a majority of Redlock nodes;
                  with Sentinel on the master the sentinels name, checked
                  only if no failover happened during the call, as a stale
                  old master may keep keys; on a Redis Cluster on the master
                  of the key's slot, checked only if the same node answered
                  before and after; on SQL the lock row, held while it has
                  an owner and its expiry is ahead), or when the workers had
                  ended (on every master; SQL: the rows held); or a lock key
                  without expiry. A release that handed the lock on in its
                  process (another call with the same owner token was
                  handed the lease when this one's work ended) leaves the
                  token held by that call, and is not counted.
  told-late       a holder cut off alone from the lock servers, both ways
                  or its requests dropped (--nemesis partition: its clock
                  and CPU intact), was told its lease
                  was lost (the lease's stop token) less than the drift
                  allowance (ttl * drift_factor + drift_floor, at their
                  defaults; the watchdog sets a deadline a tick early so
                  that the tick judging it comes by then) before the next
                  holder of the key was handed it, or after. For every lease lost the report gives
                  that margin per fault ("margin <topology>/<fault>").
  outlived        a lock key still existed a ttl after every worker ended.
  scan            the lock nodes could not be read at the end.
  incomplete      the soak itself did not run to its end.
"""
import copy
import glob
import json
import os
import re
import sys
from collections import defaultdict, namedtuple

LogEntry = namedtuple("LogEntry", "n tok lease rseq value now")
Refusal = namedtuple("Refusal", "n tok lease rseq why hi now dl")
SHOW = 8  # violations printed per kind
SEM_PERMITS = 2  # the soak worker's semaphore (kSemPermits)


def load(d):
    run = {"meta": {}, "events": [], "procs": [], "faults": [], "resource": {}, "scan_end": [],
           "scan_later": [], "unreadable": []}

    def read_json(name, default):
        try:
            with open(os.path.join(d, name)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return default

    def read_lines(path):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return []
        out = []
        for i, line in enumerate(lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                # A process killed mid-line leaves at most its last line cut.
                if i != len(lines) - 1:
                    run["unreadable"].append("%s line %d" % (os.path.basename(path), i + 1))
        return out

    run["meta"] = read_json("meta.json", {})
    run["resource"] = read_json("resource.json", {})
    run["scan_end"] = read_json("locks_end.json", [])
    run["scan_later"] = read_json("locks_later.json", [])
    run["procs"] = read_lines(os.path.join(d, "procs.jsonl"))
    run["faults"] = read_lines(os.path.join(d, "faults.jsonl"))
    for path in sorted(glob.glob(os.path.join(d, "hist", "*.jsonl"))):
        run["events"] += read_lines(path)
    return run


def _overlap(intervals, a, b):
    return sum(max(0, min(b, t1) - max(a, t0)) for t0, t1 in intervals)


def check(run):
    """Returns (stats, violations): violations as (kind, text)."""
    V = []

    def bad(kind, text):
        V.append((kind, text))

    meta = run["meta"]
    if not meta.get("completed"):
        bad("incomplete", meta.get("error", "the soak did not run to its end (no complete meta.json)"))
    for where in run["unreadable"]:
        bad("history", "unreadable history line: " + where)
    need_held = meta.get("majority", 1) if meta.get("topology") == "redlock" else 1

    begins, ends, writes = {}, {}, []
    for e in run["events"]:
        kind = e.get("e")
        if kind == "b":
            begins[e["op"]] = e
        elif kind == "c":
            ends[e["op"]] = e
        elif kind == "w":
            writes.append(e)
        elif kind == "hang":
            bad("hang", "%s: %s did not end; the worker gave up" % (e.get("op"), e.get("what")))
    procs = {p["w"]: p for p in run["procs"]}
    stops = defaultdict(list)
    for f in run["faults"]:
        if f.get("kind") in ("holder_stop", "holder_starve"):
            stops[f["w"]].append((f["t0"], f["t1"]))
    # A worker on a faked clock (--nemesis clock) times its waits on it.
    fake = {p["w"] for p in run["procs"] if p.get("fake")}

    # -- every call ends, within its bound
    slowest = (0.0, None)
    for p in run["procs"]:
        if p["how"] in ("crashed", "timeout"):
            bad("worker", "worker %s (pid %s) %s, exit status %s" % (p["w"], p["pid"], p["how"], p["rc"]))
    for op, b in sorted(begins.items()):
        w = op.split(".")[0]
        c = ends.get(op)
        if c is None:
            if procs.get(w, {}).get("how") != "killed":
                bad("unended", "%s (%s, %s api) began and never ended" % (op, b["k"], b["api"]))
            continue
        took = c["t1"] - b["t"] - _overlap(stops[w], b["t"], c["t1"])
        slowest = max(slowest, (took / (b["bound"] * 10**6), "%s took %.2f s of its %.1f s bound (%s)"
                                % (op, took / 1e9, b["bound"] / 1e3, c["out"])), key=lambda x: x[0])
        if took > b["bound"] * 10**6 and w not in fake:
            bad("over-bound", "%s (%s, %s api, ttl %d, wait %d) took %.1f s, bound %.1f s, outcome %s"
                % (op, b["k"], b["api"], b["ttl"], b["wait"], took / 1e9, b["bound"] / 1e3, c["out"]))

    # -- the resource: no interleaving, tokens never down, no lost increment
    logs, refusals = {}, {}
    accepted = late = stale = 0
    for k, r in sorted(run["resource"].items()):
        log = sorted((LogEntry(int(a), int(b), c, int(d), int(e), int(f))
                      for a, b, c, d, e, f in (x.split(" ") for x in r["log"])), key=lambda x: x.n)
        refused = [Refusal(int(a), int(b), c, int(d), e, int(f), int(g), int(h))
                   for a, b, c, d, e, f, g, h in (x.split(" ") for x in r["refused"])]
        logs.update(((k, x.n), x) for x in log)
        refusals.update(((k, x.n), x) for x in refused)
        accepted += len(log)
        count, n_acc = int(r["hash"].get("count", 0)), int(r["hash"].get("accepted", 0))
        if not count == n_acc == len(log):
            bad("lost-increment", "%s: counter %d after %d accepted writes (%d logged)" % (k, count, n_acc, len(log)))
        closed = set()
        for prev, x in zip([None] + log, log):
            if prev is None:
                continue
            if x.tok < prev.tok:
                bad("token-order", "%s: token %d (%s) accepted at #%d after token %d (%s) at #%d"
                    % (k, x.tok, x.lease, x.n, prev.tok, prev.lease, prev.n))
            if x.lease != prev.lease:
                closed.add(prev.lease)
                if x.rseq < prev.n:
                    bad("interleave", "%s: %s (token %d) read at #%d, %s (token %d) wrote at #%d, then %s wrote at #%d"
                        % (k, x.lease, x.tok, x.rseq, prev.lease, prev.tok, prev.n, x.lease, x.n))
            if x.lease in closed:
                bad("interleave", "%s: %s (token %d) wrote at #%d after %s (token %d) had written at #%d"
                    % (k, x.lease, x.tok, x.n, prev.lease, prev.tok, prev.n))
        for y in refused:
            if y.why == "late":
                late += 1
            else:
                stale += 1
                bad("stale-write", "%s: %s wrote with token %d at #%d within its lease (deadline %d us, arrived %d us) "
                    "and was refused: token %d had written" % (k, y.lease, y.tok, y.n, y.dl, y.now, y.hi))

    # -- the workers' record agrees with the resource's
    for w in writes:
        if w["res"] not in ("ok", "late", "stale"):
            continue  # no answer: the log alone says what happened
        table = logs if w["res"] == "ok" else refusals
        entry = table.get((w["k"], w["seq"]))
        if entry is None or entry.lease != w["op"] or entry.tok != w["tok"]:
            bad("history", "%s: write #%d reported %s by %s, the resource logged %s"
                % (w["k"], w["seq"], w["res"], w["op"], entry))

    # Calls of the other kinds of lock (--kinds): readers share the last
    # writer's token, and permits are held by several at once. They are
    # judged below; the checks of exclusive locks see writers and permits
    # only where those rules hold (tokens), or not at all (one holder).
    def kind_of(op):
        return (begins.get(op) or ends.get(op) or {}).get("kind", "")

    # -- tokens in real time: granted before another call began => lower
    leases = {}
    for op, c in ends.items():
        if kind_of(op) == "reader":
            continue
        if c["tok"] > 0 and c["acq"] > 0:
            leases[op] = (c["k"], begins[op]["t"] if op in begins else c["t0"], c["acq"], c["tok"])
    for w in writes:  # calls of killed workers: granted before their first read
        if w["op"] not in leases and w["op"] in begins and "r0" in w:
            leases[w["op"]] = (w["k"], begins[w["op"]]["t"], w["r0"], w["tok"])
        elif w["op"] in leases and w["op"] not in ends:
            k, t0, acq, tok = leases[w["op"]]
            leases[w["op"]] = (k, t0, min(acq, w.get("r0", acq)), tok)
    by_key = defaultdict(list)
    for op, (k, t0, acq, tok) in leases.items():
        by_key[k].append((op, t0, acq, tok))
    for k, ls in sorted(by_key.items()):
        seen = {}
        for op, _, _, tok in ls:
            if tok in seen:
                bad("token-order", "%s: %s and %s were both granted token %d" % (k, seen[tok], op, tok))
            seen[tok] = op
        granted = sorted(ls, key=lambda x: x[2])
        i, top = 0, None
        for op, t0, _, tok in sorted(ls, key=lambda x: x[1]):
            while i < len(granted) and granted[i][2] < t0:
                if top is None or granted[i][3] > top[3]:
                    top = granted[i]
                i += 1
            if top is not None and top[3] >= tok and top[0] != op:
                bad("token-order", "%s: %s began after %s was granted token %d, and got token %d"
                    % (k, op, top[0], top[3], tok))

    # -- calls that ended well held their key alone
    done = defaultdict(list)
    kinds_done = defaultdict(list)
    for op, c in ends.items():
        if c["out"] == "ok" and c["acq"] > 0 and c.get("wend", 0) > 0:
            if kind_of(op):
                kinds_done[c["k"]].append((c["acq"], c["wend"], op, kind_of(op)))
            else:
                done[c["k"]].append((c["acq"], c["wend"], op))
    # -- a writer alone; no more permit holders than permits
    for k, ls in sorted(kinds_done.items()):
        writers = [x for x in ls if x[3] == "writer"]
        for acq, wend, op, _ in writers:
            for acq2, wend2, op2, kind2 in ls:
                if op2 != op and acq2 < wend and acq < wend2:
                    bad("rw-overlap", "%s: writer %s held it from %.3f s to %.3f s, and %s %s from %.3f s to "
                        "%.3f s; both ended well" % (k, op, acq / 1e9, wend / 1e9, kind2, op2, acq2 / 1e9, wend2 / 1e9))
        permits = sorted((x for x in ls if x[3] == "permit"), key=lambda x: x[0])
        held = []  # (wend, op) of the permit holders at the time
        for acq, wend, op, _ in permits:
            held = [h for h in held if h[0] > acq] + [(wend, op)]
            if len(held) > SEM_PERMITS:
                bad("over-admission", "%s: %d holders at %.3f s (%s), %d permits; all ended well"
                    % (k, len(held), acq / 1e9, ", ".join(sorted(o for _, o in held)), SEM_PERMITS))
    for k, ls in sorted(done.items()):
        ls.sort()
        last = None  # the lease whose work ended last so far
        for acq, wend, op in ls:
            if last is not None and acq < last[1]:
                bad("two-holders", "%s: %s held it from %.3f s to %.3f s, and %s was handed it at %.3f s; "
                    "both ended well" % (k, last[2], last[0] / 1e9, last[1] / 1e9, op, acq / 1e9))
            if last is None or wend > last[1]:
                last = (acq, wend, op)

    # -- a lock reported released is not held in Redis
    # ... unless it was handed on in its process (Options::handoff.enabled):
    # the next local holder keeps the store's key under the same owner
    # token, handed the lease when this call's work ended (whether that
    # call then kept it or lost it).
    handed_on = defaultdict(list)  # owner token: when each of its calls was handed the lease
    for op, c in ends.items():
        if c["out"] in ("ok", "lost") and c["owner"] and c["acq"] > 0:
            handed_on[c["owner"]].append((c["acq"], op))
    released = {}
    probed = 0
    # Calls made while their process was cut off (--nemesis partition): a
    # request sent in the cut takes effect when TCP delivers it after the
    # cut heals, later than the runtime counts from (its send time), so a
    # release it could not confirm may be reported done up to that delay
    # before the key expires. Shown apart (see docs/guarantees.md): the
    # key is still this holder's, no one else's.
    cuts = defaultdict(list)
    for f in run["faults"]:
        if f.get("kind", "").startswith("holder_cut"):
            cuts[f["w"]].append((f["t0"], f["t1"]))
        for w in filter(None, f.get("ws", "").split(",")):
            # A server cut off from its peers (--nemesis partition on etcd,
            # ZooKeeper, Cluster): every worker's calls may have met the cut.
            cuts[w].append((f["t0"], f["t1"]))
    after_cut = 0
    for op, c in ends.items():
        if c["out"] == "ok" and c["owner"]:
            released[c["owner"]] = op
            probed += c["answered"] > 0
            if any(o != op and acq >= c.get("wend", 0) > 0 for acq, o in handed_on[c["owner"]]):
                continue
            if c["held"] >= need_held and any(t0 <= c["t1"] and c["t0"] <= t1 for t0, t1 in cuts[op.split(".")[0]]):
                after_cut += 1
            elif c["held"] >= need_held:
                bad("released-held", "%s: %s reported its release done, yet %d of %d nodes still held its owner "
                    "token right after" % (c["k"], op, c["held"], c["nodes"]))
    for name, scan in (("end", run["scan_end"]), ("later", run["scan_later"])):
        if not scan:
            if meta.get("completed"):
                bad("scan", "no scan of the lock nodes at the %s" % name)
            continue
        holders = defaultdict(int)
        for node in scan:
            if not node["ok"]:
                bad("scan", "%s scan of %s failed: %s" % (name, node["node"], node.get("error")))
                continue
            for key in node["keys"]:
                if key["pttl"] is not None and key["pttl"] < 0:
                    bad("released-held", "%s on %s has no expiry (pttl %s)" % (key["key"], node["node"], key["pttl"]))
                holders[key["value"]] += 1
                if name == "later":
                    bad("outlived", "%s on %s still exists a ttl after every worker ended" % (key["key"], node["node"]))
        if name == "end":
            for owner, n in holders.items():
                if owner in released and n >= need_held:
                    bad("released-held", "after the workers ended, %d nodes held the owner token of %s, "
                        "whose release was reported done" % (n, released[owner]))

    margins = told_margins(run, begins, ends)
    for (fault, _store), ms in margins.items():
        if fault in CUT_ALONE:
            for op, m, drift in ms:
                if m < drift:
                    bad("told-late", "%s was told its lease was lost %.1f ms %s the next grant (%s); "
                        "the drift allowance is %.1f ms" %
                        (op, abs(m) / 1e6, "before" if m >= 0 else "after", fault, drift / 1e6))

    outcomes = defaultdict(int)
    messages = defaultdict(lambda: defaultdict(int))
    for c in ends.values():
        outcomes[c["out"]] += 1
        if c["out"] not in ("ok", "busy"):
            messages[c["out"]][c["msg"]] += 1
    how = defaultdict(int)
    for p in run["procs"]:
        how[p["how"]] += 1
    stats = {"ops": len(ends), "faults": meta.get("faults", len(run["faults"])), "outcomes": dict(outcomes),
             "accepted": accepted, "late": late, "stale": stale, "procs": dict(how), "slowest": slowest[1],
             "messages": {o: sorted(m.items(), key=lambda x: -x[1])[:2] for o, m in messages.items()},
             "owners": len(released), "probed": probed,
             "kinds": {kind: sum(1 for ls in kinds_done.values() for x in ls if x[3] == kind)
                       for kind in ("reader", "writer", "permit")},
             "keys": {k: r["hash"].get("count", "0") for k, r in sorted(run["resource"].items())},
             "margins": margins, "store": meta.get("topology", "?"), "released_after_cut": after_cut}
    # A worker whose monotonic clock ran slow (--nemesis clock, 0.5x)
    # believes its leases last twice as long as they do: the overlaps it
    # makes are that fault's, shown apart. A lower token accepted, or a
    # counter that lost an increment, never is.
    slow = {f["w"] for f in run["faults"] if f.get("kind") == "client_slow"}
    # A lock server whose wall clock was stepped forward, or ran fast
    # (--nemesis server_clock: server_jump, server_fast), expires its keys
    # early: the next holder is granted a key its holder still believes it
    # has, for up to its ttl. Those overlaps, by calls that ran from the
    # fault's start to a ttl after its end, are that fault's, shown apart
    # too. A clock that ran slow (server_slow) makes keys last longer:
    # never an overlap.
    max_ttl = meta.get("max_ttl_ms", 2500) * 10**6
    jumps = [(f["t0"], f["t1"] + max_ttl) for f in run["faults"] if f.get("kind") in SERVER_CLOCK_BREAKS]

    def in_jump(op):
        c = ends.get(op)
        if c is None:
            return False
        t0 = begins[op]["t"] if op in begins else c["t0"]
        return any(j0 <= c["t1"] and t0 <= j1 for j0, j1 in jumps)
    kept, explained, explained_server, interleaved = [], defaultdict(int), defaultdict(int), set()
    for kind, text in V:
        ops = set(re.findall(r"\b(p\d+)\.\d+\.\d+", text))
        full = set(re.findall(r"\b(p\d+\.\d+\.\d+)", text))
        if kind in SLOW_CLOCK_BREAKS and ops & slow:
            explained[kind] += 1
        elif kind in SLOW_CLOCK_BREAKS and jumps and full and all(in_jump(op) for op in full):
            explained_server[kind] += 1
            if kind == "interleave":
                interleaved.add(text.split(":")[0])
        else:
            kept.append((kind, text))
    # The increment an interleaving the step made lost: the old holder's
    # write accepted after the next holder's read, before its first write
    # (the one stale write fencing cannot refuse).
    for kind, text in list(kept):
        if kind == "lost-increment" and text.split(":")[0] in interleaved:
            kept.remove((kind, text))
            explained_server[kind] += 1
    stats["explained"] = dict(explained)
    stats["explained_server"] = dict(explained_server)
    return stats, kept


# What a holder whose clock runs slow makes (it holds past its lease): see check().
SLOW_CLOCK_BREAKS = ("stale-write", "two-holders", "interleave", "rw-overlap", "over-admission")
# The server clock faults that expire keys early (see check()).
SERVER_CLOCK_BREAKS = ("server_jump", "server_fast")

# Faults after which a holder is cut off alone, its clock and CPU intact,
# and nothing it sends reaches the store: it must be told before the next
# holder is granted, by the drift allowance. (When only the answers are
# dropped, holder_cut_from_store, the release it sends once told frees the
# key at once: the margin is reported, not judged.)
CUT_ALONE = ("holder_cut", "holder_cut_to_store")


def told_margins(run, begins, ends):
    """For each exclusive lease on a counter key whose holder was told it was
    lost (the lease's stop token fired while its work ran): how long before
    the next holder of the key was handed its lease that was (negative:
    after), with the lease's drift allowance (ttl * 0.01 + 2 ms, the
    defaults). Keyed by (the fault it came under, or "none"; topology)."""
    meta = run["meta"]
    max_ttl = meta.get("max_ttl_ms", 2500) * 10**6
    grants = defaultdict(list)
    for op, c in ends.items():
        if not c.get("kind") and c.get("acq"):
            grants[c["k"]].append((c["acq"], op, c.get("tok", 0)))
    for g in grants.values():
        g.sort()
    out = defaultdict(list)
    for op, c in sorted(ends.items()):
        told = c.get("told", 0)
        if not told or c.get("kind") or not c.get("acq"):
            continue
        # The next holder's grant: the first one seen after this one, with
        # a higher token (a grant a starved or paused process saw late was
        # made before this one, and has a lower token).
        tok = c.get("tok", 0)
        nxt = next((t for t, o, tk in grants[c["k"]] if t > c["acq"] and o != op and not (tok and tk and tk < tok)),
                   None)
        if nxt is None:
            continue
        w = op.split(".")[0]
        fault = "none"
        for f in run["faults"]:
            # Told while its process was cut off (or on a faked clock): the
            # release it sends then cannot free the key before the fault
            # ends; told after, it can. A starved process is told when it
            # runs again, once the fault is over.
            late = max_ttl if f.get("kind") == "holder_starve" else 0
            if f.get("w") == w and f["t0"] <= told <= f["t1"] + late:
                fault = f["kind"]
            elif "w" not in f and fault == "none" and \
                    f["t0"] - (0 if f.get("ws") else max_ttl) <= told <= f["t1"] + max_ttl:
                # A server cut off from its peers (its "ws" the workers
                # whose calls met the cut): from the cut on, and a ttl
                # after it heals.
                fault = f["kind"]
        ttl = (begins.get(op) or {}).get("ttl", 0)
        out[(fault, meta.get("topology", "?"))].append((op, nxt - told, int(ttl * 0.01 * 10**6) + 2 * 10**6))
    return dict(out)


def report(stats, V):
    o = stats["outcomes"]
    order = ["ok", "lost", "busy", "conn", "redis", "stopped", "error"]
    parts = ["%d %s" % (o[k], k) for k in order if o.get(k)] + ["%d %s" % (n, k) for k, n in o.items() if k not in order]
    print("soak_check: calls: %s" % (", ".join(parts) or "none"))
    for out, top in sorted(stats["messages"].items()):
        print("soak_check:   %s, most often: %s" % (out, "; ".join("%dx %s" % (n, m[:160]) for m, n in top)))
    print("soak_check: writes: %d accepted, %d refused late (holders past their lease), %d refused stale"
          % (stats["accepted"], stats["late"], stats["stale"]))
    print("soak_check: counters: %s" % (", ".join("%s=%s" % kv for kv in stats["keys"].items()) or "none"))
    print("soak_check: released locks: %d owner tokens known, %d looked for in Redis right after the release"
          % (stats["owners"], stats["probed"]))
    if any(stats.get("kinds", {}).values()):
        k = stats["kinds"]
        print("soak_check: other kinds, ended well: %d readers and %d writers of 'rw', %d holders of a permit of 'sem'"
              % (k["reader"], k["writer"], k["permit"]))
    if stats["slowest"]:
        print("soak_check: slowest call (stopped time excluded): %s" % stats["slowest"])
    for (fault, store), ms in sorted(stats.get("margins", {}).items()):
        v = sorted(m for _, m, _ in ms)
        after = sum(1 for m in v if m < 0)
        short = sum(1 for _, m, drift in ms if m < drift)
        print("soak_check: margin %s/%s: %d leases lost, told before the next grant by min %.1f ms, p50 %.1f ms; "
              "by less than the drift allowance: %d; told after it: %d"
              % (store, fault, len(v), v[0] / 1e6, v[len(v) // 2] / 1e6, short, after))
    print("soak_check: worker processes: %s" % (", ".join("%d %s" % (n, k) for k, n in sorted(stats["procs"].items()))
                                                or "none"))
    if stats.get("released_after_cut"):
        print("soak_check: releases reported done while the key was still the holder's, in a call its process was "
              "cut off during (a request delivered after the cut heals): %d" % stats["released_after_cut"])
    if stats.get("explained"):
        print("soak_check: overlaps made by a worker whose clock ran at 0.5x (client_slow; fencing refused or "
              "ordered their writes): %s" % ", ".join("%d %s" % (n, k) for k, n in sorted(stats["explained"].items())))
    if stats.get("explained_server"):
        print("soak_check: overlaps in calls made while a lock server's wall clock had been stepped forward or ran "
              "fast (server_jump, server_fast: its keys expired early; fencing refused or ordered their writes): %s"
              % ", ".join("%d %s" % (n, k) for k, n in sorted(stats["explained_server"].items())))
    shown = defaultdict(int)
    for kind, text in V:
        shown[kind] += 1
        if shown[kind] <= SHOW:
            print("soak_check: VIOLATION %s: %s" % (kind, text))
    for kind, n in shown.items():
        if n > SHOW:
            print("soak_check: ... and %d more %s violations" % (n - SHOW, kind))
    print("soak: %d ops, %d faults, %d violations" % (stats["ops"], stats["faults"], len(V)))


# ------------------------------------------------------------- self-test


def _good_run():
    """Two leases on k0, one after the other, each with one write; a
    third on k1 whose process was killed while it held the lock."""
    s = 10**9

    def call(op, k, t, tok, rseq, seq, owner):
        return [
            {"e": "b", "op": op, "k": k, "api": "locked", "ttl": 500, "wait": 0, "retries": -1, "t": t, "bound": 5000},
            {"e": "w", "op": op, "k": k, "tok": tok, "rseq": rseq, "rval": rseq // 2, "r0": t + s // 50,
             "w0": t + s // 20, "w1": t + s // 10, "dl": 0, "res": "ok", "seq": seq},
            {"e": "c", "op": op, "k": k, "out": "ok", "msg": "", "t0": t, "t1": t + s // 5, "acq": t + s // 100,
             "wend": t + s // 10, "tok": tok, "owner": owner, "held": 0, "answered": 1, "nodes": 1},
        ]
    events = call("p0.0.0", "k0", 1 * s, 1, 1, 2, "ownerA") + call("p1.0.0", "k0", 2 * s, 2, 3, 4, "ownerB")
    events += call("p2.0.0", "k1", 1 * s, 1, 1, 2, "ownerC")[:2]
    return {
        "meta": {"completed": True, "topology": "single", "majority": 1, "faults": 1},
        "events": events,
        "procs": [{"w": "p0", "pid": 10, "t0": 0, "t1": 9 * s, "how": "clean", "rc": 0},
                  {"w": "p1", "pid": 11, "t0": 0, "t1": 9 * s, "how": "clean", "rc": 0},
                  {"w": "p2", "pid": 12, "t0": 0, "t1": 2 * s, "how": "killed", "rc": -9}],
        "faults": [{"kind": "holder_kill", "target": "p2", "t0": 2 * s, "t1": 2 * s}],
        "resource": {
            "k0": {"hash": {"count": "2", "accepted": "2", "token": "2", "ops": "4"},
                   "log": ["2 1 p0.0.0 1 1 100", "4 2 p1.0.0 3 2 200"], "refused": []},
            "k1": {"hash": {"count": "1", "accepted": "1", "token": "1", "ops": "2"},
                   "log": ["2 1 p2.0.0 1 1 100"], "refused": []},
        },
        "scan_end": [{"node": "redis", "ok": True, "keys": [{"key": "lockwatch:{soak:k1}", "value": "ownerC",
                                                             "pttl": 300}]}],
        "scan_later": [{"node": "redis", "ok": True, "keys": []}],
        "unreadable": [],
    }


def _ev(run, op, e):
    return next(x for x in run["events"] if x["op"] == op and x["e"] == e)


def _self_test_cases():
    """(name, mutation, kinds that must be reported); an empty set: none may be."""
    s = 10**9

    def interleave(r):  # p1 read before p0 wrote: both wrote 1
        _ev(r, "p1.0.0", "w")["rseq"] = 1
        k0 = r["resource"]["k0"]
        k0["log"] = ["2 1 p0.0.0 1 1 100", "4 2 p1.0.0 1 1 200"]
        k0["hash"]["count"] = "1"

    def aba(r):  # p0 writes again after p1 wrote
        r["resource"]["k0"]["log"].append("6 2 p0.0.0 5 3 300")
        r["resource"]["k0"]["hash"].update(count="3", accepted="3")

    def token_down(r):  # p1 began after p0 was granted 1, and got 1
        _ev(r, "p1.0.0", "c")["tok"] = 1
        _ev(r, "p1.0.0", "w")["tok"] = 1
        r["resource"]["k0"]["log"][1] = "4 1 p1.0.0 3 2 200"

    def later_lower(r):  # p1 began after p0's grant, got a lower token; its write was refused as stale
        _ev(r, "p0.0.0", "c")["tok"] = 5
        w0 = _ev(r, "p0.0.0", "w")
        w0["tok"] = 5
        _ev(r, "p1.0.0", "c")["tok"] = 3
        w = _ev(r, "p1.0.0", "w")
        w.update(tok=3, res="stale")
        k0 = r["resource"]["k0"]
        k0["log"] = ["2 5 p0.0.0 1 1 100"]
        k0["refused"] = ["4 3 p1.0.0 3 stale 5 200 900"]
        k0["hash"].update(count="1", accepted="1")

    def slow_clock_two_holders(r):  # p1's clock ran at 0.5x: its overlap is the fault's
        two_holders(r)
        r["faults"].append({"kind": "client_slow", "target": "p1", "w": "p1", "t0": 0, "t1": 9 * s})

    def server_jump_two_holders(r):  # the store's clock was stepped forward: p0's key expired early
        two_holders(r)
        r["faults"].append({"kind": "server_jump", "target": "redis", "t0": 0, "t1": 9 * s, "ws": "p0,p1"})

    def server_jump_elsewhere(r):  # the same overlap, long after the step: not the step's
        two_holders(r)
        r["faults"].append({"kind": "server_jump", "target": "redis", "t0": -30 * s, "t1": -29 * s, "ws": "p0,p1"})

    def server_jump_interleave(r):  # the step let p1 read before p0's last write: an increment lost with it
        interleave(r)
        r["faults"].append({"kind": "server_jump", "target": "redis", "t0": 0, "t1": 9 * s, "ws": "p0,p1"})

    def server_jump_lost_increment(r):  # a lost increment without an interleaving is never the step's
        lost_increment(r)
        r["faults"].append({"kind": "server_jump", "target": "redis", "t0": 0, "t1": 9 * s, "ws": "p0,p1"})

    def server_fast_two_holders(r):  # the store's clock ran at 2x: p0's key expired early
        two_holders(r)
        r["faults"].append({"kind": "server_fast", "target": "redis", "t0": 0, "t1": 9 * s, "ws": "p0,p1"})

    def server_fast_interleave(r):  # the same, an increment lost with the interleaving it let in
        interleave(r)
        r["faults"].append({"kind": "server_fast", "target": "redis", "t0": 0, "t1": 9 * s, "ws": "p0,p1"})

    def server_fast_elsewhere(r):  # the same overlap, long after the clock ran fast: not the fault's
        two_holders(r)
        r["faults"].append({"kind": "server_fast", "target": "redis", "t0": -30 * s, "t1": -29 * s, "ws": "p0,p1"})

    def server_slow_two_holders(r):  # the store's clock ran at 0.5x: keys lasted longer, never an overlap
        two_holders(r)
        r["faults"].append({"kind": "server_slow", "target": "redis", "t0": 0, "t1": 9 * s, "ws": "p0,p1"})

    def server_jump_accepted_down(r):  # a lower token accepted is never the step's
        accepted_down(r)
        r["faults"].append({"kind": "server_jump", "target": "redis", "t0": 0, "t1": 9 * s, "ws": "p0,p1"})

    def accepted_down(r):  # the resource took a lower token after a higher one
        r["resource"]["k0"]["log"] = ["2 2 p0.0.0 1 1 100", "4 1 p1.0.0 3 2 200"]
        for op, tok in (("p0.0.0", 2), ("p1.0.0", 1)):
            _ev(r, op, "c")["tok"] = _ev(r, op, "w")["tok"] = tok

    def lost_increment(r):
        r["resource"]["k0"]["hash"]["count"] = "1"

    def two_holders(r):  # p1 was handed k0 before p0's work returned
        _ev(r, "p1.0.0", "c")["acq"] = _ev(r, "p0.0.0", "c")["wend"] - 1

    def lost_overlap_is_fine(r):  # the same, but p0 was told its lease was lost
        two_holders(r)
        _ev(r, "p0.0.0", "c")["out"] = "lost"

    def unended(r):  # p1 exited cleanly with a call never ended
        r["events"].remove(_ev(r, "p1.0.0", "c"))

    def over_bound(r):
        _ev(r, "p1.0.0", "c")["t1"] = 2 * s + 9 * s

    def stopped_not_over(r):  # the same call, but its process was stopped 8 of those 9 s
        over_bound(r)
        r["faults"].append({"kind": "holder_stop", "target": "p1", "w": "p1", "t0": 3 * s, "t1": 11 * s})

    def held_after_release(r):
        _ev(r, "p1.0.0", "c")["held"] = 1

    def held_after_release_in_a_cut(r):  # the same call, its process cut off while it ran
        held_after_release(r)
        c = _ev(r, "p1.0.0", "c")
        r["faults"].append({"kind": "holder_cut", "target": "p1", "w": "p1", "t0": c["t0"] - s, "t1": c["t0"] + 1})

    def held_after_release_handed_on_and_lost(r):  # the key handed on in p1 to a call that then lost it
        held_after_release(r)
        c = _ev(r, "p1.0.0", "c")
        r["events"] += [
            {"e": "b", "op": "p1.1.0", "k": "k0", "api": "locked", "ttl": 500, "wait": 0, "retries": -1,
             "t": c["t0"], "bound": 5000},
            {"e": "c", "op": "p1.1.0", "k": "k0", "out": "lost", "msg": "lease lost", "t0": c["t0"],
             "t1": c["wend"] + s // 2, "acq": c["wend"], "wend": c["wend"] + s // 2, "told": c["wend"] + s // 2,
             "tok": 3, "owner": "ownerB", "held": 0, "answered": 0, "nodes": 1}]

    def held_after_release_in_a_split(r):  # p1's call made while a server was cut off from its peers
        held_after_release(r)
        c = _ev(r, "p1.0.0", "c")
        r["faults"].append({"kind": "member_isolated", "target": "etcd0", "ws": "p0,p1", "t0": c["t0"] - s,
                            "t1": c["t0"] + 1})

    def held_at_end(r):
        r["scan_end"][0]["keys"].append({"key": "lockwatch:{soak:k0}", "value": "ownerB", "pttl": 400})

    def sql_row_held_at_end(r):
        r["meta"]["topology"] = "sql"
        for scan in ("scan_end", "scan_later"):
            r[scan] = [{"node": "mariadbd", "ok": True, "keys": []}]
        r["scan_end"][0]["keys"].append({"key": "lockwatch:soak:k0", "value": "ownerB", "pttl": 400})

    def cluster_master_held_at_end(r):
        r["meta"]["topology"] = "cluster"
        for scan in ("scan_end", "scan_later"):
            r[scan] = [{"node": "cnode%d" % i, "ok": True, "keys": []} for i in range(3)]
        r["scan_end"][2]["keys"].append({"key": "lockwatch:{soak:k0}", "value": "ownerB", "pttl": 400})

    def no_expiry(r):
        r["scan_end"][0]["keys"][0]["pttl"] = -1

    def outlived(r):
        r["scan_later"][0]["keys"].append({"key": "lockwatch:{soak:k1}", "value": "ownerC", "pttl": 50})

    def redlock_minority(r):  # one of three nodes missed the release: not held
        r["meta"].update(topology="redlock", majority=2)
        c = _ev(r, "p1.0.0", "c")
        c.update(held=1, nodes=3)

    def redlock_majority(r):
        redlock_minority(r)
        _ev(r, "p1.0.0", "c")["held"] = 2

    def crashed(r):
        r["procs"][1]["how"] = "crashed"

    def hang(r):
        r["events"].append({"e": "hang", "op": "p1.0.0", "k": "k0", "what": "release", "t": 3 * s})

    def late_is_fine(r):  # a paused holder's write refused late: expected
        r["resource"]["k0"]["refused"] = ["5 1 p0.0.0 1 late 2 300 250"]

    def mismatch(r):
        _ev(r, "p0.0.0", "w")["seq"] = 4

    def incomplete(r):
        r["meta"] = {"completed": False, "error": "RuntimeError: redis-server did not start"}

    def kinds_call(op, k, kind, acq, wend, tok):
        w = op.split(".")[0]
        return [{"e": "b", "op": op, "k": k, "api": "locked", "kind": kind, "ttl": 500, "wait": 0, "retries": -1,
                 "t": acq - s // 100, "bound": 5000},
                {"e": "c", "op": op, "k": k, "kind": kind, "out": "ok", "msg": "", "t0": acq - s // 100,
                 "t1": wend + s // 100, "acq": acq, "wend": wend, "tok": tok, "owner": "", "held": 0,
                 "answered": 0, "nodes": 1}]

    def readers_overlap(r):  # two readers at once, a writer after them (a higher token), then a reader
        r["events"] += kinds_call("p0.0.1", "rw", "reader", 3 * s, 4 * s, 7)
        r["events"] += kinds_call("p1.0.1", "rw", "reader", 3 * s + s // 2, 5 * s, 7)
        r["events"] += kinds_call("p0.0.2", "rw", "writer", 5 * s + s // 10, 6 * s, 8)
        r["events"] += kinds_call("p1.0.2", "rw", "reader", 6 * s + s // 10, 7 * s, 8)

    def writer_with_reader(r):
        readers_overlap(r)
        r["events"] += kinds_call("p2.0.1", "rw", "writer", 3 * s + s // 4, 3 * s + s // 3, 9)

    def cut_told(r, before_ns):  # p0 cut off alone, told `before_ns` before p1 was handed k0
        c = _ev(r, "p0.0.0", "c")
        c.update(out="lost", told=_ev(r, "p1.0.0", "c")["acq"] - before_ns)
        r["faults"].append({"kind": "holder_cut", "target": "p0", "w": "p0", "t0": c["acq"],
                            "t1": _ev(r, "p1.0.0", "c")["t1"]})

    def cut_told_grant_seen_late(r):  # the same, and a grant made before p0's, seen by a starved p3 late
        for op, tok in (("p0.0.0", 2), ("p1.0.0", 3)):
            _ev(r, op, "w")["tok"] = _ev(r, op, "c")["tok"] = tok
        k0 = r["resource"]["k0"]
        k0["log"] = ["2 2 p0.0.0 1 1 100", "4 3 p1.0.0 3 2 200"]
        k0["hash"]["token"] = "3"
        cut_told(r, 8 * 10**6)
        told = _ev(r, "p0.0.0", "c")["told"]
        r["events"] += [
            {"e": "b", "op": "p3.0.0", "k": "k0", "api": "locked", "ttl": 500, "wait": 0, "retries": -1,
             "t": s // 2, "bound": 5000},
            {"e": "c", "op": "p3.0.0", "k": "k0", "out": "lost", "msg": "", "t0": s // 2, "t1": told + s,
             "acq": told + 10**6, "wend": told + s, "told": told + s, "tok": 1, "owner": "ownerD", "held": 0,
             "answered": 1, "nodes": 1}]
        r["procs"].append({"w": "p3", "pid": 13, "t0": 0, "t1": 9 * s, "how": "clean", "rc": 0})
        r["faults"].append({"kind": "holder_starve", "target": "p3", "w": "p3", "t0": s // 2, "t1": told + s})

    def permits_in_turn(r):  # two holders at once, then a third after one ended
        r["events"] += kinds_call("p0.0.1", "sem", "permit", 3 * s, 4 * s, 7)
        r["events"] += kinds_call("p1.0.1", "sem", "permit", 3 * s + s // 2, 5 * s, 8)
        r["events"] += kinds_call("p0.0.2", "sem", "permit", 4 * s + s // 10, 6 * s, 9)

    def permits_over(r):  # a third holder while two hold (tokens in order of grant)
        r["events"] += kinds_call("p0.0.1", "sem", "permit", 3 * s, 4 * s, 7)
        r["events"] += kinds_call("p1.0.1", "sem", "permit", 3 * s + s // 2, 5 * s, 8)
        r["events"] += kinds_call("p1.0.2", "sem", "permit", 3 * s + s // 2 + s // 10, 3 * s + s // 2 + s // 5, 9)

    return [
        ("a good history", lambda r: None, set()),
        ("interleaved read/write pairs", interleave, {"interleave", "lost-increment"}),
        ("a lease writing again after another", aba, {"interleave"}),
        ("a token handed out twice", token_down, {"token-order"}),
        ("a later call with a lower token", later_lower, {"token-order", "stale-write"}),
        ("the resource accepting a lower token", accepted_down, {"token-order"}),
        ("a lost increment", lost_increment, {"lost-increment"}),
        ("two calls that ended well holding a key at once", two_holders, {"two-holders"}),
        ("the same, one of them told its lease was lost", lost_overlap_is_fine, set()),
        ("the same, one of them on a clock running at 0.5x", slow_clock_two_holders, set()),
        ("the same, the store's clock stepped forward meanwhile", server_jump_two_holders, set()),
        ("the same, the store's clock stepped forward long before", server_jump_elsewhere, {"two-holders"}),
        ("interleaved read/write pairs, the store's clock stepped forward meanwhile", server_jump_interleave, set()),
        ("a lost increment, the store's clock stepped forward meanwhile", server_jump_lost_increment,
         {"lost-increment"}),
        ("the resource accepting a lower token, the store's clock stepped forward meanwhile",
         server_jump_accepted_down, {"token-order"}),
        ("two calls holding a key at once, the store's clock running at 2x meanwhile", server_fast_two_holders, set()),
        ("interleaved read/write pairs, the store's clock running at 2x meanwhile", server_fast_interleave, set()),
        ("the same two holders, the store's clock ran at 2x long before", server_fast_elsewhere, {"two-holders"}),
        ("the same two holders, the store's clock running at 0.5x meanwhile", server_slow_two_holders,
         {"two-holders"}),
        ("a call that never ended", unended, {"unended"}),
        ("a call past its bound", over_bound, {"over-bound"}),
        ("the same call, its process stopped meanwhile", stopped_not_over, set()),
        ("a released lock still held", held_after_release, {"released-held"}),
        ("a released owner left at the end", held_at_end, {"released-held"}),
        ("a released lock still held, in a call made while its process was cut off",
         held_after_release_in_a_cut, set()),
        ("a released lock still held, handed on in its process to a call that then lost it",
         held_after_release_handed_on_and_lost, set()),
        ("a released lock still held, in a call made while a server was cut off from its peers",
         held_after_release_in_a_split, set()),
        ("SQL: a released lock's row held at the end", sql_row_held_at_end, {"released-held"}),
        ("Cluster: a released owner on one master at the end", cluster_master_held_at_end, {"released-held"}),
        ("a lock key without expiry", no_expiry, {"released-held"}),
        ("a lock key outliving its ttl", outlived, {"outlived"}),
        ("Redlock: one node of three missed a release", redlock_minority, set()),
        ("Redlock: a majority still holds a released lock", redlock_majority, {"released-held"}),
        ("a crashed worker", crashed, {"worker"}),
        ("a worker giving up on a hung call", hang, {"hang"}),
        ("a paused holder's late write", late_is_fine, set()),
        ("history and resource disagreeing", mismatch, {"history"}),
        ("a soak that did not complete", incomplete, {"incomplete"}),
        ("readers holding a read-write lock together, a writer after them", readers_overlap, set()),
        ("a writer holding it with readers", writer_with_reader, {"rw-overlap"}),
        ("permit holders no more than the permits", permits_in_turn, set()),
        ("a holder cut off alone, told the drift allowance before the next grant",
         lambda r: cut_told(r, 8 * 10**6), set()),
        ("a holder cut off alone, told after the next grant", lambda r: cut_told(r, -10**6), {"told-late"}),
        ("a holder cut off alone, told in time, and an earlier grant (a lower token) seen late by a starved process",
         cut_told_grant_seen_late, set()),
        ("a holder cut off alone, told before the next grant by less than the drift allowance",
         lambda r: cut_told(r, 6 * 10**6), {"told-late"}),
        ("a permit holder too many", permits_over, {"over-admission"}),
    ]


def self_test():
    failures = 0
    cases = _self_test_cases()
    for name, mutate, want in cases:
        run = copy.deepcopy(_good_run())
        mutate(run)
        _, V = check(run)
        got = {k for k, _ in V}
        ok = want <= got if want else not got
        if not ok:
            failures += 1
            print("soak_check: self-test FAILED: %s: wanted %s, got %s" % (name, sorted(want) or "none", V))
    if failures:
        return 1
    caught = sum(1 for _, _, w in cases if w)
    print("soak_check: self-test passed: %d bad histories caught, %d good ones accepted" % (caught, len(cases) - caught))
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    stats, V = check(load(argv[1]))
    report(stats, V)
    return 1 if V else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
