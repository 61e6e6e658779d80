"""Pretrained weights as pipeline inputs.

``layout``: where a named weight set lives (imported by the Snakefile, no torch);
``fetch``: download or copy one set, verify it, write its manifest;
``safeload``: read weight files without running code and load them without gaps;
``models``: put a fetched set into a timm / Ultralytics / open_clip model.
"""
