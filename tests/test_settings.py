"""Run settings: pyproject keys and Settings fields agree; bad values name the key."""

from __future__ import annotations

from dataclasses import fields

import pytest

from gems_fl.running.cli import main
from gems_fl.settings import LAB_KEY, Settings, SettingsError, lab_keys, product_keys
from tests.helpers import app_defaults


def test_pyproject_config_and_settings_have_the_same_keys_and_defaults():
    """The app's config holds the product's settings and the one ``lab`` text; the
    research switches are the other fields."""
    defaults = app_defaults()
    assert set(defaults) == set(product_keys()) | {LAB_KEY}
    assert set(product_keys()) | set(lab_keys()) == {f.name.replace("_", "-")
                                                     for f in fields(Settings)}
    assert len(defaults) <= 46  # 45, and categories: the declaration dp-epsilon requires
    assert Settings.from_run_config(defaults) == Settings()


def test_the_lab_text_sets_research_switches():
    settings = Settings.from_run_config(
        {**app_defaults(), "lab": "tune-curve=100,200 tune-stop=fixed tune-epochs=7 "
                                  "tune-fresh=false gram-ridge=0.01 profile='paper'"})
    assert (settings.tune_sizes, settings.tune_stop, settings.tune_epochs) == ([100, 200], "fixed", 7)
    assert (settings.tune_fresh, settings.gram_ridge, settings.profile) == (False, 0.01, "paper")
    # the same switches given directly (in-process callers) make the same settings
    direct = Settings.from_run_config({"tune-curve": "100,200", "tune-stop": "fixed",
                                       "tune-epochs": 7, "tune-fresh": False,
                                       "gram-ridge": 0.01, "profile": "paper"})
    assert direct == settings
    assert "lab" not in settings.to_config()  # the trial keys see the switches, not the text


