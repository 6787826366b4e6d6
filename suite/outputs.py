"""The one way fleetbench writes a file, and reads one where a file is expected.

Every output of every command goes through here (reports, plots, traces, --markdown, --save, --out,
the nightly's state and last good commit, the asv dashboard's vendored assets,
appended records):

- **nothing that is not ours is replaced**: an existing path that is not a regular file (a directory
  where a file is expected, a FIFO, a device node, a socket, a symbolic link) is refused with one line
  naming it (:class:`OutputError`), never written into or renamed over;
- **a file is written whole or not at all** (:func:`write_atomic`, :meth:`OutputDir.write`): into a
  temporary file beside it, created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name (a link or
  file planted under a predictable name is never followed or reused), then renamed over the target;
- **nothing is written through a link under an output directory** (:class:`OutputDir`): the directory is
  held by a descriptor and every component below it is opened from its parent's descriptor with
  ``O_NOFOLLOW``, so a symbolic link anywhere inside (``traces/1 -> /elsewhere``, ``vendor -> /elsewhere``)
  is refused, not followed; the directory's own path above it is the user's;
- **records are appended whole** (:func:`append_whole`): an exclusive lock, one write whose count is checked,
  fsync; a short write (a full disk) is cut back, so the file keeps every earlier line and nothing of this one;
  a run's records that their file cannot take go to a fallback file, else to stderr (:func:`append_or_fallback`),
  never lost;
- **an output is checked before anything runs by the writer's own rule** (:func:`output_problem`: a file, or a
  directory; ``probe``: writing tried for real);
- files are created mode 0644 (less what the umask takes), directories 0755;
- **an input where a file is expected is a regular file of bounded size** (:func:`open_input`): opened
  without blocking, so a FIFO or a device is refused by its type, never read (nothing hangs); JSON read from
  one is bounded too (:func:`loads_bounded`: its nesting, its integers), its faults said in words
  (:func:`json_problem`);
- **a name the suite turns into a path is one safe component** (:func:`name_problem`, :func:`safe_name`);
- **a command whose standard output is its result keeps it for the result alone** (:func:`claimed_stdout`):
  ranks, NCCL (whose banner and warnings go to stdout) and libraries write to stderr instead.

This module is at the bottom of the layers (docs/architecture.md): every layer may write through it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

from .validate import show

__all__ = ["OutputError", "InputError", "ShortWrite", "OutputDir", "write_atomic", "append_whole", "output_problem",
           "append_or_fallback", "STDERR", "open_input", "read_input", "file_kind", "safe_name", "name_problem",
           "NAME_CHARS", "loads_bounded", "json_problem", "MAX_DEPTH", "claimed_stdout", "FILE_MODE", "DIR_MODE"]

FILE_MODE = 0o644  # files written (the umask applies, as it does to open())
DIR_MODE = 0o755
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOT_FOLLOWED = (errno.ELOOP, errno.ENOTDIR, errno.EMLINK)  # O_NOFOLLOW met a link (EMLINK: FreeBSD)


class OutputError(OSError):
    """An output that cannot be written where asked (what is there is not ours to replace, a link on the way, a
    name that is not one path component): one line naming the path and what is allowed."""

    def __init__(self, message: str):
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.args[0])


class InputError(ValueError):
    """An input file that cannot be read as one: missing, not a regular file, too large (names the path)."""


class ShortWrite(OSError):
    """An append that the file system took only part of (a full disk): the file was cut back to its
    previous end, so it holds every earlier line and nothing of this one."""


def file_kind(mode: int) -> str | None:
    """What a file of ``mode`` (``st_mode`` of an lstat) is, in words, when it is not a regular file."""
    if stat.S_ISREG(mode):
        return None
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a directory" if stat.S_ISDIR(mode)
            else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device node" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def _shown(path: str) -> str:
    """A path for a one-line message: control characters escaped, at most 200 characters."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
                   for c in str(path)[:400])
    return text if len(text) <= 200 else text[:197] + "..."


NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:@+")


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= 128 and not value.startswith(".") \
        and set(value) <= NAME_CHARS


