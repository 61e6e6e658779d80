"""Deterministic synthetic surgical video for the demo and tests (NOT real data, never a paper result).

A "site" has its own tissue style (colour mean and spread, texture scale, vessels) and
surgery type. Each video pans a textured background slowly (camera motion) and moves
tools smoothly over it. A tool is a shaft entering from the image border, a wrist and a
tip; the tip depends on the tool class (two jaws for graspers/bipolars/clippers, an L for
the hook, thin blades for scissors, a wide nozzle for the irrigator, a bag for the
specimen bag), so the seven classes are learnable from appearance. Every frame comes
with its part mask (1 shaft, 2 wrist, 3 clasper/jaws) and its tool boxes (the box of the
tool tip: wrist + jaws, as the detection datasets annotate tool tips).

Everything is a function of (seed, dataset, video, frame): rerunning gives identical files.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import cv2
import numpy as np

from fedmedbench.data.surgical.schema import TOOL_CLASSES, Box

SHAFT, WRIST, CLASPER = 1, 2, 3


@dataclass(frozen=True)
class Style:
    """How a site looks: tissue colour (BGR mean and spread), texture, vessels; its surgery type."""

    surgery_type: str
    tissue_bgr: tuple[int, int, int]
    tissue_std: float
    texture_px: float
    vessels: int
    fat_bgr: tuple[int, int, int] | None = None
    flat: bool = False  # simulator: flat shading, no noise (an unpaired, clearly synthetic domain)


STYLES: dict[str, Style] = {
    "cholecystectomy_a": Style("cholecystectomy", (70, 80, 185), 28.0, 10.0, 3, fat_bgr=(90, 190, 215)),
    "cholecystectomy_b": Style("cholecystectomy", (55, 60, 150), 22.0, 14.0, 4, fat_bgr=(80, 170, 200)),
    "nephrectomy_a": Style("nephrectomy", (95, 120, 200), 25.0, 12.0, 2),
    "nephrectomy_b": Style("nephrectomy", (60, 85, 160), 30.0, 8.0, 3),
    "prostatectomy": Style("prostatectomy", (50, 50, 170), 26.0, 9.0, 5),
    "hysterectomy": Style("hysterectomy", (140, 140, 215), 20.0, 16.0, 2),
    "lobectomy": Style("lobectomy", (110, 105, 140), 24.0, 11.0, 6),
    "simulator": Style("synthetic (simulator)", (120, 150, 230), 0.0, 30.0, 0, flat=True),
}

#: per tool class: shaft colour (BGR), tip colour, tip kind
TOOL_LOOK = {
    "grasper": ((60, 60, 60), (200, 200, 200), "jaws"),
    "bipolar": ((150, 90, 40), (230, 200, 120), "jaws_narrow"),
    "hook": ((40, 40, 40), (240, 240, 240), "hook"),
    "scissors": ((30, 30, 30), (160, 220, 255), "blades"),
    "clipper": ((90, 90, 90), (60, 200, 255), "clip"),
    "irrigator": ((210, 210, 210), (255, 255, 255), "nozzle"),
    "specimen_bag": ((0, 0, 0), (235, 235, 200), "bag"),
}


def rng_for(seed: int, *keys) -> np.random.Generator:
    """An RNG that depends only on the seed and the (dataset, video, ...) keys."""
    words = [int(seed)] + [zlib.crc32(str(k).encode()) for k in keys]
    return np.random.default_rng(np.random.SeedSequence(words))


def tissue(rng: np.random.Generator, style: Style, width: int, height: int) -> np.ndarray:
    """A background canvas (float32 BGR, larger than the frame so the camera can pan)."""
    if style.flat:
        img = np.empty((height, width, 3), np.float32)
        img[:] = style.tissue_bgr
        for _ in range(3):  # a few flat-shaded organs
            c = (int(rng.uniform(0, width)), int(rng.uniform(0, height)))
            axes = (int(rng.uniform(0.15, 0.35) * width), int(rng.uniform(0.15, 0.35) * height))
            col = tuple(float(v) for v in np.clip(np.array(style.tissue_bgr) + rng.uniform(-60, 60, 3), 0, 255))
            cv2.ellipse(img, c, axes, float(rng.uniform(0, 180)), 0, 360, col, -1)
        return img
    gh, gw = max(2, int(height / style.texture_px)), max(2, int(width / style.texture_px))
    lum = rng.normal(0, 1, (gh, gw, 1)).astype(np.float32)  # mostly brightness texture, a little colour
    noise = 0.9 * lum * np.array([0.8, 0.9, 1.0], np.float32) + 0.3 * rng.normal(0, 1, (gh, gw, 3)).astype(np.float32)
    low = cv2.resize(noise, (width, height), interpolation=cv2.INTER_CUBIC)
    shade = cv2.resize(rng.normal(0, 1, (3, 3)).astype(np.float32), (width, height), interpolation=cv2.INTER_CUBIC)
    img = np.array(style.tissue_bgr, np.float32) + style.tissue_std * low + 0.6 * style.tissue_std * shade[..., None]
    if style.fat_bgr is not None:
        for _ in range(2):
            c = (int(rng.uniform(0, width)), int(rng.uniform(0, height)))
            axes = (int(rng.uniform(0.05, 0.15) * width), int(rng.uniform(0.05, 0.15) * height))
            cv2.ellipse(img, c, axes, float(rng.uniform(0, 180)), 0, 360, style.fat_bgr, -1)
    for _ in range(style.vessels):
        pts = np.cumsum(rng.normal(0, 0.08 * width, (6, 2)), axis=0) + rng.uniform(0, 1, 2) * (width, height)
        col = tuple(float(v) for v in np.array(style.tissue_bgr) * 0.55)
        cv2.polylines(img, [pts.astype(np.int32)], False, col, 1, cv2.LINE_AA)
    return cv2.GaussianBlur(img, (3, 3), 0)


@dataclass(frozen=True)
class Track:
    """One tool over a video: class, entry point on the border, smooth tip trajectory, visible frames."""

    cls: str
    entry: tuple[float, float]
    centre: tuple[float, float]
    amp: tuple[float, float]
    omega: tuple[float, float]
    phase: tuple[float, float]
    jaw_omega: float
    start: int
    end: int  # exclusive


def random_track(rng, cls, width, height, n_frames, dt, always=False) -> Track:
    side = rng.integers(4)
    u = rng.uniform(0.15, 0.85)
    entry = [(u * width, -2.0), (width + 2.0, u * height), (u * width, height + 2.0), (-2.0, u * height)][side]
    centre = (rng.uniform(0.3, 0.7) * width, rng.uniform(0.3, 0.7) * height)
    amp = (rng.uniform(0.05, 0.18) * width, rng.uniform(0.05, 0.18) * height)
    # slow, smooth motion: at most ~0.35 rad of phase per frame whatever the frame rate
    omega = tuple(min(rng.uniform(0.3, 1.2), 0.35 / max(dt, 1e-3)) for _ in range(2))
    phase = tuple(rng.uniform(0, 2 * np.pi, 2))
    if always or n_frames <= 2:
        start, end = 0, n_frames
    else:
        start = int(rng.integers(0, max(1, n_frames // 3)))
        end = int(rng.integers(start + max(1, n_frames // 2), n_frames + 1))
    return Track(cls, entry, centre, amp, omega, phase, float(rng.uniform(0.8, 2.5)), start, end)


def tip_pose(track: Track, t: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(tip position, unit direction from entry to tip, jaw half-opening in radians) at time t."""
    tip = np.array([track.centre[i] + track.amp[i] * np.sin(track.omega[i] * t + track.phase[i]) for i in range(2)])
    d = tip - np.array(track.entry)
    direction = d / (np.linalg.norm(d) + 1e-6)
    opening = 0.12 + 0.3 * (0.5 + 0.5 * np.sin(track.jaw_omega * t))
    return tip, direction, float(opening)


