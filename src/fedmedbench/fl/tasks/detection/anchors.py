"""The detection loss's anchor grid made once a training instead of every step.

The loss builds the grid from the feature maps' sizes and the strides at every step (``make_anchors``: about 20 ops,
and 3 host reads of the strides tensor, each a wait for the device on a GPU). The grid depends on nothing else, and
the loss only reads it: kept, a step computes the same, bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def anchors_kept() -> Iterator[None]:
    """Within the block, the losses' ``make_anchors`` returns the grid it made before for the same feature-map
    sizes, dtype, device, offset and strides tensor (unchanged since)."""
    from ultralytics.utils import loss

    make = loss.make_anchors
    kept: dict = {}

    def make_anchors(feats, strides, grid_cell_offset=0.5):
        version = getattr(strides, "_version", None)  # a tensor's count of in-place changes; a list has none
        if version is None or not isinstance(feats, list):
            return make(feats, strides, grid_cell_offset)
        key = (tuple(f.shape[2:] for f in feats), feats[0].dtype, feats[0].device, grid_cell_offset, id(strides))
        entry = kept.get(key)
        if entry is None or entry[0] is not strides or entry[1] != version:
            entry = kept[key] = (strides, version, make(feats, strides, grid_cell_offset))
        return entry[2]

    loss.make_anchors = make_anchors
    try:
        yield
    finally:
        loss.make_anchors = make
