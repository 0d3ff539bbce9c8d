"""How the service's long-lived processes set up the interpreter: the garbage collector's
policy and the GIL's switch interval, both chosen for the ingest path.

Garbage collection: ingest allocates a few objects per event (parsed models, rows, stream
items) and frees nearly all of them by reference counting; CPython's default
young-generation threshold (700 allocations) then runs a collection every few dozen
events, and the older generations keep re-scanning the mirror, the module graph and the
caches. Measured on the load test's batches: parsing 9.6 -> 3.6 us an event with a
20,000 threshold. The threshold counts allocations net of frees, and at 40,000 events/s
about 20,000-40,000 young objects are alive at any time (events parsed and waiting in the
reorder window); at 20,000 each young collection scanned them and promoted them, to be
scanned again in the middle generation: 260 collections a minute, 6-8% of the server's
time, growing with the run. At 100,000 the count stays below the threshold until real
long-lived state has grown, so collections are rare (about 10 a minute, 2% of the time),
each pausing up to ~250 ms (at 20,000: up to ~170 ms).

Switch interval: DuckDB releases the GIL while it runs a statement but takes it back
several times per statement to read a registered Arrow table (its scan sources are
Python). While another thread parses the next batch, each take-back waits out the
switch interval (5 ms by default), so one 2,000-row insert took 137 ms instead of 2.6 ms
in `bench`-style isolation; at 0.5 ms it takes 15 ms.
"""

from __future__ import annotations

import gc
import sys

#: net allocations between young collections: well above what ingest holds in flight
YOUNG_THRESHOLD = 100_000
#: seconds a thread may hold the GIL while another waits for it
SWITCH_INTERVAL_S = 0.0005


def tune_interpreter(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Collect less often, never re-scan what start-up built (frozen: modules, settings,
    the app), and hand the GIL over sooner; cycles still get collected, in larger, rarer
    passes. `shadow tap` uses it too, with its own young threshold (`cli/tap.py`)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
