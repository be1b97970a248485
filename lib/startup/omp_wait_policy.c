/* Chooses how OpenMP's idle threads wait, for kiln's loops and oneDNN's alike, before the
 * OpenMP runtime starts.
 *
 * libgomp (GCC's OpenMP, which kiln and Debian's oneDNN share) reads its wait policy from the
 * environment once, in its own constructor, and offers no call to change it later. Its default
 * spins each idle thread for about 300000 pause instructions (milliseconds on a Xeon) before it
 * sleeps. On a machine where another process is busy, a spinning thread holds a core that the
 * thread it waits for needs, and a training step ran 3 to 50 times slower than on one thread.
 * A short spin (libgomp's own choice when it knows it is oversubscribed) keeps a fast wake-up
 * between back-to-back parallel loops and sleeps soon after.
 *
 * This constructor only works if it runs before libgomp's: it lives in a library of its own,
 * listed after libgomp among libkiln's dependencies, which glibc's loader initializes first (an
 * unrelated library loaded later is initialized earlier). tests/lib/env_test.cpp checks that the
 * runtime saw the setting. A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is left as it is. */
#include <stdlib.h>

/* Pause instructions an idle OpenMP thread spins before it sleeps (libgomp's default: 300000). */
#define KILN_OMP_SPIN_COUNT "1000"

static const char* g_chosen = NULL; /* what this library set, if anything */

__attribute__((constructor)) static void kiln_choose_omp_wait_policy(void) {
  if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
  if (setenv("GOMP_SPINCOUNT", KILN_OMP_SPIN_COUNT, 0) == 0) g_chosen = KILN_OMP_SPIN_COUNT;
}

/* The spin count kiln chose, or NULL where the user chose the policy. libkiln calls it, which
 * also keeps this library among libkiln's dependencies (the linker drops unused ones). */
const char* kiln_omp_spin_count(void) {
  return g_chosen;
}
