"""Data-parallel runs set unusable checkpoints aside by the same rule as the run-folder store
(``quest_sdk.checkpoint.record_set_aside``): Ray Train's restored checkpoint is recorded as unusable in worker 0's
run folder once and training starts over; a second one raises ``UnusableCheckpoint``. Direct, without Ray."""

import pytest
import torch

from quest_bench.distributed import CHECKPOINT_FILE, RayTrainCheckpoints
from quest_sdk.checkpoint import SET_ASIDE_LOG, UnusableCheckpoint


def test_an_unreadable_ray_checkpoint_is_recorded_once_then_a_second_one_raises(tmp_path, capsys):
    run, restored = tmp_path / "run", tmp_path / "ray-restored"
    run.mkdir()
    restored.mkdir()
    (restored / CHECKPOINT_FILE).write_bytes(b"not a torch file")
    store = RayTrainCheckpoints(0, run)
    assert store.read(restored / CHECKPOINT_FILE) is None
    log = (run / SET_ASIDE_LOG).read_text()
    assert len(log.splitlines()) == 1 and "unreadable" in log and "ignored" in log
    assert (restored / CHECKPOINT_FILE).exists()  # Ray Train owns the file: recorded, not moved
    err = capsys.readouterr().err
    assert "training starts from step 0" in err and f"recorded in {run / SET_ASIDE_LOG}" in err
    assert "set aside as" not in err  # the warning says what happened: the file stayed
    with pytest.raises(UnusableCheckpoint, match="set aside already"):
        store.set_aside("does not fit this run: size mismatch")  # what Trainer.restore calls


def test_a_readable_ray_checkpoint_loads_and_other_workers_only_warn(tmp_path, capsys):
    restored = tmp_path / "ray-restored"
    restored.mkdir()
    torch.save({"step": 4}, restored / CHECKPOINT_FILE)
    assert RayTrainCheckpoints(0, tmp_path / "run").read(restored / CHECKPOINT_FILE) == {"step": 4}
    worker = RayTrainCheckpoints(1)
    (restored / CHECKPOINT_FILE).write_bytes(b"truncated")
    assert worker.read(restored / CHECKPOINT_FILE) is None
    worker.set_aside("again")  # no run folder on other workers: warns, never raises or writes
    assert "ignoring unreadable checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "run" / SET_ASIDE_LOG).exists()
