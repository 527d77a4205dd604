/*
 * model/lease.pml: lockwatch's lease protocol on one Redis node, with the
 * watchdog's local deadline and a resource that checks fencing tokens.
 *
 * Check (from the repository root; scripts/verify runs it in a temp dir):
 *
 *   spin -a model/lease.pml && cc -O2 -DCOLLAPSE -o pan pan.c && ./pan -a -m1000000
 *   spin -a -DNO_FENCING model/lease.pml && cc -O2 -DCOLLAPSE -o pan pan.c && ./pan -a -m1000000
 *
 * Results (spin 6.5.2, 2-core VM):
 *   as the library does it:  errors: 0, 2,245,031 states stored, depth 5001, 11 s
 *   -DNO_FENCING:            errors: 1 (the paused holder's write), 241,322 states, 1 s
 * The model has no accept labels, so pan warns that -a has no effect: the
 * run is a full safety search (assertions and invalid end states). No
 * "search depth too small" or "max search depth too small": the search is
 * exhaustive.
 *
 * What is modelled, and where it is in the code
 *
 * - Two clients; each takes one lease (acquire, renew as long as it likes,
 *   write up to twice, release). Client = the watchdog and the work of one
 *   process; every step is a separate atomic action, so a client can be
 *   descheduled between any two of them for any number of ticks (GC,
 *   SIGSTOP): time is a process of its own that a paused client never
 *   blocks.
 * - The server (lib/scripts.cpp): acquire sets the key with the ttl and
 *   increments the fencing counter only if the key is absent; renew extends
 *   it only if the owner token matches ('0' gone, 'x' someone else's: both
 *   lose the lease); release deletes it only for its owner. Owner tokens are
 *   unique per acquisition (here the fencing token stands in for the random
 *   128-bit token). Requests and replies travel on channels and wait there
 *   while time passes (delay); a renewal may also be lost before or after
 *   Redis applied it, which the client sees as a transient error.
 * - The local deadline (lib/runtime.cpp grant(), on_renewed()): from the
 *   *send* time of the acquisition or of the last confirmed renewal, on the
 *   client's clock, plus ttl minus the drift allowance (drift_for(): ttl *
 *   drift_factor + drift_floor). Replies of older renewal rounds are
 *   ignored; a confirmation that arrives after the deadline but before the
 *   watchdog judged it still counts (on_lease_timer() reads replies first);
 *   once judged lost, nothing revives the lease. Renewals go out renew_after
 *   after the last send and only before the deadline; a transient failure
 *   is retried a tick later (renewal_failed()).
 * - The work checks remaining() (lib/lease.cpp: not lost and the local
 *   clock before the deadline) and then writes; it may pause between the
 *   two. The resource is samples/fenced_store.hpp: it refuses a token lower
 *   than the highest it accepted (equal is accepted).
 *
 * Time. The server's clock is the reference. Everything is kept as a
 * countdown (ticks left to the key's expiry, to the local deadline, to the
 * next renewal; ticks since the request in flight was sent), so there is no
 * absolute time and no bound on it: a lease may be renewed forever, and a
 * pause may last any number of ticks. Each tick, a client's clock advances
 * by 1, or stalls (advances 0) or skips (advances 2), as long as it fell
 * behind by at most LAG ticks and ran ahead by at most LEAD ticks since the
 * send the deadline counts from (and since the request in flight). This is
 * the drift bound over one lease window: a rate within 1 +- d over a ttl
 * gives LAG = d * ttl; a clock that fell further behind only after more
 * than a ttl cannot pass the deadline check anyway, so capping it there
 * loses no violation. The library is safe when LAG <= DRIFT (its drift
 * allowance covers the drift); the model checks exactly that case.
 *
 * Properties (assertions, so pan reports them as errors):
 *   P1 (the local deadline): whenever remaining() says the lease is held,
 *      the key exists on the server and is this lease's. This is the part
 *      the library's arithmetic has to get right; it holds with fencing or
 *      without.
 *   P2 (fencing): every accepted write carries a token at least as high as
 *      every write accepted before it. Tokens are unique per lease, so
 *      writes of two holders never interleave (A, B, A is impossible).
 *      With the resource's check this holds by construction; what the model
 *      shows is that the lock alone does not give it: with -DNO_FENCING,
 *      spin finds a holder that passed remaining(), paused past its ttl
 *      while another holder took the lock and wrote, then wrote its stale
 *      value.
 *
 * Bounds, and why they are enough. TTL = 4 ticks, DRIFT = LAG = 1, LEAD =
 * 1, renewal RA = 2 ticks after the send (the deadline is 3 ticks after
 * it), two clients with one lease each, two writes per lease; time and the
 * number of renewals are unbounded. A violation of P1 involves one lease
 * (its own key expired) or two (another acquired after it expired); a
 * violation of P2 involves two leases (an older one writing after a newer
 * one). Other leases cannot touch a lease's key: acquire needs the key
 * gone, renew and release need its owner token. So two leases show every
 * violation three would. Two writes let a lease write before and after a
 * renewal. The sizes of TTL and DRIFT do not matter, only LAG <= DRIFT and
 * that the deadline falls after the renewal time (-DRA=1, and -DTTL=5
 * -DRA=3, also give errors: 0); the model's drift
 * allowance is a quarter of the ttl where the library's default is 1% +
 * 2 ms, because a tick is the model's unit. Two leases per client (22
 * million states, 3 minutes) or three clients (unfinished after 5 minutes)
 * do not fit in the minute this check may take.
 *
 * Other switches, not run by scripts/verify, to show that the model can
 * fail (each errors: 1, in about a second or less):
 *   -DDEADLINE_FROM_REPLY  deadline counted from the reply's arrival: P1 fails
 *   -DLAG=2                clocks drift more than the allowance: P1 fails
 *   -DDRIFT=0 -DLAG=1      no drift allowance: P1 fails
 *   -DSTRICT               asserts at each accepted write that no one took
 *                          the lock since this lease's acquisition: fails even
 *                          with fencing. A paused holder's write that reaches
 *                          the resource before the new holder's first write
 *                          is accepted; fencing orders writes, it does not
 *                          stop that one (see docs/stores.md, Guarantees).
 *
 * Not modelled here: Redlock quorums (model/redlock_fence.pml), Sentinel
 * failover, a Redis that loses keys (restart without persistence), an
 * acquisition whose reply is lost, renewals that go on while a release is
 * in flight (they only keep the owner's key longer).
 */

