"""Fine-tuning with held-out early stopping: the held-out rows choose the epoch (the start
included) and, for a trained start, how far it is shrunk; the model is then tuned that long
on every row; the fixed recipe stays the paper's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gems_fl.learning.recipe import WARM_SHRINKS, TuneRecipe
from gems_fl.learning.train import HoldoutKeeper, accuracy, fine_tune, fine_tune_holdout

# runs that test something else with an eps (or data) that h_G meets on few sites: the
# min-good-enough check (its own test in test_protocol.py) is turned off there
NO_CHECK = {"min-good-enough": "0"}


def _data(seed: int = 0, n: int = 200):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    return x, y


def _holdout(x, y, fraction, seed):
    order = np.random.default_rng(seed).permutation(len(y))
    held = order[:int(round(fraction * len(y)))]
    return x[held], y[held]


def test_the_kept_weights_are_the_best_epoch_on_the_held_out_rows():
    x, y = _data()
    torch.manual_seed(0)
    model = nn.Linear(5, 2)
    report = fine_tune_holdout(model, x, y, max_epochs=30, patience=30, holdout_fraction=0.25,
                               lr=0.05, batch_size=16, seed=1, refit=False)
    assert report.stopped_by == "holdout" and report.epochs == 30
    hx, hy = _holdout(x, y, 0.25, 1)
    kept = accuracy(model, hx, hy)
    # replay the same run epoch by epoch: no epoch beats the kept weights on the held-out rows
    torch.manual_seed(0)
    replay = nn.Linear(5, 2)
    scores = [accuracy(replay, hx, hy)]
    for epochs in range(1, 31):
        torch.manual_seed(0)
        replay = nn.Linear(5, 2)
        fine_tune_holdout(replay, x, y, max_epochs=epochs, patience=10**6, holdout_fraction=0.25,
                          lr=0.05, batch_size=16, seed=1, refit=False)
        scores.append(accuracy(replay, hx, hy))
    assert kept == pytest.approx(max(scores))


def test_a_model_that_tuning_would_spoil_is_kept_as_it_was():
    x, y = _data(1)
    model = nn.Linear(5, 2)
    with torch.no_grad():  # already the true rule: any noisy step can only lose held-out accuracy
        model.weight.copy_(torch.tensor([[-10.0, -5.0, 0, 0, 0], [10.0, 5.0, 0, 0, 0]]))
        model.bias.zero_()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = fine_tune_holdout(model, x, y, max_epochs=20, patience=3, holdout_fraction=0.2,
                               lr=1.0, batch_size=8, seed=0)
    assert report.best_epoch == 0 and report.epochs == 3  # stopped after patience epochs
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_the_recipe_keeps_the_papers_fixed_epochs_as_an_option():
    x, y = _data(2)
    fixed = TuneRecipe(epochs=4, lr=0.01, batch_size=32, stop="fixed")
    report = fixed.tune(nn.Linear(5, 2), x, y, seed=0)
    assert report.epochs == 4 and report.best_epoch is None
    assert "4 epochs" in fixed.describe()
    with pytest.raises(ValueError, match="stop='sometimes'"):
        TuneRecipe(epochs=4, lr=0.01, batch_size=32, stop="sometimes")
    assert not TuneRecipe(epochs=0, lr=0.01, batch_size=32, stop="fixed").active
    assert TuneRecipe(epochs=0, lr=0.01, batch_size=32, stop="holdout").active


def test_the_chosen_epochs_are_then_tuned_on_every_row_from_the_same_start():
    x, y = _data(3)
    torch.manual_seed(0)
    model = nn.Linear(5, 2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    report = fine_tune_holdout(model, x, y, max_epochs=25, patience=25, holdout_fraction=0.25,
                               lr=0.05, batch_size=16, seed=1)
    assert report.stopped_by == "holdout-refit" and report.best_epoch > 0
    replay = nn.Linear(5, 2)
    replay.load_state_dict(start)
    fine_tune(replay, x, y, epochs=report.best_epoch, lr=0.05, batch_size=16, seed=1)
    for k, v in model.state_dict().items():
        assert torch.equal(v, replay.state_dict()[k])


def test_patience_waits_while_the_held_out_loss_still_falls():
    """A new lowest held-out loss resets patience even when accuracy is below its best (a
    far-off start improves its loss long before its accuracy), but it is not kept."""
    x, y = _data(4, n=60)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)

    def linear(w1, b1):  # class 1's logit w1 . x + b1, class 0's its negative
        m = nn.Linear(5, 2)
        with torch.no_grad():
            m.weight.copy_(torch.tensor([[-v for v in w1], w1]))
            m.bias.copy_(torch.tensor([-b1, b1]))
        return m

    def score(m):
        with torch.no_grad():
            logits = m(xt)
        return (float((logits.argmax(1) == yt).float().mean()),
                float(nn.functional.cross_entropy(logits, yt)))

    confident = linear([50.0, 0, 0, 0, 0], 0.0)  # accurate, confidently wrong on the rest
    cautious = linear([0.5, 0.25, 0, 0, 0], -0.3)  # the true rule, mildly, biased
    (acc_a, loss_a), (acc_b, loss_b) = score(confident), score(cautious)
    assert acc_b < acc_a and loss_b < loss_a  # the premise
    keeper = HoldoutKeeper(confident, xt, yt)
    assert keeper.update(cautious, 1) == 0  # the loss fell: patience starts again
    assert keeper.best_epoch == 0  # accuracy did not: the confident model stays kept
    assert keeper.update(cautious, 2) == 1  # neither improved


def test_a_warm_start_that_is_far_off_is_shrunk_before_tuning():
    x, y = _data(5)
    model = nn.Linear(5, 2)
    with torch.no_grad():  # confidently wrong: the rule's opposite, with large weights
        model.weight.copy_(torch.tensor([[100.0, 50.0, 0, 0, 0], [-100.0, -50.0, 0, 0, 0]]))
        model.bias.zero_()
    recipe = TuneRecipe(epochs=5, lr=0.01, batch_size=16, stop="holdout", max_epochs=10)
    report = recipe.tune(model, x, y, seed=0, warm=True)
    assert report.shrink == 0.0 and report.shrink in WARM_SHRINKS
    assert accuracy(model, x, y) > 0.9
    cold = nn.Linear(5, 2)
    with torch.no_grad():
        cold.weight.copy_(torch.tensor([[100.0, 50.0, 0, 0, 0], [-100.0, -50.0, 0, 0, 0]]))
        cold.bias.zero_()
    unshrunk = recipe.tune(cold, x, y, seed=0)  # not warm: the start is tuned as it is
    assert unshrunk.shrink == 1.0 and accuracy(cold, x, y) < 0.5
    with pytest.raises(ValueError, match="shrinks"):
        fine_tune_holdout(nn.Linear(5, 2), x, y, max_epochs=2, patience=2, holdout_fraction=0.2,
                          lr=0.01, batch_size=16, seed=0, shrinks=(1.5,))


def _mlp_blind_to_the_label():
    """An MLP whose hidden units read only the features the label ignores."""
    from gems_fl.learning.models import MLP

    torch.manual_seed(0)
    model = MLP(5, [8], 2, dropout=0.0)
    with torch.no_grad():
        model.hidden[0].weight[:, :2] = 0.0  # the label is x0 + 0.5 x1 > 0
    return model


def test_tune_layers_auto_tunes_every_layer_when_the_hidden_features_cannot_fit():
    x, y = _data(6, 400)
    recipe = TuneRecipe(epochs=5, lr=0.01, batch_size=16, stop="holdout", max_epochs=30)
    last = _mlp_blind_to_the_label()
    assert recipe.tune_trained(last, x, y, seed=0, layers="last").layers == "last"
    np.testing.assert_array_equal(last.hidden[0].weight[:, :2].detach().numpy(), 0.0)
    auto = _mlp_blind_to_the_label()
    report = recipe.tune_trained(auto, x, y, seed=0, layers="auto")
    assert report.layers == "all"
    assert accuracy(auto, x, y) > accuracy(last, x, y) + 0.1
    # the kept model is exactly the winning candidate, tuned on its own
    alone = _mlp_blind_to_the_label()
    recipe.tune_trained(alone, x, y, seed=0, layers="all")
    for a, b in zip(auto.state_dict().values(), alone.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_tune_layers_auto_is_the_papers_last_layer_when_nothing_is_held_out():
    x, y = _data(6, 400)
    fixed = TuneRecipe(epochs=3, lr=0.01, batch_size=16, stop="fixed")
    model = _mlp_blind_to_the_label()
    assert fixed.tune_trained(model, x, y, seed=0, layers="auto").layers == "last"
    np.testing.assert_array_equal(model.hidden[0].weight[:, :2].detach().numpy(), 0.0)
    assert fixed.tune_trained(nn.Linear(5, 2), x, y, seed=0, layers="auto").layers == "all"
    with pytest.raises(ValueError, match="layers='some'"):
        fixed.tune_trained(nn.Linear(5, 2), x, y, seed=0, layers="some")


def _fresh_factory(hidden: int | None = None):
    """A seeded fresh start (the same model at every call), like Raw's."""
    from gems_fl.learning.models import MLP

    def fresh():
        torch.manual_seed(7)
        return nn.Linear(5, 2) if hidden is None else MLP(5, [hidden], 2, dropout=0.0)
    return fresh


