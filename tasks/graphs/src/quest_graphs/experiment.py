"""A ``graphs`` / ``graphs-regression`` run: data, model, training and evaluation (the tasks' metadata and configs
are in ``quest_graphs.task``, which imports none of this, so that listing tasks stays fast).

Metrics. Classification: ``test_acc`` (primary), ``val_acc`` (the same on the validation split, for tuning),
``test_rocauc`` / ``val_rocauc`` (ROC-AUC; macro one-vs-rest over the classes present when there are more than
two), ``majority_acc`` (the training set's most frequent class, predicted for every test molecule) and the shared
robustness vocabulary (``corruption_acc/<name>``, ``corruption_error/<name>`` for mCE, ``corrupted_acc``).
Regression: ``test_mae`` (primary), ``val_mae``, ``mean_predictor_mae`` (the training mean predicted for every test
molecule), ``corruption_mae/<name>`` (averaged over severities) and ``corrupted_mae``; no ``corruption_error/``
(an error in target units is no 1 - score, so the leaderboard's mCE is left to the classification task). The model
is scored as it is at the end of training, or, with ``select_best`` (the paper presets, GraphGPS's protocol), as it
was at the end of the epoch with the best validation score (``best_epoch``): ROC-AUC for ogbg-molhiv (whose primary
metric is then ``test_rocauc``), MAE for regression, accuracy otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data

from quest_graphs.corruptions import CORRUPTIONS, SEVERITIES, Vocabulary, corrupt
from quest_graphs.data import MoleculeGraphs, load, targets, with_random_walk_pe
from quest_graphs.model import GraphGPS
from quest_graphs.task import GraphsConfig
from quest_sdk.data import stratified_subset
from quest_sdk.engine import Trainer, TrainSpec, steps_per_epoch
from quest_sdk.robustness import corruption_scores, corruption_summary
from quest_sdk.task import TaskOutput


def run(cfg: GraphsConfig, ctx) -> TaskOutput:
    torch.manual_seed(ctx.seed)
    device = torch.device(ctx.device)
    data = load(cfg.dataset, ctx.data_root)
    train_set, val_set, test_set = (with_random_walk_pe(g, cfg.walk_length) for g in (data.train, data.val, data.test))
    scale = TargetScale.of(data)
    model = make_model(cfg, data, ctx.variant).to(device)
    best = BestEpoch(lambda: validation_score(model, cfg, val_set, scale, device), data.is_regression) \
        if cfg.select_best else None
    steps = train(model, cfg, train_set, scale, ctx, best)
    selected = {}
    if best is not None:
        model.load_state_dict(best.state)
        selected = {"best_epoch": float(best.epoch)}

    score = mean_absolute_error if data.is_regression else accuracy
    test_out, val_out = predict(model, test_set, device), predict(model, val_set, device)
    name = "mae" if data.is_regression else "acc"
    metrics = {f"test_{name}": score(scale.undo(test_out), targets(test_set)),
               f"val_{name}": score(scale.undo(val_out), targets(val_set)),
               **baselines(data)}
    if not data.is_regression:
        metrics |= {"test_rocauc": roc_auc(test_out, targets(test_set)),
                    "val_rocauc": roc_auc(val_out, targets(val_set))}
    metrics |= robustness(model, cfg, data, test_set, scale, ctx.seed, device)
    metrics |= selected
    return TaskOutput(metrics, data={"name": cfg.dataset, "revision": data.revision},
                      samples_seen=steps * cfg.batch_size)


def make_model(cfg: GraphsConfig, data: MoleculeGraphs, variant: str | None) -> GraphGPS:
    return GraphGPS(data.atom_cardinalities, data.bond_cardinalities, 1 if data.is_regression else len(data.classes),
                    variant, dim=cfg.dim, depth=cfg.depth, num_heads=cfg.num_heads, walk_length=cfg.walk_length,
                    pe_dim=cfg.pe_dim, dropout=cfg.dropout, attn_dropout=cfg.attn_dropout, pool=cfg.pool,
                    norm=cfg.norm, pe_norm=cfg.pe_norm)


class TargetScale:
    """Regression targets standardised with the training mean and standard deviation (the model predicts in those
    units; ``undo`` maps back); classification logits pass through."""

    def __init__(self, mean: float = 0.0, std: float = 1.0, regression: bool = False):
        self.mean, self.std, self.regression = mean, std, regression

    @classmethod
    def of(cls, data: MoleculeGraphs) -> "TargetScale":
        if not data.is_regression:
            return cls()
        y = targets(data.train)
        return cls(y.mean().item(), y.std().clamp_min(1e-8).item(), regression=True)

    def apply(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.mean) / self.std if self.regression else y

    def undo(self, out: torch.Tensor) -> torch.Tensor:
        return out.squeeze(-1) * self.std + self.mean if self.regression else out


class BestEpoch:
    """Model selection on validation: ``consider(epoch, model)`` after each epoch keeps a copy of the model's state
    when its validation score (``score()``) is the best so far (the earliest epoch on ties). A watcher of the engine,
    so that the best state so far is in every checkpoint and a resumed run selects as an uninterrupted one."""

    def __init__(self, score, lower_is_better: bool):
        self.score, self.lower = score, lower_is_better
        self.value, self.epoch, self.state = None, 0, None

    def consider(self, epoch: int, model: torch.nn.Module) -> None:
        value = self.score()
        if self.value is None or (value < self.value if self.lower else value > self.value):
            self.value, self.epoch = value, epoch
            self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.train()

    def update(self, step: int, loss: float) -> None:
        pass  # considers epochs, not steps

    def state_dict(self) -> dict:
        return {"value": self.value, "epoch": self.epoch, "state": self.state}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.epoch, self.state = state["value"], state["epoch"], state["state"]


def validation_score(model: GraphGPS, cfg: GraphsConfig, val_set: list[Data], scale: TargetScale, device) -> float:
    """What ``select_best`` selects on: validation ROC-AUC (ogbg-molhiv), MAE (regression) or accuracy."""
    from quest_graphs.task import ROC_AUC_DATASETS

    out, y = predict(model, val_set, device), targets(val_set)
    if scale.regression:
        return mean_absolute_error(scale.undo(out), y)
    return roc_auc(out, y) if cfg.dataset in ROC_AUC_DATASETS else accuracy(out, y)


def train(model: GraphGPS, cfg: GraphsConfig, graphs: list[Data], scale: TargetScale, ctx,
          best: BestEpoch | None = None) -> int:
    """The shared engine: shuffled epochs of ``Batch.from_data_list``; cross-entropy, or L1 on standardised targets
    (GraphGPS's ZINC loss); with ``best``, the model is considered after every epoch. Returns the number of steps."""
    per_epoch = steps_per_epoch(len(graphs), cfg.batch_size, "training molecules")
    spec = TrainSpec.from_config(cfg, per_epoch)
    steps = spec.steps
    trainer = Trainer(model, ctx, spec, f"graphs/{cfg.dataset}", watchers={"best_epoch": best} if best else None)

    def loss_fn(net, idx, rng):  # no random augmentation: the step's generator is unused
        batch = Batch.from_data_list([graphs[i] for i in idx]).to(trainer.device)
        out = net(batch)
        if scale.regression:
            return F.l1_loss(out.squeeze(-1).float(), scale.apply(batch.y))
        return F.cross_entropy(out.float(), batch.y)

    epochs = trainer.epoch_batches(len(graphs), cfg.batch_size)

    def batches(start: int):
        for step, idx in enumerate(epochs.from_step(start), start):
            if best is not None and step and step % per_epoch == 0:  # asked after the epoch's last step (and its
                best.consider(step // per_epoch, model)                # checkpoint): the same on a resume
            yield idx

    trainer.fit(batches, loss_fn)
    if best is not None:
        best.consider(cfg.epochs, model)  # the last epoch (fit stops before asking for another batch)
    return steps


@torch.no_grad()
def predict(model: GraphGPS, graphs: list[Data], device, batch_size: int = 256) -> torch.Tensor:
    """Model outputs (N, out_dim) in float32, in the order of ``graphs``."""
    model.eval()
    out = [model(Batch.from_data_list(graphs[i: i + batch_size]).to(device)).float().cpu()
           for i in range(0, len(graphs), batch_size)]
    return torch.cat(out) if out else torch.zeros(0, 1)


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return (logits.argmax(-1) == y).float().mean().item()


def mean_absolute_error(pred: torch.Tensor, y: torch.Tensor) -> float:
    return (pred - y).abs().mean().item()


def roc_auc(logits: torch.Tensor, y: torch.Tensor) -> float:
    """ROC-AUC of the predicted probabilities: of the positive class for two classes, else the mean one-vs-rest
    AUC over the classes that occur with both outcomes in ``y``; NaN when none does."""
    from sklearn.metrics import roc_auc_score  # the function OGB's molhiv evaluator uses

    probs = logits.softmax(-1).numpy()
    columns = [1] if logits.shape[1] == 2 else range(logits.shape[1])
    aucs = [roc_auc_score((y == c).numpy(), probs[:, c]) for c in columns if 0 < int((y == c).sum()) < len(y)]
    return sum(aucs) / len(aucs) if aucs else float("nan")


def baselines(data: MoleculeGraphs) -> dict[str, float]:
    """The score of a model that ignores the molecule: the training majority class, or the training mean."""
    y_train, y_test = targets(data.train), targets(data.test)
    if data.is_regression:
        return {"mean_predictor_mae": (y_test - y_train.mean()).abs().mean().item()}
    return {"majority_acc": (y_test == torch.bincount(y_train).argmax()).float().mean().item()}


def robustness(model: GraphGPS, cfg: GraphsConfig, data: MoleculeGraphs, test_set: list[Data], scale: TargetScale,
               seed: int, device) -> dict[str, float]:
    """Scores on corrupted test graphs (``corruption_samples`` of them, 0 = all), encodings recomputed after the
    corruption; one seed per corruption for every severity, so severities nest."""
    y = targets(test_set)
    if data.is_regression:
        keep = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:cfg.corruption_samples or len(y)]
        keep = keep.sort().values
    else:
        keep = stratified_subset(y, cfg.corruption_samples, seed)
    graphs, y = [test_set[i] for i in keep.tolist()], y[keep]
    vocab = Vocabulary.of(data.train)

    def score(name: str, severity: int, corruption_seed: int) -> float:
        corrupted = with_random_walk_pe(corrupt(graphs, name, severity, vocab, seed=corruption_seed), cfg.walk_length)
        out = scale.undo(predict(model, corrupted, device))
        return mean_absolute_error(out, y) if data.is_regression else accuracy(out, y)

    scores = corruption_scores(dict.fromkeys(CORRUPTIONS, SEVERITIES), score, seed,
                               seed_of=lambda run_seed, i, _: run_seed * 1000 + i)  # one per corruption: nested
    if not data.is_regression:
        return corruption_summary(scores)
    every = [v for values in scores.values() for v in values]
    return {**{f"corruption_mae/{n}": sum(v) / len(v) for n, v in scores.items()},
            "corrupted_mae": sum(every) / len(every)}