def _rot(v: np.ndarray, a: float) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    return np.array([c * v[0] - s * v[1], s * v[0] + c * v[1]])


def draw_tool(img: np.ndarray, parts: np.ndarray, track: Track, t: float, scale: float) -> None:
    """Draw one tool at time t into the image and its own part mask (1 shaft, 2 wrist, 3 tip)."""
    shaft_col, tip_col, kind = TOOL_LOOK[track.cls]
    tip, d, opening = tip_pose(track, t)
    w = max(2, int(round(3 * scale)))
    if kind == "bag":
        axes = (int(7 * scale), int(5 * scale))
        c = tuple(int(v) for v in tip)
        cv2.ellipse(img, c, axes, float(np.degrees(np.arctan2(d[1], d[0]))), 0, 360, tip_col, -1, cv2.LINE_AA)
        cv2.ellipse(parts, c, axes, float(np.degrees(np.arctan2(d[1], d[0]))), 0, 360, CLASPER, -1)
        return
    wrist_len, jaw_len = 5 * scale, 7 * scale
    wrist_start = tip - d * (wrist_len + jaw_len)
    wrist_end = tip - d * jaw_len
    wrist_col = tuple(0.6 * np.array(tip_col) + 0.4 * np.array(shaft_col))
    _segment(img, parts, track.entry, wrist_start, shaft_col, SHAFT, w + 1)
    _segment(img, parts, wrist_start, wrist_end, wrist_col, WRIST, w + 2)
    if kind == "nozzle":
        segs, jw = [(wrist_end, tip)], w + 3
    elif kind == "hook":
        bend = wrist_end + d * 0.7 * jaw_len
        segs, jw = [(wrist_end, bend), (bend, bend + _rot(d, np.pi / 2) * 0.45 * jaw_len)], max(1, w - 1)
    elif kind == "clip":
        n = _rot(d, np.pi / 2) * 1.6 * scale
        segs, jw = [(wrist_end + n, tip + n), (wrist_end - n, tip - n)], w
    else:
        spread = {"jaws": 1.0, "jaws_narrow": 0.45, "blades": 0.3}[kind] * opening
        segs = [(wrist_end, wrist_end + _rot(d, a) * jaw_len) for a in (spread, -spread)]
        jw = max(1, w - (1 if kind == "blades" else 0))
    for a, b in segs:
        _segment(img, parts, a, b, tip_col, CLASPER, jw)


