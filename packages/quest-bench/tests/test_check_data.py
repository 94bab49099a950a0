"""Data checked before work starts (``Task.check_data`` at resolve: before a folder is written or Ray starts), the
layouts real downloads unpack to, and the one warm-up rule of every task."""

import pytest

from quest_bench import cli
from quest_bench.registry import get_task, task_names
from quest_sdk.config import WARMUP_KEYS, TrainingConfig
from quest_sdk.engine import warmup_steps_for

MODELNET10 = ("bathtub", "bed", "chair", "desk", "dresser", "monitor", "night_stand", "sofa", "table", "toilet")


def last_error(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_data_root_given_to_a_shipped_dataset_exits_2_before_writing(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["run", "lm", "--data-root", str(tmp_path), "--out", str(out), "--quiet"]) == 2
    error = last_error(capsys)
    assert "reads nothing from it" in error and "'wikitext-mini'" in error and "dataset= one of wikitext-2" in error
    assert not out.exists()


def test_a_generating_task_refuses_a_data_root_and_a_sweep_checks_before_ray(tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    suite.write_text("name: s\ntasks: [spurious]\nvariants: [quest]\n")
    assert cli.main(["sweep", "--suite", str(suite), "--results", str(tmp_path / "r"), "--data-root",
                     str(tmp_path)]) == 2
    assert "task 'spurious' reads nothing from it: it generates its data" in last_error(capsys)
    assert not (tmp_path / "r").exists()


def test_a_dataset_read_from_the_data_root_needs_one(tmp_path, capsys):
    assert cli.main(["run", "points", "--preset", "paper", "--out", str(tmp_path / "run")]) == 2
    error = last_error(capsys)
    assert "dataset 'modelnet40' is read from --data-root, which is not given" in error
    assert "ModelNet40/<class>/{train,test}/<class>_NNNN.off" in error and not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", task_names())
def test_every_task_s_shipped_presets_need_no_data_root_and_refuse_one(name, tmp_path):
    task = get_task(name)
    config = task.make_config("tiny", {})
    task.check_data(config, None)
    with pytest.raises(ValueError, match="reads nothing from it"):
        task.check_data(config, str(tmp_path))


def modelnet10(root, name=lambda cls, n: f"{cls}_{n:04d}.off"):
    for cls in MODELNET10:
        for split in ("train", "test"):
            (root / "ModelNet10" / cls / split).mkdir(parents=True)
            (root / "ModelNet10" / cls / split / name(cls, 1)).write_text("OFF\n")


def test_modelnet_as_its_zip_unpacks_passes_and_misnamed_files_or_zip_metadata_are_named(tmp_path):
    task = get_task("points")
    config = task.make_config("tiny", {"dataset": "modelnet10"})
    good, bad = tmp_path / "good", tmp_path / "bad"
    modelnet10(good)
    task.check_data(config, str(good))
    (good / "ModelNet10" / "__MACOSX").mkdir()
    with pytest.raises(ValueError, match="__MACOSX, which is not a class"):
        task.check_data(config, str(good))
    modelnet10(bad, name=lambda cls, n: f"{n}.off")
    with pytest.raises(ValueError, match=r"no bathtub_NNNN.off in .*bathtub/train \(found e.g. 1.off\); expected"):
        task.check_data(config, str(bad))


def test_imagenet_s_flat_val_is_named_with_the_command_that_sorts_it(tmp_path):
    from quest_image_cls.data import arrange_val

    task = get_task("image-cls")
    config = task.make_config("tiny", {"dataset": "imagenet"})
    (tmp_path / "train" / "n01440764").mkdir(parents=True)
    (tmp_path / "val").mkdir()
    for n in (1, 2):
        (tmp_path / "val" / f"ILSVRC2012_val_{n:08d}.JPEG").write_bytes(b"")
    with pytest.raises(ValueError, match="holds images directly .*`python -m quest_image_cls.data arrange-val"):
        task.check_data(config, str(tmp_path))
    labels = tmp_path / "LOC_val_solution.csv"
    labels.write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 1 2 3 4\n")
    with pytest.raises(ValueError, match="1 images in .* have no label"):
        arrange_val(tmp_path, labels)
    assert (tmp_path / "val" / "ILSVRC2012_val_00000001.JPEG").exists()  # nothing moved
    labels.write_text(labels.read_text() + "ILSVRC2012_val_00000002,n01443537 1 2 3 4\n")
    assert arrange_val(tmp_path, labels) == 2
    assert (tmp_path / "val" / "n01443537" / "ILSVRC2012_val_00000002.JPEG").exists()
    task.check_data(config, str(tmp_path))


@pytest.mark.parametrize("name", [n for n in task_names() if issubclass(get_task(n).config_class, TrainingConfig)])
def test_one_warm_up_rule_refuses_a_warm_up_longer_than_the_run_when_resolved(name):
    task = get_task(name)
    config = task.make_config("tiny", {})
    for warmup_key, length_key in WARMUP_KEYS:
        if hasattr(config, warmup_key):
            with pytest.raises(ValueError, match=rf"task '{name}': invalid config: the warm-up is longer than the run: "
                                                 rf"{warmup_key}=3 > {length_key}=2; set {warmup_key} to at most 2"):
                task.make_config("tiny", {length_key: 2, warmup_key: 3})
            task.make_config("tiny", {length_key: 2, warmup_key: 2})  # as long as the run: warms up throughout
    series = get_task("timeseries").make_config("tiny", {"epochs": 10, "warmup_epochs": 5})
    assert warmup_steps_for(series, steps=70, steps_per_epoch=7) == 35
    asr = get_task("asr").make_config("tiny", {"warmup_frac": 0.05})
    assert warmup_steps_for(asr, steps=100) == 5
    with pytest.raises(ValueError, match="needs the steps per epoch"):
        warmup_steps_for(series, steps=70)
