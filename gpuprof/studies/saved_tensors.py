"""What the transformer's forward pass saves for backward, tensor by tensor (chapter 7, review item 27).

Chapter 7 fits what forward leaves allocated for backward as a line in the step's tokens
(:func:`gpuprof.studies.transformer.activation_fit`: 37-38.6 bytes per token, per layer and per
unit of width under bf16 autocast). The standard accounting (Korthikanti et al. 2022, Eq. 1:
``sbh(34 + 5as/h)`` per layer; with a fused attention kernel the ``5as/h`` term goes) predicts
38 for this model from a list of tensors. :func:`saved_tensor_census` closes that loop by
counting the tensors themselves: it builds the benchmark's own model
(``build_model`` of ``examples/nsys/transformer_benchmark.py``), runs one forward and loss
exactly as the benchmark's step does (under ``torch.autocast(device, dtype=torch.bfloat16)`` for
``bf16``), and lists every tensor autograd saved, with the node that saved it, the field,
shape, dtype and bytes, and a role (LayerNorm input, q/k/v, GELU input, ...).

How the tensors are found (two views of the same graph, joined):

* a ``torch.autograd.graph.saved_tensors_hooks`` pack hook, pushed around the forward, sees
  every tensor autograd saves outside a checkpointed region (with the tensor's ``grad_fn`` intact,
  so a bf16 copy of a weight is told from an activation); it wraps each in a small object and
  keeps only a weak reference to that, so a saved tensor whose node was freed during forward is
  not counted;
* a walk of the graph from the loss (``grad_fn``, ``next_functions``) names them: for each node
  the fields listed as ``_raw_saved_<field>`` in ``dir(node)``, read through ``_saved_<field>``,
  whose unpack calls the hook above and so says which packed tensor the field is.

Deduplication: a storage (``untyped_storage()``) is counted once, at its full size
(``untyped_storage().nbytes()``), however many saved tensors view it. Memory is held per storage,
and a view keeps its whole storage alive: q, k and v are three views of the qkv product's output
(one storage, 6 bytes per token-width in bf16, not 3 x 2), and where the attention's output is
laid out (batch, token, head, dim), the projection's input ``a.transpose(1, 2).reshape(b, t, d)``
is a view of it, not a copy (one storage for two roles). The key is the device and the storage's
data pointer, read when the tensor is saved; every storage counted is alive at the census, so no
two of them can share a pointer. A storage viewed by tensors of several roles is given to the
role that comes first in the forward order (:data:`ROLES`), and the others say so.

Parameters (the FP32 weights, saved by LayerNorm and, in FP32, by the matrix products) and
autocast's bf16 copies of the weights (saved by the matrix products under autocast: the fit's
intercept) are not activations: they are reported apart, not summed with them.

Checkpointing (``checkpoint=True``): each block runs through
``torch.utils.checkpoint.checkpoint(block.forward, x, use_reentrant=False)``. Non-reentrant
checkpoint pushes its own saved-tensor hooks inside the block; hooks do not stack (the innermost
pair alone applies), so the pack hook above never sees a block's tensors: autograd holds a
placeholder for each (a ``_Holder``) and recomputes the block in backward. The graph walk still
finds those nodes, and reading their ``_saved_*`` fields would *run the recomputation* (and count
recomputed tensors as saved), so the walk does not read them: the nodes of each checkpointed block
(those reachable from its output and not from its input) are listed with the role "recomputed in
backward" and no bytes. What checkpoint keeps is its inputs: it saves them through a no-op autograd
function (``_NoopSaveInputs``) outside its hooks, so the pack hook sees them (no node reachable from
the loss holds them: the walk alone would miss them), and they are given the role "checkpoint
inputs". Checkpoint also keeps the RNG states (CPU tensors, not GPU memory); they are not saved
tensors and are not counted. Where torch shows what a saved field holds without unpacking it
(``SavedTensor.data``: torch 2.13 has it, older versions may not), every field is checked against
that split (ours outside the blocks, checkpoint's placeholder inside; ``tensors_checked_unread`` in
the summary counts them, 0 where torch cannot say), and fields holding no tensor (SDPA's
``attn_mask``) are left out.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from ..artifacts import REPO_ROOT
from ..errors import GpuprofError

__all__ = ["BENCHMARK", "MODES", "ROLES", "REVIEWER_38", "PUBLISHED_36", "SavedEntry", "Census", "benchmark_config",
           "saved_tensor_census", "role_table"]

BENCHMARK = REPO_ROOT / "examples" / "nsys" / "transformer_benchmark.py"
MODES = ("fp32", "bf16")

# Every role, in the order the forward pass makes its tensors (a storage saved under several roles is
# counted under the first), with its scope: "block" (one per layer), "model" (once), "excluded" (not an
# activation: reported apart).
ROLES: dict[str, str] = {
    "parameters": "excluded",
    "autocast weight copies": "excluded",
    "token ids": "model",
    "checkpoint inputs": "block",
    "LayerNorm inputs": "block",
    "LayerNorm statistics": "block",
    "qkv input": "block",
    "q, k, v": "block",
    "attention output": "block",
    "attention extras": "block",
    "projection input": "block",
    "MLP up input": "block",
    "GELU input": "block",
    "MLP down input": "block",
    "recomputed in backward": "block",
    "final LayerNorm": "model",
    "head input": "model",
    "logits and loss": "model",
}
# The reviewer's tensor count for this model under bf16 autocast (review 2, item 27), bytes per token, per layer and
# per unit of width: LayerNorm inputs in FP32 (4 + 4), the qkv input 2, q, k, v 6, the attention output 2, the
# projection input 2, the up-projection input 2, the GELU input 8 (4d in bf16), the down-projection input 8. Sum 38.
REVIEWER_38: dict[str, float] = {"LayerNorm inputs": 8, "qkv input": 2, "q, k, v": 6, "attention output": 2,
                                 "projection input": 2, "MLP up input": 2, "GELU input": 8, "MLP down input": 8}

# The published accounting (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
# Eq. 1: 34 bytes per token, layer and unit of width in 16-bit training, plus 5as/h for the attention scores) applied
# to this model, by the census's roles: without the paper's two dropout masks (1 + 1), with the LayerNorm inputs in
# FP32 under autocast (4 + 4, not 2 + 2), and with no score matrix (a fused attention kernel saves its output and a
# log-sum-exp instead). The paper counts the attention's output once, as the projection's input; the census counts
# that one storage under "attention output" and none under "projection input". Sum 36 (34 - 2 + 4); what the
# census adds beyond it (LayerNorm statistics, the kernel's log-sum-exp and RNG state) is not in the paper's count.
PUBLISHED_36: dict[str, float] = {"LayerNorm inputs": 8, "qkv input": 2, "q, k, v": 6, "attention output": 2,
                                  "projection input": 0, "MLP up input": 2, "GELU input": 8, "MLP down input": 8}

# Nodes a weight passes through on its way to a matrix product (transpose, autocast's cast, views); a saved tensor
# that reaches a weight's AccumulateGrad through these alone is the weight or a copy of it, not an activation.
_WEIGHT_PATH = {"TBackward0", "ToCopyBackward0", "ViewBackward0", "PermuteBackward0", "TransposeBackward0",
                "ExpandBackward0", "SliceBackward0", "UnsafeViewBackward0", "AliasBackward0"}
_MATMUL_INPUT = {"qkv": "qkv input", "proj": "projection input", "up": "MLP up input", "down": "MLP down input",
                 "head": "head input"}
_NOT_REACHED = "not reached from the loss"


@dataclass
class SavedEntry:
    """One tensor autograd saved: who saved it, what it is, where its bytes are."""

    node: str
    field: str
    role: str
    layer: int | None
    shape: tuple[int, ...]
    dtype: str
    view_bytes: int        # numel x element size of the saved tensor itself
    storage: tuple | None  # (device, data pointer) of its storage; None for a tensor checkpoint holds no bytes of
    storage_bytes: int     # the whole storage's size: what is counted, once per storage
    counted_as: str = ""   # the role its storage is counted under (itself, or the first role that saved it)


@dataclass
class Census:
    """One forward's saved tensors: every entry, the per-role table and the totals."""

    config: dict[str, Any]
    mode: str
    device: str
    batch: int
    context: int
    checkpoint: bool
    entries: list[SavedEntry]
    roles: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)

    def record(self, entries: str = "first layer") -> dict[str, Any]:
        """A JSON-ready record: the run, the totals, the role table and the entries (``"first layer"``: layer 0's
        and the model's own, enough to read every kind of tensor; ``"all"``; ``"none"``)."""
        keep = {"all": lambda e: True, "none": lambda e: False,
                "first layer": lambda e: e.layer in (None, 0)}[entries]
        roles = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}  # NaN: not JSON
                 for r in self.roles.reset_index().to_dict(orient="records")]
        return {"config": self.config, "mode": self.mode, "device": self.device, "batch": self.batch,
                "context": self.context, "checkpoint": self.checkpoint, "summary": self.summary, "roles": roles,
                "entries_kept": entries,
                "entries": [{**e.__dict__, "shape": list(e.shape), "storage": _storage_text(e.storage)}
                            for e in self.entries if keep(e)]}