def _converging():
    from gems_fl.learning.recipe import TrainRecipe

    return TrainRecipe(lr=0.01, batch_size=16, max_epochs=100, patience=3)


def test_a_fresh_converged_model_is_kept_where_the_tuned_start_scores_lower_held_out():
    from gems_fl.learning.models import MLP

    x, y = _data(8, 400)
    # a tuning budget too small to fix the start (one epoch at a tiny rate, no shrinking
    # helps a start that is wrong only in its hidden layer's blindness)
    recipe = TuneRecipe(epochs=5, lr=1e-6, batch_size=16, stop="holdout", max_epochs=1,
                        fresh=_converging())
    start = _mlp_blind_to_the_label()
    chosen, report = recipe.tune_or_fresh(start, x, y, seed=0, layers="last",
                                          fresh_model=_fresh_factory(hidden=12))
    assert report.fresh and report.layers == "all" and report.stopped_by == "converged"
    assert chosen is not start and isinstance(chosen, MLP)
    assert chosen.hidden[0].out_features == 12  # the fresh model's own widths
    # the kept model is exactly a fresh one trained to convergence on every row
    alone = _fresh_factory(hidden=12)()
    _converging().train(alone, x, y, seed=0)
    for a, b in zip(chosen.state_dict().values(), alone.state_dict().values()):
        torch.testing.assert_close(a, b)
    # and it beat the tuned start on the held-out rows, which is why it was kept
    tuned = _mlp_blind_to_the_label()
    tuned_report = recipe.tune_trained(tuned, x, y, seed=0, layers="last")
    assert report.holdout_score > tuned_report.holdout_score
    assert report.rival_score == tuned_report.holdout_score  # the one not kept
    assert accuracy(chosen, x, y) > accuracy(tuned, x, y) + 0.1


