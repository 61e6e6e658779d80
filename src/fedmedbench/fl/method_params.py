"""Per-run method parameters: the study's, overridden by the setting's, with setting-dependent defaults.

Kept free of torch so the workflow can resolve parameters while it is being planned.
"""

from __future__ import annotations

from typing import Any

#: a value meaning "the setting's Dirichlet alpha" (GPAF's server samples labels from Dir(alpha) with
#: the alpha of the setting it runs in: the paper's Table 1 has one column per alpha)
PARTITION = "partition"


def resolve(method: str, study_params: dict[str, dict], setting: dict[str, Any]) -> dict[str, Any]:
    """``method_params[method]`` of the study, then of the setting; ``label_alpha: partition`` resolved.

    A setting without an alpha (e.g. the center split) gives 1.0, a flat Dirichlet.
    """
    params = {**study_params.get(method, {}), **(setting.get("method_params") or {}).get(method, {})}
    if method == "gpaf" and params.get("label_alpha", PARTITION) == PARTITION:
        params["label_alpha"] = float((setting.get("params") or {}).get("alpha", 1.0))
    return params