def name_problem(value: Any) -> str | None:
    """Why ``value`` cannot be one component of a file name the suite builds (a run id, a case name
    with its '/' replaced): None when it is 1-128 characters of letters, digits and ``._-:@+``, not
    starting with '.'; a name is never a path."""
    if not _is_name(value):
        return (f"{show(value)} is not a name: expected 1-128 letters, digits and . _ - : @ +, not starting "
                f"with '.'")
    return None


def safe_name(value: Any, what: str = "name") -> str:
    """``value`` if it is one safe path component (:func:`name_problem`'s rule); else an :class:`OutputError`
    naming ``what``: a name the suite turns into a path is never a path."""
    if not _is_name(value):
        raise OutputError(f"{what} {_shown(repr(value))} is not a name: expected 1-128 letters, digits and "
                          f". _ - : @ +, not starting with '.' (a name becomes one path component)")
    return value


def _component(name: str, shown: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise OutputError(f"{_shown(shown)}: {_shown(repr(name))} is not one component of a path under the output "
                          f"directory")
    return name


def _lstat_at(dfd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _refuse_existing(dfd: int, name: str, shown: str) -> None:
    st = _lstat_at(dfd, name)
    if st is None or stat.S_ISREG(st.st_mode):
        return
    kind = file_kind(st.st_mode) or "not a regular file"
    if stat.S_ISLNK(st.st_mode):
        try:
            kind += f" (to {_shown(repr(os.readlink(name, dir_fd=dfd)))})"
        except OSError:
            pass
        raise OutputError(f"{_shown(shown)}: is {kind}; nothing is written through links: remove it or give the "
                          f"file itself")
    raise OutputError(f"{_shown(shown)}: is {kind}; expected a regular file (it is not replaced)")


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        view = view[n:]


@contextlib.contextmanager
def _replacing_at(dfd: int, name: str, shown: str, text: bool, encoding: str = "utf-8",
                  mode: int | None = None) -> Iterator[IO]:
    """A new temporary file beside ``name`` (in the directory ``dfd``), renamed over ``name`` when the block
    ends without an exception; removed otherwise.  ``mode``: the file's permission bits exactly, whatever the
    umask (else :data:`FILE_MODE` less the umask)."""
    _refuse_existing(dfd, name, shown)
    for _ in range(100):
        tmp = f".{name[:80]}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE,
                         dir_fd=dfd)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 100 collisions of 64 random bits
        raise OutputError(f"{_shown(shown)}: no temporary file could be created beside it")
    fh: IO = os.fdopen(fd, "w", encoding=encoding) if text else os.fdopen(fd, "wb")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        yield fh
        fh.flush()
        os.fsync(fd)
        fh.close()
        _refuse_existing(dfd, name, shown)  # what appeared meanwhile is not replaced either
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        fh.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise


def _as_bytes(data: str | bytes) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def _open_parent(path: str) -> tuple[int, str]:
    """(a descriptor of ``path``'s directory, the file's name in it): the directory is the user's, as given."""
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    if not name:
        raise OutputError(f"{_shown(path)}: is a directory; give a file name")
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), name
    except FileNotFoundError:
        raise OutputError(f"{_shown(path)}: the directory {_shown(directory)} does not exist") from None
    except NotADirectoryError:
        raise OutputError(f"{_shown(path)}: {_shown(directory)} is not a directory") from None


def write_atomic(path: str, data: str | bytes, mode: int | None = None) -> None:
    """``data`` into ``path`` whole or not at all (see the module docstring): a temporary file beside it, created
    exclusively and never through a link, renamed over it, so a crash, a cancel or a full disk leaves the previous
    file (or none), never half of the new one.  An existing ``path`` that is not a regular file (a directory, a
    FIFO, a device node, a socket, a symbolic link) is an :class:`OutputError`, and stays as it was.  ``mode``: the
    file's permission bits exactly, whatever the umask (traces: 0644); else 0644 less the umask."""
    dfd, name = _open_parent(path)
    try:
        with _replacing_at(dfd, name, os.fspath(path), text=False, mode=mode) as fh:
            fh.write(_as_bytes(data))
    finally:
        os.close(dfd)


