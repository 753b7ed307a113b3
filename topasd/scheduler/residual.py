"""Service-time model and expected longest remaining path (paper section IV-B).

`ServiceModel` keeps, per agent-stage pair (a, v), the empirical distribution
F_{a,v} of total stage LLM service (all ReAct rounds, tool waits excluded) and
the mean service of one request. Before a pair has observations, F_{a,v} is a
point mass at the profiled stage service and a request's contribution falls
back to T_prefill(|input|) + T_decode * max_new.

`TaskPaths` evaluates Eq. 5, E[LP(G, Z_i(H, t))], with the expectation outside
the longest path: on a chain it is the exact sum of expectations (Eq. 5
reduces to it); on a general DAG it averages the longest path over S
deterministic stratified samples with common random numbers (the same quantile
rows for every candidate of a decision), so decisions are reproducible.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from topasd.model import CostHints, Request, StageProgress, StageStatus, TaskView, Workflow

Pair = tuple[str, str]  # (agent, stage)
Cut = tuple[tuple[int, float], ...]  # hypothetical completions: (stage row, D_hat total)
WINDOW = 512  # most recent observations kept per pair (F adapts to drift)
SPREAD_COLUMNS = 8  # a one-set pass of this many columns copies [Z]_+ (`_many_sets`)
RESIDUALS_KEPT = 4096  # started stages' residuals a pair's distribution keeps (`residual_above`)
_DONE: Final = StageStatus.DONE  # read once (an enum member's lookup is slow)


class _Dist:
    """One pair's observations as a sorted array, their mean, and the residual
    of an unstarted stage (the whole distribution), shared by every task."""

    __slots__ = ("_above", "_residuals", "sorted", "unstarted", "values")

    def __init__(self, values: list[float]) -> None:
        self.sorted = list(values)  # for `bisect`
        self.values = np.fromiter(values, np.float64, len(values))
        self.unstarted = _Residual(self.values, 0.0, None)  # its mean when first read
        self._above = _Above(self.values)
        self._residuals: dict[tuple[int, float], _Residual] = {}

    @property
    def mean(self) -> float:
        return self.unstarted.mean

    def residual_above(self, k: int, e: float) -> _Residual:
        """X - e | X > e (`_Residual.above`), one object per (k, e) while these
        observations hold: a stage that waits keeps its residual, and the
        rows sampled from it, from one decision to the next."""
        hit = self._residuals.get((k, e))
        if hit is None:
            if len(self._residuals) >= RESIDUALS_KEPT:
                self._residuals.clear()
            hit = self._residuals[(k, e)] = _Residual.above(self._above, k, e)
        return hit


class _Above:
    """A distribution's observations and its memo of values[k:] at quantile
    rows, without the distribution (which holds the residuals that hold this:
    no reference cycle, so they are freed when the distribution is)."""

    __slots__ = ("memo", "values")

    def __init__(self, values: np.ndarray) -> None:
        self.values = values
        self.memo: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def at(self, k: int, quantiles: np.ndarray, row: int) -> np.ndarray:
        """values[k:] at the stratified quantiles of `row` (memoized: a running
        stage passes the same observations for many decisions)."""
        hit = self.memo.get((row, k))
        if hit is None or hit[0] is not quantiles:
            tail = self.values[k:]
            hit = self.memo[(row, k)] = (quantiles, tail[_positions(quantiles, row, tail.size)])
        return hit[1]


class ServiceModel:
    """Empirical F_{a,v} per agent-stage pair, fed by completed work."""

    def __init__(self) -> None:
        self._stage: dict[Pair, list[float]] = {}  # sorted total stage services
        self._recent: dict[Pair, list[float]] = {}  # arrival order, for the window
        self._dist: dict[Pair, _Dist] = {}
        self._req_sum: dict[Pair, float] = {}
        self._req_n: dict[Pair, int] = {}
        self._req_mean: dict[Pair, float] = {}  # _req_sum / _req_n, per observed pair

    def observe_stage(self, pair: Pair, service_s: float) -> None:
        """A stage finished with total LLM service `service_s` (updates F_{a,v})."""
        recent = self._recent.setdefault(pair, [])
        values = self._stage.setdefault(pair, [])
        recent.append(service_s)
        bisect.insort(values, service_s)
        if len(recent) > WINDOW:
            values.pop(bisect.bisect_left(values, recent.pop(0)))
        self._dist.pop(pair, None)

    def observe_request(self, pair: Pair, service_s: float) -> None:
        """A request finished after `service_s` of LLM service."""
        self._req_sum[pair] = self._req_sum.get(pair, 0.0) + service_s
        n = self._req_n[pair] = self._req_n.get(pair, 0) + 1
        self._req_mean[pair] = self._req_sum[pair] / n  # one division per observation

    def stage_values(self, pair: Pair) -> list[float]:
        return self._stage.get(pair, [])

    def dist(self, pair: Pair) -> _Dist | None:
        """F_{a,v} as an array (None before the first observation)."""
        d = self._dist.get(pair)
        if d is None and self._stage.get(pair):
            d = self._dist[pair] = _Dist(self._stage[pair])
        return d

    def request_estimate(self, req: Request, costs: CostHints) -> float:
        """D_hat_r: mean observed request service of the pair, else the profile."""
        mean = self.mean_request((req.agent, req.stage))
        return costs.t_request(req.input_tokens, req.output_tokens) if mean is None else mean

    def mean_request(self, pair: Pair) -> float | None:
        """The pair's mean observed request (round) service, None before any."""
        return self._req_mean.get(pair)


