"""Segmentation resumes from mmengine's own checkpoints; before mmengine resumes, the one the file ``last_checkpoint``
names is set aside by the rule of every checkpoint store when it is unreadable or was written by another run (other
code, variant or config: its ``quest_run`` fingerprint differs): renamed to ``checkpoint.unusable.pt`` in the run
folder with its reason, and mmengine's pointer removed so the run starts over; a second one raises."""

from types import SimpleNamespace

import pytest
import torch

from quest_sdk.checkpoint import SET_ASIDE, SET_ASIDE_LOG, UnusableCheckpoint
from quest_segmentation.experiment import QuestRunHook, run_fingerprint, set_aside_unusable_checkpoint
from quest_segmentation.task import SegmentationConfig

OURS = "0123456789abcdef"


def latest(run, name, content: bytes | dict):
    """A checkpoint in the run's mmengine folder, named as the latest by mmengine's ``last_checkpoint`` file."""
    work = run / "mmseg"
    work.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        (work / name).write_bytes(content)
    else:
        torch.save(content, work / name)
    (work / "last_checkpoint").write_text(str(work / name))
    return work


def test_an_unreadable_mmengine_checkpoint_is_set_aside_once_then_a_second_one_raises(tmp_path, capsys):
    run = tmp_path / "run"
    work = latest(run, "iter_4.pth", b"truncated iter_4.pth")
    set_aside_unusable_checkpoint(work, run, OURS)
    assert (run / SET_ASIDE).read_bytes() == b"truncated iter_4.pth"
    assert not (work / "iter_4.pth").exists() and not (work / "last_checkpoint").exists()  # mmengine starts over
    log = (run / SET_ASIDE_LOG).read_text()
    assert len(log.splitlines()) == 1 and "unreadable" in log and "iter_4.pth" in log
    assert "training starts from step 0" in capsys.readouterr().err
    latest(run, "iter_8.pth", b"truncated iter_8.pth")
    with pytest.raises(UnusableCheckpoint, match="set aside already"):
        set_aside_unusable_checkpoint(work, run, OURS)


@pytest.mark.parametrize("written_by", ["fedcba9876543210", None], ids=["another-run", "older-code"])
def test_a_readable_checkpoint_of_another_run_is_set_aside(tmp_path, written_by):
    run = tmp_path / "run"
    content = {"meta": {"iter": 4}, "state_dict": {"w": torch.zeros(2)}}
    work = latest(run, "iter_4.pth", content if written_by is None else {**content, "quest_run": written_by})
    set_aside_unusable_checkpoint(work, run, OURS)
    assert (run / SET_ASIDE).exists() and not (work / "last_checkpoint").exists()
    log = (run / SET_ASIDE_LOG).read_text()
    assert "another run's" in log and f"fingerprint {written_by}" in log and OURS in log


def test_a_checkpoint_of_this_run_is_left_for_mmengine(tmp_path):
    run = tmp_path / "run"
    work = latest(run, "iter_4.pth", {"meta": {"iter": 4}, "state_dict": {"w": torch.zeros(2)}, "quest_run": OURS})
    set_aside_unusable_checkpoint(work, run, OURS)
    assert (work / "last_checkpoint").exists() and (work / "iter_4.pth").exists()
    assert not (run / SET_ASIDE_LOG).exists()


def test_the_fingerprint_follows_variant_and_config_and_the_hook_writes_it():
    ctx = SimpleNamespace(variant="quest", telemetry_last={"max_logit": 3.0})
    cfg = SegmentationConfig()
    ours = run_fingerprint(cfg, ctx)
    assert ours == run_fingerprint(SegmentationConfig(), ctx)  # stable
    assert ours != run_fingerprint(cfg, SimpleNamespace(variant="softmax"))
    assert ours != run_fingerprint(SegmentationConfig(iters=cfg.iters + 1), ctx)
    assert ours == run_fingerprint(SegmentationConfig(num_workers=cfg.num_workers + 1), ctx)  # not the model's
    checkpoint = {}
    QuestRunHook(ctx, total=4, log_every=1, fingerprint=ours).before_save_checkpoint(None, checkpoint)
    assert checkpoint == {"quest_telemetry_last": {"max_logit": 3.0}, "quest_run": ours}
