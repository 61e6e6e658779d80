"""Surgical video data layer: release layouts -> one frame index -> video-level client settings -> exports.

The pieces, in pipeline order (each a Snakemake rule in ``rules/surgical.smk``):

* :mod:`.synthetic_layouts` (``synthesize_surgical``): deterministic synthetic videos written
  in the real release layouts, so the demo runs the same adapters as licensed data.
* :mod:`.index` (``index_surgical``): picks the adapter of a dataset's ``layout``
  (:mod:`.m2cai16`, :mod:`.cholectrack20`, :mod:`.yolo_folder`, :mod:`.coco_folder`,
  :mod:`.endovis2017`, :mod:`.endovis2018`, :mod:`.frames_masks`), applies the bad-file
  policy (:mod:`.badfiles`) and writes ``index.parquet`` (schema: :mod:`.schema`).
* :mod:`.recurate` + :mod:`.group_io` (``recurate_videos``): video-level splits
  (:mod:`.splits`), fixed per-client val/test, the UltraFlwr settings (iid, curation,
  length, lmo), stats and figures (:mod:`.stats`).
* :mod:`.export_yolo` (``export_yolo``): per-client Ultralytics datasets (symlinks), ID and
  CD test splits, pooled data.
* :mod:`.export_clips` (``export_clips``): FedST clips (current + previous frames) and
  site metadata with the surgery-type prompt.

What the studies read (stable interfaces):

* ``ultraflwr``: ``resources/surgical/<origin>/yolo/<group>/<setting>/manifest.json`` and the
  ``client_<k>/data.yaml`` / ``data_cd.yaml`` files it lists;
  ``.../groups/<group>/<setting>/frames.parquet`` via :func:`.group_io.read_setting`.
* ``fedst``: ``resources/surgical/<origin>/clips/<site>/clips.parquet`` and ``site.json``;
  frames/masks via :func:`.schema.read_index` on ``.../index/<dataset>``.
"""
