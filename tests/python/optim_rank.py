"""One data-parallel rank of test_optim_groups.py's replica-group tests, run as its own process.

    optim_rank.py TARGET NAMESPACE GROUP WORLD_SIZE RANK STEPS OUT [--hang]

Trains the examples' MLP (optim_models.mlp_problem) with fp4q.optim.SGD in replica group GROUP
on its own shard of the samples (rank r takes samples r, r + K, r + 2K, ...) and writes OUT
(torch.save): every step's gradients (what this rank sent) and the final parameters. With
--hang it builds the optimizer, prints "ready" and waits to be killed (a rank that dies).
"""

import sys

import torch

import fp4q
import optim_models


def main(argv):
    target, namespace, group, world, rank, steps, out = argv[:7]
    world, rank, steps = int(world), int(rank), int(steps)
    client = fp4q.Client(target, timeout=120, namespace=namespace)
    model, x, y = optim_models.mlp_problem(seed=5)
    opt = fp4q.optim.SGD(model.named_parameters(), lr=0.1, momentum=0.9, client=client,
                         group=group, world_size=world, rank=rank, deadline_ms=60000)
    if "--hang" in argv:
        print("ready", flush=True)
        sys.stdin.read()
        return 0
    xs, ys = x[rank::world], y[rank::world]
    grads, losses = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = optim_models.mlp_loss(model, xs, ys)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        losses.append(float(loss))
        opt.step()
    torch.save({"grads": grads, "losses": losses,
                "params": {n: p.detach().clone() for n, p in model.named_parameters()},
                "step": opt._fp4q_steps}, out)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
