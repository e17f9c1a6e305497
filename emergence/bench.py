"""``python -m emergence.bench``: whole-process wall time and peak memory of

  (a) ``python -m emergence ... ablate.enabled=false`` (our capture, one pass);
  (b) the floor: a bare SDPA forward over the same batch, logits at the last position only;
  (c) the study's approach: eager attention, ``output_attentions=True``, batch 4, every
      [n, layers, heads, T] attention row kept, full logits;
  (d) ``python -m emergence`` with ablation of every probe sequence (``ablate.sequences=all``);
  (e) the whole recipe: ``python -m emergence`` with adaptive ablation (the default), which
      stops once the verdict is decided;

on a Pythia-160M-shaped GPTNeoX (12 layers x 12 heads, hidden 768, vocabulary 50304,
random weights) with the paper probe. Each is a fresh process (``os.wait4`` gives its own
peak RSS); ratios are within this one run, so the machine's speed cancels out. Beside the
process wall times, the steps are compared with (b)'s own forward loop (without loading):
the recipe (probe pass + screen + ablation) and the ablation step alone, over the bare pass.

    python -m emergence.bench [--sequences 256] [--out bench.json]
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


HEADS = ["ablate.heads=[L3H1,L5H2,L7H0]"]
RECIPE = ("capture", "screen_spectral", "ablate")  # the recipe's steps in summary.json's timings


def make_model(path: Path) -> None:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    if (path / "model.safetensors").exists():
        return
    torch.manual_seed(0)
    config = GPTNeoXConfig(vocab_size=50304, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                           intermediate_size=3072, max_position_embeddings=2048, rotary_pct=0.25)
    GPTNeoXForCausalLM(config).save_pretrained(path, safe_serialization=True)


def paper_probe(path: str, n: int):
    """The first ``n`` sequences of the paper probe (``probe=paper``), as ``python -m emergence`` makes them."""
    from emergence.config import compose_config
    from emergence.probe import make_probe_batch

    p = compose_config(["model=local", f"model.name_or_path={path}", "probe=paper", f"probe.n_sequences={n}"]).probe
    return make_probe_batch(p.n_sequences, p.seq_len, p.vocab_low, p.vocab_high, p.seed), p.batch_size


def floor(path: str, n: int) -> None:
    """(b): the same batch through the model's own SDPA path, logits at T-1 only."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    batch, batch_size = paper_probe(path, n)
    start_time = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            model(batch.tokens[start:start + batch_size], logits_to_keep=1)
    print(json.dumps({"forward_s": round(time.perf_counter() - start_time, 3)}))


def study(path: str, n: int) -> None:
    """(c): eager attention with output_attentions, batch 4, all last-query rows and full logits kept."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    batch, _ = paper_probe(path, n)
    rows, logits = [], []
    with torch.inference_mode():
        for start in range(0, n, 4):
            out = model(batch.tokens[start:start + 4], output_attentions=True)
            rows.append(torch.stack([a[:, :, -1, :] for a in out.attentions], 1))  # [b, layers, heads, T]
            logits.append(out.logits)
    torch.cat(rows)


def measure(cmd: list[str]) -> dict:
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:  # files: a full pipe would block
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0), err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.read().decode()[-2000:]}")
        lines = out.read().decode().strip().splitlines()
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            **(json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {})}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m emergence.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sequences", type=int, default=256)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--floor", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--study", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.floor:
        return floor(args.floor, args.sequences)
    if args.study:
        return study(args.study, args.sequences)

    model_dir = Path(default_cache_dir()) / "bench" / "pythia-160m-shaped"
    make_model(model_dir)
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
            "d_emergence_ablation_all": measure([*ours, *HEADS, "ablate.sequences=all", f"hydra.run.dir={tmp}/d"]),
            "e_emergence_adaptive": measure([*ours, *HEADS, f"hydra.run.dir={tmp}/e"]),
        }
        summaries = {k: json.loads((Path(tmp) / k / "summary.json").read_text()) for k in ("d", "e")}
    a, b, c = (results[k] for k in ("a_emergence_no_ablation", "b_floor_sdpa_last_logits", "c_study_eager_all_rows"))
    bare = b["forward_s"]
    d, e = (summaries[k]["timings"] for k in ("d", "e"))
    results["ratios"] = {
        "a_over_b_wall": round(a["wall_s"] / b["wall_s"], 3),
        "c_over_a_wall": round(c["wall_s"] / a["wall_s"], 3),
        "a_over_c_peak_memory": round(a["peak_rss_mib"] / c["peak_rss_mib"], 3),
        "ablation_all_over_bare_pass": round(d["ablate"] / bare, 3),
        "ablation_adaptive_over_bare_pass": round(e["ablate"] / bare, 3),
        "recipe_all_over_bare_pass": round(sum(d[k] for k in RECIPE) / bare, 3),
        "recipe_adaptive_over_bare_pass": round(sum(e[k] for k in RECIPE) / bare, 3),
    }
    results["adaptive"] = {k: summaries["e"]["ablation"][k] for k in ("sequences_used", "stopped_early", "interval",
                                                                        "effect")}
    results["setup"] = {"sequences": n, "seq_len": paper_probe(str(model_dir), 1)[0].seq_len, "model": "GPTNeoX 12x12, hidden 768, vocab 50304",
                        "torch_threads": torch.get_num_threads(), "device": "cpu"}
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
