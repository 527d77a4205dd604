/*
 * model/semaphore.pml: the semaphore's leased permits, and the n a
 * semaphore keeps.
 *
 * Check (from the repository root; scripts/verify runs it in a temp dir):
 *
 *   spin -a model/semaphore.pml && cc -O2 -DCOLLAPSE -o pan pan.c && ./pan -a -f -m1000000
 *   spin -a -DNO_PERMIT_LEASE model/semaphore.pml && cc -O2 -DCOLLAPSE -o pan pan.c && ./pan -a -f -m1000000
 *   spin -a -DNO_N_CHECK model/semaphore.pml && cc -O2 -DCOLLAPSE -o pan pan.c && ./pan -a -f -m1000000
 *
 * Results (spin 6.5.2, 2-core VM):
 *   as the library does it:  errors: 0 (the assertion and the claim),
 *                            3,942 states stored, under 1 s
 *   -DNO_PERMIT_LEASE:       errors: 1, an acceptance cycle: a holder dies,
 *                            its permit never comes back (65 states)
 *   -DNO_N_CHECK:            errors: 1, P1: a caller that says n = 3 takes
 *                            a third permit while callers of n = 2 hold two
 *                            (128 states)
 * No "search depth too small": the search is exhaustive. -f is weak
 * fairness: a process that can always take a step eventually takes one.
 *
 * What is modelled, and where it is in the code
 *
 * - The store's state of one semaphore (lib/store/memory/memory_space.cpp,
 *   and the Redis scripts of semaphores in lib/store/redis/scripts.cpp): a
 *   lease per permit holder (its token with its deadline) and the n the
 *   semaphore was taken with, kept while any permit is live. Each store
 *   step is one atomic action on the store's clock:
 *   - an acquisition with a different n than the semaphore's is refused
 *     (the caller gets a typed error and takes nothing);
 *   - else it is granted when fewer than n permits are live;
 *   - a renewal extends a live permit of its own token only;
 *   - a release removes the token's permit; when the last live permit goes
 *     (released or run out), so does the semaphore's n.
 * - Three callers: two say n = 2, one says n = 3. Each takes a permit
 *   again and again, holds it for at most HOLD renewals, then releases it
 *   or stops renewing (its permit runs out); a caller may also die while it
 *   holds (it never takes another step). Time takes a tick from every live
 *   permit; a permit runs out after TTL ticks without a renewal.
 *   -DNO_PERMIT_LEASE: permits never run out (a counter, as semaphores
 *   without leases keep it). -DNO_N_CHECK: each caller counts against its
 *   own n.
 * - Without leases (-DNO_PERMIT_LEASE) there is no time: a permit stays
 *   until its holder releases it.
 *
 * Properties
 *   P1 (assertion, at every grant: nothing else can add a permit): never
 *      more live permits than the n of any caller that holds one.
 *   P2 (claim permit_returns): the permit of a caller that died comes
 *      back (its lease runs out), so the semaphore does not shrink.
 *
 * Bounds: TTL = 2, HOLD = 2, three callers: two to fill a semaphore of two
 * and one that disagrees on n. The first caller is the one that may die
 * (the others are alike).
 */

#ifndef TTL
#define TTL 2
#endif
#ifndef HOLD
#define HOLD 2
#endif

byte pttl[3];  /* each caller's permit: ticks left, 0 = none */
byte sem_n;    /* the semaphore's n, while any permit is live; 0 = none */
bool dead0;    /* caller 0 died */
bool refused;  /* some caller was told its n disagrees */

#define n_of(c) (c == 2 -> 3 : 2)  /* the n each caller says */
#define LIVE ((pttl[0] > 0) + (pttl[1] > 0) + (pttl[2] > 0))
#define FORGET_N if :: LIVE == 0 -> sem_n = 0 :: else -> skip fi
#define HOLDER_OK(c) (pttl[c] == 0 || LIVE <= n_of(c))
#define P1 assert(HOLDER_OK(0) && HOLDER_OK(1) && HOLDER_OK(2))

ltl permit_returns { [] (dead0 -> <> (pttl[0] == 0)) }

active [3] proctype Caller() {
  byte i = _pid;  /* 0, 1 and 2: declared first */
  byte k;
  do
  :: atomic {
#ifdef NO_N_CHECK
       LIVE < n_of(i) ->
#else
       (sem_n == 0 || sem_n == n_of(i)) && LIVE < n_of(i) ->
#endif
       pttl[i] = TTL;
       sem_n = n_of(i);
       k = 0;
       P1
     }
     do
     :: atomic { pttl[i] > 0 && k < HOLD -> pttl[i] = TTL; k++ }
     :: atomic { pttl[i] > 0 -> pttl[i] = 0; FORGET_N; break }
     :: pttl[i] == 0 -> break
     :: i == 0 && pttl[0] > 0 -> dead0 = true; goto died
     od
#ifndef NO_N_CHECK
  :: atomic { sem_n != 0 && sem_n != n_of(i) -> refused = true }  /* a typed error; it may try again */
#endif
  od;
died:
  skip
}

#ifndef NO_PERMIT_LEASE
active proctype Time() {
  byte c;
  do
  :: atomic {
       c = 0;
       do
       :: c < 3 ->
          if
          :: pttl[c] > 0 -> pttl[c]--
          :: else -> skip
          fi;
          c++
       :: else -> break
       od;
       FORGET_N;
       c = 0
     }
  od
}
#endif
