"""GPAF's defining properties: what leaves a client, the adversarial game, the generator's role, server training."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.clients import client_ctx, fresh_global, server_ctx, toy_data, toy_spec

from fedmedbench.fl.api.arrays import load_arrays, weighted_average
from fedmedbench.fl.api.registry import get_method
from fedmedbench.fl.methods.gpaf import GPAF, adversarial_value, server_generator
from fedmedbench.fl.training import to_float
from fedmedbench.models.vae import LatentClassifier, LatentDiscriminator, reparameterize

SPEC = toy_spec("gpaf")  # gpaf_cnn: the paper's VAE client
#: the paper's readings of GPAF's server (the declared defaults are the authors': tests/test_gpaf_authors.py)
PAPER = dict(generator_arch="paper", noise_dim=0, server_objective="paper", server_epochs=15, lambda_adv=0.3,
             generator_kl=0.4, lambda_diver=0.3, label_sampling="dirichlet")


def paper(**kw) -> GPAF:
    """GPAF with the paper's readings (the VAE client comes with SPEC's gpaf_cnn)."""
    return GPAF(**{**PAPER, **kw})


@pytest.fixture(scope="module")
def data():
    return toy_data(96)


def batch(data, n=32):
    x = to_float(data.train_x[:n], torch.device("cpu"))
    y = data.train_y[:n]
    return x, y, F.one_hot(y, 2).float()


def parts(method, model, data):
    ctx = client_ctx(method, SPEC, fresh_global(method, SPEC), data)
    return method.local_parts(ctx, model)


def value_on(model, disc, gen_net, x, y_vec, seed=123) -> float:
    """L_g = E[log D_s(z*)] + E[log(1 - D_s(z))] with fixed noise (same z*, same eps every call)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        z_star = gen_net(y_vec, g)[0]
        mu, logvar = model.encoder(x)
        z = reparameterize(mu, logvar, g)
        return float(adversarial_value(disc(z_star, y_vec), disc(z, y_vec)))


def test_only_encoder_and_classifier_parameters_leave_the_client(data):
    method = paper()
    arrays = fresh_global(method, SPEC)
    assert any(k.startswith("generator.") for k in arrays), "the generator travels server -> client"
    ctx = client_ctx(method, SPEC, arrays, data, steps=3)
    result = method.client_fit(ctx)
    sent = set(result.arrays)
    model = method.build_model(SPEC)
    expected = {k for k in model.state_dict() if k.startswith(("encoder.", "classifier."))}
    assert sent == expected
    assert not result.extras
    # decoder U_s and discriminator D_s exist, trained, but stay in the client's own state
    assert set(ctx.state) == {"decoder", "disc"}
    assert not any(k.startswith(("decoder", "disc", "generator")) for k in sent)
    # and they are used again (not re-initialised) in the client's next round
    ctx2 = client_ctx(method, SPEC, arrays, data, rnd=2, state=ctx.state)
    decoder, disc = method.local_parts(ctx2, ctx2.model)
    for k, v in disc.state_dict().items():
        assert torch.equal(v, ctx.state["disc"][k])


def test_disc_ascends_and_encoder_descends_the_adversarial_loss(data):
    method = paper(lambda_vae=0.0, lambda_cl=0.0, lambda_adv=1.0)  # isolate L_g in E_s's step
    model = method.build_model(SPEC)
    load_arrays(model, fresh_global(method, SPEC))
    model.train()
    decoder, disc = parts(method, model, data)
    x, y, y_vec = batch(data)
    gen_net = model.generator.requires_grad_(False)
    v0 = value_on(model, disc, gen_net, x, y_vec)

    # one step of D_s (Eq. 15: max over theta_D) raises L_g
    disc_state = {k: v.clone() for k, v in disc.state_dict().items()}
    g = torch.Generator().manual_seed(123)
    z_star = gen_net(y_vec, g)[0]
    mu, logvar = model.encoder(x)
    z = reparameterize(mu, logvar, g).detach()
    method.disc_step(disc, torch.optim.SGD(disc.parameters(), lr=0.05), z_star, z, y_vec)
    v_after_d = value_on(model, disc, gen_net, x, y_vec)
    assert v_after_d > v0 + 1e-4

    # one step of E_s (min over theta_E) lowers L_g, against the same D_s
    disc.load_state_dict(disc_state)
    enc_before = {k: v.clone() for k, v in model.encoder.state_dict().items()}
    opt = torch.optim.SGD(list(model.encoder.parameters()) + list(model.classifier.parameters()), lr=0.05)
    method.model_step(model, decoder, disc, opt, x, y, y_vec, z_star.detach(), torch.Generator().manual_seed(123))
    v_after_e = value_on(model, disc, gen_net, x, y_vec)
    assert v_after_e < v0 - 1e-4
    assert any(not torch.equal(v, enc_before[k]) for k, v in model.encoder.state_dict().items())
    # the E_s step does not touch D_s, and the D_s step does not touch E_s
    assert all(torch.equal(v, disc_state[k]) for k, v in disc.state_dict().items())


