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

__all__ = ["small_cnn", "synthetic_batch", "train_step", "check_loss_fell", "training_bytes", "saved_tensor_bytes",
           "require_training_memory", "transformer_lm", "transformer_lm_parameters"]


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


def saved_tensor_bytes(build: Callable[[], Any], make_input: Callable[[], Any]) -> tuple[int, int]:
    """(parameter bytes, bytes of the tensors autograd saves for backward) of one forward pass, allocating nothing.

    The model is built on PyTorch's ``meta`` device (shapes, no storage) and run forward on
    ``make_input()`` (called under the meta device too), with a saved-tensor hook recording
    every tensor autograd keeps for backward, each storage once and parameters left out (a
    weight's transpose that a layer saves is the weight's own memory).
    """
    import torch

    with torch.device("meta"):
        model = build()
        example = make_input()
    params = list(model.parameters())
    param_storages = {p.untyped_storage()._cdata for p in params}
    saved: dict[int, int] = {}

    def pack(t: Any) -> Any:
        storage = t.untyped_storage()._cdata
        if storage not in param_storages:
            saved[storage] = max(saved.get(storage, 0), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(example)
    return sum(p.numel() * p.element_size() for p in params), sum(saved.values())


def training_bytes(build: Callable[[], Any], sample_shape: tuple[int, ...], batch: int, *,
                   optimizer_states: int = 2, half_precision: bool = False) -> int:
    """A lower bound on the memory one training step of ``build()`` takes at ``batch``, computed without allocating.

    The tensors autograd keeps for backward (:func:`saved_tensor_bytes`, on a random batch of
    ``sample_shape``) are all alive together when the forward pass ends, beside the parameters,
    their gradients and ``optimizer_states`` tensors like them (Adam: 2, SGD with momentum: 1,
    plain SGD: 0). Temporaries, gradients of activations, workspaces and the allocator's
    rounding come on top, so a run this bound refuses cannot fit, and one it allows may still
    run out (the scripts' error handler then says so). Checked against the CPU's peak resident
    memory for the course's CNN: 1.27 GiB bound, 1.64 GiB measured at batch 2048.
    ``half_precision`` (bf16 autocast) halves the activations' share.
    """
    import torch

    params, saved = saved_tensor_bytes(build, lambda: torch.empty(batch, *sample_shape))
    return params * (2 + optimizer_states) + saved // (2 if half_precision else 1)


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


def transformer_lm(vocab: int, d_model: int, heads: int, d_ff: int, layers: int, context: int, group: int = 1) -> Any:
    """A causal language model built from PyTorch's own ``nn.TransformerEncoderLayer`` (pre-LayerNorm, GELU, no dropout).

    Token and position embeddings, ``layers`` blocks, a final LayerNorm and a vocabulary head.
    The blocks sit in ``model.blocks`` in runs of ``group`` consecutive layers (the last run
    shorter when ``group`` does not divide ``layers``), one module per run, so that a sharding
    wrapper can take each run as a unit: ``group`` changes which layers share a unit, never the
    weights (the layers are drawn in the same order whatever the grouping). PyTorch's layer
    rather than one written here: the block a reader shards is the one they already use. Built
    on the current default device (wrap the call in ``torch.device(...)``), from the global
    generator, so a seed set before the call gives every process the same model.
    """
    import torch
    from torch import nn

    if group < 1:
        raise GpuprofError(f"a unit holds at least one layer, not {group}.")

    class Run(nn.Module):
        """Consecutive layers that one sharding unit holds."""

        def __init__(self, count: int) -> None:
            super().__init__()
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True) for _ in range(count))

        def forward(self, x: Any, mask: Any) -> Any:
            for layer in self.layers:
                x = layer(x, src_mask=mask, is_causal=True)
            return x

    class TransformerLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d_model)
            self.position = nn.Parameter(torch.randn(context, d_model) * 0.02)
            self.blocks = nn.ModuleList(Run(min(group, layers - start)) for start in range(0, layers, group))
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)

        def forward(self, tokens: Any) -> Any:
            t = tokens.shape[1]
            x = self.embed(tokens) + self.position[:t]
            mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device, dtype=x.dtype)
            for run in self.blocks:
                x = run(x, mask)
            return self.head(self.norm(x))

    return TransformerLM()


def transformer_lm_parameters(vocab: int, d_model: int, d_ff: int, layers: int, context: int) -> dict[str, int]:
    """The parameter count of :func:`transformer_lm`, by part, from the shapes alone (checked against the model).

    One block: the attention's input projection (3 d x d and 3 d biases) and output projection
    (d x d and d), the feed-forward's two matrices (d x ff, ff x d, with ff and d biases), two
    LayerNorms (2 d each). Outside the blocks: the embeddings (vocab x d), the positions
    (context x d), the final LayerNorm (2 d) and the head (vocab x d, no bias).
    """
    d, ff = d_model, d_ff
    block = (3 * d * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d) + 4 * d
    return {"block": block, "blocks": layers * block, "outside_blocks": vocab * d + context * d + 2 * d + vocab * d,
            "total": layers * block + 2 * vocab * d + context * d + 2 * d}