RunningByTask = dict[int, dict[str, Request]]  # Q_t by task, then stage (`running_by_task`)


def running_by_task(running: Sequence[Request]) -> RunningByTask:
    """Q_t by task, then stage: each task's running requests, as Eq. 5
    (`TaskPaths.lhat`) takes them."""
    by_task: RunningByTask = {}
    for r in running:
        stages = by_task.get(r.task_id)
        if stages is None:
            by_task[r.task_id] = {r.stage: r}
        else:
            stages[r.stage] = r
    return by_task


def round_prior(wf: Workflow, stage: str, costs: CostHints) -> float:
    """Profiled service of one round: T(E[input], E[output])."""
    p = wf.stages[stage].profile
    return costs.t_request(round(p.input_tokens.mean()), round(p.output_tokens.mean()))


def stage_prior(wf: Workflow, stage: str, costs: CostHints) -> float:
    """Profiled total stage service: E[rounds] x T(E[input], E[output])."""
    return max(1.0, wf.stages[stage].profile.rounds.mean()) * round_prior(wf, stage, costs)


class _Residual:
    """Z_{i,v} of one stage (Eq. 4): an array of values, or a point `value`.
    A started stage's array X - e | X > e is built only when read (`above`):
    a DAG task reads just its samples."""

    __slots__ = ("_mean", "_rows", "_source", "_suffix", "_tail", "point")

    def __init__(self, tail: np.ndarray | None, point: float, mean: float | None) -> None:
        self._tail = tail  # sorted ascending
        self.point = point
        self._mean = mean
        self._source: tuple[_Above, int, float] | None = None
        self._suffix: np.ndarray | None = None
        self._rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @classmethod
    def above(cls, dist: _Above, k: int, e: float) -> _Residual:
        """X - e | X > e: dist.values[k:] - e, its first k observations being <= e."""
        res = cls(None, 0.0, None)
        res._source = (dist, k, e)
        return res

    @property
    def tail(self) -> np.ndarray | None:
        if self._tail is None and self._source is not None:
            dist, k, e = self._source
            self._tail = dist.values[k:] - e
        return self._tail

    @property
    def mean(self) -> float:
        if self._mean is None:
            self._mean = float(self.tail.mean())  # type: ignore[union-attr]
        return self._mean

    def sampled(self, row: int, quantiles: np.ndarray) -> np.ndarray:
        """Z at the stratified quantiles of row `row`, kept with the residual:
        an unstarted stage's residual is shared by every task and decision
        until its pair sees a new observation."""
        hit = self.kept(row, quantiles)
        if hit is None:
            shift = self.shifted(row, quantiles)
            if shift is not None:  # the tail's entries, without building it
                picked = shift[0] - shift[1]
            elif self._tail is None:
                picked = np.full(quantiles.shape[1:], self.point)
            else:
                picked = self._tail[_positions(quantiles, row, self._tail.size)]
            self.keep(row, quantiles, picked)
            return picked
        return hit

    def kept(self, row: int, quantiles: np.ndarray) -> np.ndarray | None:
        """`sampled` as kept for row `row` under `quantiles`, else None."""
        hit = self._rows.get(row)
        return None if hit is None or hit[0] is not quantiles else hit[1]

    def keep(self, row: int, quantiles: np.ndarray, picked: np.ndarray) -> None:
        """Keep `picked` as `sampled(row, quantiles)`."""
        self._rows[row] = (quantiles, picked)

    def shifted(self, row: int, quantiles: np.ndarray) -> tuple[np.ndarray, float] | None:
        """For a started stage's X - e | X > e: (X's observations above e at
        the quantiles of row `row`, e), whose difference is `sampled`; None
        for any other residual."""
        if self._source is None:
            return None
        dist, k, e = self._source
        return dist.at(k, quantiles, row), e

    def cut_mean(self, d: float) -> float:
        """E[[Z - d]_+]."""
        if self.tail is None:
            return max(self.point - d, 0.0)
        return float(np.maximum(self.tail - d, 0.0).mean())

    def cut_means(self, d: np.ndarray) -> np.ndarray:
        """E[[Z - d]_+] for many d at once (suffix sums of the sorted tail)."""
        if self.tail is None:
            return np.maximum(self.point - d, 0.0)
        if self._suffix is None:
            self._suffix = np.concatenate((np.cumsum(self.tail[::-1])[::-1], [0.0]))
        n = self.tail.size
        k = np.searchsorted(self.tail, d, side="right")
        return np.maximum((self._suffix[k] - d * (n - k)) / n, 0.0)


