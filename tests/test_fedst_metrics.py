"""FedST study metrics: MedPy values on hand-made masks and the documented empty-mask rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from medpy.metric import binary as mb

from fedmedbench.metrics.segmentation import SegmentationMeter, binary_scores, empty_penalty


def square(shape, y0, x0, size):
    m = np.zeros(shape, dtype=bool)
    m[y0:y0 + size, x0:x0 + size] = True
    return m


def test_scores_match_medpy_and_hand_computed_values():
    gt = square((20, 20), 2, 2, 6)      # 36 px
    pred = square((20, 20), 2, 5, 6)    # shifted 3 px right: overlap 6x3 = 18 px
    s = binary_scores(pred, gt)
    assert s["dice"] == pytest.approx(2 * 18 / 72)
    assert s["iou"] == pytest.approx(18 / 54)
    assert s["dice"] == pytest.approx(mb.dc(pred, gt))
    assert s["hd95"] == pytest.approx(mb.hd95(pred, gt))
    assert s["assd"] == pytest.approx(mb.assd(pred, gt))
    assert s["hd95"] == pytest.approx(3.0)  # a pure 3-pixel shift: every far-side border point is 3 px away


def test_hd95_and_assd_are_medpys_to_the_bit_from_one_pair_of_surface_distances(monkeypatch):
    """Random blobs of several shapes: HD95 and ASSD equal MedPy's hd95 and assd exactly, and each class
    pair costs 2 surface-distance passes (one each way), not the 4 that calling hd95 and assd makes."""
    from fedmedbench.metrics import segmentation as segmetrics

    rng = np.random.default_rng(3)
    compared = 0
    for shape in ((32, 48), (60, 40), (17, 23)):
        for _ in range(6):
            pred = ndimage_blobs(rng, shape)
            gt = ndimage_blobs(rng, shape)
            if not pred.any() or not gt.any():
                continue
            s = binary_scores(pred, gt)
            assert s["hd95"] == mb.hd95(pred, gt) and s["assd"] == mb.assd(pred, gt)
            compared += 1
    assert compared >= 12
    calls = []
    inner = segmetrics._SURFACE_DISTANCES
    monkeypatch.setattr(segmetrics, "_SURFACE_DISTANCES", lambda *a: calls.append(1) or inner(*a))
    binary_scores(square((20, 20), 2, 2, 6), square((20, 20), 2, 5, 6))
    assert len(calls) == 2
    monkeypatch.setattr(segmetrics, "_SURFACE_DISTANCES", None)  # a MedPy without the helper: its own functions
    assert binary_scores(square((20, 20), 2, 2, 6), square((20, 20), 2, 5, 6))["hd95"] == pytest.approx(3.0)


def test_surface_distances_on_the_box_around_both_masks_are_medpys_on_the_image_to_the_bit(monkeypatch):
    """HD95 and ASSD come from the smallest box both masks lie in: small parts in a large frame, parts touching each edge and corner, single pixels, parts far apart, and blobs; each equals MedPy's
    hd95 and assd on the whole image exactly, and the distance passes see the box, not the image."""
    from fedmedbench.metrics import segmentation as segmetrics
    from fedmedbench.metrics.segmentation import box_around

    shape = (48, 64)
    cases = [(square(shape, 10, 12, 5), square(shape, 12, 15, 6)),      # small, near each other
             (square(shape, 0, 0, 4), square(shape, 1, 2, 5)),          # the top-left corner
             (square(shape, 44, 60, 4), square(shape, 40, 58, 8)),      # the bottom-right corner, flush
             (square(shape, 0, 20, 3), square(shape, 45, 20, 3)),       # top edge against bottom edge
             (square(shape, 20, 30, 1), square(shape, 22, 33, 1)),      # single pixels
             (square(shape, 5, 5, 3), square(shape, 30, 50, 4) | square(shape, 2, 40, 2))]  # far apart, two objects
    rng = np.random.default_rng(11)
    cases += [(ndimage_blobs(rng, shape) & square(shape, 8, 10, 20), ndimage_blobs(rng, shape) & square(shape, 12, 14, 20))
              for _ in range(8)]
    seen = []
    inner = segmetrics._SURFACE_DISTANCES
    monkeypatch.setattr(segmetrics, "_SURFACE_DISTANCES", lambda a, b, *r: seen.append(a.shape) or inner(a, b, *r))
    compared = 0
    for pred, gt in cases:
        if not pred.any() or not gt.any():
            continue
        seen.clear()
        s = binary_scores(pred, gt)
        assert s["hd95"] == mb.hd95(pred, gt) and s["assd"] == mb.assd(pred, gt)
        box = box_around(pred | gt)
        assert seen == [pred[box].shape] * 2
        compared += 1
    assert compared >= 12
    assert box_around(square(shape, 10, 12, 5) | square(shape, 30, 40, 2)) == (slice(10, 32), slice(12, 42))


def ndimage_blobs(rng, shape):
    """A few smoothed random blobs (irregular borders, sometimes several objects)."""
    from scipy import ndimage

    return ndimage.gaussian_filter(rng.random(shape), 2.0) > 0.52


def test_identical_masks_are_perfect():
    m = square((16, 16), 3, 3, 5)
    assert binary_scores(m, m) == {"dice": 1.0, "iou": 1.0, "hd95": 0.0, "assd": 0.0}


def test_empty_mask_rule():
    shape = (30, 40)
    empty = np.zeros(shape, dtype=bool)
    some = square(shape, 5, 5, 4)
    assert binary_scores(empty, empty) == {"dice": 1.0, "iou": 1.0, "hd95": 0.0, "assd": 0.0}
    worst = empty_penalty(shape)
    assert worst == pytest.approx(50.0)  # the image diagonal
    for pred, gt in ((empty, some), (some, empty)):  # missed and hallucinated part
        assert binary_scores(pred, gt) == {"dice": 0.0, "iou": 0.0, "hd95": worst, "assd": worst}
    # a wrong but present prediction is always scored better than a missed part
    far = square(shape, 25, 35, 4)
    assert binary_scores(far, some)["hd95"] < worst


def test_meter_per_class_binary_collapse_and_frame_average():
    gt = np.zeros((2, 10, 10), dtype=np.int64)
    gt[0, 1:4, 1:4] = 1
    gt[0, 6:9, 6:9] = 2
    gt[1, 2:5, 2:5] = 3
    pred = gt.copy()
    pred[0, 6:9, 6:9] = 3  # wrist predicted as clasper in frame 0
    meter = SegmentationMeter({1: "shaft", 2: "wrist", 3: "clasper"})
    meter.add(pred, gt)
    r = meter.result()
    assert r["dice_shaft"] == 1.0                      # frame 0 exact, frame 1 both empty
    assert r["dice_wrist"] == pytest.approx(0.5)       # frame 0 missed (0), frame 1 both empty (1)
    assert r["dice_clasper"] == pytest.approx(0.5)     # frame 0 hallucinated (0), frame 1 exact (1)
    assert r["mean_dice"] == pytest.approx(2 / 3)
    assert r["hd95_wrist"] == pytest.approx(empty_penalty((10, 10)) / 2)
    binary = SegmentationMeter({1: "shaft"}, binary=True)
    binary.add(pred, gt)
    b = binary.result()
    assert b["dice_instrument"] == 1.0 and b["mean_hd95"] == 0.0  # every part is foreground
    assert math.isnan(SegmentationMeter({1: "x"}).result()["mean_dice"])


def test_shape_mismatch_is_named():
    with pytest.raises(ValueError, match="shape"):
        binary_scores(np.zeros((3, 3)), np.zeros((4, 4)))


PARTS = {1: "shaft", 2: "wrist", 3: "clasper"}


def parts_frame(shaft=True, wrist=True, clasper=None):
    """A 12x12 label map: shaft rows 0-3, wrist rows 4-7 (when asked), a 2x2 clasper at ``clasper``."""
    m = np.zeros((12, 12), dtype=np.uint8)
    if shaft:
        m[0:4, :] = 1
    if wrist:
        m[4:8, :] = 2
    if clasper is not None:
        y, x = clasper
        m[y:y + 2, x:x + 2] = 3
    return m


@pytest.mark.parametrize("rule,missed_wrist,false_clasper", [("all_classes", 2 / 3, 2 / 3), ("gt_classes", 0.5, 1.0)])
def test_class_rule_every_part_or_the_parts_in_the_ground_truth(rule, missed_wrist, false_clasper):
    """all_classes: every part in every frame (absent in both = 1, one side empty = 0);
    gt_classes (EndoVis 2017, ternaus evaluate.py:10-41): the parts in the ground truth only."""
    meter = SegmentationMeter(PARTS, class_rule=rule)
    meter.add(parts_frame(wrist=False), parts_frame())  # the prediction misses the wrist
    assert meter.result()["mean_dice"] == pytest.approx(missed_wrist)
    meter = SegmentationMeter(PARTS, class_rule=rule)
    meter.add(parts_frame(wrist=False, clasper=(9, 9)), parts_frame(wrist=False))  # a 2x2 false clasper
    out = meter.result()
    assert out["mean_dice"] == pytest.approx(false_clasper) and out["mean_iou"] == pytest.approx(false_clasper)
    if rule == "gt_classes":
        assert math.isnan(out["dice_clasper"]) and out["dice_shaft"] == 1.0 and out["mean_hd95"] == 0.0


def test_gt_classes_frame_without_parts_is_perfect_only_if_nothing_is_predicted():
    empty = np.zeros((12, 12), dtype=np.uint8)
    meter = SegmentationMeter(PARTS, class_rule="gt_classes")
    meter.add(empty, empty)
    meter.add(parts_frame(shaft=False, wrist=False, clasper=(0, 0)), empty)
    out = meter.result()
    assert out["mean_dice"] == pytest.approx(0.5) and out["mean_hd95"] == pytest.approx(empty_penalty((12, 12)) / 2)
    with pytest.raises(ValueError, match="class_rule"):
        SegmentationMeter(PARTS, class_rule="present")


@pytest.mark.parametrize("rule", ["all_classes", "gt_classes"])
def test_frames_scored_in_threads_give_the_same_result_taken_in_order_and_bounded(rule):
    """The evaluation's scores in 3 worker threads: the same rows in the same order, the same averages to
    the bit, and never more than max_pending frames waiting."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(0)
    preds, gts = rng.integers(0, 4, (10, 16, 16)), rng.integers(0, 4, (10, 16, 16))
    gts[3] = 0  # a frame without parts (gt_classes: perfect only if nothing is predicted)
    inline = SegmentationMeter(PARTS, class_rule=rule)
    waiting = []
    with ThreadPoolExecutor(3) as pool:
        def submit(fn, *args):
            waiting.append(len(threaded._pending))
            return pool.submit(fn, *args)

        threaded = SegmentationMeter(PARTS, class_rule=rule, submit=submit, max_pending=2)
        for start in range(0, 10, 4):
            inline.add(preds[start:start + 4], gts[start:start + 4])
            threaded.add(preds[start:start + 4], gts[start:start + 4])
        assert len(waiting) == 10 and max(waiting) <= 1  # a frame is submitted with at most one other waiting
        assert json.dumps(threaded.result()) == json.dumps(inline.result())
    assert threaded._rows == inline._rows and threaded._frames == inline._frames and len(threaded) == 10


