"""GPAF: Generated Preserved Adversarial Federated learning (Lakrouni, Bah, Sebgui, 2025; Algorithm 1).

Two client designs, picked by the network (the study's ``method_model.gpaf.name``):

``gpaf_resnet18``, the authors' client (sanywright13/GPAFflower at c2505a7; study ``gpaf``'s default).
Client k in round t builds a new D_s (client.py:397, inside ``client_fn``) and for every mini-batch (x, y):

1. z* = G_w(noise, y) for the batch's own labels (G_w frozen, 64-d noise).
2. D_s (Sigmoid output) descends 0.5 * (BCE(D_s(z*), 1) + BCE(D_s(z1), 0)), z1 ~ q(z|x) (a first encoder pass).
3. E_s, C_s descend lambda_cl * CE(C_s(z3), y) + lambda_adv * BCE(D_s(z2), 1) (weights 1, 1), z2 and z3 two
   more encoder passes (models.py:578-803); no decoder, no reconstruction, no KL.

``gpaf_cnn``, the paper's VAE client (Eq. 9-15; study ``gpaf_pathmnist``):

1. z ~ q(z|x) from the encoder E_s (reparameterised), x_hat = U_s(z), logits = C_s(z);
   z* ~ G_w(z|y) from the server's generator for the batch's own labels (G_w frozen).
2. E_s, U_s, C_s descend  L_total = lambda_vae * L_v + L_cl + lambda_adv * L_g        (Eq. 14, 15)
      L_v  = ||x - x_hat||^2 + kl_weight * KL(q(z|x) || N(0, I))                    (Eq. 9)
      L_cl = cross-entropy(C_s(z), y)                                                (Eq. 10)
      L_g  = E[log D_s(z*)] + E[log(1 - D_s(z))]: E_s minimises it                   (Eq. 13)
3. D_s ascends L_g (at the same point: simultaneous gradient descent-ascent).
   U_s and D_s stay in the client state.

Either way only theta_E and theta_C are sent (Eq. 8), with the client's label counts under the pooled label draws.

Server in round t (Alg. 1, lines 1-14):

1. theta_E, theta_C = FedAvg of the clients' encoders and classifiers (Eq. 8); the global
   classifier F is initialised with the averaged theta_C.
2. ``server_epochs`` epochs of ``server_steps_per_epoch`` (1) steps on batches of
   ``server_batch_size`` ("client": the study's train.batch_size) generated samples, Adam lr 1e-3 for G_w and
   for D_n created anew each round (FedGen's 5 steps per epoch with moments kept across rounds is
   ``server_steps_per_epoch: 5, server_optimizer: persist``); labels y as ``label_sampling`` says.
   ``server_objective: authors`` (update-gpaf at 6aea7f8, default; 40 epochs): D_n step on
   0.5 * (BCE(D_n(N(0, I)), 1) + BCE(D_n(z), 0)), then G_w step (same noise and labels, a new eps) on
      CE(mean_k C_k(z), y) + generator_kl (0.7) * KL summed + lambda_diver (0.4) * BCE(D_n(z), 1).
   ``server_objective: paper`` (Eq. 7; 15 epochs): D_n step on L_diver (Eq. 6); generator step on
      J = lambda_1 * L_s + lambda_2 * L_diver + lambda_kl * KL(G_w(z|y) || N(0, I))   (Eq. 7)
      L_s  = lambda * L_KD + (1 - lambda) * L_GM                                    (Eq. 5)
      L_KD = CE(softmax(mean_k C_k(z)), y)        (ensemble of client classifiers, Eq. 3)
      L_GM = CE(softmax(mean_k C_k(z)), softmax(F(z)))                              (Eq. 4)
3. The new E, C and the trained G_w are the next global arrays (G_w is never averaged).

G_w: ``generator_arch: authors`` (6aea7f8 ``GlobalGenerator``: noise and label branches, a last Linear after the
sample; 64-d noise) or ``paper`` (the label vector, plus ``noise_dim`` noise, through one MLP to mu, logvar).
Labels: ``label_sampling: pooled`` (the authors': the clients' pooled label proportions, with their truncation),
``pooled_exact``, ``dirichlet`` (the paper's text: p ~ Dir(label_alpha), y ~ Cat(p)), ``dirichlet_soft``, ``uniform``.

Readings of what the paper leaves open (``method_params.gpaf``; docs/gpaf.md gives the reasons):
``gm_form`` (Eq. 4 literal or CE(F(z), y)), ``diversity_prior`` (D_n against N(0, I) or none), ``gan_loss``
(non-saturating or minimax, paper design), ``conditional_disc``, ``classify_on``, ``vae_reduction``,
``aggregation`` (FedAvg weights or Eq. 8's 1/K).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedmedbench.fl.api.arrays import load_arrays, model_tensors, weighted_average
from fedmedbench.fl.api.method import Arrays, ClientContext, ClientResult, Method, Param, ServerContext
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.augment import batch_images
from fedmedbench.fl.determinism import seeded_generator
from fedmedbench.fl.methods import _gpaf_authors as authors
from fedmedbench.fl.methods._shared import seeded, tensors_of
from fedmedbench.fl.training import (
    StepLosses,
    batch_indices,
    index_device,
    make_optimizer,
    to_device,
)
from fedmedbench.models.gpaf_authors import (
    RESNET_WIDTHS,
    NoiseLabelGenerator,
    ResNetEncoder,
    ResNetEncoderClassifier,
    SigmoidDiscriminator,
)
from fedmedbench.models.vae import (
    ConditionalGenerator,
    ConvDecoder,
    EncoderClassifier,
    GPAFNet,
    LatentDiscriminator,
    kl_to_standard_normal,
    randn,
    reparameterize,
)

SHARED_PREFIXES = ("encoder.", "classifier.")
GENERATOR_PREFIX = "generator."
#: GPAF's client networks by ``model.name``: the authors' client (GPAFflower c2505a7; ``_tiny``: narrow, for
#: demos) and the paper's VAE
CLIENT_MODELS = (*RESNET_WIDTHS, "gpaf_cnn")
#: label draws from the clients' pooled label counts (they send them in the ``labels`` record)
POOLED = ("pooled", "pooled_exact")


def adversarial_value(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    """E[log D(real)] + E[log(1 - D(fake))] (Eq. 6 and 13), D = sigmoid(logits)."""
    return -(F.binary_cross_entropy_with_logits(real_logits, torch.ones_like(real_logits))
             + F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits)))


def generator_side_loss(fake_logits: torch.Tensor, kind: str) -> torch.Tensor:
    """What the encoder (or G_w) minimises against a discriminator's logits on its samples."""
    if kind == "nonsaturating":  # -E[log D(fake)]
        return F.binary_cross_entropy_with_logits(fake_logits, torch.ones_like(fake_logits))
    return -F.binary_cross_entropy_with_logits(fake_logits, torch.zeros_like(fake_logits))  # E[log(1 - D(fake))]


