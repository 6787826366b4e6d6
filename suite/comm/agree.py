"""What the ranks must agree on before they communicate: the model's structure, and each step's used parameters.

Data parallel training pairs every rank's collectives by their order: a model that differs across ranks (a shape,
a parameter more) or a step in which ranks leave different parameters without a gradient (control flow) pairs
collectives of different sizes, which gloo answers with "Connection reset by peer" and NCCL with a hang, on some
ranks, long after the cause.  So the ranks compare first, and all of them stop together with one message naming
what differs:

- :func:`verify_structure` (the engine, before its first collective, the broadcast of rank 0's state): one
  ``all_gather`` of a 32-byte digest of every parameter's and buffer's name, shape, dtype and ``requires_grad``;
  only when the digests differ, every rank's description is gathered (two more ``all_gather``) and every rank
  raises the same :class:`StructureMismatch` ("rank 1: parameter 'fc.weight' shape (4, 8) vs rank 0's (4, 16)"),
  as torch DDP's ``_verify_param_shape_across_processes`` does at its construction.
- :func:`used_parameters` and :func:`agree_on_used` (the check's engine, every step, between forward and backward,
  before any gradient collective): which trainable parameters the step's autograd graph reaches (the traversal of
  torch DDP's ``Reducer::search_unused_parameters``: from the loss, through ``next_functions``, to the
  ``AccumulateGrad`` nodes), gathered from every rank; a parameter that some ranks use and others do not, without
  ``find_unused_parameters``, stops every rank with the fix first (:func:`suite.comm.grad_sync.unused_parameters_error`)
  instead of one rank stopping and its peers waiting in a collective until the process group's timeout.

Each is a few small collectives through :mod:`suite.comm.collectives` (counted), bounded by the process group's
timeout like every other.
"""
from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from . import collectives as C
from .grad_sync import unused_parameters_error

__all__ = ["StructureMismatch", "structure_lines", "verify_structure", "used_parameters", "agree_on_used",
           "MISMATCH"]

MISMATCH = "the ranks built different models"  # the start of every StructureMismatch message


class StructureMismatch(RuntimeError):
    """The ranks' models differ (raised on every rank, with the same message)."""


def structure_lines(model: torch.nn.Module) -> list[tuple[str, str, tuple, str, bool]]:
    """(kind, name, shape, dtype, requires_grad) of every parameter and buffer, in registration order, each tensor
    once: what data parallel training pairs across ranks."""
    seen: set[int] = set()
    out = []
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in named:
            if id(t) in seen:
                continue
            seen.add(id(t))
            out.append((kind, name, tuple(t.shape), str(t.dtype).removeprefix("torch."),
                        bool(t.requires_grad) if kind == "parameter" else False))
    return out


def _encode(lines: list) -> bytes:
    return "\n".join(repr(line) for line in lines).encode()


def _gather_bytes(data: bytes, group, device) -> list[bytes]:
    """Every rank's ``data`` (any length): the lengths gathered, then the bytes padded to the longest."""
    world = dist.get_world_size(group)
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = torch.zeros(world, dtype=torch.int64, device=device)
    C.all_gather(lengths, length, group=group)
    sizes = [int(n) for n in lengths.cpu().tolist()]
    longest = max(sizes) or 1
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    if data:
        mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    everyone = torch.zeros(world * longest, dtype=torch.uint8, device=device)
    C.all_gather(everyone, mine, group=group)
    flat = everyone.cpu().numpy().tobytes()
    return [flat[r * longest:r * longest + n] for r, n in enumerate(sizes)]


def _say(line: tuple) -> str:
    kind, name, shape, dtype, grad = line
    return f"{kind} {name!r} shape {shape} {dtype}" + ("" if kind == "buffer" or grad else " frozen")