def test_a_tuned_start_that_scores_as_well_held_out_is_kept():
    x, y = _data(9, 400)
    good = nn.Linear(5, 2)
    with torch.no_grad():  # the rule itself: nothing held out can beat it on accuracy
        good.weight.copy_(torch.tensor([[-10.0, -5.0, 0, 0, 0], [10.0, 5.0, 0, 0, 0]]))
        good.bias.zero_()
    recipe = TuneRecipe(epochs=5, lr=0.01, batch_size=16, stop="holdout", max_epochs=5,
                        fresh=_converging())
    chosen, report = recipe.tune_or_fresh(good, x, y, seed=0, layers="auto",
                                          fresh_model=_fresh_factory())
    assert chosen is good and not report.fresh and report.holdout_score[0] == 1.0
    assert report.rival_score is not None and report.rival_score <= report.holdout_score


def test_without_a_fresh_recipe_or_a_holdout_the_tuned_start_is_all_there_is():
    x, y = _data(8, 400)
    for recipe in (TuneRecipe(epochs=1, lr=1e-6, batch_size=16, stop="holdout", max_epochs=1),
                   TuneRecipe(epochs=1, lr=1e-6, batch_size=16, stop="fixed",
                              fresh=_converging())):
        start = _mlp_blind_to_the_label()
        chosen, report = recipe.tune_or_fresh(start, x, y, seed=0, layers="last",
                                              fresh_model=_fresh_factory(hidden=12))
        assert chosen is start and not report.fresh and report.rival_score is None


def test_tune_fresh_setting_builds_the_fresh_recipe_from_the_local_one():
    from gems_fl.settings import Settings

    on = Settings().tune_recipe
    assert on.fresh == Settings().local_recipe and "fresh model" in on.describe()
    assert Settings(tune_fresh=False).tune_recipe.fresh is None


def test_a_run_says_which_tuned_model_it_kept_and_both_held_out_scores(tmp_path):
    from tests.helpers import run_in_process

    rows = run_in_process(3, tmp_path, **NO_CHECK, space="ball", seed=1, baselines="all",
                          **{"label-division": "classes-per-node:4"})["rows"]
    tuned = rows["GEMS tuned"]
    assert isinstance(tuned["fresh"], bool)
    kept, other = tuned["held_out_accuracy"], tuned["other_held_out_accuracy"]
    assert 0 <= other <= kept <= 1  # the kept one scores at least as well held out
    if tuned["fresh"]:  # the fresh model on every row is the model Raw converged trains
        assert tuned["accuracy"] == rows["Raw converged"]["accuracy"]
    off = run_in_process(3, tmp_path / "off", **NO_CHECK, space="ball", seed=1, baselines="all",
                         **{"label-division": "classes-per-node:4", "tune-fresh": False})["rows"]
    assert "fresh" not in off["GEMS tuned"] and "held_out_accuracy" not in off["GEMS tuned"]