def vae_loss(x_hat: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor, kl_weight: float,
             reduction: str) -> torch.Tensor:
    """L_v (Eq. 9): ||x - x_hat||^2 + kl_weight * KL(q(z|x) || N(0, I)).

    ``mean``: both terms averaged over pixels / latent dimensions (and the batch), so L_v is of the
    order of the cross-entropy; ``sum``: summed over pixels / latent dimensions and averaged over
    the batch, the usual VAE code's scaling (hundreds of times larger at 28 x 28).
    """
    kl = kl_to_standard_normal(mu, logvar)
    if reduction == "mean":
        return F.mse_loss(x_hat, x) + kl_weight * kl
    n = x.shape[0]
    return F.mse_loss(x_hat, x, reduction="sum") / n + kl_weight * kl * mu[0].numel()


#: the third key of the server's generator (apart from every client id)
SERVER_STREAM = 0x6A7AF


def server_generator(seed: int, rnd: int) -> torch.Generator:
    """The server's draws of round ``rnd`` (generator training): (run seed, round) fix them, as on resume."""
    return seeded_generator(seed, rnd, SERVER_STREAM)


def optimizer_state_cpu(opt: torch.optim.Optimizer) -> dict:
    """An optimizer's state dict with its tensors on the CPU (what the server state may hold). Adam's
    per-parameter state holds tensors only (its step count too)."""
    sd = opt.state_dict()
    return {"state": {k: {n: v.detach().cpu().clone() for n, v in st.items()} for k, st in sd["state"].items()},
            "param_groups": [dict(g) for g in sd["param_groups"]]}


def load_prefixed(module: nn.Module, arrays: Arrays, prefix: str) -> None:
    """Load the entries under ``prefix`` (tensors on any device) into ``module``."""
    module.load_state_dict({k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})


