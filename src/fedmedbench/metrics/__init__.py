"""Metrics: classification scores of many evaluated sets in one pass (``classification``) and the surgical
segmentation scores (``segmentation``: Dice, IoU, HD95, ASSD as MedPy 0.5.2 computes them; ``segmentation_device``:
the same scores of a batch with torch on the model's device; ``scoring``: the torch-free scoring defaults the
workflow reads while it plans)."""
