"""Adversarial accuracy under L∞ FGSM, PGD and (optionally) AutoAttack, through the Adversarial Robustness Toolbox.

FGSM, PGD and ART's AutoAttack come from ART (a maintained library). Attacks run in pixel space ([0, 1]); the model
normalises internally.
PGD: Madry et al. with one random start, ``pgd_steps`` steps of ``pgd_step_size``. AutoAttack: ART's ensemble
(APGD-CE, APGD-DLR and the rest of its default list), slow: opt-in. Standard AutoAttack (Croce & Hein 2020:
APGD-CE, APGD-T, FAB-T and a 5,000-query Square) comes from torchattacks (``standard_autoattack_accuracy``), whose
``requests`` pin the workspace overrides (it never imports requests); slower still: opt-in.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def _classifier(model: nn.Module, shape: tuple[int, ...], num_classes: int, device: str):
    from art.estimators.classification import PyTorchClassifier

    return PyTorchClassifier(model=model, loss=nn.CrossEntropyLoss(), input_shape=shape, nb_classes=num_classes,
                             clip_values=(0.0, 1.0), device_type="gpu" if device == "cuda" else "cpu")


def adversarial_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, eps: float,
                         pgd_steps: int, pgd_step_size: float, autoattack: bool, device: str, batch_size: int = 250,
                         seed: int = 0, standard_autoattack: bool = False) -> dict[str, float]:
    """Accuracy on x under each attack (x: images in [0, 1] on the CPU, y: labels)."""
    from art.attacks.evasion import AutoAttack, FastGradientMethod, ProjectedGradientDescent

    model.eval()
    np.random.seed(seed)  # ART's random init draws from numpy's global state
    clf = _classifier(model, tuple(x.shape[1:]), num_classes, device)
    x_np, y_np = x.numpy().astype(np.float32), y.numpy()
    attacks = {
        "fgsm": FastGradientMethod(clf, norm=np.inf, eps=eps, batch_size=batch_size),
        "pgd": ProjectedGradientDescent(clf, norm=np.inf, eps=eps, eps_step=pgd_step_size, max_iter=pgd_steps,
                                        num_random_init=1, batch_size=batch_size, verbose=False),
    }
    if autoattack:
        attacks["autoattack"] = AutoAttack(clf, norm=np.inf, eps=eps, eps_step=pgd_step_size, batch_size=batch_size)
    out = {}
    for name, attack in attacks.items():
        x_adv = attack.generate(x=x_np, y=y_np)
        out[f"{name}_acc"] = float((clf.predict(x_adv, batch_size=batch_size).argmax(1) == y_np).mean())
    if standard_autoattack:
        out["std_autoattack_acc"] = standard_autoattack_accuracy(model, x, y, num_classes, eps, device, batch_size,
                                                                 seed)[0]
    return out


def standard_autoattack(model: nn.Module, num_classes: int, eps: float, seed: int = 0):
    """torchattacks' standard L∞ AutoAttack on ``model`` (inputs in [0, 1]): APGD-CE, APGD-T, FAB-T, Square."""
    import torchattacks

    return torchattacks.AutoAttack(model, norm="Linf", eps=eps, version="standard", n_classes=num_classes, seed=seed)


def standard_autoattack_accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, eps: float,
                                 device: str, batch_size: int = 250, seed: int = 0) -> tuple[float, torch.Tensor]:
    """Accuracy on x (images in [0, 1] on the CPU, y: labels) under the standard AutoAttack, and the adversarial
    images (on the CPU)."""
    model.eval()
    attack = standard_autoattack(model, num_classes, eps, seed)
    correct, adv_chunks = 0, []
    for x_bchw, y_b in zip(x.split(batch_size), y.split(batch_size)):
        x_bchw, y_b = x_bchw.to(device), y_b.to(device)
        adv_bchw = attack(x_bchw, y_b)
        with torch.no_grad():
            correct += int((model(adv_bchw).argmax(1) == y_b).sum())
        adv_chunks.append(adv_bchw.cpu())
    return correct / len(y), torch.cat(adv_chunks)
