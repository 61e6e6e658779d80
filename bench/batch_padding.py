"""The samples a batched round (``train.batch_clients``) computes per useful one, for each setting of a study's grid,
from its partitions' client sizes alone (nothing is trained).

For each dataset and setting of the study (``config/studies/earlystop.yaml``): the partition of each seed, built with
the study's draws (``random_draws``) on labels of the dataset's official split sizes (the sizes of a Dirichlet,
pathological or quantity-skew split do not depend on which label a sample has), each round's clients as the
federation samples them, each client's batches (local epochs of its data cut in ``train.batch_size`` pieces),
and the round's plan as ``fl/methods/_batch_plan.py`` makes it: the samples the batched calls compute (padding
included) over those the clients train on, and the calls a step. ``one call`` pads every stepping client to the
step's largest batch (as before the groups); ``grouped`` is the plan the training uses. ``seeds together``: the
study's seeds' clients of a round in one call (``train.seeds_together``).

    python bench/batch_padding.py [--config config/studies/earlystop.yaml] [--rounds 500] [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from _cli import positive  # noqa: E402
from _report import emit, git_head  # noqa: E402
from grid_cost import load_config  # noqa: E402

from fedmedbench.data.medmnist import dataset_info  # noqa: E402
from fedmedbench.fl.methods._batch_plan import PADDING, BatchPlan  # noqa: E402
from fedmedbench.fl.training import steps_for_epochs  # noqa: E402
from fedmedbench.partition import replay  # noqa: E402
from fedmedbench.partition import schemes as P  # noqa: E402
from fedmedbench.studies import grid  # noqa: E402

#: the plans compared: one call a step (every client padded to the step's largest batch), and the training's
PLANS = {"one_call": float("inf"), "grouped": PADDING}


def batch_lengths(n: int, batch_size: int, steps: int) -> list[int]:
    """The lengths of a client's ``steps`` batches (``training.batch_indices``: each epoch's permutation of its ``n``
    samples cut in ``batch_size`` pieces, the last one short)."""
    epoch = [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])
    return [epoch[s % len(epoch)] for s in range(steps)]


def client_sizes(dataset: str, setting: dict, seed: int, draws: str) -> list[int]:
    """The training sizes of the setting's clients for ``seed`` (the partition built as the workflow builds it)."""
    info = dataset_info(dataset)
    labels = {s: np.arange(info.n_samples[s]) % info.n_classes for s in ("train", "val", "test")}
    doc = P.build_partition(labels, setting["scheme"], int(setting["num_clients"]), seed, setting.get("params", {}),
                            num_classes=info.n_classes, draws=draws)
    return [len(c["train"]) for c in doc["clients"]]


def round_clients(draws: str, seed: int, num_clients: int, per_round: int, rounds: int) -> list[list[int]]:
    """Each round's partition ids as ``Federation.sample`` draws them (sorted), rounds 1 .. ``rounds``."""
    sequence = replay.client_sequence(draws, seed, num_clients, per_round) if draws == "reference" else None
    out = []
    for rnd in range(1, rounds + 1):
        if per_round == num_clients:
            out.append(list(range(num_clients)))
        elif sequence is not None:
            out.append(sorted(sequence.clients(rnd)))
        else:
            rng = np.random.default_rng([seed, rnd, 1])
            out.append(sorted(rng.choice(num_clients, size=per_round, replace=False).tolist()))
    return out


def plan_of(sizes: list[int], batch_size: int, epochs: float, padding: float) -> BatchPlan:
    """The plan of clients of ``sizes`` (index rows of the right lengths: the plan reads only their lengths)."""
    base = np.arange(batch_size)
    draws = [[base[:w] for w in batch_lengths(n, batch_size, steps_for_epochs(n, epochs, batch_size))] for n in sizes]
    return BatchPlan.of_draws(draws, sizes, padding)


def setting_padding(config: dict, study: str, dataset: str, setting: str, rounds: int | None = None,
                    seeds: list[int] | None = None) -> dict:
    """Computed over useful samples and calls a step of the setting's rounds, each plan, a job's round alone and
    the seeds' rounds together."""
    st = config["studies"][study]
    s = st["settings"][setting]
    train = grid.run_train(st, setting, st["methods"][0])
    batch, epochs = int(train["batch_size"]), float(train["local_epochs"])
    rounds = int(train["rounds"]) if rounds is None else rounds
    seeds = list(st["seeds"]) if seeds is None else seeds
    draws = st.get("random_draws", "project")
    per_seed = []
    for seed in seeds:
        sizes = client_sizes(dataset, s, seed, draws)
        per_round = int(st.get("clients_per_round") or len(sizes))
        per_seed.append([[sizes[c] for c in ids] for ids in round_clients(draws, seed, len(sizes), per_round, rounds)])
    row = {"bench": "batch_padding", "study": study, "dataset": dataset, "setting": setting, "seeds": seeds,
           "rounds": rounds, "batch_size": batch, "local_epochs": epochs, "padding_bound": PADDING}
    for together, calls in (("job", [r for runs in per_seed for r in runs]),
                            ("seeds_together", [sum(rs, []) for rs in zip(*per_seed, strict=True)])):
        for name, padding in PLANS.items():
            useful = computed = steps = n_calls = 0
            for sizes in calls:
                plan = plan_of(sizes, batch, epochs, padding)
                useful, computed = useful + plan.useful, computed + plan.computed
                steps, n_calls = steps + plan.steps, n_calls + plan.calls
            row[f"{together}_{name}_computed_over_useful"] = round(computed / useful, 4)
            row[f"{together}_{name}_calls_per_step"] = round(n_calls / steps, 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "studies" / "earlystop.yaml")
    ap.add_argument("--study", default="earlystop")
    ap.add_argument("--rounds", type=positive, help="rounds of each run (default: the study's budget)")
    ap.add_argument("--settings", nargs="+", help="settings of the study (default: all)")
    ap.add_argument("--out", type=Path, help="append the rows as JSON lines")
    args = ap.parse_args()
    config = load_config(args.config)  # with the schema's defaults, as the workflow reads it
    studies = config.get("studies") or {}
    if args.study not in studies:
        raise SystemExit(f"batch_padding: {args.config}: no study {args.study!r} ({', '.join(studies) or 'none'})")
    st = studies[args.study]
    unknown = sorted(set(args.settings or []) - set(st["settings"]))
    if unknown:
        raise SystemExit(f"batch_padding: --settings {' '.join(unknown)}: not a setting of {args.study} "
                         f"({', '.join(st['settings'])})")
    code = git_head()
    for dataset in st["datasets"]:
        for setting in args.settings or list(st["settings"]):
            row = {**setting_padding(config, args.study, dataset, setting, args.rounds), "code": code}
            emit([row], args.out)
            print(f"{dataset} {setting}: computed / useful {row['job_one_call_computed_over_useful']} one call a step, "
                  f"{row['job_grouped_computed_over_useful']} grouped ({row['job_grouped_calls_per_step']} calls a "
                  f"step); seeds together {row['seeds_together_one_call_computed_over_useful']} / "
                  f"{row['seeds_together_grouped_computed_over_useful']} "
                  f"({row['seeds_together_grouped_calls_per_step']} calls a step)", flush=True)


if __name__ == "__main__":
    main()
