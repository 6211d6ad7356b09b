#!/usr/bin/env python3
"""Throughput of single AVX2 instructions on this CPU, in cycles per instruction.

For each instruction (or pair, to see whether two share an execution port) a C program runs 48
independent copies in a loop 10 million times, the fastest of 3 runs; the clock rate comes from a
chain of 48 dependent integer multiplies (3 cycles each on Intel and AMD cores alike; a chain of
adds is no clock on Intel's Golden Cove, which runs adds of a constant at renaming, several per
cycle) timed in the same program, the fastest of 3.
Used for src/lower/even_odd.h's choice (bench/README.md, "Hand-written loops"): on a Zen 1 EPYC
the 256-bit shifts and the shuffles that change element widths run at one per 2 cycles, `vpand`,
`vpaddd` and `vpblendw` at one per 0.5-0.7 cycles.

    python3 bench/micro/throughput.py            # the default list
    python3 bench/micro/throughput.py vpsrld vpmovzxwd+vpsrld
Needs a C compiler (`cc`) and an x86-64 CPU with AVX2.
"""

import argparse
import os
import subprocess
import tempfile

# Each form writes ymm{d} (0-11, cycling so that copies are independent) from ymm12 / ymm13.
FORMS = {
    "vpsrld": "vpsrld $16, %ymm12, %ymm{d}",
    "vpslld": "vpslld $16, %ymm12, %ymm{d}",
    "vpaddd": "vpaddd %ymm12, %ymm13, %ymm{d}",
    "vpand": "vpand %ymm12, %ymm13, %ymm{d}",
    "vpblendw": "vpblendw $0xaa, %ymm12, %ymm13, %ymm{d}",
    "vpshufb": "vpshufb %ymm12, %ymm13, %ymm{d}",
    "vpunpcklwd": "vpunpcklwd %ymm12, %ymm13, %ymm{d}",
    "vpackusdw": "vpackusdw %ymm12, %ymm13, %ymm{d}",
    "vpmovzxwd": "vpmovzxwd %xmm12, %ymm{d}",
    "vpermq": "vpermq $0xd8, %ymm12, %ymm{d}",
    "vaddps": "vaddps %ymm12, %ymm13, %ymm{d}",
    "vmulps": "vmulps %ymm12, %ymm13, %ymm{d}",
    "vfmadd231ps": "vfmadd231ps %ymm12, %ymm13, %ymm{d}",
    "vsqrtps": "vsqrtps %ymm12, %ymm{d}",
    "vdivps": "vdivps %ymm12, %ymm13, %ymm{d}",
    "vrcpps": "vrcpps %ymm12, %ymm{d}",
    "vcvtph2ps": "vcvtph2ps %xmm12, %ymm{d}",
}
DEFAULT = list(FORMS) + ["vpsrld+vpaddd", "vpsrld+vpmovzxwd", "vpmovzxwd+vpermq", "vsqrtps+vdivps"]

PROGRAM = r"""
#include <stdio.h>
#include <time.h>
static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(void) {
  const long n = 20000000;
  long x = 0;
  double hz = 0, best = 1e30;
  for (int round = 0; round < 3; ++round) {  // the fastest of 3: the machines are noisy
    double t0 = seconds();
    for (long i = 0; i < n / 2; ++i) __asm__ volatile(CHAIN : "+r"(x));
    double f = 3 * 48.0 * (n / 2) / (seconds() - t0);
    hz = f > hz ? f : hz;
  }
  __asm__ volatile("vpxor %%ymm12, %%ymm12, %%ymm12\n vpcmpeqd %%ymm13, %%ymm13, %%ymm13" ::);
  for (int round = 0; round < 3; ++round) {
    double t0 = seconds();
    for (long i = 0; i < n / 2; ++i) __asm__ volatile(BODY ::: "memory");
    double t = seconds() - t0;
    best = t < best ? t : best;
  }
  printf("%.2f %.2f\n", best * hz / (n / 2) / 48, hz / 1e9);
  return 0;
}
"""


def measure(spec, cc):
    forms = [FORMS[name] for name in spec.split("+")]
    body = "\\n".join(forms[i % len(forms)].format(d=i % 12) for i in range(48))
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "t.c"), os.path.join(tmp, "t")
        with open(src, "w") as f:
            # %% in extended asm: the register names' percent signs.
            chain = "\\n".join(["imul %0, %0"] * 48)  # 48 dependent multiplies: 144 cycles
            f.write(
                PROGRAM.replace("BODY", '"' + body.replace("%", "%%") + '"').replace(
                    "CHAIN", '"' + chain + '"'
                )
            )
        subprocess.run([cc, "-O2", "-mavx2", "-mfma", "-mf16c", src, "-o", exe], check=True)
        out = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="*", help="instructions, or pairs as a+b (default: all)")
    ap.add_argument("--cc", default="cc", help="C compiler (default: cc)")
    args = ap.parse_args()
    for spec in args.specs or DEFAULT:
        cycles, ghz = measure(spec, args.cc)
        print(f"{spec:22s} {cycles:5.2f} cycles per instruction  (clock {ghz:.2f} GHz)")


if __name__ == "__main__":
    main()
