"""A checkpoint that cannot be used (unreadable, another architecture, another checkpoint version) is set aside
once, with its reason in the run folder, and training starts over from the run's own initial state; a second
unusable checkpoint in the same run folder fails the run with both reasons instead of starting over forever."""

import pytest
import torch
from torch import nn

from quest_core import MultiheadAttention
from quest_sdk.checkpoint import CHECKPOINT, SET_ASIDE, SET_ASIDE_LOG, UnusableCheckpoint
from quest_sdk.engine import Trainer, TrainSpec
from quest_sdk.task import RunContext


class Model(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.embed = nn.Linear(3, width)
        self.attn = MultiheadAttention(width, 2, variant="quest", batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, x_bl3):
        h_bld = self.embed(x_bl3)
        return self.head(self.attn(h_bld, h_bld, h_bld, need_weights=False)[0].mean(1))


def train(folder, width: int = 8, steps: int = 6) -> tuple[Model, Trainer]:
    torch.manual_seed(0)
    x_bl3 = torch.randn(32, 4, 3, generator=torch.Generator().manual_seed(1))
    y_b = (x_bl3[:, :, 0].mean(1) > 0).long()
    model = Model(width)
    ctx = RunContext(folder, "quest", seed=0, progress=False, checkpoint_every=2)
    trainer = Trainer(model, ctx, TrainSpec(steps=steps, lr=1e-2, weight_decay=0.0, warmup_steps=1, log_every=2),
                      "test")
    batches = trainer.epoch_batches(len(x_bl3), 8)
    try:
        trainer.fit(batches.from_step, lambda m, idx, rng: nn.functional.cross_entropy(m(x_bl3[idx]), y_b[idx]))
    finally:
        ctx.close()
    return model, trainer


def test_a_checkpoint_of_another_architecture_is_set_aside_and_training_starts_over(tmp_path, capsys):
    straight, _ = train(tmp_path / "straight", width=16)
    run = tmp_path / "run"
    train(run, width=8)  # leaves an 8-wide checkpoint
    foreign = (run / CHECKPOINT).read_bytes()
    model, trainer = train(run, width=16)
    assert trainer.resumed_from_step == 0 and trainer.step == 6
    assert (run / SET_ASIDE).read_bytes() == foreign
    log = (run / SET_ASIDE_LOG).read_text()
    assert "does not fit this run" in log and "size mismatch" in log and len(log.splitlines()) == 1
    assert "set aside as" in capsys.readouterr().err
    for (name, a), b in zip(straight.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name  # started over from exactly the run's initial state


def test_a_second_unusable_checkpoint_fails_the_run_with_both_reasons(tmp_path):
    run = tmp_path / "run"
    train(run, width=8)
    train(run, width=16)  # the 8-wide one set aside; a 16-wide checkpoint now
    with pytest.raises(UnusableCheckpoint, match=r"an earlier one was set aside already .*size mismatch"):
        train(run, width=8)
    assert (run / CHECKPOINT).exists()  # the second one is left where it is, for a look


def test_an_unreadable_checkpoint_is_set_aside_too(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / CHECKPOINT).write_bytes(b"not a checkpoint")
    _, trainer = train(run)
    assert trainer.resumed_from_step == 0 and trainer.step == 6
    assert (run / SET_ASIDE).read_bytes() == b"not a checkpoint"
    assert "unreadable" in (run / SET_ASIDE_LOG).read_text()


def test_a_checkpoint_of_another_version_is_set_aside(tmp_path):
    run = tmp_path / "run"
    train(run)
    state = torch.load(run / CHECKPOINT, weights_only=True)
    state["version"] = -1
    torch.save(state, run / CHECKPOINT)
    _, trainer = train(run)
    assert trainer.resumed_from_step == 0
    assert "checkpoint version -1" in (run / SET_ASIDE_LOG).read_text()
