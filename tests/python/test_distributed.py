"""optfuse under torch.distributed on gloo: ZeroRedundancyOptimizer (ZeRO-1 state sharding)
with optfuse.torch.AdamW as its local optimizer, with 2 and 4 processes; DistributedDataParallel
with 2 (FSDP2: test_fsdp.py).

Every rank computes its own gradients; they are averaged with all_reduce (as DDP does), each rank
updates its 1/N shard of the params with optfuse's fused step and keeps only that shard's
state, and ZeRO broadcasts the updated shards. The result must equal one process running
torch.optim.AdamW on the averaged gradients, within the float32 bound of test_trajectories.py
(the all_reduce sums in its own order: the gradients differ by rounding).
"""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import grad_for, make_params, max_abs

STEPS = 20


def rank_grads(p, step, k, world):
    return [grad_for(p, step * 97 + r, k) for r in range(world)]


def worker(rank, world, init_file, out_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    import optfuse.torch as oft
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.set_num_threads(1)
    ps = [p.clone().requires_grad_() for p in make_params()]
    opt = ZeroRedundancyOptimizer(ps, optimizer_class=oft.AdamW, lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    for step in range(STEPS):
        for k, p in enumerate(ps):
            g = rank_grads(p, step, k, world)[rank]
            dist.all_reduce(g)
            p.grad = g / world
        opt.step()
        sched.step()
        opt.zero_grad()
    local_state = sum(len(s) for s in opt.optim.state.values())
    if rank == 0:
        torch.save({"params": [p.detach() for p in ps], "local_state": local_state}, out_file)
    dist.barrier()
    dist.destroy_process_group()
    # Skip interpreter finalization: gloo's worker threads can still hold objects with Python
    # references then and abort the process (SIGABRT, "terminate called without an active
    # exception"; a known c10d teardown problem, seen once here in a fresh-clone run).
    os._exit(0)


@pytest.mark.parametrize("world", [2, 4])
def test_zero_redundancy_optimizer_with_optfuse_adamw(world):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.pt")
        mp.spawn(worker, args=(world, os.path.join(d, "init"), out), nprocs=world, join=True)
        got = torch.load(out)
    ref = [p.clone().requires_grad_() for p in make_params()]
    opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    for step in range(STEPS):
        for k, p in enumerate(ref):
            p.grad = torch.stack(rank_grads(p, step, k, world)).sum(0) / world
        opt.step()
        sched.step()
    assert max_abs(got["params"], ref) < 2e-5
    assert max_abs(got["params"], make_params()) > 1e-3
    # ZeRO-1: rank 0 holds the state of its shard only (3 entries per param: step, m, v).
    assert 0 < got["local_state"] < 3 * len(ref)


def ddp_worker(rank, world, init_file, out_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    import optfuse.torch as oft

    torch.set_num_threads(1)
    results = {}
    for name, cls in (("ours", oft.AdamW), ("ref", torch.optim.AdamW)):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        model = torch.nn.parallel.DistributedDataParallel(net)
        opt = cls(model.parameters(), lr=1e-2, weight_decay=0.1)
        for step in range(STEPS):
            g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batch
            x, y = torch.randn(8, 12, generator=g), torch.randn(8, 3, generator=g)
            torch.nn.functional.mse_loss(model(x), y).backward()  # grads all-reduced (mean)
            opt.step()
            opt.zero_grad()
        results[name] = [p.detach().clone() for p in net.parameters()]
    if rank == 0:
        torch.save(results, out_file)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def test_ddp_with_optfuse_adamw_matches_torch():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.pt")
        mp.spawn(ddp_worker, args=(2, os.path.join(d, "init"), out), nprocs=2, join=True)
        got = torch.load(out)
    # The same averaged gradients on both sides: the float32 bound of test_trajectories.py.
    assert max_abs(got["ours"], got["ref"]) < 2e-5
    torch.manual_seed(0)
    init = [
        p.detach()
        for p in torch.nn.Sequential(
            torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
        ).parameters()
    ]
    assert max_abs(got["ours"], init) > 1e-3
