"""Files the daemon writes where another local user may have planted a name
first: a link is never written through, another user's file never written,
the temporary folder's runtime files sit in a private 0700 folder, every file
is 0600. Real files, the real command line."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemonkit import clean_env
from topasd.daemon.files import UnsafeFile, open_append, private_dir, read_own, write_replace
from topasd.daemon.runtime import RuntimeFile

VICTIM_TEXT = "root:x:0:0:do not touch\n"


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.write_text(VICTIM_TEXT)
    return path


def start(tmp_path: Path, *args: str, env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "topasd.cli", "start", "--port", "0",
                           "--db", str(tmp_path / "d.db"), *args], cwd=tmp_path,
                          env=env or clean_env(), capture_output=True, text=True, timeout=120)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def without_runtime_dir(tmp: Path) -> dict[str, str]:
    """The environment of a user without XDG_RUNTIME_DIR whose temporary folder is `tmp`."""
    env = clean_env(TMPDIR=str(tmp))
    env.pop("XDG_RUNTIME_DIR", None)
    return env


def test_a_link_planted_at_the_log_or_runtime_file_is_refused(tmp_path: Path) -> None:
    target = victim(tmp_path)
    for flag in ("--log-file", "--runtime-file"):
        link = tmp_path / f"planted{flag}"
        link.symlink_to(target)
        args = [flag, str(link)]
        if flag == "--log-file":
            args += ["--runtime-file", str(tmp_path / "rt.json")]
        for detach in ([], ["--detach"]):
            res = start(tmp_path, *args, *detach)
            assert res.returncode == 2, res.stderr
            assert res.stderr.startswith("error: the ") and "symbolic link" in res.stderr
            assert "refusing to write through it" in res.stderr
            assert "Traceback" not in res.stderr
            assert target.read_text() == VICTIM_TEXT and link.is_symlink()
    assert not (tmp_path / "d.db").exists()


def test_a_planted_private_folder_is_refused_and_nothing_is_written_into_it(
        tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = tmp / f"topasd-{os.geteuid()}"
    planted.symlink_to(elsewhere)
    res = start(tmp_path, env=without_runtime_dir(tmp))
    assert res.returncode == 2
    assert f"error: {planted} is a symbolic link, not a private folder" in res.stderr
    assert list(elsewhere.iterdir()) == []
    planted.unlink()
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)  # (the umask may have narrowed it)
    res = start(tmp_path, env=without_runtime_dir(tmp))
    assert res.returncode == 2 and "may be entered by other users (mode 777)" in res.stderr
    assert list(planted.iterdir()) == []


def test_without_xdg_runtime_dir_the_files_sit_in_a_private_folder(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = without_runtime_dir(tmp)
    shown = subprocess.run([sys.executable, "-m", "topasd.cli", "start", "--print-config"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    folder = tmp / f"topasd-{os.geteuid()}"
    assert f'runtime_file = "{folder / "topasd.json"}"' in shown.stdout
    res = start(tmp_path, "--detach", "--speed", "max", env=env)
    assert res.returncode == 0, res.stderr
    runtime = folder / "topasd.json"
    pid = json.loads(runtime.read_text())["pid"]
    try:
        assert mode(folder) == 0o700
        assert mode(runtime) == 0o600 and mode(folder / "topasd.log") == 0o600
        assert sorted(p.name for p in folder.iterdir()) == ["topasd.json", "topasd.log"]
    finally:
        stop = subprocess.run([sys.executable, "-m", "topasd.cli", "stop"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert f"topasd (pid {pid}) stopped" in stop.stdout and not runtime.exists()


def test_open_append_writes_only_a_regular_file_of_this_user(tmp_path: Path) -> None:
    target = victim(tmp_path)
    link = tmp_path / "link.log"
    link.symlink_to(target)
    with pytest.raises(UnsafeFile, match="is a symbolic link"):
        open_append(link)
    hard = tmp_path / "hard.log"
    os.link(target, hard)
    with pytest.raises(UnsafeFile, match="has 2 hard links"):
        open_append(hard)
    with pytest.raises(UnsafeFile, match="is not a regular file"):
        open_append("/dev/null")
    assert target.read_text() == VICTIM_TEXT
    fresh = tmp_path / "fresh.log"
    with open_append(fresh) as fh:
        fh.write(b"one\n")
    with open_append(fresh) as fh:
        fh.write(b"two\n")
    assert fresh.read_text() == "one\ntwo\n" and mode(fresh) == 0o600
    if os.geteuid() == 0:  # a file another user owns (root can make one)
        os.chown(fresh, 65534, 65534)
        with pytest.raises(UnsafeFile, match="belongs to uid 65534"):
            open_append(fresh)


def test_write_replace_replaces_a_link_and_never_writes_its_target(tmp_path: Path) -> None:
    target = victim(tmp_path)
    link = tmp_path / "rt.json"
    link.symlink_to(target)
    write_replace(link, '{"pid": 1}\n')
    assert target.read_text() == VICTIM_TEXT
    assert not link.is_symlink() and link.read_text() == '{"pid": 1}\n' and mode(link) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rt.json", "victim"]  # no leftovers


def test_a_runtime_file_that_is_a_link_or_someone_elses_is_not_read(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"pid": os.getpid(), "url": "http://127.0.0.1:9"}))
    link = tmp_path / "rt.json"
    link.symlink_to(record)
    assert read_own(link) is None and RuntimeFile(link).read() is None
    with pytest.raises(UnsafeFile, match="is a symbolic link; refusing"):
        RuntimeFile(link).check_free()
    if os.geteuid() == 0:
        os.chown(record, 65534, 65534)
        assert read_own(record) is None


def test_private_dir_creates_0700_and_refuses_another_users_folder(tmp_path: Path) -> None:
    made = private_dir(tmp_path / "mine")
    assert mode(made) == 0o700 and private_dir(made) == made  # an existing one is checked
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(UnsafeFile, match="belongs to uid 65534"):
            private_dir(theirs)
