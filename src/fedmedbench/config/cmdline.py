"""The ``--configfile`` files of a ``snakemake`` command line, checked before Snakemake reads them.

Snakemake reads and merges every ``--configfile`` while it parses its command line, before the first
line of the workflow runs: a target written after ``--configfile`` (which takes every following word)
is opened as a config file and fails with Snakemake's traceback, and a file whose aliases nest
mappings ("billion laughs") is expanded by Snakemake's own config merge, which then runs for hours
with no message. Snakemake reads the workflow profile (``profiles/default/config.yaml``) before it
reads the config files; that profile calls :func:`check_command_line`, so both cases are one line
naming the file. The Snakefile checks its config files again (``--workflow-profile none`` skips
the profile and this check).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from fedmedbench.config.check import ConfigFileError, check_files


def configfiles(argv: Sequence[str]) -> list[str]:
    """The config files ``argv`` gives Snakemake, read by Snakemake's own parser (abbreviations, ``--``)."""
    from snakemake.cli import get_argument_parser

    args, _ = get_argument_parser().parse_known_args(list(argv))
    return [str(f) for f in args.configfile or []]


def check_command_line(argv: Sequence[str] | None = None) -> None:
    """Exit with one line on stderr when a ``--configfile`` file would not load, or is an alias bomb.

    ``argv`` defaults to this process's arguments. A command line Snakemake's parser refuses is left
    to Snakemake, which reports it itself. ``FEDMEDBENCH_DEBUG=1`` changes nothing here: the traceback
    would be Snakemake's own reading of the file, and an alias bomb would still never finish.
    """
    argv = sys.argv[1:] if argv is None else argv
    try:
        files = configfiles(argv)
    except (Exception, SystemExit):
        return
    try:
        check_files(files)
    except ConfigFileError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except Exception:  # noqa: BLE001 - a fault of this check must not stop Snakemake reading its profile
        return
