"""TOPAS's search compiled with mypyc (optional): build, find and load it.

The scheduler is pure Python. `topasd native build` compiles its four hot
modules (`residual`, `bounds`, `window`, `topas`) with mypyc into a per-user cache,
under a key made of the source of those modules, `params.py`,
`topasd/model.py` (whose types they rely on), `topasd/score.py` (Eq. 13's
total, which they call) and the interpreter. When
`topasd.scheduler` is imported, it loads the build for exactly these sources
if there is one and its files match their checksums; anything else runs pure
Python, never a stale or damaged build. The compiled search makes the same
decisions as the pure one, float for float (tests/test_native.py); it only
makes them faster (docs/RESULTS.md, "TOPAS decision latency").

`TOPASD_NATIVE=0` forces pure Python. `TOPASD_NATIVE_CACHE` moves the cache,
which is `$XDG_CACHE_HOME/topasd/native` (`~/.cache/topasd/native`) by
default.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topasd.model import TopasError

MODULES = ("residual", "bounds", "window", "topas")  # each after the modules it imports
PACKAGE = "topasd.scheduler"
# what they depend on (their source, and the modules whose types or functions they use)
KEYED = ("../model.py", "../score.py", "params.py", *(f"{m}.py" for m in MODULES))
MANIFEST = "manifest.json"
INSTALL_HINT = "pip install -e '.[native]' in a checkout, or pip install 'topasd[native]'"


class NativeError(TopasError):
    """The compiled scheduler cannot be built."""


@dataclass(frozen=True)
class NativeStatus:
    """Whether this process runs the compiled search, and why (not)."""

    active: bool
    reason: str
    build_dir: Path


def cache_root() -> Path:
    """Where builds live: `TOPASD_NATIVE_CACHE`, else the user's cache dir."""
    given = os.environ.get("TOPASD_NATIVE_CACHE")
    if given:
        return Path(given).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "topasd" / "native"


def build_key(source_dir: Path | None = None) -> str:
    """The sources the compiled modules depend on, and the interpreter's ABI."""
    src = source_dir or Path(__file__).parent
    h = hashlib.sha256()
    for name in KEYED:
        h.update(name.encode() + b"\0" + (src / name).read_bytes() + b"\0")
    h.update(sys.version.encode() + str(sysconfig.get_config_var("EXT_SUFFIX")).encode())
    return h.hexdigest()[:24]


def build_dir() -> Path:
    return cache_root() / build_key()


def enabled() -> bool:
    return os.environ.get("TOPASD_NATIVE", "1").strip().lower() not in ("0", "no", "false", "off")


_STATUS: NativeStatus | None = None


def status() -> NativeStatus:
    """This process's choice (made once, when `topasd.scheduler` was imported)."""
    return _STATUS or load()


def load() -> NativeStatus:
    """Put the compiled modules into `sys.modules` if a build for exactly
    these sources exists (called by `topasd.scheduler` before it imports them)."""
    global _STATUS
    if _STATUS is not None:
        return _STATUS
    try:
        where = build_dir()
    except OSError as exc:  # sources unreadable: nothing to key a build by
        _STATUS = NativeStatus(False, f"pure Python: cannot read the sources ({exc})",
                               cache_root())
        return _STATUS
    if not enabled():
        _STATUS = NativeStatus(False, "pure Python: TOPASD_NATIVE=0", where)
    elif not (where / MANIFEST).is_file():
        stale = "; the cache holds one built before they were edited" if _others(where) else ""
        _STATUS = NativeStatus(False, f"pure Python: no compiled build for these sources"
                               f"{stale} (topasd native build)", where)
    else:
        _STATUS = _load_from(where)
    return _STATUS


def _source_dir() -> str:
    return str(Path(__file__).parent.resolve())


def _others(where: Path) -> list[Path]:
    """Builds in the cache of this source directory and interpreter, for other
    versions of the sources."""
    found = []
    for manifest in where.parent.glob(f"*/{MANIFEST}"):
        if manifest.parent == where:
            continue
        try:
            meta = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("source") == _source_dir() and meta.get("python") == sys.version:
            found.append(manifest.parent)
    return found


