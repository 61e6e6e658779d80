"""The torch scores (segmetrics_device) against MedPy's (segmetrics): Dice, IoU and HD95 to the bit, ASSD within
1e-12 relative (float64 on both sides; only torch's square roots and the summation order of its mean differ), on
hand-made masks and seeded random blobs; the meter and the fedst evaluation take them on request."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.ndimage import zoom

from fedmedbench.metrics import segmentation as S
from fedmedbench.metrics import segmentation_device as D

ASSD_RTOL = 1e-12
PARTS = {1: "shaft", 2: "wrist", 3: "clasper"}


def assert_same(got: dict[str, float], want: dict[str, float], where: str) -> None:
    for m in ("dice", "iou", "hd95"):
        assert got[m] == want[m], f"{where} {m}: {got[m]} != {want[m]}"
    assert got["assd"] == pytest.approx(want["assd"], rel=ASSD_RTOL, abs=0), f"{where} assd"


def compare(pred: np.ndarray, gt: np.ndarray, classes, spacing=None, chunk: int = D.CHUNK) -> list[D.FrameScores]:
    """Both paths on a batch (N, H, W), both ASSD rules; returns the torch scores (medpy_0_5)."""
    spacing = spacing or [None] * len(pred)
    out = None
    for assd in S.ASSD_RULES:
        got = D.batch_scores(torch.as_tensor(pred), torch.as_tensor(gt), classes, assd, spacing, chunk)
        for f, (p, g, sp) in enumerate(zip(pred, gt, spacing, strict=True)):
            want = S.frame_scores(p, g, classes, assd, sp)
            for c in classes:
                assert_same(got[f].scores[c], want[c], f"frame {f} class {c} {assd} spacing {sp}")
        out = out or got
    return out


def canvas(*shapes: tuple[int, ...]) -> np.ndarray:
    return np.zeros(shapes[0] if shapes else (12, 14), dtype=np.int64)


def test_single_pixels_give_their_euclidean_distance():
    """A pixel at (1, 1) against one at (4, 5): every surface distance is 5, so HD95 = ASSD = 5; at spacing
    (2, 0.5) the distance is sqrt(6^2 + 2^2)."""
    pred, gt = canvas(), canvas()
    pred[1, 1], gt[4, 5] = 1, 1
    got = compare(pred[None], gt[None], [1])[0].scores[1]
    assert got == {"dice": 0.0, "iou": 0.0, "hd95": 5.0, "assd": 5.0}
    spaced = compare(pred[None], gt[None], [1], [(2.0, 0.5)])[0].scores[1]
    assert spaced["hd95"] == math.sqrt(40.0)


def test_hd95_is_the_correctly_rounded_square_root_of_the_nearest_squared_distance():
    """HD95 of two single pixels 10 rows and 7 columns apart is NumPy's (correctly rounded) sqrt(149), and at
    spacing (2, 2) of pixels 13 rows and 1 column apart sqrt(680): square roots an approximate vectorised
    float64 ``sqrt`` rounds one bit below (torch on some CPUs)."""
    pred, gt = canvas(), canvas()
    pred[1, 1], gt[11, 8] = 1, 1
    assert compare(pred[None], gt[None], [1])[0].scores[1]["hd95"] == np.sqrt(np.float64(149))
    pred, gt = canvas((14, 14)), canvas((14, 14))
    pred[0, 2], gt[13, 3] = 1, 1
    assert compare(pred[None], gt[None], [1], [(2.0, 2.0)])[0].scores[1]["hd95"] == np.sqrt(np.float64(680))


def test_empty_masks_follow_the_empty_mask_rule():
    """Both empty: perfect; one empty: Dice = IoU = 0 and the image diagonal (in native units at a spacing)."""
    pred, gt = canvas(), canvas()
    gt[3:6, 3:6] = 2
    pred[0, 0] = 3
    frames = compare(np.stack([pred, canvas(), pred]), np.stack([gt, gt, canvas()]), [1, 2, 3],
                     [None, (2.0, 3.0), None])
    assert frames[0].scores[1] == {"dice": 1.0, "iou": 1.0, "hd95": 0.0, "assd": 0.0}
    diagonal = math.hypot(12, 14)
    assert frames[0].scores[2] == {"dice": 0.0, "iou": 0.0, "hd95": diagonal, "assd": diagonal}  # missed
    assert frames[0].scores[3]["hd95"] == diagonal  # hallucinated
    assert frames[1].scores[2]["hd95"] == math.hypot(24, 42)
    assert [f.pred_any for f in frames] == [True, False, True]
    assert [f.in_gt[2] for f in frames] == [True, True, False]


def test_feddp_pixel_rule_is_the_same_on_the_device():
    """``empty_rule: feddp_pixel``: a missed part scored from pixel (0, 0) with torch as with MedPy, per class and
    frame, at a spacing too; a hallucinated part keeps the diagonal; the meter's two paths agree."""
    pred, gt = canvas(), canvas()
    gt[3:6, 3:6] = 2
    gt[0:2, 0:2] = 1
    pred[8, 9] = 3
    pred_b, gt_b = np.stack([pred, pred, canvas()]), np.stack([gt, gt, canvas()])
    spacing = [None, (2.0, 3.0), None]
    got = D.batch_scores(torch.as_tensor(pred_b), torch.as_tensor(gt_b), [1, 2, 3], "medpy_0_5", spacing, empty_rule="feddp_pixel")
    for f in range(3):
        want = S.frame_scores(pred_b[f], gt_b[f], [1, 2, 3], "medpy_0_5", spacing[f], "feddp_pixel")
        for c in (1, 2, 3):
            assert_same(got[f].scores[c], want[c], f"frame {f} class {c}")
    assert got[0].scores[1]["dice"] == pytest.approx(2 / 5)  # the pixel lies in the shaft at (0, 0)
    assert got[0].scores[2]["hd95"] < math.hypot(12, 14) == got[0].scores[3]["hd95"]
    assert [f.pred_any for f in got] == [True, True, False]
    cpu, dev = S.SegmentationMeter(PARTS, empty_rule="feddp_pixel"), S.SegmentationMeter(PARTS, empty_rule="feddp_pixel")
    cpu.add(pred_b, gt_b, spacing)
    dev.add_on_device(torch.as_tensor(pred_b), torch.as_tensor(gt_b), spacing)
    assert dev.result() == pytest.approx(cpu.result(), rel=ASSD_RTOL)
    with pytest.raises(ValueError, match="empty_rule"):
        D.batch_scores(torch.as_tensor(pred_b), torch.as_tensor(gt_b), [1], empty_rule="corner")


