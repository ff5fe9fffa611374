"""The `device` setting: CPU path gives the old numbers, CUDA without CUDA is a clear error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gems_fl.data import FeatureOptions
from gems_fl.data.feature_cache import extract_features
from gems_fl.learning import train as train_module
from gems_fl.learning.train import (
    default_device,
    fine_tune,
    resolve_device,
    set_default_device,
    train_until_converged,
)
from gems_fl.settings import Settings, SettingsError


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(autouse=True)
def restore_default_device():
    yield
    train_module._default_device = "auto"


def _data():
    rng = np.random.default_rng(0)
    x = rng.random((120, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 1).astype(np.int64)
    return x, y


def _train(**kw):
    x, y = _data()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(6, 2))
    report = train_until_converged(model, x, y, lr=1e-2, batch_size=16, max_epochs=8,
                                   patience=3, seed=0, **kw)
    tuned = fine_tune(model, x, y, epochs=2, lr=1e-3, batch_size=16, seed=1,
                      proximal_mu=0.1, **kw)
    return model, report, tuned


def test_cpu_device_gives_the_same_numbers_as_the_default(no_cuda):
    plain, plain_report, plain_tuned = _train()
    on_cpu, cpu_report, cpu_tuned = _train(device="cpu")
    for a, b in zip(plain.parameters(), on_cpu.parameters()):
        assert torch.equal(a, b)
        assert b.device.type == "cpu"
    assert plain_report == cpu_report and plain_tuned == cpu_tuned
    set_default_device("cpu")
    again, again_report, _ = _train()
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), again.parameters()))
    assert again_report == plain_report


def test_auto_is_cpu_without_cuda(no_cuda):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("CPU") == torch.device("cpu")
    assert default_device() == torch.device("cpu")


def test_cuda_without_cuda_is_a_clear_error(no_cuda):
    with pytest.raises(ValueError, match=r"device='cuda': this machine has no usable CUDA "
                                         r"device.*device='cpu'"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="no usable CUDA"):
        set_default_device("cuda")
    assert default_device() == torch.device("cpu")  # the failed call changed nothing
    with pytest.raises(ValueError, match="no usable CUDA"):
        _train(device="cuda")


def test_unknown_device_is_rejected():
    with pytest.raises(ValueError, match="device='tpu' is not one of auto, cpu, cuda"):
        resolve_device("tpu")


def test_device_setting():
    assert Settings().device == "auto"
    assert Settings.from_run_config({"device": "cpu"}).device == "cpu"
    with pytest.raises(SettingsError, match="device='gpu' is not one of auto, cpu, cuda"):
        Settings(device="gpu")
    assert FeatureOptions.from_settings(Settings(device="cpu")).device == "cpu"


def test_feature_extraction_on_cpu_matches_a_plain_forward_pass():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    images = np.random.default_rng(0).random((10, 4)).astype(np.float32)
    feats = extract_features(model, images, torch.from_numpy, "test", batch_size=3, device="cpu")
    with torch.no_grad():
        expected = model(torch.from_numpy(images)).numpy()
    np.testing.assert_array_equal(feats, expected)
    assert next(model.parameters()).device.type == "cpu"