def _files(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """(module name, file) of every extension, in the order they load."""
    modules = manifest["modules"]
    missing = [m for m in MODULES if m not in modules]
    if missing:
        raise ValueError(f"its manifest names no file for {', '.join(missing)}")
    return [*manifest["shared"].items(), *((f"{PACKAGE}.{m}", modules[m]) for m in MODULES)]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_from(where: Path) -> NativeStatus:
    added: list[str] = []
    try:
        manifest = json.loads((where / MANIFEST).read_text())
        files = _files(manifest)
        sums = manifest.get("sha256", {})
        for _, file in files:  # a damaged library can crash the process that maps it
            if sums.get(file) != _digest(where / file):
                raise ValueError(f"{file} does not match its checksum (damaged, or built by an "
                                 "older topasd)")
        for name, file in files:
            if name in sys.modules:
                raise ImportError(f"{name} was imported before the compiled build could load")
            loader = importlib.machinery.ExtensionFileLoader(name, str(where / file))
            spec = importlib.util.spec_from_file_location(name, where / file, loader=loader)
            assert spec is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            added.append(name)
            loader.exec_module(module)
    except (OSError, ImportError, KeyError, ValueError, AssertionError) as exc:
        for name in added:  # leave nothing half-loaded: the pure modules import cleanly
            sys.modules.pop(name, None)
        return NativeStatus(False, f"pure Python: the compiled build at {where} did not "
                            f"load ({exc}); rebuild it with `topasd native build`", where)
    return NativeStatus(True, f"compiled (mypyc {manifest.get('mypyc', '?')})", where)


def build(log: bool = False) -> Path:
    """Compile the modules with mypyc into `build_dir()` and return it (about
    half a minute; needs mypy and a C compiler)."""
    try:
        import mypy.version
    except ImportError as exc:
        raise NativeError(f"building the compiled scheduler needs mypy: {INSTALL_HINT}") from exc
    src = Path(__file__).parent
    target = build_dir()
    _check_writable(target.parent)  # before half a minute of compiling
    with tempfile.TemporaryDirectory(prefix="topasd-native-") as tmp:
        work = Path(tmp) / "src"
        shutil.copytree(src.parent, work / "topasd",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
        config = Path(tmp) / "mypy.ini"  # this one only: not the user's own mypy settings
        config.write_text("[mypy]\n")
        cmd = [sys.executable, "-m", "mypyc", "--config-file", str(config),
               *(f"topasd/scheduler/{m}.py" for m in MODULES)]
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        if log or done.returncode:
            sys.stderr.write(done.stdout + done.stderr)
        if done.returncode:
            raise NativeError(_failure(done.returncode, done.stdout + done.stderr))
        try:
            _install(work, target, mypy.version.__version__)
        except OSError as exc:
            raise NativeError(f"cannot write the build to {target.parent} ({exc}); point "
                              "TOPASD_NATIVE_CACHE at a writable directory") from None
    for old in _others(target):  # this checkout's earlier builds: never loaded again
        shutil.rmtree(old, ignore_errors=True)
    return target


def _check_writable(cache: Path) -> None:
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache):
            pass
    except OSError as exc:
        raise NativeError(f"cannot write to the build cache {cache} ({exc}); point "
                          "TOPASD_NATIVE_CACHE at a writable directory") from None


def _failure(code: int, output: str) -> str:
    """Why mypyc failed, from its output (printed above the message)."""
    if re.search(r"^\S+\.py:\d+: error:", output, re.MULTILINE):  # mypy's, not the C compiler's
        return ("mypyc found type errors in topasd's scheduler (above): the compiled "
                "search needs the declared types to hold. Pure Python runs as before.")
    return (f"mypyc failed (exit {code}; its output is above). It needs a C compiler "
            "(gcc or clang) and Python's headers.")


def _install(work: Path, target: Path, mypyc_version: str) -> None:
    """Move the compiled files into `target` whole: a reader never sees half
    a build, and of two concurrent builds of the same sources one wins."""
    suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
    shared = {p.name[: -len(suffix)]: p.name for p in work.glob(f"*__mypyc{suffix}")}
    modules = {m: f"{m}{suffix}" for m in MODULES}
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        for name in shared.values():
            shutil.copy2(work / name, staged / name)
        for name in modules.values():
            shutil.copy2(work / "topasd" / "scheduler" / name, staged / name)
        files = [*shared.values(), *modules.values()]
        (staged / MANIFEST).write_text(json.dumps(
            {"shared": shared, "modules": modules, "mypyc": mypyc_version,
             "python": sys.version, "source": _source_dir(),
             "sha256": {f: _digest(staged / f) for f in files}}, indent=2))
        for name in [*files, MANIFEST]:  # on disk before the rename publishes them
            with open(staged / name, "rb") as fh:
                os.fsync(fh.fileno())
        shutil.rmtree(target, ignore_errors=True)
        try:
            staged.rename(target)
        except OSError:
            if not (target / MANIFEST).is_file():  # not another build's: a real failure
                raise
    finally:
        shutil.rmtree(staged, ignore_errors=True)
