"""Bad-file policy: a broken file is either a clear error or a line in a report, never a silent drop.

Adapters call :meth:`BadFiles.add` for every problem they find (the file, the frame it
would have produced and why) and drop that frame. At the end :meth:`BadFiles.finish`
applies the policy:

* ``fail`` (default): raise :class:`BadFileError` listing the files and reasons;
  the index is not written.
* ``skip-and-report``: the frames are left out and every one is listed in
  ``bad_files.csv`` next to the index (columns ``path, video_id, frame, reason``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

POLICIES = ("fail", "skip-and-report")
REPORT_COLUMNS = ("path", "video_id", "frame", "reason")


class BadFileError(RuntimeError):
    """Files of a surgical dataset are unreadable or inconsistent (message lists them)."""


class DatasetNotFoundError(FileNotFoundError):
    """A licensed dataset folder is missing (message says which and where it was looked for)."""


@dataclass
class BadFiles:
    dataset: str
    policy: str = "fail"
    rows: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"bad_files policy must be one of {POLICIES}, got '{self.policy}'")

    def add(self, path, reason: str, video_id: str = "", frame: int | None = None) -> None:
        self.rows.append({"path": str(path), "video_id": str(video_id), "frame": -1 if frame is None else int(frame),
                          "reason": reason})

    def __len__(self) -> int:
        return len(self.rows)

    def report(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(REPORT_COLUMNS))

    def finish(self) -> pd.DataFrame:
        """Apply the policy: raise under ``fail``, else return the report table."""
        if self.rows and self.policy == "fail":
            shown = "\n".join(f"  {r['path']}: {r['reason']}" for r in self.rows[:20])
            more = f"\n  ... and {len(self.rows) - 20} more" if len(self.rows) > 20 else ""
            raise BadFileError(
                f"surgical dataset '{self.dataset}': {len(self.rows)} bad file(s)\n{shown}{more}\n"
                "Fix or remove them, or set surgical.bad_files: skip-and-report to leave those frames out "
                "(they are then listed in bad_files.csv next to the index)."
            )
        return self.report()
