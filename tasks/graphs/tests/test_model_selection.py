"""GraphGPS's protocol at the paper presets: ogbg-molhiv scored by ROC-AUC (its primary metric), and the model scored
as it was at the epoch with the best validation score (``select_best``), resumable."""

import gzip

import pytest
import torch

from quest_graphs import data as D
from quest_graphs.experiment import BestEpoch
from quest_graphs.task import GraphsRegressionTask, GraphsTask


def test_molhiv_is_scored_by_roc_auc_and_the_paper_presets_select_on_validation():
    task = GraphsTask()
    assert task.metrics_for(task.make_config("paper", {})) == ("test_rocauc", "val_rocauc")
    assert task.metrics_for(task.make_config("tiny", {})) == ("test_acc", "val_acc")  # solubility: 3 classes
    regression = GraphsRegressionTask()
    assert regression.metrics_for(regression.make_config("paper", {})) == ("test_mae", "val_mae")
    assert task.make_config("paper", {}).select_best and regression.make_config("paper", {}).select_best
    assert not task.make_config("tiny", {}).select_best


def test_best_epoch_keeps_the_state_of_the_best_validation_score_and_round_trips():
    model = torch.nn.Linear(2, 1)
    scores = iter([0.5, 0.9, 0.7, 0.9])
    best = BestEpoch(lambda: next(scores), lower_is_better=False)
    states = []
    for epoch in range(1, 5):
        with torch.no_grad():
            model.weight.fill_(float(epoch))
        states.append({k: v.clone() for k, v in model.state_dict().items()})
        best.consider(epoch, model)
    assert (best.epoch, best.value) == (2, 0.9)  # a tie later keeps the earlier epoch
    assert torch.equal(best.state["weight"], states[1]["weight"])
    assert model.training
    again = BestEpoch(lambda: 0.0, lower_is_better=False)
    again.load_state_dict(best.state_dict())
    assert again.epoch == 2 and torch.equal(again.state["weight"], states[1]["weight"])

    errors = iter([3.0, 1.0, 2.0])
    lowest = BestEpoch(lambda: next(errors), lower_is_better=True)
    for epoch in range(1, 4):
        lowest.consider(epoch, model)
    assert (lowest.epoch, lowest.value) == (2, 1.0)


def molhiv_fixture(root):
    """ogbg-molhiv's layout with the shipped solubility molecules, labelled by a rule the model can learn."""
    sol = D.load("solubility", None)
    graphs = sol.train[:96] + sol.val[:24] + sol.test[:24]
    labels = [int(g.x.shape[0] > 12) for g in graphs]  # larger molecules are "active"
    folder = root / "ogbg_molhiv"
    for path, text in (
            ("mapping/mol.csv.gz", "HIV_active,smiles,mol_id\n" + "".join(
                f"{y},{g.smiles},{i}\n" for i, (g, y) in enumerate(zip(graphs, labels)))),
            ("split/scaffold/train.csv.gz", "".join(f"{i}\n" for i in range(96))),
            ("split/scaffold/valid.csv.gz", "".join(f"{i}\n" for i in range(96, 120))),
            ("split/scaffold/test.csv.gz", "".join(f"{i}\n" for i in range(120, 144)))):
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(folder / path, "wt") as f:
            f.write(text)
    return labels


def test_a_molhiv_run_reports_roc_auc_as_primary_at_the_best_epoch(tmp_path):
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    labels = molhiv_fixture(tmp_path / "data")
    assert 0 < sum(labels[96:120]) < 24 and 0 < sum(labels[120:]) < 24  # both classes in validation and test
    overrides = {"dataset": "ogbg-molhiv", "select_best": True, "epochs": 4, "batch_size": 16, "dim": 16,
                 "depth": 1, "num_heads": 2, "walk_length": 4, "pe_dim": 4, "corruption_samples": 8}
    result = execute(resolve(RunSpec("graphs", "quest", "tiny", 0, overrides)), tmp_path / "run",
                     data_root=str(tmp_path / "data"), progress=False)
    assert result.status == "ok", result.reason
    assert (result.primary_metric, result.validation_metric) == ("test_rocauc", "val_rocauc")
    assert 0 <= result.metrics["test_rocauc"] <= 1 and result.metrics["best_epoch"] in (1, 2, 3, 4)


def test_a_run_that_selects_on_validation_resumes_bitwise(tmp_path):
    from quest_graphs.experiment import run
    from quest_sdk.testing import straight_and_resumed

    # 8 steps per epoch: the crash at step 11 resumes from step 10, after epoch 1 was considered at step 8
    cfg = GraphsTask().make_config("tiny", {"select_best": True, "epochs": 2, "batch_size": 128, "dim": 16,
                                            "depth": 1, "num_heads": 2, "walk_length": 4, "pe_dim": 4,
                                            "corruption_samples": 9, "log_every": 1})
    straight, resumed, step = straight_and_resumed(run, cfg, tmp_path, checkpoint_every=2, crash_step=11)
    assert step == 10 and resumed == straight
    assert straight["best_epoch"] in (1, 2)