class _SetMemo:
    """One residual set's E[LP] per cut, and its samples (`TaskPaths._samples`)."""

    __slots__ = ("clipped", "lhat", "samples", "wf")

    def __init__(self, wf: Workflow) -> None:
        self.wf = wf
        self.lhat: dict[Cut, float] = {}
        self.samples: np.ndarray | None = None  # (stage, S), row v at quantile row v
        self.clipped: np.ndarray | None = None  # [samples]_+


class PathMemo:
    """Residual sets' E[LP] (Eq. 5) from one decision to the next. A set is a
    workflow and the residual objects of its stages; a residual object's
    values never change, so under the same quantile rows neither does any
    E[LP] of the set. A started stage gets a new object whenever its elapsed
    service changes, every stage of a pair whenever the pair sees an
    observation (`ServiceModel.dist`): a set is found again only while
    nothing it depends on changed. A decision keeps the sets it read; the
    others are dropped at the next one."""

    def __init__(self) -> None:
        self._u: np.ndarray | None = None
        self._now: dict[tuple[object, ...], _SetMemo] = {}
        self._last: dict[tuple[object, ...], _SetMemo] = {}
        self._priors: dict[tuple[str, str], tuple[Workflow, CostHints, _Residual]] = {}

    def next_decision(self, quantiles: np.ndarray) -> None:
        """A new decision under `quantiles` (other rows: nothing kept holds)."""
        if quantiles is not self._u:
            self._u, self._now = quantiles, {}
        self._last, self._now = self._now, {}

    def entry(self, sig: tuple[object, ...], wf: Workflow) -> _SetMemo:
        """The memo of the set `sig` = (workflow name, residual objects)."""
        hit = self._now.get(sig)
        if hit is None:
            hit = self._last.get(sig)
            if hit is None or hit.wf is not wf:
                hit = _SetMemo(wf)
            self._now[sig] = hit
        elif hit.wf is not wf:
            hit = self._now[sig] = _SetMemo(wf)
        return hit

    def prior(self, wf: Workflow, v: str, costs: CostHints) -> _Residual:
        """Before observations F_{a,v} is a point mass at the profiled service
        (one object per stage while its workflow and the costs are the same)."""
        key = (wf.name, v)
        hit = self._priors.get(key)
        if hit is None or hit[0] is not wf or hit[1] is not costs:
            prior = stage_prior(wf, v, costs)
            hit = self._priors[key] = (wf, costs, _Residual(None, prior, prior))
        return hit[2]


