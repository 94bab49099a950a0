"""swap_attention: convert a third-party model's attention modules in place, keeping their weights.

Supported hosts (more come with their domain packages):
- ``torch.nn.MultiheadAttention`` (torchvision ViT, torchaudio Conformer, nn.Transformer*, PyG's GPSConv, and
  mmcv's ``MultiheadAttention`` wrapper that mmsegmentation's ViT and Segmenter head use, ...);
- timm's ``Attention`` (timm ViT, DeiT, ...), Swin's ``WindowAttention``, EVA's ``EvaAttention``, ConViT's ``MHSA``
  and ``GPSA`` (the content branch of its gated mix) and CaiT's ``ClassAttn`` (also in XCiT), exact classes only
  (subclasses change the forward; see ``quest_core.timm_layers``);
- modules already built from quest_core: their variant is changed (learnable scales start fresh; converted timm
  modules also get the new variant's class).

Attention that no rule converts is found three ways, and each such module is listed in the report's ``left`` with
the reason; ``swap_attention`` warns about them, or with ``strict=True`` raises before changing anything:
- by name: ``attention`` or ``attn`` in the class name, or in the attribute name of a module that holds q/k/v
  projections (children named ``qkv``, ``qk``, ``kv``, ``q``/``k``/``v``, ``q_proj``/``k_proj``/``v_proj``,
  ``query``/``key``/``value``, ``to_q``/``to_qkv``, ...);
- by structure: every module with a ``nn.Linear`` child is run once on a small random token tensor (B=1, N=4,
  C = the first Linear's ``in_features``; one such tensor per required positional argument), in eval mode under
  ``torch.no_grad``, with the global RNG state and the training flags restored afterwards. A
  ``TorchFunctionMode`` watches the call: a matrix product of two activations (neither a parameter nor a buffer)
  marks its result, elementwise and reshaping ops keep the mark (scale, bias, mask, views), and a softmax over a
  marked tensor, or a call of ``scaled_dot_product_attention`` / ``multi_head_attention_forward``, is attention
  in the innermost module running at that moment. Running the forward, rather than ``torch.fx`` tracing, copes
  with the shape-dependent control flow attention code has (ConViT's GPSA cannot be fx-traced); a module whose
  forward does not accept such an input is not probed (only the name rule sees it);
- known unsupported classes (``quest_core.timm_layers.UNSUPPORTED``, e.g. XCiT's cross-covariance ``XCA``) are
  listed with the concrete reason.
"""

from __future__ import annotations

import inspect
import re
import sys
import warnings
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

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


SUPPORTED = ("nn.MultiheadAttention, timm Attention, Swin WindowAttention, EVA EvaAttention, ConViT MHSA and GPSA, "
             "CaiT/XCiT ClassAttn")


