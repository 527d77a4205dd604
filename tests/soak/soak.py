#!/usr/bin/env python3
"""The fault soak's orchestrator; run it through scripts/soak.

Starts the lock topology (one redis-server, three Redlock masters, a
master, a replica and three sentinels, a Redis Cluster of three masters
and three replicas, one mariadbd, one postgres, a ZooKeeper ensemble of
three members, or three etcd members), the resource (one more
redis-server, never faulted) and several lockwatch-soak-worker processes,
injects faults at random from a seed for the given time, then collects
what the checker (scripts/soak_check.py) reads into --dir:

  meta.json          the run: seed, topology, fault count, whether it completed
  hist/<id>.jsonl    each worker's history (written by the worker)
  procs.jsonl        each worker process: when it ran and how it ended
  faults.jsonl       each fault: kind, target, start and end (CLOCK_MONOTONIC ns)
  resource.json      the resource's counters, accepted writes and refusals
  locks_end.json     lock keys on the nodes right after the workers ended
                     (on SQL and PostgreSQL: the lock table's rows held then)
  locks_later.json   the same once the longest ttl has passed

Every lock node runs with appendonly and appendfsync always: the restart
faults are crashes (SIGKILL) of nodes that keep their keys and fencing
counters, which is what docs/stores.md asks of a deployment that wants
fencing tokens to survive a restart; mariadbd commits every statement to
its log (innodb_flush_log_at_trx_commit=1), postgres likewise (fsync and
synchronous_commit on, its defaults), ZooKeeper members likewise (forceSync,
their default); postgres's faults (kill, stop)
take every process of the server, the postmaster and its children. The cluster's nodes time out
after 1 s; its faults are a master killed (its replica takes over, it
comes back as a replica), a graceful CLUSTER FAILOVER, a slot of a lock
moved to another master while locks are held (IMPORTING/MIGRATING,
MIGRATE, SETSLOT NODE, as redis-cli --cluster reshard does) and a master
stopped for less than the node timeout. Faults stop some seconds before
the end so that the run ends on a healthy system. Cluster, SQL and
PostgreSQL faults stay on 127.0.0.1 (no network namespace). ZooKeeper's
faults (on 127.0.0.1 too) are a member killed and restarted, the leader
killed and restarted or stopped, and a majority killed for a while (no
lock is granted then, and holders lose their leases).

Every child is killed on exit (also on SIGTERM/SIGINT, and by the kernel
should this process die: PR_SET_PDEATHSIG), the network namespace is
deleted. Network faults need root, `ip` and `tc`: a namespace of our own
holds one lock node behind a veth pair with 10.200.x.y addresses; traffic
goes only to 127.0.0.1 and into that namespace. A partition takes the
namespace's end of the link down: the host keeps its route over the veth
(marked linkdown) and packets are dropped there. Taking the host's end
down instead would delete that route and send the node's traffic out by
the default route; a blackhole route for the /30 (written to
--dir/netns.route, so that scripts/soak's trap can remove it too) makes
sure that can never happen.
"""
import argparse
import ctypes
import json
import os
import pwd
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback

MAX_TTL_MS = 2500  # the longest ttl the workers use (kTtls in soak_worker.cpp)
MAX_FAULT_S = 4.5  # the longest a fault lasts (down, stopped, hung, cut)
GUARD_METRIC = "4242"  # the blackhole route behind the veth's own
SENTINEL_MASTER = "mymaster"
CLUSTER_NODE_TIMEOUT_MS = 1000
SQL_USER, SQL_PASSWORD, SQL_DATABASE = "lockwatch", "lockwatch-soak", "lockwatch_soak"
NFT_TABLE = "lwsoak"  # --nemesis partition: in the namespace scripts/soak makes for the run
WORKER_UID0 = 61000  # --nemesis partition: worker pN runs as uid WORKER_UID0 + N
# --nemesis partition on etcd, ZooKeeper and Cluster: each server runs as a
# uid of its own (SERVER_UID0 + its index), so that its own connections (a
# member's peer and quorum links, a node's bus and replication links) can be
# told apart from its peers'.
SERVER_UID0 = 62000
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
# --nemesis server_clock: the shim (clock_shift.cpp) preloaded into the lock
# servers, next to the worker in the build; the topologies it applies to.
CLOCK_SHIFT_LIB = "liblockwatch-soak-clock-shift.so"
SERVER_CLOCK_TOPOLOGIES = ("single", "sentinel", "redlock", "cluster", "sql", "postgresql")
CGROUP_CPU = "/sys/fs/cgroup/cpu"  # cgroup v1; v2 is tried at /sys/fs/cgroup


def mono_ns():
    return time.monotonic_ns()


def say(*parts):
    print(*parts, flush=True)


# ------------------------------------------------------------------ RESP


class ReplyError(Exception):
    pass


def token_of(value):
    """The owner token a Redis lock's value starts with."""
    return value.split(" ", 1)[0] if isinstance(value, str) else value


def _encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _parse(f):
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode("latin-1")
    if kind == b"-":
        return ReplyError(rest.decode("latin-1"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = f.read(n + 2)
        if len(data) != n + 2:
            raise ConnectionError("connection closed")
        return data[:-2].decode("latin-1")
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_parse(f) for _ in range(n)]
    raise ConnectionError("bad reply %r" % line)


def redis(host, port, *args, timeout=1.0):
    """One command on a fresh connection. Raises OSError/ConnectionError if
    the server cannot be reached; an error reply is returned as ReplyError."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(_encode(args))
        with s.makefile("rb") as f:
            return _parse(f)


_ports_given = set()


def free_port():
    """A port nothing listens on now, never one this run handed out before
    (the kernel may offer a port twice while the first taker has not yet
    bound it)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port


def log_tail(path, lines=5):
    try:
        with open(path, "rb") as f:
            return " | ".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
    except OSError:
        return "no log"


# ------------------------------------------------------------- processes

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone if we are


class Child:
    """A process we started; every one is killed by Soak.cleanup(). With
    uid, it runs as that user (and group): --nemesis partition tells the
    workers' connections apart by the user that opened them."""

    all = []

    def __init__(self, argv, log_path, uid=None, env=None):
        self.log = open(log_path, "ab")

        def pre():
            _die_with_parent()
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                  preexec_fn=pre, env=env)
        Child.all.append(self)

    @property
    def pid(self):
        return self.p.pid

    def signal(self, sig):
        if self.p.poll() is None:
            try:
                os.kill(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self):
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        self.p.wait()
        self.log.close()


class Server:
    env = None  # --nemesis server_clock: the server's environment (Soak.setup_clock_shift)

    """A restartable server process (self.proc, a Child, or None while down):
    the faults every node kind takes."""

    def kill(self):
        if self.proc:
            self.proc.kill()
            self.proc = None

    def pause(self):
        self.proc.signal(signal.SIGSTOP)

    def resume(self):
        self.proc.signal(signal.SIGCONT)


class RedisNode(Server):
    """One redis-server on a fixed port, restartable, with appendonly."""

    def __init__(self, root, name, port=None, host="127.0.0.1", netns=None, persist=True, cluster=False):
        self.name, self.host, self.netns, self.persist = name, host, netns, persist
        self.port = port or free_port()
        self.pick_ports = port is None  # may take other ports if its first start finds them taken
        self.started = False
        # A cluster node: its bus on a port of its own (port + 10000 may not exist).
        self.bus_port = free_port() if cluster else None
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        self.proc = None
        self.replicaof = None
        self.uid = None  # --nemesis partition: the user it runs as (Soak.own_user)
        self.env = None  # --nemesis server_clock: its environment (Soak.setup_clock_shift)

    @property
    def addr(self):
        return "%s:%d" % (self.host, self.port)

    def argv(self):
        argv = ["ip", "netns", "exec", self.netns] if self.netns else []
        argv += ["redis-server", "--port", str(self.port), "--bind", self.host, "--dir", self.dir,
                 "--logfile", os.path.join(self.dir, "redis.log"), "--daemonize", "no", "--save", "",
                 "--protected-mode", "no"]
        argv += ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
        # A replica coming back resyncs at once, not after the default 5 s.
        argv += ["--repl-diskless-sync-delay", "0"]
        if self.replicaof:
            argv += ["--replicaof", "127.0.0.1", str(self.replicaof)]
        if self.bus_port:
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", os.path.join(self.dir, "nodes.conf"),
                     "--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS), "--cluster-port", str(self.bus_port)]
        return argv

    def start(self, replicaof=None):
        self.replicaof = replicaof
        deadline = time.monotonic() + 10
        while True:
            self.proc = Child(self.argv(), os.path.join(self.dir, "stdout.log"), uid=self.uid, env=self.env)
            while time.monotonic() < deadline and self.proc.p.poll() is None:
                if self.ping():
                    self.started = True
                    return
                time.sleep(0.02)  # a fresh process: nothing signals "ready"
            exited = self.proc.p.poll() is not None
            self.proc.kill()
            if time.monotonic() >= deadline:
                raise RuntimeError("redis-server %s on %s did not start (see %s): %s"
                                   % (self.name, self.addr, self.dir, log_tail(os.path.join(self.dir, "redis.log"))))
            if exited and not self.started and self.pick_ports:
                # Its first start, and a port was taken by another process
                # since we picked it: nobody knows these ports yet, take others.
                self.port = free_port()
                self.bus_port = free_port() if self.bus_port else None
            time.sleep(0.1)  # the port is still held by the killed server: try again

    def ping(self):
        try:
            return redis(self.host, self.port, "PING", timeout=0.3) == "PONG"
        except OSError:
            return False

    def cmd(self, *args, timeout=2.0):
        return redis(self.host, self.port, *args, timeout=timeout)

    def lock_keys(self):
        """[{key, value, pttl}] of every lock key (not the fencing counters)."""
        keys, cursor = [], "0"
        while True:
            # Locks are lockwatch:{K}; the slots' counters lockwatch:fence:{T};
            # a shared or permit lock's holders lockwatch:{K}:holders (and a
            # waiting writer's lockwatch:{K}:writer), which go with it.
            cursor, batch = self.cmd("SCAN", cursor, "MATCH", "lockwatch:{*", "COUNT", 1000)
            keys += [k for k in batch if k.endswith("}")]
            if cursor == "0":
                break
        # A lock's value is its owner token, then its grant time and owner
        # name, a space apart: the token is what the checker matches.
        return [{"key": k, "value": token_of(self.cmd("GET", k)), "pttl": self.cmd("PTTL", k)}
                for k in sorted(set(keys))]