def output_problem(path: str, what: str = "file", *, probe: bool = False) -> str | None:
    """Why ``path`` cannot be written as a file (None when it can, as far as can be told beforehand), in words
    that follow the option and the path in a one-line error.  ``what`` "directory": a directory is expected there
    (one missing is made by its writer, under the nearest directory that exists).  ``probe``: writing is tried for
    real, as the writer will (a file opened for appending, else a temporary file made in its directory, which is
    made first if missing): root's permission bits and an immutable directory fool ``os.access``, not this."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        said = getattr(exc, 'strerror', None) or exc
        return f"cannot be written ({said}); pick a writable path" if probe else f"cannot be used ({said})"
    if what == "directory":
        if st is not None and stat.S_ISLNK(st.st_mode):
            return "is a symbolic link; give the directory itself"
        if st is not None and not stat.S_ISDIR(st.st_mode):
            return "exists and is not a directory"
        where = os.path.abspath(path)
        while not os.path.isdir(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)
        return None if os.access(where, os.W_OK | os.X_OK) else f"{_shown(where)} is not writable"
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            return "is a directory; give a file name"
        if stat.S_ISLNK(st.st_mode):
            return "is a symbolic link; give the file itself"
        if not stat.S_ISREG(st.st_mode):
            return f"is not a regular file ({file_kind(st.st_mode)}); it is not replaced"
    parent = os.path.dirname(os.path.abspath(path))
    if probe:
        try:
            if st is not None:
                with open(path, "ab"):
                    pass
            else:
                os.makedirs(parent, exist_ok=True)
                with tempfile.TemporaryFile(dir=parent):
                    pass
        except OSError as exc:
            return f"cannot be written ({exc.strerror or exc}); pick a writable path"
        return None
    if not os.path.isdir(parent):
        return f"the directory {_shown(parent)} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK) or (st is not None and not os.access(path, os.W_OK)):
        return "not writable"
    return None


STDERR = "stderr (one JSON line per record)"  # where lines go once neither their file nor a fallback takes them


def append_or_fallback(path: str, append: Callable[[str], None], line: Callable[[], str], fallbacks: dict,
                       say: Callable[[str], None]) -> str:
    """``append(target)`` (one record appended whole) to ``path``, and where it went: once ``path`` cannot take one
    (a full disk: the file is cut back to its last whole line), a fallback file in the temporary directory
    (``TMPDIR`` as given: where it is full, not some other directory); when that fails too, ``say`` (stderr) one
    line (``line()``) per record.  ``fallbacks`` (path -> where its lines go now) is kept by the caller for the
    run; each change is said once.  Never raises."""
    target = fallbacks.get(path, path)
    if target != STDERR:
        try:
            append(target)
            return target
        except OSError as exc:
            why = f"{type(exc).__name__}: {exc}"
        if target == path:
            fallback = _new_fallback()
            if fallback is not None:
                try:
                    append(fallback)
                    fallbacks[path] = fallback
                    say(f"fleetbench run: cannot append to {path} ({why}; the file keeps its earlier records "
                        f"intact); this and the next records of this run go to {fallback}")
                    return fallback
                except OSError as exc:
                    why = f"{why}; the fallback {fallback}: {type(exc).__name__}: {exc}"
                    with contextlib.suppress(OSError):
                        if os.path.getsize(fallback) == 0:
                            os.unlink(fallback)  # no empty fallback file left behind
        fallbacks[path] = STDERR
        say(f"fleetbench run: cannot append to {target} ({why}); this and the next records of this run are "
            f"printed on stderr, one JSON line each (lines starting with '{{'): keep them, e.g. "
            f"`grep '^{{' LOG >> {path}` once there is room")
    say(line())
    return STDERR


def _new_fallback() -> str | None:
    try:
        fd, fallback = tempfile.mkstemp(prefix="fleetbench-fallback-", suffix=".jsonl",
                                        dir=os.environ.get("TMPDIR") or None)
    except OSError:
        return None
    os.close(fd)
    return fallback


def append_whole(path: str, data: bytes, *, fresh_line: bool = True) -> None:
    """Append ``data`` (one or more whole lines) to ``path``, all or nothing: an exclusive lock, one write whose
    count is checked, fsync.  A short write (a full disk) truncates the file back to where it ended and raises
    :class:`ShortWrite`; any OSError leaves the file as it was.  ``path`` must be a regular file or missing (a
    link, a FIFO, a device is an :class:`OutputError`); ``fresh_line``: a previous writer killed mid-line left no
    newline, so this one starts on a fresh line."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{_shown(path)}: is {file_kind(st.st_mode)}; expected a regular file to append to")
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                     | getattr(os, "O_NOCTTY", 0), FILE_MODE)
    except OSError as exc:
        if exc.errno in _NOT_FOLLOWED:
            raise OutputError(f"{_shown(path)}: is a symbolic link; nothing is written through links") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{_shown(path)}: is {file_kind(st.st_mode)}; expected a regular file to append to")
        os.set_blocking(fd, True)
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if fresh_line and size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise ShortWrite(errno.ENOSPC, f"only {written} of {len(data)} bytes written")
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, size)  # nothing half-written stays behind
            raise
    finally:
        os.close(fd)  # closing releases the lock


