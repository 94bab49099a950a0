"""A ``image-cls`` run: data, model, training and evaluation (the task's metadata and config are in
``quest_image_cls.task``, which imports none of this, so that listing tasks stays fast)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

from quest_sdk.data import require_data_root, stratified_subset, validation_split
from quest_sdk.engine import Trainer, TrainSpec, rank_shard, reduce_sums, steps_per_epoch
from quest_sdk.robustness import corruption_scores, corruption_summary
from quest_sdk.task import TaskOutput
from quest_image_cls import data as D
from quest_image_cls.attacks import adversarial_accuracy
from quest_sdk.image_corruptions import CORRUPTIONS, SEVERITIES, corrupt
from quest_image_cls.figures import attention_figure
from quest_image_cls.model import Classifier, build_vit
from quest_image_cls.task import ImageClsConfig


def run(cfg: ImageClsConfig, ctx) -> TaskOutput:
    device = torch.device(ctx.device)
    train_set, test_set, data_id, eval_view = load_data(cfg, ctx.data_root)
    train_set, val_set = hold_out(train_set, eval_view, cfg.val_fraction)
    model = build_model(cfg, ctx.variant).to(device)
    samples = train(model, cfg, train_set, ctx)

    # Evaluation streams through the datasets, never holding a whole split in memory: the evaluations over datasets
    # are sharded over the data-parallel workers (counts summed); those on small tensor subsets (synthetic
    # corruptions, attacks, the figure) load only their images, on the main worker alone.
    keep = stratified_subset(labels_of(test_set), cfg.eval_samples, seed=0)
    x_test, y_test = LazyImages(test_set, keep), labels_of(test_set)[keep]
    metrics = {"test_acc": loader_accuracy(model, Subset(test_set, keep.tolist()), cfg, device, ctx=ctx)}
    if val_set is not None:
        metrics["val_acc"] = loader_accuracy(model, val_set, cfg, device, ctx=ctx)
    root = Path(ctx.data_root) if ctx.data_root else None
    synthetic = not (cfg.dataset == "imagenet" and D.imagenet_c_corruptions(root))
    if not synthetic:
        metrics.update(imagenet_c_metrics(model, cfg, root, test_set.class_to_idx, device, ctx))
    if cfg.dataset == "imagenet" and (root / "imagenet-a").exists():
        metrics["imagenet_a_acc"] = imagenet_a_accuracy(model, cfg, root, test_set.class_to_idx, device, ctx)
    real = D.imagenet_real(root) if cfg.dataset == "imagenet" else None
    if real is not None:
        metrics["real_acc"] = real_accuracy(model, test_set, keep.tolist(), real, cfg, device, ctx)
    if not ctx.is_main:  # the other workers' results are not kept
        return TaskOutput(metrics, data={"name": cfg.dataset, "revision": data_id}, samples_seen=samples)
    if synthetic:
        metrics.update(corruption_metrics(model, cfg, x_test, y_test, device, ctx.seed))
    attacked = stratified_subset(y_test, cfg.adv_samples, seed=ctx.seed)  # every class, not the first ones
    metrics.update(adversarial_accuracy(model.cpu() if ctx.device == "cpu" else model, x_test[attacked], y_test[attacked],
                                        D.NUM_CLASSES[cfg.dataset], cfg.adv_eps, cfg.pgd_steps, cfg.pgd_step_size,
                                        cfg.autoattack, ctx.device, seed=ctx.seed,
                                        standard_autoattack=cfg.standard_autoattack))
    attention_figure(model, x_test, y_test, cfg.figure_images, Path(ctx.out_dir) / "attention.png",
                     title=f"{ctx.variant}: CLS attention, last block", device=device)
    return TaskOutput(metrics, data={"name": cfg.dataset, "revision": data_id}, samples_seen=samples)


def build_model(cfg: ImageClsConfig, variant: str) -> Classifier:
    """The config's ViT with attention ``variant``, behind the dataset's pixel normalisation (on the CPU)."""
    vit = build_vit(variant, cfg.img_size, cfg.patch_size, D.CHANNELS[cfg.dataset], D.NUM_CLASSES[cfg.dataset],
                    cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.mlp_ratio, cfg.drop_path)
    vit.set_grad_checkpointing(cfg.grad_checkpointing)
    return Classifier(vit, *D.MEAN_STD[cfg.dataset])


def load_data(cfg: ImageClsConfig, data_root: str | None):
    if cfg.dataset not in D.NUM_CLASSES:
        raise ValueError(f"unknown dataset {cfg.dataset!r}; valid: {', '.join(D.NUM_CLASSES)}")
    """(train, test, data id, the training images with evaluation transforms: the validation split's source)."""
    if cfg.dataset == "digits":
        train_set, test_set, digest = D.load_digits()
        return train_set, test_set, f"mnist_5k.npz sha256:{digest}", train_set
    root = require_data_root(data_root, cfg.dataset)
    evaluate = D.eval_transform(cfg.dataset, cfg.img_size)
    if cfg.dataset.startswith("cifar"):
        return (D.cifar(root, cfg.dataset, True, D.train_transform(cfg.dataset, cfg.img_size)),
                D.cifar(root, cfg.dataset, False, evaluate), str(root), D.cifar(root, cfg.dataset, True, evaluate))
    return (D.imagenet(root, "train", D.train_transform("imagenet", cfg.img_size, cfg.randaugment)),
            D.imagenet(root, "val", evaluate), str(root), D.imagenet(root, "train", evaluate))


def labels_of(dataset) -> torch.Tensor:
    return torch.as_tensor(dataset.tensors[1] if isinstance(dataset, TensorDataset) else dataset.targets)


def hold_out(train_set, eval_view, fraction: float):
    """(train, validation) subsets: a class-stratified ``fraction`` of the training set, the same for every run;
    the validation images come from ``eval_view`` (the training images with evaluation transforms)."""
    if not fraction:
        return train_set, None
    train_idx, val_idx = validation_split(labels_of(train_set), fraction)
    return Subset(train_set, train_idx.tolist()), Subset(eval_view, val_idx.tolist())


def materialise(dataset, limit: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A class-balanced subset of ``limit`` (0 = all) examples of a dataset as tensors: for small sets only (a run's
    evaluation streams instead: ``loader_accuracy``, ``LazyImages``)."""
    keep = stratified_subset(labels_of(dataset), limit, seed=0)
    return LazyImages(dataset, keep)[torch.arange(len(keep))], labels_of(dataset)[keep]


class LazyImages:
    """The images ``dataset[keep[i]]`` of a subset, loaded only when indexed with ``i`` (a tensor or list of
    positions): evaluations that need a few images as one tensor load those, never the whole subset."""

    def __init__(self, dataset, keep: torch.Tensor):
        self.dataset, self.keep = dataset, keep

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, idx) -> torch.Tensor:
        positions = torch.as_tensor(idx).reshape(-1).tolist()
        return torch.stack([self.dataset[int(self.keep[i])][0] for i in positions])


def shift(x: torch.Tensor, pixels: int, gen: torch.Generator) -> torch.Tensor:
    """Random translation by up to ``pixels`` (zero padding), per image."""
    if pixels <= 0:
        return x
    b, _, h, w = x.shape
    padded = F.pad(x, (pixels,) * 4)
    dy, dx = (torch.randint(0, 2 * pixels + 1, (b,), generator=gen) for _ in range(2))
    return torch.stack([padded[i, :, dy[i]: dy[i] + h, dx[i]: dx[i] + w] for i in range(b)])


def train(model: Classifier, cfg: ImageClsConfig, train_set, ctx) -> int:
    """The shared engine over shuffled epochs (a DataLoader over the engine's index batches), with timm's
    mixup/cutmix and label-smoothing losses and the digits' random shift (from the step's generator); returns the
    samples seen."""
    from timm.data import Mixup
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    per_epoch = steps_per_epoch(len(train_set), cfg.batch_size, "training images")
    spec = TrainSpec.from_config(cfg, per_epoch)
    steps = spec.steps
    trainer = Trainer(model, ctx, spec, "image-cls")
    sampler = trainer.epoch_batches(len(train_set), cfg.batch_size)
    mixup = (Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.label_smoothing,
                   num_classes=D.NUM_CLASSES[cfg.dataset]) if cfg.mixup > 0 or cfg.cutmix > 0 else None)
    criterion = (SoftTargetCrossEntropy() if mixup else
                 LabelSmoothingCrossEntropy(cfg.label_smoothing) if cfg.label_smoothing > 0 else torch.nn.CrossEntropyLoss())

    def batches(start: int):  # the loader's generator (its workers' seeds) comes from (seed, start, rank): it never
        # draws from the checkpointed global state, and each seed and worker augments differently in loader workers
        return DataLoader(train_set, batch_sampler=sampler.from_step(start), num_workers=cfg.num_workers,
                          generator=trainer.rng(start, stream=2**21 + ctx.rank),
                          pin_memory=trainer.device.type == "cuda")

    def loss_fn(net, batch, rng):
        x, y = batch
        if cfg.dataset == "digits":
            x = shift(x, cfg.shift_pixels, rng)
        x, y = x.to(trainer.device, non_blocking=True), y.to(trainer.device, non_blocking=True)
        if mixup:
            x, y = mixup(x, y)
        return criterion(net(x), y)

    trainer.fit(batches, loss_fn)
    return steps * cfg.batch_size


@torch.no_grad()
def predict(model, x: torch.Tensor, device, batch_size: int = 500) -> torch.Tensor:
    model.eval()
    return torch.cat([model(x[i: i + batch_size].to(device)).argmax(-1).cpu() for i in range(0, len(x), batch_size)])


def accuracy(model, x, y, device) -> float:
    return (predict(model, x, device) == y).float().mean().item()


def spread_subset(dataset, limit: int):
    """At most ``limit`` examples spread evenly over the dataset (ImageFolder orders by class)."""
    if not limit or limit >= len(dataset):
        return dataset
    return Subset(dataset, torch.linspace(0, len(dataset) - 1, limit).long().tolist())


@torch.no_grad()
def loader_accuracy(model, dataset, cfg: ImageClsConfig, device, classes: list[int] | None = None,
                    ctx=None) -> float:
    """Accuracy over a dataset, streamed in batches; with ``classes``, the logits are restricted to those classes
    (ImageNet-A). With ``ctx`` of one of several data-parallel workers, each worker scores its shard
    (``rank_shard``) and the counts are summed (every worker gets the same accuracy; each must call this)."""
    if ctx is not None and ctx.world_size > 1:
        dataset = Subset(dataset, list(rank_shard(len(dataset), ctx.rank, ctx.world_size)))
    model.eval()
    hits = total = 0
    for x, y in DataLoader(dataset, batch_size=256, num_workers=cfg.num_workers):
        logits = model(x.to(device)).cpu()
        pred = logits.argmax(-1) if classes is None else torch.tensor(classes)[logits[:, classes].argmax(-1)]
        hits += int((pred == y).sum())
        total += len(y)
    if ctx is not None:
        hits, total = reduce_sums([hits, total], ctx)
    return hits / max(1, total)


@torch.no_grad()
def real_accuracy(model, dataset, indices: list[int], real: dict[str, list[int]], cfg: ImageClsConfig, device,
                  ctx=None) -> float:
    """ImageNet-ReaL accuracy of the validation images ``indices`` of ``dataset`` (an ImageFolder): the share of
    those with ReaL labels whose top-1 prediction is one of them. Sharded over data-parallel workers like
    ``loader_accuracy``."""
    if ctx is not None and ctx.world_size > 1:
        indices = [indices[i] for i in rank_shard(len(indices), ctx.rank, ctx.world_size)]
    labels = [real.get(Path(dataset.samples[i][0]).name) for i in indices]
    if any(item is None for item in labels):
        missing = next(Path(dataset.samples[i][0]).name for i, item in zip(indices, labels) if item is None)
        raise ValueError(f"real.json has no entry for validation image {missing}: ImageNet-ReaL labels the official "
                         "ILSVRC2012_val_<n>.JPEG files")
    model.eval()
    hits = counted = seen = 0
    for x, _ in DataLoader(Subset(dataset, indices), batch_size=256, num_workers=cfg.num_workers):
        pred = model(x.to(device)).argmax(-1).cpu().tolist()
        for p, allowed in zip(pred, labels[seen: seen + len(pred)]):
            counted += bool(allowed)
            hits += p in allowed
        seen += len(pred)
    if ctx is not None:
        hits, counted = reduce_sums([hits, counted], ctx)
    return hits / max(1, counted)


def alexnet_mce(errors: dict[str, float]) -> float:
    """The published mCE, in percent: each corruption's error (averaged over severities) divided by AlexNet's
    (``ALEXNET_IMAGENET_C_ERROR``), averaged over the corruptions given (all 15 of ImageNet-C for the standard
    number); corruptions outside that table are an error."""
    unknown = sorted(set(errors) - set(D.ALEXNET_IMAGENET_C_ERROR))
    if unknown:
        raise ValueError(f"no AlexNet error for {', '.join(unknown)}; ImageNet-C's corruptions: "
                         f"{', '.join(D.ALEXNET_IMAGENET_C_ERROR)}")
    return 100 * sum(e / D.ALEXNET_IMAGENET_C_ERROR[name] for name, e in errors.items()) / len(errors)


def imagenet_c_metrics(model, cfg: ImageClsConfig, root: Path, class_to_idx: dict, device, ctx=None) -> dict:
    """The same metrics as corruption_metrics, on the real ImageNet-C folders (``corruption_samples`` each), plus
    ``mce_alexnet`` (the published mCE, in percent) over ImageNet-C's standard corruptions that are present."""
    transform = D.eval_transform("imagenet", cfg.img_size)
    accuracies = corruption_scores(
        dict.fromkeys(D.imagenet_c_corruptions(root), SEVERITIES),
        lambda name, s, _: loader_accuracy(model, spread_subset(D.imagenet_c(root, name, s, class_to_idx, transform),
                                                                cfg.corruption_samples), cfg, device, ctx=ctx),
        seed=0)  # the published images: nothing drawn
    standard = {name: 1 - sum(a) / len(a) for name, a in accuracies.items() if name in D.ALEXNET_IMAGENET_C_ERROR}
    return corruption_summary(accuracies) | ({"mce_alexnet": alexnet_mce(standard)} if standard else {})


def imagenet_a_accuracy(model, cfg: ImageClsConfig, root: Path, class_to_idx: dict, device, ctx=None) -> float:
    dataset, classes = D.imagenet_a(root, class_to_idx, D.eval_transform("imagenet", cfg.img_size))
    return loader_accuracy(model, dataset, cfg, device, classes, ctx=ctx)


def corruption_metrics(model, cfg: ImageClsConfig, x: torch.Tensor, y: torch.Tensor, device, seed: int) -> dict:
    """Synthetic corruptions (quest_sdk.image_corruptions) of a class-balanced subset of ``corruption_samples`` test
    images (seeded)."""
    keep = stratified_subset(y, cfg.corruption_samples, seed=seed)
    x, y = x[keep], y[keep]
    return corruption_summary(corruption_scores(
        dict.fromkeys(CORRUPTIONS, SEVERITIES),
        lambda name, s, corruption_seed: accuracy(model, corrupt(x, name, s, seed=corruption_seed), y, device), seed))
