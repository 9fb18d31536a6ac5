"""Small PyTorch models and synthetic data for the profiler chapters: nothing to download, seeded, checked.

The PyTorch profiler chapter profiles a small CNN on CIFAR-sized images: big enough that
the GPU runs real convolution and matrix-product kernels, small enough that a step is a
few milliseconds and the host's launch overhead is visible beside them. The data are
random tensors with fixed labels, so a training step's loss must fall: :func:`train`
checks that, so a profile of a broken step is never mistaken for a profile of a working one.
"""

from __future__ import annotations

from typing import Any, Callable

from .errors import GpuprofError

__all__ = ["small_cnn", "synthetic_batch", "train_step", "check_loss_fell"]


def small_cnn() -> Any:
    """Two convolution blocks and a linear classifier (76,938 parameters), for 3 x 32 x 32 images."""
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def synthetic_batch(batch: int, device: str, seed: int = 0) -> tuple[Any, Any]:
    """Random images and labels, the same for a given seed on every machine (drawn on the CPU, then moved)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    return x.to(device), y.to(device)


def train_step(model: Any, opt: Any, x: Any, y: Any, *, annotate: Callable[[str], Any] | None = None) -> Any:
    """One step: forward, loss, backward, optimizer step. ``annotate`` (for example
    ``torch.profiler.record_function``) wraps each phase in a named range. Returns the loss tensor
    (not read back, so that the step does not synchronise)."""
    import contextlib

    from torch import nn

    phase = annotate or (lambda name: contextlib.nullcontext())
    with phase("forward"):
        loss = nn.functional.cross_entropy(model(x), y)
    with phase("backward"):
        loss.backward()
    with phase("optimizer_step"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss


def check_loss_fell(losses: list[float]) -> str:
    """A sentence saying the loss fell from the first step to the last; :class:`GpuprofError` if it did not."""
    if len(losses) < 2 or not losses[-1] < losses[0]:
        raise GpuprofError(f"the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f}): the training step is broken."
                           if losses else "no training step ran.")
    return f"result checked: the loss fell from {losses[0]:.4f} to {losses[-1]:.4f} over {len(losses)} steps"
