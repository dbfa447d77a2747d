"""The one atomic writer: files are staged next to their destination and published together.

``Staging`` hands out a path in a hidden folder beside each destination
(``.<name>.<random>.tmp/<name>``, same filesystem, so a rename moves it); code
writes there as it would to the destination (a model's ``.data`` file next to
its ``.onnx``, relative locations and all), checks may run the staged files, and
``publish()`` renames them into place only at the end; files a destination's old
version used and its new one does not (``retire``) are removed once it is published. Anything not published
(an error, an interrupt, a failed check) is removed: a failed run leaves
nothing. Staged files are created like a plain ``open()`` would create them
(mode 0666 less the umask), whoever writes them. See docs/architecture.md,
"Input handling".
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Iterable

__all__ = ["Staging", "atomic_write"]


class Staging:
    """Destination files written to a hidden staging folder, moved into place by ``publish``.

    Use as a context manager: leaving the block removes whatever was not published.
    """

    def __init__(self) -> None:
        self._dirs: dict[Path, Path] = {}      # destination folder -> its staging folder
        self._files: dict[Path, Path] = {}     # destination -> staged path, in staging order
        self._retired: dict[Path, list[Path]] = {}  # destination -> files removed once it is published

    def path(self, dest: str | os.PathLike) -> Path:
        """Where to write ``dest`` until it is published (the same file name, in a staging folder)."""
        dest = _destination(dest)
        if dest in self._files:
            return self._files[dest]
        if dest.exists() and not dest.is_file() and not dest.is_dir():  # a folder fails at publish, named
            raise OSError(errno.EINVAL, "not a regular file (a device or a pipe), which publishing would replace",
                          str(dest))
        folder = self._dirs.get(dest.parent)
        if folder is None:
            folder = _make_dir(dest.parent, dest.name)
            self._dirs[dest.parent] = folder
        staged = folder / dest.name
        self._files[dest] = staged
        return staged

    def write_bytes(self, dest: str | os.PathLike, content: bytes) -> Path:
        """Stage ``content`` for ``dest``, flushed to disk; returns the staged path."""
        staged = self.path(dest)
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        return staged

    def retire(self, dest: str | os.PathLike, old: str | os.PathLike) -> None:
        """Remove ``old`` once ``dest`` is published: a file the destination's old version used and its
        new version does not (a model's former external data). Not removed if ``dest`` never is, nor
        if ``old`` is itself published by this staging."""
        self._retired.setdefault(_destination(dest), []).append(Path(os.path.abspath(old)))

    def publish(self, only: Iterable[str | os.PathLike] | None = None) -> list[Path]:
        """Rename the staged files (all, or the destinations in ``only``) into place, in staging order.

        A model's data file is staged before its ``.onnx`` file, so a reader never sees a
        new model over old data. Returns the published destinations.
        """
        wanted = None if only is None else {_destination(p) for p in only}
        done = []
        for dest, staged in list(self._files.items()):
            if wanted is not None and dest not in wanted:
                continue
            if staged.exists():
                try:
                    os.replace(staged, dest)
                except OSError as exc:  # name the destination, not the hidden staged file no user knows
                    raise OSError(exc.errno, exc.strerror or str(exc), str(dest)) from None
                done.append(dest)
                self._remove_retired(dest)
            del self._files[dest]
        return done

    def _remove_retired(self, dest: Path) -> None:
        """After ``dest`` is in place (its readers already read the new version): its retired files."""
        for old in self._retired.pop(dest, []):
            if old in self._files or _destination(old) in self._files:
                continue  # written anew by this staging
            try:
                os.unlink(old)
            except FileNotFoundError:
                pass
            except OSError as exc:  # the new file is in place: a leftover is worth a warning, not a failure
                import warnings

                warnings.warn(f"{old}: no longer used by {dest.name}, but could not be removed: "
                              f"{exc.strerror or exc}", stacklevel=2)

    def discard(self) -> None:
        """Remove every staging folder and what is still in it."""
        for folder in self._dirs.values():
            shutil.rmtree(folder, ignore_errors=True)
        self._dirs.clear()
        self._files.clear()
        self._retired.clear()

    def __enter__(self) -> "Staging":
        return self

    def __exit__(self, *exc) -> None:
        self.discard()


def _destination(path: str | os.PathLike) -> Path:
    """Where ``path`` is written: its absolute path, or its target where it is a symbolic link, as a
    plain ``open()`` writes (a rename over the link had replaced it: ``-o /dev/stdout`` as root
    replaced the system's link with the model)."""
    dest = Path(os.path.abspath(path))
    return dest.resolve() if dest.is_symlink() else dest


def atomic_write(path: str | os.PathLike, content: bytes) -> Path:
    """Write ``content`` to ``path`` atomically: readers see the old file or the whole new one."""
    with Staging() as staging:
        staging.write_bytes(path, content)
        staging.publish()
    return Path(path)


def _make_dir(parent: Path, name: str) -> Path:
    for _ in range(100):
        folder = parent / f".{name}.{os.urandom(6).hex()}.tmp"  # not secrets: its hashlib import costs 15 ms
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"could not create a staging folder next to {parent / name}")  # pragma: no cover