def swap_attention(model: nn.Module, variant: str, qk_scale_init: float | None = None,
                   strict: bool = False) -> SwapReport:
    """Convert every supported attention module of ``model`` to ``variant`` in place; return a report.

    With ``variant="softmax"`` the converted model computes what it computed before. Attention modules that
    cannot be converted (found by name or structure, see the module docstring) give a warning, or with
    ``strict=True`` a ValueError before anything is changed.
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
        reasons: dict[str, list[str]] = {}
        for _, cls, why in report.left:
            reasons.setdefault(why, []).append(cls)
        message = (f"swap_attention left {len(report.left)} attention module(s) unconverted: "
                   + ", ".join(f"{p or '<root>'} ({c})" for p, c, _ in report.left) + f"; supported: {SUPPORTED}"
                   + "".join(f"\n  {', '.join(dict.fromkeys(classes))}: {why}" for why, classes in reasons.items()))
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


_ATTN_NAME = re.compile(r"attn|attention", re.IGNORECASE)
_QKV_CHILD = re.compile(r"(to_)?(qkv|qk|kv|q|k|v|query|key|value)(_proj|_linear)?", re.IGNORECASE)


def holds_qkv(module: nn.Module) -> bool:
    """Whether ``module`` has a child named like a query/key/value projection (``qkv``, ``q_proj``, ``to_kv``...)."""
    return any(_QKV_CHILD.fullmatch(name) for name, _ in module.named_children())


def unconverted(model: nn.Module, swapped_paths: list[str]) -> list[tuple[str, str, str]]:
    """Attention modules (by name, structure or known class) neither swapped nor part of a swapped one, with the
    reason each is left: ``(path, class name, why)`` in model order. A module found only by its name is not listed
    when it wraps one that is swapped or listed (a block around the attention)."""
    swapped = set(swapped_paths)

    def in_swapped(path: str) -> bool:
        return "" in swapped or path in swapped or any(path.startswith(p + ".") for p in swapped)

    timm = _timm_layers()
    found = probe_attention(model, skip=in_swapped)
    no_rule = f"no swap rule for this class (supported: {SUPPORTED})"
    left, by_name = [], set()
    for path, module in model.named_modules():
        if in_swapped(path) or isinstance(module, AttentionKernel):
            continue
        name, attr = type(module).__name__, path.rsplit(".", 1)[-1]
        known = timm.unsupported_reason(module) if timm is not None else None
        if known is not None:
            left.append((path, name, known))
        elif path in found:
            left.append((path, name, f"{found[path]} (found by probing its forward); {no_rule}"))
        elif _ATTN_NAME.search(name):
            left.append((path, name, f"named like attention (class name); {no_rule}"))
            by_name.add(path)
        elif _ATTN_NAME.search(attr) and holds_qkv(module):
            left.append((path, name, f"named like attention (attribute {attr!r}) and holds q/k/v projections; "
                                     f"{no_rule}"))
            by_name.add(path)
    inner = swapped | {path for path, _, _ in left}

    def wraps(path: str) -> bool:
        return any(p != path and (path == "" or p.startswith(path + ".")) for p in inner)

    return [entry for entry in left if entry[0] not in by_name or not wraps(entry[0])]


# ---- the structural probe ---------------------------------------------------------------------------------------

_PRODUCTS = {"matmul", "__matmul__", "__rmatmul__", "bmm", "einsum", "baddbmm"}
_SOFTMAX = {"softmax", "_softmax"}
_ATTENTION_CALLS = {"scaled_dot_product_attention": "calls scaled_dot_product_attention",
                    "multi_head_attention_forward": "calls multi_head_attention_forward"}
_STOP = re.compile(r"linear|conv|norm|pool|interpolate|embedding")  # ops that mix in weights or neighbours
PROBE_TOKENS = 4  # a square number: some attention (ConViT's GPSA) lays the tokens out on a square grid


class _AttentionProbe(TorchFunctionMode):
    """Records softmax over a product of two activations, and SDPA calls, by the innermost running module."""

    def __init__(self, constants: set[int], stack: list[str]):
        super().__init__()
        self.constants, self.stack = constants, stack
        self.found: dict[str, str] = {}
        self._marked: dict[int, weakref.ref] = {}

    def _is_marked(self, t) -> bool:
        ref = self._marked.get(id(t))
        return ref is not None and ref() is t

    def _mark(self, t: torch.Tensor) -> None:
        self._marked[id(t)] = weakref.ref(t)

    def _record(self, why: str) -> None:
        if self.stack:
            self.found.setdefault(self.stack[-1], why)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        tensors = [a for a in _flat(args) + _flat(list(kwargs.values())) if isinstance(a, torch.Tensor)]
        if name in _ATTENTION_CALLS:
            self._record(_ATTENTION_CALLS[name])
        elif name in _SOFTMAX and tensors and self._is_marked(tensors[0]):
            self._record("softmax over a product of two activations (q·kᵀ)")
        elif isinstance(out, torch.Tensor):
            if name in _PRODUCTS:
                if len(tensors) >= 2 and not any(id(t) in self.constants for t in tensors):
                    self._mark(out)
            elif not _STOP.search(name) and any(self._is_marked(t) and t.numel() == out.numel() for t in tensors):
                self._mark(out)  # scale, bias, mask, view, in-place update: still the same logits
        return out


def _flat(items) -> list:
    out = []
    for item in items:
        out.extend(_flat(item) if isinstance(item, (list, tuple)) else [item])
    return out


def _required_positional(module: nn.Module) -> int:
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return max(1, sum(p.kind in kinds and p.default is inspect.Parameter.empty for p in params))


def probe_attention(model: nn.Module, skip=lambda path: False) -> dict[str, str]:
    """Modules of ``model`` whose forward computes attention, found by running each module that has an
    ``nn.Linear`` child on a small random token tensor (see the module docstring): ``{path: what was found}``.

    ``skip(path)`` leaves a module out (e.g. already converted). Modules whose forward rejects the probe input are
    not probed. The model's parameters, buffers, training flags and the global RNG state are left as they were.
    """
    modules = dict(model.named_modules())
    targets = [(path, m) for path, m in modules.items() if not skip(path) and not isinstance(m, AttentionKernel)
               and any(isinstance(c, nn.Linear) for c in m.children())]
    if not targets:
        return {}
    constants = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()}
    stack: list[str] = []
    hooks = []

    def enter(path: str) -> None:
        stack.append(path)  # hooks return None: the module's inputs and output stay as they are

    def leave() -> None:
        if stack:
            stack.pop()

    for path, m in modules.items():
        hooks.append(m.register_forward_pre_hook(lambda _m, _args, path=path: enter(path)))
        hooks.append(m.register_forward_hook(lambda _m, _args, _out: leave(), always_call=True))
    training = {path: m.training for path, m in modules.items()}
    buffers = {path: dict(m._buffers) for path, m in modules.items()}  # forwards may re-assign caches (ConViT)
    cuda = sorted({t.device.index or 0 for t in model.parameters() if t.device.type == "cuda"})
    found: dict[str, str] = {}
    try:
        model.eval()
        with torch.random.fork_rng(devices=cuda), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for path, module in targets:
                linear = next(c for c in module.children() if isinstance(c, nn.Linear))
                x = torch.randn(1, PROBE_TOKENS, linear.in_features, generator=torch.Generator().manual_seed(0))
                x = x.to(device=linear.weight.device, dtype=linear.weight.dtype)
                probe = _AttentionProbe(constants, stack)
                try:
                    with probe:
                        module(*[x] * _required_positional(module))
                except Exception:  # noqa: BLE001 - a forward that rejects the guessed input is simply not probed
                    pass
                stack.clear()
                for where, why in probe.found.items():
                    if not skip(where):
                        found.setdefault(where, why)
    finally:
        for hook in hooks:
            hook.remove()
        for path, m in modules.items():
            m.training = training[path]
            m._buffers.clear()
            m._buffers.update(buffers[path])
    return found
