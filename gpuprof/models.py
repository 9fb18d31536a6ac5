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

__all__ = ["small_cnn", "synthetic_batch", "train_step", "check_loss_fell", "training_bytes", "require_training_memory"]


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


def training_bytes(build: Callable[[], Any], sample_shape: tuple[int, ...], batch: int, *,
                   optimizer_states: int = 2, half_precision: bool = False) -> int:
    """A lower bound on the memory one training step of ``build()`` takes at ``batch``, computed without allocating.

    The model is built on PyTorch's ``meta`` device (shapes, no storage) and run forward on
    a meta batch, with a saved-tensor hook recording every tensor autograd keeps for
    backward (each once). All of them are alive together when the forward pass ends, beside
    the parameters, their gradients and ``optimizer_states`` tensors like them (Adam: 2, SGD
    with momentum: 1, plain SGD: 0). Temporaries, gradients of activations, workspaces and
    the allocator's rounding come on top, so a run this bound refuses cannot fit, and one it
    allows may still run out (the scripts' error handler then says so). Checked against the
    CPU's peak resident memory for the course's CNN: 1.27 GiB bound, 1.64 GiB measured at
    batch 2048. ``half_precision`` (bf16 autocast) halves the activations' share.
    """
    import torch

    with torch.device("meta"):
        model = build()
    params = list(model.parameters())
    # tensors are told apart by their storage: a weight's transpose that a layer saves is the weight's own memory
    param_storages = {p.untyped_storage()._cdata for p in params}
    saved: dict[int, int] = {}

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()._cdata
        if storage not in param_storages:
            saved[storage] = max(saved.get(storage, 0), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.empty(batch, *sample_shape, device="meta"))
    activations = sum(saved.values()) // (2 if half_precision else 1)
    return sum(p.numel() * p.element_size() for p in params) * (2 + optimizer_states) + activations


def require_training_memory(build: Callable[[], Any], sample_shape: tuple[int, ...], batch: int, device: str,
                            option: str = "--batch-size", **kw: Any) -> None:
    """Refuse, in one sentence and before anything is allocated, a batch that cannot fit (see :func:`training_bytes`)."""
    from .cli import require_memory

    require_memory(training_bytes(build, sample_shape, batch, **kw), "cpu" if device == "cpu" else "cuda",
                   f"Training at batch {batch:,}", option, lower_bound=True)


def rms_norm(x: Any, w: Any, eps: float = 1e-6) -> Any:
    """RMSNorm as Llama's code computes it: in FP32 whatever the activations' type, cast back, then scaled by ``w``.

    Shared by the examples that build a decoder by hand (weight streaming, LLM decoding), so that both
    normalise the same way.
    """
    xf = x.float()
    return (xf * (xf.pow(2).mean(-1, keepdim=True) + eps).rsqrt()).to(x.dtype) * w
