"""Surgical part segmentation (FedST study): a site's clips (``clips.py``), the per-site indicators of
the channel selection (``indicators.py``), the local training loop every method of the study uses
(``training.py``), the metrics of a model on clips (``evaluation.py``) and the ``segmentation`` task
(``task.py``, registered when the task is first looked up: importing this package loads no task).

The names other modules use are re-exported here; a test or bench that replaces one while a run
works replaces it in the module that calls it (``training.on_device``, ``training.seg_loss``).
"""

from fedmedbench.fl.tasks.segmentation.clips import (
    ClipSet,
    FrameCache,
    SiteData,
    input_size,
    load_clipset,
    load_sites,
    resize_clip,
)
from fedmedbench.fl.tasks.segmentation.evaluation import evaluate_clips, metric_names, scoring
from fedmedbench.fl.tasks.segmentation.indicators import INDICATORS, site_indicators
from fedmedbench.fl.tasks.segmentation.training import (
    augment,
    dice_loss,
    draw_rotate_scale,
    make_optimizer,
    rotate_scale,
    seg_loss,
    train_steps,
)

__all__ = ["INDICATORS", "ClipSet", "FrameCache", "SiteData", "augment", "dice_loss", "draw_rotate_scale", "evaluate_clips",
           "input_size", "load_clipset", "load_sites", "make_optimizer", "metric_names", "resize_clip", "rotate_scale",
           "scoring", "seg_loss", "site_indicators", "train_steps"]
