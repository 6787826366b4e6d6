"""The compute-fusion pass: find Paddle's three fusable patterns in a user's model and replace
each by one fused op (:mod:`suite.compute.fused_ops`).

=========================  ===========================================  =====================
knob                       pattern                                      fused op
=========================  ===========================================  =====================
``fuse_bn_act_ops``        BatchNorm{1,2,3}d → ReLU                     ``BatchNormReLU``
``fuse_elewise_add_act_ops``  ``a + b`` (operator/torch.add/Tensor.add) → ReLU  ``AddReLU``
``fuse_relu_depthwise_conv``  ReLU → depthwise conv (groups = in_channels)  ``ReLUDepthwiseConv``
=========================  ===========================================  =====================

A ReLU is an ``nn.ReLU`` module, ``F.relu``, ``torch.relu`` or ``Tensor.relu``.

How: the model is traced with ``torch.fx``; a pattern is fused when the first op's output has
no other user (otherwise the intermediate is needed anyway and nothing can be dropped).  A
model (or submodule) that fx cannot trace is handled one level down: its children are
traced one by one, and inside ``nn.Sequential`` containers adjacent BatchNorm, ReLU and
depthwise-conv modules are fused by position (data flow there is certain).  Fused modules
take the place of the module they replace and share its parameters and buffers under the
same names, so ``state_dict`` and ``named_parameters`` keys do not change (checked).

Every pattern found is counted, fused or not, with the reason when not; the counts are
logged as Paddle's ``graph_pattern_detector`` logs its subgraphs and returned as the report.
"""
from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx
from torch import nn
from torch.nn.modules.conv import _ConvNd

from ..config import StrategyConfig
from ..runtime.context import current
from .fused_ops import AddReLU, BatchNormReLU, Kernels, ReLUDepthwiseConv, is_depthwise

__all__ = ["apply_compute_fusion", "fuse_model", "PATTERNS"]

log = logging.getLogger("suite.compute.fusion")

PATTERNS = {"bn_act": "fuse_bn_act_ops", "elewise_add_act": "fuse_elewise_add_act_ops",
            "relu_depthwise_conv": "fuse_relu_depthwise_conv"}

_BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_RELU_FUNCS = (torch.relu, torch.nn.functional.relu, torch.relu_)
_ADD_FUNCS = (operator.add, torch.add)


def _new_report(enabled: dict) -> dict:
    return {name: {"enabled": on, "found": 0, "fused": 0, "skipped": []} for name, on in enabled.items()}