@pytest.mark.parametrize("text, message", [
    ("eps=0.5", "'eps' is a product setting, not a research switch"),
    ("tune-epoch=5", "'tune-epoch' is not a research switch \\(did you mean 'tune-epochs'"),
    ("tune-epochs=many", "tune-epochs=many is not int like its default 5"),
    ("tune-fresh=yes", "tune-fresh=yes is not bool"),
    ("tune-curve", "'tune-curve' is not key=value"),
])
def test_a_bad_lab_text_names_the_key(text, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_run_config({"lab": text})


def test_a_lab_value_takes_its_switchs_type_and_a_dict_folds_back_into_lab():
    from gems_fl.settings.lab import fold_lab

    settings = Settings.from_run_config({"lab": "class-grams=true refine-l2=0.003 "
                                                "feature-cache-dir='/a b'"})
    assert (settings.class_grams, settings.refine_l2, settings.feature_cache_dir) == \
        ("true", 0.003, "/a b")  # text switches stay text, whatever they look like
    config = {"model": "mlp", "clusters": 6, "tune-fresh": False, "class-grams": "true",
              "feature-cache-dir": "C:\\a b\\c's", "lab": "tune-epochs=3"}
    folded = fold_lab(config, lab_keys())
    assert set(folded) == {"model", "lab"} and folded["lab"].startswith("tune-epochs=3 ")
    assert Settings.from_run_config(folded) == Settings.from_run_config(
        {**{k: v for k, v in config.items() if k != "lab"}, "tune-epochs": 3})


def test_a_switch_given_twice_with_two_values_is_refused():
    with pytest.raises(SettingsError, match="tune-epochs is given twice"):
        Settings.from_run_config({"tune-epochs": 3, "lab": "tune-epochs=4"})


def test_cli_points_a_research_switch_to_the_lab_setting(capsys):
    assert main(["run", "--run-config", "tune-curve='100,200'"]) == 2
    err = capsys.readouterr().err
    assert "research switch(es)" in err and "lab='tune-curve=100,200'" in err


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("eps", 1.5, "eps=1.5 must be in"),
        ("space", "cube", "space='cube' is not one of ball, ellipsoid, gram"),
        ("dataset", "cifar", "dataset='cifar' is not one of"),
        ("num-directions", 0, "num-directions=0 must be > 0"),
        ("delta", 5000.0, "delta=5000.0 must be smaller than r-max"),
        ("ellipsoid-c", 0.0, "ellipsoid-c=0.0 must be in \\(0, 1\\]"),
        ("num-directions", "many", "num-directions='many' has type str, expected int"),
        ("evaluate-on-server", 1, "evaluate-on-server=1 has type int, expected bool"),
        ("public-samples", -1, "public-samples=-1 must be >= 0"),
        ("no-intersection", "guess", "no-intersection='guess' is not one of"),
    ],
)
def test_invalid_values_name_the_key(key, value, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_run_config({**app_defaults(), key: value})


def test_ints_are_accepted_for_floats():
    assert Settings.from_run_config({"eps": 1}).eps == 1.0


def test_cli_rejects_a_bad_setting_before_starting_anything(capsys):
    assert main(["run", "--nodes", "2", "--run-config", "eps=2.0"]) == 2
    assert "eps=2.0" in capsys.readouterr().err


def test_cli_rejects_an_unknown_setting_with_the_closest_names(capsys):
    assert main(["run", "--run-config", "epsilon=0.5"]) == 2
    err = capsys.readouterr().err
    assert "unknown run setting(s) 'epsilon' (did you mean 'dp-epsilon' or 'eps'?)" in err
    assert main(["run", "--run-config", "standardise='federated' zzzz=1"]) == 2
    err = capsys.readouterr().err
    assert "'standardise' (did you mean 'standardize'?)" in err and "'zzzz';" in err
    assert "local-patience" not in err  # not every name: the closest ones


def test_readme_documents_every_setting():
    import re

    from gems_fl.settings.doc import user_keys
    from tests.helpers import ROOT

    def documented(path):
        rows = [line for line in (ROOT / path).read_text().splitlines() if line.startswith("| `")]
        return {key for line in rows for key in re.findall(r"`([a-z0-9-]+)`", line.split("|")[1])}

    assert set(user_keys()) <= documented("README.md")
    every = set(product_keys()) | set(lab_keys())
    assert every <= documented("docs/settings.md"), sorted(every - documented("docs/settings.md"))
    assert "lab='" in (ROOT / "docs" / "settings.md").read_text()  # how the switches are set


# ---- what the nodes receive ---------------------------------------------------------------


def test_settings_declare_meaning_constraint_and_scope():
    from gems_fl.settings import node_keys

    nodes = set(node_keys())
    # server-side paths and the server's own choices never leave the server
    assert {"output-dir", "public-data", "min-replies", "round-timeout", "gram-point",
            "gram-weighting", "gram-ridge", "no-intersection", "tune-lr", "clusters",
            "max-width", "evaluate-on-server"}.isdisjoint(nodes)
    assert {"dataset", "eps", "space", "seed", "local-lr", "standardize"} <= nodes
    for f in fields(Settings):
        assert f.metadata["meaning"], f.name


def test_a_node_holds_only_node_settings_and_fails_loudly_on_the_rest():
    node = Settings.from_node_config(Settings(dataset="digits", eps=0.5).for_nodes())
    assert node.eps == 0.5 and node.output_dir is None and node.min_replies is None
    with pytest.raises(SettingsError, match="eps=2.0 must be in"):
        Settings.from_node_config({"eps": 2.0})


def test_nodes_on_their_own_files_receive_none_of_the_servers_data_paths():
    from gems_fl.settings import PARTITION_PATHS

    paths = {"data_dir": "/srv/server-data", "feature_cache_dir": "/srv/cache"}
    assert set(PARTITION_PATHS) <= set(Settings(dataset="digits", **paths).for_nodes())
    sent = Settings(dataset="node-files", evaluate_on_server=False, **paths).for_nodes()
    assert set(PARTITION_PATHS).isdisjoint(sent)
    assert "/srv" not in repr(sent)


def test_every_message_to_the_nodes_carries_only_node_settings(tmp_path):
    from client_app import app as client_app
    from gems_fl.data.agreement import CLASSES_KEY, FEATURES_KEY
    from gems_fl.protocol.rounds import ROUND_NAME_KEY
    from gems_fl.protocol.wire import REFINE_KEY, ROUND_KEY, TEMPERATURES_KEY
    from gems_fl.settings import node_keys
    from tests.helpers import run_in_process

    seen: dict[str, set[str]] = {}

    def recording_app(msg, context):
        config = msg.content.config_records.get("config")
        if config is not None:
            seen.setdefault(msg.metadata.message_type, set()).update(config.keys())
        return client_app(msg, context)

    run_in_process(3, tmp_path, client=recording_app, **{"model": "mlp", "hidden": "8",
                                                        "clusters": 8})
    assert set(seen) == {"query", "train", "evaluate"}
    # the settings nodes read, the data agreement, and the protocol's own keys (the round's
    # name, the layer round's index, the selection round's index 0 and its logit scales)
    allowed = set(node_keys()) | {FEATURES_KEY, CLASSES_KEY, ROUND_NAME_KEY, ROUND_KEY,
                                  REFINE_KEY, TEMPERATURES_KEY}
    for kind, keys in seen.items():
        assert keys <= allowed, (kind, sorted(keys - allowed))
        assert "output-dir" not in keys and "public-data" not in keys


@pytest.mark.parametrize("secure", [False, True])
def test_a_logistic_runs_rounds_carry_what_its_node_code_reads_with_the_plan_resolved(
        tmp_path, secure):
    """Nodes of a logistic Gram run receive no MLP, ellipsoid or DP setting; ``gram-rank``
    and ``class-grams`` come resolved by the run plan: class Gram matrices travel on a
    small layer, under secure aggregation too (as SecAgg+ sums per class)."""
    from client_app import app as client_app
    from tests.helpers import run_in_process

    seen: dict[str, dict] = {}

    def recording_app(msg, context):
        config = msg.content.config_records.get("config")
        if config is not None and msg.metadata.message_type != "query":
            seen.setdefault(msg.metadata.message_type, dict(config))
        return client_app(msg, context)

    results = run_in_process(3, tmp_path, client=recording_app, **{"secure-aggregation": secure})
    plan = results["plan"]
    for kind in ("train", "evaluate"):
        keys = seen[kind]
        assert not {"hidden", "dropout", "eps-neuron", "neuron-delta", "neuron-criterion",
                    "ellipsoid-c", "ellipsoid-floor", "dp-delta", "dp-clip",
                    "dp-seeded-noise"} & set(keys), kind
        assert keys["gram-rank"] == plan["gram_rank"] == 0  # digits: 65 x 65, sent whole
        assert keys["class-grams"] == "true"
        assert plan["class_grams"] is True


def test_a_point_that_needs_class_grams_gets_them_in_the_plan_at_any_layer_size():
    from gems_fl.settings.options import node_config
    from gems_fl.settings.plan import build_plan

    settings = Settings(gram_point="gaussian")
    plan = build_plan(settings, 5, 784)  # 785 x 785: `auto` alone would not send them
    assert plan.class_grams is True and node_config(settings, plan)["class-grams"] == "true"
    plain = Settings()
    plan = build_plan(plain, 5, 784)
    assert node_config(plain, plan)["gram-rank"] == plan.gram_rank == 50


def test_a_gram_rank_at_or_above_the_matrix_size_is_refused_before_the_run():
    with pytest.raises(SettingsError, match=r"gram-rank=5000 but the Gram matrix is 65 x 65"):
        Settings(gram_rank=5000)  # digits: 64 features and the bias
    with pytest.raises(SettingsError, match="gram-rank=65"):
        Settings(gram_rank=65)
    Settings(gram_rank=64)
    Settings(gram_rank=5000, model="mlp")  # the output layer's width is known only later
    with pytest.raises(SettingsError, match="is 31 x 31"):
        Settings(dataset="node-files", num_features=30, gram_rank=31,
                 evaluate_on_server=False)


def test_gram_rank_takes_auto_or_a_whole_number_from_either_source():
    assert Settings().gram_rank == "auto"  # the default: a factor where it is smaller
    assert Settings.from_run_config({"gram-rank": 50}).gram_rank == 50
    assert Settings.from_run_config({"gram-rank": "0"}).gram_rank == 0  # --run-config text
    assert Settings.from_run_config({"gram-rank": "AUTO"}).gram_rank == "auto"
    for bad in ("-1", "half", "2.5"):
        with pytest.raises(SettingsError, match="gram-rank="):
            Settings.from_run_config({"gram-rank": bad})


def test_gram_rank_auto_sends_the_whole_matrix_where_the_sum_travels_whole():
    """SecAgg+ and the DP release carry the whole triangle, so auto's factor would only
    coarsen the space: there auto is the whole matrix, and the nodes are told so. So is
    the MLP's output layer, where the factor was not shown to keep accuracy."""
    assert Settings(secure_aggregation=True).gram_rank == 0
    assert Settings(dp_epsilon=4.0).gram_rank == 0
    assert Settings(dp_epsilon=4.0).for_nodes()["gram-rank"] in (0, "0")
    assert Settings(secure_aggregation=True, gram_rank=20).gram_rank == 20  # asked for
    assert Settings(model="mlp").gram_rank == 0  # the output layer travels whole by default
    assert Settings(model="mlp", gram_rank=32).gram_rank == 32


def test_the_paper_profile_sets_the_papers_recipe_where_the_product_default_stands():
    from gems_fl.settings.operation import PAPER_PROFILE

    paper = Settings(profile="paper")
    for key, value in PAPER_PROFILE.items():
        assert getattr(paper, key.replace("-", "_")) == value, key
    assert Settings(profile="paper", space="ball").space == "ball"  # a user's choice stands
    assert Settings().space == "gram" and Settings().baselines == "cheap"
    with pytest.raises(SettingsError, match="profile='lab' is not one of"):
        Settings(profile="lab")
    # what the nodes receive is the resolved recipe, not the profile
    nodes = Settings(profile="paper").for_nodes()
    assert nodes["ellipsoid-floor"] == "paper" and "profile" not in nodes


def test_the_estimator_takes_research_switches_either_way():
    from gems_fl.estimator import GEMSClassifier

    for settings in ({"lab": "tune-epochs=3 gram-ridge=0.01"}, {"tune-epochs": 3, "gram-ridge": 0.01}):
        config = GEMSClassifier(settings=settings).run_config()
        built = Settings.from_run_config(config)
        assert (built.tune_epochs, built.gram_ridge) == (3, 0.01)
    with pytest.raises(SettingsError, match="'tune-epoch' is not a research switch"):
        GEMSClassifier(settings={"lab": "tune-epoch=3"}).run_config()


def test_the_space_kind_is_asked_not_named():
    """settings.space_kind answers what the rest of the package asks of the kind; its
    names are those the geometry's registry builds spaces for."""
    from gems_fl.geometry.choices import SPACE_KINDS, kind_traits
    from gems_fl.geometry.kinds import space_kind

    assert [space_kind(name).name for name in SPACE_KINDS] == list(SPACE_KINDS)
    traits = {name: Settings(space=name).space_kind for name in SPACE_KINDS}
    assert [name for name, t in traits.items() if t.statistics] == ["gram"]
    assert [name for name, t in traits.items() if t.fisher_axes] == ["ellipsoid"]
    with pytest.raises(ValueError, match="ball, ellipsoid, gram"):
        kind_traits("sphere")


def test_a_group_of_the_settings_is_a_frozen_config_of_its_own():
    """``part`` hands a component the one group it reads, with the values as the settings
    resolved them (``standardize='auto'`` already decided), and refuses what is no group."""
    import dataclasses

    from gems_fl.settings import GROUPS, DataSettings, PrivacySettings

    settings = Settings.from_run_config({"dataset": "fashion-mnist", "dp-epsilon": 2.0,
                                         "secure-aggregation": True})
    data = settings.part(DataSettings)
    assert type(data) is DataSettings and data.dataset == "fashion-mnist"
    assert data.standardize == settings.standardize != "auto"
    assert {f.name for f in dataclasses.fields(data)} < {f.name for f in dataclasses.fields(settings)}
    privacy = settings.part(PrivacySettings)
    assert (privacy.dp_epsilon, privacy.secure_aggregation) == (2.0, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        privacy.dp_epsilon = 0.0
    assert all(settings.part(group) == settings.part(group) for group in GROUPS)
    with pytest.raises(TypeError, match="not one of the settings' groups"):
        settings.part(Settings)
