"""A run's working files (``work/``) go once the run is complete: links as links (never their targets), a kill
half-way through leaves nothing a rerun could take for a staged view, and a failure to tidy up is reported."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fedmedbench.fl.state import scratch


def _run_with_work(tmp_path: Path) -> tuple[Path, Path]:
    """A finished run's folder with a stage of links to frames outside it, as the detection task leaves it."""
    frames = tmp_path / "export" / "images"
    frames.mkdir(parents=True)
    run = tmp_path / "run"
    images = run / "work" / "stage" / "client_0" / "train" / "images"
    images.mkdir(parents=True)
    for i in range(5):
        (frames / f"f{i}.png").write_bytes(b"x" * 5000)
        os.symlink(frames / f"f{i}.png", images / f"f{i}.png")
    os.symlink(frames, images.parent / "labels", target_is_directory=True)
    (images.parent / "labels.cache").write_bytes(b"c" * 3000)
    (run / "work" / "stage" / "STAGED.json").write_text("{}")
    (run / "work" / "client_0" / "r001" / "train").mkdir(parents=True)
    (run / "work" / "client_0" / "r001" / "train" / "results.csv").write_text("epoch\n1\n")
    for name in ("metrics.csv", "client_metrics.csv", "summary.json", "model.pt"):
        (run / name).write_text(name)
    return run, frames


def test_usage_counts_links_as_themselves_not_their_targets(tmp_path):
    run, frames = _run_with_work(tmp_path)
    size, entries = scratch.usage(run / "work")
    # folders: stage, client_0 (twice), train, images, r001, train; links: 5 frames + labels; files: 3
    assert entries == 7 + 6 + 3
    cache = run / "work" / "stage" / "client_0" / "train" / "labels.cache"
    assert size >= os.stat(cache).st_blocks * 512 > 0
    for frame in frames.iterdir():  # the frames grow: what the working folder takes does not
        frame.write_bytes(b"x" * 2**20)
    assert scratch.usage(run / "work") == (size, entries)
    cache.write_bytes(b"c" * 2**20)  # its own files count
    assert scratch.usage(run / "work")[0] >= size + 2**20 - 4096


def test_release_removes_the_working_folder_and_leaves_results_and_frames(tmp_path):
    run, frames = _run_with_work(tmp_path)
    expected = scratch.usage(run / "work")
    assert scratch.release(run) == (*expected, [])
    assert sorted(p.name for p in run.iterdir()) == ["client_metrics.csv", "metrics.csv", "model.pt", "summary.json"]
    assert sorted(p.name for p in frames.iterdir()) == [f"f{i}.png" for i in range(5)]
    assert all(p.stat().st_size == 5000 for p in frames.iterdir())
    assert scratch.release(run) == (0, 0, [])  # nothing left to remove


def test_keep_keeps_the_working_folder(tmp_path):
    run, _ = _run_with_work(tmp_path)
    assert scratch.release(run, keep=True) == (0, 0, [])
    assert (run / "work" / "stage" / "STAGED.json").is_file()


def test_a_kill_half_way_leaves_no_stage_behind_and_the_next_release_removes_the_rest(tmp_path, monkeypatch):
    run, _ = _run_with_work(tmp_path)

    def killed(path, *a, **k):
        raise KeyboardInterrupt  # the job is killed while the tree is removed

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        scratch.release(run)
    monkeypatch.undo()
    assert not (run / "work").exists()  # a rerun stages afresh: no marker of a half-removed stage
    assert [p.name for p in run.glob(".work.removing.*")]
    (run / "work" / "stage").mkdir(parents=True)  # the rerun's own working files
    assert scratch.release(run)[1] == 1
    assert sorted(p.name for p in run.iterdir()) == ["client_metrics.csv", "metrics.csv", "model.pt", "summary.json"]


def test_what_cannot_be_removed_is_reported_not_raised(tmp_path, monkeypatch):
    run, _ = _run_with_work(tmp_path)
    unlink = os.unlink

    def refuse(path, *a, **k):
        if str(path).endswith("labels.cache"):
            raise PermissionError(13, "Permission denied")
        return unlink(path, *a, **k)

    monkeypatch.setattr(os, "unlink", refuse)
    size, entries, failed = scratch.release(run)
    assert entries == 16 and len(failed) == 1 and "labels.cache" in failed[0] and "Permission denied" in failed[0]
    monkeypatch.undo()
    assert scratch.release(run) == (0, 0, [])  # the leftover goes with the next release
    assert not list(run.glob(".work.removing.*"))
