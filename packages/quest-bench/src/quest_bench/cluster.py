"""The node types of a cluster manifest, and whether a run's placement fits on them (``sweep --dry-run``).

Two manifest kinds are read: a Ray cluster-launcher file (``available_node_types``: each type's ``resources`` and
``max_workers``; the head type counts once) and a KubeRay ``RayJob`` or ``RayCluster`` (the head group once, each
worker group ``maxReplicas`` times, with the CPUs, GPUs and memory of its container's limits; ``num-cpus`` /
``num-gpus`` in ``rayStartParams`` override what Ray advertises). A run fits when its data-parallel workers, each
with its CPUs, GPUs and memory, can be packed onto the largest cluster the manifest allows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

GIB = 2**30
# Kubernetes quantities: binary and decimal suffixes (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/)
K8S_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3}


@dataclass(frozen=True)
class NodeType:
    """One kind of node: what Ray sees on it, and how many of them the cluster may have."""

    name: str
    cpus: float
    gpus: float
    memory_gb: float | None  # None: the manifest does not say (not checked)
    count: int

    def describe(self) -> str:
        mem = f", {self.memory_gb:g} GiB" if self.memory_gb is not None else ""
        return f"{self.count} x {self.name} ({self.cpus:g} CPUs, {self.gpus:g} GPUs{mem})"


def k8s_quantity(value) -> float:
    """A Kubernetes resource quantity ("8", "500m", "64Gi") as a number."""
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value).strip())
    if not match or (match.group(2) and match.group(2) not in K8S_SUFFIXES):
        raise ValueError(f"{value!r} is not a Kubernetes quantity (a number with an optional suffix: "
                         f"{', '.join(K8S_SUFFIXES)})")
    return float(match.group(1)) * K8S_SUFFIXES.get(match.group(2), 1)


def load_cluster(path: Path) -> list[NodeType]:
    """The node types of a Ray cluster-launcher file or a KubeRay RayJob / RayCluster manifest."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"cannot read the cluster manifest {path}: {err}") from None
    if isinstance(doc, dict) and "available_node_types" in doc:
        return _launcher_nodes(doc)
    if isinstance(doc, dict) and doc.get("kind") in ("RayJob", "RayCluster"):
        spec = doc.get("spec") or {}
        return _kuberay_nodes(spec.get("rayClusterSpec", {}) if doc["kind"] == "RayJob" else spec)
    raise ValueError(f"{path} is neither a Ray cluster-launcher file (with available_node_types) nor a KubeRay "
                     "RayJob / RayCluster manifest")


def _launcher_nodes(doc: dict) -> list[NodeType]:
    nodes = []
    head = doc.get("head_node_type")
    for name, node in doc["available_node_types"].items():
        res = node.get("resources") or {}
        count = 1 if name == head else int(node.get("max_workers", 0))
        memory = res.get("memory")
        nodes.append(NodeType(name, float(res.get("CPU", 0)), float(res.get("GPU", 0)),
                              memory / GIB if memory is not None else None, count))
    return nodes


def _kuberay_nodes(spec: dict) -> list[NodeType]:
    groups = [("head", spec.get("headGroupSpec") or {}, 1)]
    for group in spec.get("workerGroupSpecs") or []:
        groups.append((group.get("groupName", "workers"), group,
                       int(group.get("maxReplicas", group.get("replicas", 0)))))
    nodes = []
    for name, group, count in groups:
        containers = ((group.get("template") or {}).get("spec") or {}).get("containers") or [{}]
        limits = (containers[0].get("resources") or {}).get("limits") or {}
        params = group.get("rayStartParams") or {}
        cpus = k8s_quantity(params.get("num-cpus", limits.get("cpu", 0)))
        gpus = k8s_quantity(params.get("num-gpus", limits.get("nvidia.com/gpu", 0)))
        memory = limits.get("memory")
        nodes.append(NodeType(name, cpus, gpus, k8s_quantity(memory) / GIB if memory is not None else None, count))
    return nodes


def fits(nodes: list[NodeType], workers: int, cpus: float, gpus: float, memory_gb: float) -> tuple[bool, str]:
    """Whether ``workers`` workers of (``cpus``, ``gpus``, ``memory_gb``) each can be placed on ``nodes`` (each
    node type at its maximum count), and on what, or why not."""
    per_node = {}
    for node in nodes:
        limits = [node.cpus // cpus if cpus else math.inf, node.gpus // gpus if gpus else math.inf]
        if memory_gb and node.memory_gb is not None:
            limits.append(node.memory_gb // memory_gb)
        per_node[node.name] = int(min(min(limits), workers))
    capacity = sum(per_node[n.name] * n.count for n in nodes)
    used = [f"{n.name}" for n in nodes if per_node[n.name] and n.count]
    if capacity >= workers:
        return True, "fits on " + ", ".join(used)
    have = "; ".join(n.describe() for n in nodes) or "no nodes"
    return False, f"does not fit: room for {capacity} of {workers} worker(s) on {have}"
