"""Per-site indicators of the FedST channel selection: frozen CLIP text embeddings of each
site's prompt (from a local weights file), or the paper's one-hot / Gaussian / random alternatives
(Table VII).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

INDICATORS = ("clip", "onehot", "gaussian", "random")




def site_indicators(sites: dict[str, dict], cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """One fixed indicator vector per site (all sites of sites.json, in their order)."""
    kind, dim = cfg.get("kind", "onehot"), int(cfg.get("dim", 512))
    names = list(sites)
    if kind not in INDICATORS:
        raise ValueError(f"fedst indicator.kind = {kind!r}: choose one of {list(INDICATORS)}")
    if kind == "clip":
        return _clip_indicators(sites, cfg, dim)
    if dim < len(names):
        raise ValueError(f"fedst indicator.dim = {dim} is smaller than the number of sites ({len(names)})")
    out = {}
    for i, name in enumerate(names):
        g = torch.Generator().manual_seed(1000 + i)
        onehot = F.one_hot(torch.tensor(i), dim).float()
        if kind == "onehot":
            out[name] = onehot
        elif kind == "gaussian":  # Table VII: exp(-(x - mu)^2 / (2 sigma^2)) over dimensions x, mu = the site's id
            x = torch.arange(dim, dtype=torch.float32)
            sigma = float(cfg.get("sigma", 0.1))
            out[name] = torch.exp(-((x - i) ** 2) / (2 * sigma**2))
        else:  # random: no relation to the site identity
            out[name] = torch.randn(dim, generator=g)
    return out


def _clip_indicators(sites: dict[str, dict], cfg: dict[str, Any], dim: int) -> dict[str, torch.Tensor]:
    """Frozen CLIP text embeddings of each site's prompt (L2-normalised), from a local file."""
    weights = cfg.get("clip_weights")
    if not weights:
        raise ValueError("fedst indicator.kind = clip needs indicator.clip_weights: an open_clip weight set "
                         "(docs/weights.md; e.g. clip_vit_b32_laion2b); or choose onehot, gaussian or random (Table VII)")
    path = Path(weights)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: CLIP weights file not found (fedst indicator.clip_weights)")
    import open_clip

    from fedmedbench.weights.models import load_open_clip, read_open_clip

    state = read_open_clip(path)  # weights_only / safetensors: refused before any model is built
    model = open_clip.create_model(cfg.get("clip_model", "ViT-B-32"), pretrained=None)
    load_open_clip(model, path, state)  # every tensor must fit
    model.eval()
    tokenizer = open_clip.get_tokenizer(cfg.get("clip_model", "ViT-B-32"))
    names = list(sites)
    with torch.no_grad():
        emb = F.normalize(model.encode_text(tokenizer([sites[n]["prompt"] for n in names])).float(), dim=-1)
    if emb.shape[1] != dim:
        raise ValueError(f"fedst indicator.dim = {dim} but the CLIP text embedding has {emb.shape[1]} dimensions")
    return {n: emb[i].clone() for i, n in enumerate(names)}
