"""``engine.deterministic``: a job asks torch, cuDNN and cuBLAS for deterministic kernels; runtime only.
(That it makes a GPU rerun the same bits is checked on a GPU: ``tests/test_cuda.py``.)"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch
import yaml
from snakemake.utils import validate
from test_config import MICRO, SCHEMA
from test_device_arrays import make_spec

from fedmedbench.fl.determinism import CUBLAS_WORKSPACE_CONFIG
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.engine.job import Job
from fedmedbench.fl.spec import RunSpec, for_job, result_params


@pytest.fixture
def torch_flags(monkeypatch):
    """Restores the process-wide flags a deterministic job sets."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]


def _flags() -> tuple:
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))


def test_a_deterministic_job_asks_for_deterministic_kernels(blood_dir, torch_flags):
    Job(make_spec(blood_dir, "fedavg", "det", deterministic=True))
    assert _flags() == (True, True, True, False, CUBLAS_WORKSPACE_CONFIG)


def test_a_job_without_it_leaves_the_process_flags_alone(blood_dir, torch_flags):
    Job(make_spec(blood_dir, "fedavg", "nondet"))
    assert _flags() == (False, False, False, True, None)


def test_on_the_cpu_it_changes_no_bit(blood_dir, torch_flags):
    engine.run(make_spec(blood_dir, "fedsam", "plain"), log=lambda m: None)
    engine.run(make_spec(blood_dir, "fedsam", "det", deterministic=True), log=lambda m: None)
    plain, det = (torch.load(blood_dir / f"run-fedsam-{t}" / "model.pt", weights_only=True) for t in ("plain", "det"))
    assert plain.keys() == det.keys() and all(torch.equal(plain[k], det[k]) for k in plain)


def test_a_workspace_setting_of_the_user_is_kept(blood_dir, torch_flags, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    Job(make_spec(blood_dir, "fedavg", "det", deterministic=True))
    assert _flags()[-1] == ":16:8"


def test_it_is_a_runtime_option_outside_the_run_hash(blood_dir):
    spec = make_spec(blood_dir, "fedavg", "h")
    on = RunSpec.from_dict({**spec.to_dict(), "deterministic": True})
    assert on.run_hash() == spec.run_hash()  # a finished job is not rerun, a checkpoint is resumed
    assert "deterministic" not in result_params(on.to_dict())  # not in the rule's params either
    cfg = copy.deepcopy(MICRO)
    cfg["engine"] = {"deterministic": True}
    validate(cfg, SCHEMA)
    assert for_job(spec.to_dict(), 2, cfg).deterministic is True
    validate(plain := copy.deepcopy(MICRO), SCHEMA)
    assert plain["engine"]["deterministic"] is False and for_job(spec.to_dict(), 2, plain).deterministic is False


def test_the_schema_rejects_a_non_boolean():
    cfg = copy.deepcopy(MICRO)
    cfg["engine"] = {"deterministic": "yes"}
    with pytest.raises(Exception, match="deterministic"):
        validate(cfg, SCHEMA)


def test_the_demo_config_leaves_it_off():
    cfg = yaml.safe_load(Path(SCHEMA).with_name("config.yaml").read_text())
    validate(cfg, SCHEMA)
    assert cfg["engine"]["deterministic"] is False


#: (run seed, round, client id) -> the client generator's seed and first three draws of randint(0, 2**31 - 1),
#: as the generators of the runs so far drew them (SeedSequence([seed, rnd, pid]).generate_state(1)[0])
CLIENT_DRAWS = {(0, 1, 0): (3964924996, [536259671, 2122385505, 775548124]),
                (0, 1, 3): (1680122868, [1230907790, 548896888, 1817753194]),
                (7, 12, 5): (3365750739, [1715674586, 1521926389, 1627278260]),
                (123456, 200, 99): (3154092539, [1392039852, 1692955276, 187711356])}
#: (run seed, round) -> the same for the validation reads' generator (stream 2**31 - 1)
VALIDATION_DRAWS = {(0, 1): (4073574703, [1559243224, 382608614, 417358594]),
                    (0, 4): (2848028078, [1156805562, 2128324726, 2024376022]),
                    (7, 12): (3220046835, [624337654, 912832649, 652904802]),
                    (123456, 200): (1765904179, [1361671356, 284993181, 1956412460])}


def _seed_and_draws(g: torch.Generator) -> tuple[int, list[int]]:
    return g.initial_seed(), torch.randint(0, 2**31 - 1, (3,), generator=g).tolist()


def test_seeded_generators_draw_as_the_runs_so_far():
    """One seeding for the clients' and the validation reads' generators; each draws what it drew before."""
    from fedmedbench.fl.augment import validation_generator
    from fedmedbench.fl.determinism import seeded_generator
    from fedmedbench.fl.engine.federation import client_generator

    for keys, expected in CLIENT_DRAWS.items():
        assert _seed_and_draws(seeded_generator(*keys)) == expected, keys
        assert _seed_and_draws(client_generator(*keys)) == expected, keys
    for (seed, rnd), expected in VALIDATION_DRAWS.items():
        assert _seed_and_draws(validation_generator(seed, rnd)) == expected, (seed, rnd)
        assert _seed_and_draws(seeded_generator(seed, rnd, 2**31 - 1)) == expected, (seed, rnd)


#: (run seed, round) -> the GPAF server generator's seed and first three draws, as its runs so far drew them
SERVER_DRAWS = {(0, 1): (1488179704, [1693505914, 1015508590, 1088521370]),
                (7, 12): (2622202218, [1640882864, 1603378906, 774920155])}


def test_the_gpaf_server_generator_draws_as_its_runs_so_far():
    from fedmedbench.fl.methods.gpaf import server_generator

    for (seed, rnd), expected in SERVER_DRAWS.items():
        assert _seed_and_draws(server_generator(seed, rnd)) == expected, (seed, rnd)