class TaskPaths:
    """L_hat_i(H, t) for the tasks of one decision (caches live for one view;
    E[LP] of residual sets also in `memo`, from one decision to the next).
    Tasks of one workflow whose residuals are the same objects (unstarted
    stages share theirs, a waiting stage keeps its own) have the same
    samples, so the same L_hat for every cut: they share one residual set,
    and each (set, cut) is priced once."""

    def __init__(self, model: ServiceModel, costs: CostHints, workflows: Mapping[str, Workflow],
                 quantiles: np.ndarray, t: float, memo: PathMemo | None = None) -> None:
        self.model = model
        self.costs = costs
        self.workflows = workflows
        self.u = quantiles  # (rows, S) stratified quantile rows, fixed by the seed
        self.t = t
        self.memo = memo if memo is not None else PathMemo()
        self.memo.next_decision(quantiles)
        self._res: dict[int, list[_Residual]] = {}
        self._dists: dict[str, list[_Dist | None]] = {}  # per workflow (`_residuals`)
        self._set: dict[int, int] = {}  # task id -> its residual set
        self._fresh: dict[str, int] = {}  # workflow -> the residual set of a fresh task
        self._sets: dict[tuple[object, ...], int] = {}  # (workflow, residuals) -> set
        self._set_res: list[list[_Residual]] = []  # each set's residuals
        self._memo: list[_SetMemo] = []  # each set's E[LP] per cut, and samples

    def _set_of(self, task: TaskView, running: Mapping[str, Request]) -> int:
        """The residual set of a task: one per workflow and residual objects."""
        k = self._set.get(task.id)
        if k is None:
            wf = self.workflows[task.workflow]
            k = self._set[task.id] = self._set_index(wf, self._residuals(task, wf, running))
        return k

    def _set_index(self, wf: Workflow, res: list[_Residual]) -> int:
        sig: tuple[object, ...] = (wf.name, *res)
        k = self._sets.get(sig)
        if k is None:
            k = self._sets[sig] = len(self._set_res)
            self._set_res.append(res)
            self._memo.append(self.memo.entry(sig, wf))
        return k

    def fresh(self, name: str) -> float:
        """Eq. 5 for a task of workflow `name` none of whose stages started."""
        k = self._fresh_set(name)
        hit = self._memo[k].lhat.get(())
        if hit is None:
            self._price(self.workflows[name], k, [()])
            hit = self._memo[k].lhat[()]
        return hit

    def _fresh_set(self, name: str) -> int:
        """The residual set of a task of workflow `name` with no stage started."""
        k = self._fresh.get(name)
        if k is None:
            wf = self.workflows[name]
            res = [self._prior(wf, v) if dist is None else dist.unstarted
                   for v, dist in zip(wf.topo_order, self._dists_of(wf), strict=True)]
            k = self._fresh[name] = self._set_index(wf, res)
        return k

    def lhat(self, task: TaskView, running: Mapping[str, Request], cut: Cut = ()) -> float:
        """Eq. 5: expected longest remaining path after hypothetical completions."""
        hit = self._memo[self._set_of(task, running)].lhat.get(cut)
        return self.lhat_many(task, running, [cut])[0] if hit is None else hit

    def lhat_many(self, task: TaskView, running: Mapping[str, Request],
                  cuts: list[Cut]) -> list[float]:
        """Eq. 5 for several hypothetical completion sets of one task at once
        (one vectorized longest-path pass; same quantiles: common random numbers)."""
        k = self._set_of(task, running)
        known = self._memo[k].lhat
        out: list[float | None] = [known.get(c) for c in cuts]
        todo = [cuts[i] for i, v in enumerate(out) if v is None]
        if todo:
            self._price(self.workflows[task.workflow], k, list(dict.fromkeys(todo)))
            return [known[c] for c in cuts]
        return out  # type: ignore[return-value]

    def lhat_batch(self, jobs: Sequence[tuple[TaskView, Mapping[str, Request], list[Cut]]],
                   fresh: Sequence[str] = ()) -> None:
        """Eq. 5 for many tasks' cuts at once, and for a fresh task of each
        workflow of `fresh` (`fresh`), into the cache `lhat` reads: one
        vectorized longest-path pass per DAG workflow (chains are sums); a
        residual set's cuts once, however many tasks have it."""
        by_wf: dict[str, list[tuple[int, list[Cut]]]] = {}
        queued: dict[int, set[Cut]] = {}  # per set, its cuts already in a group
        every: list[tuple[str, int, list[Cut]]] = [
            (task.workflow, self._set_of(task, running), cuts) for task, running, cuts in jobs]
        every.extend((name, self._fresh_set(name), [()]) for name in fresh)
        for name, k, cuts in every:
            known = self._memo[k].lhat
            mine = queued.get(k)
            if mine is None:
                mine = queued[k] = set()
            todo = []
            for c in cuts:
                if c not in known:
                    size = len(mine)
                    mine.add(c)
                    if len(mine) > size:  # not queued before (one hash, not two)
                        todo.append(c)
            if todo:
                by_wf.setdefault(name, []).append((k, todo))
        for name, group in by_wf.items():
            wf = self.workflows[name]
            if wf.is_chain:
                for k, todo in group:
                    self._price(wf, k, todo)
            else:
                self._dag_pass(wf, group)

    def _price(self, wf: Workflow, k: int, cuts: list[Cut]) -> None:
        """E[LP] of set k under each of `cuts` (distinct) into the cache: on a
        chain LP is a sum, so E[LP] = sum of E[Z_v], exactly."""
        if not wf.is_chain:
            self._dag_pass(wf, [(k, cuts)])
            return
        res = self._set_res[k]
        known = self._memo[k].lhat
        base = sum((r.mean for r in res), 0.0)
        for cut in cuts:
            known[cut] = base + sum((res[row].cut_mean(d) - res[row].mean for row, d in cut), 0.0)

    def _dag_pass(self, wf: Workflow, group: list[tuple[int, list[Cut]]]) -> None:
        """E[LP] of every (set, cut) of `group` (distinct; sets of the DAG `wf`)
        into the cache, averaged over the stratified samples in one
        longest-path pass: each cut is one column of the pass."""
        keys: list[tuple[int, Cut]] = []
        place: dict[int, int] = {}  # set -> its place among the pass's sets
        picks: list[int] = []  # the set of each column
        rows: list[int] = []  # each column's cut stage rows (each at most once) ...
        at: list[int] = []  # ... the column ...
        dhat: list[float] = []  # ... and D_hat there
        for k, todo in group:
            i = place.get(k)
            if i is None:
                i = place[k] = len(place)
            for cut in todo:
                j = len(keys)
                keys.append((k, cut))
                picks.append(i)
                for row, d in cut:
                    rows.append(row)
                    at.append(j)
                    dhat.append(d)
        sets, n_cols = list(place), len(keys)
        flat = [rows[i] * n_cols + at[i] for i in range(len(rows))]  # (stage, column)
        stacked = self._sample_sets(sets)
        if len(sets) == 1 and n_cols < SPREAD_COLUMNS:
            z = self._one_set(sets[0], n_cols, flat, dhat)
        else:  # several sets, or one in many columns (copying [Z]_+ is then faster)
            z = self._many_sets(sets, stacked, picks, rows, at, flat, dhat)
        lp = _longest_path(wf, z)
        n: int = lp.shape[-1]
        sums: list[float] = np.add.reduce(lp, axis=-1).tolist()
        for i, (k, cut) in enumerate(keys):  # sums[i] is column i's
            self._memo[k].lhat[cut] = sums[i] / n  # the mean as ndarray.mean takes it

    def _one_set(self, k: int, n_cols: int, flat: list[int], dhat: list[float]) -> np.ndarray:
        """(stage, column, S) = [Z - D_hat]_+ (IV-B, after Eq. 4) of set k
        under the cuts (stage row * n_cols + column, D_hat)."""
        samples = self._samples(k, False)
        cuts = np.zeros(samples.shape[0] * n_cols)  # D_hat per (stage, column)
        if flat:
            cuts[flat] = dhat
        z = samples[:, None] - cuts.reshape(samples.shape[0], n_cols, 1)
        return np.maximum(z, 0.0, out=z)

    def _many_sets(self, sets: list[int], stacked: tuple[np.ndarray, np.ndarray] | None,
                   picks: list[int], rows: list[int], at: list[int], flat: list[int],
                   dhat: list[float]) -> np.ndarray:
        """`_one_set` for columns of several sets (`picks`): x - 0.0 is x, so
        only the stages a cut holds differ from their set's [Z]_+. `stacked`:
        the sets' (samples, [samples]_+) as (set, stage, S) arrays, if at hand."""
        if stacked is None:
            stacked = (np.array([self._samples(k, False) for k in sets]),
                       np.array([self._samples(k, True) for k in sets]))
        z = stacked[1].transpose(1, 0, 2).take(picks, axis=1)  # a new (stage, column, S) array
        if not rows:
            return z
        n_stages, n = z.shape[0], z.shape[-1]
        raw = stacked[0].reshape(-1, n)  # (set * stage, S)
        cut_z = raw[[picks[at[i]] * n_stages + rows[i] for i in range(len(rows))]] \
            - np.array(dhat)[:, None]
        by_cell = z.reshape(-1, n)  # (stage * column, S)
        by_cell[flat] = np.maximum(cut_z, 0.0, out=cut_z)
        return z  # by_cell is a view of it

    def residuals(self, task: TaskView, running: Mapping[str, Request]) -> list[_Residual]:
        """Z_{i,v} of every stage of a task, in `topo_order` rows (Eq. 4)."""
        return self._residuals(task, self.workflows[task.workflow], running)

    def _dists_of(self, wf: Workflow) -> list[_Dist | None]:
        """F_{a,v} of each stage of `wf`, in `topo_order` rows."""
        dists = self._dists.get(wf.name)
        if dists is None:
            dists = self._dists[wf.name] = [self.model.dist((wf.stages[v].agent, v))
                                            for v in wf.topo_order]
        return dists

    def _residuals(self, task: TaskView, wf: Workflow,
                   running: Mapping[str, Request]) -> list[_Residual]:
        res = self._res.get(task.id)
        if res is None:
            stages = task.stages
            dists = self._dists_of(wf)  # one per stage of topo_order
            res = self._res[task.id] = [self._residual(stages[v], wf, v, running, dists[i])
                                        for i, v in enumerate(wf.topo_order)]
        return res

    def _residual(self, prog: StageProgress, wf: Workflow, v: str,
                  running: Mapping[str, Request], dist: _Dist | None) -> _Residual:
        """Eq. 4 for stage v with progress `prog`: Z_{i,v} = X - e | X > e for
        a started stage; X unstarted; 0 done."""
        if prog.status is _DONE:
            return _ZERO
        e = prog.service_s
        req = running.get(v)
        began = req.started_at if req is not None else None
        started = e > 0.0 or began is not None
        if began is not None:
            e += max(0.0, self.t - began)
        if dist is None:  # F is a point mass at the profile: it knows no rounds,
            if not started:  # so a started stage keeps at least the floor
                return self._prior(wf, v)
            point = max(self._prior(wf, v).point - e, self._floor(wf, v, req))
            return _Residual(None, point, point)
        if not started:  # an unstarted stage keeps its whole distribution X
            return dist.unstarted
        k = bisect.bisect_right(dist.sorted, e)
        if k == len(dist.sorted):
            floor = self._floor(wf, v, req)
            return _Residual(None, floor, floor)
        return dist.residual_above(k, e)

    def _prior(self, wf: Workflow, v: str) -> _Residual:
        """Before observations F_{a,v} is a point mass at the profiled service."""
        return self.memo.prior(wf, v, self.costs)

    def _floor(self, wf: Workflow, v: str, req: Request | None) -> float:
        """Residual of an active stage whose service exceeds every observation
        (Eq. 4 conditions on an event of probability zero there): what the
        running request still needs, at least 1% of its estimate; with no
        request running, one more round (a round is waiting, or follows the
        tool wait), at the pair's mean observed round service."""
        if req is None:
            mean = self.model.mean_request((wf.stages[v].agent, v))
            return round_prior(wf, v, self.costs) if mean is None else mean
        est = self.model.request_estimate(req, self.costs)
        elapsed = max(0.0, self.t - req.started_at) if req.started_at is not None else 0.0
        return max(est - elapsed, 0.01 * est)

    def _samples(self, k: int, clipped: bool) -> np.ndarray:
        """S stratified samples of every Z_{i,v} of set k (row v uses quantile
        row v), or [Z]_+ of them."""
        m = self._memo[k]
        if m.samples is None or m.clipped is None:
            self._sample_sets([k])
        return (m.clipped if clipped else m.samples)  # type: ignore[return-value]

    def _sample_sets(self, sets: list[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """`_samples` of those of `sets` without them, built at once: one
        array for their rows, the started stages' X - e | X > e subtracted in
        one step (the same differences, element for element, as
        `_Residual.sampled`; x - 0.0 is x for the other rows), and their
        [Z]_+ in one step. When it built every one of `sets`: (samples,
        [samples]_+) as (set, stage, S) arrays."""
        todo = [k for k in sets if self._memo[k].clipped is None]  # kept with its samples
        if not todo:
            return None
        u = self.u
        rows, shifts, late = self._sample_rows(todo)
        samples: np.ndarray = np.concatenate(rows).reshape(len(rows), -1)  # as np.array stacks
        if late:  # a started stage's rows are not kept: mostly a running one's, new each time
            samples = samples - np.array(shifts)[:, None]
        samples = samples.reshape(len(todo), -1, u.shape[1])
        clipped = np.maximum(samples, 0.0)
        for j, k in enumerate(todo):
            m = self._memo[k]
            m.samples, m.clipped = samples[j], clipped[j]
        return (samples, clipped) if len(todo) == len(sets) else None

    def _sample_rows(self, todo: list[int]) -> tuple[list[np.ndarray], list[float], bool]:
        """The rows of sets `todo` (row v at quantile row v): each kept one,
        else for a started stage X's observations above e, with e among the
        shifts (0.0 for the other rows); and whether there was one."""
        u, n_rows = self.u, self.u.shape[0]
        rows: list[np.ndarray] = []
        shifts: list[float] = []
        late = False
        for k in todo:
            for i, r in enumerate(self._set_res[k]):
                row = i % n_rows
                hit = r.kept(row, u)
                shift = r.shifted(row, u) if hit is None else None
                if shift is None:
                    rows.append(r.sampled(row, u) if hit is None else hit)
                    shifts.append(0.0)
                    continue
                late = True
                rows.append(shift[0])
                shifts.append(shift[1])
        return rows, shifts, late


_ZERO = _Residual(None, 0.0, 0.0)


# (row, size) -> (quantile rows, `_positions`)
_POSITIONS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
POSITIONS_KEPT = 4096


def _positions(quantiles: np.ndarray, row: int, size: int) -> np.ndarray:
    """Where `size` sorted values are at the stratified quantiles u of row
    `row`, u in [0, 1): floor(u * size) (once per row and size)."""
    hit = _POSITIONS.get((row, size))
    if hit is None or hit[0] is not quantiles:
        if len(_POSITIONS) >= POSITIONS_KEPT:
            _POSITIONS.clear()
        hit = _POSITIONS[(row, size)] = (quantiles, (quantiles[row] * size).astype(np.int64))
    return hit[1]


def _longest_path(wf: Workflow, z: np.ndarray) -> np.ndarray:
    """LP(G, z) per cut and sample, from the sinks up; z is (stage, cut, S)
    and is overwritten with each stage's longest path to a sink."""
    for rows, succ in wf.lp_steps:
        tail = z[succ]
        if tail.shape[0] > 1:
            tail = np.maximum.reduce(tail, axis=0, keepdims=True)
        z[rows] += tail
    entries = [wf.stage_index[v] for v in wf.entry_stages]
    return z[entries[0]] if len(entries) == 1 else np.maximum.reduce(z[entries], axis=0)


def quantile_rows(n_rows: int, samples: int, seed: int) -> np.ndarray:
    """Stratified (Latin-hypercube) quantiles: row k is a fixed permutation of
    (j + 0.5)/S, independent across rows; deterministic given the seed."""
    rng = np.random.default_rng(seed)
    strata = (np.arange(samples) + 0.5) / samples
    return np.vstack([rng.permutation(strata) for _ in range(n_rows)])
