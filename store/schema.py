"""The decision log's schema as an ordered list of migrations.

Each migration is a function of a `sqlite_utils.Database`, applied once, in
order, and recorded by name in `_topasd_migrations` (name, applied_at). A
database holding a migration this code does not know was written by a newer
topasd and is refused rather than guessed at.

The columns of each table are listed once, in `store.columns`, each with
the migration that added it. Tables (times `t` are seconds on the backend's
clock, `*_ts` unix wall time):

- `runs`: one row per run: policy, backend, profile, params (JSON: the
  profile's, the policy's and the backend's settings, and for TOPAS which
  search ran, compiled or pure Python), workload,
  seed, trace meta (JSON), topasd version, `log_candidates`, status
  (running | done | failed | interrupted), pid/host, summary (JSON: the
  replay table's row), row counts.
- `tasks`: (run_id, task_id): workflow, arrival, completion, jct.
- `requests`: (run_id, request_id): task, stage, agent, input/output tokens,
  ready, admitted (first admission), started (first prefill), finished,
  service_s, preemptions, retractions.
- `decisions`: (run_id, seq): t, wall_ms (policy time), wall_ts, noop, the
  admit/preempt/load/evict lists (JSON) and their counts, reservation,
  blocked, retry, n_candidates, n_logged, chosen (candidate index),
  chosen_resident (JSON) and the chosen state's score terms; held (JSON)
  and n_held: the waiting requests it left out of W_t (m006). `load` lists
  the prefixes the decision makes resident, whether the engine then moves
  them from host memory or computes them again by prefill: the
  `engine_events` say which (`prefix_load_start` or `prefix_compute_start`);
  and the shared context copies it loads back from the host ahead of their
  holders (`context_load_start` with no request). A decision's `wake_at`
  (a scheduling point it asked for) is not a column: the decision it brings
  is the row at that `t` with no engine event before it there.
- `candidates`: (run_id, decision_seq, idx): resident/admit/preempt (JSON),
  score terms, total, won.
- `engine_events`: id, run_id, t, kind (`EventKind` value), request_id,
  task_id, agent, stage, tokens, value, note: every event the run reported,
  in the order reported (`tokens`/`value` as the backend defines them).
- `param_changes`: id, run_id, t, wall_ts, name, old/new (JSON), source,
  from_decision (the first decision `seq` it applies to).

Views (m005, again in m006; `store.views`) answer the common questions in one `SELECT`
with plain columns (no JSON to unpack): `decision_actions`,
`preemption_log`, `request_log`, `task_log` (docs/decision-log.md).

Indexes (m002) serve `store.queries`: decisions by (run, t), requests by
(run, agent, admitted) and (run, task), tasks by (run, arrival), parameter
changes by (run, t), runs by status; events only by run (a run's events are
one contiguous id range that readers scan once; wider event indexes doubled
the writer's insert time).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from functools import partial

from sqlite_utils import Database

from store.columns import TABLES, added_by, columns
from store.views import VIEWS

MIGRATIONS_TABLE = "_topasd_migrations"

Migration = Callable[[Database], None]
MIGRATIONS: list[tuple[str, Migration]] = []


def migration(fn: Migration) -> Migration:
    """Register `fn` as the next migration (order of definition is the order)."""
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_core_tables(db: Database) -> None:
    cols = partial(columns, added_by=m001_core_tables.__name__)
    db.table("runs").create(cols("runs"), pk="id", not_null=["status", "policy", "backend"])
    db.table("tasks").create(cols("tasks"), pk=("run_id", "task_id"),
                             foreign_keys=[("run_id", "runs", "id")])
    db.table("requests").create(cols("requests"), pk=("run_id", "request_id"),
                                foreign_keys=[("run_id", "runs", "id")],
                                defaults={"preemptions": 0, "retractions": 0})
    db.table("decisions").create(cols("decisions"), pk=("run_id", "seq"),
                                 foreign_keys=[("run_id", "runs", "id")])
    db.table("candidates").create(cols("candidates"), pk=("run_id", "decision_seq", "idx"),
                                  foreign_keys=[("run_id", "runs", "id")])
    db.table("engine_events").create(cols("engine_events"), pk="id",
                                     not_null=["run_id", "t", "kind"],
                                     foreign_keys=[("run_id", "runs", "id")])
    db.table("param_changes").create(cols("param_changes"), pk="id",
                                     not_null=["run_id", "name"],
                                     foreign_keys=[("run_id", "runs", "id")])


@migration
def m002_query_indexes(db: Database) -> None:
    """Indexes for the console and the Gantt export (queries in `store.queries`)."""
    # One narrow index on the events: a run's events are a contiguous id range,
    # which every reader scans once (a second, wider index doubled insert time).
    db.table("engine_events").create_index(["run_id"], index_name="ix_events_run")
    db.table("decisions").create_index(["run_id", "t"], index_name="ix_decisions_run_t")
    db.table("requests").create_index(["run_id", "agent", "admitted"],
                                index_name="ix_requests_run_agent")
    db.table("requests").create_index(["run_id", "task_id"], index_name="ix_requests_run_task")
    db.table("tasks").create_index(["run_id", "arrival"], index_name="ix_tasks_run_arrival")
    db.table("param_changes").create_index(["run_id", "t"], index_name="ix_params_run_t")
    db.table("runs").create_index(["status"], index_name="ix_runs_status")


@migration
def m003_param_change_first_decision(db: Database) -> None:
    """`param_changes.from_decision`: the first decision `seq` a change applies to.
    A decision and a change may share an engine time; the number says which
    came first (NULL in logs written before: `t` is all they have)."""
    _add_columns(db, m003_param_change_first_decision.__name__)


@migration
def m004_request_withdrawn(db: Database) -> None:
    """`requests.withdrawn`: when a request was taken back unfinished (its
    client went away); NULL for every other request, and in older logs."""
    _add_columns(db, m004_request_withdrawn.__name__)


@migration
def m005_preempt_decision(db: Database) -> None:
    """`engine_events.decision`: the decision a `preempt` event carries out
    (NULL on other events and in older logs); and the views of
    `store.views` (docs/decision-log.md)."""
    _add_columns(db, m005_preempt_decision.__name__)
    _create_views(db)


@migration
def m006_decision_held(db: Database) -> None:
    """`decisions.held` and `n_held`: the waiting requests the policy left
    out of W_t (TOPAS's `lot_size` and `phases`); NULL where nothing was
    held (`n_held` 0), and both NULL in older logs. The views of
    `store.views` again (`decision_actions` lists them as `hold`)."""
    _add_columns(db, m006_decision_held.__name__)
    _create_views(db)


def _create_views(db: Database) -> None:
    """(Re)create every view of `store.views`."""
    for name, sql in VIEWS.items():
        db.execute(f"DROP VIEW IF EXISTS {name}")
        db.execute(f"CREATE VIEW {name} AS {sql}")


def _add_columns(db: Database, migration: str) -> None:
    """Add the columns `store.columns` says `migration` adds."""
    for table, name, typ in added_by(migration):
        db.table(table).add_column(name, typ)


def _check_columns() -> None:
    """Every column of `store.columns` names a migration that exists."""
    known = {name for name, _ in MIGRATIONS}
    stray = sorted({since for cols in TABLES.values() for _, _, since in cols} - known)
    if stray:
        raise ValueError(f"store/columns.py names unknown migrations {stray}")


_check_columns()


def applied(db: Database) -> list[str]:
    """Names of the migrations recorded in `db`, in the order applied."""
    if MIGRATIONS_TABLE not in db.table_names():
        return []
    return [r["name"] for r in db.query(f"SELECT name FROM {MIGRATIONS_TABLE} ORDER BY rowid")]


def pending(db: Database) -> list[str]:
    """Names of the known migrations not yet applied to `db`."""
    done = set(applied(db))
    return [name for name, _ in MIGRATIONS if name not in done]


def unknown(db: Database) -> list[str]:
    """Recorded migrations this topasd does not know (a newer writer)."""
    known = {name for name, _ in MIGRATIONS}
    return [name for name in applied(db) if name not in known]


def migrate(db: Database, upto: str | None = None) -> list[str]:
    """Apply pending migrations in order (through `upto` if given), each in its
    own write-locked transaction with its record; returns the names applied.
    Two processes opening a new file at once apply each migration once."""
    ran: list[str] = []
    if MIGRATIONS_TABLE in db.table_names() and not pending(db):
        return ran  # nothing to do: no write lock (a read-only file opens too)
    for name, fn in MIGRATIONS:
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(f"CREATE TABLE IF NOT EXISTS [{MIGRATIONS_TABLE}] "
                       "([name] TEXT PRIMARY KEY, [applied_at] TEXT)")
            if name not in applied(db):
                fn(db)
                now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
                db.execute(f"INSERT INTO [{MIGRATIONS_TABLE}] (name, applied_at) VALUES (?, ?)",
                           [name, now])
                ran.append(name)
            db.execute("COMMIT")
        except BaseException:
            db.rollback()
            raise
        if name == upto:
            break
    return ran
