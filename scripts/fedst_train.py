"""Snakemake entry: one FedST-study run on Flower, then the deployed model's evaluation
(out-of-federation site, unseen binary set, communication, FPS) into deploy.json."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.compat import limit_threads
from fedmedbench.studies.fedst.deploy import deploy_eval
from fedmedbench.studies.fedst.runs import pin_initial_model
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import for_job
from fedmedbench.workflow.runlock import run_lock
from fedmedbench.workflow.runlog import log_to
from fedmedbench.weights import fetch as weights

with log_to(snakemake.log[0]) as log:
    limit_threads(snakemake.threads)
    # runtime fields (threads, backend, ...) from the job and config, not params
    spec = pin_initial_model(for_job(snakemake.params.spec, snakemake.threads, snakemake.config))
    spec = weights.pin(spec, snakemake.input.weights)  # encoder / CLIP files verified, hashes in the run hash
    with run_lock(spec.run_dir, log=snakemake.log[0]):  # a second process (e.g. after --unlock) refuses this run
        federation = engine.run(spec, log=log)
        d = dict(snakemake.params.deploy)
        out = deploy_eval(federation.spec, federation.final_state, d["outfed_site"], d["unseen_site"], int(d["fps_clips"]))
        out["data_origin"] = spec.data_origin
        io.write_json(snakemake.output.deploy, out)
        engine.complete(spec, log=log)  # after deploy_eval, which reads the sites' final client states
        log(f"deployed model: outfed dice {out['outfed_dice']:.4f}, unseen dice {out['unseen_dice']:.4f}, "
            f"{out['comm_mb_per_round']:.2f} MB/round, {out['fps']:.1f} FPS")
        log("done")
