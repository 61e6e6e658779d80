"""Federated YOLO object detection (UltraFlwr study): Ultralytics trainer wrapper, model
component key maps for partial aggregation, client data staging and the ``detection`` task."""