def benchmark_config(size: str, context: int, batch: int, mode: str = "bf16") -> dict[str, Any]:
    """The benchmark's own configuration dict (its ``parse_args`` and ``model_config``) for a named size."""
    script = _script()
    return script.model_config(script.parse_args(["--size", size, "--context-length", str(context),
                                                  "--batch-size", str(batch), "--dtype", mode]))


def saved_tensor_census(cfg: dict[str, Any], device: str, mode: str, *, batch: int | None = None,
                        context: int | None = None, checkpoint: bool = False, seed: int = 0) -> Census:
    """Every tensor one forward + loss of the benchmark's model saves for backward, deduplicated by storage.

    ``cfg`` is the benchmark's ``model_config`` (:func:`benchmark_config`); ``batch`` and ``context``
    default to its own. ``mode``: ``"fp32"`` (no autocast) or ``"bf16"`` (the benchmark's
    ``torch.autocast(device, dtype=torch.bfloat16)`` around forward and loss). ``checkpoint`` wraps
    each block in ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``. On CUDA a
    warm-up step runs first (cuBLAS's workspace is allocated once, on first use), and the memory
    forward leaves allocated is recorded beside the census (``summary["cuda_memory"]``).

    The numbers are the device's own: CUDA autocast's op lists and the SDPA kernel chosen (and what
    it saves) differ from the CPU's, so only a CUDA census speaks for the chapter's GPU fit.
    """
    if mode not in MODES:
        raise GpuprofError(f"mode must be one of {', '.join(MODES)} (fp32: no autocast; bf16: the benchmark's "
                           f"bf16 autocast), not {mode!r}.")
    from ..backend import require_torch

    torch = require_torch("the saved-tensor census")
    cfg = {**cfg, "batch_size": batch or cfg["batch_size"], "context_length": context or cfg["context_length"],
           "dtype": mode}
    batch, context = cfg["batch_size"], cfg["context_length"]
    torch.manual_seed(seed)
    model = _script().build_model(cfg, device)
    regions: list[tuple[Any, Any, tuple]] = []
    if checkpoint:
        _checkpoint_blocks(model, regions)
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.randint(0, cfg["vocab"], (batch, context + 1), device=device, generator=gen)
    x, y = tokens[:, :-1], tokens[:, 1:]
    cuda = torch.device(device).type == "cuda"
    existing = {_storage_key(tokens)}  # storages alive before forward: saved by it, not allocated by it
    if cuda:  # one untracked step first: what the first step allocates once (cuBLAS's workspace) is not forward's
        _loss(torch, model, x, y, device, mode).backward()
        model.zero_grad(set_to_none=True)
        regions.clear()
        gc.collect()  # an earlier census's checkpointed model, freed only by the cycle collector, must not be freed
        torch.cuda.synchronize()  # during this forward (its bytes would come off the allocated count)
        before = torch.cuda.memory_allocated()
    collector = _Collector(model)
    with torch.autograd.graph.saved_tensors_hooks(collector.pack, collector.unpack):
        loss = _loss(torch, model, x, y, device, mode)
    if cuda:
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated() - before
    inside = _checkpointed_nodes(regions)
    names = {id(p): n for n, p in model.named_parameters()}
    entries, dead = _entries(collector, loss, names, inside, {s: i for i, (_, _, s) in enumerate(regions)})
    layers, width = cfg["num_layers"], cfg["d_model"]
    table = role_table(entries, batch * context, layers, width)
    summary = _summary(entries, table, layers, dead)
    summary["tensors_checked_unread"] = collector.checked
    summary["attention_nodes"] = sorted({e.node for e in entries if e.node.startswith("ScaledDotProduct")})
    if cuda:
        summary["cuda_memory"] = _memory_check(entries, existing, int(allocated))
    if checkpoint:  # the wrappers close over their blocks (a cycle): undo them, so the model is freed by refcount
        for block in model.blocks:
            del block.forward
    return Census(cfg, mode, str(device), batch, context, checkpoint, entries, table, summary)


