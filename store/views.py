"""The decision log's views: the common questions as one `SELECT` over plain
columns (docs/decision-log.md). Ids are typed integers, so a parameter given
as text (`sqlite-utils -p rid 12`) matches too.

- `decision_actions`: one row per thing a decision did: `action` (admit,
  preempt, load, evict, hold) and its `request_id` (admit, preempt, hold: a
  waiting request left out of W_t) or `agent` (load, evict).
- `preemption_log`: one row per preemption (`by` policy) or retraction (`by`
  engine), `id` its event's: its decision (the policy's; logs before m005 find it through
  `decision_actions`), request, task, workflow, stage, agent, tokens it had
  generated, the chosen state's total and the best rejected candidate's total
  (logged candidates only) and their margin.
- `request_log`: one row per request: its task's workflow, stage and agent,
  ready / admitted / finished times, `queue_s` (ready -> first admission),
  `e2e_s` (ready -> finish), service, preemptions, retractions, withdrawal.
- `task_log`: one row per task: workflow, arrival, completion, JCT, its
  requests and their summed queueing and preemptions.
"""

from __future__ import annotations

_ACTION = """SELECT run_id, seq AS decision, t, '{action}' AS action,
       {request} AS request_id, {agent} AS agent
FROM decisions, json_each(decisions.{column})"""

DECISION_ACTIONS = "\nUNION ALL\n".join(
    _ACTION.format(action=a, column=col,
                   request="CAST(json_each.value AS INTEGER)" if ids else "NULL",
                   agent="NULL" if ids else "CAST(json_each.value AS TEXT)")
    for a, col, ids in (("admit", "admit", True), ("preempt", "preempt", True),
                        ("load", "load", False), ("evict", "evict", False),
                        ("hold", "held", True)))

PREEMPTION_LOG = """
SELECT q.*, q.chosen_total - q.best_rejected_total AS margin FROM (
SELECT p.run_id, p.id, p.t, p.decision, p.by, p.request_id, p.task_id, tk.workflow, p.stage,
       p.agent, p.generated, d.total AS chosen_total,
       (SELECT max(c.total) FROM candidates c WHERE c.run_id = p.run_id
          AND c.decision_seq = p.decision AND c.won = 0) AS best_rejected_total
FROM (SELECT e.run_id, e.id, e.t, e.request_id, e.task_id, e.stage, e.agent, e.tokens AS generated,
             CASE e.kind WHEN 'preempt' THEN 'policy' ELSE 'engine' END AS by,
             CAST(CASE WHEN e.kind = 'retract' THEN NULL ELSE coalesce(e.decision, (
                 SELECT max(a.decision) FROM decision_actions a
                 WHERE a.run_id = e.run_id AND a.action = 'preempt'
                   AND a.request_id = e.request_id AND a.t <= e.t)) END AS INTEGER) AS decision
      FROM engine_events e WHERE e.kind IN ('preempt', 'retract')) p
LEFT JOIN tasks tk ON tk.run_id = p.run_id AND tk.task_id = p.task_id
LEFT JOIN decisions d ON d.run_id = p.run_id AND d.seq = p.decision) q"""

REQUEST_LOG = """
SELECT r.run_id, r.request_id, r.task_id, tk.workflow, r.stage, r.agent,
       r.input_tokens, r.output_tokens, r.ready, r.admitted, r.started, r.finished,
       r.admitted - r.ready AS queue_s, r.finished - r.ready AS e2e_s, r.service_s,
       r.preemptions, r.retractions, r.withdrawn
FROM requests r LEFT JOIN tasks tk ON tk.run_id = r.run_id AND tk.task_id = r.task_id"""

TASK_LOG = """
SELECT tk.run_id, tk.task_id, tk.workflow, tk.arrival, tk.completion, tk.jct,
       count(r.request_id) AS requests, sum(r.admitted - r.ready) AS queue_s,
       coalesce(sum(r.preemptions), 0) AS preemptions,
       coalesce(sum(r.retractions), 0) AS retractions
FROM tasks tk LEFT JOIN requests r ON r.run_id = tk.run_id AND r.task_id = tk.task_id
GROUP BY tk.run_id, tk.task_id"""

# name -> SELECT, in creation order (a view may read the ones before it)
VIEWS: dict[str, str] = {
    "decision_actions": DECISION_ACTIONS,
    "preemption_log": PREEMPTION_LOG,
    "request_log": REQUEST_LOG,
    "task_log": TASK_LOG,
}
