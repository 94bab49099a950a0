"""Tests of the segmentation task: the mmcv-lite shim, the swapped Segmenter against the stock mmseg model, checkpoint
resume under torch's weights-only loading, the generated mosaics (deterministic, held-out strip), the ADE20K layout,
the corruption transform, and a tiny run that learns."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import quest_segmentation.mmcv_shim  # noqa: F401  (the mmcv-lite shim, before mmengine/mmseg)
import pytest
import torch
from mmengine.hooks import Hook
from PIL import Image

from quest_segmentation import data as D
from quest_segmentation.experiment import CONFIGS

TINY = str(CONFIGS / "segmenter_vit-tiny_mosaics-64x64.py")
PAPER = str(CONFIGS / "segmenter_vit-t_quest_8xb1-160k_ade20k-512x512.py")


def test_the_shim_makes_mmseg_models_importable_and_names_missing_ops():
    code = ("import quest_segmentation.mmcv_shim, mmseg.models, mmcv.ops\n"
            "from mmseg.models.losses.focal_loss import _sigmoid_focal_loss\n"
            "try:\n    _sigmoid_focal_loss(None)\nexcept ModuleNotFoundError as e:\n    print('CLEAR:', e)\n"
            "print(mmcv.ops.point_sample.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "CLEAR: mmcv.ops.sigmoid_focal_loss needs mmcv's compiled extensions" in out.stdout
    assert "mmcv.ops.point_sample" in out.stdout  # mmcv's own pure-torch implementation


def build_model(config: str, **model_overrides):
    from mmengine.config import Config
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    import quest_segmentation.mmseg_plugin  # noqa: F401

    register_all_modules()
    cfg = Config.fromfile(config)
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.update(model_overrides)
    if model_cfg.type == "EncoderDecoder":
        model_cfg.pop("attention")
    return MODELS.build(model_cfg)


def segment(model, x_bchw):
    from mmseg.structures import SegDataSample

    model.eval()
    metas = [dict(img_shape=x_bchw.shape[-2:], ori_shape=x_bchw.shape[-2:], pad_shape=x_bchw.shape[-2:])] * len(x_bchw)
    with torch.no_grad():
        return model.encode_decode(x_bchw, metas)


@pytest.mark.parametrize("config", [TINY, PAPER], ids=["tiny", "paper"])
def test_softmax_swap_equals_the_stock_mmseg_model(config):
    torch.manual_seed(0)
    size = (64, 64) if config == TINY else (128, 128)
    overrides = {} if config == TINY else {"backbone": dict(img_size=size), "test_cfg": dict(mode="whole")}
    stock = build_model(config, type="EncoderDecoder", **overrides)
    ours = build_model(config, type="QuestEncoderDecoder", attention="softmax", **overrides)
    ours.load_state_dict(stock.state_dict())
    n_layers = len(stock.backbone.layers) + len(stock.decode_head.layers)
    assert len(ours.swap_report.swapped) == n_layers and not ours.swap_report.left, str(ours.swap_report)
    x = torch.randn(2, 3, *size)
    expected = segment(stock, x)
    torch.testing.assert_close(segment(ours, x), expected, atol=2e-5, rtol=1e-4)
    quest = build_model(config, type="QuestEncoderDecoder", attention="quest", **overrides)
    quest.load_state_dict(stock.state_dict(), strict=True)  # quest adds no parameters
    assert (segment(quest, x) - expected).abs().max() > 1e-3  # and computes something else


def test_mosaics_are_deterministic_with_labels_from_the_photos(tmp_path):
    a = D.texture_mosaics(6, 3, 32, seed=1, cache=tmp_path / "a")
    b = D.texture_mosaics(6, 3, 32, seed=1, cache=tmp_path / "b")
    for split, n in (("training", 6), ("validation", 3)):
        files = sorted((a / "annotations" / split).glob("*.png"))
        assert len(files) == n and len(list((a / "images" / split).glob("*.jpg"))) == n
        for f in files:
            label = np.asarray(Image.open(f))
            assert label.shape == (32, 32) and label.min() >= 1 and label.max() <= len(D.SOURCES)
            assert 2 <= len(np.unique(label)) <= 5
            assert (label == np.asarray(Image.open(b / "annotations" / split / f.name))).all()
    assert (a / "images" / "training" / "mosaic_00000.jpg").read_bytes() == \
        (b / "images" / "training" / "mosaic_00000.jpg").read_bytes()


def test_validation_crops_come_only_from_the_held_out_strip():
    width = 500  # photos whose pixels encode their own column: x = R + 256 * G
    x = np.arange(width)
    photo = np.zeros((300, width, 3), np.uint8)
    photo[..., 0], photo[..., 1] = x % 256, x // 256
    photos = [photo] * len(D.SOURCES)
    split_x = int(width * (1 - D.VAL_FRACTION))
    rng = np.random.default_rng(0)
    for split in ("training", "validation"):
        for _ in range(20):
            image, label = D._mosaic(photos, 48, split, rng)
            cols = image[..., 0].astype(int) + 256 * image[..., 1].astype(int)
            assert (cols < split_x).all() if split == "training" else (cols >= split_x).all()
            assert label.shape == (48, 48)


def write_ade_fixture(root, n=3, size=(40, 56)):
    """A miniature ADEChallengeData2016: JPEG images and PNG annotations with ADE's 0 = ignore, 1..150 classes."""
    rng = np.random.default_rng(0)
    for split in ("training", "validation"):
        (root / "images" / split).mkdir(parents=True)
        (root / "annotations" / split).mkdir(parents=True)
        for i in range(n):
            name = f"ADE_{'train' if split == 'training' else 'val'}_{i:08d}"
            image = rng.integers(0, 255, (*size, 3), dtype=np.uint8)
            Image.fromarray(image).save(root / "images" / split / f"{name}.jpg")
            label = rng.integers(0, 151, size, dtype=np.uint8)
            label[0, 0], label[0, 1] = 0, 150
            Image.fromarray(label).save(root / "annotations" / split / f"{name}.png")


