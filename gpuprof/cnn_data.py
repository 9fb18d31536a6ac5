"""A CIFAR-sized image task that needs no download, and the two input pipelines the CNN chapter compares.

The CNN case study needs data whose preparation costs real CPU time per image (as decoding
and augmenting photographs does) and a task the network can learn, so that a faster loop
can be checked to still train. :func:`make_images` draws a fixed set of 32 x 32 RGB images
(uint8, like a decoded CIFAR-10): each class is a grating of its own spatial frequency and
colour, at a random orientation and phase, under noise. A two-layer CNN learns it in a few
hundred steps; nothing about it is memorised from labels alone.

Two pipelines make training batches from it, with the same augmentation (the CIFAR-10
recipe of torchvision's tutorials: pad by 4 with zeros, crop 32 x 32 at a random offset,
flip left-right with probability 1/2, scale to [0, 1], normalise per channel):

* :class:`AugmentedImages`, a ``Dataset`` that does it one image at a time with PIL on the
  CPU, as torchvision's transforms do, for a ``DataLoader`` (in the main process, or in
  worker processes);
* :func:`augment_batch`, the same operations on a whole batch of a dataset held on the
  device, in a few tensor operations.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

__all__ = ["SIZE", "CLASSES", "MEAN", "STD", "make_images", "preload", "AugmentedImages", "augment_batch", "images_to_device"]

SIZE = 32
CLASSES = 10
PAD = 4
# Cycles across the image for classes 0-4 (and 5-9), and the two colour tints.
FREQUENCIES = np.array([1.0, 2.0, 3.0, 4.5, 6.0])
TINTS = np.array([[1.0, 0.55, 0.15], [0.15, 0.55, 1.0]])
# Per-channel mean and standard deviation of the generated images (scaled to [0, 1]), measured
# on the 20,000 of seed 0 before augmentation, as CIFAR-10's are quoted (the zero padding of
# the crop then pulls the augmented mean below zero, in both pipelines alike).
MEAN = (0.5001, 0.5002, 0.5001)
STD = (0.1772, 0.1559, 0.1773)


_PRELOADED: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def preload(count: int, seed: int = 0) -> None:
    """Draw a set once and keep it in this process, so that processes forked from it (one per timed run,
    :mod:`gpuprof.fork_runs`) get it from :func:`make_images` in milliseconds instead of drawing it again."""
    _PRELOADED[(count, seed)] = make_images(count, seed)


def make_images(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``count`` images (uint8, N x 32 x 32 x 3, channels last as decoded images are) and their labels (int64).

    The same ``seed`` gives the same images on every machine. Drawn in chunks so that a
    large set does not need a large float buffer. A set :func:`preload` made is returned as
    a copy (the same values, drawn once).
    """
    if count < 1:
        raise ValueError("count must be at least 1")
    if (count, seed) in _PRELOADED:
        images, labels = _PRELOADED[(count, seed)]
        return images.copy(), labels.copy()
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, count)
    images = np.empty((count, SIZE, SIZE, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    for lo in range(0, count, 4096):
        lab = labels[lo:lo + 4096]
        n = len(lab)
        theta = rng.uniform(0, math.pi, n).astype(np.float32)[:, None, None]
        phase = rng.uniform(0, 2 * math.pi, n).astype(np.float32)[:, None, None]
        freq = FREQUENCIES[lab % 5].astype(np.float32)[:, None, None]
        wave = np.sin(2 * math.pi * freq * (xx * np.cos(theta) + yy * np.sin(theta)) / SIZE + phase)
        tint = TINTS[lab // 5].astype(np.float32)[:, None, None, :]
        img = 128 + 70 * wave[..., None] * tint + rng.normal(0, 30, (n, SIZE, SIZE, 3)).astype(np.float32)
        images[lo:lo + n] = np.clip(img, 0, 255).astype(np.uint8)
    return images, labels.astype(np.int64)


class AugmentedImages:
    """A map-style dataset (``len`` and ``[i]``) that augments image ``i`` on the CPU when asked, with PIL.

    Written out rather than taken from torchvision so that it runs where torchvision is not
    installed; the steps are those of ``transforms.Compose([RandomCrop(32, padding=4),
    RandomHorizontalFlip(), ToTensor(), Normalize(MEAN, STD)])``, and the random draws use
    ``torch``'s generator as torchvision's do (the DataLoader seeds it in each worker).
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        import torch

        self.images, self.labels = images, labels
        self.mean = torch.tensor(MEAN).view(3, 1, 1)
        self.std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import torch
        from PIL import Image, ImageOps

        img = ImageOps.expand(Image.fromarray(self.images[index]), border=PAD, fill=0)
        dx, dy = (int(v) for v in torch.randint(0, 2 * PAD + 1, (2,)))
        img = img.crop((dx, dy, dx + SIZE, dy + SIZE))
        if torch.rand(1).item() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).float().div_(255)
        return x.sub_(self.mean).div_(self.std), int(self.labels[index])


def images_to_device(images: np.ndarray, labels: np.ndarray, device: str) -> tuple[Any, Any]:
    """The whole set on ``device``: uint8 N x 3 x 32 x 32 (a 50,000-image set is 150 MB) and int64 labels."""
    import torch

    return (torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device),
            torch.from_numpy(labels).to(device))


def augment_batch(images: Any, index: Any, generator: Any = None) -> Any:
    """Augment ``images[index]`` (uint8 N x 3 x 32 x 32 on any device) as :class:`AugmentedImages` does, all at once.

    Padding, a random crop per image and a random flip per image become one gather with
    per-image row and column indices; then scaling and normalisation. About a dozen kernels
    for the whole batch, instead of a dozen Python calls per image.
    """
    import torch
    import torch.nn.functional as F

    device = images.device
    b = index.numel()
    x = F.pad(images[index], (PAD, PAD, PAD, PAD))
    off = torch.randint(0, 2 * PAD + 1, (b, 2), device=device, generator=generator)
    ar = torch.arange(SIZE, device=device)
    rows = off[:, 0:1] + ar
    cols = off[:, 1:2] + ar
    flip = torch.rand(b, 1, device=device, generator=generator) < 0.5
    cols = torch.where(flip, cols.flip(1), cols)
    batch = torch.arange(b, device=device)[:, None, None, None]
    chan = torch.arange(3, device=device)[None, :, None, None]
    x = x[batch, chan, rows[:, None, :, None], cols[:, None, None, :]]
    mean, std = _normalisation(device)
    return x.float().div_(255).sub_(mean).div_(std)


@functools.lru_cache(maxsize=None)
def _normalisation(device: Any) -> tuple[Any, Any]:
    """MEAN and STD as 1 x 3 x 1 x 1 tensors on ``device``, made once.

    Made per batch, ``torch.tensor(MEAN, device="cuda")`` is a copy from pageable host memory,
    which makes the host wait until the GPU has finished all the work queued before it: a
    synchronisation hidden in one line (the chapter's first capture of this pipeline found it).
    """
    import torch

    return (torch.tensor(MEAN, device=device).view(1, 3, 1, 1), torch.tensor(STD, device=device).view(1, 3, 1, 1))
