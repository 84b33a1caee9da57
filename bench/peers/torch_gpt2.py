#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bench/peers/torch_gpt2.py: PyTorch as mini_gpt's peer, measured in the same run.

The same GPT-2 float32 training step as examples/mini_gpt (llm.c's architecture: learned
positions, pre-LayerNorm blocks, tanh GELU, the LM head tied to the token embedding over the
padded vocabulary, the loss over the real one) and the same AdamW (torch.optim.AdamW, whose
formula mini_gpt's step follows), on the same llm.c checkpoint and token file, with the same
batch, sequence length and threads.

Usage:
  torch_gpt2.py train --model CKPT --data TOKENS --batch B --seq T --threads N --steps S
                [--lr LR --beta1 B1 --beta2 B2 --eps E --wd WD]
      one JSON line per step: {"step", "loss", "ms"} ("step" counts from 1).
  torch_gpt2.py compare --mini-gpt BINARY [--init gpt2 | --tiny] [--steps 5] [--batch 4]
                [--seq 64] [--threads 2] [--out FILE] [--max-loss-diff X]
      in one run: 1. mini_gpt writes the checkpoint (its GPT-2 initialisation, --steps 0
      --save-model); 2. a token file of seeded random tokens is written; 3. mini_gpt trains
      on them (--offload none), then 4. this script does; 5. the JSON (FILE, default
      build/bench/torch_peer.json) holds both runs' losses and step times, the step time
      ratio mini_gpt / PyTorch (medians of the steps after the first) and the largest
      relative loss difference. Exits 1 when that exceeds --max-loss-diff (default 1e-5:
      float32 sums in another order, and mini_gpt's softmax exponential, differ in the last
      bits, and the difference grows over the steps). Exits 77 where PyTorch is missing.
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKPOINT_MAGIC, CHECKPOINT_VERSION = 20240326, 3
TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1
HEADER_INTS = 256


def read_checkpoint(path: Path):
    """(config dict, flat float32 tensor of the parameters) of an llm.c checkpoint."""
    import torch
    raw = path.read_bytes()
    head = struct.unpack_from(f"<{HEADER_INTS}i", raw)
    if head[0] != CHECKPOINT_MAGIC or head[1] != CHECKPOINT_VERSION:
        sys.exit(f"{path}: not an llm.c float32 checkpoint (magic {head[0]}, version {head[1]})")
    cfg = dict(maxT=head[2], V=head[3], L=head[4], NH=head[5], C=head[6], Vp=head[7])
    params = torch.frombuffer(bytearray(raw[HEADER_INTS * 4:]), dtype=torch.float32)
    return cfg, params


def read_tokens(path: Path):
    raw = path.read_bytes()
    head = struct.unpack_from(f"<{HEADER_INTS}i", raw)
    if head[0] != TOKENS_MAGIC or head[1] != TOKENS_VERSION:
        sys.exit(f"{path}: not an llm.c token file (magic {head[0]}, version {head[1]})")
    return list(struct.unpack_from(f"<{head[2]}H", raw, HEADER_INTS * 4))


def write_tokens(path: Path, tokens: list) -> None:
    head = [TOKENS_MAGIC, TOKENS_VERSION, len(tokens)] + [0] * (HEADER_INTS - 3)
    path.write_bytes(struct.pack(f"<{HEADER_INTS}i", *head) + struct.pack(f"<{len(tokens)}H", *tokens))


def split_params(cfg: dict, flat):
    """llm.c's parameter tensors, in its order, as views of `flat` (trainable leaves)."""
    import torch
    Vp, C, L, maxT = cfg["Vp"], cfg["C"], cfg["L"], cfg["maxT"]
    shapes = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)),
              ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)),
              ("ln2w", (L, C)), ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
              ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
    out, at = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        out[name] = torch.nn.Parameter(flat[at:at + n].clone().view(shape))
        at += n
    if at != flat.numel():
        sys.exit(f"checkpoint holds {flat.numel()} parameters, the config needs {at}")
    return out


def gpt2_loss(p: dict, cfg: dict, idx, targets):
    """Mean cross-entropy of llm.c's GPT-2 over (B, T) tokens."""
    import torch
    import torch.nn.functional as F
    B, T = idx.shape
    C, NH, L, V = cfg["C"], cfg["NH"], cfg["L"], cfg["V"]
    hs = C // NH
    x = p["wte"][idx] + p["wpe"][:T]  # (B, T, C)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], eps=1e-5)
        qkv = h @ p["qkvw"][l].t() + p["qkvb"][l]  # (B, T, 3C)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)  # (B, NH, T, T)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p["attprojw"][l].t() + p["attprojb"][l]
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], eps=1e-5)
        h = F.gelu(h @ p["fcw"][l].t() + p["fcb"][l], approximate="tanh")
        x = x + h @ p["fcprojw"][l].t() + p["fcprojb"][l]
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], eps=1e-5)
    logits = x @ p["wte"].t()  # (B, T, Vp); the padded rows take no part in the loss
    return F.cross_entropy(logits[..., :V].reshape(B * T, V), targets.reshape(B * T))


def train(a) -> list:
    """Trains as mini_gpt does; prints and returns one record per step."""
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg, flat = read_checkpoint(Path(a.model))
    tokens = read_tokens(Path(a.data))
    p = split_params(cfg, flat)
    opt = torch.optim.AdamW(list(p.values()), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                            weight_decay=a.wd, foreach=False)
    BT = a.batch * a.seq
    nbatches = (len(tokens) - 1) // BT
    records = []
    for step in range(a.steps):
        start = (step % nbatches) * BT  # mini_gpt's fill_batch: batch k at k * B * T
        chunk = torch.tensor(tokens[start:start + BT + 1], dtype=torch.long)
        idx, targets = chunk[:-1].view(a.batch, a.seq), chunk[1:].view(a.batch, a.seq)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = gpt2_loss(p, cfg, idx, targets)
        loss.backward()
        opt.step()
        ms = (time.perf_counter() - t0) * 1e3
        rec = {"step": step + 1, "loss": loss.item(), "ms": ms}
        records.append(rec)
        if a.json:
            print(json.dumps(rec), flush=True)
    return records


