"""PyTorch on one GPU: torch_mnist.py's model, loss, schedule and moving average (batch 100, one
process), timed like its single mode, for a side-by-side ratio with tandem on the same GPU.
Prints one JSON line with examples_per_sec and acc_avg / acc_raw, like torch_mnist.py."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import mnist_idx  # noqa: E402
import torch_mnist as tm  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    dev = torch.device("cuda")
    train_x, train_y, test_x, test_y = mnist_idx.load()
    tx, ty = torch.from_numpy(train_x).to(dev), torch.from_numpy(train_y).to(dev)
    model = tm.make_model(torch, args.seed).to(dev)
    params = list(model.parameters())
    shadow = [q.detach().clone() for q in params]
    opt = torch.optim.SGD(params, lr=0.8)
    stream = mnist_idx.BatchStream(np.arange(60000), np.arange(60000), tm.BATCH, seed=args.seed)
    steps = args.epochs * 60000 // tm.BATCH

    def step(gs):
        idx, _ = stream.next()
        idx = torch.from_numpy(idx).to(dev)
        x, y = tx.index_select(0, idx), ty.index_select(0, idx)
        for g in opt.param_groups:
            g["lr"] = tm.lr_at(gs)
        opt.zero_grad(set_to_none=True)
        tm.loss_fn(torch, model, x, y).backward()
        opt.step()
        tm.ema_update(torch, shadow, params, gs)

    for gs in range(args.warmup):
        step(gs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for gs in range(args.warmup, steps):
        step(gs)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    timed = steps - args.warmup
    print(json.dumps({"system": "pytorch", "torch_version": torch.__version__, "mode": "single-gpu",
                      "device": torch.cuda.get_device_name(), "steps": steps, "timed_seconds": dt,
                      "examples_per_sec": timed * tm.BATCH / dt,
                      "acc_avg": tm.accuracy(shadow, test_x, test_y),
                      "acc_raw": tm.accuracy(params, test_x, test_y)}))


if __name__ == "__main__":
    main()
