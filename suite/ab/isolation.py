"""How a trial server and its ranks are placed and laid out: the factors `fleetbench figures gate-sources` varies.

A preparation of a case runs at its own speed for its whole life and a pair of processes adds its own (the gate
figure's tau_prep and tau_process).  Each field of :class:`Isolation` is one candidate source, switched for both
servers of a pair alike (so A/A stays A/A):

- ``pin``: rank r on the r-th allowed core (``os.sched_setaffinity``; both revisions' rank r on the same core);
- ``aslr_off``: the server and its ranks without address-space randomization (``personality(ADDR_NO_RANDOMIZE)``
  before exec, what ``setarch -R`` does; inherited by the ranks);
- ``malloc_fixed``: glibc's allocator without its adaptive parts (one arena, a fixed mmap threshold of 128 KiB,
  no trimming), through ``MALLOC_*`` environment variables;
- ``thp``: PyTorch's CPU allocator asks for transparent huge pages for its large tensors
  (``THP_MEM_ALLOC_ENABLE=1``; the kernel's default here is ``madvise``, so they are off otherwise);
- ``gc_frozen``: after every preparation each rank collects, freezes what survives and switches the garbage
  collector off (it stays off while that preparation is timed);
- ``layout_pad``: before every preparation each rank allocates a random number of random-sized blocks and keeps
  them while the case lives, so each preparation's tensors start at other addresses (a coarse Stabilizer:
  Curtsinger and Berger, ASPLOS 2013);
- ``threads``: intra-op threads per rank (the case's ``num_threads`` knob; default: the suite's own).

Inter-op threads are not a factor: the cases' eager training steps never use torch's inter-op pool.  Gloo has no
buffer or pair setting that ``torch.distributed`` exposes, so it is not one either.
"""
from __future__ import annotations

import dataclasses
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Isolation", "FACTORS", "AB_DEFAULT", "gc_freeze_on_rank", "layout_pad_on_rank"]

ADDR_NO_RANDOMIZE = 0x0040000  # <linux/personality.h>
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Isolation:
    pin: bool = False
    aslr_off: bool = False
    malloc_fixed: bool = False
    thp: bool = False
    gc_frozen: bool = False
    layout_pad: bool = False
    threads: int | None = None

    def __post_init__(self):
        if self.threads is not None and not (isinstance(self.threads, int) and 1 <= self.threads <= 256):
            raise ValueError(f"isolation threads {self.threads!r}: an integer 1..256, or None for the default")

    @property
    def name(self) -> str:
        on = [f.name for f in dataclasses.fields(self) if f.name != "threads" and getattr(self, f.name)]
        if self.threads is not None:
            on.append(f"threads={self.threads}")
        return "+".join(on) or "default"

    @classmethod
    def parse(cls, text: str) -> Isolation:
        """``none``, or factors joined by ``+`` or ``,``: pin, aslr_off, malloc_fixed, thp, gc_frozen, layout_pad,
        threads=N (the names :attr:`name` prints)."""
        flags = {f.name for f in dataclasses.fields(cls) if f.name != "threads"}
        fields: dict[str, Any] = {}
        for part in (p.strip() for p in text.replace(",", "+").split("+")):
            if part in ("", "none", "default"):
                continue
            if part.startswith("threads="):
                try:
                    fields["threads"] = int(part.split("=", 1)[1])
                except ValueError:
                    raise ValueError(f"isolation {text!r}: threads={part.split('=', 1)[1]!r} is not an integer") \
                        from None
            elif part in flags:
                fields[part] = True
            else:
                raise ValueError(f"isolation {text!r}: {part!r} is unknown; allowed: none, "
                                 f"{', '.join(sorted(flags))}, threads=N (joined by '+')")
        return cls(**fields)

    def env(self) -> dict[str, str]:
        """Environment variables for the server (its ranks inherit them)."""
        out: dict[str, str] = {}
        if self.malloc_fixed:
            out.update(MALLOC_ARENA_MAX="1", MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="-1",
                       MALLOC_TOP_PAD_="0")
        if self.thp:
            out["THP_MEM_ALLOC_ENABLE"] = "1"
        return out

    def sets(self) -> list[str]:
        """``--set`` strings for the case's config."""
        return [f"num_threads={self.threads}"] if self.threads is not None else []

    def preexec(self, pdeathsig: int | None) -> Callable[[], None] | None:
        """A ``preexec_fn`` (run in the child between fork and exec): the parent-death signal, then the
        personality; the ctypes functions are looked up here, so the child only calls them.  None when there
        is nothing to do or no libc to do it with (not Linux)."""
        if not sys.platform.startswith("linux") or (pdeathsig is None and not self.aslr_off):
            return None
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            prctl, personality = libc.prctl, libc.personality
        except (OSError, AttributeError):
            return None
        aslr_off = self.aslr_off

        def run() -> None:
            if pdeathsig is not None:
                prctl(PR_SET_PDEATHSIG, pdeathsig, 0, 0, 0)
            if aslr_off:
                current = personality(0xFFFFFFFF)
                personality(current | ADDR_NO_RANDOMIZE)

        return run

    def prepare_fields(self) -> dict[str, Any]:
        """Fields of the trial protocol's ``prepare`` request (servers that do not know them ignore them)."""
        out: dict[str, Any] = {}
        if self.gc_frozen:
            out["gc_frozen"] = True
        if self.layout_pad:
            out["layout_pad"] = True
        if self.threads is not None:
            out["set"] = self.sets()
        return out


# One factor at a time against the default, then everything that can be switched off at once.
FACTORS: tuple[Isolation, ...] = (
    Isolation(),
    Isolation(pin=True),
    Isolation(threads=2),
    Isolation(malloc_fixed=True),
    Isolation(thp=True),
    Isolation(aslr_off=True),
    Isolation(gc_frozen=True),
    Isolation(layout_pad=True),
    Isolation(pin=True, aslr_off=True, malloc_fixed=True, gc_frozen=True),
)


# `fleetbench ab`'s and `bisect`'s default: none of the factors.  docs/figures/gate.md ("Sources") screened each;
# none lowered the spreads reproducibly (THP did in the screen, not in its confirmation), and pinning raised them.
AB_DEFAULT = Isolation()


# ---- rank functions (module level: the pool pickles them by reference) ---------------------------
_PAD: list = []


def layout_pad_on_rank(seed: int) -> dict:
    """Allocate 1-64 blocks of 1 B to 64 KiB (host memory, through torch's allocator and Python's) and keep them,
    dropping the previous preparation's pad after the new one exists, so the next tensors land elsewhere."""
    import torch

    from ..runtime.context import current

    rng = random.Random(seed * 1009 + current().rank)
    pad: list = [torch.empty(rng.randint(1, 1 << 16), dtype=torch.uint8, device="cpu")  # host memory, on purpose
                 for _ in range(rng.randint(1, 64))]
    pad += [bytearray(rng.randint(1, 1 << 16)) for _ in range(rng.randint(1, 64))]
    old = list(_PAD)
    _PAD[:] = pad
    del old
    return {"blocks": len(pad), "bytes": sum(p.numel() if hasattr(p, "numel") else len(p) for p in pad)}


def gc_freeze_on_rank() -> dict:
    """Collect, move every surviving object to the permanent generation, and switch the collector off."""
    import gc

    gc.unfreeze()  # the previous preparation's objects may be garbage now
    gc.enable()
    collected = gc.collect()
    gc.freeze()
    gc.disable()
    return {"collected": collected, "frozen": gc.get_freeze_count(), "pid": os.getpid()}
