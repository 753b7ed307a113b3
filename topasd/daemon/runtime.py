"""The runtime file: where a running daemon records its address (pid, URL,
store, run) so that `topasd status`, `topasd stop`, `topasd console` and a
second `topasd start` find it. One daemon per file; a file whose process is
gone (or now runs another program) is stale and ignored, and so is one that is
a link or belongs to another user. It is written through `files.write_replace`
(0600, never through a link), in the private folder `private_runtime_dir()`
when XDG_RUNTIME_DIR is unset."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from pathlib import Path
from typing import Any

from topasd.config import default_runtime_file, private_runtime_dir, raw_setting
from topasd.daemon.files import UnsafeFile, private_dir, read_own, write_replace
from topasd.model import TopasError, pid_alive, pid_runs_topasd


class AlreadyRunning(TopasError):
    """Another daemon owns the runtime file."""


class RuntimeFile:
    """One runtime file (it need not exist)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @staticmethod
    def configured(runtime_file: str | None = None, config: str | None = None) -> RuntimeFile:
        """The file `topasd start` would use: the flag, TOPAS_RUNTIME_FILE, the
        TOML file's `runtime_file`, else the default."""
        return RuntimeFile(str(raw_setting("runtime_file", {"runtime_file": runtime_file},
                                           config=config)))

    def __str__(self) -> str:
        return str(self.path)

    @property
    def stop_command(self) -> str:
        """The `topasd stop` that reaches the daemon of this file."""
        if str(self.path) == default_runtime_file():
            return "topasd stop"
        return f"topasd stop --runtime-file {shlex.quote(str(self.path))}"

    def read(self) -> dict[str, Any] | None:
        """The live daemon's record (None if absent, unreadable or stale)."""
        text = read_own(self.path)
        try:
            info = json.loads(text) if text is not None else None
        except ValueError:
            return None
        if not isinstance(info, dict) or not pid_alive(info.get("pid")):
            return None
        if not pid_runs_topasd(info["pid"]):  # stale: the pid now belongs to another program
            return None
        return info

    def check_free(self) -> None:
        """TopasError unless a daemon of this process may claim the file: its
        folder exists (the default private folder is created) and is not a link
        planted by someone (UnsafeFile), and no other live daemon holds it
        (AlreadyRunning)."""
        if self.path.parent == private_runtime_dir():
            private_dir(self.path.parent)
        if self.path.is_symlink():
            raise UnsafeFile(f"the runtime file {self.path} is a symbolic link; refusing to "
                             "write through it (remove the link, or give another "
                             "--runtime-file)")
        if not self.path.parent.is_dir():  # as --db: a mistyped folder is not created
            raise TopasError(f"runtime file {self.path}: the folder {self.path.parent} does "
                             "not exist; create it or give another --runtime-file")
        other = self.read()
        if other is not None and other.get("pid") != os.getpid():
            raise AlreadyRunning(f"a daemon already runs (pid {other.get('pid')}, "
                                 f"{other.get('url')}); stop it with `{self.stop_command}` or "
                                 "give this one another --runtime-file")

    def write(self, info: dict[str, Any]) -> None:
        """Record `info` (atomically: readers never see half a file)."""
        try:
            write_replace(self.path, json.dumps(info, indent=2) + "\n")
        except OSError as exc:
            raise TopasError(f"cannot write the runtime file {self.path} ({exc.strerror}); "
                             "set --runtime-file to a writable place") from None

    def remove_if_ours(self) -> None:
        """Remove the file if this process wrote it."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            if json.loads(read_own(self.path) or "{}").get("pid") == os.getpid():
                self.path.unlink()
