"""The paper-scale plan: the paper suites, cluster manifests read as node types, placements checked against them,
GPU-hour estimates from the tasks' throughput declarations, per-task timeouts, and ``sweep --dry-run`` on a
machine without a GPU."""

import re
from pathlib import Path

import pytest

from quest_bench.cli import main
from quest_bench.cluster import NodeType, fits, k8s_quantity, load_cluster
from quest_bench.registry import get_task, task_names
from quest_bench.suite import load_suite
from quest_bench.sweep import SHIPPED_CLUSTERS, dry_run, placement
from quest_sdk.task import DEFAULT_TIMEOUT_S, Throughput, transformer_train_flops

REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout these tests run in

SHIPPED = [REPO_ROOT / "infra" / name for name in SHIPPED_CLUSTERS]


def test_the_paper_suite_covers_every_task_and_each_domain_suite_is_part_of_it():
    paper = load_suite("paper")
    assert {s.task for s in paper.specs} == set(task_names())
    assert all(s.preset == "paper" or s.preset.startswith("paper-") for s in paper.specs)  # image-cls: paper-vit-*
    ids = {s.run_id for s in paper.specs}
    domains = sorted((REPO_ROOT / "configs" / "suites").glob("paper-*.yaml"))
    covered = set()
    for path in domains:
        specs = load_suite(str(path)).specs
        assert specs and {s.run_id for s in specs} <= ids, path.name
        covered |= {s.task for s in specs}
    assert covered == set(task_names())


@pytest.mark.parametrize("manifest", SHIPPED, ids=lambda p: p.name)
def test_every_paper_run_can_be_placed_on_the_shipped_manifests(manifest):
    nodes = load_cluster(manifest)
    assert any(n.gpus for n in nodes)
    for spec in load_suite("paper").specs:
        where, res = placement(spec, "auto"), get_task(spec.task).resources_for(spec.preset)
        ok, why = fits(nodes, where.workers, where.num_cpus, where.num_gpus, res.memory_gb)
        assert ok, f"{spec.label()} on {manifest.name}: {why}"


def test_a_node_too_small_for_a_worker_is_refused_with_what_the_nodes_have():
    small = [NodeType("gpu", cpus=8, gpus=1, memory_gb=64, count=8)]
    ok, why = fits(small, workers=8, cpus=10, gpus=1, memory_gb=32)  # the old image-cls ask on the old nodes
    assert not ok and "room for 0 of 8" in why and "8 x gpu (8 CPUs, 1 GPUs, 64 GiB)" in why
    assert not fits(small, workers=9, cpus=8, gpus=1, memory_gb=0)[0]  # one GPU node too few
    assert not fits(small, workers=1, cpus=1, gpus=0, memory_gb=65)[0]  # memory counts where declared
    assert fits([NodeType("gpu", 8, 1, None, 8)], workers=8, cpus=8, gpus=1, memory_gb=500)[0]  # not declared


def test_kuberay_manifests_read_limits_start_params_and_max_replicas(tmp_path):
    path = tmp_path / "raycluster.yaml"
    path.write_text("kind: RayCluster\nspec:\n  headGroupSpec:\n    rayStartParams: {num-cpus: '0'}\n"
                    "    template: {spec: {containers: [{resources: {limits: {cpu: '4', memory: 8Gi}}}]}}\n"
                    "  workerGroupSpecs:\n  - groupName: g\n    replicas: 1\n    maxReplicas: 3\n"
                    "    template: {spec: {containers: [{resources: {limits: {cpu: 2500m, memory: 16G, "
                    "nvidia.com/gpu: '2'}}}]}}\n")
    head, group = load_cluster(path)
    assert (head.cpus, head.gpus, head.memory_gb, head.count) == (0, 0, 8, 1)
    assert (group.cpus, group.gpus, group.count) == (2.5, 2, 3)
    assert group.memory_gb == pytest.approx(16e9 / 2**30)
    assert k8s_quantity("500m") == 0.5 and k8s_quantity("64Gi") == 64 * 2**30


def test_unreadable_manifests_and_quantities_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        k8s_quantity("8 cores")
    bad = tmp_path / "other.yaml"
    bad.write_text("kind: Deployment\n")
    with pytest.raises(ValueError, match="neither a Ray cluster-launcher file"):
        load_cluster(bad)