def test_masks_touching_the_image_border_and_holes():
    """A mask along the image's edge (its edge pixels are border: the outside counts as empty) and a ring
    with a hole (the hole's rim is border too)."""
    pred, gt = canvas(), canvas()
    pred[:, :4] = 1  # the whole left edge
    gt[0:3, 0:14] = 1  # the whole top edge
    pred[5:11, 6:13] = 2
    pred[7:9, 8:11] = 0  # a hole
    gt[6:12, 5:12] = 2  # touches the bottom edge
    compare(pred[None], gt[None], [1, 2])


def test_overlapping_and_identical_masks():
    pred, gt = canvas(), canvas()
    pred[2:9, 2:9] = 1
    gt[2:9, 2:9] = 1
    pred[9:12, 0:3], gt[10:12, 1:5] = 2, 2
    got = compare(pred[None], gt[None], [1, 2])[0].scores
    assert got[1] == {"dice": 1.0, "iou": 1.0, "hd95": 0.0, "assd": 0.0}


@pytest.mark.parametrize("spacing", [None, (1.0, 1.0), (2.0, 0.5), (0.3, 1.7)])
def test_several_classes_at_anisotropic_spacing(spacing):
    rng = np.random.default_rng(1)
    pred = rng.integers(0, 4, (2, 16, 20))
    gt = rng.integers(0, 4, (2, 16, 20))
    compare(pred, gt, [1, 2, 3], [spacing, spacing])