def test_an_ade20k_layout_fixture_loads_through_the_paper_config(tmp_path):
    from mmengine.config import Config
    from mmseg.registry import DATASETS
    from mmseg.utils import register_all_modules

    register_all_modules()
    write_ade_fixture(tmp_path / "ADEChallengeData2016")
    root = D.ade20k_root(tmp_path)
    cfg = Config.fromfile(PAPER)
    dataset_cfg = copy.deepcopy(cfg.val_dataloader.dataset)
    dataset_cfg.data_root = str(root)
    dataset = DATASETS.build(dataset_cfg)
    assert len(dataset) == 3 and len(dataset.metainfo["classes"]) == 150
    sample = dataset[0]
    raw = np.asarray(Image.open(root / "annotations" / "validation" / "ADE_val_00000000.png"))
    seg = sample["data_samples"].gt_sem_seg.data[0].numpy()
    assert seg.shape == raw.shape  # the test pipeline resizes the image, not the labels
    assert seg[0, 0] == 255 and seg[0, 1] == 149  # reduce_zero_label: 0 -> ignore, k -> k - 1
    assert (seg[raw > 0] == raw[raw > 0] - 1).all()
    with pytest.raises(FileNotFoundError, match="ADEChallengeData2016"):
        D.ade20k_root(tmp_path / "nowhere")


def test_image_corruption_is_seeded_per_sample_and_checked():
    from quest_segmentation.mmseg_plugin import ImageCorruption

    img = np.random.default_rng(0).integers(0, 255, (24, 32, 3), dtype=np.uint8)
    first = ImageCorruption("gaussian_noise", 3, seed=1)({"img": img.copy(), "sample_idx": 4})["img"]
    again = ImageCorruption("gaussian_noise", 3, seed=1)({"img": img.copy(), "sample_idx": 4})["img"]
    other = ImageCorruption("gaussian_noise", 3, seed=1)({"img": img.copy(), "sample_idx": 5})["img"]
    assert first.shape == img.shape and first.dtype == np.uint8
    assert (first == again).all() and (first != other).any() and (first != img).any()
    bright = ImageCorruption("brightness", 5)({"img": np.full((4, 4, 3), 100, np.uint8)})["img"]
    assert np.isin(bright, (227, 228)).all()  # 100 + 0.5 * 255, every channel
    with pytest.raises(ValueError, match="valid: gaussian_noise"):
        ImageCorruption("snow", 1)
    with pytest.raises(ValueError, match="severity"):
        ImageCorruption("fog", 6)