def run_mini_gpt(binary: str, args: list) -> list:
    out = subprocess.run([binary] + args, check=True, capture_output=True, text=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.startswith("{") and '"step"' in l and '"loss"' in l]


def compare(a) -> int:
    try:
        import torch
    except ImportError:
        print("torch_gpt2.py: PyTorch is not installed (Debian: python3-torch; `scripts/dev bench torch` "
              "installs it)", file=sys.stderr)
        return 77  # skipped (ctest SKIP_RETURN_CODE 77)
    shape = (["--layers", "2", "--channels", "64", "--heads", "4", "--vocab", "512", "--max-seq", "64"]
             if a.tiny else ["--init", a.init])
    common = ["--batch", str(a.batch), "--seq", str(a.seq), "--threads", str(a.threads), "--lr", str(a.lr)]
    with tempfile.TemporaryDirectory(prefix="torch-peer-", dir=a.scratch) as tmp:
        tmp = Path(tmp)
        ckpt, data = tmp / "model.bin", tmp / "tokens.bin"
        # 1. The checkpoint: mini_gpt's initialisation, untrained.
        subprocess.run([a.mini_gpt] + shape + ["--steps", "0", "--save-model", str(ckpt), "--path", str(tmp)],
                       check=True, capture_output=True)
        cfg, _ = read_checkpoint(ckpt)
        # 2. Seeded random tokens, enough for every step's batch.
        import random
        rng = random.Random(1)
        write_tokens(data, [rng.randrange(cfg["V"]) for _ in range(a.batch * a.seq * a.steps + 1)])
        # 3-4. Both trainers, one after the other, on the same files.
        mini = run_mini_gpt(a.mini_gpt, ["--model", str(ckpt), "--data", str(data), "--offload", "none",
                                         "--steps", str(a.steps), "--path", str(tmp), "--json"] + common)
        t = argparse.Namespace(model=ckpt, data=data, batch=a.batch, seq=a.seq, threads=a.threads, steps=a.steps,
                               lr=a.lr, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.0, json=False)
        peer = train(t)
    if len(mini) != a.steps:
        print(f"torch_gpt2.py: mini_gpt printed {len(mini)} steps of JSON, expected {a.steps}", file=sys.stderr)
        return 1
    diffs = [abs(m["loss"] - p["loss"]) / abs(p["loss"]) for m, p in zip(mini, peer)]
    timed = slice(1, None) if a.steps > 1 else slice(0, None)
    mini_ms = statistics.median(r["ms"] for r in mini[timed])
    peer_ms = statistics.median(r["ms"] for r in peer[timed])
    doc = {
        "context": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "machine": platform.processor() or platform.machine(), "num_cpus": os.cpu_count(),
                    "torch": torch.__version__},
        "settings": {"model": "tiny" if a.tiny else a.init, "batch": a.batch, "seq": a.seq, "threads": a.threads,
                     "steps": a.steps, "lr": a.lr, "config": cfg},
        "mini_gpt": {"loss": [r["loss"] for r in mini], "ms": [r["ms"] for r in mini]},
        "torch": {"loss": [r["loss"] for r in peer], "ms": [r["ms"] for r in peer]},
        "mini_gpt_ms": mini_ms, "torch_ms": peer_ms, "step_ratio": mini_ms / peer_ms,
        "max_loss_rel_diff": max(diffs),
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for m, p, d in zip(mini, peer, diffs):
        print(f"step {m['step']}: loss mini_gpt {m['loss']:.6f}, PyTorch {p['loss']:.6f} (relative {d:.1e}); "
              f"ms {m['ms']:.1f} / {p['ms']:.1f}")
    print(f"step time mini_gpt / PyTorch: {mini_ms:.1f} / {peer_ms:.1f} ms = {doc['step_ratio']:.2f} -> {out}")
    if max(diffs) > a.max_loss_diff:
        print(f"torch_gpt2.py: the losses differ by {max(diffs):.2e} (relative), more than {a.max_loss_diff:g}",
              file=sys.stderr)
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True)
    for name, default in (("--batch", 4), ("--seq", 64), ("--threads", 2), ("--steps", 5)):
        t.add_argument(name, type=int, default=default)
    for name, default in (("--lr", 1e-4), ("--beta1", 0.9), ("--beta2", 0.999), ("--eps", 1e-8), ("--wd", 0.0)):
        t.add_argument(name, type=float, default=default)
    t.add_argument("--json", action="store_true", default=True)
    c = sub.add_parser("compare")
    c.add_argument("--mini-gpt", required=True)
    c.add_argument("--init", default="gpt2")
    c.add_argument("--tiny", action="store_true", help="a 2-layer, 64-channel model instead of --init")
    for name, default in (("--batch", 4), ("--seq", 64), ("--threads", 2), ("--steps", 5)):
        c.add_argument(name, type=int, default=default)
    c.add_argument("--lr", type=float, default=1e-4)
    c.add_argument("--max-loss-diff", type=float, default=1e-5)
    c.add_argument("--scratch", default=None, help="where the checkpoint and tokens go (default: $TMPDIR)")
    c.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "build/bench/torch_peer.json"))
    a = ap.parse_args()
    if a.cmd == "train":
        train(a)
        return 0
    return compare(a)


if __name__ == "__main__":
    sys.exit(main())
