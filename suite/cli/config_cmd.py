"""`fleetbench config`: show the resolved config (defaults, a TOML file, presets, --set), or list fields."""
from __future__ import annotations

from ..config import PRESETS, StrategyConfig


def add_parser(sub) -> None:
    p = sub.add_parser("config", help="print a resolved StrategyConfig, list fields or presets")
    p.add_argument("--config", help="TOML file with strategy fields (top level or a [strategy] table)")
    p.add_argument("--preset", help=f"a named preset: {', '.join(sorted(PRESETS))}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one field")
    p.add_argument("--list", action="store_true", help="every field with its default")
    p.add_argument("--presets", action="store_true", help="list the presets")
    p.set_defaults(func=main)


def resolve(args) -> StrategyConfig:
    cfg = StrategyConfig.from_toml(args.config) if getattr(args, "config", None) else StrategyConfig()
    if getattr(args, "preset", None):
        cfg = StrategyConfig.preset(args.preset, **cfg.diff())
    return cfg.with_overrides(getattr(args, "set", []) or [])


def main(args) -> int:
    if args.presets:
        for name, values in sorted(PRESETS.items()):
            print(f"{name:22s} {values}")
        return 0
    if args.list:
        print(StrategyConfig().describe())
        return 0
    cfg = resolve(args)
    print(cfg.describe())
    return 0