#ifndef NC
#define NC 2            /* clients (2 or 3) */
#endif
#ifndef ROUNDS
#define ROUNDS 1        /* leases each client takes, one after another */
#endif
#ifndef WRITES
#define WRITES 2        /* writes at most per lease */
#endif
#ifndef TTL
#define TTL 4           /* the lock's ttl, in ticks */
#endif
#ifndef DRIFT
#define DRIFT 1         /* the drift allowance: local deadline = sent + TTL - DRIFT */
#endif
#ifndef LAG
#define LAG DRIFT       /* how far a client's clock may fall behind over a lease window */
#endif
#ifndef LEAD
#define LEAD 1          /* ... and run ahead */
#endif
#ifndef RA
#define RA 2            /* renew_after: a renewal goes out RA after the last send */
#endif
#define CAP (TTL - DRIFT) /* ticks since a send saturate here: a reply this late leaves nothing */
#ifdef DEADLINE_FROM_REPLY
#define AGO(c) 0
#else
#define AGO(c) cl[c].since
#endif

mtype = { ACQ, REN, REL, OK, NO, ERR };

/* The server: one key and its fencing counter. */
byte srv_owner;   /* 0: no key; else its owner token */
byte srv_rem;     /* ticks until the key expires */
byte srv_fence;

/* The resource. */
byte res_max;     /* the highest token it accepted */

hidden byte ticks;  /* for the trail only; not part of the state */