def runner_for(tmp_path, work_dir, iters, resume_from=None):
    from mmengine.config import Config
    from mmengine.runner import Runner

    from quest_segmentation.experiment import set_iters

    root = D.texture_mosaics(64, 8, 64, seed=0, cache=tmp_path / "cache")
    cfg = Config.fromfile(TINY)
    for loader in ("train_dataloader", "val_dataloader", "test_dataloader"):
        cfg[loader].dataset.data_root = str(root)
    cfg.train_dataloader.batch_size = 8
    cfg.train_dataloader.dataset.pipeline = [p for p in cfg.train_pipeline if p["type"] != "RandomFlip"]
    set_iters(cfg, iters)
    cfg.default_hooks.checkpoint.interval = 2
    cfg.default_hooks.checkpoint.max_keep_ckpts = 5
    cfg.work_dir = str(work_dir)
    if resume_from:
        cfg.resume, cfg.load_from = True, str(resume_from)
    return Runner.from_cfg(cfg)


class CountIterations(Hook):
    """Records the iteration index of every training step run."""

    def __init__(self, seen: list):
        self.seen = seen

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.seen.append(runner.iter)


@pytest.mark.slow
def test_the_tuning_split_holds_out_a_fixed_part_of_training_only(tmp_path):
    from mmengine.config import Config
    from mmseg.registry import DATASETS
    from mmseg.utils import register_all_modules

    register_all_modules()
    root = D.texture_mosaics(40, 4, 32, cache=tmp_path / "cache")
    train_txt, tune_txt = D.tuning_split(root, 0.1, tmp_path / "a")
    train, tune = (p.read_text().split() for p in (train_txt, tune_txt))
    assert len(tune) == 4 and len(train) == 36 and not set(train) & set(tune)
    assert sorted(train + tune) == sorted(p.stem for p in (root / "images" / "training").glob("*.jpg"))
    again = D.tuning_split(root, 0.1, tmp_path / "b")  # the same for every run
    assert [p.read_text() for p in again] == [train_txt.read_text(), tune_txt.read_text()]
    assert D.tuning_split(root, 0.0, tmp_path / "c") is None

    cfg = Config.fromfile(TINY)  # the training loader reads only the kept images
    dataset_cfg = copy.deepcopy(cfg.train_dataloader.dataset)
    dataset_cfg.data_root, dataset_cfg.ann_file = str(root), str(train_txt)
    dataset = DATASETS.build(dataset_cfg)
    assert sorted(Path(dataset.get_data_info(i)["img_path"]).stem for i in range(len(dataset))) == sorted(train)


