"""Where a method's own code raised: the method's name and its file:line, added to the exception as a note.

A job prints one line of its error on the console and keeps the traceback in its log. An error inside a
method (a user's file above all: at import, in ``client_fit``, in ``aggregate``) must name the method and
the line that raised, or the user opens the log to learn which of their files failed. The line is the
deepest traceback frame in a file of the method's classes (its own file, then what it inherits from);
the note travels with the exception (``BaseException.add_note``, types unchanged) and the job's console
line (``workflow/diagnostics.py``) and a client's error reply (``fl/engine/flower.py``) print it.
Stdlib only.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path

#: every note of this module starts so (one note per exception, however often it passes a method's step)
PREFIX = "in method "


def last_line(exc: BaseException) -> str:
    """The traceback's last line as Python prints it, notes left out (``NameError: name 'x' is not defined``;
    of a message of several lines, the first)."""
    te = traceback.TracebackException.from_exception(exc, limit=0)
    te.__notes__ = None
    text = "".join(te.format_exception_only()).strip()
    if isinstance(exc, SyntaxError):  # Python shows the line and a caret before the message
        return text.splitlines()[-1]
    return text.splitlines()[0] if text else type(exc).__name__


def shown(path: str | os.PathLike) -> str:
    """A path relative to the working directory when inside it (as the user named the file)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def class_files(cls: type) -> list[str]:
    """The source files of ``cls`` and of its bases, the class's own first."""
    files: list[str] = []
    for c in cls.__mro__:
        f = getattr(sys.modules.get(c.__module__), "__file__", None)
        if f and f not in files:
            files.append(f)
    return files


def raised_at(exc: BaseException, files: Iterable[str | os.PathLike]) -> str | None:
    """``file:line (function)`` of the deepest traceback frame in one of ``files``; None when none is there."""
    wanted = {os.path.realpath(f) for f in files}
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.realpath(frame.filename) in wanted:
            found = frame
    return None if found is None else f"{shown(found.filename)}:{found.lineno} ({found.name})"


def notes(exc: BaseException) -> list[str]:
    """The notes of this module on ``exc``."""
    return [n for n in getattr(exc, "__notes__", ()) if isinstance(n, str) and n.startswith(PREFIX)]


def add_note(exc: BaseException, method: str, files: Iterable[str | os.PathLike], step: str) -> None:
    """Note on ``exc`` which method raised, at which line of its files, in which ``step`` (once per exception)."""
    if notes(exc):
        return
    at = raised_at(exc, files)
    exc.add_note(f"{PREFIX}'{method}'{f' at {at}' if at else ''}, {step}")


def note_method(exc: BaseException, method: object, step: str) -> None:
    """:func:`add_note` for a method object (its registered name, the files of its class and bases)."""
    add_note(exc, getattr(method, "name", type(method).__name__), class_files(type(method)), step)
