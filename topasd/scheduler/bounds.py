"""Upper bounds on Phi(R) that prune TOPAS's state search (section IV-E).

`SearchBounds` is mixed into the search of one decision. Every bound here is
at least the best full score GreedyPack can emit for a prefix set, so pruning
by it never changes Eq. 14's argmax (property-tested against an exhaustive
search in tests/test_topas_properties.py):

- `bound`: V_reuse - J_redo - J_revoke plus a fractional knapsack of each
  task's whole possible reduction, net of T_move for tasks that must wait for
  an incoming prefix (Eqs. 8-11);
- `refined`: the same with a fork task valued by the ready requests the set
  covers (small pools; priced in one longest-path pass by `_prime_covers`);
- `quick_family`: cheap bounds that order and prune a whole family of sets
  (small pools) before `refined` prices the survivors: V_reuse by its
  per-agent bound, each touched task by its whole reduction, or by its
  `partial_cap` when the set leaves out one of its agents, the sum capped by
  room times the best ratio;
- `_ext_bounds`: a weak-duality bound for every one- or two-agent extension
  of a set at once (large pools).

Which valid bound prunes a set changes only which losing sets GreedyPack
fills, never the chosen state.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from topasd.model import EngineView, Request
from topasd.scheduler.residual import TaskPaths

Cut = tuple[tuple[int, float], ...]
# per agent: (l_a + KV of Q_t, least d_r if not running, J_redo + J_revoke if running,
# V_reuse bound, bit mask of its items, its own bit)
QuickTerms = dict[str, tuple[float, float, float, float, int, int]]


class SearchBounds(ABC):
    """Bounds of one decision's search; `_Search` provides the state below."""

    budget: float
    view: EngineView
    paths: TaskPaths
    gpu: frozenset[str]
    hold: dict[str, float]
    d: dict[int, float]
    g: dict[int, float]
    min_d: dict[str, float]
    lost_by_agent: dict[str, float]
    # per agent: l_a + KV of its running requests, their J_redo + J_revoke (None
    # if none runs), and its least d_r (inf if none waits)
    agent_terms: dict[str, tuple[float, float | None, float]]
    _quick: QuickTerms | None
    _touched_memo: dict[tuple[int, int], tuple[float, float]]
    _quick_parts: list[tuple[int, int]]
    item_tasks: list[int]
    _quick_scales: tuple[float, float]
    _plan: list[tuple[int, list[Request], frozenset[str],
                      tuple[str, float, float, bool] | None]] | None
    gpu_moves: list[tuple[str, float]]  # T_move share of each GPU prefix leaving, sorted
    lost_all: float
    margin: float  # `preempt_margin`: a preempting state scores >= margin * its cost
    running_agents: frozenset[str]
    running_stage: Mapping[int, dict[str, Request]]
    solo_agents: frozenset[str]
    reuse_value: dict[str, float]  # an upper bound on V_reuse per agent of R (Eq. 11)
    move_in: dict[str, float]
    move_out: dict[str, float]
    waiting_by_task: Mapping[int, list[Request]]
    _bounds: dict[frozenset[str], float]
    _refined: dict[frozenset[str], float]
    _covers: dict[tuple[int, frozenset[str]], tuple[float, float, bool]]
    task_agents: dict[int, frozenset[str]]
    _cover_cuts: dict[tuple[int, frozenset[str]], Cut]
    # per task: its waiting requests' ((stage row, D_hat), agent) by row, if no two share a
    # row (each pair one object, shared by every cut `_cut_of` builds: kept boxed)
    _by_row: dict[int, list[tuple[object, str]] | None]
    _item_arrays: ItemArrays | None
    _orders: dict[frozenset[str], list[str]]  # `ordered`

    # provided by `_Search`: abstract methods, not callable attributes (mypyc compiles both)
    @abstractmethod
    def _items(self) -> list[tuple[float, float, frozenset[str]]]:
        ...

    @abstractmethod
    def base_gain(self, r: Request) -> float:
        ...

    @abstractmethod
    def _joint_gain(self, task_id: int, reqs: list[Request]) -> float:
        ...

    @abstractmethod
    def _joint_cut(self, reqs: list[Request]) -> Cut:
        ...

    @abstractmethod
    def _task_table(self, task_id: int) -> list[tuple[str, int, float, float, bool]]:
        ...

    @abstractmethod
    def _t_move(self, resident: frozenset[str]) -> float:
        ...

    @abstractmethod
    def v_reuse(self, resident: frozenset[str]) -> float:
        ...

    @abstractmethod
    def partial_cap(self, task_id: int) -> float:
        ...

    def ordered(self, agents: frozenset[str]) -> list[str]:
        """`sorted(agents)`, once per set and decision (not to be changed): sums
        over a prefix set run in this fixed order, so that every process
        computes the same floats."""
        hit = self._orders.get(agents)
        if hit is None:
            hit = self._orders[agents] = sorted(agents)
        return hit

    def bound(self, resident: frozenset[str]) -> float:
        """An upper bound on Phi(R): V_reuse - J_redo - J_revoke plus a
        fractional knapsack of the largest admission values (each task's
        value capped by its whole reduction, Eq. 7 sums to it) in R's room."""
        hit = self._bounds.get(resident)
        if hit is None:
            hit = self._bounds[resident] = self._bound(resident)
        return hit

    def refined(self, resident: frozenset[str]) -> float:
        """`bound` with each task valued by the requests R covers (tighter,
        dearer: priced only for sets that pass `bound`; small pools only)."""
        if len(self._items()) > 64:
            return self.bound(resident)
        hit = self._refined.get(resident)
        if hit is None:
            hit = self._refined[resident] = self._bound(resident, covers=True)
        return hit

    def quick_bound(self, resident: frozenset[str]) -> float:
        """A cheap upper bound on Phi(R) (`quick_family`)."""
        return self.quick_family(resident, [(None, ())])[0]

    def quick_family(self, base: frozenset[str],
                     changes: Sequence[tuple[str | None, tuple[str, ...]]]) -> list[float]:
        """Cheap upper bounds on Phi((base - {drop}) | add) for every (drop,
        add) of `changes` (small pools), each in O(|add|) plus a pass over the
        tasks of several agents, after one pass over `base` (and one per
        distinct drop): V_reuse by its per-agent bound (Eq. 11), each task the set
        touches by its whole reduction (Eqs. 6, 7), or at most its
        `partial_cap` when the set leaves out one of its agents, the sum
        capped by room times the best ratio; nothing sorted. Its sums run in
        another order than the scores', so it keeps a margin far above their
        rounding."""
        terms = self._quick_terms()
        room0, need0, lost0, reuse0, mask0 = self.budget, 0.0, self.lost_all, 0.0, 0
        agents0, parts, memo = 0, self._quick_parts, self._touched_memo
        for a in self.ordered(base):  # a fixed order: the same floats (and visits) everywhere
            hold, need_d, lost_d, value, bits, bit = terms[a]
            room0, need0, lost0, reuse0, mask0, agents0 = (
                room0 - hold, need0 + need_d, lost0 - lost_d, reuse0 + value, mask0 | bits,
                agents0 | bit)
        room_tol, value_tol = self._quick_scales
        room_tol *= _QUICK_SLACK
        without: dict[str, int] = {}
        out = []
        for drop, add in changes:
            room, need, lost, reuse, mask, agents = room0, need0, lost0, reuse0, mask0, agents0
            if drop is not None:
                hold, need_d, lost_d, value, _, bit = terms[drop]
                room, need, lost, reuse, agents = (
                    room + hold, need - need_d, lost + lost_d, reuse - value, agents & ~bit)
                mask = without.get(drop, -1)
                if mask < 0:
                    mask = without[drop] = _mask(terms, base - {drop})
            for a in add:
                hold, need_d, lost_d, value, bits, bit = terms[a]
                room, need, lost, reuse, mask, agents = (
                    room - hold, need + need_d, lost - lost_d, reuse + value, mask | bits,
                    agents | bit)
            if room + room_tol < need:
                out.append(-math.inf)
                continue
            partial = 0  # touched items of tasks whose agents the set covers in part
            for item, its_agents in parts:
                if mask & item and its_agents & ~agents:
                    partial |= item
            total, ratio = memo.get((mask, partial)) or self._touched(mask, partial)
            if ratio < math.inf:
                total = min(total, max(room + room_tol, 0.0) * ratio)
            ub = reuse - lost + total
            out.append(ub + _QUICK_SLACK * (abs(ub) + value_tol + total))
        return out

    def _quick_terms(self) -> QuickTerms:
        """Per agent: `agent_terms`, its V_reuse bound, a bit mask of the items
        (`_items` positions) with a request of the agent and the agent's own
        bit; the items of tasks of several agents; and the magnitudes that
        `quick_family`'s rounding margin scales with."""
        if self._quick is None:
            bits: dict[str, int] = {}
            for i, (_, _, ags) in enumerate(self._items()):
                for a in ags:
                    bits[a] = bits.get(a, 0) | (1 << i)
            self._quick = {  # a leaving agent frees `share`, a new one needs `least`
                a: (hold, least if share is None else 0.0, 0.0 if share is None else share,
                    self.reuse_value.get(a, 0.0), bits.get(a, 0), 1 << j)
                for j, (a, (hold, share, least)) in enumerate(self.agent_terms.items())}
            self._quick_parts = [  # (item bit, its agents' bits) of tasks of several agents
                (1 << i, sum(self._quick[a][5] for a in ags))
                for i, (_, _, ags) in enumerate(self._items()) if len(ags) > 1]
            terms = [self._quick[a] for a in sorted(self._quick)]  # a fixed order
            finite = [t[1] for t in terms if t[1] < math.inf]
            self._quick_scales = (self.budget + sum((t[0] for t in terms), 0.0) + sum(finite, 0.0),
                                  1.0 + self.lost_all + sum((t[3] for t in terms), 0.0))
        return self._quick

    def _touched(self, mask: int, partial: int) -> tuple[float, float]:
        """The summed value and the best value per KV token of the items in
        `mask`, those in `partial` valued at most by their `partial_cap`
        (memoized: many sets touch the same items)."""
        hit = self._touched_memo.get((mask, partial))
        if hit is None:
            items, tasks = self._items(), self.item_tasks
            chosen = [(min(v, self.partial_cap(tasks[i])) if partial >> i & 1 else v, w)
                      for i, (v, w, _) in enumerate(items) if mask >> i & 1]
            hit = self._touched_memo[(mask, partial)] = (
                sum((v for v, _ in chosen), 0.0),
                max((v / w if w > 0 else math.inf for v, w in chosen), default=0.0))
        return hit

    def _bound(self, resident: frozenset[str], covers: bool = False) -> float:
        room, need, lost = self.budget, 0.0, self.lost_all
        terms = self.agent_terms
        for a in self.ordered(resident):  # a fixed order: the same floats in every process
            hold, share, least = terms[a]
            room -= hold
            if share is None:
                need += least
            else:
                lost -= share
        if room < need:
            return -math.inf
        ub = loosen(self.v_reuse(resident) - lost + self._knapsack(
            resident, room, self._t_move(resident), covers))
        if self.margin > 0.0 and lost > 0.0 and ub < unloosen(self.margin * lost):
            return -math.inf  # every state would score below the preemption's floor
        return ub

    def _t_move_of(self, resident: frozenset[str]) -> float:
        """T_move(S'|S_t) (Eq. 8): the transfers out, then in, each summed in
        sorted agent order, so that every process computes the same float."""
        t_out = t_in = 0.0
        for a, move in self.gpu_moves:  # sorted
            if a not in resident:
                t_out += move
        for a in self.ordered(resident):
            if a not in self.gpu:
                t_in += self.move_in[a]
        return t_out + t_in

    def _knapsack(self, resident: frozenset[str], room: float, t_move: float,
                  covers: bool = False) -> float:
        """Fractional knapsack of R's items in `room`. A task none of whose
        covered requests has its prefix on the GPU joins T_in when admitted,
        so its value is net of T_move (Eq. 8) and it is left out when that is
        <= 0. With `covers`, a task is valued by what the requests R covers can
        reduce (`_cover`, one longest-path pass per new cover), not by all of
        its waiting requests."""
        items = self._items()
        if len(items) > 64:
            return self._knapsack_np(resident, room, t_move)
        if not covers:
            here = self.gpu & resident
            chosen = [(v if not ags.isdisjoint(here) else v - t_move, w)
                      for v, w, ags in items if not ags.isdisjoint(resident)]
            if t_move > 0:
                chosen = sorted(((v, w) for v, w in chosen if v > 0), key=by_ratio)
            return _fractional(chosen, room)
        chosen = []
        priced = self._covers
        for tid, reqs, mine, alone in self._cover_plan():
            if alone is not None:
                if alone[0] not in resident:
                    continue
                _, v, w, incoming = alone
            else:
                # mine itself when R covers it all (no new set, its hash kept)
                covered = mine if mine <= resident else mine & resident
                if not covered:
                    continue
                v, w, incoming = priced.get((tid, covered)) or self._cover(tid, reqs, covered)
            if incoming:
                v -= t_move
            if v > 0:
                chosen.append((v, w))
        chosen.sort(key=by_ratio)
        return _fractional(chosen, room)

    def _knapsack_np(self, resident: frozenset[str], room: float, t_move: float) -> float:
        """The same fractional knapsack, vectorized for large waiting pools."""
        arrays = self._arrays()
        values, weights, member, col = arrays.values, arrays.weights, arrays.member, arrays.col
        cols = [col[a] for a in resident if a in col]
        if room <= 0 or not cols:
            return 0.0
        mask = member[:, cols].any(axis=1)
        v, w = values[mask], weights[mask]
        if t_move > 0:
            on_gpu = [col[a] for a in resident & self.gpu if a in col]
            v = v - np.where(member[mask][:, on_gpu].any(axis=1), 0.0, t_move)
            keep = v > 0
            v, w = v[keep], w[keep]
            order = np.argsort(-v / np.maximum(w, 1e-12), kind="stable")
            v, w = v[order], w[order]
        cum = np.cumsum(w)
        j = int(np.searchsorted(cum, room, side="right"))
        total = float(v[:j].sum())
        if j < len(w) and w[j] > 0:
            total += float(v[j]) * (room - (cum[j - 1] if j else 0.0)) / float(w[j])
        return total

    def _arrays(self) -> ItemArrays:
        """`_items` as arrays (built once per decision)."""
        if self._item_arrays is None:
            items = self._items()
            agents = sorted({a for _, _, ags in items for a in ags})
            col = {a: i for i, a in enumerate(agents)}
            member = np.zeros((len(items), len(agents)), dtype=bool)
            for i, (_, _, ags) in enumerate(items):
                member[i, [col[a] for a in ags]] = True
            values = np.array([v for v, _, _ in items], dtype=float)
            weights = np.array([w for _, w, _ in items], dtype=float)
            ratios = np.divide(values, weights, out=np.full_like(values, np.inf),
                               where=weights > 0)
            finite = np.unique(ratios[np.isfinite(ratios)])
            lam = np.zeros(1)
            if finite.size:
                lam = np.concatenate((lam, np.quantile(finite, np.linspace(0.0, 1.0, 33))))
            off_gpu = np.array([ags.isdisjoint(self.gpu) for _, _, ags in items], dtype=float)
            self._item_arrays = ItemArrays(values, weights, member, col, off_gpu, lam)
        return self._item_arrays

    def _cover_plan(self) -> list[tuple[int, list[Request], frozenset[str],
                                        tuple[str, float, float, bool] | None]]:
        """Per task: its id, waiting requests and their agents, and for a task
        of one request (agent, value, d_r, prefix off the GPU) (built once)."""
        if self._plan is None:
            self._plan = [
                (tid, reqs, self.task_agents[tid], None if len(reqs) > 1 else (
                    reqs[0].agent, self.base_gain(reqs[0]), self.d[reqs[0].id],
                    reqs[0].agent not in self.gpu))
                for tid, reqs in self.waiting_by_task.items()]
        return self._plan

    def _cover(self, task_id: int, reqs: list[Request],
               covered: frozenset[str]) -> tuple[float, float, bool]:
        """A task of which a prefix set covers only the requests of agents
        `covered`: the most it can admit, g_i * (L_hat_i({}) - L_hat_i(covered))
        (more completions never lengthen the path, so no subset reduces more),
        the least KV it needs, and whether every covered prefix is off the GPU."""
        hit = self._covers.get((task_id, covered))
        if hit is None:
            cov = [(d, off) for a, _, _, d, off in self._task_table(task_id) if a in covered]
            if len(cov) == len(reqs):
                value = self._joint_gain(task_id, reqs)
            elif (task := self.view.tasks.get(task_id)) is None:
                value = 0.0
            else:
                running = self.running_stage.get(task_id, {})
                drop = self.paths.lhat(task, running, ()) - self.paths.lhat(
                    task, running, self._cover_cut(task_id, reqs, covered))
                value = self.g.get(task_id, 1.0) * max(0.0, drop)
            hit = self._covers[(task_id, covered)] = (
                value, min(d for d, _ in cov), all(off for _, off in cov))
        return hit

    def _cover_cut(self, task_id: int, reqs: list[Request], covered: frozenset[str]) -> Cut:
        """H = the requests of agents `covered` completed (memoized)."""
        hit = self._cover_cuts.get((task_id, covered))
        if hit is None:
            hit = self._cover_cuts[(task_id, covered)] = self._cut_of(task_id, reqs, covered)
        return hit

    def _cut_of(self, task_id: int, reqs: list[Request], agents: frozenset[str]) -> Cut:
        """H = the requests of `reqs` (the task's waiting ones) of `agents` completed."""
        if task_id in self._by_row:
            by_row = self._by_row[task_id]
        else:
            table = self._task_table(task_id)
            by_row = self._by_row[task_id] = (
                [((row, dhat), a) for row, dhat, a in sorted(
                    (row, dhat, a) for a, row, dhat, _, _ in table)]
                if len({row for _, row, _, _, _ in table}) == len(table) else None)
        if by_row is not None:  # nothing to merge: the rows' sorted order is the cut's
            return cast(Cut, tuple([entry for entry, a in by_row if a in agents]))
        return self._joint_cut([r for r in reqs if r.agent in agents])

    def _prime_covers(self, r_sets: Iterable[frozenset[str]]) -> None:
        """Price the partial covers `refined` will need for `r_sets` in one
        longest-path pass per workflow (small pools only: only then are they read)."""
        if len(self._items()) > 64:
            return
        sets = list(r_sets)
        if not sets:
            return
        jobs = []
        for tid, reqs in self.waiting_by_task.items():
            task = self.view.tasks.get(tid)
            if len(reqs) == 1 or task is None:
                continue
            mine = self.task_agents[tid]
            keys = {mine & r_set for r_set in sets}
            cuts = [self._cover_cut(tid, reqs, key) for key in keys
                    if key and key != mine and (tid, key) not in self._covers]
            if cuts:
                jobs.append((task, self.running_stage.get(tid, {}), [(), *cuts]))
        self.paths.lhat_batch(jobs)

    def _ext_bounds(self, base: frozenset[str], rest: list[str],
                    size: int) -> np.ndarray | None:
        """Upper bounds on `bound(base | X)` for every X of `size` (1 or 2)
        agents of `rest` (in `itertools.combinations` order), all at once, or
        None when the pool is small enough to price each set exactly.

        By weak duality a fractional knapsack is at most lam * room +
        sum_i max(0, v_i - lam w_i) for any lam >= 0; splitting the items into
        those `base` covers and those each added agent covers only
        over-counts. Items are net of the least T_move (Eq. 8) of any X, and
        each X's excess is charged to the tasks it must admit. The least over
        a grid of lam (the items' ratios) is kept."""
        if len(self._items()) <= 64:
            return None
        n = len(rest)
        ia, ib = np.triu_indices(n, 1) if size == 2 else (np.arange(n), None)

        def per_set(x: np.ndarray) -> np.ndarray:
            return x[ia] if ib is None else x[ia] + x[ib]

        def per_agent(f: Callable[[str], float]) -> np.ndarray:
            return np.array([f(a) for a in rest], dtype=float)

        ordered = sorted(base)  # sums in a fixed order: the same floats in every process
        room = self.budget - sum((self.hold[a] for a in ordered), 0.0) - per_set(
            per_agent(lambda a: self.hold[a]))
        need = sum((self.min_d.get(a, math.inf) for a in ordered
                    if a not in self.running_agents), 0.0) + per_set(
            per_agent(lambda a: 0.0 if a in self.running_agents else self.min_d.get(a, math.inf)))
        fixed = sum((self.reuse_value.get(a, 0.0) for a in ordered), 0.0) - sum(
            (self.lost_by_agent[a] for a in sorted(self.running_agents - base)), 0.0
        ) + per_set(per_agent(
            lambda a: self.reuse_value.get(a, 0.0) + self.lost_by_agent.get(a, 0.0)))
        t_move = self._t_move(base) + per_set(per_agent(
            lambda a: -self.move_out.get(a, 0.0) if a in self.gpu else self.move_in[a]))
        t_lo = max(0.0, float(t_move.min())) if t_move.size else 0.0
        f_base, f_x, lam = self._dual_terms(base, rest, t_lo)
        dual = (room[:, None] * lam[None, :] + f_base[None, :] + per_set(f_x)).min(axis=1)
        incoming = per_agent(lambda a: a not in self.gpu and a not in self.running_agents)
        n_in = len((base - self.gpu) - self.running_agents) + per_set(incoming)
        solo = per_set(per_agent(lambda a: a in self.solo_agents)) == (1 if ib is None else 2)
        if not base <= self.solo_agents:
            solo[:] = False
        dual -= (t_move - t_lo) * np.where(solo, n_in, np.minimum(n_in, 1.0))
        return np.where((room >= 0) & (room >= need), loosen(fixed + dual), -np.inf)

    def _dual_terms(self, base: frozenset[str], rest: list[str],
                    t_lo: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For a grid of lam: sum_i max(0, v_i - t_lo [i off the GPU] - lam w_i)
        over the items `base` covers, and over the other items of each agent
        of `rest`."""
        arrays = self._arrays()
        values = arrays.values - t_lo * arrays.off_gpu
        gain = np.maximum(0.0, values[:, None] - arrays.weights[:, None] * arrays.lam[None, :])
        base_cols = [arrays.col[a] for a in base if a in arrays.col]
        covered = arrays.member[:, base_cols].any(axis=1)
        member = np.zeros((len(values), len(rest)))
        has = [j for j, a in enumerate(rest) if a in arrays.col]
        member[:, has] = arrays.member[:, [arrays.col[rest[j]] for j in has]] & ~np.asarray(
            covered)[:, None]
        return gain[covered].sum(axis=0), member.T @ gain, arrays.lam


@dataclass(frozen=True, slots=True)
class ItemArrays:
    """`_Search._items` as arrays: one row per task."""

    values: np.ndarray
    weights: np.ndarray
    member: np.ndarray  # (task, agent): the task has a waiting request of the agent
    col: dict[str, int]  # agent -> column of `member`
    off_gpu: np.ndarray  # 1.0 where none of the task's agents is on the GPU
    lam: np.ndarray  # the dual grid of `_ext_bounds`


def by_ratio(item: tuple[Any, ...]) -> float:
    """Sort key: value per KV token, descending (weightless items first)."""
    return -item[0] / item[1] if item[1] > 0 else -math.inf


def _fractional(items: list[tuple[float, float]], room: float) -> float:
    """The fractional knapsack of (value, weight) items taken in list order."""
    total = 0.0
    for value, weight in items:
        if room <= 0:
            break
        if weight <= room:
            total += value
            room -= weight
        else:
            total += value * room / weight
            room = 0.0
    return total


def _mask(terms: QuickTerms, agents: frozenset[str]) -> int:
    """The items touched by `agents` (`_quick_terms` bit masks)."""
    mask = 0
    for a in agents:
        mask |= terms[a][4]
    return mask


_QUICK_SLACK = 1e-7  # `quick_bound`'s margin, relative: far above any rounding
SLACK = 1e-9  # bounds summed in another order than the scores they bound: rounding room


def unloosen(floor: float) -> float:
    """A floor lowered by the rounding margin of `loosen`."""
    return floor - SLACK * (1.0 + abs(floor))


def loosen(bound: Any) -> Any:
    """A bound raised by a relative rounding margin (float or array)."""
    if isinstance(bound, float):
        return bound + SLACK * (1.0 + abs(bound))
    return bound + SLACK * (1.0 + np.abs(bound))