def _memory_check(entries: list[SavedEntry], existing: set[tuple], allocated: int) -> dict[str, int]:
    """The census against what forward left allocated on the GPU, over the same storages: those on a CUDA device
    that did not exist before forward (the token ids did: saved, not allocated), each counted once, activations and
    autocast's weight copies alike. What remains in ``difference`` is the caching allocator's rounding of each block
    (512 B, more for large blocks), the loss and what forward allocated without saving it for backward."""
    seen: set[tuple] = set()
    counted = 0
    for e in entries:
        if e.storage is None or e.storage in seen or e.storage in existing or not str(e.storage[0]).startswith("cuda"):
            continue
        if e.counted_as == "parameters":  # the weights exist before forward (their storages are not new)
            continue
        seen.add(e.storage)
        counted += e.storage_bytes
    return {"allocated_by_forward": allocated, "census_new_cuda_storages": counted, "difference": allocated - counted}


def role_table(entries: list[SavedEntry], tokens: int, layers: int, width: int) -> pd.DataFrame:
    """Per role: saved tensors, storages counted, bytes, bytes per token and per token-layer-width, beside the
    reviewer's count; then the totals (blocks' activations, all activations, and the two excluded kinds).

    ``per token-layer-width`` divides by tokens x layers x width for every role, the model's own
    (logits, final LayerNorm) too: that is how the chapter's fit divides its slope, so the rows add up
    to what the fit measures. The reviewer column holds the review's count, for the eight roles it lists.
    """
    norm = tokens * layers * width
    rows = []
    names = [r for r in ROLES if any(e.role == r for e in entries) or r in REVIEWER_38]
    names += sorted({e.role for e in entries} - set(names))
    for role in names:
        mine = [e for e in entries if e.role == role]
        counted = {e.storage: e.storage_bytes for e in entries if e.counted_as == role and e.storage is not None}
        elsewhere = sorted({e.counted_as for e in mine if e.counted_as and e.counted_as != role})
        rows.append({"role": role, "scope": ROLES.get(role, "other"), "reviewer": REVIEWER_38.get(role),
                     "saved tensors": len(mine), "storages": len(counted), "bytes": sum(counted.values()),
                     "note": ("storage counted under " + ", ".join(elsewhere)) if elsewhere else ""})
    out = pd.DataFrame(rows)
    block, model = out[out["scope"] == "block"], out[out["scope"].isin(("model", "other"))]
    totals = [("activations, blocks", block), ("activations, all", pd.concat([block, model]))]
    totals += [(f"{r} (not activations)", out[out["role"] == r]) for r in ("parameters", "autocast weight copies")]
    rows = [r for r in rows if r["scope"] != "excluded"]  # those two appear once, as totals
    for name, part in totals:
        rows.append({"role": name, "scope": "total", "reviewer": sum(REVIEWER_38.values()) if "blocks" in name
                     else None, "saved tensors": int(part["saved tensors"].sum()),
                     "storages": int(part["storages"].sum()), "bytes": int(part["bytes"].sum()), "note": ""})
    out = pd.DataFrame(rows).set_index("role")
    out["bytes per token"] = out["bytes"] / tokens
    out["bytes per token-layer-width"] = out["bytes"] / norm
    return out[["scope", "saved tensors", "storages", "bytes", "bytes per token", "bytes per token-layer-width",
                "reviewer", "note"]]