class _Pass:
    def __init__(self, enabled: dict[str, bool], kernels: Kernels):
        self.enabled = enabled
        self.kernels = kernels
        self.erased: set = set()
        self.add_count = 0
        self.report = _new_report(enabled)
        self.methods: list[str] = []  # how each traced unit was handled: "fx:<path>" / "sequential:<path>"

    # ---- helpers ------------------------------------------------------------------------
    def _skip(self, pattern: str, where: str, why: str) -> None:
        self.report[pattern]["skipped"].append(f"{where}: {why}")

    @staticmethod
    def _module(gm: nn.Module, node: fx.Node) -> nn.Module | None:
        if node.op != "call_module":
            return None
        return gm.get_submodule(str(node.target))

    def _is_relu(self, gm: nn.Module, node: fx.Node) -> bool:
        if node.op == "call_module":
            return type(self._module(gm, node)) is nn.ReLU
        if node.op == "call_function":
            return node.target in _RELU_FUNCS
        if node.op == "call_method":
            return node.target in ("relu", "relu_")
        return False

    @staticmethod
    def _relu_input(node: fx.Node) -> fx.Node:
        arg = node.args[0] if node.args else node.kwargs.get("input")
        assert isinstance(arg, fx.Node), f"ReLU input {arg!r} is not a graph node"
        return arg

    def _is_add(self, node: fx.Node) -> bool:
        if node.op == "call_function" and node.target in _ADD_FUNCS:
            return len(node.args) == 2 and not node.kwargs
        if node.op == "call_method" and node.target == "add":
            return len(node.args) == 2 and not node.kwargs
        return False

    def _erase(self, graph: fx.Graph, node: fx.Node) -> None:
        graph.erase_node(node)
        self.erased.add(node)

    def _fresh_name(self, gm: nn.Module) -> str:
        while True:
            self.add_count += 1
            name = f"fused_add_relu_{self.add_count}"
            if not hasattr(gm, name):
                return name

    # ---- the fx rewrite -------------------------------------------------------------------
    def rewrite_fx(self, gm: fx.GraphModule, prefix: str) -> None:
        graph = gm.graph
        for node in list(graph.nodes):
            if node in self.erased or node.op == "output":
                continue
            where = f"{prefix}{node.name}"
            # BatchNorm -> ReLU
            mod = self._module(gm, node)
            if isinstance(mod, _BN_TYPES):
                relu = next(iter(node.users)) if len(node.users) == 1 else None
                if relu is not None and self._is_relu(gm, relu) and self._relu_input(relu) is node:
                    self.report["bn_act"]["found"] += 1
                    if not self.enabled["bn_act"]:
                        continue
                    _set_submodule(gm, str(node.target), BatchNormReLU(mod, self.kernels))
                    relu.replace_all_uses_with(node)
                    self._erase(graph, relu)
                    self.report["bn_act"]["fused"] += 1
                elif any(self._is_relu(gm, u) for u in node.users):
                    self.report["bn_act"]["found"] += 1
                    self._skip("bn_act", where, "the BatchNorm output has other users besides the ReLU")
                continue
            # add -> ReLU
            if self._is_add(node):
                relu = next(iter(node.users)) if len(node.users) == 1 else None
                if relu is not None and self._is_relu(gm, relu) and self._relu_input(relu) is node:
                    self.report["elewise_add_act"]["found"] += 1
                    if not self.enabled["elewise_add_act"]:
                        continue
                    a, b = node.args
                    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
                        self._skip("elewise_add_act", where, "an operand is a constant, not a tensor")
                        continue
                    target = self._fresh_name(gm)
                    gm.add_submodule(target, AddReLU(self.kernels))
                    with graph.inserting_after(relu):
                        fused = graph.call_module(target, (a, b))
                    relu.replace_all_uses_with(fused)
                    self._erase(graph, relu)
                    self._erase(graph, node)
                    self.report["elewise_add_act"]["fused"] += 1
                elif any(self._is_relu(gm, u) for u in node.users):
                    self.report["elewise_add_act"]["found"] += 1
                    self._skip("elewise_add_act", where, "the sum has other users besides the ReLU")
                continue
            # ReLU -> depthwise conv
            if self._is_relu(gm, node):
                users = list(node.users)
                convs = [u for u in users if (m := self._module(gm, u)) is not None
                         and is_depthwise(m) and u.args and u.args[0] is node]
                if not convs:
                    continue
                self.report["relu_depthwise_conv"]["found"] += 1
                if not self.enabled["relu_depthwise_conv"]:
                    continue
                conv_node = convs[0]
                conv = self._module(gm, conv_node)
                assert isinstance(conv, _ConvNd)  # is_depthwise held
                if len(users) != 1:
                    self._skip("relu_depthwise_conv", where, "the ReLU output has other users besides the conv")
                    continue
                if sum(1 for n in graph.nodes if n.op == "call_module" and n.target == conv_node.target) != 1:
                    self._skip("relu_depthwise_conv", where, "the conv module is called more than once")
                    continue
                try:
                    fused_mod = ReLUDepthwiseConv(conv, self.kernels)
                except ValueError as exc:
                    self._skip("relu_depthwise_conv", where, str(exc))
                    continue
                _set_submodule(gm, conv_node.target, fused_mod)
                conv_node.args = (self._relu_input(node),) + tuple(conv_node.args[1:])
                self._erase(graph, node)
                self.report["relu_depthwise_conv"]["fused"] += 1
        graph.lint()
        gm.recompile()

    # ---- the module-pattern rewrite (Sequential containers) --------------------------------
    def rewrite_sequential(self, seq: nn.Sequential, prefix: str) -> None:
        names = list(seq._modules)
        i = 0
        while i < len(names) - 1:
            a, b = seq._modules[names[i]], seq._modules[names[i + 1]]
            where = f"{prefix}{names[i]}"
            if isinstance(a, _BN_TYPES) and type(b) is nn.ReLU:
                self.report["bn_act"]["found"] += 1
                if self.enabled["bn_act"]:
                    seq._modules[names[i]] = BatchNormReLU(a, self.kernels)
                    seq._modules[names[i + 1]] = nn.Identity()
                    self.report["bn_act"]["fused"] += 1
                    i += 2
                    continue
            elif type(a) is nn.ReLU and isinstance(b, _ConvNd) and is_depthwise(b):
                self.report["relu_depthwise_conv"]["found"] += 1
                if self.enabled["relu_depthwise_conv"]:
                    try:
                        fused_mod = ReLUDepthwiseConv(b, self.kernels)
                    except ValueError as exc:
                        self._skip("relu_depthwise_conv", where, str(exc))
                    else:
                        seq._modules[names[i]] = nn.Identity()
                        seq._modules[names[i + 1]] = fused_mod
                        self.report["relu_depthwise_conv"]["fused"] += 1
                        i += 2
                        continue
            i += 1

    # ---- driver ----------------------------------------------------------------------------
    def run(self, module: nn.Module, prefix: str = "") -> nn.Module:
        """The fused module for ``module`` (traced if fx can, else its children one by one)."""
        if not any(True for _ in module.children()):
            return module  # a leaf (conv, BN, ReLU, fused op …): nothing inside to fuse
        try:
            gm = fx.symbolic_trace(module)
        except Exception as exc:  # noqa: BLE001 - fx raises many kinds of errors on untraceable code
            log.info("compute fusion: fx cannot trace %s (%s: %s); fusing its children one by one",
                     prefix.rstrip(".") or "the model", type(exc).__name__, str(exc).splitlines()[0][:120])
            for name, child in list(module._modules.items()):
                if child is not None:
                    module._modules[name] = self.run(child, f"{prefix}{name}.")
            if isinstance(module, nn.Sequential):
                self.rewrite_sequential(module, prefix)
                self.methods.append(f"sequential:{prefix.rstrip('.') or '<root>'}")
            return module
        self.rewrite_fx(gm, prefix)
        self.methods.append(f"fx:{prefix.rstrip('.') or '<root>'}")
        _restore_missing_state(module, gm)
        return gm


