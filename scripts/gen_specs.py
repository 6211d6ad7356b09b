#!/usr/bin/env python3
"""Writes examples/specs/{resnet50,gpt2-small,gpt2-small-bf16}.json: the parameter layouts of
torchvision's resnet50 and Hugging Face's gpt2 (names, shapes as torch reports them), with the
optimizer set-ups usually trained with them (gpt2 also in bf16 without master weights). Run from
the repository root."""

import json


def resnet50():
    p = [("conv1.weight", [64, 3, 7, 7]), ("bn1.weight", [64]), ("bn1.bias", [64])]
    inplanes = 64
    for li, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            pre = f"layer{li}.{b}."
            p += [
                (pre + "conv1.weight", [width, inplanes, 1, 1]),
                (pre + "bn1.weight", [width]),
                (pre + "bn1.bias", [width]),
                (pre + "conv2.weight", [width, width, 3, 3]),
                (pre + "bn2.weight", [width]),
                (pre + "bn2.bias", [width]),
                (pre + "conv3.weight", [width * 4, width, 1, 1]),
                (pre + "bn3.weight", [width * 4]),
                (pre + "bn3.bias", [width * 4]),
            ]
            if b == 0:
                p += [
                    (pre + "downsample.0.weight", [width * 4, inplanes, 1, 1]),
                    (pre + "downsample.1.weight", [width * 4]),
                    (pre + "downsample.1.bias", [width * 4]),
                ]
            inplanes = width * 4
    p += [("fc.weight", [1000, 2048]), ("fc.bias", [1000])]
    return {
        "model": "resnet50",
        "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4},
        "param_groups": [
            {"match": r"(bn\d|downsample\.1)\.|\.bias$", "weight_decay": 0.0},
            {"match": ""},
        ],
        "parameters": [{"name": n, "shape": s, "dtype": "float32"} for n, s in p],
    }


def gpt2_small():
    d, p = 768, [("transformer.wte.weight", [50257, 768]), ("transformer.wpe.weight", [1024, 768])]
    for layer in range(12):
        pre = f"transformer.h.{layer}."
        p += [
            (pre + "ln_1.weight", [d]),
            (pre + "ln_1.bias", [d]),
            (pre + "attn.c_attn.weight", [d, 3 * d]),
            (pre + "attn.c_attn.bias", [3 * d]),
            (pre + "attn.c_proj.weight", [d, d]),
            (pre + "attn.c_proj.bias", [d]),
            (pre + "ln_2.weight", [d]),
            (pre + "ln_2.bias", [d]),
            (pre + "mlp.c_fc.weight", [d, 4 * d]),
            (pre + "mlp.c_fc.bias", [4 * d]),
            (pre + "mlp.c_proj.weight", [4 * d, d]),
            (pre + "mlp.c_proj.bias", [d]),
        ]
    p += [("transformer.ln_f.weight", [d]), ("transformer.ln_f.bias", [d])]
    return {
        "model": "gpt2-small",
        "optimizer": {
            "type": "adamw",
            "lr": 6e-4,
            "betas": [0.9, 0.95],
            "eps": 1e-8,
            "weight_decay": 0.1,
        },
        "param_groups": [
            {"match": r"\.bias$|ln_|\.wpe\.", "weight_decay": 0.0},
            {"match": ""},
        ],
        "parameters": [{"name": n, "shape": s, "dtype": "float32"} for n, s in p],
    }


def gpt2_small_bf16():
    """GPT-2 small trained in bf16 with torch's own semantics: no master copy, bf16 state."""
    spec = gpt2_small()
    spec["model"] = "gpt2-small-bf16"
    spec["optimizer"]["master_weights"] = False
    for x in spec["parameters"]:
        x["dtype"] = "bfloat16"
    return spec


for name, spec in [
    ("resnet50", resnet50()),
    ("gpt2-small", gpt2_small()),
    ("gpt2-small-bf16", gpt2_small_bf16()),
]:
    with open(f"examples/specs/{name}.json", "w") as f:
        f.write("{\n")
        keys = list(spec)
        for i, k in enumerate(keys):
            if k == "parameters":
                rows = ",\n".join("    " + json.dumps(x) for x in spec[k])
                f.write(f'  "parameters": [\n{rows}\n  ]')
            else:
                f.write(f"  {json.dumps(k)}: {json.dumps(spec[k])}")
            f.write(",\n" if i + 1 < len(keys) else "\n")
        f.write("}\n")
