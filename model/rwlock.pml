/*
 * model/rwlock.pml: the read-write lock's leases on the store, and why a
 * waiting writer marks its intent.
 *
 * Check (from the repository root; scripts/verify runs it in a temp dir):
 *
 *   spin -a model/rwlock.pml && cc -O2 -DCOLLAPSE -o pan pan.c && ./pan -a -f -m1000000
 *   spin -a -DNO_WRITER_PREFERENCE model/rwlock.pml && cc -O2 -DCOLLAPSE -o pan pan.c && ./pan -a -f -m1000000
 *
 * Results (spin 6.5.2, 2-core VM):
 *   as the library does it:   errors: 0 (the assertion and the claim),
 *                             2,844 states stored, under 1 s
 *   -DNO_WRITER_PREFERENCE:   errors: 1, an acceptance cycle: two readers
 *                             that take turns keep the lock read-held for
 *                             ever, and the writer waits for ever (126
 *                             states)
 * No "search depth too small": the search is exhaustive. -f is weak
 * fairness: a process that can always take a step eventually takes one
 * (time goes on, a waiting writer asks again).
 *
 * What is modelled, and where it is in the code
 *
 * - The store's state of one key (lib/store/memory/memory_space.cpp, and
 *   the Redis scripts of shared locks in lib/store/redis/scripts.cpp): each
 *   reader's lease is its own (a deadline per reader token), the writer's
 *   lease, and a waiting writer's intent (a deadline of its own). Each
 *   store step is one atomic action, decided on the store's clock:
 *   - a read acquisition is granted when no writer's lease is live and no
 *     other writer's intent is (a reader that holds already may renew);
 *   - a write acquisition is granted when no lease at all is live; when
 *     readers hold, it marks the writer's intent (`<lock>:writer` on Redis,
 *     expiring after the writer's ttl or 2 s, whichever is shorter, set
 *     anew each time it asks) and the writer waits for a release notice or
 *     at most half the mark's life, then asks again;
 *   - a renewal extends a live lease of its own token and nothing else (an
 *     expired lease is not brought back);
 *   - a release removes the token's lease.
 * - Two readers and one writer, each taking its lease again and again: a
 *   reader holds for at most HOLD renewals, then releases, or stops
 *   renewing and loses the lease when it runs out (a crashed or paused
 *   holder); the writer likewise. Time is a process of its own that takes
 *   a tick from every live lease; a lease runs out after TTL ticks without
 *   a renewal. The intent does not run out while its writer waits here:
 *   a waiting writer asks again within half the mark's life (the store's
 *   busy answer says so); a writer that dies or gives up while it waits
 *   leaves a mark that runs out within 2 s (not modelled: it only delays
 *   readers by that much).
 * - The client side of each lease (the local deadline before the store's
 *   expiry, fencing) is model/lease.pml's; here a holder is a holder while
 *   its lease is live on the store.
 *
 * Properties
 *   P1 (assertion, at every grant: nothing else can break it): never a
 *      live writer's lease together with a live reader's.
 *   P2 (claim writer_not_starved): a writer that waits eventually holds,
 *      however the readers come and go. Readers alone could keep the lock
 *      read-held for ever by overlapping; the intent stops new readers, so
 *      the ones inside finish within HOLD renewals or TTL ticks.
 *
 * Bounds: TTL = 2, HOLD = 2; two readers are the fewest that can overlap
 * for ever, and one writer the fewest that can starve. More readers or a
 * longer ttl give the same cycles with more states.
 */

#ifndef TTL
#define TTL 2   /* ticks a lease lasts without a renewal */
#endif
#ifndef HOLD
#define HOLD 2  /* renewals at most before a holder releases */
#endif

byte rttl[2];   /* each reader's lease on the store: ticks left, 0 = none */
byte wttl;      /* the writer's lease: ticks left, 0 = none */
bool intent;    /* the waiting writer's mark */
bool wwait;     /* the writer asked and does not hold yet */
bool wholds;    /* the writer's lease is its own (until released or run out) */

#define READERS_LIVE (rttl[0] > 0 || rttl[1] > 0)
/* Only a grant can make a writer's and a reader's leases live together (a
 * renewal extends a live lease, a tick shortens one): P1 is asserted at
 * each grant. */
#define P1 assert(!(wttl > 0 && READERS_LIVE))

ltl writer_not_starved { [] (wwait -> <> wholds) }

active [2] proctype Reader() {
  byte i = _pid;  /* 0 and 1: declared first */
  byte n;
  do
  :: atomic {
#ifdef NO_WRITER_PREFERENCE
       wttl == 0 ->
#else
       wttl == 0 && !intent ->
#endif
       rttl[i] = TTL;
       n = 0;
       P1
     }
     do
     :: atomic { rttl[i] > 0 && n < HOLD -> rttl[i] = TTL; n++ }  /* a renewal of a live lease */
     :: atomic { rttl[i] > 0 -> rttl[i] = 0; break }             /* released */
     :: rttl[i] == 0 -> break                                    /* ran out: lost */
     od
  od
}

active proctype Writer() {
  byte n;
  do
  :: wwait = true;
     do
     :: atomic { wttl == 0 && !READERS_LIVE -> wttl = TTL; intent = false; wwait = false; wholds = true; n = 0; P1; break }
     :: atomic { READERS_LIVE -> intent = true }  /* busy: marks its intent, waits, asks again */
     od;
     do
     :: atomic { wttl > 0 && n < HOLD -> wttl = TTL; n++ }
     :: atomic { wttl > 0 -> wttl = 0; wholds = false; break }
     :: atomic { wttl == 0 -> wholds = false; break }
     od
  od
}

active proctype Time() {
  do
  :: atomic {
       if
       :: rttl[0] > 0 -> rttl[0]--
       :: else -> skip
       fi;
       if
       :: rttl[1] > 0 -> rttl[1]--
       :: else -> skip
       fi;
       if
       :: wttl > 0 -> wttl--
       :: else -> skip
       fi
     }
  od
}