# ----- the pieces -----

def _script() -> Any:
    from ..runner import load_script

    return load_script(BENCHMARK)


def _loss(torch: Any, model: Any, x: Any, y: Any, device: str, mode: str) -> Any:
    """Forward and loss as the benchmark's training step runs them (``run``'s ``step``): the model and
    ``F.cross_entropy`` inside ``torch.autocast(device, dtype=torch.bfloat16)`` for bf16, nothing for fp32.
    A test reads the benchmark's source for these two lines, so a change there is caught."""
    import torch.nn.functional as F

    autocast = (torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if mode == "bf16"
                else contextlib.nullcontext())
    with autocast:
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def _checkpoint_blocks(model: Any, regions: list[tuple[Any, Any, tuple]]) -> None:
    """Run each block through non-reentrant checkpoint; record each call's input and output nodes and the input's
    storage (the region's bounds for the walk, and the tensor checkpoint keeps). Parameter names are unchanged."""
    from torch.utils.checkpoint import checkpoint

    for block in model.blocks:
        def forward(x: Any, inner: Callable[[Any], Any] = block.forward) -> Any:
            out = checkpoint(inner, x, use_reentrant=False)
            regions.append((x.grad_fn, out.grad_fn, _storage_key(x)))
            return out
        block.forward = forward


