"""The seam between the product and the lab (gems_fl.extensions): the lab's subcommand and
study are found through their entry points, and a missing study says what to install."""

from __future__ import annotations

import pytest

from gems_fl.extensions import StudyInputs, commands, study


def test_the_lab_subcommand_is_found_and_parsed():
    from gems_fl.running.cli import build_parser

    assert [c.name for c in commands()] == ["reproduce"]
    args = build_parser().parse_args(["reproduce", "--quick", "--studies", "1"])
    assert (args.command, args.quick, args.studies) == ("reproduce", True, "1")


def test_the_fine_tuning_study_is_the_labs_curve(monkeypatch):
    import gems_lab.fine_tuning as lab

    seen = {}
    monkeypatch.setattr(lab, "fine_tuning_curve", lambda *a: seen.setdefault("args", a))
    from gems_fl.settings import Settings

    config = Settings(tune_curve="100,200", baselines="all").to_config()
    inputs = StudyInputs("gems", ["local"], "averaged", list, ("px", "py"), ("tx", "ty"), config)
    study("fine-tuning")(inputs)
    *models, settings = seen["args"]
    assert models == ["gems", ["local"], "averaged", list, ("px", "py"), ("tx", "ty")]
    assert settings == Settings(tune_curve="100,200", baselines="all")


def test_a_study_that_is_not_installed_names_what_to_install():
    with pytest.raises(LookupError, match="'no-such-study' study is not installed.*gems_lab"):
        study("no-such-study")
