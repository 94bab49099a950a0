"""Segmentation resumes from mmengine's own checkpoints; an unreadable one (the file ``last_checkpoint`` names) is
set aside by the rule of every checkpoint store before mmengine resumes: renamed to ``checkpoint.unusable.pt`` in
the run folder with its reason, and mmengine's pointer removed so the run starts over; a second one raises."""

import pytest
import torch

from quest_sdk.checkpoint import SET_ASIDE, SET_ASIDE_LOG, UnusableCheckpoint
from quest_segmentation.experiment import set_aside_unreadable_checkpoint


def bad_checkpoint(run, name):
    work = run / "mmseg"
    work.mkdir(parents=True, exist_ok=True)
    (work / name).write_bytes(b"truncated " + name.encode())
    (work / "last_checkpoint").write_text(str(work / name))
    return work


def test_an_unreadable_mmengine_checkpoint_is_set_aside_once_then_a_second_one_raises(tmp_path, capsys):
    run = tmp_path / "run"
    work = bad_checkpoint(run, "iter_4.pth")
    set_aside_unreadable_checkpoint(work, run)
    assert (run / SET_ASIDE).read_bytes() == b"truncated iter_4.pth"
    assert not (work / "iter_4.pth").exists() and not (work / "last_checkpoint").exists()  # mmengine starts over
    log = (run / SET_ASIDE_LOG).read_text()
    assert len(log.splitlines()) == 1 and "unreadable" in log and "iter_4.pth" in log
    assert "training starts from step 0" in capsys.readouterr().err
    bad_checkpoint(run, "iter_8.pth")
    with pytest.raises(UnusableCheckpoint, match="set aside already"):
        set_aside_unreadable_checkpoint(work, run)


def test_a_readable_mmengine_checkpoint_is_left_for_mmengine(tmp_path):
    run = tmp_path / "run"
    work = run / "mmseg"
    work.mkdir(parents=True)
    torch.save({"meta": {"iter": 4}, "state_dict": {"w": torch.zeros(2)}}, work / "iter_4.pth")
    (work / "last_checkpoint").write_text(str(work / "iter_4.pth"))
    set_aside_unreadable_checkpoint(work, run)
    assert (work / "last_checkpoint").exists() and (work / "iter_4.pth").exists()
    assert not (run / SET_ASIDE_LOG).exists()
