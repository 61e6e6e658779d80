"""FedST (Fang et al., "Spatio-temporal representation decoupling and enhancement for
federated instrument segmentation in surgical videos"), Algorithm 1.

Client (RSC, Sec. III-B): the site's model = broadcast shared parameters gamma + its own
personal parameters rho (the encoder's attention query embeddings, ``enc_q``, plus the
channel-selection network ``cs``, which the paper calls "a personalized lightweight
network"; the study's ``fedst.sent: table_ix`` keeps the decoder and head there too, Table IX);
E local steps of CE + lambda1 Dice (Eq. 9) on its clips; rho stays on the site (Eq. 5), gamma
is sent (Eq. 6). The temporal module and channel selection are parts of the network
(``task_params.model``: ``temporal``, ``selection``).

Server (Algorithm 1, lines 8-12): gamma_g = uniform mean of the sites' gamma (line 8,
``train.aggregation: uniform``); v_g = gamma_g with the server's rho_g^t (line 9: the initial
model's in round 1, afterwards what the server's own Eq. 12 step made of it, kept as server
state; no site sends its rho); then SERQ on the synthetic simulator clips (batches rotated and
scaled as the sites', Sec. IV-A):

* Eq. 10: F_hat_g <- (1 - mu) F_hat_g + mu F_g, with F_g the global model's deepest
  encoder feature map averaged over a fixed probe batch of synthetic frames (the paper
  does not say over which inputs the moving average runs; a fixed probe set makes it a
  moving average of one quantity);
* Eq. 11: the synthetic model v_pre and the learnable domain descriptor D_sy (one map
  (C, h, w), small random init, ``descriptor_init``) take ``steps`` Adam steps on
  L_seg + lambda2 * mean((F_sy - D_sy - F_hat_g)^2), the global model fixed;
* Eq. 12: v_pre and D_sy fixed, v_g takes ``steps`` Adam steps on
  L_seg + lambda3 * mean((F_g - (F_sy - D_sy))^2).

Synthetic data "lacks temporal information" (Sec. III-C): SERQ's L_seg bypasses the RSC
module (F* = F_ts), so the shared temporal module learns from the sites' videos only.
SERQ's state (v_pre, D_sy, F_hat_g) is server state (checkpointed). v_pre starts from the
synthetically pre-trained model that also initialises the sites (``fedst_pretrain``).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from fedmedbench.fl.api.arrays import load_arrays, model_arrays, weighted_average
from fedmedbench.fl.api.method import Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.methods._seg_shared import SegMethod, client_weights, tensors
from fedmedbench.fl.tasks.segmentation import (
    FrameCache,
    draw_rotate_scale,
    input_size,
    load_clipset,
    load_sites,
    rotate_scale,
    seg_loss,
    site_indicators,
)
from fedmedbench.fl.training import on_device
from fedmedbench.models.fedst import dropout_generator

SERQ_DEFAULTS: dict[str, Any] = {
    "enabled": True, "server": "serq", "steps": 100, "lr": 1e-4, "batch_size": 2, "lambda2": 0.3, "lambda3": 0.3, "mu": 0.5,
    "probe": 4, "descriptor_init": 0.01,
    # filled in by the rule from the fedst config (where the server's synthetic clips are)
    "clips_root": None, "site": "sim", "num_frames": 4, "indicator": {}, "loss": {}, "input_size": None, "cache_mb": 2048,
}


@register_method("fedst")
class FedST(SegMethod):
    params = (Param("personal", list, ["enc_q", "cs"], "parameter groups kept on the site"),
              Param("serq", dict, {}, "SERQ's settings over SERQ_DEFAULTS (clips_root and site set by the rules)"),
              Param("site_finetune", int, 0, "synthetic batches each site fine-tunes on after its round (Fig. 5)", low=0))

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        unknown = set(self.p["serq"]) - set(SERQ_DEFAULTS)
        if unknown:
            raise TypeError(f"method_params.fedst.serq has unknown key(s) {sorted(unknown)}; known: {sorted(SERQ_DEFAULTS)}")
        self.serq = {**SERQ_DEFAULTS, **self.p["serq"]}
        if self.serq["server"] not in ("serq", "finetune"):
            raise ValueError(f"method_params.fedst.serq.server = {self.serq['server']!r}: choose serq or finetune")
        if (self.serq["enabled"] or self.p["site_finetune"]) and not self.serq["clips_root"]:
            raise ValueError("method_params.fedst.serq.clips_root: SERQ needs the synthetic clips (set by the fedst rules)")

    def local_train(self, ctx, model):
        """RSC's E local iterations; Fig. 5's "synthetic data at the sites" then fine-tunes the
        site's model on ``site_finetune`` synthetic batches (temporal module bypassed)."""
        from fedmedbench.fl.tasks.segmentation import train_steps

        loss = super().local_train(ctx, model)
        if self.p["site_finetune"]:
            cache = ctx.data.train.cache  # the site's decode threads and disk store
            synthetic = _server_clips(self.serq, cache.workers, str(cache.store.folder) if cache.store else None)
            train_steps(model, synthetic, int(self.p["site_finetune"]), ctx.train, ctx.train.lr_at(ctx.rnd),
                        ctx.device, ctx.generator, self.loss_cfg(ctx), temporal=False)
        return loss

    def aggregate(self, ctx):
        gamma = weighted_average([r.arrays for r in ctx.results], client_weights(ctx))
        if not self.serq["enabled"]:
            return gamma
        t0 = time.perf_counter()
        out = (serq_round if self.serq["server"] == "serq" else finetune_round)(ctx, gamma, self.serq)
        # Table IX splits training time into local and server work
        ctx.state["server_time_s"] = float(ctx.state.get("server_time_s", 0.0)) + time.perf_counter() - t0
        return out


