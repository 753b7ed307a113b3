"""The workflows a daemon knows and the ones its engine runs.

Registered: the built-in workloads' workflows, the `--workload` and the
`--workflow` spec files. Active: those in use, as the policy sees them
(`EngineView.workflows`); agents are global by name, so an agent whose name
another workflow took with a different prefix size is renamed
`<workflow>/<agent>`. Calls without a registered workflow run in a
synthesized one-stage workflow `agent:<agent>`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from topasd.daemon.errors import Invalid
from topasd.lifecycle import SYNTHESIZED
from topasd.model import Agent, Stage, Workflow
from workflows.builtin import Workload, builtin_workflows

if TYPE_CHECKING:
    from topasd.daemon.calls import CallSpec



class WorkflowRegistry:
    """Registered workflows by name, and the active ones the engine runs."""

    def __init__(self, workload: Workload | None, specs: tuple[Workflow, ...]) -> None:
        # `config.load_settings` refused name clashes between these
        self.known: dict[str, Workflow] = {name: wf for name, (_, wf)
                                           in builtin_workflows().items()}
        for wf in (*(workload.workflows if workload else ()), *specs):
            self.known[wf.name] = wf
        self.active: dict[str, Workflow] = {}  # the policy's view; grows as they are used
        self._agent_sizes: dict[str, int] = {}
        self._system_keys: dict[str, str] = {}  # agents that a call's system prompt defined

    def registered(self, name: str) -> Workflow:
        wf = self.known.get(name)
        if wf is None:
            raise Invalid(f"workflow: unknown workflow {name!r}; registered: "
                          f"{', '.join(sorted(self.known))} (add spec files with --workflow)")
        return wf

    def activate(self, name: str) -> Workflow:
        """The registered workflow `name` as the engine runs it (its agents renamed
        where another workflow holds the name with another prefix size)."""
        if name in self.active:
            return self.active[name]
        wf = self.known[name]
        rename = {a.name: f"{wf.name}/{a.name}" for a in wf.agents.values()
                  if self._agent_sizes.get(a.name, a.prefix_tokens) != a.prefix_tokens}
        if rename:
            agents = {rename.get(a, a): Agent(rename.get(a, a), ag.prefix_tokens)
                      for a, ag in wf.agents.items()}
            stages = {v: replace(s, agent=rename.get(s.agent, s.agent))
                      for v, s in wf.stages.items()}
            wf = Workflow(wf.name, agents, stages, wf.description)
        for agent in wf.agents.values():
            self._agent_sizes[agent.name] = agent.prefix_tokens
        self.active[name] = wf
        return wf

    def synthesized(self, agent: str, spec: CallSpec) -> Workflow:
        """The one-stage workflow `agent:<agent>` of calls without a registered
        workflow; a new agent's prefix is this call's system prompt."""
        name = f"{SYNTHESIZED}{agent}"
        wf = self.active.get(name)
        if wf is None:
            if agent not in self._agent_sizes:
                self._system_keys[agent] = spec.system_key
            size = self._agent_sizes.get(agent, spec.system_tokens)
            wf = Workflow(name, {agent: Agent(agent, size)}, {"call": Stage("call", agent)},
                          f"calls of agent {agent} (synthesized)")
            self._agent_sizes[agent] = size
            self.active[name] = wf
        return wf

    def uncached_system(self, agent: str, spec: CallSpec) -> int:
        """Tokens of a system prompt that is not its agent's prefix: an agent that
        a call's system prompt defined keeps that prefix, and a later call with
        another system prompt sends its own as input (no prefix-cache hit)."""
        key = self._system_keys.get(agent)
        return spec.system_tokens if key is not None and key != spec.system_key else 0
