"""``python -m emergence.bench``: whole-process wall time and peak memory of

  (a) ``python -m emergence ... ablate.enabled=false`` (our capture, one pass);
  (b) the floor: a bare SDPA forward over the same batch, logits at the last position only;
  (c) the study's approach: eager attention, ``output_attentions=True``, batch 4, every
      [n, layers, heads, T] attention row kept, full logits;
  (d) ``python -m emergence`` with ablation on, for the ablation's cost;
  (e) in one process, the probe pass alone (``capture.run_probe``) against the bare SDPA
      forward pass over the same batch, alternated and timed ``--repeats`` times (the
      fastest of each): the capture's own cost, without start-up and reporting;

on a random-weight model of the chosen shape (``--arch``: a Pythia-160M-shaped GPTNeoX or
a SmolLM2-135M-shaped llama with grouped-query attention) with the paper probe. (a)-(d)
are each a fresh process (``os.wait4`` gives its own peak RSS); ratios are within this one
run, so the machine's speed cancels out.

    python -m emergence.bench [--arch llama] [--sequences 256] [--out bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from emergence.config import default_cache_dir


# Random-weight stand-ins for a real checkpoint of each shape: (description, config class, arguments).
SHAPES = {
    "gpt_neox": ("GPTNeoX 12x12, hidden 768, vocab 50304 (Pythia-160M-shaped)", "GPTNeoXConfig",
                 dict(vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072, max_position_embeddings=2048, rotary_pct=0.25)),
    "llama": ("llama 30 layers x 9 heads (3 KV heads), hidden 576, vocab 49152 (SmolLM2-135M-shaped)", "LlamaConfig",
              dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                   num_key_value_heads=3, intermediate_size=1536, max_position_embeddings=2048)),
}


def make_model(arch: str, path: Path) -> None:
    import transformers

    if (path / "model.safetensors").exists():
        return
    torch.manual_seed(0)
    _, config_class, kwargs = SHAPES[arch]
    config = getattr(transformers, config_class)(**kwargs)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)


def probe_pass_over_forward(path: str, n: int, repeats: int) -> dict:
    """(e): seconds of the probe pass and of the bare SDPA forward, fastest of ``repeats`` alternations."""
    from transformers import AutoModelForCausalLM

    from emergence.ablation import score_logits
    from emergence.capture import ATTN_IMPLEMENTATION, run_probe
    from emergence.checkpoints import Architecture
    from emergence.probe import baseline_positions, make_probe_batch

    bare = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    ours = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                attn_implementation=ATTN_IMPLEMENTATION).eval()
    arch = Architecture.of(ours)
    batch, baseline = make_probe_batch(n, 256, 100, 10000, 42), baseline_positions(256, 50)
    times: dict[str, list[float]] = {"probe_pass_s": [], "bare_forward_s": []}
    for _ in range(repeats):
        start = time.perf_counter()
        run_probe(ours, arch, batch, baseline, 16, n, False, score_logits)
        times["probe_pass_s"].append(time.perf_counter() - start)
        start = time.perf_counter()
        forward(bare, batch)
        times["bare_forward_s"].append(time.perf_counter() - start)
    best = {k: round(min(v), 3) for k, v in times.items()}
    return {**best, "ratio": round(best["probe_pass_s"] / best["bare_forward_s"], 3), "repeats": repeats}


def forward(model, batch) -> None:
    with torch.inference_mode():
        for start in range(0, batch.n, 16):
            model(batch.tokens[start:start + 16], logits_to_keep=1)


def floor(path: str, n: int) -> None:
    """(b): the same batch through the model's own SDPA path, logits at T-1 only."""
    from transformers import AutoModelForCausalLM

    from emergence.probe import make_probe_batch

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    forward(model, make_probe_batch(n, 256, 100, 10000, 42))


def study(path: str, n: int) -> None:
    """(c): eager attention with output_attentions, batch 4, all last-query rows and full logits kept."""
    from transformers import AutoModelForCausalLM

    from emergence.probe import make_probe_batch

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    batch = make_probe_batch(n, 256, 100, 10000, 42)
    rows, logits = [], []
    with torch.inference_mode():
        for start in range(0, n, 4):
            out = model(batch.tokens[start:start + 4], output_attentions=True)
            rows.append(torch.stack([a[:, :, -1, :] for a in out.attentions], 1))  # [b, layers, heads, T]
            logits.append(out.logits)
    torch.cat(rows)


def measure(cmd: list[str]) -> dict:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err[-2000:]}")
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m emergence.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", choices=sorted(SHAPES), default="gpt_neox", help="the model shape to measure on")
    p.add_argument("--sequences", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="alternations of (e); the fastest of each counts")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--floor", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--study", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.floor:
        return floor(args.floor, args.sequences)
    if args.study:
        return study(args.study, args.sequences)

    model_dir = Path(default_cache_dir()) / "bench" / f"{args.arch}-shaped"
    make_model(args.arch, model_dir)
    n = args.sequences
    with tempfile.TemporaryDirectory() as tmp:
        ours = [sys.executable, "-m", "emergence", "model=local", f"model.name_or_path={model_dir}",
                "model.dtype=float32", "probe=paper", f"probe.n_sequences={n}", "wandb.mode=disabled",
                "reuse=false", "resume=false"]
        results = {
            "a_emergence_no_ablation": measure([*ours, "ablate.enabled=false", f"hydra.run.dir={tmp}/a"]),
            "b_floor_sdpa_last_logits": measure([sys.executable, "-m", "emergence.bench", "--floor",
                                                 str(model_dir), "--sequences", str(n)]),
            "c_study_eager_all_rows": measure([sys.executable, "-m", "emergence.bench", "--study",
                                               str(model_dir), "--sequences", str(n)]),
            # A random model has no induction circuit: ablate a fixed 3-head set (+5 matched controls).
            "d_emergence_with_ablation": measure([*ours, "ablate.heads=[L3H1,L5H2,L7H0]",
                                                  f"hydra.run.dir={tmp}/d"]),
            "e_probe_pass_vs_bare_forward": probe_pass_over_forward(str(model_dir), n, args.repeats),
        }
        timings = json.loads((Path(tmp) / "d" / "summary.json").read_text())["timings"]
    a, b, c = (results[k] for k in ("a_emergence_no_ablation", "b_floor_sdpa_last_logits", "c_study_eager_all_rows"))
    results["ratios"] = {
        "a_over_b_wall": round(a["wall_s"] / b["wall_s"], 3),
        "c_over_a_wall": round(c["wall_s"] / a["wall_s"], 3),
        "a_over_c_peak_memory": round(a["peak_rss_mib"] / c["peak_rss_mib"], 3),
        "ablation_over_clean_pass": round(timings["ablate"] / timings["capture"], 3),
        "probe_pass_over_bare_forward": results["e_probe_pass_vs_bare_forward"]["ratio"],
    }
    results["setup"] = {"sequences": n, "seq_len": 256, "arch": args.arch, "model": SHAPES[args.arch][0],
                        "torch_threads": torch.get_num_threads(), "device": "cpu"}
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