@pytest.mark.parametrize("gan_loss", ["nonsaturating", "minimax"])
def test_encoder_step_lowers_adversarial_loss_for_both_gan_forms(data, gan_loss):
    method = paper(lambda_vae=0.0, lambda_cl=0.0, lambda_adv=1.0, gan_loss=gan_loss)
    model = method.build_model(SPEC)
    load_arrays(model, fresh_global(method, SPEC))
    decoder, disc = parts(method, model, data)
    x, y, y_vec = batch(data)
    v0 = value_on(model, disc, model.generator, x, y_vec)
    g = torch.Generator().manual_seed(123)
    z_star = model.generator(y_vec, g)[0].detach()
    opt = torch.optim.SGD(model.encoder.parameters(), lr=0.05)
    method.model_step(model, decoder, disc, opt, x, y, y_vec, z_star, torch.Generator().manual_seed(123))
    assert value_on(model, disc, model.generator, x, y_vec) < v0


def test_generator_output_changes_the_clients_adversarial_loss_and_update(data):
    method = paper()
    arrays = fresh_global(method, SPEC)
    other = dict(arrays)
    for k in arrays:  # a different generator, everything else equal
        if k.startswith("generator.") and arrays[k].is_floating_point():
            other[k] = arrays[k] + 0.5
    results = []
    for a in (arrays, other):
        ctx = client_ctx(method, SPEC, a, data, steps=4)
        results.append(method.client_fit(ctx))
    assert results[0].metrics["loss_g"] != pytest.approx(results[1].metrics["loss_g"], abs=1e-6)
    assert results[0].metrics["loss_d"] != pytest.approx(results[1].metrics["loss_d"], abs=1e-6)
    assert any(not np.array_equal(results[0].arrays[k], results[1].arrays[k]) for k in results[0].arrays)
    # without the adversarial term the generator has no influence on the client
    quiet = paper(lambda_adv=0.0, adv_start_round=99)
    same = [quiet.client_fit(client_ctx(quiet, SPEC, a, data, steps=4)).arrays for a in (arrays, other)]
    assert all(np.array_equal(same[0][k], same[1][k]) for k in same[0])


def fixed_ensemble(k=3, latent=64, classes=2, seed=0):
    torch.manual_seed(seed)
    return [LatentClassifier(latent, classes) for _ in range(k)]


def kd_on_fixed_batch(method, gen, ensemble, seed=7):
    g = torch.Generator().manual_seed(seed)
    y_vec = method.sample_labels(256, 2, g)
    with torch.no_grad():
        z = gen(y_vec, g)[0]
        return float(method.generator_losses(z, y_vec, ensemble, ensemble[0])["kd"])


def test_kd_loss_decreases_on_a_fixed_ensemble_after_server_training():
    method = paper(server_epochs=15, server_steps_per_epoch=5, server_batch_size=32, label_sampling="uniform")
    model = method.build_model(SPEC)
    ensemble = fixed_ensemble()
    global_clf = fixed_ensemble(1, seed=1)[0]
    before = kd_on_fixed_batch(method, model.generator, ensemble)
    history = method.train_generator(model.generator, ensemble, global_clf, LatentDiscriminator(64), server_generator(0, 1),
                                     torch.device("cpu"))
    after = kd_on_fixed_batch(method, model.generator, ensemble)
    assert len(history) == 15 and all(np.isfinite(h["kd"]) for h in history)
    assert after < before - 0.05, (before, after)