#define IDLE 0
#define ACQUIRING 1
#define HELD 2
#define DONE 3
typedef Client_ {
  byte phase;
  byte tok;       /* fencing token, also the owner token */
  byte rem_dl;    /* local ticks to the local deadline */
  byte rem_due;   /* local ticks to the next renewal */
  byte since;     /* local ticks since the request in flight was sent */
  short lag_ref;  /* ticks the local clock fell behind since the send the deadline counts from */
  short lag_pend; /* ... since the request in flight was sent */
  bool awaiting;  /* a renewal is in flight */
  bool lost;
  bool checked;   /* the work passed remaining() and is about to write */
  byte writes;
  byte round;
};
Client_ cl[NC];

chan req[NC] = [3] of { mtype, byte };          /* kind, owner token */
chan rep[NC] = [2] of { mtype, mtype, byte };   /* kind, answer, token */

#define key_alive() (srv_owner != 0 && srv_rem > 0)
#define pending(i) (cl[i].phase == ACQUIRING || cl[i].awaiting)
#define held(i) (cl[i].phase == HELD)

/* The client's clock advances by n. */
inline advance(i, n) {
  cl[i].rem_dl = (cl[i].rem_dl > n -> cl[i].rem_dl - n : 0);
  cl[i].rem_due = (cl[i].rem_due > n -> cl[i].rem_due - n : 0);
  if
  :: pending(i) -> cl[i].since = (cl[i].since + n < CAP -> cl[i].since + n : CAP)
  :: else -> skip
  fi
}

inline lag_by(i, d) {
  if :: held(i) -> cl[i].lag_ref = cl[i].lag_ref + d :: else -> skip fi;
  if :: pending(i) -> cl[i].lag_pend = cl[i].lag_pend + d :: else -> skip fi
}

/* Time: never waits for anyone. */
active proctype Clock() {
  byte i;
end:
  do
  :: atomic {
       ticks = (ticks < 255 -> ticks + 1 : ticks);
       if
       :: srv_rem > 1 -> srv_rem--
       :: srv_rem == 1 -> srv_rem = 0; srv_owner = 0; printf("t=%d key expires\n", ticks)
       :: else -> skip
       fi;
       i = 0;
       do
       :: i < NC ->
          if
          :: held(i) || pending(i) ->
             if
             :: advance(i, 1)
             :: (!held(i) || cl[i].lag_ref < LAG) && (!pending(i) || cl[i].lag_pend < LAG) ->
                lag_by(i, 1)                      /* the client's clock stalls */
             :: (!held(i) || cl[i].lag_ref > -LEAD) && (!pending(i) || cl[i].lag_pend > -LEAD) ->
                advance(i, 2); lag_by(i, -1)      /* the client's clock skips */
             fi
          :: else -> skip
          fi;
          i++
       :: else -> break
       od;
       i = 0
     }
  od
}

/* The acquire, renew and release scripts. */
inline serve(c) {
  if
  :: k == ACQ ->
     if
     :: key_alive() -> rep[c]!ACQ,NO,0
     :: else ->
        srv_fence++; srv_owner = srv_fence; srv_rem = TTL;
        printf("t=%d client %d acquires, token %d\n", ticks, c, srv_fence);
        rep[c]!ACQ,OK,srv_fence
     fi
  :: k == REN ->
     if
     :: key_alive() && srv_owner == t -> srv_rem = TTL; rep[c]!REN,OK,t
     :: key_alive() && srv_owner == t -> srv_rem = TTL; rep[c]!REN,ERR,t  /* the reply is lost */
     :: rep[c]!REN,ERR,t                                                   /* the request is lost */
     :: !(key_alive() && srv_owner == t) -> rep[c]!REN,NO,t
     fi
  :: k == REL ->
     if
     :: key_alive() && srv_owner == t -> srv_owner = 0; srv_rem = 0
     :: else -> skip
     fi
  fi
}

active proctype Server() {
  mtype k; byte t;
end:
  do
  :: atomic { req[0]?k,t -> serve(0); k = 0; t = 0 }
  :: atomic { req[1]?k,t -> serve(1); k = 0; t = 0 }
#if NC > 2
  :: atomic { req[2]?k,t -> serve(2); k = 0; t = 0 }
#endif
  od
}

