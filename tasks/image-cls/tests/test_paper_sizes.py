"""The paper's ViT-S/B/L presets: their shapes and epochs, their placement on the shipped cluster manifests, the
memory one worker needs against the manifests' 24 GB GPUs, and one training step of each model on a tiny input."""

import re
from pathlib import Path

import pytest
import torch
import yaml

from quest_bench.cli import main
from quest_bench.cluster import fits, load_cluster
from quest_bench.suite import load_suite
from quest_bench.sweep import SHIPPED_CLUSTERS, placement
from quest_image_cls.experiment import build_model
from quest_image_cls.task import PAPER_WORKERS, ImageClsTask
from quest_sdk.task import transformer_train_flops

REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout these tests run in

# The paper's ImageNet-1k models and epochs (ViT-Ti 300, ViT-S 200, ViT-B and ViT-L 100):
# preset -> (embed_dim, depth, num_heads, epochs)
PAPER = {"paper": (192, 12, 3, 300), "paper-vit-s": (384, 12, 6, 200), "paper-vit-b": (768, 12, 12, 100),
         "paper-vit-l": (1024, 24, 16, 100)}
TASK = ImageClsTask()
# The GPU of the shipped manifests' GPU nodes: AWS g5.4xlarge (checked below), one NVIDIA A10G with 24 GB.
A10G_BYTES = 24e9


@pytest.mark.parametrize("preset", PAPER)
def test_each_paper_size_resolves_with_the_papers_shape_epochs_and_the_deit_batch(preset):
    cfg = TASK.make_config(preset, {})
    dim, depth, heads, epochs = PAPER[preset]
    assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.epochs) == (dim, depth, heads, epochs)
    assert (cfg.dataset, cfg.img_size, cfg.patch_size, cfg.batch_size) == ("imagenet", 224, 16, 1024)
    res = TASK.resources_for(preset)
    assert (res.workers, res.num_gpus) == (PAPER_WORKERS, 1) and cfg.batch_size % res.workers == 0
    flops = transformer_train_flops(depth, dim, 197, 4.0, 768 * dim) * (4 / 3 if cfg.grad_checkpointing else 1)
    assert res.throughput.flops_per_sample == pytest.approx(flops)
    assert res.throughput.train_samples == pytest.approx(epochs * 1_281_167 * 0.99)


def test_the_paper_suites_list_every_size_and_every_run_fits_the_shipped_manifests(capsys):
    domain, union = load_suite("paper-image-cls"), load_suite("paper")
    assert {s.preset for s in domain.specs} == set(PAPER)
    assert {s.run_id for s in domain.specs} <= {s.run_id for s in union.specs}
    for manifest in SHIPPED_CLUSTERS:
        nodes = load_cluster(REPO_ROOT / "infra" / manifest)
        for spec in domain.specs:
            where = placement(spec, "auto")
            ok, why = fits(nodes, where.workers, where.num_cpus, where.num_gpus, where.memory_gb)
            assert ok, f"{spec.label()} on {manifest}: {why}"
    assert main(["sweep", "--suite", "paper-image-cls", "--dry-run", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    for preset in PAPER:
        rows = [line for line in out.splitlines() if f"/{preset}/seed" in line]
        assert len(rows) == 12, preset  # 4 variants x 3 seeds
        assert all(re.search(r"est\. [\d.]+ GPU-h", row) and row.count(": fits") == 2 for row in rows), rows[0]
    assert "every run can be placed" in out


def saved_bytes_per_sample(model, x_bchw: torch.Tensor) -> int:
    """Bytes autograd keeps for backward after a forward of ``x_bchw`` (distinct storages), per image."""
    storages = {}

    def keep(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(x_bchw)
    return sum(storages.values()) // len(x_bchw)


@pytest.mark.parametrize("preset", PAPER)
def test_one_worker_of_each_paper_size_fits_a_24_gb_gpu(preset):
    """An upper bound measured on the CPU in float32 (bf16 autocast and the fused or flash kernels of a GPU keep
    less): weights, gradients, AdamW's two moments and the bf16 weight copies (18 bytes a parameter), plus the
    activations of the batch per GPU; with recomputation, the blocks' saved inputs plus one block's activations."""
    launcher = yaml.safe_load((REPO_ROOT / "infra" / "cluster.yaml").read_text())
    assert launcher["available_node_types"]["gpu_worker"]["node_config"]["InstanceType"] == "g5.4xlarge"
    cfg = TASK.make_config(preset, {"drop_path": 0.0})
    batch_per_gpu = cfg.batch_size // TASK.resources_for(preset).workers
    torch.manual_seed(0)
    model = build_model(cfg, "quest")
    params = sum(p.numel() for p in model.parameters())
    x_bchw = torch.rand(1, 3, cfg.img_size, cfg.img_size)
    activations = saved_bytes_per_sample(model, x_bchw)
    if cfg.grad_checkpointing:
        one_block = build_model(TASK.make_config(preset, {"depth": 1, "grad_checkpointing": False}), "quest")
        activations += saved_bytes_per_sample(one_block, x_bchw)  # the block being recomputed (+ stem and head)
    need = 18 * params + batch_per_gpu * activations
    assert need < A10G_BYTES, f"{preset}: {need / 1e9:.1f} GB for {batch_per_gpu} images per GPU"


def test_recomputing_activations_gives_the_same_gradients():
    cfg = TASK.make_config("tiny", {"drop_path": 0.1})
    torch.manual_seed(0)
    plain = build_model(cfg, "quest")
    recomputed = build_model(TASK.make_config("tiny", {"drop_path": 0.1, "grad_checkpointing": True}), "quest")
    recomputed.load_state_dict(plain.state_dict())
    x_bchw, y = torch.rand(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])
    grads = []
    for model in (plain, recomputed):
        model.train()
        torch.manual_seed(1)  # the same stochastic depth draws: recomputation replays them
        torch.nn.functional.cross_entropy(model(x_bchw), y).backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
    assert recomputed.vit.grad_checkpointing and not plain.vit.grad_checkpointing
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)


@pytest.mark.parametrize("preset", ["paper-vit-s", "paper-vit-b", "paper-vit-l"])
def test_one_training_step_of_each_size_on_a_tiny_input(preset):
    """The preset's architecture (width, depth, heads, recomputation) at 32 x 32 pixels: 2 patches a side."""
    cfg = TASK.make_config(preset, {"img_size": 32})
    torch.manual_seed(0)
    model = build_model(cfg, "quest").train()
    dim, depth, heads, _ = PAPER[preset]
    assert (len(model.vit.blocks), model.vit.embed_dim, model.vit.blocks[0].attn.num_heads) == (depth, dim, heads)
    logits = model(torch.rand(2, 3, 32, 32))
    assert logits.shape == (2, 1000)
    torch.nn.functional.cross_entropy(logits, torch.tensor([3, 7])).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