def read_once(steps: list[dict[str, torch.Tensor]]) -> list[dict[str, float]]:
    """Per-step loss tensors (0-d, same keys every step) as floats, read from the device in one transfer."""
    if not steps:
        return []
    keys = list(steps[0])
    values = torch.stack([torch.stack([s[k].detach().float() for k in keys]) for s in steps]).double().cpu().tolist()
    return [dict(zip(keys, row, strict=True)) for row in values]


@register_method("gpaf")
class GPAF(Method):
    #: batches are indexed wherever the client's data is (the engine may keep it on the device)
    device_data = True
    #: the client's training label counts, for the pooled label draws
    extra_records = ("labels",)
    params = (
        # networks
        Param("latent_dim", int, 64, "d, the latent size of E and G_w", low=1),
        Param("classifier_hidden", int, 128, "hidden units of C", low=1),
        Param("generator_hidden", int, 256, "hidden units of G_w", low=1),
        Param("generator_arch", str, "authors", "G_w: noise and label branches (update-gpaf 6aea7f8) or the paper's MLP",
              choices=("authors", "paper")),
        Param("noise_dim", int, 64, "Gaussian noise inputs of G_w (0 = none, paper generator only)", low=0),
        # client (Eq. 9-15); encoder/classifier/decoder use the study's train.optimizer and train.lr
        Param("lambda_vae", float, 1.0, "weight of L_v (Eq. 9)", low=0),
        Param("lambda_adv", float, 1.0, "weight of the client's adversarial alignment (authors 1; paper 0.3)", low=0),
        Param("lambda_cl", float, 1.0, "weight of the classification loss", low=0),
        Param("kl_weight", float, 1.0, "KL weight inside L_v", low=0),
        Param("disc_lr", float, 2e-4, "Adam lr of D_s", low=0, low_open=True),
        Param("disc_beta1", float, 0.5, "Adam beta1 of D_s", low=0, high=1, high_open=True),
        Param("gan_loss", str, "nonsaturating", "encoder/G_w side of the GAN losses", choices=("nonsaturating", "minimax")),
        Param("conditional_disc", bool, False, "D_s(z, y) instead of D_s(z)"),
        Param("classify_on", str, "sample", "C_s trained on the sampled z or on mu", choices=("sample", "mean")),
        Param("adv_start_round", int, 1, "first round of the adversarial term", low=1),
        # server (Eq. 3-8)
        Param("server_objective", str, "authors", "G_w's loss: CE + KL sum + BCE (update-gpaf 6aea7f8) or Eq. 7",
              choices=("authors", "paper")),
        Param("server_epochs", int, 40, "generator epochs per round (authors 40; paper 15)", low=0),
        Param("server_steps_per_epoch", int, 1, "generated batches per server epoch", low=1),
        Param("server_batch_size", int, "client", "generated samples per server batch; client = the study's train.batch_size",
              low=1, also=("client",)),
        Param("server_optimizer", str, "fresh", "G_w's optimizer kept across rounds or fresh", choices=("persist", "fresh")),
        Param("generator_lr", float, 1e-3, "Adam lr of G_w", low=0, low_open=True),
        Param("generator_lr_decay", float, 1.0, "per-round factor on generator_lr", low=0, low_open=True),
        Param("dn_lr", float, 1e-3, "Adam lr of D_n", low=0, low_open=True),
        Param("kd_balance", float, 0.5, "lambda in L_s = lambda L_KD + (1 - lambda) L_GM (Eq. 5)", low=0, high=1),
        Param("lambda_s", float, 1.0, "weight of L_s in J (Eq. 7)", low=0),
        Param("lambda_diver", float, 0.4, "weight of G_w's adversarial term (authors 0.4; paper 0.3)", low=0),
        Param("generator_kl", float, 0.7, "weight of the KL term on G_w's Gaussian (authors 0.7; paper 0.4)", low=0),
        Param("gm_form", str, "literal", "L_GM as Eq. 4 prints it or CE(F(z), y)", choices=("literal", "global_ce")),
        Param("diversity_prior", str, "gaussian", "D_n's prior samples, or none (no L_diver)", choices=("gaussian", "none")),
        Param("label_sampling", str, "pooled", "how the server draws labels",
              choices=("pooled", "pooled_exact", "dirichlet", "dirichlet_soft", "uniform")),
        Param("label_alpha", float, 1.0, "Dirichlet alpha of the server's labels; partition = the setting's alpha",
              low=0, low_open=True, also=("partition",)),
        Param("aggregation", str, "weighted", "FedAvg weights or Eq. 8's 1/K", choices=("weighted", "uniform")),
        Param("vae_reduction", str, "mean", "L_v averaged or summed over pixels", choices=("mean", "sum")),
    )

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        if self.p["label_alpha"] == "partition":
            raise ValueError("method_params.gpaf.label_alpha: 'partition' is resolved to the setting's Dirichlet alpha "
                             "by the workflow; a run needs a number > 0")

    # --- model -------------------------------------------------------------------
    def build_model(self, spec) -> GPAFNet:
        """E_s + C_s of the client design ``spec.model`` names, with G_w of ``generator_arch``."""
        p, c = self.p, spec.num_classes
        if spec.model in RESNET_WIDTHS:
            base: EncoderClassifier = ResNetEncoderClassifier(spec.in_channels, c, p["latent_dim"], RESNET_WIDTHS[spec.model])
        elif spec.model == "gpaf_cnn":
            base = EncoderClassifier(spec.in_channels, c, spec.image_size, p["latent_dim"], p["classifier_hidden"])
        else:
            raise ValueError(f"method 'gpaf' trains one of its client networks {list(CLIENT_MODELS)}; set the study's "
                             f"method_model.gpaf.name (got '{spec.model}')")
        if p["generator_arch"] == "authors":
            generator: nn.Module = NoiseLabelGenerator(c, p["latent_dim"], p["generator_hidden"], p["noise_dim"])
        else:
            generator = ConditionalGenerator(c, p["latent_dim"], p["generator_hidden"], p["noise_dim"])
        return GPAFNet(base.encoder, base.classifier, generator)

    @staticmethod
    def authors_client(model: GPAFNet) -> bool:
        """Whether ``model`` is the authors' client (ResNet encoder, no decoder) or the paper's VAE."""
        return isinstance(model.encoder, ResNetEncoder)

    @staticmethod
    def client_keys(model: nn.Module) -> list[str]:
        """theta_E and theta_C: the only arrays a client sends (Eq. 8)."""
        return [k for k in model.state_dict() if k.startswith(SHARED_PREFIXES)]

    def reply_keys(self, model: nn.Module, rnd: int, train) -> dict[str, list[str] | None]:
        return {"arrays": self.client_keys(model), "labels": None}

    # --- client side -------------------------------------------------------------
    def local_parts(self, ctx: ClientContext, model: GPAFNet) -> tuple[ConvDecoder, LatentDiscriminator]:
        """U_s and D_s: from the client state, or freshly initialised (seeded) in the client's first round."""
        c, size = ctx.data.train_x.shape[1], ctx.data.train_x.shape[-1]
        ncls = model.generator.num_classes if self.p["conditional_disc"] else 0
        decoder = seeded(lambda: ConvDecoder(c, size, self.p["latent_dim"]), ctx.generator)
        disc = seeded(lambda: LatentDiscriminator(self.p["latent_dim"], num_classes=ncls), ctx.generator)
        if "decoder" in ctx.state:
            decoder.load_state_dict(ctx.state["decoder"])
            disc.load_state_dict(ctx.state["disc"])
        return decoder.to(ctx.device), disc.to(ctx.device)

    def disc_optimizer(self, disc: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.Adam(disc.parameters(), lr=self.p["disc_lr"], betas=(self.p["disc_beta1"], 0.999))

    def model_step(self, model: GPAFNet, decoder: ConvDecoder, disc: LatentDiscriminator, opt: torch.optim.Optimizer,
                   x: torch.Tensor, y: torch.Tensor, y_vec: torch.Tensor, z_star: torch.Tensor | None,
                   generator: torch.Generator, grad_clip: float | None = None) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """One descent step of E_s, U_s, C_s on L_total (Eq. 14); returns the losses (detached 0-d tensors, not
        read here: the client reads them once after its last step) and the detached z."""
        p = self.p
        mu, logvar = model.encoder(x)
        z = reparameterize(mu, logvar, generator)
        loss_v = vae_loss(decoder(z), x, mu, logvar, p["kl_weight"], p["vae_reduction"])
        loss_cl = F.cross_entropy(model.classifier(z if p["classify_on"] == "sample" else mu), y)
        total = p["lambda_vae"] * loss_v + p["lambda_cl"] * loss_cl
        loss_g = torch.zeros((), device=x.device)
        if z_star is not None:
            loss_g = generator_side_loss(disc(z, y_vec), p["gan_loss"])
            total = total + p["lambda_adv"] * loss_g
        opt.zero_grad(set_to_none=True)
        total.backward()
        if grad_clip:
            nn.utils.clip_grad_norm_([q for g in opt.param_groups for q in g["params"]], grad_clip)
        opt.step()
        return {"loss_total": total.detach(), "loss_v": loss_v.detach(), "loss_cl": loss_cl.detach(),
                "loss_g": loss_g.detach()}, z.detach()

    def disc_step(self, disc: LatentDiscriminator, opt: torch.optim.Optimizer, z_star: torch.Tensor, z: torch.Tensor,
                  y_vec: torch.Tensor) -> torch.Tensor:
        """One ascent step of D_s on L_g (Eq. 13, max over D_s); returns L_g before the step (a detached 0-d tensor)."""
        value = adversarial_value(disc(z_star, y_vec), disc(z.detach(), y_vec))
        opt.zero_grad(set_to_none=True)
        (-value).backward()
        opt.step()
        return value.detach()

    def authors_step(self, model: GPAFNet, disc: SigmoidDiscriminator, opt: torch.optim.Optimizer,
                     opt_d: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, z_star: torch.Tensor | None,
                     generator: torch.Generator, grad_clip: float | None = None) -> dict[str, torch.Tensor]:
        """One batch of the authors' client: a D_s step on a first encoder pass, then one E_s + C_s step with the
        adversarial term on a second pass and the classifier on a third (c2505a7 models.py:639-774); each pass
        samples z (new eps) and moves the BatchNorm statistics, as theirs. Losses as detached 0-d tensors."""
        rec: dict[str, torch.Tensor] = {}
        p_local = None
        if z_star is not None:
            with torch.no_grad():
                z1 = reparameterize(*model.encoder(x), generator)
            d_loss = authors.client_disc_loss(disc(z_star), disc(z1))
            opt_d.zero_grad(set_to_none=True)
            d_loss.backward()
            opt_d.step()
            rec["loss_d"] = d_loss.detach()
            p_local = disc(reparameterize(*model.encoder(x), generator))
        logits = model.classifier(reparameterize(*model.encoder(x), generator))
        if p_local is None:
            cls = F.cross_entropy(logits, y)
            losses = {"loss_cl": cls, "loss_g": torch.zeros((), device=x.device), "loss_total": self.p["lambda_cl"] * cls}
        else:
            losses = authors.client_encoder_loss(p_local, logits, y, self.p["lambda_cl"], self.p["lambda_adv"])
        opt.zero_grad(set_to_none=True)
        losses["loss_total"].backward()
        if grad_clip:
            nn.utils.clip_grad_norm_([q for g in opt.param_groups for q in g["params"]], grad_clip)
        opt.step()
        return {**{k: v.detach() for k, v in losses.items()}, **rec}

    def label_record(self, ctx: ClientContext, num_classes: int) -> dict[str, Arrays]:
        """The client's training label counts (the ``labels`` record) when the server draws pooled labels."""
        if self.p["label_sampling"] not in POOLED:
            return {}
        counts = torch.bincount(ctx.data.train_y.reshape(-1).long().cpu(), minlength=num_classes)
        return {"labels": {"counts": counts}}

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        model: GPAFNet = to_device(ctx.model, ctx.device).train()
        generator_net = model.generator.eval().requires_grad_(False)
        if self.authors_client(model):  # a new D_s every round, as the authors' client_fn builds it (client.py:397)
            disc = seeded(lambda: SigmoidDiscriminator(self.p["latent_dim"]), ctx.generator).to(ctx.device).train()
            opt = make_optimizer(nn.ModuleList([model.encoder, model.classifier]), ctx.train, ctx.rnd)
            opt_d = self.disc_optimizer(disc)
            return self.fit_steps(ctx, model, generator_net, lambda x, y, y_vec, z_star: self.authors_step(
                model, disc, opt, opt_d, x, y, z_star, ctx.generator, ctx.train.grad_clip))
        decoder, disc = self.local_parts(ctx, model)
        decoder.train()
        disc.train()
        opt = make_optimizer(nn.ModuleList([model.encoder, model.classifier, decoder]), ctx.train, ctx.rnd)
        opt_d = self.disc_optimizer(disc)

        def step(x, y, y_vec, z_star):
            losses, z = self.model_step(model, decoder, disc, opt, x, y, y_vec, z_star, ctx.generator, ctx.train.grad_clip)
            if z_star is not None:
                losses["loss_d"] = self.disc_step(disc, opt_d, z_star, z, y_vec)
            return losses

        result = self.fit_steps(ctx, model, generator_net, step)
        ctx.state["decoder"] = tensors_of(decoder)
        ctx.state["disc"] = tensors_of(disc)
        return result

    def fit_steps(self, ctx: ClientContext, model: GPAFNet, generator_net: nn.Module, step) -> ClientResult:
        """The client's ``ctx.steps`` mini-batches, each given to ``step(x, y, y_vec, z_star)`` (z* None before
        ``adv_start_round``), which returns its losses (``loss_total`` and its terms, detached 0-d tensors)."""
        adversarial = ctx.rnd >= self.p["adv_start_round"]
        ncls = generator_net.num_classes
        total = StepLosses(ctx.steps_per_epoch())  # L_total, read once after the last step: no host sync per step
        parts: list[dict[str, torch.Tensor]] = []  # its terms (and D_s's loss), read once too
        for idx in batch_indices(ctx.data.num_train, ctx.train.batch_size, ctx.steps, ctx.generator,
                                 index_device(ctx.data.train_x, ctx.data.train_y)):
            x, y = batch_images(ctx.data, idx, ctx.device, ctx.generator), ctx.data.train_y[idx].to(ctx.device, non_blocking=True)
            y_vec = F.one_hot(y, ncls).float()
            z_star = None
            if adversarial:
                with torch.no_grad():
                    z_star = generator_net(y_vec, ctx.generator)[0]
            losses = step(x, y, y_vec, z_star)
            total.add(losses.pop("loss_total"))
            parts.append(losses)
        train_loss = total.mean(ctx.rnd, what="GPAF client", hint="lower train.lr or enable train.grad_clip") if parts \
            else float("nan")
        sums: dict[str, float] = {}
        for losses in read_once(parts):  # each term's mean over the steps, summed in step order
            for k, v in losses.items():
                sums[k] = sums.get(k, 0.0) + v
        metrics = {k: v / len(parts) for k, v in sums.items()}
        metrics["train_loss"] = train_loss
        metrics.update(total.epoch_metrics())  # L_total per local epoch
        return ClientResult(arrays=ctx.result_arrays(model, self.client_keys(model)), num_examples=ctx.data.num_train,
                            metrics=metrics, extras=self.label_record(ctx, ncls))

    # --- server side -------------------------------------------------------------
    def sample_labels(self, n: int, num_classes: int, generator: torch.Generator,
                      probs: np.ndarray | None = None) -> torch.Tensor:
        """Label vectors (n x C) for generator training (see ``label_sampling``); ``probs``: the pooled label
        proportions of the round's clients (``pooled``, ``pooled_exact``)."""
        mode = self.p["label_sampling"]
        if mode in POOLED:
            if probs is None:
                raise ValueError(f"method_params.gpaf.label_sampling {mode!r} needs the clients' label counts")
            return F.one_hot(authors.draw_labels(n, probs, generator), num_classes).float()
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
        alpha = np.full(num_classes, float(self.p["label_alpha"]))
        if mode == "dirichlet_soft":
            return torch.from_numpy(rng.dirichlet(alpha, size=n)).float()
        idx = rng.choice(num_classes, size=n, p=rng.dirichlet(alpha)) if mode == "dirichlet" else rng.integers(num_classes, size=n)
        return F.one_hot(torch.from_numpy(idx).long(), num_classes).float()

    def generator_losses(self, z: torch.Tensor, y_vec: torch.Tensor, ensemble: list[nn.Module],
                         global_clf: nn.Module) -> dict[str, torch.Tensor]:
        """L_KD (Eq. 3), L_GM (Eq. 4) and L_s (Eq. 5) of generated z."""
        ens_logits = torch.stack([c(z) for c in ensemble]).mean(0)
        kd = F.cross_entropy(ens_logits, y_vec)
        if self.p["gm_form"] == "literal":
            gm = -(F.softmax(global_clf(z), dim=1) * F.log_softmax(ens_logits, dim=1)).sum(1).mean()
        else:
            gm = F.cross_entropy(global_clf(z), y_vec)
        lam = self.p["kd_balance"]
        return {"kd": kd, "gm": gm, "s": lam * kd + (1 - lam) * gm}

    def server_optimizers(self, gen: nn.Module, dn: nn.Module, state: dict | None,
                          rnd: int = 1) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        """Adam for G_w and D_n; with ``server_optimizer: persist`` their moments carry over from the last round
        (FedGen creates its generator optimizer once, serverpFedGen.py:42-47), ``fresh`` starts them anew."""
        p = self.p
        opt_g = torch.optim.Adam(gen.parameters(), lr=p["generator_lr"])
        opt_d = torch.optim.Adam(dn.parameters(), lr=p["dn_lr"])
        if state is not None and p["server_optimizer"] == "persist" and "gpaf_opt_g" in state:
            opt_g.load_state_dict(state["gpaf_opt_g"])
            opt_d.load_state_dict(state["gpaf_opt_dn"])
        for group in opt_g.param_groups:  # FedGen decays its generator lr per round (ExponentialLR 0.98)
            group["lr"] = p["generator_lr"] * p["generator_lr_decay"] ** (rnd - 1)
        return opt_g, opt_d

    def train_generator(self, gen: nn.Module, ensemble: list[nn.Module], global_clf: nn.Module, dn: nn.Module,
                        generator: torch.Generator, device: torch.device,
                        optimizers: tuple[torch.optim.Optimizer, torch.optim.Optimizer] | None = None,
                        rnd: int = 1, batch_size: int | None = None,
                        label_probs: np.ndarray | None = None) -> list[dict[str, float]]:
        """``server_epochs`` epochs of ``server_steps_per_epoch`` D_n and G_w updates each (Alg. 1 lines 4-12).

        There is no server data, so an epoch is a number of generated batches of ``batch_size`` (the
        resolved ``server_batch_size``): 1 by default, as the authors' loop draws one batch per epoch;
        FedGen's ``n_teacher_iters`` is 5 (its round trains ensemble_epochs // n_teacher_iters "epochs" of
        n_teacher_iters steps, serverpFedGen.py:97-99, 129, 171-173). One loss record per epoch.
        ``label_probs``: the pooled label proportions (``label_sampling: pooled``).
        """
        p = self.p
        if batch_size is None:
            if p["server_batch_size"] == "client":
                raise ValueError("method_params.gpaf.server_batch_size 'client' needs the clients' batch size")
            batch_size = p["server_batch_size"]
        for m in [*ensemble, global_clf]:
            m.to(device).eval().requires_grad_(False)
        gen.to(device).train().requires_grad_(True)
        dn.to(device).train()
        opt_g, opt_d = optimizers or self.server_optimizers(gen, dn, None)
        diversity = p["diversity_prior"] != "none"
        totals = StepLosses()  # every step's J, read once after the last step: no host sync per step
        last_steps: list[dict[str, torch.Tensor]] = []  # each epoch's last step's losses
        for _ in range(p["server_epochs"]):
            for _ in range(p["server_steps_per_epoch"]):
                y_vec = self.sample_labels(batch_size, gen.num_classes, generator, label_probs).to(device, non_blocking=True)
                if p["server_objective"] == "authors":
                    rec = self._authors_server_step(gen, ensemble, dn, opt_g, opt_d, y_vec, generator, diversity)
                    totals.add(rec["J"])
                    continue
                z, mu, logvar = gen(y_vec, generator)
                rec = {}
                div = torch.zeros((), device=device)
                if diversity:  # D_n: prior samples (real) vs generated z (fake), Eq. 6
                    prior = randn(z.shape[0], z.shape[1], generator, device)
                    rec["diver_value"] = self._dn_step(dn, opt_d, prior, z)
                    div = generator_side_loss(dn(z), p["gan_loss"])  # G_w's side of Eq. 6, the same form as E_s's
                losses = self.generator_losses(z, y_vec, ensemble, global_clf)
                kl = kl_to_standard_normal(mu, logvar)
                total = p["lambda_s"] * losses["s"] + p["lambda_diver"] * div + p["generator_kl"] * kl
                opt_g.zero_grad(set_to_none=True)
                total.backward()
                opt_g.step()
                totals.add(total)
                rec.update({"J": total.detach(), "kd": losses["kd"].detach(), "gm": losses["gm"].detach(),
                            "diver": div.detach(), "kl": kl.detach()})
            last_steps.append(rec)
        gen.eval().requires_grad_(False)
        totals.mean(rnd, what="GPAF generator", hint="lower generator_lr")  # a non-finite step names itself
        return read_once(last_steps)

    def _authors_server_step(self, gen: nn.Module, ensemble: list[nn.Module], dn: nn.Module, opt_g: torch.optim.Optimizer,
                             opt_d: torch.optim.Optimizer, y_vec: torch.Tensor, generator: torch.Generator,
                             diversity: bool) -> dict[str, torch.Tensor]:
        """One epoch of update-gpaf's ``_train_generator`` (6aea7f8): a D_n step (N(0, I) draws real, G_w's z fake),
        then a G_w step on the same noise and labels with a new eps. Losses as detached 0-d tensors."""
        rec: dict[str, torch.Tensor] = {}
        noise = randn(y_vec.shape[0], gen.noise_dim, generator, y_vec.device) if gen.noise_dim else None
        z = gen(y_vec, generator, noise)[0]
        if diversity:
            real = randn(z.shape[0], z.shape[1], generator, z.device)
            d_loss = authors.dn_loss(dn(real), dn(z.detach()))
            opt_d.zero_grad(set_to_none=True)
            d_loss.backward()
            opt_d.step()
            rec["dn_loss"] = d_loss.detach()
        z, mu, logvar = gen(y_vec, generator, noise)
        ens_logits = torch.stack([c(z) for c in ensemble]).mean(0)
        losses = authors.generator_loss(ens_logits, y_vec, mu, logvar, dn(z) if diversity else None,
                                        self.p["generator_kl"], self.p["lambda_diver"])
        opt_g.zero_grad(set_to_none=True)
        losses["J"].backward()
        opt_g.step()
        return {**rec, **{k: v.detach() for k, v in losses.items()}}

    def label_probs(self, ctx: ServerContext) -> np.ndarray | None:
        """The pooled label proportions of this round's clients (None unless ``label_sampling`` pools them); a
        client's batches per epoch are ceil(n_k / B), as its loader's length."""
        if self.p["label_sampling"] not in POOLED:
            return None
        counts, batches = [], []
        for pid, r in zip(ctx.pids, ctx.results, strict=True):
            if "labels" not in r.extras:
                raise ValueError(f"round {ctx.rnd}: client {pid} sent no label counts (method_params.gpaf.label_sampling "
                                 f"{self.p['label_sampling']!r} needs them)")
            counts.append(r.extras["labels"]["counts"].detach().cpu().numpy())
            batches.append(math.ceil(r.num_examples / ctx.train.batch_size))
        return authors.pooled_label_probs(counts, batches, truncate=self.p["label_sampling"] == "pooled")

    @staticmethod
    def _dn_step(dn: nn.Module, opt: torch.optim.Optimizer, prior: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """One ascent step of D_n on Eq. 6's value; returns the value before the step (a detached 0-d tensor)."""
        value = adversarial_value(dn(prior), dn(z.detach()))
        opt.zero_grad(set_to_none=True)
        (-value).backward()
        opt.step()
        return value.detach()

    def aggregate(self, ctx: ServerContext) -> Arrays:
        weights = [r.num_examples if self.p["aggregation"] == "weighted" else 1 for r in ctx.results]
        new = weighted_average([r.arrays for r in ctx.results], weights)  # theta_E, theta_C (Eq. 8)
        model: GPAFNet = ctx.new_model()
        load_arrays(model, {**ctx.global_arrays, **new})  # F = the averaged classifier; G_w from last round
        ensemble = []
        for r in ctx.results:
            clf = ctx.new_model().classifier
            load_prefixed(clf, r.arrays, "classifier.")
            ensemble.append(clf)
        g = server_generator(ctx.seed, ctx.rnd)
        dn = seeded(lambda: LatentDiscriminator(self.p["latent_dim"]), g)
        if "gpaf_dn" in ctx.state:
            dn.load_state_dict(ctx.state["gpaf_dn"])
        model.generator.to(ctx.device)
        dn.to(ctx.device)
        optimizers = self.server_optimizers(model.generator, dn, ctx.state, ctx.rnd)
        batch = ctx.train.batch_size if self.p["server_batch_size"] == "client" else self.p["server_batch_size"]
        history = self.train_generator(model.generator, ensemble, model.classifier, dn, g, ctx.device, optimizers, ctx.rnd,
                                       batch, self.label_probs(ctx))
        ctx.state["gpaf_dn"] = tensors_of(dn)
        if self.p["server_optimizer"] == "persist":
            ctx.state["gpaf_opt_g"], ctx.state["gpaf_opt_dn"] = (optimizer_state_cpu(o) for o in optimizers)
        ctx.state.setdefault("gpaf_generator_losses", []).append(history[-1] if history else {})
        out = dict(new)
        generator_keys = [k for k in model.state_dict() if k.startswith(GENERATOR_PREFIX)]
        out.update(model_tensors(model, generator_keys, device=next(iter(new.values())).device))  # G_w where the arrays are
        return out
