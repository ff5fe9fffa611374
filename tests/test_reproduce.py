"""The reproduction harness: plan, training cache, fine-tuning curve, FedAvg/FedProx,
byte counting, per-node eps, and the whole `gems-fl reproduce --quick`."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch

from gems_fl.data import load_dataset, parse_division
from gems_fl.learning import train as train_module
from gems_fl.learning.models import build_model
from gems_fl.learning.train import train_until_converged
from gems_fl.learning.train_cache import ENV_VAR
from gems_fl.protocol.wire import content_bytes
from gems_fl.settings import Settings, SettingsError
from gems_lab import fedavg as fedavg_module
from gems_lab.fedavg import FederatedCurve, choose_lr, run_federated, run_sgd
from gems_lab.fine_tuning import CURVE_ROWS, nested_samples
from gems_lab.reproduce import Options, expected_files
from gems_lab.reproduce.plan import build_plan
from gems_lab.reproduce.report import mean_std
from gems_lab.reproduce.report_federated import rounds_to_reach
from gems_lab.reproduce.store import TrialStore
from tests.helpers import FAST, ROOT, app_defaults, run_in_process

# --- plan -----------------------------------------------------------------------------

def test_plan_shares_trials_between_studies():
    options = Options(seeds=(0, 1))
    plan = build_plan(options)
    keys = [t.key for t in plan]
    assert len(keys) == len(set(keys))
    # The fine-tuning study runs no trial of its own: it rides on K=5 trials of 1 and 2.
    ft = [t for t in plan if 3 in t.studies]
    assert ft and all(t.studies & {1, 2} for t in ft)
    assert all(t.run_config.get("tune-curve") for t in ft)
    only = build_plan(Options(seeds=(0, 1), studies=(1,)))
    # (K=2 twice, K=3, K=5) x {ellipsoid, ball, gram} + gram ranks 5, 20, 50, 100 and auto
    # (the full matrix, the default, is the K=5 gram trial), x seeds
    assert len(only) == (4 * 3 + 5) * 2
    assert not any(t.run_config.get("tune-curve") for t in only)


def test_the_paper_profile_runs_every_trial_with_the_papers_recipe_as_separate_trials():
    product = build_plan(Options(seeds=(0,), studies=(1, 2)))
    paper = build_plan(Options(seeds=(0,), studies=(1, 2), profile="paper"))
    assert len(paper) == len(product)
    assert not {t.name for t in paper} & {t.name for t in product}
    for p, q in zip(product, paper):
        settings = Settings.from_run_config(q.run_config)
        assert (settings.ellipsoid_floor, settings.neuron_criterion, settings.tune_stop,
                settings.tune_layers, settings.tune_fresh) == ("paper", "paper", "fixed",
                                                               "last", False)
        assert settings.space == Settings.from_run_config(p.run_config).space  # kept
    with pytest.raises(ValueError, match="profile='lab'"):
        Options(profile="lab")


def test_plan_runs_gram_beside_ball_and_ellipsoid_with_both_k2_divisions():
    options = Options(seeds=(0,), studies=(1, 2, 6))
    assert options.setups() == [(2, "paper"), (2, "0,1,2,3,4/5,6,7,8,9"), (3, "paper"),
                                (5, "paper")]
    plan = build_plan(options)
    for study, model in ((1, "logistic"), (2, "mlp")):
        got = {(t.labels["K"], t.labels["division"], t.labels["space"]) for t in plan
               if study in t.studies and t.kind == "gems"
               and t.labels.get("gram_rank", "auto") == "auto"}
        assert got == {(k, d, s) for k, d in options.setups()
                       for s in ("ellipsoid", "ball", "gram")}
        split = [t for t in plan if study in t.studies and t.labels.get("division", "").startswith("0,")]
        assert split and all(Settings.from_run_config(t.run_config).label_division
                             == "0,1,2,3,4/5,6,7,8,9" and t.run_config["model"] == model
                             for t in split)
    ranks = {t.labels["gram_rank"]: t for t in plan if "gram_rank" in t.labels}
    assert set(ranks) == {5, 20, 50, 100, "auto", 0}
    assert Settings.from_run_config(ranks[20].run_config).gram_rank == 20
    assert Settings.from_run_config(ranks["auto"].run_config).gram_rank == "auto"
    assert Settings.from_run_config(ranks[0].run_config).gram_rank == 0
    assert 6 in ranks["auto"].studies, "auto, the default, is the K=5 gram trial study 6 uses"
    sgd = [t for t in plan if t.kind != "gems" and t.federated.get("optimizer") == "sgd"]
    assert {(t.kind, t.labels["model"]) for t in sgd} == {
        (s, m) for s in ("fedavg", "fedprox") for m in ("logistic", "mlp")}
    assert all(t.federated["lr_grid"] == list(options.logistic_sgd_lrs if t.labels["model"]
                                              == "logistic" else options.sgd_lrs) for t in sgd)
    assert options.sgd_lrs == (0.01, 0.03, 0.1, 0.3) and max(options.logistic_sgd_lrs) == 3.0
    adam = [t for t in plan if t.kind != "gems" and "optimizer" not in t.federated]
    assert len(adam) == 4 and all(t.labels["optimizer"] == "adam" for t in adam)
    assert "study1_gram_rank.png" in expected_files(options)


def test_plan_keys_ignore_spelled_out_defaults():
    options = Options(seeds=(0,), studies=(2, 4),
                      size_grid=((Settings().clusters, Settings().eps_neuron), (20, 0.3)))
    plan = build_plan(options)
    default_point = [t for t in plan if 4 in t.studies and 2 in t.studies]
    assert len(default_point) == 1, "the grid's default point must reuse study 2's K=5 trial"


def test_plan_puts_seeds_of_one_configuration_next_to_each_other():
    plan = build_plan(Options(seeds=(0, 1, 2), studies=(1,)))
    seeds = [t.seed for t in plan]
    assert seeds[:3] == [0, 1, 2] and seeds[3:6] == [0, 1, 2]


def test_plan_intersection_grid_gives_each_node_its_eps():
    plan = build_plan(Options(seeds=(0,), studies=(5,), intersection_eps=(0.2, 0.7)))
    assert sorted((t.node_configs[0]["eps"], t.node_configs[1]["eps"]) for t in plan) == [
        (0.2, 0.2), (0.2, 0.7), (0.7, 0.2), (0.7, 0.7)]
    assert all(t.num_nodes == 2 for t in plan)


def test_point_counts_names_the_kept_points_most_often_first():
    from gems_lab.reproduce.report import point_counts

    assert point_counts(["pooled", "gaussian", "gaussian", None]) == "gaussian 2, ? 1, pooled 1"
    assert point_counts(["lda"]) == "lda 1"


def test_mean_std_format():
    assert mean_std([0.5, 0.7]) == "0.6000 (0.1000)"
    assert mean_std([None]) == "n/a"


# --- training cache -------------------------------------------------------------------

def _train(seed: int = 0):
    rng = np.random.default_rng(0)
    x = rng.random((120, 6)).astype(np.float32)
    y = rng.integers(0, 3, 120)
    torch.manual_seed(seed)
    model = build_model("logistic", 6, 3)
    report = train_until_converged(model, x, y, lr=0.01, batch_size=16, max_epochs=8,
                                   patience=2, seed=seed)
    return model, report


def test_training_cache_returns_identical_weights_and_skips_training(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    plain, plain_report = _train()
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    calls = []
    original = train_module._run_epochs
    monkeypatch.setattr(train_module, "_run_epochs",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    first, _ = _train()
    second, second_report = _train()
    assert len(calls) == 1, "the repeated call must come from the cache"
    for a, b, c in zip(plain.parameters(), first.parameters(), second.parameters()):
        assert torch.equal(a, b) and torch.equal(b, c)
    assert second_report.epochs == plain_report.epochs
    _train(seed=1)
    assert len(calls) == 2, "another seed is another computation"


def test_training_cache_recomputes_a_damaged_entry(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    reference, _ = _train()
    (entry,) = list(tmp_path.glob("*.pt"))
    entry.write_bytes(b"not a torch file")
    again, _ = _train()
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), again.parameters()))


# --- fine-tuning curve ----------------------------------------------------------------

def test_nested_samples_are_prefixes_of_one_permutation():
    x = np.arange(50, dtype=float)[:, None]
    y = np.arange(50)
    samples = nested_samples(x, y, [5, 20], seed=3)
    assert set(samples[5][1]) <= set(samples[20][1])
    assert len(set(samples[20][1])) == 20
    with pytest.raises(ValueError, match="public pool holds 50"):
        nested_samples(x, y, [60], seed=0)


def test_tune_curve_setting_is_validated():
    assert Settings(tune_curve="100, 200", baselines="all").tune_sizes == [100, 200]
    assert Settings().tune_sizes == []
    with pytest.raises(SettingsError, match="tune-curve"):
        Settings(tune_curve="100,abc", baselines="all")
    with pytest.raises(SettingsError, match="> 0"):
        Settings(tune_curve="0,100", baselines="all")
    # the study tunes on the server: a product run's rows do not
    with pytest.raises(SettingsError, match="baselines='all'"):
        Settings(tune_curve="100")


@pytest.mark.parametrize("model", ["logistic", "mlp"])
def test_server_writes_the_fine_tuning_curve(tmp_path, model):
    results = run_in_process(3, tmp_path, model=model, hidden="8",
                             **{"tune-curve": "20,60", "baselines": "all"})
    curve = results["fine_tuning"]
    assert curve["sizes"] == [20, 60]
    assert set(curve["accuracy"]) == set(CURVE_ROWS)
    for row in CURVE_ROWS:
        assert len(curve["accuracy"][row]) == 2
        assert all(0.0 <= a <= 1.0 for a in curve["accuracy"][row])
    assert "fine_tuning" not in run_in_process(2, tmp_path / "off", space="ball")


# --- per-node settings and byte counting ------------------------------------------------

def test_a_node_can_set_its_own_eps(tmp_path):
    base = run_in_process(2, tmp_path / "a", space="ball", eps=0.3)
    mixed = run_in_process(2, tmp_path / "b", space="ball", eps=0.3,
                           node_configs=[{"partition-id": 0, "num-partitions": 2},
                                         {"partition-id": 1, "num-partitions": 2, "eps": 0.9}])
    # Replies are in canonical order, not partition order: match nodes by their names
    # (the two nodes may hold equally many samples: leftovers are spread round-robin).
    radius = lambda res: {n["name"]: n["radius"] for n in res["nodes"]}
    first, second = "partition-0", "partition-1"
    assert set(radius(base)) == {first, second}
    assert radius(mixed)[first] == radius(base)[first]  # node 0 kept the run's eps
    assert radius(mixed)[second] < radius(base)[second]  # node 1 asked for 0.9
    with pytest.raises(SettingsError, match="eps"):
        Settings().for_node({"eps": "high"})


def test_in_process_grid_counts_the_bytes_of_the_real_records(tmp_path):
    received = []

    def hook(reply):
        received.append(content_bytes(reply.content))
        return reply

    results, grid = run_in_process(3, tmp_path, reply_hook=hook, return_grid=True, space="ball")
    rounds = [e for e in grid.exchanges if e["nodes"] and e["type"] == "train"]
    assert len(rounds) == 1 and rounds[0]["nodes"] == 3
    assert rounds[0]["up"] == sum(received) > 0
    assert rounds[0]["down"] > 0
    assert results["status"] == "completed"


# --- FedAvg / FedProx -----------------------------------------------------------------

def test_fedavg_and_fedprox_learn_and_count_bytes():
    cfg = {**app_defaults(), **FAST}
    fedavg = run_federated(cfg, 3, "fedavg", num_rounds=3, local_epochs=5)
    assert fedavg.rounds == [1, 2, 3]
    assert fedavg.accuracy[-1] > 0.3, "three rounds of five epochs must learn something"
    # Each round sends the model to 3 nodes and gets 3 models back: equal per round.
    per_round = np.diff([0, *fedavg.bytes_total])
    assert len(set(per_round.tolist())) == 1 and per_round[0] > 3 * 2 * 64 * 10 * 4
    prox = run_federated(cfg, 3, "fedprox", num_rounds=3, local_epochs=5, proximal_mu=1.0)
    assert prox.accuracy != fedavg.accuracy, "the proximal term must change training"
    again = run_federated(cfg, 3, "fedavg", num_rounds=3, local_epochs=5)
    assert again.accuracy == fedavg.accuracy, "same seed and config, same result"
    with pytest.raises(ValueError, match="fedsgd"):
        run_federated(cfg, 3, "fedsgd", num_rounds=1)


def test_fedavg_mlp_is_deterministic_whatever_ran_before():
    # dropout draws from torch's global generator, which earlier work in the process moves
    cfg = {**app_defaults(), **FAST, "model": "mlp", "hidden": "16"}
    first = run_federated(cfg, 3, "fedavg", num_rounds=2, local_epochs=1)
    torch.rand(1000)
    again = run_federated(cfg, 3, "fedavg", num_rounds=2, local_epochs=1)
    assert again.accuracy == first.accuracy


def test_fedavg_sums_the_replies_in_node_order_whatever_flower_sampled_first():
    # Flower's FedAvg samples nodes with the global `random` and sums the replies in the
    # order they come; a float sum in another order gives other bits, and 100 rounds of
    # SGD turn those into other accuracies.
    cfg = {**app_defaults(), **FAST, "seed": 3}
    start = build_model("logistic", 64, 10)
    finals, orders = [], []
    for draw in (1, 2, 3, 4):
        random.seed(draw)
        grid = fedavg_module.InProcessGrid(fedavg_module.fedavg_client_app, 5, cfg)
        sent = grid.push_messages
        grid.push_messages = lambda msgs, sent=sent: sent(
            orders.append([m.metadata.dst_node_id for m in msgs]) or msgs)
        result = fedavg_module.FedAvg(fraction_evaluate=0.0).start(
            grid=grid, initial_arrays=fedavg_module.ArrayRecord(start.state_dict()),
            num_rounds=2, train_config=fedavg_module.ConfigRecord(
                {"local-epochs": 1, "optimizer": "sgd", "lr": 0.5}))
        finals.append(result.arrays.to_torch_state_dict())
    assert len({tuple(o) for o in orders}) > 1, "the draws must sample the nodes in other orders"
    for other in finals[1:]:
        assert all(torch.equal(other[k], finals[0][k]) for k in finals[0])


SGD_CFG = {**app_defaults(), **FAST, "label-division": "0,1,2,3,4/5,6,7,8,9"}


def test_sgd_local_training_changes_weights_and_differs_from_adam():
    rng = np.random.default_rng(0)
    x = rng.random((64, 6)).astype(np.float32)
    y = rng.integers(0, 3, 64)
    torch.manual_seed(0)
    start = build_model("logistic", 6, 3)
    trained = {}
    for optimizer in ("sgd", "adam"):
        model = build_model("logistic", 6, 3)
        model.load_state_dict(start.state_dict())
        train_module.fine_tune(model, x, y, epochs=2, lr=0.1, batch_size=16, seed=0,
                               optimizer=optimizer)
        trained[optimizer] = model.weight.detach().clone()
        assert not torch.equal(trained[optimizer], start.weight)
    assert not torch.equal(trained["sgd"], trained["adam"])
    with pytest.raises(ValueError, match="optimizer"):
        train_module.fine_tune(start, x, y, epochs=1, lr=0.1, batch_size=16, seed=0,
                               optimizer="rmsprop")


def test_fedavg_sgd_learns_is_deterministic_and_fedprox_term_still_acts():
    sgd = run_federated(SGD_CFG, 2, "fedavg", num_rounds=2, optimizer="sgd", lr=0.1)
    assert sgd.optimizer == "sgd" and sgd.lr == 0.1
    assert sgd.accuracy[-1] > 0.3
    adam = run_federated(SGD_CFG, 2, "fedavg", num_rounds=2)
    assert adam.accuracy != sgd.accuracy and adam.lr is None
    assert run_federated(SGD_CFG, 2, "fedavg", num_rounds=2, optimizer="sgd",
                         lr=0.1).accuracy == sgd.accuracy
    prox = run_federated(SGD_CFG, 2, "fedprox", num_rounds=2, proximal_mu=5.0,
                         optimizer="sgd", lr=0.1)
    assert prox.accuracy != sgd.accuracy, "the proximal term must change SGD training"
    with pytest.raises(ValueError, match="lr"):
        run_federated(SGD_CFG, 2, "fedavg", num_rounds=1, optimizer="sgd")


def test_sgd_learning_rate_is_chosen_on_validation_never_on_test(monkeypatch):
    grid = (0.001, 0.3)
    choice = choose_lr(SGD_CFG, 2, "fedavg", grid=grid, rounds=2)
    assert choice.lr in grid and list(choice.scores) == list(grid)
    assert choice.lr == max(grid, key=choice.scores.get)
    real = fedavg_module.load_dataset

    def garbage_test(*args, **kwargs):
        splits = real(*args, **kwargs)
        rng = np.random.default_rng(1)
        splits.test_x = rng.random(splits.test_x.shape).astype(splits.test_x.dtype)
        splits.test_y = rng.permutation(splits.test_y)
        return splits

    monkeypatch.setattr(fedavg_module, "load_dataset", garbage_test)
    again = choose_lr(SGD_CFG, 2, "fedavg", grid=grid, rounds=2)
    assert again.lr == choice.lr and again.scores == choice.scores
    # The patch does reach the test curve: the test set there is garbage.
    assert run_federated(SGD_CFG, 2, "fedavg", 2, optimizer="sgd", lr=choice.lr).accuracy[-1] < 0.3
    monkeypatch.undo()
    tuned = run_sgd(SGD_CFG, 2, "fedavg", num_rounds=2, grid=grid, tune_rounds=2)
    assert tuned.lr == choice.lr and tuned.tuning["lr"] == choice.lr
    assert tuned.tuning["val_accuracy"] == list(choice.scores.values())
    assert tuned.to_dict()["tuning"]["grid"] == list(grid)


def test_rounds_to_reach():
    curve = FederatedCurve("fedavg", [1, 2, 3], [0.2, 0.5, 0.7], [10, 20, 30], [10, 20, 30])
    assert rounds_to_reach(curve.accuracy, curve.bytes_total, 0.5) == (2, 40)
    assert rounds_to_reach(curve.accuracy, curve.bytes_total, 0.9) is None


# --- the whole command ----------------------------------------------------------------

@pytest.mark.slow
def test_reproduce_quick_writes_every_table_and_plot_with_every_row(tmp_path):  # noqa: C901
    from gems_fl.running.cli import main

    # One seed for every study keeps this end-to-end run short; the second invocation below
    # adds seed 1 for study 4 and checks every seed is reported and the resumption.
    out = tmp_path / "repro"
    assert main(["reproduce", "--quick", "--seeds", "1", "--out", str(out)]) == 0
    options = Options.quick_preset(seeds=(0,))
    for name in expected_files(options):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "README.md").read_text()
    for k in options.ks:
        assert re.search(rf"^\| {k} \|", (out / "study1_convex.md").read_text(), re.M)
        assert re.search(rf"^\| {k} \|", (out / "study2_nn.md").read_text(), re.M)
    assert "n/a" not in (out / "study1_convex.md").read_text()
    assert "n/a" not in (out / "study2_nn.md").read_text()
    fine = json.loads((out / "study3_fine_tuning.json").read_text())
    for model in ("logistic", "mlp"):
        assert fine[model]["sizes"] == list(options.tune_sizes)
        assert set(CURVE_ROWS) <= set(fine[model])
    sizes = json.loads((out / "study4_model_size.json").read_text())
    assert len(sizes["grid"]) == len(options.size_grid) and sizes["ensemble"]
    inter = json.loads((out / "study5_intersection.json").read_text())
    assert len(inter["cells"]) == len(options.intersection_eps) ** 2
    convex = json.loads((out / "study1_convex.json").read_text())
    nn = json.loads((out / "study2_nn.json").read_text())
    assert len(convex) == len(nn) == len(options.setups())
    for table, spaces in ((convex, options.spaces), (nn, options.nn_spaces)):
        for row in table.values():
            assert set(row["spaces"]) == set(spaces)
            for cell in row["spaces"].values():
                assert all(0 <= g <= a == row["K"] for g, a in
                           zip(cell["good_enough"], cell["answered"]))
    assert "h_G good enough (nodes)" in (out / "study1_convex.md").read_text()
    assert "GEMS untuned (gram)" in (out / "study2_nn.md").read_text()
    ranks = json.loads((out / "study1_gram_rank.json").read_text())["ranks"]
    assert [r["gram_rank"] for r in ranks] == [5, "auto", 0]  # fixed ranks, auto, full
    assert all(min(r["bytes_up_per_node"]) > 0 for r in ranks)
    assert all(len(r["point"]) == len(options.seeds) and None not in r["point"] for r in ranks)
    assert ranks[0]["bytes_up_per_node"][0] < ranks[-1]["bytes_up_per_node"][0]
    fed = json.loads((out / "study6_federated.json").read_text())
    for model in ("logistic", "mlp"):
        assert {"gems", "gems_gram", "fedavg", "fedprox", "fedavg-sgd", "fedprox-sgd"} <= set(fed[model])
        assert len(fed[model]["fedavg"]["accuracy_mean"]) == options.fed_rounds
        assert fed[model]["gems"]["bytes_total"] > 0
        sgd = fed[model]["fedavg-sgd"]
        assert len(sgd["accuracy_mean"]) == options.fed_rounds
        for lr, tuning in zip(sgd["lr"], sgd["tuning"]):
            assert lr in options.sgd_lrs and tuning["grid"] == list(options.sgd_lrs)
            assert tuning["lr"] == lr and len(tuning["val_accuracy"]) == len(options.sgd_lrs)
        assert {"GEMS (gram)", "GEMS tuned (gram)"} <= set(sgd["reaches"])
    assert "FedAvg" in text and "rounds" in text
    assert "FedAvg-SGD (lr=" in text and "FedAvg (Adam)" in text
    assert re.search(r"FedAvg-SGD \(lr=[^)]*\) (reaches|does not reach) GEMS \(gram\)", text)
    assert re.search(r"FedAvg-SGD \(lr=[^)]*\) (reaches|does not reach) GEMS tuned \(gram\)", text)
    dirichlet = json.loads((out / "study7_dirichlet.json").read_text())
    spec = f"dirichlet:{options.dirichlet_alphas[0]:g}"
    for model in ("logistic", "mlp"):
        cell = dirichlet[model][f"{options.dirichlet_ks[0]}:{spec}"]
        for point in options.dirichlet_points:
            assert len([a for a in cell[point]["GEMS"] if a is not None]) == len(options.seeds)
        for point in options.dirichlet_spaces:
            assert len([a for a in cell[point]["GEMS"] if a is not None]) == len(options.seeds)
        steps = cell["refined"]
        assert sorted(steps, key=int) == ["1", str(options.refine_rounds)]
        assert all(len(v["accuracy"]) == len(v["bytes"]) == len(options.seeds)
                   for v in steps.values())
        assert steps["1"]["bytes"][0] < steps[str(options.refine_rounds)]["bytes"][0]
        assert set(cell["baselines"]) == {f"{s}-sgd" for s in options.dirichlet_baselines}
        for fed in cell["baselines"].values():
            assert len(fed["accuracy_mean"]) == options.fed_rounds
            assert all(lr in options.sgd_lrs for lr in fed["lr"])
            assert set(fed["reaches"]) == {
                *(f"GEMS {p}" for p in (*options.dirichlet_spaces, *options.dirichlet_points)),
                f"refined {options.refine_rounds}", "GEMS tuned (auto)"}
    md = (out / "study7_dirichlet.md").read_text()
    assert "GEMS pooled" in md and "GEMS ellipsoid" in md
    assert re.search(r"^\| mlp \| dirichlet:[^|]+\| \d+ \| FedProx-SGD \(lr=", md, re.M)
    # A second invocation with 2 seeds for study 4 (its 2 trials a seed: the cheapest
    # study) reuses seed 0's stored trials untouched, runs only seed 1's, and reports
    # every seed.
    stored = TrialStore(out).load()
    assert sorted(p.name for p in (out / "trials").iterdir()) == [
        f"study{n}.jsonl" for n in (1, 2, 4, 5, 6, 7)]  # one file per study (3: in 1's)
    planned = {t.name for t in build_plan(Options.quick_preset(seeds=(0, 1), studies=(4,)))}
    assert main(["reproduce", "--quick", "--seeds", "2", "--studies", "4",
                 "--out", str(out)]) == 0
    now = TrialStore(out).load()
    assert set(now) - set(stored) == planned - set(stored) != set()
    assert all(now[name] == stored[name] for name in set(stored))  # untouched
    sizes = json.loads((out / "study4_model_size.json").read_text())
    assert len(sizes["grid"]) == len(options.size_grid)
    assert all(len(cell["accuracy"]) == 2 for cell in sizes["grid"])
    assert len(sizes["ensemble"]["accuracy"]) == 2


def test_tuning_pool_is_the_public_split_no_node_uses():
    from gems_fl.evaluation.server_data import load_server_data
    from gems_fl.settings.options import server_data_options

    settings = Settings(dataset="digits", seed=0)
    data, meta, _ = load_server_data(server_data_options(settings), parse_division("paper", 5, 10))
    splits = load_dataset("digits", seed=0)
    np.testing.assert_array_equal(data.with_all_rows().pool_x, splits.public_x)
    np.testing.assert_array_equal(data.pool_y, splits.public_y)
    # Nodes draw only from the train and validation splits, disjoint from public
    # (test_data.test_digits_split_sizes_and_disjointness).
    assert meta["node_train_total"] <= len(splits.train_y)
    assert meta["node_val_total"] <= len(splits.val_y)


def test_plan_runs_the_dirichlet_study_for_both_models_and_the_refined_trial():
    options = Options(seeds=(0, 1), studies=(7,))
    plan = build_plan(options)
    divisions = len(options.dirichlet_alphas) * len(options.dirichlet_ks)
    per_seed = divisions * 2 * (len(options.dirichlet_points) + len(options.dirichlet_spaces)
                                + 1 + len(options.dirichlet_baselines))
    assert len(plan) == 2 * per_seed
    refined = [t for t in plan if t.labels.get("point") == "refined"]
    assert len(refined) == 2 * divisions * 2
    assert all(t.run_config["refine-rounds"] == options.refine_rounds for t in refined)
    assert {t.run_config["model"] for t in refined} == {"logistic", "mlp"}
    paper = [t for t in plan if t.labels.get("point") in options.dirichlet_spaces]
    assert {t.run_config["space"] for t in paper} == set(options.dirichlet_spaces)
    assert {t.run_config["label-division"] for t in plan} == {
        f"dirichlet:{a:g}" for a in options.dirichlet_alphas}
    fed = [t for t in plan if t.kind != "gems"]
    assert {t.kind for t in fed} == set(options.dirichlet_baselines)
    assert all(t.federated["optimizer"] == "sgd" and t.federated["rounds"] == options.fed_rounds
               and t.run_config["label-division"] == t.labels["division"] for t in fed)
    # The logistic baselines' grid reaches past study 6's top rate; the MLP's keeps it.
    grids = {m: {tuple(t.federated["lr_grid"]) for t in fed if t.labels["model"] == m}
             for m in ("logistic", "mlp")}
    assert grids == {"logistic": {options.logistic_sgd_lrs},
                     "mlp": {options.sgd_lrs}}
    assert max(options.logistic_sgd_lrs) > max(options.sgd_lrs)
    plain = build_plan(Options(seeds=(0,), studies=(7,), logistic_sgd_lrs=()))
    assert {tuple(t.federated["lr_grid"]) for t in plain if t.kind != "gems"} == {options.sgd_lrs}
    # The baselines cost most: they come last, after every GEMS trial.
    kinds = [t.kind for t in plan]
    assert kinds.index("fedavg") > max(i for i, kind in enumerate(kinds) if kind == "gems")


def test_the_first_full_dirichlet_plan_keeps_its_trials_and_order():
    """The trials added to study 7 later are appended: the stored 210 keep their names."""
    options = Options(studies=(7,))
    first = Options(studies=(7,), dirichlet_spaces=(), dirichlet_baselines=())
    old = [t.name for t in build_plan(first) if not (
        t.labels["point"] == "refined" and t.labels["model"] == "mlp")]
    assert len(old) == 210
    names = [t.name for t in build_plan(options)]
    assert names[:len(old)] == old
    stored = TrialStore(ROOT / "results" / "reproduction" / "study7").load()
    assert len(stored) == 420 and set(stored) <= set(names)


def test_the_seed_note_counts_the_tuned_rows_that_kept_a_fresh_model(tmp_path):
    from gems_lab.reproduce.report import Report

    def record(seed, fresh=None, **config):
        tuned = {"accuracy": 0.8, **({} if fresh is None else {"fresh": fresh})}
        return {"run_config": {"seed": seed, **config}, "outcome": {"rows": {"GEMS tuned": tuned}}}

    on = Report(tmp_path, [], {"defaults": {"tune-fresh": True}})
    records = [record(0, True), record(1, False), record(2), record(3, True, **{"tune-fresh": False})]
    assert "in 1 of 3 runs" in on._fresh_note(records)
    off = Report(tmp_path, [], {"defaults": {"tune-fresh": False}})
    assert off._fresh_note([record(0), record(1)]) == ""
    assert Report(tmp_path, [], {})._fresh_note([record(0, True)]) == ""  # older results


def test_a_trial_records_the_commit_of_the_code_that_ran_it(tmp_path):
    from gems_fl.evaluation.results import git_commit
    from gems_lab.reproduce.plan import Trial
    from gems_lab.reproduce.runner import execute

    trial = Trial("fedavg", {"dataset": "digits", "model": "logistic", "seed": 0}, 2,
                  federated={"rounds": 1, "local_epochs": 1, "proximal_mu": 0.0})
    record = execute(trial, str(tmp_path))
    here = git_commit()
    assert record["git_commit"] == (here["commit"] if here else None)
    assert record["git_dirty"] == (here["dirty"] if here else None)
    assert len(record["outcome"]["accuracy"]) == 1


def test_a_stored_trial_without_its_commit_takes_it_from_its_run_and_keeps_it(tmp_path):
    from gems_lab.reproduce.plan import Trial
    from gems_lab.reproduce.runner import run_trials

    trial = Trial("gems", {"dataset": "digits", "seed": 0}, 2, labels={"seed": 0})
    stored = {"kind": "gems", "labels": {"seed": 0, "gram_rank": 5}, "studies": [1],
              "outcome": {}, "wall_s": 1.0}
    TrialStore(tmp_path).add(trial.name, stored)
    run = tmp_path / "runs" / trial.name / "run-1"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"run": {"git_commit": "abc1234def",
                                                          "git_dirty": False}}))
    records, ran = run_trials([trial], tmp_path, jobs=1)
    assert ran == 0 and records[0]["git_commit"] == "abc1234def"
    # The labels and studies are this plan's, not those an earlier plan stored.
    assert records[0]["labels"] == {"seed": 0} and records[0]["studies"] == []
    kept = TrialStore(tmp_path).load()[trial.name]
    assert kept["git_commit"] == "abc1234def"  # written back, with the stored labels
    assert kept["labels"] == stored["labels"]
    # Without its run on disk, a stored trial stays as it was: nothing is made up.
    other = Trial("gems", {"dataset": "digits", "seed": 1}, 2, labels={"seed": 1})
    TrialStore(tmp_path).add(other.name, stored)
    records, ran = run_trials([other], tmp_path, jobs=1)
    assert ran == 0 and "git_commit" not in records[0]


def test_one_file_per_trial_is_packed_into_the_study_files_unchanged(tmp_path):
    from gems_lab.reproduce.plan import Trial
    from gems_lab.reproduce.runner import run_trials

    trials = [Trial("gems", {"dataset": "digits", "seed": s}, 2, labels={"seed": s},
                    studies={s + 1}) for s in range(3)]
    records = {t.name: {"kind": "gems", "studies": [t.seed + 1], "outcome": {"x": t.seed},
                        "git_commit": "abc"} for t in trials}
    (tmp_path / "trials").mkdir()
    for name, record in records.items():
        (tmp_path / "trials" / f"{name}.json").write_text(json.dumps(record))
    out, ran = run_trials(trials, tmp_path, jobs=1)
    assert ran == 0 and [r["outcome"] for r in out] == [{"x": 0}, {"x": 1}, {"x": 2}]
    assert sorted(p.name for p in (tmp_path / "trials").iterdir()) == [
        "study1.jsonl", "study2.jsonl", "study3.jsonl"]
    assert TrialStore(tmp_path).load() == records


def test_a_study_file_cut_short_by_a_crash_loses_only_its_last_trial(tmp_path, caplog):
    store = TrialStore(tmp_path)
    store.add("a", {"studies": [1], "outcome": 1})
    store.add("b", {"studies": [1], "outcome": 2})
    path = tmp_path / "trials" / "study1.jsonl"
    path.write_text(path.read_text()[:-9])  # the second line half written
    assert store.load() == {"a": {"studies": [1], "outcome": 1}}
    assert "cut short" in caplog.text
    path.write_text('{"broken\n' + path.read_text())  # not the last line: refused
    with pytest.raises(ValueError, match="line 1 is not a stored trial"):
        store.load()


def test_the_report_header_says_which_commits_computed_the_trials():
    from gems_lab.reproduce import commits_line

    records = [{"git_commit": "a" * 40, "git_dirty": False}] * 2 + [
        {"git_commit": "b" * 40, "git_dirty": True}, {}]
    assert commits_line(records) == ("Trials computed at commit `aaaaaaa` (2), `bbbbbbb` with "
                                     "uncommitted changes (1), not recorded (1)")


def test_gram_ranks_flag_is_parsed_and_validated():
    from gems_fl.running.cli import main
    from gems_lab.cli import parse_gram_ranks

    assert parse_gram_ranks("5,auto,0") == (5, "auto", 0)
    assert parse_gram_ranks("none") == ()
    for bad in ("5,x", "-1", "5,5", ""):
        with pytest.raises(ValueError, match="--gram-ranks"):
            parse_gram_ranks(bad)
    assert main(["reproduce", "--gram-ranks", "5,x", "--out", "/nonexistent"]) == 2


def test_no_gram_rank_sweep_plans_no_rank_trials_and_expects_no_rank_files():
    options = Options(studies=(1,), gram_ranks=())
    plan = build_plan(options)
    assert len(plan) == len(options.setups()) * len(options.spaces) * len(options.seeds)
    assert not any("gram_rank" in t.labels for t in plan)
    assert not any(f.startswith("study1_gram_rank") for f in expected_files(options))


def test_the_committed_tables_regenerate_bit_for_bit_from_the_stored_trials(tmp_path):
    """`gems-fl reproduce` on the committed trials of results/reproduction (all stored:
    none runs again) writes every committed study table and JSON unchanged."""
    import shutil

    from gems_lab.reproduce import Options, reproduce
    from gems_lab.reproduce.plan import build_plan

    committed = ROOT / "results" / "reproduction"
    meta = json.loads((committed / "results.json").read_text())["meta"]["options"]
    options = Options(**{k: tuple(tuple(x) if isinstance(x, list) else x for x in v)
                         if isinstance(v, list) else v for k, v in meta.items()})
    stored = TrialStore(committed).load()
    missing = [t.name for t in build_plan(options) if t.name not in stored]
    assert missing == []  # a trial key that changed would rerun, not regenerate
    assert len(list((committed / "trials").iterdir())) <= 7  # a few files per study
    shutil.copytree(committed / "trials", tmp_path / "trials")
    reproduce(options, tmp_path, jobs=1, command="test")
    tables = sorted(p.name for p in committed.glob("study*_*.*") if p.suffix in (".md", ".json"))
    assert tables
    changed = [name for name in tables
               if (tmp_path / name).read_bytes() != (committed / name).read_bytes()]
    assert changed == []


def test_a_trial_key_holds_the_frozen_settings_and_a_newer_one_only_away_from_its_default(
        monkeypatch):
    from gems_lab.reproduce import plan

    config = plan.Options().trial_config(seed=0)
    key = json.loads(plan.Trial("gems", config, 5).key)[1]
    assert set(key) == set(plan.TRIAL_KEY_SETTINGS) | set(plan.RETIRED_SETTINGS)
    # a setting the product adds later (max-width played as one): out of the key at its
    # default, so no stored trial is renamed; in it where a trial sets another value
    monkeypatch.setattr(plan, "TRIAL_KEY_SETTINGS",
                        tuple(k for k in plan.TRIAL_KEY_SETTINGS if k != "max-width"))
    assert "max-width" not in json.loads(plan.Trial("gems", config, 5).key)[1]
    wider = plan.Trial("gems", {**config, "max-width": 150}, 5)
    assert json.loads(wider.key)[1]["max-width"] == 150