def freeze_bn_statistics(model: torch.nn.Module) -> None:
    """BatchNorm layers normalise with (and keep) the running statistics the sites built: the
    Eq. 12 step learns from synthetic frames but must not overwrite real-data statistics."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.eval()


def _deep(model, frames: torch.Tensor) -> torch.Tensor:
    return model.features(frames)[-1]


_SERVER_CLIPS: dict[tuple, object] = {}


def _server_clips(cfg: dict[str, Any], workers: int = 0, image_cache: str | None = None):
    """The simulator clips SERQ draws from, with one bounded cache kept across rounds (``workers`` threads decode
    each batch's clips in parallel; ``image_cache``: the decoded clips shared on disk)."""
    size = input_size(cfg.get("input_size"))
    key = (str(cfg["clips_root"]), cfg["site"], int(cfg["num_frames"]), size, int(workers), image_cache)
    if key not in _SERVER_CLIPS:
        _SERVER_CLIPS.clear()
        _SERVER_CLIPS[key] = load_clipset(cfg["clips_root"], cfg["site"], None, int(cfg["num_frames"]), size,
                                          FrameCache(int(cfg.get("cache_mb", 2048)) * 2**20, int(workers), image_cache))
    return _SERVER_CLIPS[key]


def _global_model(ctx, gamma: dict, cfg: dict[str, Any]):
    """Algorithm 1 line 9: v_g = gamma_g with the server's rho_g, on the device, with the
    simulator's indicator; also the synthetic clips and the round's generator."""
    g = torch.Generator().manual_seed(int(ctx.seed) * 100003 + int(ctx.rnd))
    sites = load_sites(cfg["clips_root"])["sites"]
    if cfg["site"] not in sites:
        raise KeyError(f"method_params.fedst.serq.site = {cfg['site']!r} is not among the exported sites {sorted(sites)}")
    data = _server_clips(cfg, ctx.loader_workers, ctx.image_cache)
    indicator = site_indicators(sites, cfg["indicator"])[cfg["site"]]
    glob = ctx.new_model()
    if "serq_rho" in ctx.state:  # rho_g^t: the server's own personal part, kept from its last update
        load_arrays(glob, ctx.state["serq_rho"], list(ctx.state["serq_rho"]))
    load_arrays(glob, gamma, list(gamma))
    glob.to(ctx.device).set_indicator(indicator)
    glob.set_generator(dropout_generator(g))
    return data, glob, indicator, g


def keep_server_rho(ctx, glob, gamma: dict) -> None:
    """Algorithm 1 lines 11-12: the server updates all of v_g but distributes only gamma_g; the
    rest (rho_g^{t+1}: encoder queries, selection network, ...) stays with the server for the
    next round's line 9 (the simulator's indicator is not a parameter and is not kept)."""
    keys = [k for k in glob.state_dict() if k not in gamma and k != "cs.indicator"]
    ctx.state["serq_rho"] = tensors(glob, keys)


def synthetic_batches(data, cfg: dict[str, Any], g: torch.Generator, dev: torch.device):
    """``steps`` random synthetic batches, rotated and scaled as the sites' (the paper: "in each
    site or server training, data augmentation (rotation and scale) is performed").

    Each step's clips and augmentation are drawn from ``g`` in the order a step at a time draws them (clips, angles,
    scales), all before the first batch: the clips of the next steps then decode in the cache's threads while the
    model trains on this one, as a site's steps do. ``g`` serves nothing else while the batches are taken."""
    loss = cfg["loss"]
    augmented = loss.get("augment", True)
    degrees, scale = float(loss.get("rotate_deg", 15)), float(loss.get("scale", 0.1))
    bs = min(int(cfg["batch_size"]), len(data))
    plan = []
    for _ in range(int(cfg["steps"])):
        idx = torch.randint(len(data), (bs,), generator=g).tolist()
        plan.append((idx, draw_rotate_scale(bs, g, degrees, scale) if augmented else None))
    ahead = max(bs, data.cache.workers)  # clips decoding ahead, of the steps still to come
    steps_ahead = (ahead + bs - 1) // bs  # the steps those clips belong to
    for step, (idx, affine) in enumerate(plan):
        later = [i for next_idx, _ in plan[step + 1:step + 1 + steps_ahead] for i in next_idx][:ahead]
        x, y = data.batch(idx, ahead=later)
        x, y = on_device(x, dev), on_device(y, dev)  # augmented where the model runs; copied without waiting
        if affine is not None:
            x, y = rotate_scale(x, y, *affine)
        yield x, y


def finetune_round(ctx, gamma: dict, cfg: dict[str, Any]) -> dict:
    """Fig. 5's "fine-tune the averaged global model on the server": ``steps`` Adam steps of
    L_seg on synthetic batches, no domain descriptor and no feature terms (otherwise as Eq. 12)."""
    data, glob, _, g = _global_model(ctx, gamma, cfg)
    glob.train()
    freeze_bn_statistics(glob)
    opt = torch.optim.Adam(glob.parameters(), lr=float(cfg["lr"]))
    dice_w = float(cfg["loss"].get("dice_weight", 0.3))
    for x, y in synthetic_batches(data, cfg, g, ctx.device):
        loss = seg_loss(glob(x, temporal=False), y, dice_w)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    keep_server_rho(ctx, glob, gamma)
    return model_arrays(glob, list(gamma))


def serq_round(ctx, gamma: dict, cfg: dict[str, Any]) -> dict:
    """SERQ for one round (Algorithm 1, lines 9-11); returns the new shared arrays."""
    data, glob, indicator, g = _global_model(ctx, gamma, cfg)
    dev = ctx.device
    pre = ctx.new_model()
    if "serq_pre" in ctx.state:
        load_arrays(pre, ctx.state["serq_pre"])
    pre.to(dev).set_indicator(indicator)
    pre.set_generator(dropout_generator(torch.Generator().manual_seed(g.initial_seed() + 1)))

    probe_x, _ = data.batch(list(range(min(len(data), int(cfg["probe"])))))
    with torch.no_grad():
        glob.eval()
        f_g = _deep(glob, probe_x[:, -1].to(dev)).mean(0)
    f_hat = f_g if "serq_Fg" not in ctx.state else (1 - cfg["mu"]) * ctx.state["serq_Fg"].to(dev) + cfg["mu"] * f_g
    if "serq_D" in ctx.state:
        d_sy = ctx.state["serq_D"].to(dev).clone().requires_grad_(True)
    else:
        d_sy = (float(cfg["descriptor_init"]) * torch.randn(f_g.shape, generator=g)).to(dev).requires_grad_(True)
    dice_w = float(cfg["loss"].get("dice_weight", 0.3))

    def batches():
        return synthetic_batches(data, cfg, g, dev)

    # Eq. 11: update v_pre and D_sy towards the global features' moving average
    pre.train()
    opt = torch.optim.Adam([*pre.parameters(), d_sy], lr=float(cfg["lr"]))
    for x, y in batches():
        f_sy = _deep(pre, x[:, -1])
        loss = seg_loss(pre(x, temporal=False), y, dice_w) + cfg["lambda2"] * (f_sy - d_sy - f_hat).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    # Eq. 12: v_pre and D_sy fixed; the global model learns the instrument part I_sy = F_sy - D_sy
    pre.eval()
    glob.train()
    freeze_bn_statistics(glob)
    opt = torch.optim.Adam(glob.parameters(), lr=float(cfg["lr"]))
    d_fixed = d_sy.detach()
    for x, y in batches():
        with torch.no_grad():
            target = _deep(pre, x[:, -1]) - d_fixed
        loss = seg_loss(glob(x, temporal=False), y, dice_w) + cfg["lambda3"] * (_deep(glob, x[:, -1]) - target).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    ctx.state["serq_pre"] = tensors(pre, list(pre.state_dict()))
    ctx.state["serq_D"] = d_fixed.cpu()
    ctx.state["serq_Fg"] = f_hat.detach().cpu()
    keep_server_rho(ctx, glob, gamma)
    return model_arrays(glob, list(gamma))