def _checkpointed_nodes(regions: list[tuple[Any, Any, tuple]]) -> set[Any]:
    """The nodes made inside checkpointed blocks: reachable from a block's output, not from its input."""
    inside: set[Any] = set()
    for start, end, _ in regions:
        inside |= _reachable(end) - _reachable(start)
    return inside


def _reachable(node: Any) -> set[Any]:
    seen: set[Any] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        stack.extend(nf for nf, _ in n.next_functions)
    return seen


def _storage_text(key: tuple | None) -> str | None:
    """A storage's key as the record writes it: device and data pointer (which saved tensors share a storage)."""
    return None if key is None else f"{key[0]}:{key[1]:#x}" if isinstance(key[1], int) else f"{key[0]}:empty"


def _storage_key(t: Any) -> tuple:
    s = t.untyped_storage()
    return (str(t.device), s.data_ptr()) if s.nbytes() else (str(t.device), "empty", id(s))


class _Packed:
    """What the pack hook returns: the saved tensor (detached: no reference cycle through its own node) and its
    index in the collector's records. Weakly referenced by the collector, so a freed node's tensors drop out."""

    __slots__ = ("tensor", "index", "__weakref__")

    def __init__(self, tensor: Any, index: int) -> None:
        self.tensor, self.index = tensor, index


@dataclass
class _Record:
    shape: tuple[int, ...]
    dtype: str
    view_bytes: int
    storage: tuple
    storage_bytes: int
    weight: str | None  # "parameters" / "autocast weight copies" when the tensor is a weight or derived from one
    ref: Any


class _Collector:
    """The pack/unpack hooks: a record per saved tensor, and which record each unpack returned."""

    def __init__(self, model: Any) -> None:
        self.records: list[_Record] = []
        self.unpacked: list[int] = []
        self.checked = 0
        self.param_storages = {_storage_key(p) for p in model.parameters()}

    def pack(self, t: Any) -> _Packed:
        packed = _Packed(t.detach(), len(self.records))
        self.records.append(_Record(tuple(t.shape), str(t.dtype).replace("torch.", ""), t.numel() * t.element_size(),
                                    _storage_key(t), t.untyped_storage().nbytes(), self._weight(t),
                                    weakref.ref(packed)))
        return packed

    def unpack(self, packed: _Packed) -> Any:
        self.unpacked.append(packed.index)
        return packed.tensor

    def check_packed_by(self, node: Any, name: str, ours: bool) -> str:
        """Where torch shows what a saved field holds without unpacking it (``SavedTensor.data``, in recent
        versions), check the walk's split: outside checkpointed blocks our ``_Packed``, inside them checkpoint's
        placeholder. Counts the tensors checked (``checked``); one the split got wrong is an error. Returns
        "empty" for a field that holds no tensor, "checked", or "unknown" where torch cannot say unread."""
        raws = getattr(node, "_raw_saved_" + name)
        raws = raws if isinstance(raws, (list, tuple)) else [raws]
        if not all(hasattr(raw, "data") for raw in raws):
            return "unknown"
        held = [raw.data for raw in raws if raw.data is not None]
        for data in held:
            self.checked += 1
            if isinstance(data, _Packed) != ours:
                raise GpuprofError(f"{node.name()}.{name} holds {type(data).__name__}, but the walk took it for "
                                   f"{'a census tensor' if ours else 'a checkpointed one'}: the census cannot be "
                                   "trusted for this model.")
        return "checked" if held else "empty"

    def _weight(self, t: Any) -> str | None:
        """A parameter (same storage), or a copy of one (a path of casts and views back to its AccumulateGrad)."""
        if _storage_key(t) in self.param_storages:
            return "parameters"
        return "autocast weight copies" if _reaches_weight(t.grad_fn) else None


