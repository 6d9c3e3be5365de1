#!/usr/bin/env python3
"""Data-parallel training with torchrun and minibatchd: every rank reads its own share of each
sweep from the node's daemon, and every rank runs the same number of steps per epoch, so
DistributedDataParallel never waits on a rank that ran out of data.

    minibatchd run --config conf/example.toml &
    torchrun --standalone --nproc_per_node 2 examples/torch_ddp.py \\
        --socket target/example/minibatchd.sock --dataset train --stream features --epochs 2

Each rank regresses a fixed linear function of the stream's (normalized) values, a stand-in
for a model, and,
with --step-log DIR, writes DIR/rank-R.json: per step its epoch, CNTK worker, minibatch index, position
and sample count, and the epoch losses.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from minibatchd.torch import MinibatchDataLoader, MinibatchIterableDataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", default=None, help="the daemon's socket (default: $MINIBATCHD_SOCKET)")
    ap.add_argument("--dataset", default="train")
    ap.add_argument("--stream", default="features", help="a dense stream to train on")
    ap.add_argument("--minibatch-size", type=int, default=64, help="global minibatch size, in samples (each rank's items hold its share, whatever --workers)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-log", help="a directory for each rank's step log")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # The rank and world size come from torchrun's environment; equal steps are on for world > 1.
    ds = MinibatchIterableDataset(args.dataset, args.socket, minibatch_size=args.minibatch_size, seed=args.seed)
    loader = MinibatchDataLoader(ds, num_workers=args.workers)

    torch.manual_seed(0)
    model = None
    steps, losses = [], []
    for epoch in range(args.epochs):
        ds.set_epoch(epoch)
        total, samples = torch.zeros(2), 0
        for item in loader:
            # Unit-norm rows keep the stand-in regression well conditioned on any data.
            x = torch.nn.functional.normalize(item[args.stream]["values"], dim=1)
            if model is None:
                dim = x.shape[1]
                target = torch.linspace(-1.0, 1.0, dim).unsqueeze(1)
                model = DistributedDataParallel(torch.nn.Linear(dim, 1))
                opt = torch.optim.SGD(model.parameters(), lr=0.5)
            y = x @ target
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()          # all-reduces the gradients: every rank must be here
            opt.step()
            total += torch.tensor([loss.item() * len(x), float(len(x))])
            meta = item["meta"]
            steps.append({"epoch": epoch, "worker": meta["worker"], "workers": meta["workers"], "index": meta["index"],
                          "position": meta["position"], "samples": len(x), "fingerprint": meta["fingerprint"]})
        dist.all_reduce(total)
        losses.append(float(total[0] / total[1]))
    if args.step_log:
        os.makedirs(args.step_log, exist_ok=True)
        with open(os.path.join(args.step_log, f"rank-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world": world, "steps": steps, "losses": losses}, f)
    if rank == 0:
        print(json.dumps({"world": world, "epoch_losses": losses}))
    # Every rank done before any tears gloo down: a rank that left first made another abort in
    # gloo's teardown once in CI ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