def _dir_error(dfd: int | None, name: str, shown: str, exc: OSError) -> OutputError:
    """Why ``name`` (in ``dfd``, or a path) could not be opened as a directory without following a link."""
    if isinstance(exc, FileNotFoundError):
        return OutputError(f"{_shown(shown)}: no such directory")
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return OutputError(f"{_shown(shown)}: cannot be opened as a directory ({exc.strerror or exc})")
    if stat.S_ISLNK(st.st_mode):
        try:
            to = os.readlink(name, dir_fd=dfd)
        except OSError:
            to = "?"
        return OutputError(f"{_shown(shown)}: is a symbolic link (to {_shown(repr(to))}); nothing is written "
                           f"through links: remove it, or give another directory")
    if not stat.S_ISDIR(st.st_mode):
        return OutputError(f"{_shown(shown)}: is {file_kind(st.st_mode)}; expected a directory")
    return OutputError(f"{_shown(shown)}: cannot be opened as a directory ({exc.strerror or exc})")


class OutputDir:
    """A directory fleetbench writes into, held by a descriptor: every path below it is reached component by
    component from its parent's descriptor with ``O_NOFOLLOW``, so a symbolic link anywhere inside is refused
    (:class:`OutputError` naming it), never followed; files are written as :func:`write_atomic` writes them.

    ``path`` itself must be a directory, not a symbolic link (``create``: made, with its parents, when missing);
    the path above it is the user's.  Use as a context manager, or :meth:`close` it."""

    def __init__(self, path: str, *, create: bool = True, _fd: int | None = None):
        self.path = os.fspath(path)
        if _fd is not None:
            self.fd = _fd
            return
        if create and not os.path.lexists(self.path):
            try:
                os.makedirs(self.path, mode=DIR_MODE, exist_ok=True)
            except FileExistsError:
                pass
        try:
            self.fd = os.open(self.path, _DIR_FLAGS)
        except OSError as exc:
            raise _dir_error(None, self.path, self.path, exc) from None

    # ---- life cycle ----------------------------------------------------------------------------------------
    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        with contextlib.suppress(Exception):
            self.close()

    # ---- paths ---------------------------------------------------------------------------------------------
    def join(self, rel: str) -> str:
        """The path ``rel`` names under this directory (for messages and for tools that take a path)."""
        return os.path.join(self.path, rel)

    def _parts(self, rel: str) -> list[str]:
        rel = os.fspath(rel)
        if os.path.isabs(rel):
            raise OutputError(f"{_shown(rel)}: an absolute path; expected a path under {_shown(self.path)}")
        return [_component(p, self.join(rel)) for p in rel.split("/") if p not in ("",)]

    def dir(self, rel: str, create: bool = True) -> OutputDir:
        """The directory ``rel`` below this one (made when missing and ``create``), every component checked."""
        parts = self._parts(rel)
        fd = os.dup(self.fd)
        path = self.path
        try:
            for part in parts:
                try:
                    new = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError as exc:
                    if not create:
                        raise _dir_error(fd, part, os.path.join(path, part), exc) from None
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, DIR_MODE, dir_fd=fd)
                    try:
                        new = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    except OSError as exc2:
                        raise _dir_error(fd, part, os.path.join(path, part), exc2) from None
                except OSError as exc:
                    raise _dir_error(fd, part, os.path.join(path, part), exc) from None
                os.close(fd)
                fd, path = new, os.path.join(path, part)
        except BaseException:
            os.close(fd)
            raise
        return OutputDir(path, _fd=fd)

    def _parent(self, rel: str) -> tuple[OutputDir, str]:
        parts = self._parts(rel)
        if not parts:
            raise OutputError(f"{_shown(self.path)}: expected a file name under it")
        return self.dir("/".join(parts[:-1])), parts[-1]

    # ---- reading what is there -----------------------------------------------------------------------------
    def entries(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def lstat(self, name: str) -> os.stat_result | None:
        return _lstat_at(self.fd, _component(name, self.join(name)))

    # ---- writing -------------------------------------------------------------------------------------------
    def write(self, rel: str, data: str | bytes, mode: int | None = None) -> str:
        """``data`` into ``rel`` (below this directory) whole or not at all; returns the path written.  ``mode``:
        the file's permission bits exactly, whatever the umask (see :func:`write_atomic`)."""
        parent, name = self._parent(rel)
        with parent, _replacing_at(parent.fd, name, self.join(rel), text=False, mode=mode) as fh:
            fh.write(_as_bytes(data))
        return self.join(rel)

    @contextlib.contextmanager
    def replacing(self, rel: str, text: bool = True) -> Iterator[IO]:
        """A file object whose content replaces ``rel`` when the block ends (a stream a child process writes,
        a JSON dump); nothing of it is left when the block raises."""
        parent, name = self._parent(rel)
        with parent, _replacing_at(parent.fd, name, self.join(rel), text=text) as fh:
            yield fh

    def append(self, rel: str, data: str | bytes) -> None:
        """``data`` appended to ``rel`` (created when missing), in one write; never through a link."""
        parent, name = self._parent(rel)
        with parent:
            _refuse_existing(parent.fd, name, self.join(rel))
            try:
                fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                             | os.O_CLOEXEC, FILE_MODE, dir_fd=parent.fd)
            except OSError as exc:
                if exc.errno in _NOT_FOLLOWED:
                    _refuse_existing(parent.fd, name, self.join(rel))
                raise
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise OutputError(f"{_shown(self.join(rel))}: is {file_kind(st.st_mode)}; expected a regular "
                                      f"file")
                os.set_blocking(fd, True)
                _write_fd(fd, _as_bytes(data))
            finally:
                os.close(fd)

    def copy_in(self, src: str, rel: str, limit: int | None = None, links: bool = True) -> str:
        """The regular file ``src`` (opened without following a link in its last component, refused if it is
        not a regular file, over ``limit`` bytes, or with more than one hard link unless ``links``) copied to
        ``rel``; returns the path written."""
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fin:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (not links and st.st_nlink > 1) or \
                    (limit is not None and st.st_size > limit):
                raise OutputError(f"{_shown(src)}: not one regular file"
                                  + (f" of at most {limit // 2**20} MiB" if limit is not None else "")
                                  + "; not copied")
            os.set_blocking(fd, True)
            with self.replacing(rel, text=False) as fout:
                while chunk := fin.read(2**20):
                    fout.write(chunk)
        return self.join(rel)

    def remove(self, rel: str) -> None:
        """Remove the file (or link) ``rel``, or the tree ``rel`` without following any link in it."""
        parent, name = self._parent(rel)
        with parent:
            _remove_at(parent.fd, name)


