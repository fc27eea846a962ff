"""The per-machine CPU tanh: both forms agree with torch.tanh, the choice is forced or measured once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from embodied.policies import cpu_tanh
from embodied.policies.mlp import Tanh


@pytest.fixture
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Forget the process's cached choice before and after the test (it is decided once)."""
    cpu_tanh.use_sigmoid_tanh.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    cpu_tanh.use_sigmoid_tanh.cache_clear()


@pytest.mark.parametrize("form", ["tanh", "sigmoid"])
def test_both_forms_match_torch_tanh_values_and_gradients(fresh_choice: pytest.MonkeyPatch, form: str) -> None:
    fresh_choice.setenv(cpu_tanh.ENV_VAR, form)
    assert cpu_tanh.use_sigmoid_tanh() is (form == "sigmoid")
    x = torch.linspace(-12.0, 12.0, 4001, requires_grad=True)
    y = Tanh()(x)
    (grad,) = torch.autograd.grad(y.square().sum(), x)
    x_ref = x.detach().double().requires_grad_(True)
    y_ref = torch.tanh(x_ref)
    (grad_ref,) = torch.autograd.grad(y_ref.square().sum(), x_ref)
    assert (y.detach().double() - y_ref.detach()).abs().max().item() < 3e-7
    assert (grad.double() - grad_ref).abs().max().item() < 1e-6


def test_auto_follows_the_measured_timings(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.delenv(cpu_tanh.ENV_VAR, raising=False)
    # sigmoid form 3x faster: taken; only 1.5x faster: below the required margin, torch.tanh kept
    fresh_choice.setattr(cpu_tanh, "measure_tanh_s", lambda: (90e-6, 30e-6))
    assert cpu_tanh.use_sigmoid_tanh() is True
    cpu_tanh.use_sigmoid_tanh.cache_clear()
    fresh_choice.setattr(cpu_tanh, "measure_tanh_s", lambda: (45e-6, 30e-6))
    assert cpu_tanh.use_sigmoid_tanh() is False


def test_the_choice_is_measured_once_per_process(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.delenv(cpu_tanh.ENV_VAR, raising=False)
    calls: list[int] = []

    def fake_measure() -> tuple[float, float]:
        calls.append(1)
        return 10e-6, 50e-6

    fresh_choice.setattr(cpu_tanh, "measure_tanh_s", fake_measure)
    for _ in range(3):
        Tanh()(torch.ones(4))
    assert len(calls) == 1


def test_measurement_leaves_the_global_random_state_alone() -> None:
    before = torch.get_rng_state()
    tanh_s, sigmoid_s = cpu_tanh.measure_tanh_s(rows=8, width=8, rounds=1, calls=1)
    assert torch.equal(torch.get_rng_state(), before)
    assert tanh_s > 0.0 and sigmoid_s > 0.0


def test_a_bad_setting_names_the_variable(fresh_choice: pytest.MonkeyPatch) -> None:
    fresh_choice.setenv(cpu_tanh.ENV_VAR, "fast")
    with pytest.raises(ValueError, match=r"EMBODIED_CPU_TANH='fast': expected one of auto, tanh, sigmoid"):
        cpu_tanh.use_sigmoid_tanh()