/* A confirmed acquisition or renewal: the deadline counts from its send. */
inline confirmed(c) {
  cl[c].rem_dl = CAP - AGO(c);
  cl[c].rem_due = (AGO(c) < RA -> RA - AGO(c) : 0);
  cl[c].lag_ref = cl[c].lag_pend
}

proctype Client(byte c) {
  mtype k, a; byte t;
end:
  do
  :: atomic { cl[c].phase == IDLE && nfull(req[c]) ->
       req[c]!ACQ,0; cl[c].phase = ACQUIRING; cl[c].since = 0; cl[c].lag_pend = 0 }
  :: atomic { rep[c]?k,a,t ->
       if
       :: cl[c].phase == ACQUIRING && k == ACQ && a == OK ->
          cl[c].tok = t; cl[c].phase = HELD; confirmed(c)
       :: cl[c].phase == ACQUIRING && k == ACQ && a == NO ->
          cl[c].phase = IDLE  /* busy: try again */
       :: held(c) && cl[c].awaiting && k == REN && t == cl[c].tok ->
          if
          :: a == OK && !cl[c].lost -> confirmed(c)
          :: a == NO -> cl[c].lost = true
          :: a == ERR -> cl[c].rem_due = 1  /* transient: again a tick later */
          :: else -> skip
          fi;
          cl[c].awaiting = false
       :: else -> skip  /* a reply for a lease already given up */
       fi;
       cl[c].since = (pending(c) -> cl[c].since : 0);
       cl[c].lag_pend = (pending(c) -> cl[c].lag_pend : 0);
       k = 0; a = 0; t = 0 }

  /* the watchdog */
  :: atomic { held(c) && !cl[c].lost && !cl[c].awaiting &&
              cl[c].rem_due == 0 && cl[c].rem_dl > 0 && nfull(req[c]) ->
       req[c]!REN,cl[c].tok; cl[c].awaiting = true; cl[c].since = 0; cl[c].lag_pend = 0 }
  :: atomic { held(c) && !cl[c].lost && cl[c].rem_dl == 0 ->
       cl[c].lost = true; printf("t=%d client %d: lease lost at its local deadline\n", ticks, c) }

  /* the work: remaining() > 0, then (perhaps after a pause) the write */
  :: atomic { held(c) && !cl[c].checked && cl[c].writes < WRITES &&
              !cl[c].lost && cl[c].rem_dl > 0 ->
       printf("t=%d client %d: remaining() > 0\n", ticks, c);
       assert(key_alive() && srv_owner == cl[c].tok);   /* P1 */
       cl[c].checked = true }
  :: atomic { cl[c].checked ->
#ifdef NO_FENCING
       if :: true ->
#else
       if :: cl[c].tok >= res_max ->
#endif
             printf("t=%d client %d writes with token %d: accepted\n", ticks, c, cl[c].tok);
             assert(cl[c].tok >= res_max);              /* P2 */
#ifdef STRICT
             assert(srv_fence == cl[c].tok);
#endif
             res_max = cl[c].tok
       :: else -> printf("t=%d client %d writes with token %d: refused\n", ticks, c, cl[c].tok)
       fi;
       cl[c].checked = false; cl[c].writes++ }

  /* the work returns: release */
  :: atomic { held(c) && !cl[c].checked && nfull(req[c]) ->
       req[c]!REL,cl[c].tok;
       cl[c].round++;
       cl[c].phase = (cl[c].round < ROUNDS -> IDLE : DONE);
       cl[c].tok = 0; cl[c].rem_dl = 0; cl[c].rem_due = 0; cl[c].since = 0;
       cl[c].lag_ref = 0; cl[c].lag_pend = 0;
       cl[c].awaiting = false; cl[c].lost = false; cl[c].writes = 0 }
  od
}

init {
  atomic {
    run Client(0); run Client(1);
#if NC > 2
    run Client(2)
#endif
  }
}