def _centre_and_square() -> tuple[np.ndarray, np.ndarray]:
    """Prediction: one pixel; ground truth: the 3x3 square around it (8 border pixels, 4 at 1, 4 at sqrt 2)."""
    pred, gt = np.zeros((7, 7), bool), np.zeros((7, 7), bool)
    pred[3, 3] = True
    gt[2:5, 2:5] = True
    return pred, gt


def test_assd_medpy_0_5_pools_both_directions_medpy_0_4_averages_their_means():
    """pred -> gt: [1]; gt -> pred: [1, 1, 1, 1, r2, r2, r2, r2]. MedPy 0.5 (default): (5 + 4 r2) / 9;
    MedPy 0.4: (1 + (4 + 4 r2) / 8) / 2. HD95 (both pooled, 95th percentile) is r2 under either."""
    r2 = math.sqrt(2)
    pred, gt = _centre_and_square()
    new = binary_scores(pred, gt)
    old = binary_scores(pred, gt, assd="medpy_0_4")
    assert new["assd"] == pytest.approx((5 + 4 * r2) / 9, abs=1e-12) == float(mb.assd(pred, gt))
    assert old["assd"] == pytest.approx((1 + (4 + 4 * r2) / 8) / 2, abs=1e-12)
    assert new["hd95"] == old["hd95"] == pytest.approx(r2, abs=1e-12)
    meter = SegmentationMeter({1: "part"}, assd="medpy_0_4")
    meter.add(pred.astype(np.uint8), gt.astype(np.uint8))
    assert meter.result()["assd_part"] == pytest.approx(old["assd"], abs=1e-12)
    with pytest.raises(ValueError, match="assd must be one of"):
        SegmentationMeter({1: "part"}, assd="medpy_0_6")