def describe_differences(everyone: list[list[tuple]], limit: int = 3) -> str:
    """How each rank's structure differs from rank 0's (at most ``limit`` differences per rank)."""
    ref = everyone[0]
    parts = []
    for r, lines in enumerate(everyone[1:], 1):
        if lines == ref:
            continue
        said = []
        by_name = {(line[0], line[1]): line for line in lines}
        ref_by_name = {(line[0], line[1]): line for line in ref}
        for key, line in by_name.items():
            other = ref_by_name.get(key)
            if other is None:
                said.append(f"{_say(line)}, which rank 0 does not have")
            elif other != line:
                kind, name, shape, dtype, grad = line
                if shape != other[2]:
                    said.append(f"{kind} {name!r} shape {shape} vs rank 0's {other[2]}")
                elif dtype != other[3]:
                    said.append(f"{kind} {name!r} dtype {dtype} vs rank 0's {other[3]}")
                else:
                    said.append(f"{kind} {name!r} requires_grad={grad} vs rank 0's {other[4]}")
        said += [f"no {_say(line)}, which rank 0 has" for key, line in ref_by_name.items() if key not in by_name]
        if not said:  # the same tensors in another order
            said.append("the same tensors in another registration order (data parallel pairs them by order)")
        more = f" (and {len(said) - limit} more)" if len(said) > limit else ""
        parts.append(f"rank {r}: " + "; ".join(said[:limit]) + more)
    return "; ".join(parts)


def verify_structure(model: torch.nn.Module, group=None, device=None) -> None:
    """Raise :class:`StructureMismatch` on every rank when the ranks' models differ (see the module docstring)."""
    if not dist.is_initialized() or dist.get_world_size(group) < 2:
        return
    if device is None:
        first = next(iter(model.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
    lines = structure_lines(model)
    data = _encode(lines)
    world = dist.get_world_size(group)
    digest = torch.frombuffer(bytearray(hashlib.sha256(data).digest()), dtype=torch.int64).to(device)
    digests = torch.zeros(world * digest.numel(), dtype=torch.int64, device=device)
    C.all_gather(digests, digest, group=group)
    rows = digests.view(world, -1)
    if bool((rows == rows[0]).all()):
        return
    import ast

    everyone = [[ast.literal_eval(line) for line in text.decode().splitlines()] if text else []
                for text in _gather_bytes(data, group, device)]
    raise StructureMismatch(f"{MISMATCH} (every rank must build the same parameters and buffers, in the same "
                            f"order, for data parallel training): {describe_differences(everyone)}")


def used_parameters(root: torch.Tensor, params: list[torch.nn.Parameter]) -> list[bool]:
    """For each of ``params``: whether the autograd graph of ``root`` reaches it (a gradient will be computed for
    it in ``root.backward()``), found as torch DDP's reducer does (``search_unused_parameters``)."""
    fn = root.grad_fn
    if fn is None:
        return [False] * len(params)
    reached: set[int] = set()
    seen = {fn}
    stack = [fn]
    while stack:
        node = stack.pop()
        for nxt, _ in node.next_functions:
            if nxt is None or nxt in seen:
                continue
            seen.add(nxt)
            stack.append(nxt)
            variable = getattr(nxt, "variable", None)  # an AccumulateGrad node: a leaf's gradient
            if variable is not None:
                reached.add(id(variable))
    return [id(p) in reached for p in params]


def agree_on_used(used: list[bool], names: list[str], group=None, device=None, find_unused: bool = False) -> None:
    """Gather every rank's ``used`` (one flag per trainable parameter, the same parameters in the same order on every
    rank: :func:`verify_structure` made sure) and, without ``find_unused``, stop every rank with the same message
    when some rank uses a parameter another does not."""
    if not dist.is_initialized() or dist.get_world_size(group) < 2 or not used:
        return
    world = dist.get_world_size(group)
    mine = torch.tensor(used, dtype=torch.int32, device=device)
    everyone = torch.zeros(world * len(used), dtype=torch.int32, device=device)
    C.all_gather(everyone, mine, group=group)
    rows = everyone.view(world, -1).cpu().tolist()
    if find_unused:
        return
    differ = [k for k in range(len(used)) if len({row[k] for row in rows}) > 1]
    if not differ:
        return  # unused on every rank alike: the strategy's own error (every rank raises it, nothing hangs)

    def ranks(k: int, flag: int) -> str:
        return ", ".join(str(r) for r in range(world) if rows[r][k] == flag)

    patterns = {(ranks(k, 0), ranks(k, 1)) for k in differ}
    if len(patterns) == 1:
        (none, some), = patterns
        where = f" on rank(s) {none} and one on rank(s) {some}"
    else:
        where = " on some ranks only (" + "; ".join(f"{names[k]!r}: none on rank(s) {ranks(k, 0)}" for k in differ[:4])
        where += (f"; and {len(differ) - 4} more" if len(differ) > 4 else "") + ")"
    raise unused_parameters_error([names[k] for k in differ],
                                  where=where + " (the ranks took different branches of the model's control flow)")
