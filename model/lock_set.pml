/*
 * model/lock_set.pml: sets of keys taken all or none (lockwatch::all_of),
 * in canonical order, by callers naming them in any order.
 *
 * Check (from the repository root; scripts/verify runs it in a temp dir):
 *
 *   spin -a model/lock_set.pml && cc -O2 -DCOLLAPSE -o pan pan.c && ./pan -a -m1000000
 *   spin -a -DUNSORTED model/lock_set.pml && cc -O2 -DCOLLAPSE -o pan pan.c && ./pan -a -m1000000
 *
 * Results (spin 6.5.2, 2-core VM):
 *   as the library does it:  errors: 0, 252,732 states stored, under 1 s
 *   -DUNSORTED:              errors: 1 (2,565 states), P2: two callers each hold one key
 *                            of the pair the other waits for (a transfer
 *                            1 -> 2 against one 2 -> 1), and every wait
 *                            can only run out
 * No "search depth too small": the search is exhaustive.
 *
 * What is modelled, and where it is in the code
 *
 * - Three keys (accounts) and three callers (lib/runtime/lock_set.cpp,
 *   SetAcquirer). Each caller, again and again, picks any pair of the keys
 *   in any order (a transfer from one account to another, or to itself),
 *   drops the duplicate (all_of("acct:7", "acct:7") is one key), and
 *   first tries the whole set: each key taken if it is free, none waited
 *   for, in two steps other callers' steps may come between (the requests
 *   are sent together and answered one by one). With every key taken it
 *   holds the set; else it gives back what it took and takes the keys one
 *   by one in canonical order (the smaller first), waiting for each while
 *   keeping those it took: the ordered way. With both held it does its
 *   work, then gives both back.
 * - Taking a free key is one atomic step of the store; a caller waits for
 *   a held key until it is free (woken by the release).
 * - A wait runs out only when nothing else can happen: the `timeout` of
 *   spin, enabled when every process is blocked, is the wait of a caller
 *   stuck for good. The caller then gives back what it took (all or none)
 *   and fails; P2 says it never has to.
 *   -DUNSORTED: each caller takes the keys in the order it named them.
 * - Leases, their renewal and their loss are model/lease.pml's; here every
 *   holder keeps its keys until it gives them back.
 *
 * Properties
 *   P1 (assertion, in the work): a caller works only with every key of its
 *      set held by itself, and no key is in two callers' work at once.
 *   P2 (assertion, when a wait runs out for good): no caller is ever stuck
 *      waiting for a key held by a caller that waits for it (no deadlock).
 *
 * Bounds: three keys, three callers, any pair each time.
 */

#define NKEYS 3
#define NCALLERS 3

byte owner[NKEYS];  /* 0 = free, else the holder's id + 1 */
byte working[NKEYS];  /* callers in their work on each key */

#define P1(k) assert(owner[k] == me + 1 && working[k] == 1)

active [NCALLERS] proctype Caller() {
  byte me = _pid;
  byte x, y, first, second;
  bool got_first, got_second;
  do
  :: atomic {
       /* a transfer between any two accounts, named in any order */
       if
       :: x = 0 :: x = 1 :: x = 2
       fi;
       if
       :: y = 0 :: y = 1 :: y = 2
       fi;
#ifdef UNSORTED
       first = x; second = y;
#else
       if
       :: x <= y -> first = x; second = y
       :: else -> first = y; second = x
       fi;
#endif
       x = 0; y = 0
     }
     /* the whole set, tried at once: nothing waited for */
     atomic { if :: owner[first] == 0 -> owner[first] = me + 1; got_first = true :: else -> skip fi }
     atomic {
       if
       :: second != first && owner[second] == 0 -> owner[second] = me + 1; got_second = true
       :: second == first -> got_second = got_first
       :: else -> skip
       fi
     }
     if
     :: got_first && got_second -> goto work
     :: else ->
        atomic {  /* what the try took is given back */
          if :: got_first -> owner[first] = 0 :: else -> skip fi;
          if :: got_second && second != first -> owner[second] = 0 :: else -> skip fi;
          got_first = false; got_second = false
        }
     fi;
     /* the first key: wait until it is free */
     if
     :: atomic { owner[first] == 0 -> owner[first] = me + 1 }
     :: timeout -> assert(false)  /* P2: stuck for good before holding anything */
     fi;
     /* the second key, unless it is the same one */
     if
     :: second == first -> skip
     :: else ->
        if
        :: atomic { owner[second] == 0 -> owner[second] = me + 1 }
        :: timeout ->  /* P2: stuck for good, holding the first key */
           atomic { owner[first] = 0; assert(false) }
        fi
     fi;
     /* the work, with every key held */
work:
     atomic {
       got_first = false; got_second = false;
       working[first]++;
       if :: second != first -> working[second]++ :: else -> skip fi;
       P1(first);
       P1(second)
     }
     atomic {
       working[first]--;
       if :: second != first -> working[second]-- :: else -> skip fi
     }
     /* both given back (and the caller's choice forgotten: fewer states) */
     atomic {
       owner[first] = 0;
       owner[second] = 0;
       x = 0; y = 0; first = 0; second = 0
     }
  od
}