def test_server_averages_encoder_classifier_and_trains_not_averages_the_generator(data):
    method = paper(server_epochs=3)
    arrays = fresh_global(method, SPEC)
    results = [method.client_fit(client_ctx(method, SPEC, arrays, toy_data(64 + 32 * i, seed=i), pid=i, steps=3)) for i in range(2)]
    ctx = server_ctx(method, SPEC, arrays, results)
    new = method.aggregate(ctx)
    avg = weighted_average([r.arrays for r in results], [r.num_examples for r in results])
    for k in avg:
        np.testing.assert_allclose(new[k], avg[k], rtol=1e-6)
    gen_keys = [k for k in arrays if k.startswith("generator.")]
    assert set(new) == set(avg) | set(gen_keys)
    assert any(not np.allclose(new[k], arrays[k]) for k in gen_keys), "the generator is trained on the server"
    assert "gpaf_dn" in ctx.state and len(ctx.state["gpaf_generator_losses"]) == 1
    # same seed and round -> the same server step (resumable)
    again = method.aggregate(server_ctx(method, SPEC, arrays, results))
    assert all(np.array_equal(new[k], again[k]) for k in new)


def test_client_step_is_reproducible_from_its_generator(data):
    method = paper()
    arrays = fresh_global(method, SPEC)
    a = method.client_fit(client_ctx(method, SPEC, arrays, data, steps=3))
    torch.manual_seed(999)  # the global RNG must not matter
    b = method.client_fit(client_ctx(method, SPEC, arrays, data, steps=3))
    assert all(np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)


@pytest.mark.parametrize("mode", ["dirichlet", "dirichlet_soft", "uniform"])
def test_label_sampling(mode):
    method = paper(label_sampling=mode, label_alpha=0.1)
    y = method.sample_labels(64, 4, torch.Generator().manual_seed(0))
    assert y.shape == (64, 4)
    np.testing.assert_allclose(y.sum(1).numpy(), 1.0, rtol=1e-5)
    if mode != "dirichlet_soft":
        assert set(np.unique(y.numpy())) <= {0.0, 1.0}


def test_gm_forms_differ_and_are_finite():
    ensemble, f = fixed_ensemble(), fixed_ensemble(1, seed=3)[0]
    z = torch.randn(16, 64)
    y_vec = F.one_hot(torch.randint(0, 2, (16,)), 2).float()
    lit = paper(gm_form="literal").generator_losses(z, y_vec, ensemble, f)["gm"]
    glob = paper(gm_form="global_ce").generator_losses(z, y_vec, ensemble, f)["gm"]
    assert torch.isfinite(lit) and torch.isfinite(glob) and not torch.isclose(lit, glob)
    # literal L_GM: cross-entropy of the ensemble prediction against F's prediction
    ens = torch.stack([c(z) for c in ensemble]).mean(0)
    expected = -(F.softmax(f(z), 1) * F.log_softmax(ens, 1)).sum(1).mean()
    assert torch.isclose(lit, expected)


def test_parameter_errors_name_the_key():
    with pytest.raises(TypeError, match="method_params.gpaf"):
        get_method("gpaf", {"lamda_adv": 0.3})
    with pytest.raises(ValueError, match="gm_form"):
        get_method("gpaf", {"gm_form": "kl"})
    with pytest.raises(ValueError, match="method_model.gpaf.name"):
        GPAF().build_model(toy_spec("gpaf", model="cnn_small"))


def test_server_epoch_is_fedgen_steps_and_adam_moments_persist(data, monkeypatch):
    """The FedGen option: 15 epochs x 5 generated batches per round (n_teacher_iters); Adam state carried over."""
    method = paper(server_epochs=15, server_steps_per_epoch=5, server_optimizer="persist")
    arrays = fresh_global(method, SPEC)
    results = [method.client_fit(client_ctx(method, SPEC, arrays, toy_data(64, seed=i), pid=i, steps=2)) for i in range(2)]
    calls = []
    real = method.sample_labels
    monkeypatch.setattr(method, "sample_labels", lambda *a: calls.append(1) or real(*a))
    state: dict = {}
    method.aggregate(server_ctx(method, SPEC, arrays, results, state=state))
    assert len(calls) == 75 and len(state["gpaf_generator_losses"][-1]) > 0
    assert int(state["gpaf_opt_g"]["state"][0]["step"]) == 75
    method.aggregate(server_ctx(method, SPEC, arrays, results, rnd=2, state=state))
    assert int(state["gpaf_opt_g"]["state"][0]["step"]) == 150  # the moments went on, not restarted
    fresh_state: dict = {}
    paper(server_epochs=2, server_optimizer="fresh").aggregate(server_ctx(method, SPEC, arrays, results, state=fresh_state))
    assert "gpaf_opt_g" not in fresh_state
    one = paper(server_epochs=2, server_steps_per_epoch=1, server_optimizer="persist")
    calls.clear()
    monkeypatch.setattr(one, "sample_labels", lambda *a: calls.append(1) or real(*a))
    one.aggregate(server_ctx(one, SPEC, arrays, results, state={}))
    assert len(calls) == 2


