"""One training config: task configs inherit the optimisation settings, keep their ranges when they set other
defaults, refuse a warm-up longer than the run when built, and convert to the engine's TrainSpec in one place."""

from dataclasses import dataclass

import pytest

from quest_sdk.config import EpochTraining, StepTraining, TrainingConfig, make_config, param, valid_values
from quest_sdk.engine import TrainSpec, warmup_steps_for


@dataclass
class Epochs(EpochTraining):
    lr: float = 2e-3  # another default, the base's range
    epochs: int = 4
    warmup_epochs: float = 0.5
    grad_clip: float = 10.0
    width: int = param(8, ge=1)


@dataclass
class Steps(StepTraining):
    steps: int = 30
    warmup_steps: int = 5
    amp: bool = True
    log_every: int = 3


@dataclass
class Fraction(TrainingConfig):
    epochs: int = param(3, ge=1)
    warmup_frac: float = param(0.05, ge=0, le=1)


def test_a_task_default_overrides_the_base_and_keeps_its_range():
    assert Epochs().lr == 2e-3 and Epochs().batch_size == TrainingConfig().batch_size
    assert valid_values(Epochs, "lr") is valid_values(TrainingConfig, "lr")
    with pytest.raises(ValueError, match=r"task 'x': config key 'lr' = -1.0 is out of range; valid: > 0$"):
        make_config(Epochs, {"lr": -1}, "task 'x'")
    with pytest.raises(ValueError, match=r"config key 'width' = 0 is out of range; valid: >= 1$"):
        make_config(Epochs, {"width": 0}, "task 'x'")


def test_a_default_outside_the_base_range_is_refused():
    @dataclass
    class Bad(StepTraining):
        weight_decay: float = -0.1

    with pytest.raises(ValueError, match=r"weight_decay = -0.1 is out of range; valid: >= 0"):
        Bad()


@pytest.mark.parametrize("config, values, message", [
    (Steps, {"steps": 4}, r"warmup_steps=5 > steps=4; set warmup_steps to at most 4 \(--set warmup_steps=\.\.\.\)"),
    (Epochs, {"epochs": 1, "warmup_epochs": 1.5}, r"warmup_epochs=1\.5 > epochs=1; set warmup_epochs to at most 1 "),
])
def test_a_warmup_longer_than_the_run_is_an_error_naming_both(config, values, message):
    with pytest.raises(ValueError, match=r"task 'x': invalid config: the warm-up is longer than the run: " + message):
        make_config(config, values, "task 'x'")


def test_a_warmup_as_long_as_the_run_is_allowed():
    spec = TrainSpec.from_config(make_config(Epochs, {"epochs": 1, "warmup_epochs": 1}, "task 'x'"), 7)
    assert (spec.steps, spec.warmup_steps) == (7, 7)


def test_train_spec_from_an_epoch_config():
    spec = TrainSpec.from_config(Epochs(), 7, min_lr_ratio=0.0)
    assert (spec.steps, spec.warmup_steps, spec.lr, spec.weight_decay) == (28, 3, 2e-3, TrainingConfig().weight_decay)
    assert (spec.grad_clip, spec.amp, spec.log_every, spec.min_lr_ratio) == (10.0, False, 10, 0.0)
    with pytest.raises(ValueError, match=r"a run of 4 epochs needs the steps per epoch"):
        TrainSpec.from_config(Epochs())


def test_train_spec_from_a_step_config_and_a_fraction():
    spec = TrainSpec.from_config(Steps(), betas=(0.9, 0.95))
    assert (spec.steps, spec.warmup_steps, spec.amp, spec.log_every, spec.betas) == (30, 5, True, 3, (0.9, 0.95))
    assert warmup_steps_for(Fraction(), steps=100) == 5
    assert TrainSpec.from_config(Fraction(), 10).warmup_steps == 1  # at least one step
