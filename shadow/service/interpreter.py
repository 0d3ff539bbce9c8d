"""How the service's long-lived processes set up the interpreter: the garbage collector's
policy and the GIL's switch interval, both chosen for the ingest path.

Garbage collection: ingest allocates a few objects per event (parsed models, rows, stream
items) and frees nearly all of them by reference counting; CPython's default
young-generation threshold (700 allocations) then runs a collection every few dozen
events, and the older generations keep re-scanning the mirror, the module graph and the
caches. Measured on the load test's batches: parsing 9.6 -> 3.6 us an event with a
20,000 threshold.

Switch interval: DuckDB releases the GIL while it runs a statement but takes it back
several times per statement to read a registered Arrow table (its scan sources are
Python). While another thread parses the next batch, each take-back waits out the
switch interval (5 ms by default), so one 2,000-row insert took 137 ms instead of 2.6 ms
in `bench`-style isolation; at 0.5 ms it takes 15 ms.
"""

from __future__ import annotations

import gc
import sys

#: allocations between young collections: about ten 2,000-event batches of parsing
YOUNG_THRESHOLD = 20_000
#: seconds a thread may hold the GIL while another waits for it
SWITCH_INTERVAL_S = 0.0005


def tune_interpreter() -> None:
    """Collect less often, never re-scan what start-up built (frozen: modules, settings,
    the app), and hand the GIL over sooner; cycles still get collected, in larger, rarer
    passes."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
