#!/usr/bin/env python3
"""Training with PyTorch on minibatchd, with checkpoints that resume mid-epoch exactly.

    minibatchd run --config conf/example.toml &
    python examples/torch_train.py --socket target/example/minibatchd.sock --dataset train \\
        --stream features --epochs 3 --checkpoint /tmp/ckpt.pt --checkpoint-every 5

The loader is StatefulMinibatchDataLoader (torchdata's StatefulDataLoader, owning the epoch) over
a MinibatchIterableDataset: its state_dict (the epoch and the daemon session's position, per
worker split — read in the main process, or by worker processes) goes into the checkpoint with the model and the optimizer. Started again with the same --checkpoint, the script continues from the
last checkpoint: the minibatches after it are exactly those an uninterrupted run would have seen.
--stop-after N stops (as a crash would) after N steps; --step-log FILE writes one JSON line per
step (epoch, worker, minibatch index, position, samples, loss).
"""

import argparse
import json
import os

import torch
from minibatchd.torch import MinibatchIterableDataset, StatefulMinibatchDataLoader


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", default=None, help="the daemon's socket (default: $MINIBATCHD_SOCKET)")
    ap.add_argument("--dataset", default="train")
    ap.add_argument("--stream", default="features", help="a dense stream to train on")
    ap.add_argument("--minibatch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", required=True, help="checkpoint file (resumed from when it exists)")
    ap.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    ap.add_argument("--stop-after", type=int, default=None, help="stop after this many steps of this run")
    ap.add_argument("--step-log", default=None, help="append one JSON line per step to this file")
    args = ap.parse_args()

    ds = MinibatchIterableDataset(args.dataset, args.socket, minibatch_size=args.minibatch_size, seed=args.seed)
    loader = StatefulMinibatchDataLoader(ds, num_workers=args.workers)
    torch.manual_seed(0)
    model, opt, target = None, None, None
    start_epoch, step = 0, 0
    saved = torch.load(args.checkpoint, weights_only=False) if os.path.exists(args.checkpoint) else None

    def build(dim):
        nonlocal model, opt, target
        target = torch.linspace(-1.0, 1.0, dim).unsqueeze(1)
        model = torch.nn.Linear(dim, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)

    if saved is not None:
        build(saved["dim"])
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        start_epoch, step = saved["epoch"], saved["step"]

    def checkpoint(epoch):
        tmp = args.checkpoint + ".tmp"
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "loader": loader.state_dict(),
                    "epoch": epoch, "step": step, "dim": target.shape[0]}, tmp)
        os.replace(tmp, args.checkpoint)

    log = open(args.step_log, "a") if args.step_log else None
    taken = 0
    for epoch in range(start_epoch, args.epochs):
        for item in loader:
            # Unit-norm rows keep the stand-in regression well conditioned on any data.
            x = torch.nn.functional.normalize(item[args.stream]["values"], dim=1)
            if model is None:
                build(x.shape[1])
            loss = torch.nn.functional.mse_loss(model(x), x @ target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step, taken = step + 1, taken + 1
            meta = item["meta"]
            if log:
                log.write(json.dumps({"step": step, "epoch": meta["epoch"], "worker": meta["worker"], "index": meta["index"],
                                      "position": meta["position"], "samples": len(x), "loss": loss.item()}) + "\n")
                log.flush()
            if step % args.checkpoint_every == 0:
                checkpoint(epoch)
            if args.stop_after is not None and taken >= args.stop_after:
                return
        # The loader's state at an epoch's end starts the next epoch.
        checkpoint(epoch + 1)
    print(json.dumps({"steps": step}))


if __name__ == "__main__":
    main()