def test_distances_in_native_pixels_scale_each_axis():
    """Spacing (2, 3) (a frame twice as tall, three times as wide natively): pred -> gt [2]; gt -> pred
    [2, 2, 3, 3, r13 x 4]; the empty-mask distance is the native diagonal sqrt(14^2 + 21^2)."""
    r13 = math.sqrt(13)
    pred, gt = _centre_and_square()
    s = binary_scores(pred, gt, spacing=(2.0, 3.0))
    assert s["assd"] == pytest.approx((2 + 2 + 2 + 3 + 3 + 4 * r13) / 9, abs=1e-12)
    assert s["dice"] == binary_scores(pred, gt)["dice"]  # overlaps do not change
    assert binary_scores(pred, np.zeros_like(gt), spacing=(2.0, 3.0))["hd95"] == pytest.approx(math.sqrt(14**2 + 21**2))
    meter = SegmentationMeter({1: "part"})
    meter.add(np.stack([pred, pred]).astype(np.uint8), np.stack([gt, gt]).astype(np.uint8), [(2.0, 3.0), None])
    assert meter.result()["assd_part"] == pytest.approx((s["assd"] + binary_scores(pred, gt)["assd"]) / 2, abs=1e-12)


def test_native_spacing_reads_each_mask_files_size(tmp_path):
    from PIL import Image

    from fedmedbench.metrics.segmentation import native_spacing

    Image.new("L", (1920, 1080)).save(tmp_path / "a.png")  # EndoVis2017 frames: 1920 wide, 1080 tall
    Image.new("L", (1280, 1024)).save(tmp_path / "b.png")  # EndoVis2018
    got = native_spacing([str(tmp_path / "a.png"), str(tmp_path / "b.png")], (480, 480))
    assert got == [(1080 / 480, 1920 / 480), (1024 / 480, 1280 / 480)]


