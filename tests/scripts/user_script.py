"""A user's own training script: their own model, their own process group, fleetbench's engine.

Run it with torchrun (the README's command):
    torchrun --standalone --nproc_per_node 2 tests/scripts/user_script.py --out result.json
"""
import argparse
import json

import torch
import torch.distributed as dist
from torch import nn

from suite import StrategyConfig, build_engine


class UserNet(nn.Module):  # defined here, unknown to fleetbench
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 3))
        self.norm = nn.BatchNorm1d(12)

    def forward(self, x):
        return self.body(self.norm(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(100 + rank)  # ranks initialised differently on purpose
    model = UserNet()
    initial = [p.detach().clone() for p in model.parameters()]
    engine = build_engine(model, nn.functional.cross_entropy, StrategyConfig().with_overrides(args.set))
    after_broadcast = [p.detach().clone() for p in engine.module.parameters()]
    g = torch.Generator().manual_seed(7)
    xs = torch.randn(4, 8 * world, 12, generator=g)
    ys = torch.randint(0, 3, (4, 8 * world), generator=g)
    losses = []
    for step in range(4):
        x, y = xs[step, rank * 8:(rank + 1) * 8], ys[step, rank * 8:(rank + 1) * 8]
        losses.append(engine.train_step(x, y).item())
    flat = torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()])
    everyone = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    result = {
        "rank": rank,
        "changed_by_broadcast": any(not torch.equal(a, b) for a, b in zip(initial, after_broadcast)),
        "max_param_spread": max((e - flat).abs().max().item() for e in everyone),
        "losses": losses,
        "is_tensor_loss": True,
    }
    with open(f"{args.out}.{rank}", "w") as fh:
        json.dump(result, fh)
    dist.barrier()  # both ranks done with the group before either tears it down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
