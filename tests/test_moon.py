"""MOON: the model-contrastive term, its reduction to cross-entropy (= FedAvg) at mu = 0 and in a client's
first round, eval-mode frozen models, previous model in state."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.clients import client_ctx, fresh_global, toy_data, toy_spec

from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.methods import moon as moon_module
from fedmedbench.fl.methods.moon import model_contrastive_loss, moon_loss

SPEC = toy_spec("moon")


def test_loss_reduces_to_cross_entropy_when_mu_is_zero():
    torch.manual_seed(0)
    logits, y = torch.randn(8, 3), torch.randint(0, 3, (8,))
    z, zg, zp = torch.randn(8, 16), torch.randn(8, 16), torch.randn(8, 16)
    ce = F.cross_entropy(logits, y)
    assert torch.equal(moon_loss(logits, y, z, zg, zp, 0.0, 0.5), ce)
    assert moon_loss(logits, y, z, zg, zp, 1.0, 0.5) > ce


def test_contrastive_term_pulls_towards_global_and_away_from_previous():
    z = torch.randn(16, 8)
    near_global = model_contrastive_loss(z, z, -z, 0.5)  # positive pair identical, negative opposite
    near_previous = model_contrastive_loss(z, -z, z, 0.5)
    assert near_global == pytest.approx(np.log1p(np.exp(-4.0)), rel=1e-4)  # sims 1 vs -1, tau 0.5
    assert near_previous == pytest.approx(np.log1p(np.exp(4.0)), rel=1e-4)
    # tau scales the logits: the paper's l_con = -log softmax([sim_g, sim_p] / tau)[0]
    zg, zp = torch.randn(16, 8), torch.randn(16, 8)
    sims = torch.stack([F.cosine_similarity(z, zg, -1), F.cosine_similarity(z, zp, -1)], 1) / 0.5
    assert torch.isclose(model_contrastive_loss(z, zg, zp, 0.5), -F.log_softmax(sims, 1)[:, 0].mean())


def test_moon_with_mu_zero_is_a_fedavg_client_step():
    data = toy_data(80)
    moon, fedavg = get_method("moon", {"mu": 0.0}), get_method("fedavg")
    arrays = fresh_global(fedavg, SPEC)
    prev = fedavg.client_fit(client_ctx(fedavg, SPEC, arrays, data, steps=3, seed=7)).arrays
    prev_state = {k: v.clone() for k, v in prev.items()}
    a = moon.client_fit(client_ctx(moon, SPEC, arrays, data, rnd=2, steps=5, state={"prev": dict(prev_state)}))
    b = fedavg.client_fit(client_ctx(fedavg, SPEC, arrays, data, rnd=2, steps=5))
    assert a.arrays.keys() == b.arrays.keys()
    assert all(np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)
    # with mu > 0 and a previous model the update differs
    c = get_method("moon", {"mu": 5.0}).client_fit(client_ctx(moon, SPEC, arrays, data, rnd=2, steps=5,
                                                               state={"prev": dict(prev_state)}))
    assert any(not np.array_equal(a.arrays[k], c.arrays[k]) for k in a.arrays)


def test_first_round_trains_on_cross_entropy_only():
    """No previous model yet (the reference's empty pool): even with mu = 5 the step is FedAvg's, bit for bit."""
    data = toy_data(80)
    moon, fedavg = get_method("moon", {"mu": 5.0}), get_method("fedavg")
    arrays = fresh_global(fedavg, SPEC)
    a = moon.client_fit(client_ctx(moon, SPEC, arrays, data, steps=5, state={}))
    b = fedavg.client_fit(client_ctx(fedavg, SPEC, arrays, data, steps=5))
    assert all(np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)


def test_global_and_previous_models_run_in_eval_mode(monkeypatch):
    """The frozen models use running batch-norm statistics (reference: global_model.eval(), prev nets .eval())."""
    data = toy_data(80)
    moon = get_method("moon", {"mu": 1.0})
    arrays = fresh_global(moon, SPEC)
    first = client_ctx(moon, SPEC, arrays, data, steps=2)
    moon.client_fit(first)
    seen = []
    real = moon_module.representation

    def spy(model, x):
        seen.append((model.training, any(p.requires_grad for p in model.parameters())))
        return real(model, x)

    monkeypatch.setattr(moon_module, "representation", spy)
    ctx = client_ctx(moon, SPEC, arrays, data, rnd=2, steps=3, state=first.state)
    moon.client_fit(ctx)
    frozen_calls = [s for s in seen if not s[1]]
    assert len(frozen_calls) == 6  # global and previous model, 3 steps
    assert all(training is False for training, _ in frozen_calls)


def test_previous_local_model_is_kept_in_client_state_and_used():
    data = toy_data(80)
    moon = get_method("moon", {"mu": 5.0})
    arrays = fresh_global(moon, SPEC)
    ctx = client_ctx(moon, SPEC, arrays, data, steps=4)
    result = moon.client_fit(ctx)
    prev = ctx.state["prev"]
    assert all(np.array_equal(prev[k].numpy(), result.arrays[k]) for k in result.arrays)
    # round 2 from the same global model: a different previous model changes the update
    r_with = moon.client_fit(client_ctx(moon, SPEC, arrays, data, rnd=2, steps=4, state={"prev": prev}))
    r_other = moon.client_fit(client_ctx(moon, SPEC, arrays, data, rnd=2, steps=4,
                                         state={"prev": {k: v.clone() for k, v in arrays.items()}}))
    assert any(not np.array_equal(r_with.arrays[k], r_other.arrays[k]) for k in r_with.arrays)


def test_moon_parameter_errors():
    with pytest.raises(TypeError, match="method_params.moon"):
        get_method("moon", {"tau": 0.5})
    with pytest.raises(ValueError, match="temperature"):
        get_method("moon", {"temperature": 0})


def test_authors_moon_network_projects_to_256_dims_and_classifies_the_projection():
    """gpaf_cnn_moon: MOON's projection MLP (l1: d -> d, ReLU, l2: d -> 256) on GPAF's encoder; the contrast and
    the classifier read the 256-d projection, as the GPAF authors' MOON config (output_dim 256)."""
    from fedmedbench.models import build_model

    torch.manual_seed(0)
    model = build_model("gpaf_cnn_moon", 1, 2, 28).eval()
    l1, l2 = model.projection[0], model.projection[2]
    assert (l1.in_features, l1.out_features, l2.out_features, model.classifier.in_features) == (64, 64, 256, 256)
    x = torch.rand(5, 1, 28, 28)
    with torch.no_grad():
        h = model.features(x)
        z = moon_module.representation(model, x)
        assert z.shape == (5, 256)
        assert torch.allclose(z, l2(torch.relu(l1(h))))
        rep, logits = moon_module.representation_and_logits(model, x)
        assert torch.allclose(logits, model(x)) and torch.allclose(logits, model.classifier(z))


def test_authors_moon_trains_and_sends_the_projection_head():
    """MOON on gpaf_cnn_moon: the projection head is part of what the client sends (averaged like the rest), and
    with the authors' mu = 0.001 the contrast still changes the round-2 update."""
    spec = toy_spec("moon", model="gpaf_cnn_moon")
    data = toy_data(80)
    moon = get_method("moon", {"mu": 0.001})
    arrays = fresh_global(moon, spec)
    assert {"projection.0.weight", "projection.2.weight", "classifier.weight"} <= set(arrays)
    first = client_ctx(moon, spec, arrays, data, steps=3)
    sent = moon.client_fit(first).arrays
    assert sent.keys() == arrays.keys() and sent["projection.2.weight"].shape == (256, 64)
    a = moon.client_fit(client_ctx(moon, spec, arrays, data, rnd=2, steps=3, state=dict(first.state)))
    b = get_method("moon", {"mu": 0.0}).client_fit(client_ctx(moon, spec, arrays, data, rnd=2, steps=3,
                                                               state=dict(first.state)))
    assert any(not np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)


def test_gpaf_grid_runs_moon_as_the_authors_configured_it():
    """config/studies/gpaf.yaml (and the demo): mu 0.001, tau 0.5; study gpaf on the authors' ModelMOON with SGD
    (momentum 0.9, weight decay 1e-5) at lr 1.39e-4, the value update-gpaf's MOONFlowerClient hard-codes (its config's
    0.03 never reaches it; method_train.moon.lr: 0.03 is the option); gpaf_pathmnist on the 256-d head on GPAF's
    VAE encoder; mu 1 stays an option."""
    from pathlib import Path

    import yaml

    from fedmedbench.studies import grid as study_grid

    root = Path(__file__).resolve().parents[1]
    grid = yaml.safe_load((root / "config" / "studies" / "gpaf.yaml").read_text())["studies"]
    demo = yaml.safe_load((root / "config" / "config.yaml").read_text())["studies"]["gpaf"]
    for study, model in ((grid["gpaf"], "moon_resnet_gpaf"), (grid["gpaf_pathmnist"], "gpaf_cnn_moon"),
                         (demo, "moon_resnet_gpaf_tiny")):
        assert study["method_params"]["moon"] == {"mu": 0.001, "temperature": 0.5}
        assert study["method_model"]["moon"]["name"] == model
    for study in (grid["gpaf"], demo):
        train = study_grid.run_train({"method_train": {}, **study}, next(iter(study["settings"])), "moon")
        assert (train["optimizer"], train["momentum"], train["weight_decay"]) == ("sgd", 0.9, 1e-5)
        assert train["lr"] == 0.00013914064388085564
    assert moon_module.MOON.declared_params()["mu"].default == 1.0  # MOON's own default, the option


def test_authors_moon_resnet_contrasts_and_classifies_the_256d_projection():
    """moon_resnet_gpaf (update-gpaf ModelMOON): h = the ResNet base's pooled 256-d features, z = l2(relu(l1(h))),
    logits = l3(z); MOON contrasts z."""
    from fedmedbench.models import build_model

    torch.manual_seed(0)
    model = build_model("moon_resnet_gpaf_tiny", 1, 2, 28).eval()
    assert (model.l2.out_features, model.l3.in_features, model.classifier is model.l3) == (256, 256, True)
    x = torch.rand(5, 1, 28, 28)
    with torch.no_grad():
        h = torch.flatten(model.features(x), 1)
        z, logits = moon_module.representation_and_logits(model, x)
        assert z.shape == (5, 256) and torch.allclose(z, model.l2(torch.relu(model.l1(h))))
        assert torch.allclose(logits, model(x)) and torch.allclose(logits, model.l3(z))
