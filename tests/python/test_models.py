"""Real training: an MLP and a tiny transformer on synthetic data, 300 steps from the same seed
with torch.optim.AdamW and with optfuse.torch.AdamW (cosine schedule, weight decay, grads set
to None every step).

Tolerance: the runs differ only by float32 rounding in the update (see test_trajectories.py:
optfuse contracts AdamW's last multiply-add into one FMA, so after a step 30% of its weights
are 1-2 ulp from torch's, in both directions), but training amplifies such differences over
hundreds of steps, so params are not compared and no fixed bound fits every model. The yardstick
is torch against itself, rounded differently: its fused AdamW, and its foreach AdamW with every
update then moved one ulp up or down in a third of the elements (`Jittered`, 4 seeds). Where
the loss curve goes is chaotic in those perturbations: on a 2-core Intel Xeon (torch 2.15) the
transformer's worst relative deviation from torch's foreach curve was 0.24% for fused and
0.45-2.45% for 8 jitter seeds, against 3.5% for optfuse (on a Zen 4 earlier: 1.4% fused, 2.5%
optfuse; the MLP: 7e-7 fused, 9e-7 optfuse, 1e-6 jittered). optfuse's curve must stay within 3
times the largest of them, and both must learn (final loss under half the first). Small changes
of the maths (eps 1e-8 -> 1e-7, beta2 0.999 -> 0.998, amsgrad) move the transformer's curve by
1.3-2.5% too, so this checks that optfuse trains like torch; the update's maths is checked step
by step against torch in test_trajectories.py and the optimizer tests.
"""

import functools

import pytest
import torch
import torch.nn as nn

import optfuse.torch as oft

STEPS = 300


class TinyTransformer(nn.Module):
    def __init__(self, vocab=64, dim=32, heads=4, layers=2, seq=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(self.enc(self.emb(x) + self.pos))


def mlp():
    return nn.Sequential(
        nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1)
    )


def data(kind):
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        x = torch.randn(256, 20, generator=g)
        y = (x[:, :5].sum(1, keepdim=True) ** 2 + x[:, 5:6]).tanh()
        return x, y, nn.functional.mse_loss
    x = torch.randint(0, 64, (64, 16), generator=g)
    y = torch.roll(x, 1, dims=1)  # learn to copy the previous token
    return x, y, lambda out, tgt: nn.functional.cross_entropy(out.reshape(-1, 64), tgt.reshape(-1))


def train(kind, cls):
    torch.manual_seed(0)
    model = mlp() if kind == "mlp" else TinyTransformer()
    x, y, loss_fn = data(kind)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = cls(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=3e-3
    )
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, STEPS)
    losses = []
    for step in range(STEPS):
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


class Jittered(torch.optim.AdamW):
    """torch's foreach AdamW, each update then moved one ulp up or down in a third of the
    elements (drawn from `seed`): a rounding-level perturbation of every step."""

    def __init__(self, params, seed, **kw):
        super().__init__(params, foreach=True, **kw)
        self.gen = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def step(self):
        super().step()
        for group in self.param_groups:
            for p in group["params"]:
                r = torch.rand(p.shape, generator=self.gen)
                up = torch.nextafter(p, torch.full_like(p, float("inf")))
                down = torch.nextafter(p, torch.full_like(p, float("-inf")))
                p.copy_(torch.where(r < 1 / 6, up, torch.where(r < 1 / 3, down, p)))


@pytest.mark.parametrize("kind", ["mlp", "transformer"])
def test_loss_curves_agree_with_torch(kind):
    torch.set_num_threads(1)  # deterministic forward/backward in every run
    ref = train(kind, functools.partial(torch.optim.AdamW, foreach=True))
    others = [train(kind, functools.partial(torch.optim.AdamW, fused=True))]
    others += [train(kind, functools.partial(Jittered, seed=s)) for s in range(1, 5)]
    ours = train(kind, oft.AdamW)

    def worst(a, b):
        return max(abs(x - y) / abs(x) for x, y in zip(a, b))

    yardstick = max(worst(ref, o) for o in others)
    assert ref[-1] < 0.5 * ref[0] and ours[-1] < 0.5 * ours[0]
    assert worst(ref, ours) <= 3 * yardstick + 1e-5, (worst(ref, ours), yardstick)
