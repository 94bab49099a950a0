"""A segmentation backbone that starts from an ``image-cls`` run of the same attention variant.

``image_cls_backbone(run_dir, variant, out_file)`` reads a finished image-cls run folder (``spec.json``,
``result.json``, ``checkpoint.pt``), renames its timm ViT's weights to mmseg's ``VisionTransformer`` layout (the
mapping of mmseg's ``tools/model_converters/vit2mmseg.py``, plus the attention variants' own parameters, which
quest-core names ``kernel.*`` in both) and writes them where mmseg's ``pretrained`` loads them (mmseg resizes the
position embedding to the segmentation crop). The classifier head is dropped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

# timm ViT name -> mmseg VisionTransformer name (torch's in-proj layout [q; k; v] is timm's qkv layout)
TIMM_TO_MMSEG = [
    (r"^(cls_token|pos_embed)$", r"\1"),
    (r"^patch_embed\.proj\.(weight|bias)$", r"patch_embed.projection.\1"),
    (r"^blocks\.(\d+)\.norm1\.(weight|bias)$", r"layers.\1.ln1.\2"),
    (r"^blocks\.(\d+)\.norm2\.(weight|bias)$", r"layers.\1.ln2.\2"),
    (r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", r"layers.\1.attn.attn.in_proj_\2"),
    (r"^blocks\.(\d+)\.attn\.proj\.(weight|bias)$", r"layers.\1.attn.attn.out_proj.\2"),
    (r"^blocks\.(\d+)\.attn\.kernel\.(\w+)$", r"layers.\1.attn.attn.kernel.\2"),
    (r"^blocks\.(\d+)\.mlp\.fc1\.(weight|bias)$", r"layers.\1.ffn.layers.0.0.\2"),
    (r"^blocks\.(\d+)\.mlp\.fc2\.(weight|bias)$", r"layers.\1.ffn.layers.1.\2"),
    (r"^norm\.(weight|bias)$", r"ln1.\1"),
]
DROPPED = re.compile(r"^(head|fc_norm)\.")  # the classifier


def timm_to_mmseg(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A timm ViT state dict in mmseg's VisionTransformer names; a weight with no counterpart is an error."""
    out, unknown = {}, []
    for name, value in state.items():
        if DROPPED.match(name):
            continue
        for pattern, replacement in TIMM_TO_MMSEG:
            if re.match(pattern, name):
                out[re.sub(pattern, replacement, name)] = value
                break
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(f"no mmseg counterpart for the ViT weights {', '.join(unknown[:5])}"
                         + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""))
    return out


def image_cls_backbone(run_dir: Path, variant: str, out_file: Path) -> Path:
    """Write the ViT of the finished image-cls run in ``run_dir`` to ``out_file`` in mmseg's layout; the run must
    have trained with attention ``variant``."""
    run_dir = Path(run_dir)
    files = {name: run_dir / name for name in ("spec.json", "result.json", "checkpoint.pt")}
    missing = [name for name, path in files.items() if not path.is_file()]
    if missing:
        raise ValueError(f"init_from={str(run_dir)!r} is not a finished run folder: no {', '.join(missing)} there "
                         "(give the folder of an image-cls run: results/<suite>/runs/<run_id> or a `run --out`)")
    spec = json.loads(files["spec.json"].read_text())
    result = json.loads(files["result.json"].read_text())
    if spec.get("task") != "image-cls" or result.get("status") != "ok":
        raise ValueError(f"init_from={str(run_dir)!r}: a finished image-cls run is needed, this is task "
                         f"{spec.get('task')!r} with status {result.get('status')!r}")
    if spec.get("variant") != variant:
        raise ValueError(f"init_from={str(run_dir)!r} trained attention {spec.get('variant')!r}, this run uses "
                         f"{variant!r}: start from an image-cls run of the same variant")
    model = torch.load(files["checkpoint.pt"], map_location="cpu", weights_only=True)["model"]
    vit = {name.removeprefix("vit."): value for name, value in model.items() if name.startswith("vit.")}
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": timm_to_mmseg(vit)}, out_file)
    return out_file
