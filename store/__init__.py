"""The SQLite decision log (sqlite-utils, WAL, ordered migrations).

    store = Store("run.db")                       # creates or migrates the file
    result = Run(trace, policy, backend, sink=store.sink("top:8")).execute()
    queries.request_segments(store.db, run_id)    # read side for console/Gantt

Schema: `store.schema`; batching, no-op and candidate rules: `store.writer`.
"""

from store.db import Store, StoreError, connect
from store.writer import CandidateFilter, StoreSink

__all__ = ["CandidateFilter", "Store", "StoreError", "StoreSink", "connect"]
