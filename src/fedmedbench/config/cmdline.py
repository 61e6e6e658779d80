"""The config files of a ``snakemake`` command line, checked before Snakemake reads them.

Snakemake reads and merges every ``--configfile`` while it parses its command line, before the first
line of the workflow runs: a target written after ``--configfile`` (which takes every following word)
is opened as a config file and fails with Snakemake's traceback, and a file whose aliases nest
mappings ("billion laughs") is expanded by Snakemake's own config merge, which then runs for hours
with no message. Snakemake reads the workflow profile (``profiles/default/config.yaml``) before it
reads the config files; that profile calls :func:`check_command_line`, so both cases are one line
naming the file, for the files of ``--configfile`` and for those of a user profile's ``configfile``
(``--profile`` or ``$SNAKEMAKE_PROFILE``). The Snakefile checks its config files again.
``--workflow-profile none`` skips the profile and this check: Snakemake then merges the config files
before any file of this project is read (docs/reliability.md).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from fedmedbench.config.check import ConfigFileError, check_file

#: True while a check runs: reading a profile again (to learn its config files) must not start another
_running = False


def configfiles(argv: Sequence[str], profiles: Sequence[str] = ()) -> list[str]:
    """The config files ``argv`` gives Snakemake (with ``profiles``' settings as defaults, later ones overriding),
    read by Snakemake's own parser (abbreviations, ``--``)."""
    from snakemake.cli import get_argument_parser

    args, _ = get_argument_parser(profiles=list(profiles) or None).parse_known_args(list(argv))
    return [str(f) for f in args.configfile or []]


def user_profiles(argv: Sequence[str]) -> list[tuple[str, Path]]:
    """The user profiles of ``argv`` (each ``--profile`` in order, else ``$SNAKEMAKE_PROFILE``) with their config
    files. Snakemake >= 9.27 merges every ``--profile`` given (a list), older releases take the last (a string)."""
    from snakemake.cli import get_argument_parser, get_profile_dir

    args, _ = get_argument_parser().parse_known_args(list(argv))
    given = args.profile if isinstance(args.profile, list) else [args.profile] if args.profile else []
    if "none" in given:  # no profile, or a mix Snakemake refuses itself
        return []
    found = [(name, get_profile_dir(name)) for name in given]
    return [(name, entry[1]) for name, entry in found if entry]


def profile_target_hint(path: Path) -> str:
    """What a config file a profile names may be instead: a target, which belongs on the command line."""
    if path.suffix in (".yaml", ".yml"):
        return ""
    return f"; if '{path}' is a target, give it on the command line (snakemake {path} --profile ...), not in the profile"


def check_command_line(argv: Sequence[str] | None = None) -> None:
    """Exit with one line on stderr when a config file of the command line (``--configfile``, or a user profile's
    ``configfile``) would not load, or is an alias bomb.

    ``argv`` defaults to this process's arguments. A command line Snakemake's parser refuses is left
    to Snakemake, which reports it itself. ``FEDMEDBENCH_DEBUG=1`` changes nothing here: the traceback
    would be Snakemake's own reading of the file, and an alias bomb would still never finish.
    """
    global _running
    if _running:
        return
    argv = sys.argv[1:] if argv is None else argv
    _running = True
    try:
        try:
            files, origin = configfiles(argv), None
            if profiles := user_profiles(argv):
                with_profiles = configfiles(argv, [name for name, _ in profiles])
                if with_profiles != files:  # the command line names none: those of the last profile naming any
                    origin = next(path for name, path in reversed(profiles) if configfiles(argv, [name]) != files)
                    files = with_profiles
        except (Exception, SystemExit):
            return
        try:
            for f in files:
                if origin is None:
                    check_file(f)
                else:
                    check_file(f, hint=profile_target_hint)
        except ConfigFileError as exc:
            where = f" (configfile of profile {origin})" if origin is not None else ""
            print(f"config error: {exc}{where}", file=sys.stderr)
            raise SystemExit(1) from None
        except Exception:  # noqa: BLE001 - a fault of this check must not stop Snakemake reading its profile
            return
    finally:
        _running = False
