#!/usr/bin/env python3
"""Training with JAX on minibatchd: jax.Array minibatches, one sweep per epoch, and a checkpoint
(model parameters plus the iterator's state dict, pickled) that resumes mid-epoch exactly.

    minibatchd run --config conf/example.toml &
    python examples/jax_train.py --socket target/example/minibatchd.sock --dataset train \\
        --stream features --epochs 3 --checkpoint /tmp/jax-ckpt.pkl

--stop-after N stops after N steps of this run (as a crash would); started again with the same
--checkpoint it continues from the last checkpoint. --step-log FILE writes one JSON line per step.
"""

import argparse
import json
import os
import pickle

import jax
import jax.numpy as jnp

from minibatchd.jax import MinibatchIterator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", default=None, help="the daemon's socket (default: $MINIBATCHD_SOCKET)")
    ap.add_argument("--dataset", default="train")
    ap.add_argument("--stream", default="features", help="a dense stream to train on")
    ap.add_argument("--minibatch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--checkpoint-every", type=int, default=10)
    ap.add_argument("--stop-after", type=int, default=None)
    ap.add_argument("--step-log", default=None)
    args = ap.parse_args()

    it = MinibatchIterator(args.dataset, args.socket, minibatch_size=args.minibatch_size, seed=args.seed)
    params, step = None, 0
    if os.path.exists(args.checkpoint):
        with open(args.checkpoint, "rb") as f:
            saved = pickle.load(f)
        params, step = saved["params"], saved["step"]
        it.load_state_dict(saved["data"])

    def loss_fn(p, x, y):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    @jax.jit
    def update(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree_util.tree_map(lambda a, g: a - 0.5 * g, p, grads), loss

    def checkpoint():
        tmp = args.checkpoint + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump({"params": params, "step": step, "data": it.state_dict()}, f)
        os.replace(tmp, args.checkpoint)

    log = open(args.step_log, "a") if args.step_log else None
    taken = 0
    while it.state_dict()["epoch"] < args.epochs:
        for item in it:
            x = item[args.stream]["values"]
            x = x / jnp.linalg.norm(x, axis=1, keepdims=True)      # unit-norm rows: well conditioned
            y = x @ jnp.linspace(-1.0, 1.0, x.shape[1])[:, None]   # a fixed linear target
            if params is None:
                params = {"w": jnp.zeros((x.shape[1], 1)), "b": jnp.zeros((1,))}
            params, loss = update(params, x, y)
            step, taken = step + 1, taken + 1
            meta = item["meta"]
            if log:
                log.write(json.dumps({"step": step, "epoch": meta["epoch"], "index": meta["index"],
                                      "position": meta["position"], "samples": int(x.shape[0]), "loss": float(loss)}) + "\n")
                log.flush()
            if step % args.checkpoint_every == 0:
                checkpoint()
            if args.stop_after is not None and taken >= args.stop_after:
                return
        checkpoint()
    print(json.dumps({"steps": step}))


if __name__ == "__main__":
    main()
