"""The `topasd` command line (click). Commands by concern: `daemon` (start,
status, stop), `replay` (runs in virtual time and their table), `tune`
(sweep, tune: many replays on a process pool or Ray), `trace` (trace gen),
`views` (console, gantt), `tools` (model tiny, native); shared options in
`options`."""

from __future__ import annotations

from typing import Any

import click

from topasd.model import TopasError


class TopasGroup(click.Group):
    """Turns expected errors (bad input) into one clear line and exit code 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TopasError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)


@click.group(cls=TopasGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="topasd")
def main() -> None:
    """topasd: workflow-aware prefix-state scheduling (TOPAS) for multi-agent LLM serving.

    \b
    Try:
      topasd start --workload chain3 --rate 0.3
      topasd replay --workload chain3 --rate 0.2 --policy all
      topasd trace gen --workload dag4 --rate 0.12 --tasks 200 -o dag4.jsonl
      topasd replay dag4.jsonl --policy lpm --policy spf --json
      topasd sweep -w dag4 --rates 0.1:0.3:5 --seeds 2
      topasd tune dag4.jsonl --trials 30
    """


from topasd.cli import daemon, replay, tools, trace, tune, views  # noqa: E402  (they register)

for _module in (trace, replay, tune, tools, daemon, views):
    for _command in _module.COMMANDS:
        main.add_command(_command)

__all__ = ["main"]
