"""`topasd model tiny` and `topasd native`: a model directory for the vLLM
backend, and the compiled TOPAS search."""

from __future__ import annotations

import click

from topasd.scheduler import native as compiled_search

# ----------------------------------------------------------------- model


@click.group()
def model() -> None:
    """Model directories for the vLLM backend (nothing is downloaded)."""


@model.command("tiny")
@click.option("--output", "-o", type=click.Path(file_okay=False), required=True,
              help="The directory to write (created if missing).")
@click.option("--layers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Decoder layers (1-64).")
@click.option("--hidden", type=click.IntRange(64, 4096), default=128, show_default=True,
              help="Hidden size, a multiple of 64 up to 4096 (head size 32; the key/value "
                   "heads must divide the query heads).")
@click.option("--vocab", type=click.IntRange(64, 262_144), default=2048, show_default=True,
              help="Vocabulary size (64-262,144; dummy weights fill hidden x vocab twice).")
def model_tiny(output: str, layers: int, hidden: int, vocab: int) -> None:
    """Write a tiny Qwen2-style config.json; vLLM runs it with dummy weights.

    \b
    Try:
      topasd model tiny -o tiny-model
      topasd replay --workload chain3 --tasks 3 -p topas --backend vllm --model tiny-model
    """
    from backends.vllm.tiny import write_tiny_model

    path = write_tiny_model(output, layers=layers, hidden=hidden, vocab=vocab)
    click.echo(f"wrote {path / 'config.json'}: Qwen2, {layers} layers, hidden {hidden}, "
               f"vocab {vocab} (dummy weights at load)", err=True)


# ---------------------------------------------------------------- native


@click.group()
def native() -> None:
    """The compiled TOPAS search (mypyc): same decisions, ~1.4x faster at paper scale.

    \b
    Build it once after installing topasd, and again after editing the
    search (topasd/scheduler/residual.py, bounds.py, topas.py, params.py),
    topasd/model.py or changing Python; it needs mypy, a C compiler and
    Python's headers (pip install -e '.[native]'; python3-dev):
      topasd native build
    Until then topasd runs the pure-Python search, which decides the same.
    Builds live in $TOPASD_NATIVE_CACHE, else $XDG_CACHE_HOME/topasd/native
    (~/.cache/topasd/native);
    TOPASD_NATIVE=0 runs pure Python.
    """


@native.command("build")
@click.option("--verbose", "-v", is_flag=True, help="Show mypyc's and the compiler's output.")
def native_build(verbose: bool) -> None:
    """Compile topasd/scheduler's search into the per-user cache (~30 s)."""
    click.echo(f"compiling topasd.scheduler ({', '.join(compiled_search.MODULES)}) with mypyc ...",
               err=True)
    where = compiled_search.build(log=verbose)
    click.echo(f"built {where}; topasd processes started from now on use it"
               + ("" if compiled_search.enabled() else " (not with TOPASD_NATIVE=0, as now)"))


@native.command("status")
def native_status() -> None:
    """Say whether topasd started here (this environment) runs the compiled
    search, and why (not); `topasd status` says it of a running daemon."""
    st = compiled_search.status()
    where = "is in" if st.active else "would go in (topasd native build)"
    click.echo(f"{st.reason}\nthe build for these sources {where}: {st.build_dir}")


COMMANDS = [model, native]
