"""Each decision-log table's columns, written once, and the row layouts the
writer sends its process (`store/_child.py`), named by those columns.

`store.schema`'s migrations create and add these columns (each column names
the migration that added it), `store.writer` builds its rows in these
layouts, and the writer process builds its INSERT statements from them: a
new column is one line here, its migration and the code that fills it.
Stdlib only and no imports: the writer process loads this file by path.
"""

M001 = "m001_core_tables"

# table -> ((column, type, the migration that added it), ...), in column order
TABLES: dict[str, tuple[tuple[str, type, str], ...]] = {
    "runs": tuple((name, typ, M001) for name, typ in (
        ("id", int), ("started_ts", float), ("finished_ts", float), ("status", str),
        ("pid", int), ("host", str), ("policy", str), ("backend", str), ("profile", str),
        ("params", str), ("workload", str), ("seed", int), ("trace_meta", str),
        ("version", str), ("log_candidates", str), ("summary", str), ("error", str),
        ("decisions", int), ("candidates", int), ("events", int))),
    "tasks": tuple((name, typ, M001) for name, typ in (
        ("run_id", int), ("task_id", int), ("workflow", str), ("arrival", float),
        ("completion", float), ("jct", float))),
    "requests": (*((name, typ, M001) for name, typ in (
        ("run_id", int), ("request_id", int), ("task_id", int), ("stage", str),
        ("agent", str), ("input_tokens", int), ("output_tokens", int), ("ready", float),
        ("admitted", float), ("started", float), ("finished", float), ("service_s", float),
        ("preemptions", int), ("retractions", int))),
        ("withdrawn", float, "m004_request_withdrawn")),
    "decisions": (*((name, typ, M001) for name, typ in (
        ("run_id", int), ("seq", int), ("t", float), ("wall_ms", float), ("wall_ts", float),
        ("noop", int), ("admit", str), ("preempt", str), ("load", str), ("evict", str),
        ("n_admit", int), ("n_preempt", int), ("n_load", int), ("n_evict", int),
        ("reservation", str), ("blocked", int), ("retry", int), ("n_candidates", int),
        ("n_logged", int), ("chosen", int), ("chosen_resident", str), ("j_admit", float),
        ("j_move", float), ("j_redo", float), ("j_revoke", float), ("v_reuse", float),
        ("total", float))),
        # the waiting requests the policy left out of W_t (`Decision.held`), and how many
        ("held", str, "m006_decision_held"), ("n_held", int, "m006_decision_held")),
    "candidates": tuple((name, typ, M001) for name, typ in (
        ("run_id", int), ("decision_seq", int), ("idx", int), ("won", int),
        ("resident", str), ("admit", str), ("preempt", str), ("j_admit", float),
        ("j_move", float), ("j_redo", float), ("j_revoke", float), ("v_reuse", float),
        ("total", float))),
    "engine_events": (*((name, typ, M001) for name, typ in (
        ("id", int), ("run_id", int), ("t", float), ("kind", str), ("request_id", int),
        ("task_id", int), ("agent", str), ("stage", str), ("tokens", int), ("value", float),
        ("note", str))),
        ("decision", int, "m005_preempt_decision")),
    "param_changes": (*((name, typ, M001) for name, typ in (
        ("id", int), ("run_id", int), ("t", float), ("wall_ts", float), ("name", str),
        ("old", str), ("new", str), ("source", str))),
        ("from_decision", int, "m003_param_change_first_decision")),
}

TERMS = ("j_admit", "j_move", "j_redo", "j_revoke", "v_reuse")  # Eq. 13's, in this order

# The rows the writer sends (each a tuple in this order; `EngineEvent`'s attributes
# carry these names) and the rows the writer process inserts (run_id first).
EVENT_ROW = ("kind", "t", "request_id", "task_id", "agent", "stage", "tokens", "value", "note",
             "decision")
# a decision as sent: the head for a compact no-op (with the requests it held); + the
# lists (and n_logged); + the chosen candidate (index, resident set, terms and total)
# when one was chosen
DECISION_HEAD = ("seq", "t", "wall_ms", "wall_ts", "reservation", "blocked", "retry",
                 "n_candidates", "held")
DECISION_LISTS = ("admit", "preempt", "load", "evict", "n_logged")
DECISION_CHOSEN = ("chosen", "chosen_resident", *TERMS, "total")
DECISION_ROW = (*DECISION_HEAD, "n_held", "noop", "admit", "preempt", "load", "evict", "n_admit",
                "n_preempt", "n_load", "n_evict", "n_logged", *DECISION_CHOSEN)
# a candidate as sent (`Candidate`'s attributes, then its terms), and as inserted
CANDIDATE_SENT = ("resident", "admit", "preempt", *TERMS)
CANDIDATE_ROW = ("decision_seq", "idx", "won", "resident", "admit", "preempt", *TERMS, "total")
PARAM_ROW = ("t", "wall_ts", "name", "old", "new", "source", "from_decision")
ROWS = {"engine_events": EVENT_ROW, "decisions": DECISION_ROW, "candidates": CANDIDATE_ROW,
        "param_changes": PARAM_ROW}


def columns(table: str, added_by: str | None = None) -> dict[str, type]:
    """The columns of `table` (those `added_by` one migration), name -> type."""
    return {name: typ for name, typ, since in TABLES[table]
            if added_by is None or since == added_by}


def added_by(migration: str) -> list[tuple[str, str, type]]:
    """(table, column, type) of every column `migration` adds."""
    return [(table, name, typ) for table, cols in TABLES.items()
            for name, typ, since in cols if since == migration]


def insert_sql(table: str) -> str:
    """`INSERT INTO table (run_id, <its row>) VALUES ({run}, ?, ...)` for the
    writer process (`{run}`: the run id, formatted in per frame)."""
    names = ROWS[table]
    return (f"INSERT INTO {table} (run_id, {', '.join(names)}) VALUES ({{run}}, "
            + ", ".join("?" * len(names)) + ")")


def check() -> None:
    """Every row layout names columns of its table (ValueError naming the stray)."""
    for table, names in ROWS.items():
        stray = sorted(set(names) - set(columns(table)))
        if stray:
            raise ValueError(f"store/columns.py: {table} has no column(s) {stray}")


check()
