"""Atomic file and directory replacement: the one place partition-fx writes results.

A reader (or a crash) sees the old file or the new one, never half of one. Every writer in the package
(checkpoints, resume state, run directories, ONNX files, JSON reports) goes through these helpers.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def replace_file(path: str | os.PathLike[str], write: Callable[[Path], object]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then ``os.replace`` it onto ``path`` (what ``write``
    returns, such as ``Path.write_text``'s count, is ignored).

    The file gets the mode of any file the user creates (0666 less the umask), although ``mkstemp`` made
    the temporary one private.

    Example::

        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
        >>> replace_file(target, lambda tmp: tmp.write_text("hello"))
        >>> target.read_text()
        'hello'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_json(path: str | os.PathLike[str], payload: Any) -> None:
    """``payload`` as indented JSON at ``path``, replaced atomically."""
    replace_file(path, lambda tmp: tmp.write_text(json.dumps(payload, indent=2) + "\n"))


def link_file(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Make ``path`` the same file as ``source`` (a hard link: no second copy on disk), replacing ``path``
    atomically; where the file system has no hard links, a copy. Replacing ``source`` later (through
    :func:`replace_file`) leaves ``path`` as it was.

    Example::

        >>> import tempfile, pathlib, os
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> (root / "last").write_text("v1"); link_file(root / "last", root / "best")
        2
        >>> os.path.samefile(root / "last", root / "best")
        True
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    os.unlink(tmp)
    try:
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def aside_path(directory: str | os.PathLike[str]) -> Path:
    """Where :func:`replace_directory` keeps the previous directory while it swaps the new one in."""
    directory = Path(directory)
    return directory.with_name(f".{directory.name}.old")


def existing_directory(directory: str | os.PathLike[str]) -> Path:
    """``directory``, or the previous version that :func:`replace_directory` set aside if a crash came
    between moving it aside and moving the new one in."""
    directory = Path(directory)
    aside = aside_path(directory)
    return aside if not directory.is_dir() and aside.is_dir() else directory


def remove_directory(directory: str | os.PathLike[str]) -> None:
    """Remove ``directory`` and any previous version :func:`replace_directory` set aside, if there are any.

    Example::

        >>> import tempfile, pathlib
        >>> state = pathlib.Path(tempfile.mkdtemp()) / "resume"
        >>> replace_directory(state, lambda tmp: (tmp / "state.json").write_text("{}"))
        2
        >>> remove_directory(state); state.exists(), aside_path(state).exists()
        (False, False)
    """
    for path in (Path(directory), aside_path(directory)):
        remove_path(path)


def staging_directory(directory: str | os.PathLike[str], *, suffix: str = "") -> Path:
    """A new empty directory beside ``directory`` to fill before :func:`swap_in`, with the mode of any
    directory the user creates (0777 less the umask; ``mkdtemp`` would make it private)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.{suffix}", dir=directory.parent))
    staging.chmod(0o777 & ~_umask())
    return staging


def swap_in(staging: Path, directory: str | os.PathLike[str], *, fsync: bool = False) -> None:
    """Replace ``directory`` (a directory, a file or nothing) by the filled ``staging`` directory.

    The previous directory is renamed aside first and removed last, so at every moment either it or the
    new one is complete (:func:`existing_directory` finds whichever is there). The staged files get the
    mode of any file the user creates (0666 less the umask); ``fsync`` flushes them to disk before the swap.
    """
    directory = Path(directory)
    umask = _umask()
    for path in staging.rglob("*"):
        if path.is_file():
            # writers such as safetensors create private (0600) files: give them the mode of any user file
            path.chmod(0o666 & ~umask)
            if fsync:
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
    aside = aside_path(directory)
    remove_path(aside)  # a previous swap's leftover
    if directory.exists():
        os.replace(directory, aside)
    os.replace(staging, directory)
    remove_path(aside, ignore_errors=True)  # the new directory is in place: a failed clean-up loses nothing


def replace_directory(
    directory: str | os.PathLike[str],
    fill: Callable[[Path], T],
    *,
    suffix: str = "",
    fsync: bool = False,
) -> T:
    """``fill(staging)`` in a directory beside ``directory`` that then replaces it (see :func:`swap_in`);
    returns what ``fill`` returned. Nothing is left behind if ``fill`` raises.

    Example::

        >>> import tempfile, pathlib
        >>> run = pathlib.Path(tempfile.mkdtemp()) / "run"
        >>> replace_directory(run, lambda tmp: (tmp / "report.json").write_text("{}"))
        2
        >>> sorted(p.name for p in run.iterdir())
        ['report.json']
    """
    staging = staging_directory(directory, suffix=suffix)
    try:
        result = fill(staging)
        swap_in(staging, directory, fsync=fsync)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result


def remove_path(path: Path, ignore_errors: bool = False) -> None:
    """Remove a file, a link or a directory tree, if there is one (a link to a directory: the link alone)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=ignore_errors)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _umask() -> int:
    """The process's umask (reading it means setting it: put it straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask
