# Early-stopping study report: glue from the rules (report_earlystop.smk) to fedmedbench.studies.earlystop.runs
# (checks, taus, targets).
import fedmedbench.studies.earlystop.runs as ES


def _check_earlystop_config():
    for sname, study in config["studies"].items():
        if study["settings"]:
            ES.check_config(sname, study)


_check_earlystop_config()


def es_taus(study):
    """Every tau the early-stopping report evaluates (sweep, study tau, Table 2 tau)."""
    return ES.taus(config["studies"][study])


def es_figure_setting(study):
    return ES.figure_setting(config["studies"][study])


def earlystop_targets(study):
    return ES.targets(study, config["studies"][study], TAG)
