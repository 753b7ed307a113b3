"""Files the daemon writes where another local user may have planted a name
first (the runtime file, the detached log, the temporary folder): never
through a symbolic link, never into another user's file, always 0600.

- `private_dir`: a folder only this user may enter (0700, owned by the
  effective user, not a link): created, or checked when it exists.
- `open_append`: a log opened for appending (O_NOFOLLOW; an existing file must
  be a regular file of this user with one link), created 0600 otherwise.
- `write_replace`: a whole file written through an exclusively created
  temporary file (O_EXCL, 0600) renamed over the name (a rename replaces a
  link, it does not write through it).
- `read_own`: a file's text if it is a regular file of this user, else None.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

from topasd.model import TopasError


class UnsafeFile(TopasError):
    """A path the daemon refuses to write: a link, or another user's file."""


def _owner_problem(st: os.stat_result, path: Path, what: str) -> str | None:
    """Why a file with status `st` is not this user's own `what`, else None."""
    if st.st_uid != os.geteuid():
        return f"{what} {path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})"
    return None


def private_dir(path: str | Path) -> Path:
    """`path` as a folder only this user may enter: created 0700 if absent; an
    existing one must be a real folder (not a link) of this user with no group
    or other permissions (UnsafeFile names what is wrong and the fix)."""
    p = Path(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(p, 0o700)
    try:
        st = os.lstat(p)
    except OSError as exc:
        raise UnsafeFile(f"cannot create the private folder {p} ({exc.strerror})") from None
    fix = ("; remove it (another user may have created it to catch topasd's files), or set "
           "XDG_RUNTIME_DIR or --runtime-file to a folder of yours")
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFile(f"{p} is a symbolic link, not a private folder{fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFile(f"{p} is not a folder{fix}")
    problem = _owner_problem(st, p, "the folder")
    if problem is not None:
        raise UnsafeFile(problem + fix)
    if st.st_mode & 0o077:
        raise UnsafeFile(f"the folder {p} may be entered by other users (mode "
                         f"{stat.S_IMODE(st.st_mode):o}){fix}")
    return p


def open_append(path: str | Path, what: str = "log") -> BinaryIO:
    """`path` opened for appending without following a link: created 0600, or an
    existing regular file of this user with a single link (UnsafeFile otherwise;
    TopasError when it cannot be opened)."""
    p = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(p, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(f"the {what} {p} is a symbolic link; refusing to write through "
                             "it (remove the link, or name another file)") from None
        raise TopasError(f"cannot write the {what} {p} ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        problem = (f"the {what} {p} is not a regular file" if not stat.S_ISREG(st.st_mode)
                   else _owner_problem(st, p, f"the {what}")
                   or (f"the {what} {p} has {st.st_nlink} hard links (another name may "
                       "point at a file of someone else's)" if st.st_nlink != 1 else None))
        if problem is not None:
            raise UnsafeFile(f"{problem}; refusing to write it (remove it, or name another "
                             "file)")
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


def write_replace(path: str | Path, text: str) -> None:
    """Write `text` as the whole of `path` (readers see the old or the new file,
    never half of one): an exclusively created 0600 temporary file in the same
    folder, renamed over `path` (OSError when that fails)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)  # O_EXCL|O_NOFOLLOW, 0600
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_own(path: str | Path) -> str | None:
    """The text of `path` if it is a regular file of this user (not a link);
    None when it is absent, unreadable or someone else's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        return fh.read().decode("utf-8", errors="replace")
