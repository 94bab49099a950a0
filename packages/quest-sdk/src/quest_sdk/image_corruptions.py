"""Image corruptions in the four ImageNet-C families (Hendrycks & Dietterich 2019), 5 severities, in torch.

Written by hand rather than taken from ``imagecorruptions``: that package works per image in numpy, needs images of
at least ~32 px for several corruptions (frost crops bundled 224 px textures), and cannot take a seed per call. These
run batched on (B, C, H, W) float images in [0, 1] of any size, and are deterministic given ``seed``.

| family  | corruptions                           | severity parameters (1..5)                            |
|---------|---------------------------------------|-------------------------------------------------------|
| noise   | gaussian_noise, shot_noise, impulse_noise | ImageNet-C's: σ .08–.38, photons 60–3, amount .03–.27 |
| blur    | gaussian_blur, motion_blur            | σ and kernel length relative to image size (CIFAR-C's at 32 px) |
| weather | fog, brightness                       | low-frequency haze strength; +0.1–0.5 brightness      |
| digital | contrast, pixelate, jpeg_compression  | ImageNet-C's contrast .4–.05 and JPEG quality 25–7; pixelate .5–.2 (ImageNet-C .6–.25, which aliases out of order at 28 px) |

Left out of ImageNet-C's 15: glass and zoom blur, snow, frost, elastic transform (their reference versions depend
on image files or on per-pixel loops too slow on a CPU); gaussian_blur stands in for defocus blur.
Mean corruption error (mCE) is computed in the leaderboard, relative to the `softmax` variant.
"""

from __future__ import annotations

import io
import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from quest_sdk.robustness import check_corruption

SEVERITIES = (1, 2, 3, 4, 5)


def _gen(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def gaussian_noise(x, s, seed):
    sigma = (0.08, 0.12, 0.18, 0.26, 0.38)[s - 1]
    return x + sigma * torch.randn(x.shape, generator=_gen(seed, x.device), device=x.device)


def shot_noise(x, s, seed):
    photons = (60, 25, 12, 5, 3)[s - 1]
    return torch.poisson(x * photons, generator=_gen(seed, x.device)) / photons


def impulse_noise(x, s, seed):
    amount = (0.03, 0.06, 0.09, 0.17, 0.27)[s - 1]
    u = torch.rand(x.shape, generator=_gen(seed, x.device), device=x.device)
    return torch.where(u < amount / 2, torch.zeros_like(x), torch.where(u > 1 - amount / 2, torch.ones_like(x), x))


def _conv_per_channel(x, kernel_bkk):
    """Convolve each image (all channels) with its own kernel (B, k, k), reflect-padded."""
    b, c, h, w = x.shape
    k = kernel_bkk.shape[-1]
    padded = F.pad(x.reshape(1, b * c, h, w), (k // 2,) * 4, mode="reflect" if k // 2 < min(h, w) else "replicate")
    weight = kernel_bkk.repeat_interleave(c, dim=0).unsqueeze(1)  # (B*C, 1, k, k)
    return F.conv2d(padded, weight, groups=b * c).reshape(b, c, h, w)


def gaussian_blur(x, s, seed):
    sigma = (0.4, 0.6, 0.8, 1.0, 1.5)[s - 1] * x.shape[-1] / 32
    radius = max(1, math.ceil(3 * sigma))
    t = torch.arange(-radius, radius + 1, device=x.device, dtype=x.dtype)
    g = torch.exp(-(t**2) / (2 * sigma**2))
    kernel = torch.outer(g, g)
    return _conv_per_channel(x, (kernel / kernel.sum()).expand(x.shape[0], -1, -1))


def motion_blur(x, s, seed):
    length = max(2, round((3, 5, 7, 9, 11)[s - 1] * x.shape[-1] / 32))
    size = length | 1  # odd
    angles = torch.rand(x.shape[0], generator=_gen(seed, "cpu")) * math.pi
    c = size // 2
    kernels = torch.zeros(x.shape[0], size, size)
    for i, a in enumerate(angles.tolist()):  # a line of `length` pixels through the centre at angle a
        for t in torch.linspace(-(length - 1) / 2, (length - 1) / 2, length).tolist():
            kernels[i, round(c + t * math.sin(a)), round(c + t * math.cos(a))] = 1.0
    kernels = kernels / kernels.sum((1, 2), keepdim=True)
    return _conv_per_channel(x, kernels.to(x.device, x.dtype))


def fog(x, s, seed):
    strength = (0.2, 0.35, 0.5, 0.7, 0.9)[s - 1]
    b, _, h, w = x.shape
    noise = torch.rand(b, 1, 4, 4, generator=_gen(seed, x.device), device=x.device)
    haze = F.interpolate(noise, size=(h, w), mode="bicubic", align_corners=False).clamp(0, 1)
    peak = x.amax(dim=(1, 2, 3), keepdim=True)
    return (x + strength * haze) * peak / (peak + strength)


def brightness(x, s, seed):
    return x + (0.1, 0.2, 0.3, 0.4, 0.5)[s - 1]


def contrast(x, s, seed):
    c = (0.4, 0.3, 0.2, 0.1, 0.05)[s - 1]
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - mean) * c + mean


def pixelate(x, s, seed):
    c = (0.5, 0.4, 0.33, 0.25, 0.2)[s - 1]  # ImageNet-C: .6–.25; non-integer factors alias at 28 px
    h, w = x.shape[-2:]
    small = F.interpolate(x, size=(max(1, round(h * c)), max(1, round(w * c))), mode="area")
    return F.interpolate(small, size=(h, w), mode="nearest")


def jpeg_compression(x, s, seed):
    quality = (25, 18, 15, 10, 7)[s - 1]
    out = []
    for img in x.clamp(0, 1).mul(255).round().byte().cpu().numpy():
        mode_img = Image.fromarray(img[0] if img.shape[0] == 1 else np.moveaxis(img, 0, -1))
        buf = io.BytesIO()
        mode_img.save(buf, format="JPEG", quality=quality)
        arr = np.asarray(Image.open(buf), dtype=np.float32) / 255
        out.append(torch.from_numpy(arr[None] if arr.ndim == 2 else np.moveaxis(arr, -1, 0)))
    return torch.stack(out).to(x.device, x.dtype)


CORRUPTIONS: dict[str, tuple[str, Callable]] = {
    "gaussian_noise": ("noise", gaussian_noise),
    "shot_noise": ("noise", shot_noise),
    "impulse_noise": ("noise", impulse_noise),
    "gaussian_blur": ("blur", gaussian_blur),
    "motion_blur": ("blur", motion_blur),
    "fog": ("weather", fog),
    "brightness": ("weather", brightness),
    "contrast": ("digital", contrast),
    "pixelate": ("digital", pixelate),
    "jpeg_compression": ("digital", jpeg_compression),
}


def corrupt(x: torch.Tensor, name: str, severity: int, seed: int = 0) -> torch.Tensor:
    """Apply corruption ``name`` at ``severity`` (1..5) to images in [0, 1]; the result is clipped to [0, 1]."""
    check_corruption(name, severity, CORRUPTIONS, SEVERITIES)
    return CORRUPTIONS[name][1](x, severity, seed).clamp(0, 1)
