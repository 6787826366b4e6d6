"""`fleetbench config`: prints a resolved ``suite.config.StrategyConfig`` (its --help: ``ABOUT``), its fields or the
presets."""
from __future__ import annotations

from ..config import PRESETS, StrategyConfig, field_table, to_toml
from . import helps

# --help's description: what the command does, for its users (the docstring above is for developers)
ABOUT = """`fleetbench config`: show the strategy config a case would run with, or list the fields and presets.

The config is every knob at its default, then a preset, a TOML file (fleetbench's names or Paddle 2.x
DistributedStrategy's) and --set on top, validated as `fleetbench run` validates it.  docs/config.md
describes every field."""


def add_parser(sub) -> None:
    p = sub.add_parser("config", help="print a resolved strategy config, list fields or presets", **helps(ABOUT, """
        fleetbench config --list
        fleetbench config --presets
        fleetbench config --preset paddle_proto_fusion --set fuse_grad_size_in_MB=8 --format toml
        fleetbench config --config my_paddle_strategy.toml"""))
    p.add_argument("--config", help="TOML file with strategy fields (top level or a [strategy] table); "
                   "Paddle 2.x DistributedStrategy names are read too (docs/config.md)")
    p.add_argument("--preset", help=f"a named preset: {', '.join(sorted(PRESETS))}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field (ours or Paddle's, e.g. build_strategy.fuse_bn_act_ops=true)")
    p.add_argument("--format", choices=("text", "toml"), default="text",
                   help="text: one field a line, changed ones marked; toml: a file --config reads back")
    p.add_argument("--list", action="store_true", help="every field with its default, what it accepts, and help")
    p.add_argument("--presets", action="store_true", help="list the presets")
    p.set_defaults(func=main)


def resolve(args) -> StrategyConfig:
    cfg = StrategyConfig.from_toml(args.config) if getattr(args, "config", None) else StrategyConfig()
    if getattr(args, "preset", None):
        cfg = StrategyConfig.preset(args.preset, **cfg.diff())
    return cfg.with_overrides(getattr(args, "set", []) or [])


def _title(args) -> str:
    parts = [f"--config {args.config}" if getattr(args, "config", None) else "",
             f"--preset {args.preset}" if getattr(args, "preset", None) else "",
             " ".join(f"--set {s}" for s in getattr(args, "set", []) or [])]
    said = " ".join(p for p in parts if p)
    return "fleetbench strategy" + (f": fleetbench config {said}" if said else " (the all-off default)")


def main(args) -> int:
    if args.presets:
        for name, values in sorted(PRESETS.items()):
            print(f"{name:22s} {values}")
        return 0
    if args.list:
        print(field_table())
        return 0
    cfg = resolve(args)
    text = to_toml(cfg, _title(args)) if args.format == "toml" else cfg.describe()
    print(text, end="\n" if args.format == "text" else "")
    return 0
