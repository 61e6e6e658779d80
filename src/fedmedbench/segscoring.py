"""How a segmentation run's frames are scored where its config says nothing: one source for the evaluation
(:func:`fedmedbench.fl.tasks.segmentation.evaluation.scoring`, with torch) and for the FedST workflow while
it plans (:func:`fedmedbench.studies.fedst.runs.scoring_config`, without torch). The schema's defaults of
``fedst.eval`` mirror it (``tests/test_segmetrics_device.py``)."""

from __future__ import annotations

#: keyword of ``evaluate_clips`` -> its default: the class rule (``segmetrics.CLASS_RULES``), the ASSD
#: definition (``segmetrics.ASSD_RULES``), the resolution (``segmetrics.RESOLUTIONS``) and where frames are
#: scored (``evaluation.METRICS_DEVICES``)
SCORING_DEFAULTS: dict[str, str] = {"class_rule": "all_classes", "assd": "medpy_0_5", "resolution": "input",
                                    "metrics_device": "auto"}