def test_checkpoint_resume_round_trips_under_weights_only_loading(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    straight = runner_for(tmp_path, tmp_path / "straight", iters=4)
    straight.train()
    resumed = runner_for(tmp_path, tmp_path / "resumed", iters=4, resume_from=tmp_path / "straight" / "iter_2.pth")
    trained = []
    resumed.register_hook(CountIterations(trained))
    resumed.train()  # loads iteration 2 (weights, optimizer, schedulers, message hub), trains 3 and 4
    assert trained == [2, 3] and resumed.iter == 4
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(b, a, msg=name)
    lr = straight.optim_wrapper.get_lr()["lr"][0]
    assert resumed.optim_wrapper.get_lr()["lr"][0] == pytest.approx(lr)


@pytest.mark.slow
def test_a_tiny_run_learns_and_reports_corrupted_miou(tmp_path):
    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec
    from quest_sdk.image_corruptions import CORRUPTIONS

    overrides = {"iters": 150, "mosaic_train": 300, "mosaic_val": 40, "corruption_samples": 8, "log_every": 10}
    result = execute(resolve(RunSpec("segmentation", "quest", "tiny", 0, overrides)), tmp_path / "run", progress=False)
    assert result.status == "ok", result.reason
    m = result.metrics
    assert m["miou"] > 0.25 and m["aacc"] > 0.4  # chance: aAcc ~0.1, mIoU ~0.05 for 10 classes
    assert m["val_miou"] > 0.25  # the held-out 10% of the training mosaics
    assert {f"corruption_error/{c}" for c in CORRUPTIONS} <= set(m) and 0 < m["corrupted_miou"] < 1
    assert "final_max_logit" in m and len((tmp_path / "run" / "events.jsonl").read_text().splitlines()) >= 15
    assert (tmp_path / "run" / "predictions.png").stat().st_size > 10_000


@pytest.mark.slow
def test_consecutive_runs_in_one_process_are_independent(tmp_path):
    """A Ray worker runs many runs in one process: mmengine's per-process singletons must not leak between them."""
    import shutil

    from quest_bench.runner import execute, resolve
    from quest_bench.spec import RunSpec

    overrides = {"iters": 10, "mosaic_train": 64, "mosaic_val": 8, "corruption_samples": 0}
    for seed in (0, 1):
        out = tmp_path / f"run{seed}"
        result = execute(resolve(RunSpec("segmentation", "softmax", "tiny", seed, overrides)), out, progress=False)
        assert result.status == "ok", result.reason
        assert (out / "mmseg").is_dir()
        shutil.rmtree(out)  # the next run must not write into this folder


def test_the_variants_parameters_get_no_weight_decay():
    from quest_segmentation.experiment import exclude_variant_params_from_decay
    from mmengine.config import Config

    cfg = Config.fromfile(str(CONFIGS / "segmenter_vit-tiny_mosaics-64x64.py"))
    exclude_variant_params_from_decay(cfg)
    keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
    for name in ("q_gain", "k_gain", "logit_scale", "q_ln_weight", "q_ln_bias", "k_ln_weight", "k_ln_bias"):
        assert keys[name] == dict(decay_mult=0.0)
    assert keys["pos_embed"] == dict(decay_mult=0.0)  # the config's own keys stay


@pytest.mark.slow
def test_an_interrupted_run_resumes_from_mmengine_s_latest_checkpoint(tmp_path):
    """Crash at iteration 6, resume from mmengine's checkpoint of iteration 4: the metrics and the events rows equal
    an uninterrupted run's (bitwise here: mmengine re-seeds and replays the data loader up to the checkpoint, and
    nothing in this model draws from torch's RNG); a run started again after training resumes at the end."""
    from quest_sdk.task import RunContext
    from quest_sdk.testing import straight_and_resumed
    from quest_segmentation.experiment import run
    from quest_segmentation.task import SegmentationTask

    cfg = SegmentationTask().make_config("tiny", {"iters": 10, "mosaic_train": 64, "mosaic_val": 8,
                                                  "corruption_samples": 0, "figure_images": 0, "log_every": 2})
    straight, resumed, step = straight_and_resumed(run, cfg, tmp_path, checkpoint_every=4, crash_step=6)
    assert step == 4 and resumed == straight and 0 <= straight["miou"] <= 1
    rows = [[json.loads(line) for line in (tmp_path / name / "events.jsonl").read_text().splitlines()]
            for name in ("straight", "resumed")]
    assert [r["step"] for r in rows[1]] == [1, 3, 5, 7, 9, 10]  # rows after the checkpoint dropped, logged again
    assert rows[1] == rows[0]
    for row in rows[0]:  # the engine's names (grad_norm only when the config clips gradients: this one does not)
        assert {"loss", "lr", "max_logit", "entropy_mean", "backbone.layers.0.attn.attn/max_logit",
                "backbone.layers.0.attn.attn/entropy_mean"} <= row.keys()
    assert sorted(p.name for p in (tmp_path / "resumed" / "mmseg").glob("*.pth")) == ["iter_10.pth"]  # latest only

    ctx = RunContext(tmp_path / "resumed", "quest", 0, progress=False, checkpoint_every=4)
    try:  # started again after training ended: nothing trained, the same metrics (final_* from the checkpoint)
        again = {**run(cfg, ctx).metrics, **ctx.final_metrics()}  # as the runner records them
    finally:
        ctx.close()
    assert ctx.resumed_from_step == 10 and again == straight and "final_max_logit" in again


def test_data_parallel_runs_are_refused_up_front_with_the_reason(tmp_path, capsys):
    from quest_bench.cli import main
    from quest_bench.registry import get_task
    from quest_bench.spec import RunSpec
    from quest_bench.sweep import placement

    out = tmp_path / "run"
    assert main(["run", "segmentation", "--workers", "2", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "cannot train on 2 data-parallel workers" in err and "never synchronise gradients" in err
    assert not out.exists()  # refused before anything was written
    spec = RunSpec("segmentation", "quest", "tiny", 0)
    with pytest.raises(ValueError, match="use --workers 1"):
        placement(spec, workers=2)  # what a sweep (and its dry run) resolves before Ray starts
    assert placement(spec, workers=1).workers == 1
    get_task("lm").check_workers(4)  # tasks on the shared engine train data-parallel
