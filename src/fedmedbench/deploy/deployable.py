"""Why a run cannot be deployed across sites, read from its spec: asked while the workflow plans a
``deploy/...`` target (torch-free; rules/deploy.smk) and again by every site before it trains (``apps``).

Three kinds of run cannot: a centralized method (it pools every site's data in one place), FedST's
``site_finetune`` (each site fine-tunes on the server's synthetic clips, which no site folder holds) and
``client_augmentation`` (each training image is read before its domain shift, which no site folder holds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def why_not(spec: Mapping[str, Any], centralized: bool) -> str | None:
    """The reason the run of ``spec`` (a RunSpec as a dict) cannot be deployed; None when it can.
    ``centralized``: whether its method trains on pooled data (``Method.centralized``)."""
    if centralized:
        return f"method '{spec['method']}' pools all data in one place; it cannot be deployed across sites"
    if int((spec.get("method_params") or {}).get("site_finetune") or 0):
        return ("method_params.site_finetune fine-tunes every site on the server's synthetic clips, which no site "
                "folder holds; it is not deployable")
    if spec.get("client_augmentation"):
        return ("client_augmentation reads each training image before its domain shift, which no site folder holds "
                "(a site would train on its stored images); it is not deployable")
    return None