def _segment(img, parts, a, b, colour, value: int, width: int) -> None:
    """A thick line into the image (anti-aliased) and into the part mask (hard labels)."""
    pa, pb = tuple(int(round(x)) for x in a), tuple(int(round(x)) for x in b)
    cv2.line(img, pa, pb, tuple(float(c) for c in colour), width, cv2.LINE_AA)
    cv2.line(parts, pa, pb, int(value), width)


def tip_box(parts: np.ndarray, cls: str) -> Box | None:
    """Box of a tool's tip (wrist + jaws) in its own part mask; None when the tip is out of view."""
    ys, xs = np.nonzero(parts >= WRIST)
    if xs.size == 0:
        return None
    return Box(cls, float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))


@dataclass
class Frame:
    image: np.ndarray  # uint8 BGR
    parts: np.ndarray  # uint8, 0..3
    tool_parts: list[np.ndarray]  # one part mask per visible tool (EndoVis2017 writes these)
    tool_names: list[str]
    boxes: list[Box]
    organ: np.ndarray  # bool, pixels of the organ (EndoVis2018 labels it as a scene class)


ORGAN_BGR = (60, 70, 120)


def render_video(rng: np.random.Generator, style: Style, n_frames: int, width: int, height: int, dt: float,
                 tracks: list[Track], t0: float = 0.0, organ: bool = False, tool_scale: float = 1.0) -> list[Frame]:
    """Render n_frames frames dt seconds apart (the camera pans slowly over the tissue).

    With ``organ`` an organ (a darker ellipse on the tissue) is drawn and its pixels returned.
    ``tool_scale`` enlarges the tools (and so their boxes) beyond the size that follows the frame.
    """
    margin = max(8, width // 6)
    canvas = tissue(rng, style, width + 2 * margin, height + 2 * margin)
    organ_mask = np.zeros(canvas.shape[:2], np.uint8)
    if organ:
        c = (int(rng.uniform(0.35, 0.65) * canvas.shape[1]), int(rng.uniform(0.35, 0.65) * canvas.shape[0]))
        axes = (int(0.22 * canvas.shape[1]), int(0.18 * canvas.shape[0]))
        angle = float(rng.uniform(0, 180))
        cv2.ellipse(canvas, c, axes, angle, 0, 360, ORGAN_BGR, -1, cv2.LINE_AA)
        cv2.ellipse(organ_mask, c, axes, angle, 0, 360, 1, -1)
    pan_phase = rng.uniform(0, 2 * np.pi, 2)
    scale = max(0.6, min(width, height) / 64.0) * float(tool_scale)
    frames = []
    for k in range(n_frames):
        t = t0 + k * dt
        ox = int(margin + 0.8 * margin * np.sin(0.05 * t + pan_phase[0]))
        oy = int(margin + 0.8 * margin * np.sin(0.04 * t + pan_phase[1]))
        img = canvas[oy:oy + height, ox:ox + width].copy()
        organ_px = organ_mask[oy:oy + height, ox:ox + width] > 0
        parts = np.zeros((height, width), np.uint8)
        tool_parts, names, boxes = [], [], []
        for tr in tracks:
            if not tr.start <= k < tr.end:
                continue
            own = np.zeros_like(parts)
            draw_tool(img, own, tr, t, scale)
            parts = np.where(own > 0, own, parts)
            box = tip_box(own, tr.cls)
            tool_parts.append(own)
            names.append(tr.cls)
            if box is not None:
                boxes.append(box)
        if not style.flat:
            img = img + rng.normal(0, 4.0, img.shape).astype(np.float32)
        frames.append(Frame(np.clip(img, 0, 255).astype(np.uint8), parts, tool_parts, names, boxes, organ_px))
    return frames


def class_mix(rng: np.random.Generator) -> np.ndarray:
    """A video's tool-class frequencies: graspers and hooks common, bags and irrigators rare (as in
    cholecystectomy), with per-video variation so client label distributions differ."""
    base = np.array([5.0, 2.0, 4.0, 1.5, 1.5, 1.0, 1.0])
    return rng.dirichlet(base)


def detection_tracks(rng, width, height, n_frames, dt) -> list[Track]:
    """Two to four different tools per video, each visible over part of it."""
    mix = class_mix(rng)
    n_tools = int(rng.integers(2, 5))
    classes = rng.choice(len(TOOL_CLASSES), size=n_tools, replace=False, p=mix)
    return [random_track(rng, TOOL_CLASSES[c], width, height, n_frames, dt) for c in classes]


def segmentation_tracks(rng, width, height, n_frames, dt) -> list[Track]:
    """Robotic instruments: one or two graspers/needle drivers visible the whole clip."""
    n_tools = int(rng.integers(1, 3))
    return [random_track(rng, str(rng.choice(["grasper", "bipolar", "scissors"])), width, height, n_frames, dt,
                         always=True) for _ in range(n_tools)]