def test_default_server_step_is_the_authors_loop(data, monkeypatch):
    """One batch of the clients' batch size per server epoch, 40 epochs, a new Adam each round: update-gpaf
    server.py _train_generator at 6aea7f8 (num_epochs 40, one batch of the strategy's batch size and one D_n and one
    G_w step per epoch, both Adams created in the per-round function); GPAFflower server.py:564 at c2505a7 draws
    batches of 13. The paper's 15 epochs is server_epochs: 15."""
    method = GPAF()
    assert (method.p["server_epochs"], method.p["server_steps_per_epoch"], method.p["server_optimizer"]) == (40, 1, "fresh")
    arrays = fresh_global(method, SPEC)
    results = [method.client_fit(client_ctx(method, SPEC, arrays, toy_data(64, seed=i), pid=i, steps=1)) for i in range(2)]
    sizes = []
    real = method.sample_labels
    monkeypatch.setattr(method, "sample_labels", lambda n, *a: sizes.append(n) or real(n, *a))
    state: dict = {}
    ctx = server_ctx(method, SPEC, arrays, results, state=state)
    ctx.train = dataclasses.replace(ctx.train, batch_size=13)
    method.aggregate(ctx)
    assert sizes == [13] * 40  # 40 generator steps of 13 generated samples
    assert "gpaf_opt_g" not in state and "gpaf_opt_dn" not in state  # nothing carried to the next round
    fixed = GPAF(server_batch_size=7, server_epochs=2)
    monkeypatch.setattr(fixed, "sample_labels", lambda n, *a: sizes.append(n) or real(n, *a))
    sizes.clear()
    fixed.aggregate(server_ctx(fixed, SPEC, arrays, results, state={}))
    assert sizes == [7, 7]
    with pytest.raises(ValueError, match="server_batch_size"):
        paper(server_batch_size="clients")


def test_label_alpha_follows_the_settings_alpha():
    from fedmedbench.fl.api import method_params

    study = {"gpaf": {"label_alpha": "partition", "server_epochs": 3}}
    assert method_params.resolve("gpaf", study, {"params": {"alpha": 0.1}})["label_alpha"] == 0.1
    assert method_params.resolve("gpaf", {}, {"params": {"alpha": 0.5}})["label_alpha"] == 0.5  # the default
    assert method_params.resolve("gpaf", study, {"scheme": "center"})["label_alpha"] == 1.0
    assert method_params.resolve("gpaf", {"gpaf": {"label_alpha": 2.0}}, {"params": {"alpha": 0.1}})["label_alpha"] == 2.0
    per_setting = {"params": {"alpha": 0.1}, "method_params": {"gpaf": {"server_epochs": 7}}}
    assert method_params.resolve("gpaf", study, per_setting) == {"label_alpha": 0.1, "server_epochs": 7}
    assert "label_alpha" not in method_params.resolve("moon", {"moon": {"mu": 1.0}}, {"params": {"alpha": 0.1}})
    with pytest.raises(ValueError, match="label_alpha"):
        paper(label_alpha="partition")
    # a small alpha concentrates each server batch on few classes
    g = torch.Generator().manual_seed(0)
    peaked = [paper(label_alpha=0.05).sample_labels(64, 4, g).mean(0).max() for _ in range(20)]
    flat = [paper(label_alpha=100.0).sample_labels(64, 4, g).mean(0).max() for _ in range(20)]
    assert np.mean(peaked) > 0.8 > 0.45 > np.mean(flat)