class Sentinel:
    def __init__(self, root, name, master_port):
        self.port = free_port()
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        conf = os.path.join(self.dir, "sentinel.conf")
        with open(conf, "w") as f:
            f.write("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s/sentinel.log\n" % (self.port, self.dir, self.dir))
            f.write("sentinel monitor %s 127.0.0.1 %d 2\n" % (SENTINEL_MASTER, master_port))
            f.write("sentinel down-after-milliseconds %s 1000\n" % SENTINEL_MASTER)
            f.write("sentinel failover-timeout %s 3000\n" % SENTINEL_MASTER)
            f.write("sentinel parallel-syncs %s 1\n" % SENTINEL_MASTER)
        self.proc = Child(["redis-server", conf, "--sentinel"], os.path.join(self.dir, "stdout.log"))

    def cmd(self, *args):
        return redis("127.0.0.1", self.port, *args, timeout=1.0)

    def master_info(self):
        r = self.cmd("SENTINEL", "master", SENTINEL_MASTER)
        return dict(zip(r[0::2], r[1::2])) if isinstance(r, list) else {}


class MariaDb(Server):
    """One mariadbd on a loopback port and a socket of its own, restartable;
    every commit reaches its log before it is acknowledged."""

    def __init__(self, root):
        self.name = "mariadbd"
        self.dir = os.path.join(root, "mariadb")
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.sock = os.path.join(self.dir, "sock")
        self.proc = None
        self.user = pwd.getpwuid(os.geteuid()).pw_name
        with open(os.path.join(self.dir, "install.log"), "wb") as log:
            rc = subprocess.run(["mariadb-install-db", "--no-defaults", "--datadir=" + os.path.join(self.dir, "data"),
                                 "--user=" + self.user, "--auth-root-authentication-method=normal", "--skip-test-db",
                                 "--innodb-log-file-size=4M"], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, timeout=120).returncode
        if rc != 0:
            raise RuntimeError("mariadb-install-db failed (see %s/install.log)" % self.dir)

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        argv = ["mariadbd", "--no-defaults", "--datadir=" + os.path.join(self.dir, "data"), "--user=" + self.user,
                "--socket=" + self.sock, "--port=%d" % self.port, "--bind-address=127.0.0.1", "--skip-name-resolve",
                "--log-error=" + os.path.join(self.dir, "error.log"), "--skip-log-bin",
                "--innodb-buffer-pool-size=64M", "--innodb-flush-log-at-trx-commit=1", "--max-connections=200"]
        self.proc = Child(argv, os.path.join(self.dir, "stdout.log"), env=self.env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.p.poll() is None:
            if self.ping():
                return
            time.sleep(0.05)  # a starting server (crash recovery included): nothing signals "ready"
        raise RuntimeError("mariadbd did not answer within 30 s (see %s/error.log)" % self.dir)

    def query(self, sql, timeout=3.0):
        """The rows (lists of strings) of `sql`, run as root over the socket.
        Raises OSError when the server does not answer or refuses."""
        try:
            r = subprocess.run(["mariadb", "--no-defaults", "--socket=" + self.sock, "-uroot", "-N", "-B",
                                "--connect-timeout=1", "-e", sql], stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise OSError("mariadbd did not answer within %.1f s" % timeout)
        if r.returncode != 0:
            raise OSError(r.stderr.strip() or "mariadb exited with %d" % r.returncode)
        return [line.split("\t") for line in r.stdout.splitlines()]

    def ping(self):
        try:
            return self.query("SELECT 1", timeout=1.0) == [["1"]]
        except OSError:
            return False

    def create_user(self):
        self.query("CREATE DATABASE %s; CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY '%s'; "
                   "GRANT ALL ON %s.* TO '%s'@'127.0.0.1'"
                   % (SQL_DATABASE, SQL_USER, SQL_PASSWORD, SQL_DATABASE, SQL_USER, ))

    def lock_keys(self):
        """[{key, value, pttl}] of every lock row held now (owner set, not expired)."""
        try:
            rows = self.query("SELECT lock_name, owner, TIMESTAMPDIFF(MICROSECOND, NOW(6), expires_at) DIV 1000 "
                              "FROM %s.lockwatch_locks WHERE owner <> '' AND expires_at > NOW(6)" % SQL_DATABASE)
        except OSError as e:
            if "doesn't exist" in str(e):
                return []  # no lock was ever taken
            raise
        return [{"key": r[0], "value": r[1], "pttl": int(r[2])} for r in rows]


def pg_bin():
    """Debian's newest /usr/lib/postgresql/<version>/bin, else where PATH
    has postgres."""
    best, version = None, -1
    try:
        for v in os.listdir("/usr/lib/postgresql"):
            b = os.path.join("/usr/lib/postgresql", v, "bin")
            if v.isdigit() and int(v) > version and os.access(os.path.join(b, "postgres"), os.X_OK):
                best, version = b, int(v)
    except OSError:
        pass
    if best:
        return best
    found = shutil.which("postgres")
    if not found:
        raise RuntimeError("postgres not found (Debian package postgresql)")
    return os.path.dirname(found)


def children_of(pid):
    """The pids whose parent is `pid` (live ones)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(rest[1]) == pid and rest[0] != "Z":
            out.append(int(d))
    return out


class Postgres(Server):
    """One postgres on a loopback port and a socket of its own, restartable;
    every commit reaches its log (fsync) before it is acknowledged. A
    server is a process tree (the postmaster and a process per connection):
    kill, pause and resume act on all of it. PostgreSQL refuses to run as
    root: then initdb and the server run as the postgres user (else
    nobody), through setpriv."""

    def __init__(self, root):
        self.name = "postgres"
        self.dir = os.path.join(root, "postgres")
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.bin = pg_bin()
        self.proc = None
        self.run_as = []
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                pw = pwd.getpwnam("nobody")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            # The run's directory is root's: that user may pass through it
            # (not list it) to reach its own.
            os.chmod(root, os.stat(root).st_mode | 0o011)
            self.run_as = ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--clear-groups",
                           "--pdeathsig", "KILL"]
        data = os.path.join(self.dir, "data")
        with open(os.path.join(self.dir, "initdb.log"), "wb") as log:
            rc = subprocess.run(self.run_as + [os.path.join(self.bin, "initdb"), "-D", data, "-U", "postgres",
                                               "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-instructions"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=120).returncode
        if rc != 0:
            raise RuntimeError("initdb failed (see %s/initdb.log)" % self.dir)
        with open(os.path.join(data, "pg_hba.conf"), "w") as f:
            f.write("local all postgres trust\nhost all all 127.0.0.1/32 scram-sha-256\n")

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        argv = self.run_as + [os.path.join(self.bin, "postgres"), "-D", os.path.join(self.dir, "data"),
                              "-p", str(self.port), "-k", self.dir, "-c", "listen_addresses=127.0.0.1",
                              "-c", "max_connections=200", "-c", "log_min_messages=warning"]
        self.proc = Child(argv, os.path.join(self.dir, "server.log"), env=self.env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.p.poll() is None:
            if self.ping():
                return
            time.sleep(0.05)  # a starting server (crash recovery included): nothing signals "ready"
        raise RuntimeError("postgres did not answer within 30 s (see %s/server.log)" % self.dir)

    def tree(self):
        return [self.proc.pid] + children_of(self.proc.pid) if self.proc else []

    def kill(self):
        if not self.proc:
            return
        # Stopped first, the postmaster starts nothing while its children die.
        self.proc.signal(signal.SIGSTOP)
        children = children_of(self.proc.pid)
        for c in children:
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.kill()
        self.proc = None
        until = time.monotonic() + 10
        while any(os.path.exists("/proc/%d" % c) and self._state(c) not in ("Z", None) for c in children) \
                and time.monotonic() < until:
            time.sleep(0.005)  # the kernel ends a killed process as it next runs

    @staticmethod
    def _state(pid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return None

    def pause(self):
        self.proc.signal(signal.SIGSTOP)
        for c in children_of(self.proc.pid):
            try:
                os.kill(c, signal.SIGSTOP)
            except ProcessLookupError:
                pass

    def resume(self):
        for c in children_of(self.proc.pid):
            try:
                os.kill(c, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.proc.signal(signal.SIGCONT)

    def query(self, sql, database=None, timeout=3.0):
        """The rows (lists of strings) of `sql`, run as the superuser over
        the socket. Raises OSError when the server does not answer or refuses."""
        try:
            r = subprocess.run([os.path.join(self.bin, "psql"), "-X", "-q", "-A", "-t", "-F", "\t", "-v",
                                "ON_ERROR_STOP=1", "-h", self.dir, "-p", str(self.port), "-U", "postgres",
                                "-d", database or SQL_DATABASE, "-c", sql],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, PGCONNECT_TIMEOUT="1"))
        except subprocess.TimeoutExpired:
            raise OSError("postgres did not answer within %.1f s" % timeout)
        if r.returncode != 0:
            raise OSError(r.stderr.strip() or "psql exited with %d" % r.returncode)
        return [line.split("\t") for line in r.stdout.splitlines()]

    def ping(self):
        try:
            return self.query("SELECT 1", database="postgres", timeout=1.0) == [["1"]]
        except OSError:
            return False

    def create_user(self):
        self.query("CREATE ROLE %s LOGIN PASSWORD '%s'" % (SQL_USER, SQL_PASSWORD), database="postgres")
        self.query("CREATE DATABASE %s OWNER %s" % (SQL_DATABASE, SQL_USER), database="postgres")

    def lock_keys(self):
        """[{key, value, pttl}] of every lock row held now (owner set, not expired)."""
        try:
            rows = self.query("SELECT convert_from(lock_name, 'UTF8'), convert_from(owner, 'UTF8'), "
                              "(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::int8 "
                              "FROM lockwatch_locks WHERE owner <> '' AND expires_at > clock_timestamp()")
        except OSError as e:
            if "does not exist" in str(e):
                return []  # no lock was ever taken
            raise
        return [{"key": r[0], "value": r[1], "pttl": int(r[2])} for r in rows]


ZK_JAR = "/usr/share/java/zookeeper.jar"


class ZooKeeperMember(Server):
    """One member of the ensemble (java, Debian's zookeeper.jar), on fixed
    loopback ports, restartable on its data directory."""

    def __init__(self, root, i, servers):
        self.name = "zk%d" % (i + 1)
        self.dir = os.path.join(root, self.name)
        os.makedirs(self.dir, exist_ok=True)
        self.port = servers[i][0]
        self.quorum_ports = servers[i][1:]  # its quorum and election ports
        self.proc = None
        self.uid = None  # --nemesis partition: the user it runs as (Soak.own_user)
        with open(os.path.join(self.dir, "myid"), "w") as f:
            f.write("%d\n" % (i + 1))
        with open(os.path.join(self.dir, "zoo.cfg"), "w") as f:
            f.write("tickTime=100\ninitLimit=50\nsyncLimit=5\ndataDir=%s\nclientPort=%d\n"
                    "clientPortAddress=127.0.0.1\nminSessionTimeout=200\nmaxSessionTimeout=60000\n"
                    "admin.enableServer=false\n4lw.commands.whitelist=srvr,ruok\npreAllocSize=1024\n"
                    "maxClientCnxns=0\n" % (self.dir, self.port))
            for j, (_, peer, election) in enumerate(servers):
                f.write("server.%d=127.0.0.1:%d:%d\n" % (j + 1, peer, election))

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def start(self, replicaof=None):
        self.proc = Child(["java", "-Xmx96m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                           "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                           "-cp", ZK_JAR + ":/usr/share/java/slf4j-simple.jar",
                           "org.apache.zookeeper.server.quorum.QuorumPeerMain", os.path.join(self.dir, "zoo.cfg")],
                          os.path.join(self.dir, "server.log"), uid=self.uid)

    def mode(self):
        """'leader', 'follower', or None (no answer within 0.5 s, no quorum)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as c:
                c.settimeout(0.5)
                c.sendall(b"srvr")
                out = b""
                while True:
                    chunk = c.recv(4096)
                    if not chunk:
                        break
                    out += chunk
        except OSError:
            return None
        for line in out.decode(errors="replace").splitlines():
            if line.startswith("Mode: "):
                return line[6:].strip()
        return None


class ZooKeeper:
    """Three members; the locks' nodes are read with ZooKeeper's own
    command-line client."""

    def __init__(self, root):
        ports = set()
        servers = []
        for _ in range(3):
            trio = []
            while len(trio) < 3:
                p = free_port()
                if p not in ports:
                    ports.add(p)
                    trio.append(p)
            servers.append(tuple(trio))
        self.members = [ZooKeeperMember(root, i, servers) for i in range(3)]
        self.name = "zookeeper"

    @property
    def hosts(self):
        return ",".join(m.addr for m in self.members)

    def start(self):
        for m in self.members:
            m.start()

    def healthy(self):
        return all(m.proc is None or m.mode() is not None for m in self.members)

    def leader(self):
        for m in self.members:
            if m.proc is not None and m.mode() == "leader":
                return m
        return None

    def cli(self, command, timeout=20.0):
        """ZooKeeperMain's output for one command (its own JVM)."""
        r = subprocess.run(["java", "-Xmx64m", "-XX:TieredStopAtLevel=1", "-cp",
                            ZK_JAR + ":/usr/share/java/slf4j-nop.jar", "org.apache.zookeeper.ZooKeeperMain",
                            "-server", self.hosts] + command.split(" "),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise OSError("zkCli %s: %s" % (command, (r.stderr or r.stdout).strip()[-300:]))
        return r.stdout

    def lock_keys(self):
        """[{key, value, pttl}] of every lock held now: the lowest node of
        each lock's directory (pttl None: a node lives with its session)."""
        from urllib.parse import unquote
        try:
            listing = self.cli("ls -R /lockwatch")
        except subprocess.TimeoutExpired:
            raise OSError("the ensemble did not answer within 20 s")
        lowest = {}
        for line in listing.splitlines():
            parts = line.strip().split("/")
            if len(parts) != 4 or parts[1] != "lockwatch" or not parts[3].startswith("lock-"):
                continue
            d, node = parts[2], parts[3]
            if d not in lowest or node[-10:] < lowest[d][-10:]:
                lowest[d] = node
        out = []
        for d, node in sorted(lowest.items()):
            data = self.cli("get /lockwatch/%s/%s" % (d, node))
            # The node's data is "<owner token>\n<ttl>"; the client adds
            # lines of its own around it. Owner tokens are 32 hex digits.
            value = next((l.strip() for l in data.splitlines()
                          if len(l.strip()) == 32 and all(c in "0123456789abcdef" for c in l.strip())), "")
            out.append({"key": unquote(d), "value": value, "pttl": None})
        return out


class EtcdMember(Server):
    """One member of the etcd cluster, restartable on its data directory."""

    def __init__(self, root, name, etcd):
        self.name = name
        self.etcd = etcd
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.peer_port = free_port()
        self.proc = None
        self.uid = None  # --nemesis partition: the user it runs as (Soak.own_user)

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def start(self):
        client, peer = "http://" + self.addr, "http://127.0.0.1:%d" % self.peer_port
        argv = [self.etcd.bin, "--name", self.name, "--data-dir", os.path.join(self.dir, "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", self.etcd.initial_cluster(), "--initial-cluster-state", "new",
                "--initial-cluster-token", "lockwatch-soak", "--heartbeat-interval", "50",
                "--election-timeout", "500", "--logger", "zap", "--log-level", "warn"]
        self.proc = Child(argv, os.path.join(self.dir, "server.log"), uid=self.uid)


class Etcd:
    """Three etcd members on loopback ports (every write is fsynced by a
    majority before it is answered; 50 ms heartbeats and 500 ms elections,
    which make etcd's shortest lease one second). Faults: the leader killed
    or stopped, a follower killed, a majority killed for a moment."""

    def __init__(self, root):
        self.bin = shutil.which("etcd")
        self.ctl = shutil.which("etcdctl")
        if not self.bin or not self.ctl:
            raise RuntimeError("etcd or etcdctl not found (Debian packages etcd-server, etcd-client)")
        self.members = [EtcdMember(root, "etcd%d" % i, self) for i in range(3)]
        self.name = "etcd"

    def initial_cluster(self):
        return ",".join("%s=http://127.0.0.1:%d" % (m.name, m.peer_port) for m in self.members)

    def start(self):
        for m in self.members:
            m.start()
        if not Soak.wait_for(self.healthy, 30):
            raise RuntimeError("etcd did not answer within 30 s (see its members' server.log)")

    def ctl_run(self, args, endpoints=None, timeout=3.0):
        eps = endpoints or ",".join(m.addr for m in self.members if m.proc)
        try:
            r = subprocess.run([self.ctl, "--endpoints=" + eps, "--dial-timeout=1s", "--command-timeout=2s"] + args,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, ETCDCTL_API="3"))
        except subprocess.TimeoutExpired:
            raise OSError("etcdctl %s did not answer within %.1f s" % (" ".join(args), timeout))
        if r.returncode != 0:
            raise OSError(r.stderr.strip() or "etcdctl exited with %d" % r.returncode)
        return r.stdout

    def healthy(self):
        """Every member up, and a write through the cluster answered."""
        if not all(m.proc for m in self.members):
            return False
        try:
            self.ctl_run(["put", "lockwatch-soak-health", "1"])
            return True
        except OSError:
            return False

    def leader(self):
        """The member that leads now, or None."""
        for m in self.members:
            if not m.proc:
                continue
            try:
                st = json.loads(self.ctl_run(["endpoint", "status", "-w", "json"], endpoints=m.addr, timeout=2.0))
            except (OSError, ValueError):
                continue
            s = st[0]["Status"]
            # A member that knows no leader (a minority's) leaves "leader" out.
            if s["header"]["member_id"] == s.get("leader"):
                return m
        return None

    def lock_keys(self):
        """[{key, value, pttl}] of every lock key (pttl None: bound to a
        lease; -1: to none, which would never expire)."""
        import base64
        got = json.loads(self.ctl_run(["get", "--prefix", "lockwatch:", "-w", "json"]))
        out = []
        for kv in got.get("kvs", []):
            out.append({"key": base64.b64decode(kv["key"]).decode("utf-8", "replace"),
                        "value": base64.b64decode(kv.get("value", "")).decode("utf-8", "replace"),
                        "pttl": None if kv.get("lease") else -1})
        return out


class Cluster:
    """Six cluster nodes (appendonly), made three masters with a replica
    each by redis-cli --cluster create; nodes keep their ports across
    restarts and rejoin from their nodes.conf."""

    def __init__(self, root):
        self.nodes = [RedisNode(root, "cnode%d" % i, cluster=True) for i in range(6)]

    def start(self):
        for n in self.nodes:
            n.start()
        r = subprocess.run(["redis-cli", "--cluster", "create"] + [n.addr for n in self.nodes]
                           + ["--cluster-replicas", "1", "--cluster-yes"], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("redis-cli --cluster create failed: %s" % (r.stdout + r.stderr)[-500:])

    def live(self):
        return [n for n in self.nodes if n.proc is not None]

    def masters(self):
        return [n for n in self.live() if info(n).get("role") == "master"]

    def replicas_of(self, m):
        return [n for n in self.live() if info(n).get("role") == "slave" and info(n).get("master_port") == str(m.port)]

    def by_port(self, port):
        return next((n for n in self.nodes if n.port == port), None)

    def owner(self, slot):
        """The master of `slot` as a live master sees it, or None."""
        for m in self.masters():
            try:
                for r in m.cmd("CLUSTER", "SLOTS"):
                    if r[0] <= slot <= r[1]:
                        return self.by_port(int(r[2][1]))
            except (OSError, TypeError, IndexError):
                continue
        return None

    def healthy(self):
        """Every node up and cluster_state:ok with all slots served, three
        masters, each with one replica whose link is up."""
        try:
            if len(self.live()) != len(self.nodes):
                return False
            for n in self.nodes:
                ci = dict(l.split(":", 1) for l in n.cmd("CLUSTER", "INFO", timeout=0.5).splitlines() if ":" in l)
                if ci.get("cluster_state") != "ok" or ci.get("cluster_slots_ok") != "16384":
                    return False
            masters = self.masters()
            if len(masters) != 3:
                return False
            for m in masters:
                reps = self.replicas_of(m)
                if len(reps) != 1 or info(reps[0]).get("master_link_status") != "up":
                    return False
            return True
        except (OSError, ValueError, TypeError, AttributeError):
            return False

    def move_slot(self, slot, src, dst, rng):
        """Moves `slot` from master src to master dst as redis-cli --cluster
        reshard does, a key at a time with short pauses (so that calls meet
        ASK and TRYAGAIN). Returns how many keys moved."""
        sid, did = src.cmd("CLUSTER", "MYID"), dst.cmd("CLUSTER", "MYID")
        for node, args in ((dst, ("IMPORTING", sid)), (src, ("MIGRATING", did))):
            r = node.cmd("CLUSTER", "SETSLOT", slot, *args)
            if isinstance(r, ReplyError):
                raise OSError("CLUSTER SETSLOT %s %s on %s: %s" % (slot, args[0], node.name, r))
        moved = 0
        for _ in range(100):
            keys = src.cmd("CLUSTER", "GETKEYSINSLOT", slot, 10)
            if not keys:
                break
            for k in keys:
                time.sleep(rng.uniform(0.0, 0.3))  # a slot half moved: ASK and TRYAGAIN meanwhile
                r = src.cmd("MIGRATE", dst.host, dst.port, "", 0, 5000, "KEYS", k, timeout=6.0)
                if isinstance(r, ReplyError):
                    raise OSError("MIGRATE of %s to %s: %s" % (k, dst.name, r))
                moved += r == "OK"
        for node in [dst, src] + [m for m in self.masters() if m not in (src, dst)]:
            r = node.cmd("CLUSTER", "SETSLOT", slot, "NODE", did)
            if isinstance(r, ReplyError):
                raise OSError("CLUSTER SETSLOT %s NODE on %s: %s" % (slot, node.name, r))
        return moved


def info(node):
    try:
        text = node.cmd("INFO", "replication", timeout=0.5)
    except OSError:
        return {}
    return dict(l.split(":", 1) for l in text.splitlines() if ":" in l)


def run_quiet(argv):
    return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


# ------------------------------------------------------------------ soak


class Soak:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.dir = a.dir
        os.makedirs(os.path.join(self.dir, "hist"), exist_ok=True)
        self.meta = {"seed": a.seed, "topology": a.topology, "seconds": a.seconds, "procs": a.procs,
                     "threads": a.threads, "keys": a.keys, "max_ttl_ms": MAX_TTL_MS, "completed": False}
        self.faults = []
        self.workers = {}  # id -> dict(child, t0, until)
        self.finished_workers = []
        self.next_worker = 0
        self.nodes = []  # lock nodes
        self.sentinels = []
        self.cluster = None
        self.sql = None
        self.zk = None
        self.etcd = None
        self.netns = None
        self.guard = None  # the blackhole route's arguments, once added
        self.net_mode = None  # "netem", "partition" or None
        self.deck = []
        self.nft = False  # --nemesis partition: our nftables table, once made
        self.cgroup = None  # --nemesis starve: the cgroup made for it
        self.fake_files = []
        self.clock_shift = {}  # --nemesis server_clock: server name -> (its shift file, its offset in ns, its seq)

    # ---- set-up

    def setup_netns(self):
        a = self.a
        why = None
        if a.nemesis != "faults":
            why = "--nemesis %s" % a.nemesis
        elif os.geteuid() != 0:
            why = "not running as root"
        elif not shutil.which("ip") or not shutil.which("tc"):
            why = "ip or tc not found (Debian package iproute2)"
        elif a.topology in ("sentinel", "cluster", "sql", "postgresql", "zookeeper", "etcd"):
            why = "%s nodes stay on 127.0.0.1" % a.topology
        if why:
            say("soak: network faults skipped: %s" % why)
            return None
        used = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
        base = os.getpid() % 250
        for i in range(250):
            x = (base + i) % 250 + 1
            if "10.200.%d." % x not in used:
                break
        else:
            say("soak: network faults skipped: no free 10.200.x.0/30 subnet")
            return None
        ns, hif, nif = a.netns, a.host_if, a.ns_if
        guard = ["blackhole", "10.200.%d.0/30" % x, "metric", GUARD_METRIC]
        if not run_quiet(["ip", "route", "add"] + guard):
            say("soak: network faults skipped: cannot add the blackhole route that keeps 10.200.%d.0/30 local" % x)
            return None
        self.guard = guard
        with open(os.path.join(self.dir, "netns.route"), "w") as f:
            f.write(" ".join(guard) + "\n")
        ok = (run_quiet(["ip", "netns", "add", ns])
              and run_quiet(["ip", "link", "add", hif, "type", "veth", "peer", "name", nif])
              and run_quiet(["ip", "link", "set", nif, "netns", ns])
              and run_quiet(["ip", "addr", "add", "10.200.%d.1/30" % x, "dev", hif])
              and run_quiet(["ip", "link", "set", hif, "up"])
              and run_quiet(["ip", "netns", "exec", ns, "ip", "addr", "add", "10.200.%d.2/30" % x, "dev", nif])
              and run_quiet(["ip", "netns", "exec", ns, "ip", "link", "set", nif, "up"])
              and run_quiet(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]))
        self.netns = ns  # cleaned up even if half made
        if not ok:
            say("soak: network faults skipped: cannot make a network namespace with a veth pair here")
            return None
        if run_quiet(["tc", "qdisc", "add", "dev", hif, "root", "netem", "delay", "1ms"]):
            run_quiet(["tc", "qdisc", "del", "dev", hif, "root"])
            self.net_mode = "netem"
            say("soak: network faults: tc netem delay and loss on the veth link to namespace %s" % ns)
        else:
            self.net_mode = "partition"
            say("soak: tc netem is not available in this kernel: network delay/loss skipped; "
                "the link to namespace %s is cut instead (partitions)" % ns)
        return "10.200.%d.2" % x

    def setup(self):
        a = self.a
        ns_addr = self.setup_netns()
        self.resource = RedisNode(self.dir, "resource", persist=False)
        self.resource.start()
        if a.topology == "single":
            if ns_addr:
                self.nodes = [RedisNode(self.dir, "redis", port=6379, host=ns_addr, netns=self.netns)]
            else:
                self.nodes = [RedisNode(self.dir, "redis")]
        elif a.topology == "cluster":
            self.cluster = Cluster(self.dir)
            self.nodes = self.cluster.nodes
        elif a.topology == "sql":
            self.sql = MariaDb(self.dir)
        elif a.topology == "postgresql":
            self.sql = Postgres(self.dir)
        elif a.topology == "zookeeper":
            self.zk = ZooKeeper(self.dir)
        elif a.topology == "etcd":
            self.etcd = Etcd(self.dir)
        elif a.topology == "redlock":
            self.nodes = [RedisNode(self.dir, "node%d" % i) for i in range(2)]
            if ns_addr:
                self.nodes.append(RedisNode(self.dir, "node2", port=6379, host=ns_addr, netns=self.netns))
            else:
                self.nodes.append(RedisNode(self.dir, "node2"))
        else:
            self.nodes = [RedisNode(self.dir, "data0"), RedisNode(self.dir, "data1")]
        if self.nft:
            for i, server in enumerate(self.own_user_servers()):
                self.own_user(server, SERVER_UID0 + i)
        if a.nemesis == "server_clock":
            self.setup_clock_shift()
        if self.cluster:
            self.cluster.start()
            if not self.wait_for(self.cluster.healthy, 40):
                raise RuntimeError("the cluster was not healthy within 40 s")
            self.url = "redis-cluster://" + ",".join(n.addr for n in self.nodes[:3])
        elif self.zk:
            self.zk.start()
            if not self.wait_for(lambda: self.zk.leader() is not None and self.zk.healthy(), 60):
                raise RuntimeError("the ZooKeeper ensemble did not serve within 60 s")
            self.url = "zookeeper://" + self.zk.hosts
        elif self.etcd:
            self.etcd.start()
            self.url = "etcd://" + ",".join(m.addr for m in self.etcd.members)
        elif self.sql:
            self.sql.start()
            self.sql.create_user()
            scheme = "postgresql" if a.topology == "postgresql" else "mysql"
            self.url = "%s://%s:%s@%s/%s" % (scheme, SQL_USER, SQL_PASSWORD, self.sql.addr, SQL_DATABASE)
        else:
            for i, n in enumerate(self.nodes):
                n.start(replicaof=self.nodes[0].port if a.topology == "sentinel" and i > 0 else None)
        if a.topology in ("cluster", "sql", "postgresql", "zookeeper", "etcd"):
            pass
        elif a.topology == "sentinel":
            self.sentinels = [Sentinel(self.dir, "sentinel%d" % i, self.nodes[0].port) for i in range(3)]
            if not self.wait_for(self.sentinel_healthy, 40):
                raise RuntimeError("the sentinels did not see a healthy master and replica within 40 s")
            self.url = "redis-sentinel://%s/%s" % (",".join("127.0.0.1:%d" % s.port for s in self.sentinels),
                                                   SENTINEL_MASTER)
        else:
            self.url = ",".join("redis://%s" % n.addr for n in self.nodes)
        self.meta.update(url=self.url, majority=len(self.nodes) // 2 + 1 if a.topology == "redlock" else 1,
                         net_faults=self.net_mode or "none")
        mr = 1 if a.min_replicas is None else a.min_replicas
        self.meta["min_replicas"] = mr
        desc = {"single": "one redis-server", "redlock": "Redlock over 3 redis-server masters",
                "sentinel": "a master, a replica and 3 sentinels (min_replicas %d)" % mr,
                "cluster": "a Redis Cluster of 3 masters and 3 replicas (node timeout 1 s, min_replicas %d)" % mr,
                "sql": "one mariadbd", "postgresql": "one postgres",
                "zookeeper": "a ZooKeeper ensemble of 3 members (tick 100 ms)",
                "etcd": "an etcd cluster of 3 members"}[a.topology]
        durable = ("flush at every commit" if a.topology in ("sql", "postgresql", "zookeeper")
                   else "a majority's fsync" if a.topology == "etcd" else "appendonly, fsync always")
        say("soak: %s (%s) at %s; resource on %s" % (desc, durable, self.url, self.resource.addr))
        say("soak: %d processes x %d threads on %d keys for %d s" % (a.procs, a.threads, a.keys, a.seconds))

    @staticmethod
    def wait_for(pred, seconds):
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            try:
                if pred():
                    return True
            except OSError:
                pass
            time.sleep(0.1)  # polling other processes' state
        return False

    # ---- sentinel state

    def sentinel_master(self):
        """The data node all sentinels name as master, or None."""
        ports = set()
        for s in self.sentinels:
            try:
                r = s.cmd("SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER)
            except OSError:
                return None
            if not isinstance(r, list):
                return None
            ports.add(int(r[1]))
        if len(ports) != 1:
            return None
        port = ports.pop()
        return next((n for n in self.nodes if n.port == port), None)

    def sentinel_healthy(self):
        try:
            return self._sentinel_healthy()
        except (OSError, ValueError, TypeError):
            return False

    def _sentinel_healthy(self):
        m = self.sentinel_master()
        if m is None:
            return False
        r = next(n for n in self.nodes if n is not m)
        mi, ri = info(m), info(r)
        if mi.get("role") != "master" or "state=online" not in mi.get("slave0", ""):
            return False
        if ri.get("role") != "slave" or ri.get("master_link_status") != "up" or ri.get("master_port") != str(m.port):
            return False
        for s in self.sentinels:
            mi = s.master_info()
            if mi.get("flags") != "master" or mi.get("num-slaves") != "1" or mi.get("num-other-sentinels") != "2":
                return False
            reps = s.cmd("SENTINEL", "replicas", SENTINEL_MASTER)
            if not isinstance(reps, list) or len(reps) < 1:
                return False
            fields = [dict(zip(x[0::2], x[1::2])) for x in reps]
            if not any(f.get("port") == str(r.port) and f.get("flags") == "slave" for f in fields):
                return False
        return True

    # ---- workers

    def start_worker(self, until_ns, env=None):
        wid = "p%d" % self.next_worker
        uid = WORKER_UID0 + self.next_worker if self.nft else None
        self.next_worker += 1
        if uid is not None:
            # Every connection this user opens carries its uid as conntrack
            # mark, replies included: a cut drops them by mark.
            self.nft_cmd("insert rule inet %s out ct state new meta skuid %d ct mark set %d" % (NFT_TABLE, uid, uid))
        argv = [self.a.worker, "--redis", self.url, "--resource", self.resource.addr, "--id", wid,
                "--history", os.path.join(self.dir, "hist", wid + ".jsonl"), "--until-ns", str(until_ns),
                "--threads", str(self.a.threads), "--keys", str(self.a.keys),
                "--seed", str(self.a.seed * 1000 + self.next_worker)]
        if self.a.topology in ("sentinel", "cluster") and self.a.min_replicas != 0:
            argv += ["--min-replicas", str(self.a.min_replicas or 1)]
        # Read-write locks and semaphores where the store keeps them
        # (Redlock: no permits; not etcd).
        kinds = {"single": "rw,sem", "sentinel": "rw,sem", "cluster": "rw,sem", "redlock": "rw",
                 "sql": "rw,sem", "postgresql": "rw,sem", "zookeeper": "rw,sem"}.get(self.a.topology)
        if kinds:
            argv += ["--kinds", kinds]
        child = Child(argv, os.path.join(self.dir, wid + ".log"), uid=uid, env=env)
        self.workers[wid] = {"w": wid, "child": child, "t0": mono_ns(), "until": until_ns, "uid": uid,
                             "fake": bool(env)}
        return wid

    def end_worker(self, wid, how):
        w = self.workers.pop(wid)
        rc = w["child"].p.returncode
        self.finished_workers.append({"w": wid, "pid": w["child"].pid, "t0": w["t0"], "t1": mono_ns(),
                                      "how": how, "rc": rc, "uid": w["uid"], "fake": w["fake"]})
        w["child"].log.close()

    def reap_workers(self):
        for wid, w in list(self.workers.items()):
            rc = w["child"].p.poll()
            if rc is None:
                continue
            clean = rc == 0 and mono_ns() >= w["until"]
            self.end_worker(wid, "clean" if clean else "crashed")
            if not clean and not w["fake"]:
                say("  worker %s exited early with status %s (see %s.log)" % (wid, rc, wid))
                if mono_ns() < w["until"]:
                    self.start_worker(w["until"])

    # ---- faults

    def fault(self, kind, target, t0, t1=None, **detail):
        f = {"kind": kind, "target": target, "t0": t0, "t1": t1 or mono_ns()}
        f.update(detail)
        self.faults.append(f)
        extra = " ".join("%s=%s" % (k, ("%.2f" % v if isinstance(v, float) else v)) for k, v in detail.items())
        say("  +%5.1fs %-14s %s %s" % ((t0 - self.t_start) / 1e9, kind, target, extra))

    def live_worker(self):
        live = sorted(w for w in self.workers if not self.workers[w]["fake"])
        return self.rng.choice(live) if live else None

    def holder_kill(self):
        wid = self.live_worker()
        if wid is None:
            return
        w = self.workers[wid]
        t0 = mono_ns()
        w["child"].kill()
        self.end_worker(wid, "killed")
        new = self.start_worker(w["until"])
        self.fault("holder_kill", wid, t0, pid=w["child"].pid, replaced_by=new)

    def holder_stop(self):
        wid = self.live_worker()
        if wid is None:
            return
        w = self.workers[wid]
        d = self.rng.uniform(0.1, 3.0)
        t0 = mono_ns()
        w["child"].signal(signal.SIGSTOP)
        time.sleep(d)
        w["child"].signal(signal.SIGCONT)
        self.fault("holder_stop", wid, t0, w=wid, pid=w["child"].pid, seconds=d)

    def node_kill(self, kind, node, down, replicaof=None):
        """SIGKILL, `down` seconds, start again (as a replica of the port
        replicaof() names, if any)."""
        t0 = mono_ns()
        node.kill()
        time.sleep(down)
        detail = {}
        port = replicaof() if replicaof else None
        if replicaof:
            detail["restarted_as"] = "replica" if port else "master"
        if self.sql:
            node.start()
        else:
            node.start(replicaof=port)
        if self.sentinels:
            self.wait_for(lambda: self.sentinel_master() is not None, 3)
            detail["master_now"] = getattr(self.sentinel_master(), "name", "undecided")
        self.fault(kind, node.name, t0, down=down, **detail)

    def node_hang(self, kind, node, d):
        t0 = mono_ns()
        node.pause()
        time.sleep(d)
        node.resume()
        self.fault(kind, node.name, t0, seconds=d)

    def zk_fault(self, kind):
        rng, zk = self.rng, self.zk
        leader = zk.leader() or rng.choice(zk.members)
        if kind == "zk_member_kill":
            self.node_kill(kind, rng.choice(zk.members), rng.uniform(0.2, 3.0))
        elif kind == "zk_leader_kill":
            self.node_kill(kind, leader, rng.uniform(0.2, 3.0))
        elif kind == "zk_leader_hang":
            self.node_hang(kind, leader, rng.uniform(0.3, 3.0))
        else:
            # No quorum for a while: nothing is granted, holders lose their leases.
            down = rng.sample(zk.members, 2)
            t0 = mono_ns()
            for m in down:
                m.kill()
            d = rng.uniform(0.5, 3.0)
            time.sleep(d)
            for m in down:
                m.start()
            self.fault(kind, "+".join(m.name for m in down), t0, down=d)
        self.wait_for(lambda: zk.leader() is not None, 20)

    def lock_slot(self):
        """The cluster slot of one of the workers' locks, picked at random."""
        key = "lockwatch:{soak:k%d}" % self.rng.randrange(self.a.keys)
        return int(self.nodes[0].cmd("CLUSTER", "KEYSLOT", key)) if self.nodes[0].proc else None

    def cluster_fault(self, kind):
        """One cluster fault on the master of a lock's slot (the cluster is
        healthy when it starts)."""
        rng, c = self.rng, self.cluster
        slot = self.lock_slot()
        m = c.owner(slot)
        if m is None:
            return
        if kind == "master_kill":
            # Its replica takes over after the node timeout; back, it rejoins as a replica.
            self.node_kill("master_kill", m, rng.uniform(0.5, 3.0))
        elif kind == "master_hang":
            # Shorter than the node timeout: a hang, not a failover.
            self.node_hang("master_hang", m, rng.uniform(0.2, 0.6))
        elif kind == "failover":
            r = c.replicas_of(m)[0]
            t0 = mono_ns()
            answer = r.cmd("CLUSTER", "FAILOVER")
            done = self.wait_for(lambda: info(r).get("role") == "master", 10)
            self.fault("failover", m.name, t0, to=r.name, answer=str(answer), done=done)
        elif kind == "slot_move":
            dst = rng.choice([x for x in c.masters() if x is not m])
            t0 = mono_ns()
            try:
                moved, error = c.move_slot(slot, m, dst, rng), ""
            except OSError as e:
                moved, error = -1, str(e)
            self.fault("slot_move", m.name, t0, slot=slot, to=dst.name, keys=moved, error=error)

    def etcd_fault(self, kind):
        """One etcd fault (the cluster is healthy when it starts): the
        leader killed or stopped, a follower killed, or the leader and a
        follower killed at once (no majority: no lock granted meanwhile)."""
        rng, e = self.rng, self.etcd
        leader = e.leader()
        if leader is None:
            return
        followers = [m for m in e.members if m is not leader]
        if kind == "leader_hang":
            self.node_hang("leader_hang", leader, rng.uniform(0.3, 3.0))
            return
        down = {"leader_kill": [leader], "follower_kill": [rng.choice(followers)],
                "majority_down": [leader, rng.choice(followers)]}[kind]
        d = rng.uniform(0.5, 3.0) if kind != "majority_down" else rng.uniform(0.5, 2.0)
        t0 = mono_ns()
        for m in down:
            m.kill()
        time.sleep(d)
        for m in down:
            m.start()
        self.wait_for(e.healthy, 10)
        self.fault(kind, "+".join(m.name for m in down), t0, down=d)

    def net_fault(self):
        node = next(n for n in self.nodes if n.netns)
        d = self.rng.uniform(1.0, 4.0)
        ends = [[], ["ip", "netns", "exec", self.netns]]
        devs = [self.a.host_if, self.a.ns_if]
        t0 = mono_ns()
        if self.net_mode == "netem":
            if self.rng.random() < 0.5:
                kind, spec = "net_delay", ["delay", "%dms" % self.rng.randint(20, 300), "%dms" % self.rng.randint(0, 50)]
            else:
                kind, spec = "net_loss", ["loss", "%d%%" % self.rng.randint(10, 60)]
            for pre, dev in zip(ends, devs):
                run_quiet(pre + ["tc", "qdisc", "replace", "dev", dev, "root", "netem"] + spec)
            time.sleep(d)
            for pre, dev in zip(ends, devs):
                run_quiet(pre + ["tc", "qdisc", "del", "dev", dev, "root"])
            self.fault(kind, node.name, t0, netem=" ".join(spec), seconds=d)
        else:
            # The namespace's end: the host's route stays (see the top).
            run_quiet(ends[1] + ["ip", "link", "set", self.a.ns_if, "down"])
            time.sleep(d)
            run_quiet(ends[1] + ["ip", "link", "set", self.a.ns_if, "up"])
            self.wait_for(node.ping, 10)
            self.fault("net_partition", node.name, t0, seconds=d)

    # ---- nemeses other than the default faults (--nemesis)

    def nft_cmd(self, text):
        r = subprocess.run(["nft", text], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("nft %s: %s" % (text, r.stderr.strip()))

    def setup_nft(self):
        """--nemesis partition runs in a network namespace of its own
        (scripts/soak makes it and runs this inside): every process talks
        over its loopback, and the table below (gone with the namespace)
        drops packets silently. A connection is told apart by the user
        that opened it (a worker's uid; on etcd, ZooKeeper and Cluster a
        server's, SERVER_UID0 + its index; 0 for the other servers and this
        script), kept as its conntrack mark for the replies too, and by the
        port it went to (each server has its own)."""
        if os.geteuid() != 0 or not shutil.which("nft"):
            raise RuntimeError("--nemesis partition needs root and nft (Debian package nftables)")
        self.nft_cmd("add table inet %s" % NFT_TABLE)
        self.nft = True
        self.nft_cmd("add chain inet %s out { type filter hook output priority 0; policy accept; }" % NFT_TABLE)
        self.nft_cmd("add chain inet %s cut" % NFT_TABLE)
        self.nft_cmd("add rule inet %s out jump cut" % NFT_TABLE)
        say("soak: partitions: nftables drops in network namespace %s; workers run as uids %d+" %
            (self.a.netns, WORKER_UID0))

    def own_user_servers(self):
        """The servers that run as users of their own under --nemesis
        partition: those whose peer links a cut tells apart."""
        if self.etcd:
            return self.etcd.members
        if self.zk:
            return self.zk.members
        if self.cluster:
            return self.cluster.nodes
        return []

    def own_user(self, server, uid):
        """Runs `server` as `uid` (its directory its own), and marks every
        connection that user opens, replies included, with its uid."""
        server.uid = uid
        os.chmod(self.dir, 0o711)  # passed through to its own directory, not listed
        for d, _, files in os.walk(server.dir):
            os.chown(d, uid, uid)
            for name in files:
                os.chown(os.path.join(d, name), uid, uid)
        self.nft_cmd("insert rule inet %s out ct state new meta skuid %d ct mark set %d" % (NFT_TABLE, uid, uid))

    def server_ports(self):
        """Every port a worker may reach a lock server on (not the resource's)."""
        if self.zk:
            return sorted(m.port for m in self.zk.members)
        if self.etcd:
            return sorted(m.port for m in self.etcd.members)
        if self.sql:
            return [self.sql.port]
        ports = [n.port for n in self.nodes] + [s.port for s in self.sentinels]
        ports += [n.bus_port for n in self.nodes if n.bus_port]
        return sorted(ports)

    def cut(self, rules, seconds):
        self.nft_cmd("flush chain inet %s cut" % NFT_TABLE)
        for r in rules:
            self.nft_cmd("add rule inet %s cut %s drop" % (NFT_TABLE, r))
        time.sleep(seconds)
        self.nft_cmd("flush chain inet %s cut" % NFT_TABLE)

    def holding_worker(self, seconds=3.0, with_key=False):
        """A worker (not on a faked clock) in a long hold of an exclusive
        lease (its history's "a" without its "c"), waiting up to `seconds`
        for one; else any. With with_key, (the worker, the key it holds, or
        None)."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            holding = []
            for wid in sorted(self.workers):
                if self.workers[wid]["fake"]:
                    continue
                open_ops = {}
                try:
                    with open(os.path.join(self.dir, "hist", wid + ".jsonl"), "rb") as f:
                        f.seek(0, os.SEEK_END)
                        f.seek(max(0, f.tell() - 16384))
                        lines = f.read().splitlines()[1:]
                except OSError:
                    continue
                for line in lines:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    if e.get("e") == "a" and not e.get("kind"):
                        open_ops[e["op"]] = e.get("k")
                    elif e.get("e") == "c":
                        open_ops.pop(e["op"], None)
                if open_ops:
                    holding.append((wid, open_ops[sorted(open_ops)[0]]))
            if holding:
                wid, key = self.rng.choice(holding)
                return (wid, key) if with_key else wid
            time.sleep(0.02)  # polling the workers' histories
        wid = self.live_worker()
        return (wid, None) if with_key else wid

    def holder_cut(self, kind):
        """A holder alone cut off from every lock server (the others and the
        resource still reach them): both ways, only its requests dropped
        (to_store), or only the servers' answers (from_store)."""
        wid = self.holding_worker()
        if wid is None:
            return
        uid = self.workers[wid]["uid"]
        way = {"holder_cut": "", "holder_cut_to_store": "ct direction original ",
               "holder_cut_from_store": "ct direction reply "}[kind]
        ports = ", ".join(str(p) for p in self.server_ports())
        d = self.rng.uniform(3.0, MAX_FAULT_S)  # longer than the longest ttl
        t0 = mono_ns()
        self.cut(["ct mark %d %smeta l4proto tcp ct original proto-dst { %s }" % (uid, way, ports)], d)
        self.fault(kind, wid, t0, w=wid, seconds=d)

    def master_isolated(self):
        """Sentinel: the master cut off from its replica and the sentinels
        (every connection opened by a server), and from some of the
        workers; the other workers still reach it."""
        m = self.sentinel_master() if self.sentinel_healthy() else None
        if m is None:
            return self.holder_cut("holder_cut")
        live = sorted(w for w in self.workers if not self.workers[w]["fake"])
        cut = self.rng.sample(live, len(live) // 2)
        marks = ", ".join(str(x) for x in [0] + [self.workers[w]["uid"] for w in cut])
        d = self.rng.uniform(2.0, MAX_FAULT_S)  # longer than down-after-milliseconds (1 s)
        t0 = mono_ns()
        self.cut(["ct mark { %s } meta l4proto tcp ct original proto-dst %d" % (marks, m.port)], d)
        self.wait_for(self.sentinel_healthy, 20)
        self.fault("master_isolated", m.name, t0, seconds=d, with_workers=",".join(cut) or "none",
                   master_now=getattr(self.sentinel_master(), "name", "undecided"))

    @staticmethod
    def ports_of(server):
        """Every port `server` listens on: clients', peers', bus, quorum, election."""
        extra = (getattr(server, "peer_port", None), getattr(server, "bus_port", None))
        ports = [server.port] + [p for p in extra if p]
        return ports + list(getattr(server, "quorum_ports", ()))

    def split(self, kind, server, minority, seconds, settled, oneway=False, **detail):
        """A server cut off from its peers (every connection between it and
        another server of the topology, whichever opened it), together
        with the workers in `minority`, which lose every other server,
        while the other workers lose it. With oneway, only what the server
        sends its peers is dropped (it hears them, they do not hear it) and
        the workers are left alone. Then waits for the topology to be
        healthy again (`settled`, up to 30 s)."""
        others = [x for x in self.own_user_servers() if x is not server]

        def fmt(xs):
            return ", ".join(str(x) for x in sorted(set(xs)))
        inside, outside = fmt(self.ports_of(server)), fmt(p for o in others for p in self.ports_of(o))
        peers = fmt(o.uid for o in others)
        tcp = "meta l4proto tcp ct original proto-dst"
        if oneway:
            rules = ["ct mark %d ct direction original %s { %s }" % (server.uid, tcp, outside),
                     "ct mark { %s } ct direction reply %s { %s }" % (peers, tcp, inside)]
        else:
            rules = ["ct mark %d %s { %s }" % (server.uid, tcp, outside),
                     "ct mark { %s } %s { %s }" % (peers, tcp, inside)]
            live = sorted(self.workers)
            with_it = [self.workers[w]["uid"] for w in live if w in minority]
            without = [self.workers[w]["uid"] for w in live if w not in minority]
            if with_it:
                rules.append("ct mark { %s } %s { %s }" % (fmt(with_it), tcp, outside))
            if without:
                rules.append("ct mark { %s } %s { %s }" % (fmt(without), tcp, inside))
        # Every worker's calls may meet the cut (the majority's on the
        # isolated server): a request it holds back is delivered by TCP
        # once it heals (see soak_check.py, released-held).
        ws = ",".join(sorted(self.workers))
        t0 = mono_ns()
        self.cut(rules, seconds)
        t1 = mono_ns()
        healthy = self.wait_for(settled, 30)
        self.fault(kind, server.name, t0, t1=t1, seconds=seconds, ws=ws,
                   with_workers=",".join(sorted(minority)) or "none", healthy_after=(mono_ns() - t1) / 1e9
                   if healthy else -1.0, **detail)

    def member_isolated(self, kind):
        """etcd, ZooKeeper: the leader or a follower (even odds) cut off
        from the other two members with the workers in the middle of a
        hold (a minority side), or, member_oneway, only its messages to
        them dropped."""
        if self.etcd:
            members = self.etcd.members

            def settled():
                return self.etcd.healthy() and self.etcd.leader() is not None
        else:
            members = self.zk.members

            def settled():
                return self.zk.leader() is not None and self.zk.healthy()
        minority = [] if kind == "member_oneway" else [w for w in [self.holding_worker()] if w]
        if not settled():
            return self.holder_cut("holder_cut")
        leader = self.etcd.leader() if self.etcd else self.zk.leader()
        if leader is None:
            return self.holder_cut("holder_cut")
        m = leader if self.rng.random() < 0.5 else self.rng.choice([x for x in members if x is not leader])
        d = self.rng.uniform(3.0, MAX_FAULT_S)  # longer than the longest ttl
        self.split(kind, m, minority, d, settled, oneway=kind == "member_oneway",
                   role="leader" if m is leader else "follower")

    def cluster_master_isolated(self, kind="master_isolated"):
        """Redis Cluster: the master of the key a holder holds (else of a
        lock's slot) cut off from the other nodes (bus and replication)
        with that holder, a minority: the majority fails it over to its
        replica after the node timeout, while the holder still reaches it.
        master_oneway: only what that master sends the other nodes is
        dropped (it hears them, they do not hear it), the workers left
        alone: the others fail it over while every client still reaches it."""
        c = self.cluster
        if not c.healthy():
            return self.holder_cut("holder_cut")
        wid, key = self.holding_worker(with_key=True)
        if key is None:
            slot = self.lock_slot()
        else:
            slot = int(self.nodes[0].cmd("CLUSTER", "KEYSLOT", "lockwatch:{soak:%s}" % key))
        m = c.owner(slot)
        if m is None or wid is None:
            return self.holder_cut("holder_cut")
        replica = c.replicas_of(m)
        # Longer than the node timeout (1 s) and the replica's election that follows it.
        d = self.rng.uniform(3.0, MAX_FAULT_S)
        oneway = kind == "master_oneway"
        self.split(kind, m, [] if oneway else [wid], d, c.healthy, oneway=oneway, slot=slot, key=key or "",
                   replica=replica[0].name if replica else "none")
        self.faults[-1]["master_now"] = getattr(c.owner(slot), "name", "undecided")

    def setup_cgroup(self):
        """--nemesis starve: a CPU cgroup (v1 cpu controller, or v2) whose
        quota is 1 ms per period of 1 s (v1's longest) while a holder is in it."""
        name = self.a.cgroup
        for root, v2 in ((CGROUP_CPU, False), ("/sys/fs/cgroup", True)):
            path = os.path.join(root, name)
            if not os.path.isfile(os.path.join(root, "cgroup.procs")):
                continue
            if v2 and "cpu" not in open(os.path.join(root, "cgroup.subtree_control")).read().split():
                continue
            try:
                os.mkdir(path)
                self.cgroup = (path, v2)
                if v2:
                    with open(os.path.join(path, "cpu.max"), "w") as f:
                        f.write("1000 1000000")
                else:
                    with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
                        f.write("1000000")
                    with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
                        f.write("1000")
                say("soak: starvation: a holder's process moved into cgroup %s (1 ms of CPU a second)" % path)
                return
            except OSError as e:
                say("soak: cannot make cgroup %s: %s" % (path, e))
        raise RuntimeError("--nemesis starve needs a writable CPU cgroup (v1 %s or v2 with cpu)" % CGROUP_CPU)

    def holder_starve(self):
        wid = self.holding_worker()
        if wid is None:
            return
        pid = self.workers[wid]["child"].pid
        path, v2 = self.cgroup
        home = None
        with open("/proc/%d/cgroup" % pid) as f:
            for line in f:
                _, ctrl, where = line.rstrip("\n").split(":", 2)
                if (v2 and ctrl == "") or (not v2 and "cpu" in ctrl.split(",")):
                    home = os.path.join(os.path.dirname(path), where.lstrip("/"))
        d = self.rng.uniform(2.0, MAX_FAULT_S)
        t0 = mono_ns()
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        time.sleep(d)
        try:
            with open(os.path.join(home, "cgroup.procs"), "w") as f:
                f.write(str(pid))
        except (OSError, TypeError):
            pass  # the worker is gone, or its home is unknown: cleanup() kills what is left in the cgroup
        self.fault("holder_starve", wid, t0, w=wid, pid=pid, seconds=d)

    def client_clock(self, kind):
        """One more worker, for a few seconds, under libfaketime: its
        monotonic clock (the leases') at 2x or 0.5x, or its wall clock
        stepped forward and back while the monotonic one is left alone (an
        NTP step). The history's times are the kernel's (soak_worker.cpp)."""
        d = self.rng.uniform(4.0, 8.0)
        env = dict(os.environ, LD_PRELOAD=FAKETIME_LIB)
        detail = {}
        if kind == "client_jump":
            path = os.path.join(self.dir, "faketime%d" % len(self.fake_files))
            self.fake_files.append(path)
            with open(path, "w") as f:
                f.write("+0\n")
            env.update(FAKETIME_TIMESTAMP_FILE=path, FAKETIME_NO_CACHE="1", FAKETIME_DONT_FAKE_MONOTONIC="1")
        else:
            rate = {"client_fast": "2", "client_slow": "0.5"}[kind]
            env.update(FAKETIME="+0 x" + rate, FAKETIME_NO_CACHE="1")
            detail["rate"] = rate
        t0 = mono_ns()
        wid = self.start_worker(t0 + int(d * 1e9), env=env)
        if kind == "client_jump":
            steps = []
            until = time.monotonic() + d
            while time.monotonic() < until - 0.5:
                time.sleep(self.rng.uniform(0.5, 1.5))
                step = self.rng.choice([-1, 1]) * self.rng.randint(1, 60)
                steps.append(step)
                with open(path + ".new", "w") as f:
                    f.write("%+ds\n" % step)
                os.rename(path + ".new", path)
            detail["steps_s"] = ",".join(str(x) for x in steps)
        while wid in self.workers and mono_ns() < t0 + int((d + 60) * 1e9):
            self.reap_workers()
            time.sleep(0.05)
        self.fault(kind, wid, t0, w=wid, seconds=d, **detail)

    def clock_servers(self):
        """The lock servers whose wall clock --nemesis server_clock steps."""
        return [self.sql] if self.sql else list(self.nodes)

    def setup_clock_shift(self):
        """--nemesis server_clock: every lock server runs with the shim
        (clock_shift.cpp) preloaded, its wall clock shifted by what a file
        of its own holds (nothing at first)."""
        lib = os.path.join(self.dir, CLOCK_SHIFT_LIB)
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(self.a.worker)), CLOCK_SHIFT_LIB), lib)
        os.chmod(lib, 0o755)  # a server may run as another user (postgres)
        for server in self.clock_servers():
            path = os.path.join(self.dir, "clock-shift-" + server.name)
            with open(path, "wb") as f:
                f.write(struct.pack("=5q", 0, 0, 0, 0, 0))
            os.chmod(path, 0o644)
            server.env = dict(os.environ, LD_PRELOAD=lib, LOCKWATCH_CLOCK_SHIFT=path)
            self.clock_shift[server.name] = (path, 0, 0)
        say("soak: server clocks: %s run with their wall clock shifted (%s)" %
            (", ".join(x.name for x in self.clock_servers()), CLOCK_SHIFT_LIB))

    def write_clock_shift(self, server, offset_ns, rate_ppm=0, start_ns=0, end_ns=0):
        """Rewrites a server's shift (clock_shift.cpp's layout), which the
        server reads mapped at its next clock read: its seq odd while the
        other fields change (a seqlock), even again after."""
        path, _, seq = self.clock_shift[server.name]
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, struct.pack("=q", seq + 1), 32)
            os.pwrite(fd, struct.pack("=4q", offset_ns, rate_ppm, start_ns, end_ns), 0)
            os.pwrite(fd, struct.pack("=q", seq + 2), 32)
        finally:
            os.close(fd)
        self.clock_shift[server.name] = (path, offset_ns, seq + 2)

    def clock_server(self):
        """The server a server_clock fault moves the clock of: the master on
        Sentinel, the node holding a lock's slot on Cluster, one of
        Redlock's; None while a failover settles."""
        if self.a.topology == "sentinel":
            return self.sentinel_master() if self.sentinel_healthy() else None
        if self.cluster:
            return self.cluster.owner(self.lock_slot()) if self.cluster.healthy() else None
        return self.rng.choice(self.clock_servers())

    def server_jump(self):
        """A lock server's wall clock stepped forward by 1-3 s, for good (an
        NTP step; the monotonic clock untouched). Then waits 3-4.5 s,
        longer than the longest ttl, so that what the step does falls
        within the fault."""
        server = self.clock_server()
        if server is None:
            time.sleep(1.0)  # no master to step now: a failover is settling
            return
        _, total, _ = self.clock_shift[server.name]
        jump = self.rng.uniform(1.0, 3.0)
        d = self.rng.uniform(3.0, MAX_FAULT_S)
        total += int(jump * 1e9)
        ws = ",".join(sorted(self.workers))
        t0 = mono_ns()
        self.write_clock_shift(server, total)
        time.sleep(d)
        self.fault("server_jump", server.name, t0, seconds=d, jump_s=jump, shift_s=total / 1e9, ws=ws)

    def server_rate(self, kind):
        """A lock server's wall clock run at 2x (server_fast) or 0.5x
        (server_slow) for 3-4.5 s, longer than the longest ttl (its
        monotonic clock untouched). The shim ends the rate by itself at the
        fault's end, the clock going on from where the rate took it (no
        step back); the soak then folds what the rate added into the
        offset."""
        server = self.clock_server()
        if server is None:
            time.sleep(1.0)  # no master to move now: a failover is settling
            return
        rate_ppm = {"server_fast": 2000000, "server_slow": 500000}[kind]
        _, offset, _ = self.clock_shift[server.name]
        d = self.rng.uniform(3.0, MAX_FAULT_S)
        ws = ",".join(sorted(self.workers))
        t0 = mono_ns()
        end = t0 + int(d * 1e9)
        self.write_clock_shift(server, offset, rate_ppm, t0, end)
        time.sleep(max(0.0, (end - mono_ns()) / 1e9))
        # What the shim added by the end, truncated toward zero as it does.
        moved = (rate_ppm - 1000000) * (end - t0)
        moved = moved // 1000000 if moved >= 0 else -(-moved // 1000000)
        while mono_ns() <= end:
            time.sleep(0.001)
        self.write_clock_shift(server, offset + moved)
        self.fault(kind, server.name, t0, seconds=d, rate=rate_ppm / 1e6, moved_s=moved / 1e9,
                   shift_s=(offset + moved) / 1e9, ws=ws)

    def inject_nemesis(self):
        topo, rng = self.a.topology, self.rng
        if not self.deck:
            if self.a.nemesis == "partition":
                self.deck = ["holder_cut", "holder_cut", "holder_cut_to_store", "holder_cut_from_store"]
                if topo == "sentinel":
                    self.deck += ["master_isolated", "master_isolated"]
                elif topo == "cluster":
                    self.deck += ["master_isolated", "master_isolated", "master_oneway"]
                elif topo in ("etcd", "zookeeper"):
                    self.deck += ["member_isolated", "member_isolated", "member_oneway"]
            elif self.a.nemesis == "clock":
                self.deck = ["client_fast", "client_slow", "client_jump"]
            elif self.a.nemesis == "server_clock":
                self.deck = ["server_jump", "server_fast", "server_slow"]
            else:
                self.deck = ["holder_starve"]
            rng.shuffle(self.deck)
            split = next((k for k in self.deck if k in ("member_isolated", "master_isolated")), None)
            if not self.faults and split and topo in ("etcd", "zookeeper", "cluster"):
                # A server cut off from its peers comes first, so that a
                # short run sees it too, and its one-way drop second.
                self.deck.remove(split)
                oneway = next((k for k in self.deck if k.endswith("_oneway")), None)
                if oneway:
                    self.deck.remove(oneway)
                    self.deck.append(oneway)
                self.deck.append(split)
        kind = self.deck.pop()
        if kind.startswith("holder_cut"):
            self.holder_cut(kind)
        elif kind in ("master_isolated", "master_oneway") and self.cluster:
            self.cluster_master_isolated(kind)
        elif kind == "master_isolated":
            self.master_isolated()
        elif kind.startswith("member_"):
            self.member_isolated(kind)
        elif kind.startswith("client_"):
            self.client_clock(kind)
        elif kind == "server_jump":
            self.server_jump()
        elif kind in ("server_fast", "server_slow"):
            self.server_rate(kind)
        else:
            self.holder_starve()

    def inject(self):
        """One fault, picked by the seeded generator; returns when it is over.
        Kinds come from a shuffled deck, so that every kind comes up in
        each round (a short run still sees them all)."""
        if self.a.nemesis != "faults":
            return self.inject_nemesis()
        topo, rng = self.a.topology, self.rng
        if not self.deck:
            self.deck = ["holder_kill", "holder_stop"]
            if topo == "single":
                self.deck += ["redis_restart", "redis_hang"]
            elif topo == "cluster":
                self.deck += ["c_master_kill", "c_failover", "c_slot_move", "c_slot_move", "c_master_hang"]
            elif topo in ("sql", "postgresql"):
                self.deck += ["sql_restart", "sql_hang"]
            elif topo == "zookeeper":
                self.deck += ["zk_member_kill", "zk_leader_kill", "zk_leader_hang", "zk_majority_down"]
            elif topo == "etcd":
                self.deck += ["e_leader_kill", "e_leader_hang", "e_follower_kill", "e_majority_down"]
            elif topo == "redlock":
                self.deck += ["node_kill", "redis_hang"]
            else:
                self.deck += ["master_kill", "master_kill", "master_hang", "master_stall", "replica_kill"]
            if self.net_mode:
                self.deck.append("net")
            rng.shuffle(self.deck)
        kind = self.deck.pop()
        m = None
        if kind in ("master_kill", "master_hang", "master_stall", "replica_kill"):
            m = self.sentinel_master() if self.sentinel_healthy() else None
            if m is None:
                # Let the last failover settle first; this kind comes up again later.
                self.deck.insert(0, kind)
                kind = rng.choice(["holder_kill", "holder_stop"])
        if kind.startswith("c_") and not self.cluster.healthy():
            # Let the last failover settle first; this kind comes up again later.
            self.deck.insert(0, kind)
            kind = rng.choice(["holder_kill", "holder_stop"])
        if kind.startswith("zk_") and not self.zk.healthy():
            # Let the last fault settle first; this kind comes up again later.
            self.deck.insert(0, kind)
            kind = rng.choice(["holder_kill", "holder_stop"])
        if kind.startswith("e_") and not self.etcd.healthy():
            self.deck.insert(0, kind)
            kind = rng.choice(["holder_kill", "holder_stop"])
        if kind.startswith("zk_"):
            self.zk_fault(kind)
        elif kind.startswith("c_"):
            self.cluster_fault(kind[2:])
        elif kind.startswith("e_"):
            self.etcd_fault(kind[2:])
        elif kind == "sql_restart":
            self.node_kill("sql_restart", self.sql, rng.uniform(0.0, 1.5))
        elif kind == "sql_hang":
            self.node_hang("sql_hang", self.sql, rng.uniform(0.3, 3.0))
        elif kind == "holder_kill":
            self.holder_kill()
        elif kind == "holder_stop":
            self.holder_stop()
        elif kind == "redis_restart":
            self.node_kill("redis_restart", self.nodes[0], rng.uniform(0.0, 1.5))
        elif kind == "node_kill":
            self.node_kill("node_kill", rng.choice(self.nodes), rng.uniform(0.2, 4.0))
        elif kind == "redis_hang":
            self.node_hang("redis_hang", rng.choice(self.nodes), rng.uniform(0.3, 3.0))
        elif kind == "net":
            self.net_fault()
        elif kind == "master_kill":
            other = next(n for n in self.nodes if n is not m)

            def role_now():  # restart as the sentinels see it now: replica of the new master, or master again
                return other.port if self.sentinel_master() is other else None
            self.node_kill("master_kill", m, rng.uniform(0.5, 4.0), replicaof=role_now)
        elif kind == "master_hang":
            # Shorter than down-after-milliseconds: a hang, not a failover.
            self.node_hang("master_hang", m, rng.uniform(0.2, 0.7))
        elif kind == "master_stall":
            # Longer than down-after-milliseconds: the sentinels fail over
            # from a master that is alive, and it comes back as a stale
            # master until they turn it into a replica.
            self.node_hang("master_stall", m, rng.uniform(1.2, 4.0))
        elif kind == "replica_kill":
            r = next(n for n in self.nodes if n is not m)
            self.node_kill("replica_kill", r, rng.uniform(0.5, 3.0), replicaof=lambda: m.port)

    # ---- the run

    def run(self):
        a = self.a
        if a.nemesis == "partition":
            self.setup_nft()
        elif a.nemesis == "starve":
            self.setup_cgroup()
        elif a.nemesis == "clock" and not os.path.exists(FAKETIME_LIB):
            raise RuntimeError("--nemesis clock needs %s (Debian package faketime)" % FAKETIME_LIB)
        elif a.nemesis == "server_clock" and a.topology not in SERVER_CLOCK_TOPOLOGIES:
            raise RuntimeError("--nemesis server_clock: not on %s (see docs/guarantees.md: etcd reads the clock "
                               "without the C library, ZooKeeper times sessions on a monotonic clock)" % a.topology)
        self.meta["nemesis"] = a.nemesis
        self.setup()
        if self.nft:
            # Workers run as other users: they write their histories here.
            os.chmod(self.dir, 0o711)
            os.chmod(os.path.join(self.dir, "hist"), 0o777)
        quiet = 8 if a.topology in ("sentinel", "cluster") else 5
        self.t_start = mono_ns()
        end = self.t_start + a.seconds * 10**9
        # The last fault is over `quiet` seconds before the end.
        faults_until = end - int((quiet + MAX_FAULT_S) * 1e9)
        self.meta.update(t_start=self.t_start, t_end=end, faults_until=faults_until)
        for _ in range(a.procs):
            self.start_worker(end)
        next_fault = self.t_start + int(self.rng.uniform(1.0, 3.0) * 1e9)
        while mono_ns() < end:
            self.reap_workers()
            if next_fault <= mono_ns() < faults_until:
                self.inject()
                next_fault = mono_ns() + int(self.rng.uniform(1.0, 3.0) * 1e9)
            time.sleep(0.05)
        say("soak: %d faults injected; waiting for the workers to finish" % len(self.faults))
        # The workers stop by themselves at `end` (and exit by force 45 s later).
        give_up = end + 50 * 10**9
        while self.workers and mono_ns() < give_up:
            self.reap_workers()
            time.sleep(0.05)
        for wid in sorted(self.workers):
            say("  worker %s did not exit in time: killed" % wid)
            self.workers[wid]["child"].kill()
            self.end_worker(wid, "timeout")
        self.collect()
        self.meta["completed"] = True

    def scan(self):
        out = []
        if self.zk:
            if not self.wait_for(lambda: self.zk.leader() is not None, 20):
                return [{"node": "zookeeper", "ok": False, "error": "no leader within 20 s"}]
            try:
                return [{"node": "zookeeper", "ok": True, "keys": self.zk.lock_keys()}]
            except (OSError, subprocess.TimeoutExpired) as e:
                return [{"node": "zookeeper", "ok": False, "error": str(e)}]
        if self.etcd:
            if not self.wait_for(self.etcd.healthy, 15):
                return [{"node": "etcd", "ok": False, "error": "etcd was not healthy within 15 s"}]
            try:
                return [{"node": "etcd", "ok": True, "keys": self.etcd.lock_keys()}]
            except (OSError, ValueError) as e:
                return [{"node": "etcd", "ok": False, "error": str(e)}]
        if self.sql:
            try:
                return [{"node": self.sql.name, "ok": True, "keys": self.sql.lock_keys()}]
            except OSError as e:
                return [{"node": self.sql.name, "ok": False, "error": str(e)}]
        if self.cluster:
            # Every key lives on the master of its slot: a healed cluster's masters hold them all.
            if not self.wait_for(self.cluster.healthy, 15):
                out.append({"node": "cluster", "ok": False, "error": "the cluster was not healthy within 15 s"})
            targets = self.cluster.masters()
        elif self.a.topology == "sentinel":
            targets = [self.sentinel_master()]
        else:
            targets = self.nodes
        for n in targets:
            if n is None:
                out.append({"node": "sentinel master", "ok": False, "error": "the sentinels do not agree"})
                continue
            try:
                out.append({"node": n.name, "ok": True, "keys": n.lock_keys()})
            except (OSError, ValueError) as e:
                out.append({"node": n.name, "ok": False, "error": str(e)})
        return out

    def collect(self):
        def dump(name, obj):
            with open(os.path.join(self.dir, name), "w") as f:
                json.dump(obj, f)
        dump("locks_end.json", self.scan())
        res = {}
        for i in range(self.a.keys):
            k = "k%d" % i
            h = self.resource.cmd("HGETALL", "res:" + k)
            res[k] = {"hash": dict(zip(h[0::2], h[1::2])),
                      "log": self.resource.cmd("LRANGE", "log:" + k, 0, -1),
                      "refused": self.resource.cmd("LRANGE", "refused:" + k, 0, -1)}
        dump("resource.json", res)
        time.sleep(MAX_TTL_MS / 1000 + 1)  # every lease is released or expired by now
        dump("locks_later.json", self.scan())

    def write_files(self):
        with open(os.path.join(self.dir, "faults.jsonl"), "w") as f:
            for x in self.faults:
                f.write(json.dumps(x) + "\n")
        with open(os.path.join(self.dir, "procs.jsonl"), "w") as f:
            for x in self.finished_workers:
                f.write(json.dumps(x) + "\n")
        self.meta["faults"] = len(self.faults)
        with open(os.path.join(self.dir, "meta.json"), "w") as f:
            json.dump(self.meta, f)

    def cleanup(self):
        if self.cgroup:
            # A process held to 1 ms of CPU a second takes that long to die.
            path, v2 = self.cgroup
            try:
                with open(os.path.join(path, "cpu.max" if v2 else "cpu.cfs_quota_us"), "w") as f:
                    f.write("max" if v2 else "-1")
            except OSError:
                pass
        for c in Child.all:
            try:
                c.kill()
            except Exception:  # keep going: every child must go
                pass
        if self.netns:
            run_quiet(["ip", "netns", "del", self.netns])
            run_quiet(["ip", "link", "del", self.a.host_if])
        if self.guard:
            run_quiet(["ip", "route", "del"] + self.guard)
        if self.nft:
            run_quiet(["nft", "delete", "table", "inet", NFT_TABLE])
        if self.cgroup:
            for _ in range(50):  # its last process may take a moment to leave it
                try:
                    os.rmdir(self.cgroup[0])
                    break
                except OSError as e:
                    why = e
                    time.sleep(0.1)
            else:
                say("soak: cannot remove cgroup %s: %s" % (self.cgroup[0], why))


class Stop(Exception):
    pass


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--topology",
                   choices=["single", "redlock", "sentinel", "cluster", "sql", "postgresql", "zookeeper", "etcd"],
                   default="single")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--procs", type=int, default=3)
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--keys", type=int, default=3)
    p.add_argument("--worker", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--netns", required=True, help="name of the network namespace to make (if root)")
    p.add_argument("--host-if", required=True)
    p.add_argument("--ns-if", required=True)
    p.add_argument("--min-replicas", type=int, default=None,
                   help="Sentinel and Cluster: the workers' min_replicas (default 1)")
    p.add_argument("--nemesis", choices=["faults", "partition", "clock", "starve", "server_clock"], default="faults")
    p.add_argument("--cgroup", default="lwsoak%d" % os.getpid(), help="--nemesis starve: the cgroup to make")
    a = p.parse_args()

    def stop(sig, _frame):
        raise Stop("signal %d" % sig)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        signal.signal(sig, stop)
    signal.alarm(a.seconds + 200)  # the whole run, set-up and collection included

    soak = Soak(a)
    try:
        soak.run()
    except Exception as e:  # Stop included; recorded for the checker, which then fails the run
        soak.meta["error"] = "%s: %s" % (type(e).__name__, e)
        say("soak: stopped: %s" % soak.meta["error"])
        if not isinstance(e, Stop):
            traceback.print_exc()
    finally:
        signal.alarm(0)
        soak.cleanup()
        soak.write_files()
    return 0 if soak.meta["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