def _reaches_weight(node: Any, depth: int = 8) -> bool:
    if node is None or depth == 0:
        return False
    if node.name().endswith("AccumulateGrad"):
        return True
    if node.name() not in _WEIGHT_PATH:
        return False
    return any(_reaches_weight(nf, depth - 1) for nf, _ in node.next_functions)


def _entries(collector: _Collector, loss: Any, names: dict[int, str], inside: set[Any],
             inputs: dict[tuple, int]) -> tuple[list[SavedEntry], int]:
    """Walk the graph from the loss, name every saved field, add what the pack hook saw that no node reached
    (checkpoint's inputs), drop what was freed, and give each storage its role."""
    entries: list[SavedEntry] = []
    owners = _Owners(names)
    reached: set[int] = set()
    for node in _walk(loss.grad_fn):
        fields = sorted(a[len("_raw_saved_"):] for a in dir(node) if a.startswith("_raw_saved_"))
        module, layer = owners.of(node) if fields else (None, None)
        for name in fields:
            if collector.check_packed_by(node, name, node not in inside) == "empty":
                continue  # an optional tensor not given (SDPA's attn_mask), where torch can say so unread
            if node in inside:  # held by checkpoint: reading it would run the recomputation
                entries.append(SavedEntry(node.name(), name, "recomputed in backward", layer, (), "", 0, None, 0))
                continue
            collector.unpacked.clear()
            value = getattr(node, "_saved_" + name)
            tensors = [v for v in (value if isinstance(value, (list, tuple)) else [value]) if v is not None]
            indices = list(collector.unpacked)
            if len(indices) != len(tensors):
                raise GpuprofError(f"{node.name()}.{name}: {len(tensors)} tensors read but {len(indices)} went "
                                   "through the census's hook: a tensor saved outside it cannot be counted.")
            for i in indices:
                reached.add(i)
                r = collector.records[i]
                role = r.weight or _role(node.name(), name, module)
                entries.append(SavedEntry(node.name(), name, role, layer, r.shape, r.dtype, r.view_bytes, r.storage,
                                          r.storage_bytes))
    dead = 0
    for i, r in enumerate(collector.records):
        if i in reached:
            continue
        if r.ref() is None:  # saved, then freed with its node during forward
            dead += 1
            continue
        role = r.weight or ("checkpoint inputs" if r.storage in inputs else _NOT_REACHED)
        entries.append(SavedEntry("(no node reachable from the loss)", "", role, inputs.get(r.storage), r.shape,
                                  r.dtype, r.view_bytes, r.storage, r.storage_bytes))
    _assign_storages(entries)
    return entries, dead


def _walk(root: Any) -> list[Any]:
    """Every node reachable from ``root``, each once, in a fixed order (depth first from the loss)."""
    order, seen, stack = [], set(), [root]
    while stack:
        n = stack.pop()
        if n is None or n in seen:
            continue
        seen.add(n)
        order.append(n)
        stack.extend(nf for nf, _ in reversed(n.next_functions))
    return order


class _Owners:
    """The module a node belongs to (``up`` of layer 3), from the weight it multiplies or, for a node with no
    weight of its own (attention, GELU, the loss), from the nearest node upstream that has one."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names  # id of each parameter -> its name in the model
        self.cache: dict[Any, tuple[str | None, int | None]] = {}

    def own(self, node: Any) -> str | None:
        for nf, _ in node.next_functions:
            name = _weight_name(nf, self.names)
            if name:
                return name
        return None

    def of(self, node: Any) -> tuple[str | None, int | None]:
        if node not in self.cache:
            self.cache[node] = self._find(node)
        return self.cache[node]

    def _find(self, node: Any) -> tuple[str | None, int | None]:
        queue, seen = [node], {node}
        while queue:
            n = queue.pop(0)
            name = self.own(n)
            if name:
                parts = name.split(".")
                if parts[0] == "blocks":
                    return parts[2], int(parts[1])
                return parts[0], None
            for nf, _ in n.next_functions:
                if nf is not None and nf not in seen:
                    seen.add(nf)
                    queue.append(nf)
        return None, None


def _weight_name(node: Any, names: dict[int, str], depth: int = 4) -> str | None:
    """The parameter's name at the end of a weight path from ``node`` (through casts and views), if any."""
    if node is None or depth == 0:
        return None
    if node.name().endswith("AccumulateGrad"):
        return names.get(id(node.variable))
    if node.name() not in _WEIGHT_PATH:
        return None
    for nf, _ in node.next_functions:
        name = _weight_name(nf, names, depth - 1)
        if name:
            return name
    return None