def test_every_gpu_paper_preset_declares_its_throughput_and_gets_its_own_timeout():
    timeouts = set()
    for name in task_names():
        task = get_task(name)
        res = task.resources_for("paper")
        if res.num_gpus:
            assert res.throughput is not None and res.throughput.basis, name
            assert 0 < task.timeout_for("paper") <= DEFAULT_TIMEOUT_S["paper"]
            timeouts.add(task.timeout_for("paper"))
    assert len(timeouts) > 1  # not one timeout for every task


def test_gpu_hours_scale_with_the_work_and_the_assumed_rate():
    flops = transformer_train_flops(12, 192, 197, 4.0)
    # ViT-Ti's forward is ~1.3 G multiply-adds per image (DeiT's table): 3 x 2 x that for a training step
    assert 6 * 1.2e9 < flops < 6 * 1.4e9
    one = Throughput(1e6, flops, "test")
    assert Throughput(2e6, flops, "test").gpu_hours(30) == pytest.approx(2 * one.gpu_hours(30))
    assert one.gpu_hours(60) == pytest.approx(one.gpu_hours(30) / 2)
    with pytest.raises(ValueError, match="train_samples > 0"):
        Throughput(0, flops, "test")
    with pytest.raises(ValueError, match="must be > 0 TFLOP/s"):
        one.gpu_hours(0)


def test_dry_run_reports_each_run_and_the_total(tmp_path):
    text = dry_run(load_suite("paper-lm"), tmp_path, "cuda", data_root="/shared/data",
                   clusters=[REPO_ROOT / "infra" / "cluster.yaml"], gpu_tflops=60)
    lines = [l for l in text.splitlines() if l.startswith("  lm/") and "/seed" in l]
    assert len(lines) == 12  # 4 variants x 3 seeds
    hours = get_task("lm").resources_for("paper").throughput.gpu_hours(60)
    assert all("4 x (8 CPUs, 1 GPUs, 32 GiB, cuda); data wikitext-103" in l and "cluster.yaml: fits" in l
               for l in lines)
    assert f"est. {hours:.3g} GPU-h" in lines[0]
    assert f"estimated {12 * hours:.4g} GPU-hours at an assumed sustained 60 TFLOP/s" in text
    assert "data root: /shared/data" in text and "cluster cluster.yaml: every run can be placed" in text


def test_dry_run_names_runs_a_given_cluster_cannot_host(tmp_path):
    small = tmp_path / "small.yaml"
    small.write_text("head_node_type: head\navailable_node_types:\n  head: {resources: {CPU: 8}}\n"
                     "  gpu: {resources: {CPU: 8, GPU: 1}, max_workers: 2}\n")
    text = dry_run(load_suite("paper-lm"), tmp_path, clusters=[small])
    assert "small.yaml: does not fit: room for 2 of 4 worker(s)" in text
    assert "cluster small.yaml: 12 runs cannot be placed" in text


def test_cli_dry_run_with_cuda_needs_no_gpu(tmp_path, capsys):
    assert main(["sweep", "--suite", "paper-points", "--dry-run", "--device", "cuda", "--results",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"points/quest/paper/seed0 +4 x \(8 CPUs, 1 GPUs, 16 GiB, cuda\)", out)
    assert "cluster kuberay-rayjob.yaml: every run can be placed" in out


def test_memory_reservations_reach_the_placement_and_the_live_feasibility_check():
    from quest_bench.spec import RunSpec
    from quest_bench.sweep import check_feasible

    spec = RunSpec("lm", "quest", "paper", 0)
    where = placement(spec)
    assert (where.workers, where.memory_gb, where.memory_bytes) == (4, 32, 32 * 2**30)
    assert "32 GiB" in where.total
    roomy = [{"Alive": True, "Resources": {"CPU": 16.0, "GPU": 1.0, "memory": 40.0 * 2**30}}] * 4
    check_feasible([spec], {spec.run_id: where}, roomy)
    tight = [{"Alive": True, "Resources": {"CPU": 16.0, "GPU": 1.0, "memory": 24.0 * 2**30}}] * 4
    with pytest.raises(ValueError, match=r"32 GiB \(cuda\), but the cluster's nodes have: 16 CPUs, 1 GPUs, 24 GiB"):
        check_feasible([spec], {spec.run_id: where}, tight)
