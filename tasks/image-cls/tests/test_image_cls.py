"""image-cls: model parity with stock timm, loaders on fixture trees, corruptions, attacks, a tiny run that learns."""

import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from timm.models.vision_transformer import VisionTransformer

from quest_sdk.task import RunContext
from quest_image_cls import data as D
from quest_image_cls.attacks import adversarial_accuracy, standard_autoattack, standard_autoattack_accuracy
from quest_sdk.image_corruptions import CORRUPTIONS, SEVERITIES, corrupt
from quest_image_cls.model import Classifier, build_vit, cls_attention
from quest_image_cls.experiment import accuracy, materialise, train
from quest_image_cls.task import ImageClsTask


def test_softmax_vit_matches_stock_timm_with_the_same_weights():
    torch.manual_seed(0)
    kwargs = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=4,
                  mlp_ratio=2.0)
    stock = VisionTransformer(**kwargs).eval()
    ours = build_vit("softmax", **kwargs).eval()
    missing, unexpected = ours.load_state_dict(stock.state_dict(), strict=False)
    assert not missing and not unexpected  # softmax has no extra parameters
    x = torch.randn(3, 1, 28, 28)
    torch.testing.assert_close(ours(x), stock(x), atol=1e-5, rtol=1e-5)
    quest = build_vit("quest", **kwargs).eval()
    quest.load_state_dict(stock.state_dict())
    assert not torch.allclose(quest(x), stock(x), atol=1e-3)


def test_shipped_digits_split():
    train_set, test_set, digest = D.load_digits()
    assert (len(train_set), len(test_set)) == (4000, 1000) and len(digest) == 16
    x, y = test_set.tensors
    assert x.shape == (1000, 1, 28, 28) and 0.0 <= x.min() and x.max() <= 1.0 and x.max() > 0.99
    assert torch.bincount(y).tolist() == [100] * 10


def write_png(path, size=(8, 8), seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)


def test_imagenet_c_and_a_layouts(tmp_path):
    wnids = ["n01440764", "n01443537", "n01484850"]
    for split in ("train", "val"):
        for i, w in enumerate(wnids):
            write_png(tmp_path / split / w / f"{split}_{i}.JPEG", seed=i)
    train = D.imagenet(tmp_path, "train", D.eval_transform("imagenet", 16))
    assert len(train) == 3 and train[1][0].shape == (3, 16, 16) and train.class_to_idx[wnids[2]] == 2
    for sev in (1, 5):  # ImageNet-C holds a subset of classes: labels must follow the training mapping
        write_png(tmp_path / "imagenet-c" / "fog" / str(sev) / wnids[2] / "a.JPEG")
    c = D.imagenet_c(tmp_path, "fog", 5, train.class_to_idx, D.eval_transform("imagenet", 16))
    assert D.imagenet_c_corruptions(tmp_path) == ["fog"] and c[0][1] == 2
    write_png(tmp_path / "imagenet-a" / wnids[1] / "x.jpg")
    write_png(tmp_path / "imagenet-a" / wnids[2] / "y.jpg")
    a, subset = D.imagenet_a(tmp_path, train.class_to_idx, D.eval_transform("imagenet", 16))
    assert subset == [1, 2] and [a[i][1] for i in range(2)] == [1, 2]
    with pytest.raises(FileNotFoundError, match="ImageNet-C not found"):
        D.imagenet_c(tmp_path, "snow", 1, train.class_to_idx, None)


def test_cifar10_layout(tmp_path, monkeypatch):
    # torchvision checks the md5 sums of the real CIFAR files; a fixture can only pass with that check off
    monkeypatch.setattr("torchvision.datasets.cifar.check_integrity", lambda *args, **kwargs: True)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 255, (4, 3072), dtype=np.uint8), "labels": [0, 1, 2, 3]}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    ds = D.cifar(tmp_path, "cifar10", False, D.eval_transform("cifar10", 32))
    assert len(ds) == 4 and ds[3][0].shape == (3, 32, 32) and ds[3][1] == 3
    assert len(D.cifar(tmp_path, "cifar10", True, D.train_transform("cifar10", 32))) == 20
    with pytest.raises(FileNotFoundError, match="cifar100 not found"):
        D.cifar(tmp_path, "cifar100", False, None)
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for name in ("train", "test"):
        with open(folder / name, "wb") as f:
            pickle.dump({"data": rng.integers(0, 255, (3, 3072), dtype=np.uint8), "fine_labels": [5, 50, 99]}, f)
    with open(folder / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)]}, f)
    ds100 = D.cifar(tmp_path, "cifar100", False, D.eval_transform("cifar100", 32))
    assert [ds100[i][1] for i in range(3)] == [5, 50, 99]


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_corruptions_are_deterministic_and_grow_with_severity(name):
    x = D.load_digits()[1].tensors[0][:64]
    distances = []
    for s in SEVERITIES:
        a, b = corrupt(x, name, s, seed=3), corrupt(x, name, s, seed=3)
        torch.testing.assert_close(a, b)
        assert a.shape == x.shape and a.min() >= 0 and a.max() <= 1
        distances.append((a - x).abs().mean().item())
    assert all(d1 <= d2 + 1e-6 for d1, d2 in zip(distances, distances[1:])), distances
    assert distances[-1] > distances[0]
    if name in ("gaussian_noise", "shot_noise", "impulse_noise", "motion_blur", "fog"):  # random: seed matters
        assert not torch.equal(corrupt(x, name, 3, seed=3), corrupt(x, name, 3, seed=4))


