"""swap_attention: convert a third-party model's attention modules in place, keeping their weights.

Supported hosts (more come with their domain packages):
- ``torch.nn.MultiheadAttention`` (torchvision ViT, torchaudio Conformer, nn.Transformer*, PyG's GPSConv, and
  mmcv's ``MultiheadAttention`` wrapper that mmsegmentation's ViT and Segmenter head use, ...);
- timm's ``Attention`` (timm ViT, DeiT, ...), exact class only: subclasses change the forward;
- modules already built from quest_core: their variant is changed (learnable scales start fresh).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from torch import nn

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


def _timm_attention_class():
    if "timm" not in sys.modules:  # a model cannot hold timm modules if timm was never imported
        return None
    from timm.layers import Attention

    return Attention


def swap_attention(model: nn.Module, variant: str, qk_scale_init: float | None = None) -> SwapReport:
    """Convert every supported attention module of ``model`` to ``variant`` in place; return a report.

    With ``variant="softmax"`` the converted model computes what it computed before.
    """
    spec = get_variant(variant)
    report = SwapReport(spec.name)
    timm_attention = _timm_attention_class()
    for path, module in list(model.named_modules()):
        kernel = getattr(module, "kernel", None)
        if isinstance(kernel, AttentionKernel):
            module.kernel = AttentionKernel(
                spec.name, kernel.num_heads, kernel.head_dim, qk_scale_init,
                device=next(module.parameters()).device, dtype=next(module.parameters()).dtype,
            )
            report.swapped.append((path, type(module).__name__))
        elif isinstance(module, nn.MultiheadAttention):
            report.swapped.append((path, type(module).__name__))
            MultiheadAttention.convert(module, spec.name, qk_scale_init)
        elif timm_attention is not None and type(module) is timm_attention:
            from quest_core import timm_layers

            report.swapped.append((path, "timm.Attention"))
            timm_layers.convert(module, spec.name, qk_scale_init)
        if isinstance(module, nn.TransformerEncoder) and getattr(module, "use_nested_tensor", False):
            module.use_nested_tensor = False
            report.notes.append(f"{path or '<root>'}: turned off nn.TransformerEncoder's nested-tensor fast path")

    swapped_paths = [p for p, _ in report.swapped]
    for path, module in model.named_modules():
        name = type(module).__name__
        if "attention" not in name.lower() or isinstance(module, AttentionKernel) or path in swapped_paths:
            continue
        prefix = path + "." if path else ""
        if any(p.startswith(prefix) for p in swapped_paths):
            continue  # a wrapper whose attention inside was swapped
        report.left.append((path, name, "no swap rule for this class (supported: nn.MultiheadAttention, timm Attention)"))
    return report
