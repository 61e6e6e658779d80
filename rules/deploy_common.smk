# A run that cannot be deployed (a centralized method, client_augmentation, FedST's site_finetune) is
# refused while planning, in one line naming the target (fedmedbench.deploy.deployable).
from fedmedbench.deploy.deployable import why_not as why_not_deployable


def deployable(spec_of, target):
    """``spec_of`` (a rule's params function) for a deploy target: the run's spec, or one line and exit."""

    def spec(wildcards):
        s = spec_of(wildcards)
        source = METHOD_SOURCES.get(s["method"])
        why = why_not_deployable(s, centralized=source is not None and source.centralized())
        if why:
            print(f"error: {target.format(**wildcards)}: {why}", file=sys.stderr, flush=True)
            raise SystemExit(1)
        return s

    return spec