def test_bad_corruption_arguments():
    x = torch.rand(1, 1, 8, 8)
    with pytest.raises(ValueError, match="unknown corruption 'snow'"):
        corrupt(x, "snow", 1)
    with pytest.raises(ValueError, match="severity must be one of"):
        corrupt(x, "fog", 6)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The tiny preset trained for 4 epochs (a few seconds) with quest attention."""
    torch.manual_seed(0)
    task = ImageClsTask()
    cfg = task.make_config("tiny", {"epochs": 4})
    ctx = RunContext(tmp_path_factory.mktemp("run"), "quest", progress=False)
    train_set, test_set, _ = D.load_digits()
    vit = build_vit("quest", 28, 7, 1, 10, cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.mlp_ratio)
    model = Classifier(vit, *D.MEAN_STD["digits"])
    train(model, cfg, train_set, ctx)
    ctx.close()
    return model, materialise(test_set), ctx


def test_a_tiny_run_learns_and_logs_telemetry(trained):
    model, (x, y), ctx = trained
    assert accuracy(model, x, y, "cpu") > 0.6  # chance is 0.1
    events = (ctx.out_dir / "events.jsonl").read_text().splitlines()
    assert len(events) >= 5 and "max_logit" in events[-1] and "entropy_mean" in events[-1]
    assert '"vit.blocks.2.attn/max_logit"' in events[-1]  # per-layer curves too


def test_pgd_is_stronger_than_fgsm(trained):
    model, (x, y), _ = trained
    clean = accuracy(model, x[:200], y[:200], "cpu")
    adv = adversarial_accuracy(model, x[:200], y[:200], 10, eps=8 / 255, pgd_steps=10, pgd_step_size=2 / 255,
                               autoattack=False, device="cpu")
    assert adv["pgd_acc"] < adv["fgsm_acc"] < clean


def test_cls_attention_is_a_distribution_over_patches(trained):
    model, (x, _), _ = trained
    attn = cls_attention(model, x[:3])
    assert attn.shape == (3, 4, 4)
    total = attn.sum((1, 2))  # the CLS token's attention to itself is left out, so the patches get ≤ 1
    assert (attn >= 0).all() and (total > 0.1).all() and (total <= 1 + 1e-6).all()


def test_imagenet_layout_runs_end_to_end_with_imagenet_c_and_a(tmp_path):
    """The `paper` code path (ImageFolder data, real ImageNet-C/-A evaluation) on a fixture tree, tiny sizes."""
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    wnids = ["n01440764", "n01443537", "n01484850"]
    for split, per_class in (("train", 4), ("val", 2)):
        for i, w in enumerate(wnids):
            for j in range(per_class):
                write_png(tmp_path / "data" / split / w / f"{j}.JPEG", size=(20, 20), seed=10 * i + j)
    for s in SEVERITIES:
        write_png(tmp_path / "data" / "imagenet-c" / "fog" / str(s) / wnids[0] / "a.JPEG", size=(20, 20))
    write_png(tmp_path / "data" / "imagenet-a" / wnids[1] / "a.jpg", size=(20, 20))
    overrides = {"dataset": "imagenet", "img_size": 16, "patch_size": 8, "epochs": 1, "batch_size": 4,
                 "adv_samples": 2, "corruption_samples": 2, "figure_images": 2, "embed_dim": 16, "depth": 1}
    spec = resolve(RunSpec("image-cls", "quest", "tiny", 0, overrides))
    result = execute(spec, tmp_path / "run", data_root=str(tmp_path / "data"), progress=False)
    assert result.status == "ok", result.reason
    assert set(result.metrics) >= {"test_acc", "corruption_acc/fog", "corruption_error/fog", "imagenet_a_acc",
                                   "fgsm_acc", "pgd_acc"}
    assert (tmp_path / "run" / "attention.png").exists()


@pytest.mark.slow  # ~2 minutes: ART's AutoAttack ensemble includes a 5,000-query Square attack
def test_autoattack_runs_and_is_at_least_as_strong_as_pgd(trained):
    model, (x, y), _ = trained
    adv = adversarial_accuracy(model, x[:4], y[:4], 10, eps=8 / 255, pgd_steps=10, pgd_step_size=2 / 255,
                               autoattack=True, device="cpu", batch_size=4)  # 4 images: AutoAttack is slow
    assert adv["autoattack_acc"] <= adv["pgd_acc"]


def test_standard_autoattack_is_torchattacks_standard_version(trained):
    model, _, _ = trained
    attack = standard_autoattack(model, num_classes=10, eps=8 / 255, seed=0)
    assert type(attack).__module__.startswith("torchattacks") and attack.version == "standard"
    names = [type(a).__name__ for a in attack._autoattack.attacks]
    assert names == ["APGD", "APGDT", "FAB", "Square"]  # APGD-CE, APGD-T, FAB-T, Square
    assert attack._autoattack.attacks[3].n_queries == 5000 and attack._autoattack.attacks[2].multi_targeted


def test_standard_autoattack_stays_in_budget_and_lowers_accuracy(trained):  # ~12 s on a loaded CPU: 6 images
    model, (x, y), _ = trained
    eps = 8 / 255
    x_bchw, y_b = x[:6], y[:6]
    clean = accuracy(model, x_bchw, y_b, "cpu")
    acc, adv_bchw = standard_autoattack_accuracy(model, x_bchw, y_b, 10, eps, "cpu", batch_size=6)
    assert adv_bchw.shape == x_bchw.shape
    assert (adv_bchw - x_bchw).abs().max() <= eps + 1e-6
    assert adv_bchw.min() >= 0.0 and adv_bchw.max() <= 1.0
    assert acc <= clean
    adv = adversarial_accuracy(model, x_bchw, y_b, 10, eps=eps, pgd_steps=2, pgd_step_size=2 / 255,
                               autoattack=False, device="cpu", batch_size=6, standard_autoattack=True)
    assert adv["std_autoattack_acc"] == acc  # the same seeded attack through the metric's entry point


def test_standard_autoattack_is_on_only_at_paper_and_declared_higher_is_better():
    task = ImageClsTask()
    assert not task.make_config("tiny", {}).standard_autoattack
    assert task.make_config("paper", {}).standard_autoattack
    assert task.metric_directions()["std_autoattack_acc"] is True


def test_an_interrupted_run_resumes_bitwise(tmp_path):
    from quest_image_cls.experiment import run
    from quest_sdk.testing import straight_and_resumed

    # one epoch of 4 batches (4,000 digits / 1,000), a narrow model, small evaluation subsets: a few seconds a run;
    # the random shift (the step's generator) and mixup/cutmix (numpy's global RNG, checkpointed) on, to resume too
    cfg = ImageClsTask().make_config("tiny", {"epochs": 1, "batch_size": 1000, "embed_dim": 16, "depth": 2,
                                              "num_heads": 2, "shift_pixels": 2, "mixup": 0.8, "cutmix": 1.0,
                                              "label_smoothing": 0.1, "eval_samples": 100, "adv_samples": 8,
                                              "corruption_samples": 10, "pgd_steps": 1, "figure_images": 1,
                                              "log_every": 1})
    straight, resumed, step = straight_and_resumed(run, cfg, tmp_path, checkpoint_every=2, crash_step=3)
    assert step == 2 and resumed == straight
    assert {"test_acc", "corrupted_acc", "fgsm_acc", "pgd_acc", "final_max_logit"} <= straight.keys()
    rows = [(tmp_path / run_dir / "events.jsonl").read_text() for run_dir in ("straight", "resumed")]
    assert rows[0] == rows[1]  # the rows of steps 3 and 4 logged again after the resume, not doubled


def test_validation_is_held_out_of_train_and_evaluation_subsets_cover_every_class():
    """The shipped test split is sorted by class: a first-n slice would attack digits 0-4 only."""
    from quest_image_cls.data import load_digits
    from quest_image_cls.experiment import hold_out, labels_of
    from quest_sdk.data import stratified_subset

    train_set, test_set, _ = load_digits()
    assert labels_of(test_set)[:500].unique().tolist() == [0, 1, 2, 3, 4]  # why the slice was wrong
    fit, val = hold_out(train_set, train_set, 0.1)
    assert len(val) == 400 and len(fit) == 3600 and not set(fit.indices) & set(val.indices)
    assert torch.bincount(labels_of(train_set)[val.indices]).tolist() == [40] * 10
    assert hold_out(train_set, train_set, 0.1)[1].indices == val.indices  # the same split for every run
    x, y = materialise(test_set, 50)
    assert torch.bincount(y).tolist() == [5] * 10
    attacked = stratified_subset(labels_of(test_set), 500, seed=3)
    assert torch.bincount(labels_of(test_set)[attacked]).tolist() == [50] * 10