def _set_submodule(root: nn.Module, target: str, new: nn.Module) -> None:
    parent_name, _, name = target.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    parent._modules[name] = new


def _restore_missing_state(original: nn.Module, gm: nn.Module) -> None:
    """fx copies only what the traced forward touches: bring back unused parameters and buffers,
    so state_dict keys stay those of the original."""
    have = set(gm.state_dict(keep_vars=True))
    for key, value in original.state_dict(keep_vars=True).items():
        if key in have:
            continue
        owner_path, _, attr = key.rpartition(".")
        owner = gm
        for part in owner_path.split(".") if owner_path else []:
            child = owner._modules.get(part)
            if child is None:
                child = owner._modules[part] = nn.Module()
            owner = child
        if isinstance(value, nn.Parameter):
            owner.register_parameter(attr, value)
        else:
            owner.register_buffer(attr, value)


def fuse_model(model: nn.Module, bn_act: bool = True, elewise_add_act: bool = True,
               relu_depthwise_conv: bool = True, backend: str = "eager") -> tuple[nn.Module, dict]:
    """The fused model and the report (per pattern: found, fused, skipped with reasons).

    ``report["backend"]`` is the fused ops' :class:`Kernels` info: which backend was asked for
    and which ran (``ran`` is filled by the first fused call).
    """
    kernels = Kernels(backend)
    p = _Pass({"bn_act": bn_act, "elewise_add_act": elewise_add_act, "relu_depthwise_conv": relu_depthwise_conv},
              kernels)
    before_keys = list(model.state_dict().keys())
    before_params = [n for n, _ in model.named_parameters()]
    training = model.training
    fused = p.run(model)
    fused.train(training)
    after_keys = list(fused.state_dict().keys())
    after_params = [n for n, _ in fused.named_parameters()]
    if sorted(before_keys) != sorted(after_keys) or sorted(before_params) != sorted(after_params):
        missing = sorted(set(before_keys) - set(after_keys))
        extra = sorted(set(after_keys) - set(before_keys))
        raise RuntimeError(f"compute fusion changed the model's state_dict keys (missing {missing}, extra {extra}); "
                           "this is a bug in suite.compute.fusion")
    report = dict(p.report)
    report["method"] = p.methods
    report["backend"] = kernels.info
    return fused, report


def kernels_label(backend: str, on_cuda: bool) -> tuple[str, str]:
    """What a fused case measures, for its record (``describe["compute_fusion"]``: ``kernels`` and ``kernels_note``)
    and the report.  The eager backend runs each fused op's arithmetic as separate kernels: on CUDA that is a
    composition of 6 to 10 kernels per direction for BN+ReLU against cuDNN's one batch-norm kernel (and a ReLU) of the
    unfused pair, so its speedup measures the composition, not a fused kernel as Paddle's is."""
    if backend == "compile":
        return "torch.compile", ("each fused op's arithmetic compiled by torch.compile (Inductor fuses its pointwise "
                                 "chains); the first steps pay for the compile")
    if on_cuda:
        return "eager composition", ("on CUDA each fused op runs as separate eager kernels (BN+ReLU: 6 to 10 per "
                                     "direction) where the unfused pair runs cuDNN's one batch-norm kernel and a ReLU: "
                                     "the speedup measures this composition, not a fused kernel "
                                     "(--set fusion_backend=compile runs them compiled)")
    return "eager composition", ("each fused op runs as separate eager kernels: on CPU what it changes is the bytes "
                                 "kept for backward")


def _on_cuda(model: nn.Module) -> bool:
    """The rank's platform is CUDA (a fake CUDA platform counts: tests), else the model's parameters are on a GPU."""
    try:
        return current().platform.is_cuda
    except RuntimeError:  # no rank context: a user's own process group
        return any(p.is_cuda for p in model.parameters())


def apply_compute_fusion(model: nn.Module, config: StrategyConfig) -> tuple[nn.Module, dict]:
    """The engine's plug point: fuse what ``config`` asks for; log and return the counts, and what the fused ops'
    kernels are (:func:`kernels_label`)."""
    fused, report = fuse_model(model, bn_act=config.fuse_bn_act_ops,
                               elewise_add_act=config.fuse_elewise_add_act_ops,
                               relu_depthwise_conv=config.fuse_relu_depthwise_conv, backend=config.fusion_backend)
    report["kernels"], report["kernels_note"] = kernels_label(config.fusion_backend, _on_cuda(fused))
    for pattern, knob in PATTERNS.items():
        r = report[pattern]
        if r["enabled"]:
            log.info("%s: ---  detected %d subgraphs, fused %d%s", knob, r["found"], r["fused"],
                     f" (skipped: {'; '.join(r['skipped'])})" if r["skipped"] else "")
    return fused, report