def _remove_at(dfd: int, name: str) -> None:
    st = _lstat_at(dfd, name)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dfd)
        return
    fd = os.open(name, _DIR_FLAGS, dir_fd=dfd)
    try:
        for entry in os.listdir(fd):
            _remove_at(fd, entry)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dfd)


# ---- inputs ----------------------------------------------------------------------------------------------------
MAX_INPUT_BYTES = 2**30


def open_input(path: str, what: str = "file", limit: int = MAX_INPUT_BYTES) -> IO[bytes]:
    """``path`` opened for reading in binary, if it is a regular file of at most ``limit`` bytes; otherwise an
    :class:`InputError` naming it.  A FIFO or a device is refused without blocking (the open is non-blocking,
    the type read from the open file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise InputError(f"{_shown(path)}: no such {what}") from None
    except PermissionError:
        raise InputError(f"{_shown(path)}: cannot be read (permission denied)") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{_shown(path)}: cannot be opened ({getattr(exc, 'strerror', None) or exc})") from None
    st = os.fstat(fd)
    kind = None if stat.S_ISREG(st.st_mode) else f"is {file_kind(st.st_mode)}"
    if kind is None and st.st_size > limit:
        kind = f"is {st.st_size} bytes, more than the {max(1, limit // 2**20)} MiB a {what} may have"
    if kind is not None:
        os.close(fd)
        raise InputError(f"{_shown(path)}: {kind}; expected a regular file" + (f" ({what})" if what != "file" else ""))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_input(path: str, what: str = "file", limit: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of the regular file ``path`` (:func:`open_input`'s checks; not UTF-8 is an InputError)."""
    with open_input(path, what, limit) as fh:
        raw = fh.read(limit + 1)
    if len(raw) > limit:
        raise InputError(f"{_shown(path)}: more than {max(1, limit // 2**20)} MiB; expected a {what}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{_shown(path)}: not UTF-8 text ({exc.reason} at byte {exc.start}); expected a "
                         f"{what}") from None