def test_feddp_pixel_rule_scores_an_empty_prediction_from_one_pixel_at_the_origin():
    """``empty_rule: feddp_pixel`` (FedDP ``tester_utils.py:101-102``): an empty prediction of a part the ground
    truth holds gets pixel (0, 0) and MedPy scores the pair; an empty ground truth keeps the diagonal (FedDP has
    no rule for it); both empty stay perfect. The default is the diagonal."""
    shape = (20, 30)
    empty, gt = np.zeros(shape, dtype=bool), square(shape, 10, 12, 4)
    corner = empty.copy()
    corner[0, 0] = True
    got = binary_scores(empty, gt, empty_rule="feddp_pixel")
    assert got == {"dice": 0.0, "iou": 0.0, "hd95": pytest.approx(mb.hd95(corner, gt)), "assd": pytest.approx(mb.assd(corner, gt))}
    assert math.hypot(10, 12) <= got["hd95"] < empty_penalty(shape) == binary_scores(empty, gt)["hd95"]
    on_corner = square(shape, 0, 0, 3)  # the ground truth covers (0, 0): the pixel overlaps it
    assert binary_scores(empty, on_corner, empty_rule="feddp_pixel")["dice"] == pytest.approx(2 / 10)
    assert binary_scores(gt, empty, empty_rule="feddp_pixel")["hd95"] == empty_penalty(shape)  # hallucinated part
    assert binary_scores(empty, empty, empty_rule="feddp_pixel") == {"dice": 1.0, "iou": 1.0, "hd95": 0.0, "assd": 0.0}
    labels = np.zeros((1, *shape), dtype=np.int64)
    labels[0][gt] = 2
    feddp = SegmentationMeter({1: "shaft", 2: "wrist"}, empty_rule="feddp_pixel")
    feddp.add(np.zeros_like(labels), labels)
    assert feddp.result()["hd95_wrist"] == pytest.approx(got["hd95"]) and feddp.result()["hd95_shaft"] == 0.0
    with pytest.raises(ValueError, match="empty_rule"):
        SegmentationMeter({1: "x"}, empty_rule="pixel")
