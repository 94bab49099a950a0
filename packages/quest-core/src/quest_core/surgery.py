"""swap_attention: convert a third-party model's attention modules in place, keeping their weights.

Supported hosts (more come with their domain packages):
- ``torch.nn.MultiheadAttention`` (torchvision ViT, torchaudio Conformer, nn.Transformer*, PyG's GPSConv, and
  mmcv's ``MultiheadAttention`` wrapper that mmsegmentation's ViT and Segmenter head use, ...);
- timm's ``Attention`` (timm ViT, DeiT, ...), Swin's ``WindowAttention`` and EVA's ``EvaAttention``, exact classes
  only (subclasses change the forward; see ``quest_core.timm_layers``);
- modules already built from quest_core: their variant is changed (learnable scales start fresh; converted timm
  modules also get the new variant's class).

Modules that look like attention (``attention`` or ``attn`` in the class name) but have no rule are listed in the
report; ``swap_attention`` warns about them, or with ``strict=True`` raises before changing anything.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field

from torch import nn

from quest_core.elliptical import link_elliptical
from quest_core.kernel import AttentionKernel
from quest_core.modules import MultiheadAttention
from quest_core.variants import get_variant


@dataclass
class SwapReport:
    """What ``swap_attention`` did to a model."""

    variant: str
    swapped: list[tuple[str, str]] = field(default_factory=list)  # (module path, original class name)
    left: list[tuple[str, str, str]] = field(default_factory=list)  # (module path, class name, why)
    notes: list[str] = field(default_factory=list)  # side changes, e.g. fast paths turned off

    def __str__(self) -> str:
        lines = [f"swap_attention -> {self.variant}: {len(self.swapped)} swapped, {len(self.left)} left"]
        lines += [f"  swapped  {path or '<root>'}  ({cls})" for path, cls in self.swapped]
        lines += [f"  left     {path or '<root>'}  ({cls}): {why}" for path, cls, why in self.left]
        lines += [f"  note     {note}" for note in self.notes]
        return "\n".join(lines)


def _timm_layers():
    if "timm" not in sys.modules:  # a model cannot hold timm modules if timm was never imported
        return None
    from quest_core import timm_layers

    return timm_layers


SUPPORTED = "nn.MultiheadAttention, timm Attention, Swin WindowAttention, EVA EvaAttention"


def swap_attention(model: nn.Module, variant: str, qk_scale_init: float | None = None,
                   strict: bool = False) -> SwapReport:
    """Convert every supported attention module of ``model`` to ``variant`` in place; return a report.

    With ``variant="softmax"`` the converted model computes what it computed before. Attention-like modules that
    cannot be converted give a warning, or with ``strict=True`` a ValueError before anything is changed.
    """
    spec = get_variant(variant)
    report = SwapReport(spec.name)
    timm = _timm_layers()
    plan = []
    for path, module in model.named_modules():
        if timm is not None and timm.quest_base(module) is not None:
            plan.append((path, module, "timm"))
        elif isinstance(getattr(module, "kernel", None), AttentionKernel):
            plan.append((path, module, "kernel"))
        elif isinstance(module, nn.MultiheadAttention):
            plan.append((path, module, "mha"))
    report.swapped = [(path, type(module).__name__) for path, module, _ in plan]
    report.left = unconverted(model, [p for p, _ in report.swapped])
    if report.left:
        message = (f"swap_attention left {len(report.left)} attention module(s) unconverted: "
                   + ", ".join(f"{p or '<root>'} ({c})" for p, c, _ in report.left) + f"; supported: {SUPPORTED}")
        if strict:
            raise ValueError(message)
        warnings.warn(message, stacklevel=2)
    for path, module, kind in plan:
        if kind == "timm":
            timm.convert(module, spec.name, qk_scale_init)
        elif kind == "kernel":
            module.kernel = AttentionKernel(
                spec.name, module.kernel.num_heads, module.kernel.head_dim, qk_scale_init,
                device=next(module.parameters()).device, dtype=next(module.parameters()).dtype,
            )
        else:
            MultiheadAttention.convert(module, spec.name, qk_scale_init)
    if link_elliptical(model) is not None:
        report.notes.append("elliptical kernels linked into one metric chain (quest_core.link_elliptical)")
    for path, module in model.named_modules():
        if isinstance(module, nn.TransformerEncoder) and getattr(module, "use_nested_tensor", False):
            module.use_nested_tensor = False
            report.notes.append(f"{path or '<root>'}: turned off nn.TransformerEncoder's nested-tensor fast path")
    return report


def unconverted(model: nn.Module, swapped_paths: list[str]) -> list[tuple[str, str, str]]:
    """Attention-like modules (by class name) that are neither swapped nor inside or around a swapped one."""
    left = []
    for path, module in model.named_modules():
        name = type(module).__name__
        if not ("attention" in name.lower() or "attn" in name.lower()) or isinstance(module, AttentionKernel):
            continue
        prefix = path + "." if path else ""
        if path in swapped_paths or any(p.startswith(prefix) for p in swapped_paths):
            continue  # swapped, or a wrapper whose attention inside was swapped
        if any(path.startswith(p + ".") for p in swapped_paths):
            continue  # a part of a swapped module
        left.append((path, name, f"no swap rule for this class (supported: {SUPPORTED})"))
    return left
