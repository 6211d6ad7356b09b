"""An installed optfuse wheel, in a fresh virtual environment: run by scripts/wheel_test.sh.

Checks that the package is the installed one, that a training step compiles its kernel (empty
kernel cache: Halide and LLVM run in this process) and matches torch.optim.AdamW, and that every
library the wheel bundles was loaded from the wheel's own folder, never from the system.
Exits non-zero with the reason on the first failure.
"""

import copy
import os
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # (torch's; not needed)
import torch  # noqa: E402

import optfuse  # noqa: E402
import optfuse.torch as oft  # noqa: E402


def fail(why: str) -> None:
    sys.exit(f"wheel smoke: FAIL: {why}")


package = os.path.realpath(os.path.dirname(optfuse.__file__))
site = os.path.dirname(package)
if not package.startswith(os.path.realpath(sys.prefix) + os.sep):
    fail(f"optfuse imported from {package}, not from this environment ({sys.prefix})")
libs_dir = os.path.realpath(os.path.join(site, "optfuse.libs"))
if not os.path.isdir(libs_dir):
    fail(f"{libs_dir} is missing: the wheel was not repaired")
schedules = optfuse._core.shipped_schedule_dir()
if not os.path.realpath(schedules).startswith(package + os.sep):
    fail(f"shipped schedules found at {schedules!r}, not inside {package}")

cache_dir = os.environ.get("OPTFUSE_CACHE_DIR", "")
if not cache_dir or os.listdir(cache_dir):
    fail("OPTFUSE_CACHE_DIR must name an empty directory, so that the step compiles")


def train_and_compare() -> None:
    """A small model, three steps each of optfuse's AdamW and torch's, from the same start.
    (In a function, so that no optimizer outlives it: nanobind reports bound objects still
    alive at exit as leaks.)"""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    reference = copy.deepcopy(model)
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    pairs = [
        (model, oft.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)),
        (reference, torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)),
    ]
    for net, opt in pairs:
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if not torch.allclose(p, q, rtol=1e-5, atol=1e-6):
            fail(
                f"{name}: optfuse's AdamW differs from torch's by {(p - q).abs().max().item():.3g}"
            )


train_and_compare()
counters = optfuse.engine().counters()
# (No runtime is compiled: the wheel's library has it built in, jit/embedded_runtime.h.)
if counters["compiles"] < 1 or counters["runtime_compiles"] != 0:
    fail(f"no kernel was compiled in this process: {counters}")
if not os.listdir(cache_dir):
    fail(f"nothing was written to the kernel cache {cache_dir}")

# Halide, LLVM and xxHash (and Z3, which only LLVM uses) must be mapped from the wheel's copies
# in optfuse.libs, none from anywhere else. (Other bundled libraries, e.g. libffi, may also be
# loaded from the system by Python itself: two copies of those are normal and harmless.)
with open("/proc/self/maps", encoding="utf-8") as f:
    fields = [line.split(None, 5) for line in f]
mapped = {os.path.realpath(x[5].strip()) for x in fields if len(x) == 6 and x[5].startswith("/")}
ours = ("libHalide", "libLLVM", "libxxhash", "libz3")
for path in sorted(mapped):
    if os.path.basename(path).startswith(ours) and os.path.dirname(path) != libs_dir:
        fail(f"{path} is loaded, not the wheel's copy in {libs_dir}")
for name in ours[:3]:
    if not any(
        os.path.dirname(m) == libs_dir and os.path.basename(m).startswith(name) for m in mapped
    ):
        fail(f"no {name} is loaded from {libs_dir}: {sorted(os.listdir(libs_dir))}")

print(
    f"wheel smoke: ok: optfuse {optfuse.__version__} from {package}, torch {torch.__version__},"
    f" {counters['compiles']} kernel(s) compiled (the Halide runtime built in) in "
    f"{counters['compile_seconds']:.2f} s, Halide, LLVM and xxHash from {libs_dir}"
)
