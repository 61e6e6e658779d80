"""The GPAF authors' losses and label draws (study ``gpaf``'s defaults), as pure functions of their inputs.

Client (sanywright13/GPAFflower at c2505a7, baselines/fedprox/fedprox/models.py:578-803, ``train_one_epoch_gpaf``),
per batch, D_s a Sigmoid network (``BCELoss`` on probabilities, :586):

* D_s step: 0.5 * (BCE(D_s(z*), 1) + BCE(D_s(E(x)), 0)) on a first encoder pass, detached (:639-664);
* E_s + C_s step: BCE(D_s(E(x)), 1) on a second pass + CE(C_s(E(x)), y) on a third (:711-774), weights 1, 1.

Server (sanywright13/update-gpaf at 6aea7f8, fedprox/fedprox/server.py ``_train_generator``), per epoch, D_n ending
in a logit (``BCEWithLogitsLoss``):

* D_n step: 0.5 * (BCE(D_n(N(0, I) draw), 1) + BCE(D_n(z), 0));
* G_w step: CE(mean_k C_k(z), y) + 0.7 * KL(N(mu, sigma^2) || N(0, I)) summed over batch and dimensions
  (``kl_divergence``: ``torch.mean`` of a 0-d sum) + 0.4 * BCE(D_n(z), 1).

Labels for G_w (c2505a7 server.py:398-410 and models.py:215-224; the same at 6aea7f8): each client's label
proportions p_k (float32, over the labels it trained on) times its number of batches n_k, each product truncated
to an integer, summed over clients and normalised; labels drawn i.i.d. from that categorical.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from fedmedbench.models.vae import kl_to_standard_normal


def client_disc_loss(p_generated: torch.Tensor, p_local: torch.Tensor) -> torch.Tensor:
    """D_s's loss on its probabilities: generated z* are real (1), the encoder's z fake (0)."""
    return 0.5 * (F.binary_cross_entropy(p_generated, torch.ones_like(p_generated))
                  + F.binary_cross_entropy(p_local, torch.zeros_like(p_local)))


def client_encoder_loss(p_local: torch.Tensor, logits: torch.Tensor, y: torch.Tensor, lambda_cl: float = 1.0,
                        lambda_adv: float = 1.0) -> dict[str, torch.Tensor]:
    """E_s + C_s: lambda_cl * CE(logits, y) + lambda_adv * BCE(D_s(z), 1) (the authors' weights: 1 and 1)."""
    cls = F.cross_entropy(logits, y)
    adv = F.binary_cross_entropy(p_local, torch.ones_like(p_local))
    return {"loss_cl": cls, "loss_g": adv, "loss_total": lambda_cl * cls + lambda_adv * adv}


def dn_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    """D_n's loss: N(0, I) draws real (1), generated z fake (0), on logits."""
    return 0.5 * (F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
                  + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits)))


def generator_loss(ensemble_logits: torch.Tensor, y: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor,
                   dn_logits: torch.Tensor | None, lambda_kl: float, lambda_adv: float) -> dict[str, torch.Tensor]:
    """G_w's loss: CE(mean client logits, y) + lambda_kl * KL summed + lambda_adv * BCE(D_n(z), 1) (no D_n: 0)."""
    distill = F.cross_entropy(ensemble_logits, y)
    kl = kl_to_standard_normal(mu, logvar, "sum")
    adv = torch.zeros((), device=distill.device) if dn_logits is None else \
        F.binary_cross_entropy_with_logits(dn_logits, torch.ones_like(dn_logits))
    return {"kd": distill, "kl": kl, "diver": adv, "J": distill + lambda_kl * kl + lambda_adv * adv}


def pooled_label_probs(counts: list[np.ndarray], batches: list[int], truncate: bool = True) -> np.ndarray:
    """The categorical G_w's labels are drawn from: per client k, p_k = counts_k / sum (float32, as the clients'
    JSON label distributions) times its batches n_k, each product truncated (``truncate``) and summed over the
    clients, then normalised. ``truncate=False``: the clients' counts pooled as they are. Where truncation leaves
    nothing (every p_kc * n_k < 1) the pooled counts are used."""
    counts = [np.asarray(c, dtype=np.float64) for c in counts]
    pooled = np.sum(counts, axis=0)
    if truncate:
        cut = np.zeros_like(pooled)
        for c, n in zip(counts, batches, strict=True):
            p = (c / c.sum()).astype(np.float32) if c.sum() else np.zeros(len(c), dtype=np.float32)
            cut += [math.floor(float(pk) * int(n)) for pk in p]
        if cut.sum() > 0:
            pooled = cut
    return pooled / pooled.sum()


def draw_labels(n: int, probs: np.ndarray, generator: torch.Generator) -> torch.Tensor:
    """n labels i.i.d. from ``probs`` (with replacement), from a NumPy stream seeded by ``generator``."""
    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
    return torch.from_numpy(rng.choice(len(probs), size=n, p=probs)).long()
