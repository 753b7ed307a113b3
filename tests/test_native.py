"""The compiled TOPAS search (`topasd native build`, topasd/scheduler/native.py):
it builds, loads only for exactly the sources it was built from, and makes
the same decisions as pure Python, float for float."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from topasd.scheduler import native

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "topasd.cli"]


def _env(cache: Path, enabled: bool = True) -> dict[str, str]:
    return {**os.environ, "TOPASD_NATIVE_CACHE": str(cache), "TOPASD_NATIVE": "1" if enabled
            else "0"}


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def _fake_build(where: Path, source: str, python: str) -> None:
    where.mkdir(parents=True)
    (where / native.MANIFEST).write_text(json.dumps(
        {"shared": {}, "modules": {}, "source": source, "python": python}))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh build in a private cache, through the CLI (mypyc and gcc: ~30 s),
    under a user mypy config that would fail it if the build read it, beside
    an earlier build of these sources (which it replaces) and one of another
    checkout (which it keeps)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    if not Path(sysconfig.get_paths()["include"], "Python.h").is_file():
        pytest.skip("no Python headers on this machine (python3-dev)")
    cache = tmp_path_factory.mktemp("native-cache")
    config = tmp_path_factory.mktemp("xdg")
    (config / "mypy").mkdir()
    (config / "mypy" / "config").write_text("[mypy]\nstrict = True\n")
    source = str(Path(native.__file__).parent.resolve())
    _fake_build(cache / "0ld", source, sys.version)
    _fake_build(cache / "elsewhere", "/another/checkout/topasd/scheduler", sys.version)
    env = _env(cache)
    stale = _run([*CLI, "native", "status"], env)
    assert "; the cache holds one built before they were edited" in stale.stdout
    done = _run([*CLI, "native", "build"], {**env, "XDG_CONFIG_HOME": str(config)})
    assert done.returncode == 0, done.stderr
    assert "built " in done.stdout
    assert not (cache / "0ld").exists() and (cache / "elsewhere").exists()
    return cache


def test_status_names_the_compiled_build_and_its_modules_are_extensions(built: Path) -> None:
    done = _run([*CLI, "native", "status"], _env(built))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("compiled (mypyc 2.4.1)")
    probe = _run([sys.executable, "-c", "import topasd.scheduler.topas as t, "
                  "topasd.scheduler.bounds as b, topasd.scheduler.residual as r; "
                  "print(t.__file__, b.__file__, r.__file__)"], _env(built))
    files = probe.stdout.split()
    assert len(files) == 3 and all(f.startswith(str(built)) and f.endswith(".so")
                                   for f in files), probe.stdout + probe.stderr
    off = _run([*CLI, "native", "status"], _env(built, enabled=False))
    assert off.stdout.startswith("pure Python: TOPASD_NATIVE=0")


def test_compiled_and_pure_make_the_same_decisions(built: Path) -> None:
    """Every decision (admissions, preemptions, moves, every candidate's score
    terms) and every JCT, over six workload/parameter cases and a crowd of 40 agents."""
    digests = []
    for enabled in (True, False):
        done = _run([sys.executable, "-m", "tests.native_digest"], _env(built, enabled))
        assert done.returncode == 0, done.stderr
        digests.append(json.loads(done.stdout))
    compiled, pure = digests
    assert compiled["native"] is True and pure["native"] is False
    assert all(case["decisions"] > 10 and case["pickles"] for case in pure["cases"])
    assert compiled["cases"] == pure["cases"]


def test_edited_sources_run_pure_python_not_a_stale_build(built: Path, tmp_path: Path) -> None:
    src = Path(native.__file__).parent
    copy = tmp_path / "topasd"
    shutil.copytree(src.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    same = native.build_key(copy / "scheduler")
    assert same == native.build_key(src)
    bounds = copy / "scheduler" / "bounds.py"
    bounds.write_text(bounds.read_text() + "\n# edited\n")
    assert native.build_key(copy / "scheduler") != same
    model = copy / "model.py"  # the compiled code reads its types too
    bounds.write_text(bounds.read_text().removesuffix("\n# edited\n"))
    model.write_text(model.read_text() + "\n")
    assert native.build_key(copy / "scheduler") != same


def test_a_broken_build_falls_back_to_pure_python_and_says_why(tmp_path: Path) -> None:
    env = _env(tmp_path)
    key = _run([sys.executable, "-c", "from topasd.scheduler import native; "
                "print(native.build_key())"], env).stdout.strip()
    (tmp_path / key).mkdir()
    (tmp_path / key / native.MANIFEST).write_text(json.dumps(
        {"shared": {}, "modules": {m: f"{m}.missing.so" for m in native.MODULES}}))
    done = _run([*CLI, "native", "status"], env)
    assert done.stdout.startswith("pure Python: the compiled build at"), done.stdout
    assert "did not load" in done.stdout and "topasd native build" in done.stdout
    replay = _run([*CLI, "replay", "-w", "chain3", "-r", "0.3", "-n", "5", "-p", "topas",
                   "-q", "--json"], env)
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["runs"][0]["tasks"] == 5


def test_building_without_mypy_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("TOPASD_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "mypy", None)
    monkeypatch.setitem(sys.modules, "mypy.version", None)
    with pytest.raises(native.NativeError, match=r"pip install 'topasd\[native\]'"):
        native.build()
    assert not any(tmp_path.iterdir())


def test_an_unwritable_cache_is_named_before_compiling(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TOPASD_NATIVE_CACHE", str(blocker / "native"))
    with pytest.raises(native.NativeError, match="TOPASD_NATIVE_CACHE at a writable"):
        native.build()


def test_a_damaged_library_is_not_loaded(built: Path, tmp_path: Path) -> None:
    """A truncated extension crashes the process that maps it (SIGBUS), even
    `topasd --help`: its checksum keeps it from being loaded."""
    cache = tmp_path / "cache"
    shutil.copytree(built, cache)
    key = next(p for p in cache.iterdir() if (p / native.MANIFEST).is_file()
               and json.loads((p / native.MANIFEST).read_text()).get("modules"))
    shared = next(key.glob("*__mypyc*"))
    shared.write_bytes(shared.read_bytes()[: shared.stat().st_size // 2])
    done = _run([*CLI, "native", "status"], _env(cache))
    assert done.returncode == 0, done.stderr
    assert f"{shared.name} does not match its checksum (damaged" in done.stdout
    replay = _run([*CLI, "replay", "-w", "chain3", "-r", "0.3", "-n", "5", "-p", "topas",
                   "-q", "--json"], _env(cache))
    assert replay.returncode == 0, replay.stderr
    assert json.loads(replay.stdout)["search"].startswith("pure Python")


def test_a_failed_build_says_whether_types_or_the_compiler_failed() -> None:
    typed = native._failure(1, "topasd/scheduler/bounds.py:3: error: Incompatible types")
    assert "type errors" in typed and "Pure Python runs as before" in typed
    compiler = native._failure(1, "build/__native.c:12:10: error: Python.h: No such file")
    assert "C compiler" in compiler and "headers" in compiler
