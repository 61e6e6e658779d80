"""GPAF as the authors' code trains it (study gpaf's defaults): the client's losses and step, the labels, noise and
objective of the generator. Values on hand-made inputs come from the authors' formulas (tests/fixtures/gpaf_reference.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.clients import client_ctx, fresh_global, server_ctx, toy_data, toy_spec

from fedmedbench.fl.api import ClientResult
from fedmedbench.fl.methods import _gpaf_authors as authors
from fedmedbench.fl.methods.gpaf import GPAF, server_generator
from fedmedbench.models.gpaf_authors import SigmoidDiscriminator
from fedmedbench.models.vae import LatentClassifier, LatentDiscriminator

REF = json.loads((Path(__file__).parent / "fixtures" / "gpaf_reference.json").read_text())
SPEC = toy_spec("gpaf", model="gpaf_resnet18_tiny")  # the authors' client, narrow: quick on a CPU


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def test_declared_defaults_are_the_authors():
    p = GPAF().p
    assert (p["lambda_cl"], p["lambda_adv"]) == (1.0, 1.0)  # c2505a7 models.py:769: cls_loss + g_loss
    assert (p["disc_lr"], p["disc_beta1"]) == (2e-4, 0.5)  # models.py:584
    assert (p["generator_arch"], p["noise_dim"], p["server_objective"]) == ("authors", 64, "authors")
    assert (p["server_epochs"], p["generator_kl"], p["lambda_diver"], p["generator_lr"], p["dn_lr"]) == \
        (40, 0.7, 0.4, 1e-3, 1e-3)  # update-gpaf 6aea7f8 _train_generator
    assert (p["label_sampling"], p["server_optimizer"]) == ("pooled", "fresh")
    opt = GPAF().disc_optimizer(SigmoidDiscriminator(64))
    group = opt.param_groups[0]
    assert type(opt) is torch.optim.Adam and (group["lr"], group["betas"], group["weight_decay"]) == (2e-4, (0.5, 0.999), 0)


def test_client_losses_on_hand_made_probabilities():
    """D_s: 0.5 (BCE(D(z*), 1) + BCE(D(z), 0)); E_s + C_s: CE + BCE(D(z), 1) (c2505a7 models.py:646-662, 717, 762-769)."""
    ref = REF["client_c2505a7"]
    inp = ref["inputs"]
    p_gen, p_local = t(inp["Ds_prob_on_generated"]).squeeze(1), t(inp["Ds_prob_on_local"]).squeeze(1)
    assert float(authors.client_disc_loss(p_gen, p_local)) == pytest.approx(ref["d_loss"], abs=1e-12)
    losses = authors.client_encoder_loss(p_local, t(inp["classifier_logits"]), torch.tensor(inp["labels"]))
    assert float(losses["loss_g"]) == pytest.approx(ref["g_loss_nonsaturating"], abs=1e-12)
    assert float(losses["loss_cl"]) == pytest.approx(ref["ce"], abs=1e-12)
    assert float(losses["loss_total"]) == pytest.approx(ref["encoder_total"], abs=1e-12)


def test_generator_loss_on_the_hand_made_batch():
    """CE(mean client logits) + 0.7 KL summed over batch x dimensions + 0.4 BCE(D_n(z), 1) = 1.3063609752; D_n's step
    0.5 (BCE(D_n(N(0, I)), 1) + BCE(D_n(z), 0)) = 0.7476723745 (update-gpaf 6aea7f8 server.py _train_generator)."""
    ref = REF["generator_loss_6aea7f8"]
    inp = ref["inputs"]
    ens = torch.stack([t(inp["logits_client1"]), t(inp["logits_client2"])]).mean(0)
    y = F.one_hot(torch.tensor(inp["labels"]), 2).double()
    args = (ens, y, t(inp["mu"]), t(inp["logvar"]), t(inp["Dn_logits_on_z"]))
    got = authors.generator_loss(*args, lambda_kl=0.7, lambda_adv=0.4)
    assert float(got["kd"]) == pytest.approx(ref["ce"], abs=1e-12)
    assert float(got["kl"]) == pytest.approx(ref["kl_sum"], abs=1e-12)
    assert float(got["diver"]) == pytest.approx(ref["adv_bce"], abs=1e-12)
    assert float(got["J"]) == pytest.approx(ref["total_lambda_kl_0p7_adv_0p4"], abs=1e-12)
    assert round(float(got["J"]), 10) == 1.3063609752
    assert float(authors.generator_loss(*args, lambda_kl=0.4, lambda_adv=0.3)["J"]) == \
        pytest.approx(ref["total_paper_lambda_kl_0p4_adv_0p3"], abs=1e-12)
    dn = REF["dn_step_6aea7f8"]["inputs"]
    d_loss = authors.dn_loss(t(dn["D_logits_on_gaussian"]), t(dn["D_logits_on_generated"]))
    assert round(float(d_loss), 10) == 0.7476723745


def test_pooled_label_proportions_truncate_each_clients_counts_as_the_authors():
    """c2505a7 server.py:398-410: int(p_kc * n_batches_k) summed over clients, normalised (the worked example: three
    clients of 13 / 13 / 15 batches -> (10, 28) / 38, not the exact pooled (0.302, 0.698))."""
    ex = REF["label_probs_c2505a7"]
    counts = [np.array(c["labels_seen"]) for c in ex["clients"]]
    batches = [c["n_batches"] for c in ex["clients"]]
    got = authors.pooled_label_probs(counts, batches)
    np.testing.assert_allclose(got, [ex["label_probs"]["0"], ex["label_probs"]["1"]], atol=1e-15)
    exact = authors.pooled_label_probs(counts, batches, truncate=False)
    np.testing.assert_allclose(exact, [ex["exact_pooled_proportions_for_comparison"][k] for k in "01"], atol=1e-15)
    # the server reads each client's counts and its batches ceil(n_k / B) from the replies
    method = GPAF()
    results = [ClientResult(arrays={}, num_examples=n, extras={"labels": {"counts": torch.tensor(c)}})
               for n, c in ((169, [51, 118]), (160, [50, 110]), (195, [59, 136]))]  # 13, 13, 15 batches of 13
    ctx = server_ctx(method, SPEC, {}, results)
    ctx.train = dataclasses.replace(ctx.train, batch_size=13)
    want = authors.pooled_label_probs([r.extras["labels"]["counts"].numpy() for r in results], [13, 13, 15])
    np.testing.assert_allclose(method.label_probs(ctx), want)
    assert abs(want[0] - 160 / 524) > 0.01  # not the exact pooled proportion


def test_generator_labels_follow_the_pooled_proportions():
    """A chi-square test over 2,000 server batches of 13: the labels G_w is given follow the pooled proportions
    (and clearly not a uniform draw)."""
    from scipy.stats import chisquare

    probs = np.array([0.2, 0.5, 0.3])
    method = GPAF()
    draws = torch.cat([method.sample_labels(13, 3, server_generator(0, r), probs).argmax(1) for r in range(1, 2001)])
    observed = np.bincount(draws.numpy(), minlength=3)
    assert observed.sum() == 26000
    assert chisquare(observed, probs * observed.sum()).pvalue > 1e-3
    assert chisquare(observed, np.full(3, observed.sum() / 3)).pvalue < 1e-12
    with pytest.raises(ValueError, match="label_sampling"):
        method.sample_labels(13, 3, server_generator(0, 1))


def test_authors_client_step_uses_three_encoder_passes_and_a_new_ds_each_round():
    """Per batch: D_s's step on a first encoder pass, then E_s + C_s on CE (third pass) + BCE (second pass), weights 1
    and 1: BatchNorm counts three batches per step. D_s is new each round (nothing kept in the client state); only
    E_s and C_s leave the client, with its label counts."""
    method = GPAF(server_epochs=1)
    arrays = fresh_global(method, SPEC)
    data = toy_data(48)
    ctx = client_ctx(method, SPEC, arrays, data, steps=2)
    passes = []
    ctx.model.encoder.register_forward_hook(lambda m, i, o: passes.append(1))
    result = method.client_fit(ctx)
    assert len(passes) == 6 and int(ctx.model.encoder.bn1.num_batches_tracked) == 6
    assert result.metrics["train_loss"] == pytest.approx(result.metrics["loss_cl"] + result.metrics["loss_g"], rel=1e-6)
    assert ctx.state == {}
    assert set(result.arrays) == {k for k in ctx.model.state_dict() if k.startswith(("encoder.", "classifier."))}
    assert torch.equal(result.extras["labels"]["counts"], torch.bincount(data.train_y, minlength=2))
    # a later round with any leftover state trains the same: nothing of D_s is carried over
    again = method.client_fit(client_ctx(method, SPEC, arrays, data, steps=2, state={"disc": {"junk": torch.zeros(1)}}))
    assert all(torch.equal(result.arrays[k], again.arrays[k]) for k in result.arrays)
    # before adv_start_round: the classifier's pass only, CE alone
    quiet = GPAF(adv_start_round=2)
    passes.clear()
    ctx = client_ctx(quiet, SPEC, arrays, data, steps=2)
    ctx.model.encoder.register_forward_hook(lambda m, i, o: passes.append(1))
    out = quiet.client_fit(ctx)
    assert len(passes) == 2 and out.metrics["loss_g"] == 0.0 and "loss_d" not in out.metrics


def test_authors_client_step_moves_ds_first_then_the_encoder_against_it():
    """D_s's step comes first (c2505a7 models.py:639-664), then the E_s + C_s step (:711-774); the adversarial term
    reaches the encoder only: with lambda_cl 0 the encoder moves and the classifier does not."""
    method = GPAF(lambda_cl=0.0)
    model = method.build_model(SPEC).train()
    torch.manual_seed(0)
    disc = SigmoidDiscriminator(64)
    opt = torch.optim.SGD(list(model.encoder.parameters()) + list(model.classifier.parameters()), lr=0.1)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
    order = []
    for name, o in (("D_s", opt_d), ("E_s+C_s", opt)):
        o.register_step_pre_hook(lambda *a, name=name: order.append(name))
    x, y = torch.rand(8, 1, 28, 28), torch.randint(0, 2, (8,))
    enc, clf = ([p.clone() for p in m.parameters()] for m in (model.encoder, model.classifier))
    rec = method.authors_step(model, disc, opt, opt_d, x, y, torch.randn(8, 64), torch.Generator().manual_seed(1))
    assert order == ["D_s", "E_s+C_s"] and set(rec) == {"loss_cl", "loss_g", "loss_total", "loss_d"}
    assert any(not torch.equal(a, b) for a, b in zip(enc, model.encoder.parameters(), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(clf, model.classifier.parameters(), strict=True))
    assert float(rec["loss_total"]) == pytest.approx(float(rec["loss_g"]))


def test_authors_server_step_reuses_its_noise_with_a_new_eps_and_keeps_dn():
    """Each server epoch: labels and 64-d noise drawn once; D_n's step on G_w's z, then G_w's step on a second pass
    with the same noise and labels (a new eps); J = CE + 0.7 KL + 0.4 BCE. D_n persists across rounds."""
    method = GPAF(server_epochs=3)
    model = method.build_model(SPEC)
    torch.manual_seed(0)
    ensemble = [LatentClassifier(64, 2) for _ in range(2)]
    calls = []
    real = model.generator.forward
    model.generator.forward = lambda y, g=None, noise=None: calls.append(noise) or real(y, g, noise)
    dn = LatentDiscriminator(64)
    dn_before = [p.clone() for p in dn.parameters()]
    history = method.train_generator(model.generator, ensemble, ensemble[0], dn, server_generator(0, 1),
                                     torch.device("cpu"), batch_size=13, label_probs=np.array([0.3, 0.7]))
    assert len(calls) == 6 and all(c is not None and c.shape == (13, 64) for c in calls)
    assert all(torch.equal(calls[2 * e], calls[2 * e + 1]) for e in range(3))
    assert not torch.equal(calls[0], calls[2])
    assert any(not torch.equal(a, b) for a, b in zip(dn_before, dn.parameters(), strict=True))
    for h in history:
        assert h["J"] == pytest.approx(h["kd"] + 0.7 * h["kl"] + 0.4 * h["diver"], rel=1e-5)
    # one aggregate: fresh Adams, D_n kept in the server state for the next round
    arrays = fresh_global(method, SPEC)
    results = [method.client_fit(client_ctx(method, SPEC, arrays, toy_data(32, seed=i), pid=i, steps=1)) for i in range(2)]
    state: dict = {}
    method.aggregate(server_ctx(method, SPEC, arrays, results, state=state))
    assert "gpaf_dn" in state and "gpaf_opt_g" not in state