def blobs(rng: np.random.Generator, n: int, shape: tuple[int, int]) -> np.ndarray:
    """Label maps of smooth random blobs (four labels)."""
    coarse = rng.random((n, shape[0] // 8, shape[1] // 8))
    return np.stack([np.digitize(zoom(c, 8, order=1), [0.45, 0.6, 0.75]) for c in coarse])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_seeded_random_blobs(seed):
    rng = np.random.default_rng(seed)
    pred, gt = blobs(rng, 3, (64, 80)), blobs(rng, 3, (64, 80))
    gt[0] = np.where(gt[0] == 3, 0, gt[0])  # a class only predicted
    compare(pred, gt, [1, 2, 3], [None, (1.5, 0.75), None])


def test_the_nearest_border_search_is_the_same_in_small_chunks():
    rng = np.random.default_rng(3)
    pred, gt = blobs(rng, 2, (48, 48)), blobs(rng, 2, (48, 48))
    whole = compare(pred, gt, [1, 2, 3])
    small = compare(pred, gt, [1, 2, 3], chunk=7)
    assert [f.scores for f in small] == [f.scores for f in whole]


def test_borders_are_medpys_four_neighbour_erosion():
    """An L-shaped mask at the image corner: every pixel but the fully surrounded ones (4-neighbours) is border."""
    from scipy.ndimage import binary_erosion, generate_binary_structure

    mask = np.zeros((7, 8), dtype=bool)
    mask[0:5, 0:6] = True
    mask[2:4, 3:8] = True
    want = mask ^ binary_erosion(mask, structure=generate_binary_structure(2, 1), iterations=1)
    assert np.array_equal(D.borders(torch.as_tensor(mask)).numpy(), want)
    assert D.borders(torch.as_tensor(mask))[1, 1].item() is False  # diagonal neighbours do not count


@pytest.mark.parametrize("n", [1, 2, 3, 19, 20, 21, 40, 101, 1000])
def test_percentile_is_numpys_linear_rule(n):
    values = np.sort(np.random.default_rng(n).random(n) * 50)
    lo, hi, gamma = D._percentile_picks(np.array([n]))
    assert D._lerp(values[lo], values[hi], gamma)[0] == np.percentile(values, 95)


def test_meter_on_device_gives_the_meters_scores():
    """:meth:`SegmentationMeter.add_on_device` against :meth:`add`, for both class rules and the binary set,
    on a batch with a frame without any part in its ground truth."""
    rng = np.random.default_rng(4)
    pred, gt = blobs(rng, 4, (32, 40)), blobs(rng, 4, (32, 40))
    gt[1] = 0
    pred[2] = 0
    spacing = [(2.0, 2.0), None, (0.5, 1.0), None]
    for kw in ({}, {"class_rule": "gt_classes"}, {"binary": True}, {"assd": "medpy_0_4"}):
        cpu, dev = S.SegmentationMeter(PARTS, **kw), S.SegmentationMeter(PARTS, **kw)
        cpu.add(pred, gt, spacing)
        dev.add_on_device(torch.as_tensor(pred), torch.as_tensor(gt), spacing)
        want, got = cpu.result(), dev.result()
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=ASSD_RTOL, nan_ok=True), (kw, k)
        assert len(dev) == 4


def test_bad_inputs_are_named():
    a = torch.zeros((1, 4, 4), dtype=torch.long)
    with pytest.raises(ValueError, match="must be the same"):
        D.batch_scores(a, torch.zeros((1, 4, 5), dtype=torch.long), [1])
    with pytest.raises(ValueError, match="assd"):
        D.batch_scores(a, a, [1], assd="medpy_0_3")
    with pytest.raises(ValueError, match="2 spacings for 1 frames"):
        D.batch_scores(a, a, [1], spacing=[None, None])


def test_where_frames_are_scored():
    from fedmedbench.fl.tasks.segmentation.evaluation import scores_on_device

    assert not scores_on_device("auto", torch.device("cpu"))
    assert scores_on_device("auto", torch.device("cuda"))
    assert not scores_on_device("cpu", torch.device("cuda"))
    assert scores_on_device("torch", torch.device("cpu"))
    with pytest.raises(ValueError, match="eval.metrics_device"):
        scores_on_device("gpu", torch.device("cpu"))


def test_the_schemas_metrics_devices_are_the_packages():
    from test_name_lists import SCHEMA, enums

    from fedmedbench.fl.tasks.segmentation.evaluation import METRICS_DEVICES

    found = [values for path, values in enums(SCHEMA) if path.endswith("/metrics_device")]
    assert found == [list(METRICS_DEVICES)]


def test_a_runs_scoring_defaults_are_evaluate_clips_and_its_values_pass_through():
    """One reading of a run's scoring keys for the simulation and the deployed site: unset keys take
    :func:`evaluate_clips`' defaults, set ones pass as they are."""
    import inspect

    from fedmedbench.fl.tasks.segmentation.evaluation import evaluate_clips, scoring

    defaults = {k: p.default for k, p in inspect.signature(evaluate_clips).parameters.items()}
    assert scoring({}) == {k: defaults[k] for k in scoring({})}
    tp = {"class_rule": "gt_classes", "assd": "medpy_0_4", "resolution": "native", "metrics_device": "torch",
          "empty_rule": "feddp_pixel", "lr": 1}
    assert scoring(tp) == {k: v for k, v in tp.items() if k != "lr"}


def test_the_planned_and_the_evaluated_scoring_defaults_are_one_source(monkeypatch):
    """The FedST workflow's run spec (planned without torch) and the evaluation read their unset scoring keys
    from one table, which the schema's ``fedst.eval`` defaults mirror: a default changed there changes both."""
    from test_name_lists import SCHEMA

    from fedmedbench.fl.tasks.segmentation.evaluation import scoring
    from fedmedbench.metrics.scoring import SCORING_DEFAULTS
    from fedmedbench.studies.fedst.runs import scoring_config

    def blocks(node):
        if isinstance(node, dict):
            if set(SCORING_DEFAULTS) <= set(node.get("properties", {})):
                yield node["properties"]
            for value in node.values():
                yield from blocks(value)

    (schema_eval,) = blocks(SCHEMA)
    assert {k: schema_eval[k]["default"] for k in SCORING_DEFAULTS} == SCORING_DEFAULTS
    assert scoring({}) == SCORING_DEFAULTS
    assert scoring_config({"eval": {}}) == {k: v for k, v in SCORING_DEFAULTS.items() if k != "metrics_device"}
    monkeypatch.setitem(SCORING_DEFAULTS, "assd", "medpy_0_4")
    monkeypatch.setitem(SCORING_DEFAULTS, "class_rule", "gt_classes")
    assert scoring({})["assd"] == scoring_config({"eval": {}})["assd"] == "medpy_0_4"
    assert scoring({})["class_rule"] == scoring_config({"eval": {}})["class_rule"] == "gt_classes"
    assert scoring_config({"eval": {"metrics_device": "torch"}})["metrics_device"] == "torch"  # off its default only


def test_scores_are_medpys_own_functions_on_seeded_masks_at_spacings():
    """Against MedPy 0.5.2's public dc, jc, hd95 and assd (asd both ways for medpy_0_4) directly, not through
    segmetrics: seeded speckle and blob masks of two classes, masks touching the image edge, pixel and
    anisotropic spacings. Dice, IoU, HD95 the same bits; ASSD within 1e-12 relative."""
    from medpy.metric import binary as mb
    from scipy.ndimage import binary_dilation

    rng = np.random.default_rng(11)
    checked = 0
    for trial in range(24):
        h, w = (int(v) for v in rng.integers(3, 30, size=2))
        sp = [None, (2.0, 0.5), (0.37, 1.9)][trial % 3]
        pred, gt = np.zeros((2, h, w), np.int64), np.zeros((2, h, w), np.int64)
        for arr in (pred, gt):
            for f in range(2):
                m = rng.random((h, w)) < rng.uniform(0.02, 0.3)
                m = binary_dilation(m) if trial % 2 else m
                arr[f][m] = rng.integers(1, 3, size=int(m.sum()))
        for assd in S.ASSD_RULES:
            got = D.batch_scores(torch.as_tensor(pred), torch.as_tensor(gt), [1, 2], assd, [sp, sp])
            for f in range(2):
                for c in (1, 2):
                    p, g = pred[f] == c, gt[f] == c
                    if not (p.any() and g.any()):
                        continue
                    s = got[f].scores[c]
                    want_assd = (mb.assd(p, g, sp) if assd == "medpy_0_5"
                                 else np.mean((mb.asd(p, g, sp), mb.asd(g, p, sp))))
                    assert (s["dice"], s["iou"], s["hd95"]) == (mb.dc(p, g), mb.jc(p, g), mb.hd95(p, g, sp)), (trial, f, c)
                    assert s["assd"] == pytest.approx(want_assd, rel=ASSD_RTOL, abs=0), (trial, f, c, assd)
                    checked += 1
    assert checked > 100