def _role(node: str, name: str, module: str | None) -> str:
    """A saved activation's role, from the node that saved it, the field and the node's module."""
    if node.startswith("NativeLayerNormBackward"):
        if module == "ln":
            return "final LayerNorm"
        return "LayerNorm inputs" if name == "input" else "LayerNorm statistics"
    if node.startswith(("MmBackward", "AddmmBackward", "BmmBackward")) and name in ("self", "mat1") \
            and module in _MATMUL_INPUT:
        return _MATMUL_INPUT[module]
    if node.startswith("ScaledDotProduct"):
        return {"query": "q, k, v", "key": "q, k, v", "value": "q, k, v", "output": "attention output"}.get(
            name, "attention extras")
    if node.startswith("GeluBackward") and name == "self":
        return "GELU input"
    if node.startswith(("LogSoftmaxBackward", "NllLossBackward")):
        return "logits and loss"
    if node.startswith("EmbeddingBackward"):
        return "token ids"
    return f"other: {node}.{name}"


def _assign_storages(entries: list[SavedEntry]) -> None:
    """Each storage counted once, under the first role (in forward order) of the tensors that view it."""
    order = {r: i for i, r in enumerate(ROLES)}
    first: dict[tuple, str] = {}
    for e in entries:
        if e.storage is None:
            continue
        best = first.get(e.storage)
        if best is None or order.get(e.role, len(order)) < order.get(best, len(order)):
            first[e.storage] = e.role
    for e in entries:
        e.counted_as = first.get(e.storage, e.role) if e.storage is not None else e.role


def _summary(entries: list[SavedEntry], table: pd.DataFrame, layers: int, dead: int) -> dict[str, Any]:
    """The totals, the bytes of the blocks' roles per layer (equal in every layer, or the census says not), and how
    many tensors were saved and freed during forward (not counted)."""
    per_layer = [0] * layers
    seen: set[tuple] = set()
    for e in entries:
        if e.storage is None or e.storage in seen or ROLES.get(e.counted_as) != "block":
            continue
        seen.add(e.storage)
        if e.layer is not None:
            per_layer[e.layer] += e.storage_bytes
    col = "bytes per token-layer-width"
    return {"activation_bytes": int(table.loc["activations, all", "bytes"]),
            "block_activation_bytes": int(table.loc["activations, blocks", "bytes"]),
            "parameter_bytes": int(table.loc["parameters (not activations)", "bytes"]),
            "weight_copy_bytes": int(table.loc["autocast weight copies (not activations)", "bytes"]),
            "blocks_per_token_layer_width": float(table.loc["activations, blocks", col]),
            "all_per_token_layer_width": float(table.loc["activations, all", col]),
            "reviewer_per_token_layer_width": float(sum(REVIEWER_38.values())),
            "block_bytes_per_layer": per_layer,
            "saved_tensors": sum(e.storage is not None for e in entries),
            "storages": len({e.storage for e in entries if e.storage is not None}),
            "held_by_checkpoint": sum(e.role == "recomputed in backward" for e in entries),
            "saved_then_freed": dead}


def census_beside_fit(record: dict[str, Any], fit: pd.DataFrame) -> pd.DataFrame:
    """Per size the census ran: the chapter's fitted slope (``tr.activation_fit``'s bytes per token, per layer and
    per unit of width, from the benchmark's own memory records) beside the census's slope between the record's
    contexts, and CUDA's allocated bytes over the same contexts where the record has them, with each block plain and
    checkpointed. The fit and the allocated slope weigh what memory held; the census, what autograd saved: where
    they part, something forward allocates is not a saved tensor (or the allocator rounds)."""
    rows: dict[str, dict[str, float]] = {}
    for s in record["slopes"]:
        known = s["size"] in fit.index
        row = rows.setdefault(s["size"], {"fit": float(fit.loc[s["size"], "bytes per token-layer-width"])
                                          if known else float("nan")})
        tag = "checkpointed" if s["checkpoint"] else "plain"
        row[f"census, {tag}"] = s["census_slope"]
        if "allocated_slope" in s:
            row[f"allocated, {tag}"] = s["allocated_slope"]
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("size")
