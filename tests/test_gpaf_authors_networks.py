"""The GPAF study's networks equal the authors' (names, shapes and parameter counts counted from their classes,
tests/fixtures/gpaf_reference.json), and the grid trains each method on its authors' network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from helpers.clients import toy_spec

from fedmedbench.fl.methods.gpaf import GPAF
from fedmedbench.models import build_model
from fedmedbench.models.gpaf_authors import (
    MLPClassifier,
    NoiseLabelGenerator,
    ResNetEncoder,
    SigmoidDiscriminator,
)
from fedmedbench.models.vae import LatentDiscriminator

ROOT = Path(__file__).resolve().parents[1]
REF = json.loads((ROOT / "tests" / "fixtures" / "gpaf_reference.json").read_text())["networks"]


def params(module: torch.nn.Module) -> list[list]:
    return [[name, list(p.shape)] for name, p in module.named_parameters()]


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("key,build", [
    ("encoder_c2505a7", lambda: ResNetEncoder(1)),  # GPAFflower models.py:277-367, get_resnet18_encoder(64)
    ("classifier_c2505a7", lambda: MLPClassifier(64, 2)),  # models.py:448-463
    ("discriminator_c2505a7", lambda: SigmoidDiscriminator(64)),  # models.py:418-435
    ("generator_6aea7f8_c2_d64", lambda: NoiseLabelGenerator(2)),  # update-gpaf GlobalGenerator(64, 2, 256, 64)
    ("moon_7f48809_in1_c2", lambda: build_model("moon_resnet_gpaf", 1, 2, 28)),  # update-gpaf ModelMOON(256, 2)
    ("swin_c2505a7_in1_c2", lambda: build_model("swin_gpaf", 1, 2, 28)),  # GPAFflower models.py:53-89
])
def test_networks_have_the_authors_parameter_names_shapes_and_counts(key, build):
    net = build()
    assert params(net) == REF[key]["params"]
    assert count(net) == REF[key]["total_params"]


def test_dn_has_the_authors_layer_shapes():
    """D_n: 64 -> 256 -> 128 -> 1 logit (update-gpaf GlobalDiscriminator); our module names its Sequential ``net``."""
    dn = LatentDiscriminator(64)
    assert [s for _, s in params(dn)] == [s for _, s in REF["dn_6aea7f8_d64"]["params"]]
    assert count(dn) == REF["dn_6aea7f8_d64"]["total_params"] == 49665


def test_gpaf_builds_the_authors_client_and_generator_by_default():
    """method_model.gpaf.name gpaf_resnet18 + the declared defaults: the authors' E_s, C_s and G_w (64-d noise);
    D_s ends in a Sigmoid; in eval mode the classifier reads mu (their encoder returns mu when not training)."""
    method = GPAF()
    assert (method.p["generator_arch"], method.p["noise_dim"], method.p["latent_dim"]) == ("authors", 64, 64)
    model = method.build_model(toy_spec("gpaf", model="gpaf_resnet18"))
    assert count(model.encoder) == REF["encoder_c2505a7"]["total_params"] == 11497024
    assert count(model.classifier) == REF["classifier_c2505a7"]["total_params"] == 165122
    assert count(model.generator) == REF["generator_6aea7f8_c2_d64"]["total_params"] == 88256
    assert model.generator.noise_proj[0].in_features == 64
    assert isinstance(SigmoidDiscriminator(64).model[-1], torch.nn.Sigmoid)
    tiny = method.build_model(toy_spec("gpaf", model="gpaf_resnet18_tiny")).eval()
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(tiny(x), tiny.classifier(tiny.encoder(x)[0]))
    with pytest.raises(ValueError, match="method_model.gpaf.name"):
        method.build_model(toy_spec("gpaf", model="swin_gpaf"))


def test_swin_drop_rates_windows_and_the_dropout_after_the_patch_embedding():
    """Microsoft's drop_rate 0.1 is four dropouts: after the patch embedding (swin_transformer.py:546, 597), after
    the attention projection and twice in the MLP; drop path rises linearly to 0.2 over the 10 blocks; stage 2's
    7 x 7 tokens fit one window, so no block there shifts."""
    model = build_model("swin_gpaf", 1, 2, 28)
    ref = REF["swin_c2505a7_in1_c2"]
    blocks = [b for stage in model.layers for b in stage.blocks]
    assert [b.drop_path1.drop_prob if hasattr(b.drop_path1, "drop_prob") else 0.0 for b in blocks] == \
        pytest.approx(ref["drop_path_per_block"], abs=1e-7)
    assert [[list(b.window_size), list(b.shift_size)] for b in blocks] == [w[2:] for w in ref["window_shift_per_block"]]
    assert all(b.attn.proj_drop.p == 0.1 and b.mlp.drop1.p == 0.1 and b.mlp.drop2.p == 0.1 for b in blocks)
    assert all(b.attn.attn_drop.p == 0.0 for b in blocks) and model.head.drop.p == 0.0
    assert model.pos_drop.p == 0.1
    seen = []
    model.pos_drop.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    model.eval()(torch.rand(2, 1, 28, 28))
    assert seen == [torch.Size([2, 14, 14, 96])]  # right after the 2 x 2 patch embedding
    assert model.embed(torch.rand(2, 1, 28, 28)).shape == (2, ref["num_features"])


def test_swin_dropout_draws_from_its_generator_not_the_global_one():
    model = build_model("swin_gpaf_tiny", 1, 2, 28).train()
    x = torch.rand(4, 1, 28, 28)

    def out(seed: int) -> torch.Tensor:
        model.set_dropout_generator(torch.Generator().manual_seed(seed))
        return model(x)

    state = torch.get_rng_state()
    a, b, c = out(5), out(5), out(6)
    assert torch.equal(torch.get_rng_state(), state)  # the global stream is left as it was
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_the_engine_gives_each_client_its_dropout_generator(breast_domains_dir):
    from fedmedbench.fl.determinism import seeded_generator
    from fedmedbench.fl.engine import federation as fed
    from fedmedbench.fl.spec import RunSpec

    d = breast_domains_dir
    spec = RunSpec(run_dir=str(d / "swin"), study="t", dataset="breastmnist", setting="s", method="fedavg", seed=3,
                   partition_path=str(d / "p.json"), sources={"a": str(d / "b.npz"), "b": str(d / "b.npz"),
                                                              "base": str(d / "b.npz")},
                   image_size=28, model="swin_gpaf_tiny", device="cpu",
                   train={"rounds": 1, "local_epochs": 1, "batch_size": 32, "lr": 1e-3})
    job = fed.Job(fed.resolve_data_shapes(spec))
    arrays = job.arrays({k: v for k, v in job.new_model().state_dict().items()})
    ctx, _ = fed._client_context(job, 1, 2, arrays, 1)
    want = seeded_generator(3, 2, 1, fed.DROPOUT_STREAM).initial_seed()
    assert ctx.model.dropout_generator.initial_seed() == want


def test_the_grid_trains_each_method_on_its_authors_network():
    """Study gpaf: FedAvg, FedDG, centralized on the small Swin from scratch (GPAFflower main.py:244-257; FedDG has no
    code in any snapshot, so it takes FedAvg's), GPAF on its ResNet client, MOON on ModelMOON; gpaf_pathmnist keeps
    the paper's VAE network for all (no runnable PathMNIST snapshot)."""
    from fedmedbench.studies import grid

    studies = yaml.safe_load((ROOT / "config" / "studies" / "gpaf.yaml").read_text())["studies"]
    models = {m: grid.run_model({"method_model": {}, **studies["gpaf"]}, m) for m in studies["gpaf"]["methods"]}
    assert {m: v["name"] for m, v in models.items()} == {
        "fedavg": "swin_gpaf", "feddg": "swin_gpaf", "centralized": "swin_gpaf", "gpaf": "gpaf_resnet18",
        "moon": "moon_resnet_gpaf"}
    assert not any(v.get("weights") for v in models.values())  # no pretrained start
    path = studies["gpaf_pathmnist"]
    assert {m: grid.run_model(path, m)["name"] for m in path["methods"]} == {
        "fedavg": "gpaf_cnn", "feddg": "gpaf_cnn", "centralized": "gpaf_cnn", "gpaf": "gpaf_cnn", "moon": "gpaf_cnn_moon"}