def test_vae_loss_reductions():
    from fedmedbench.fl.methods.gpaf import vae_loss

    x, x_hat = torch.zeros(2, 1, 4, 4), torch.ones(2, 1, 4, 4)
    mu, logvar = torch.ones(2, 3), torch.zeros(2, 3)  # KL per dimension = 0.5
    assert float(vae_loss(x_hat, x, mu, logvar, 1.0, "mean")) == pytest.approx(1.0 + 0.5)
    assert float(vae_loss(x_hat, x, mu, logvar, 1.0, "sum")) == pytest.approx(16.0 + 1.5)  # per image: 16 pixels, 3 dims


@pytest.mark.parametrize("kl_weight", [0.4, 0.0])
def test_generator_objective_is_eq7_plus_the_optional_kl_term(kl_weight):
    """J = lambda_1 L_s + lambda_2 L_diver (+ generator_kl KL(G_w(z|y) || N(0, I)), an added term; 0 removes it)."""
    method = paper(server_epochs=2, server_steps_per_epoch=1, generator_kl=kl_weight)
    model = method.build_model(SPEC)
    history = method.train_generator(model.generator, fixed_ensemble(), fixed_ensemble(1, seed=1)[0], LatentDiscriminator(64),
                                     server_generator(0, 1), torch.device("cpu"), batch_size=32)
    for h in history:
        s = 0.5 * h["kd"] + 0.5 * h["gm"]
        assert h["J"] == pytest.approx(1.0 * s + 0.3 * h["diver"] + kl_weight * h["kl"], rel=1e-5)
        assert h["kl"] > 0


def test_paper_grid_trains_every_method_with_the_authors_batch_and_optimizer():
    """The authors' client code: batch 13 and 35 local epochs (GPAFflower conf/config.yaml:5, client.py:409; 32 in
    their PathMNIST config) and Adam with weight decay 1e-4 on the encoder and classifier (models.py:583, 585) and
    the FedAvg client (client.py:527); MOON's SGD (momentum 0.9, weight decay 1e-5; update-gpaf train_moon) at the
    lr its client hard-codes; the centralized Swin's AdamW (Swin-Transformer-fed main.py:110-113), batch 16."""
    from pathlib import Path

    import yaml
    from snakemake.utils import validate

    from fedmedbench.fl.api import TrainConfig
    from fedmedbench.fl.training import make_optimizer
    from fedmedbench.studies import grid

    root = Path(__file__).resolve().parents[1]
    config = yaml.safe_load((root / "config" / "studies" / "gpaf.yaml").read_text())
    validate(config, str(root / "config" / "schema.yaml"), set_default=True)
    expected = {("gpaf", "moon"): (13, "sgd", 0.9, 1e-5), ("gpaf", "centralized"): (16, "adamw", 0.0, 1e-4)}
    optimizers = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}
    for study, batch, epochs in (("gpaf", 13, 35), ("gpaf_pathmnist", 32, 3)):
        st = config["studies"][study]
        for setting in st["settings"]:
            for method in st["methods"]:
                train = TrainConfig(**grid.run_train(st, setting, method))
                want = expected.get((study, method), (batch, "adam", 0.0, 1e-4))
                assert (train.batch_size, train.optimizer, train.momentum, train.weight_decay) == want, (study, method)
                assert (train.lr, train.local_epochs) == (0.00013914064388085564, epochs)
                opt = make_optimizer(torch.nn.Linear(2, 2), train, 1)
                group = opt.param_groups[0]
                assert type(opt) is optimizers[want[1]] and group["weight_decay"] == want[3]
                assert group["lr"] == 0.00013914064388085564 and group.get("momentum", 0.0) == want[2]


@pytest.mark.parametrize("gan_loss", ["nonsaturating", "minimax"])
def test_generators_diversity_loss_follows_gan_loss(gan_loss):
    """G_w's side of Eq. 6 takes the configured GAN form: minimax is log(1 - D_n(z)) (<= 0), as printed;
    nonsaturating is -log D_n(z) (>= 0)."""
    method = paper(server_epochs=1, server_steps_per_epoch=1, gan_loss=gan_loss, lambda_s=0.0, generator_kl=0.0,
                  lambda_diver=1.0)
    model = method.build_model(SPEC)
    dn = LatentDiscriminator(64)
    (rec,) = method.train_generator(model.generator, fixed_ensemble(), fixed_ensemble(1, seed=1)[0], dn,
                                    server_generator(0, 1), torch.device("cpu"), batch_size=32)
    assert rec["J"] == pytest.approx(rec["diver"])
    assert (rec["diver"] < 0) == (gan_loss == "minimax"), rec
