"""optfuse under FSDP2 (torch.distributed.fsdp.fully_shard) on CPU over gloo, 2 processes.

The params are DTensors sharded on dim 0; optfuse steps each rank's local shards and keeps the
state sharded like the params (DTensors too), so torch.distributed.checkpoint (DCP) saves and
loads it as it does torch's AdamW's. Each run is checked against torch.optim.AdamW on the same
FSDP2 model, data and schedule in the same processes: the gradients are the same reduce-scattered
values, so the two differ only by the kernels' rounding (max relative 1e-5 after 20 steps, the
float32 bound of test_trajectories.py).
"""

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

fsdp = pytest.importorskip("torch.distributed.fsdp")
if not hasattr(fsdp, "fully_shard"):
    pytest.skip("this torch has no FSDP2 (fully_shard)", allow_module_level=True)

STEPS = 20
# Uneven shards on purpose: 7 rows over 2 ranks (4 + 3), and a (1, 5) param whose second
# rank's shard is empty.
SHAPES = [(16, 12), (7, 16), (1, 5)]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(12, 16)
        self.b = torch.nn.Linear(16, 7)
        self.scale = torch.nn.Parameter(torch.ones(1, 7))

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) * self.scale


def make_model(shard):
    torch.manual_seed(0)
    m = Net()
    if shard:
        for layer in (m.a, m.b):
            fsdp.fully_shard(layer)
        fsdp.fully_shard(m)
    return m


def train(model, opt, sched, steps, rank, start=0):
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(8, 12, generator=g)
        y = torch.randn(8, 7, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()


def schedule(opt, last_epoch=-1):
    """A closed-form schedule: a resumed run gets the same lr at each step from the step alone."""
    if last_epoch >= 0:
        for g in opt.param_groups:
            g.setdefault("initial_lr", 1e-2)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1.0 / (1.0 + 0.1 * s), last_epoch=last_epoch
    )


def full(model):
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    import optfuse.torch as oft

    def run(cls, steps, **kw):
        m = make_model(True)
        o = cls(m.parameters(), lr=1e-2, weight_decay=0.1, **kw)
        s = schedule(o)
        train(m, o, s, steps, rank)
        return m, o, s

    out = {}
    m_ref, o_ref, _ = run(torch.optim.AdamW, STEPS)
    m_ours, o_ours, _ = run(oft.AdamW, STEPS)
    out["ref"], out["ours"] = full(m_ref), full(m_ours)
    # State is sharded like the params: DTensors with the params' placements, local shards only.
    st = o_ours.state[next(iter(m_ours.parameters()))]
    out["state_is_dtensor"] = type(st["exp_avg"]).__name__ == "DTensor"
    out["state_keys"] = sorted(o_ours.state_dict()["state"][0])
    out["ref_keys"] = sorted(o_ref.state_dict()["state"][0])

    # DCP: 10 steps, save, a fresh model and optimizer load it and run the other 10.
    ckpt = os.path.join(out_dir, "ckpt")
    m1, o1, s1 = run(oft.AdamW, STEPS // 2)
    dcp.save({"optim": get_optimizer_state_dict(m1, o1)}, checkpoint_id=ckpt)
    dcp.save({"model": m1.state_dict()}, checkpoint_id=ckpt + "-model")
    for cls, name in ((oft.AdamW, "resumed"), (torch.optim.AdamW, "resumed_in_torch")):
        m2 = make_model(True)
        msd = {"model": m2.state_dict()}
        dcp.load(msd, checkpoint_id=ckpt + "-model")
        m2.load_state_dict(msd["model"])
        o2 = cls(m2.parameters(), lr=1e-2, weight_decay=0.1)
        osd = {"optim": get_optimizer_state_dict(m2, o2)}
        dcp.load(osd, checkpoint_id=ckpt)
        set_optimizer_state_dict(m2, o2, osd["optim"])
        s2 = schedule(o2, last_epoch=STEPS // 2 - 1)
        train(m2, o2, s2, STEPS // 2, rank, start=STEPS // 2)
        out[name] = full(m2)
    if rank == 0:
        torch.save(out, os.path.join(out_dir, "out.pt"))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # (see test_distributed.py: gloo's threads at interpreter exit)


@pytest.fixture(scope="module")
def fsdp_run():
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(2, os.path.join(d, "init"), d), nprocs=2, join=True)
        return torch.load(os.path.join(d, "out.pt"))


def max_rel(a, b):
    return max(((x - y).abs().max() / y.abs().max()).item() for x, y in zip(a, b))


def test_fsdp2_adamw_matches_torch(fsdp_run):
    assert max_rel(fsdp_run["ours"], fsdp_run["ref"]) <= 1e-5
    init = [p.detach() for p in make_model(False).parameters()]
    assert max_rel(fsdp_run["ours"], init) > 1e-3  # the params really moved


def test_fsdp2_state_is_sharded_like_the_params(fsdp_run):
    assert fsdp_run["state_is_dtensor"]
    assert fsdp_run["state_keys"] == fsdp_run["ref_keys"] == ["exp_avg", "exp_avg_sq", "step"]


def test_fsdp2_state_round_trips_through_dcp(fsdp_run):
    # Resumed from the checkpoint made after 10 steps: where the uninterrupted run ends, in
    # optfuse and in torch's AdamW (the checkpoint is torch's layout).
    assert max_rel(fsdp_run["resumed"], fsdp_run["ours"]) <= 1e-6
    assert max_rel(fsdp_run["resumed_in_torch"], fsdp_run["ref"]) <= 1e-5
