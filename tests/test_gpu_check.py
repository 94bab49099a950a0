"""`make gpu-check` (benchmarks/gpu_check.py): it skips cleanly without a GPU, and its lm pipeline (3 variants x the
paper learning rate and 40 times it) runs and reports on a CPU with a small model."""

import importlib.util

import pytest
import torch

from helpers import REPO

spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA device")
def test_without_a_gpu_it_skips_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "report.md"
    assert gpu_check.main(["--out", str(out)]) == 0
    assert "skipped: no CUDA device here" in capsys.readouterr().out
    assert not out.exists()


def test_the_lm_runs_report_logits_and_throughput_on_a_cpu(tmp_path):
    out = tmp_path / "report.md"
    small = ["--set", "depth=1", "--set", "dim=32", "--set", "num_heads=2", "--set", "context=32",
             "--set", "batch_size=4", "--set", "eval_tokens=1000"]
    assert gpu_check.main(["--device", "cpu", "--skip-tests", "--steps", "10", "--out", str(out), *small]) == 0
    rows = [line.split(" | ") for line in out.read_text().splitlines() if line.startswith("| ") and "x) |" in line]
    assert [(r[0].strip("| "), r[1]) for r in rows] == [(v, lr) for v in ("softmax", "quest", "qknorm")
                                                       for lr in ("0.00025 (1x)", "0.01 (40x)")]
    for r in rows:
        assert r[2] == "ok" and float(r[3]) >= float(r[4]) > 0 and float(r[6]) > 0  # logits, tokens/s
        assert r[7].strip(" |") == "nan"  # no TFLOP/s for a model that is not the paper's
    with pytest.raises(SystemExit, match="--steps must be >= 10"):
        gpu_check.main(["--device", "cpu", "--steps", "2"])


def test_the_report_goes_between_the_markers_of_the_shipped_guide(tmp_path):
    guide = tmp_path / "gpu-check.md"
    guide.write_text((REPO / "docs" / "gpu-check.md").read_text())
    before, _, after = guide.read_text().partition(gpu_check.BEGIN)
    after = after.partition(gpu_check.END)[2]
    for run in ("first", "second"):  # a second run replaces the first one's report
        gpu_check.write_report(guide, f"# GPU check on X\n\n{run} report\n")
        text = guide.read_text()
        assert text.startswith(before) and text.endswith(gpu_check.END + after)
        assert f"### GPU check on X\n\n{run} report\n" in text and text.count("GPU check on X") == 1
    plain = tmp_path / "report.md"  # a file without the markers gets the report alone
    plain.write_text("old")
    gpu_check.write_report(plain, "# GPU check on X\n")
    assert plain.read_text() == "# GPU check on X\n"