MAX_DEPTH = 64  # nesting of a JSON input (a record nests 5 deep)


def json_problem(exc: json.JSONDecodeError, line: bool = False) -> str:
    """What the JSON decoder found and where, in words: "Unterminated string starting at column 294" (its
    message ends in "at" for some errors: not "starting at at column")."""
    msg = exc.msg[:-3] if exc.msg.endswith(" at") else exc.msg
    return f"{msg} at " + (f"line {exc.lineno}, " if line else "") + f"column {exc.colno}"


def loads_bounded(text: str | bytes, where: str, what: str = "fleetbench record") -> Any:
    """``json.loads`` with its failures as :class:`InputError` naming ``where``: invalid JSON, nesting deeper than
    :data:`MAX_DEPTH`, an integer of more digits than Python converts (``what``: what the text was meant to be)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = " (truncated: the file ends mid-record)" if not str(text).endswith("\n") else ""
        raise InputError(f"{where}: not valid JSON{hint}: {json_problem(exc)}") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels; not a {what}") from None
    except ValueError as exc:  # an integer beyond sys.get_int_max_str_digits()
        raise InputError(f"{where}: not usable JSON ({exc})") from None
    todo = [(data, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels; not a {what}")
        if isinstance(value, dict):
            todo += [(v, depth + 1) for v in value.values()]
        elif isinstance(value, list):
            todo += [(v, depth + 1) for v in value if isinstance(v, (dict, list))]
    return data


@contextlib.contextmanager
def claimed_stdout() -> Iterator[IO[str]]:
    """Standard output kept for this command's result: the block gets a private, line-buffered copy of fd 1, and
    fd 1 (with ``sys.stdout``) points at stderr until it ends, so whatever else writes there (a rank started in the
    block, NCCL's ``NCCL version`` banner and ``NCCL_DEBUG`` lines, a library's print) goes to stderr and the
    result stays whole.  When ``sys.stdout`` is not fd 1 (a capture, an in-process redirect) nothing else can write
    into it, and it is the block's as it is."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None
    if fd != 1:
        yield sys.stdout
        return
    sys.stdout.flush()
    saved = os.dup(1)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    before, sys.stdout = sys.stdout, sys.stderr
    try:
        yield out
    finally:
        with contextlib.suppress(OSError):
            out.close()
        os.dup2(saved, 1)
        os.close(saved)
        sys.stdout = before
