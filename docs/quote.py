"""``python docs/quote.py [--check] [--model toy_neox ...]``: the toy numbers the docs quote, written by the tool.

A quoted block in ``docs/*.md`` is the text between

    <!-- quoted KIND ARGS... (weights SHA12) -->
    <!-- /quoted -->

and nothing but this script writes it. For each block the script runs the commands that measure it
(``python -m emergence`` and ``python -m emergence.report`` on the toy models, in a scratch folder),
renders the block from their ``summary.json`` or ``findings.json`` and writes it back, with the first 12
hex digits of the measured weights' sha256 in its marker. ``--check`` writes nothing: it prints each
block that differs from what the tool prints now and exits 1. A block measured on other weights than
this machine's toy (a toy trained natively on another CPU: docs/toy-reproducibility.md) cannot be
compared: it is listed as such, and ``--check`` exits 3.

Kinds:

- ``ablation OVERRIDES...``: one run of ``python -m emergence OVERRIDES``; its ablation as a sentence.
- ``head-sets model=M revision=R heads=A,B,...``: each head set ablated alone, adaptive and
  ``ablate.sequences=all``; a table.
- ``trajectory model=M``: the panel of ``M`` (``revision=glob(r*)``, no ablation) through the panel
  report; a table of each revision's induction heads, BOS fraction and in-context score.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parent
BLOCK = re.compile(
    r"<!-- quoted (?P<kind>[\w-]+)(?P<args>(?: [^\s()]+)*) \(weights (?P<weights>[0-9a-f]{12})\) -->\n"
    r"(?P<text>.*?)<!-- /quoted -->",
    re.DOTALL,
)


@dataclass(frozen=True)
class Quote:
    """One quoted block of a doc."""

    doc: Path
    kind: str
    args: tuple[str, ...]
    weights: str  # the first 12 hex digits of the sha256 of the weights it was measured on
    text: str

    @property
    def options(self) -> dict[str, str]:
        return dict(arg.split("=", 1) for arg in self.args)

    @property
    def model(self) -> str:
        return self.options["model"]

    def marker(self, weights: str) -> str:
        return f"<!-- quoted {self.kind}{''.join(' ' + a for a in self.args)} (weights {weights}) -->\n"


@dataclass
class Runner:
    """Runs the tool in ``work`` with ``env``; ``sweeps`` maps a model to a panel sweep already run."""

    work: Path
    env: dict[str, str] = field(default_factory=dict)
    sweeps: dict[str, Path] = field(default_factory=dict)

    def cli(self, module: str, *args: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", module, *args],
            capture_output=True,
            text=True,
            env={**os.environ, "WANDB_MODE": "disabled", **self.env},
        )
        if done.returncode != 0:
            raise RuntimeError(f"python -m {module} {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")

    def folder(self, name: str, *args: str) -> Path:
        """One folder per command: ``name/<its arguments>``, never one inside another's."""
        return self.work / name / re.sub(r"[^\w.-]", "_", "__".join(args) or "default")

    def summaries(self, name: str, *overrides: str, sweep: bool = False) -> list[dict]:
        """The summary.json of each job of ``python -m emergence [-m] OVERRIDES``."""
        out = self.folder(name, *overrides)
        if not out.is_dir():
            where = ["-m", f"hydra.sweep.dir={out}"] if sweep else [f"hydra.run.dir={out}"]
            self.cli("emergence", *where, *overrides)
        return [json.loads(p.read_text()) for p in sorted(out.rglob("summary.json"))]

    def findings(self, model: str) -> dict:
        """The panel report's findings.json over ``model``'s panel."""
        sweep = self.sweeps.get(model)
        if sweep is None:
            sweep = self.folder("panel", model)
            if not sweep.is_dir():
                self.cli(
                    "emergence",
                    "-m",
                    f"model={model}",
                    "revision=glob(r*)",
                    "ablate.enabled=false",
                    f"hydra.sweep.dir={sweep}",
                )
        report = self.folder("report", model)
        if not (report / "findings.json").is_file():
            self.cli("emergence.report", str(sweep), "--out", str(report))
        return json.loads((report / "findings.json").read_text())


def quotes(docs: Path = DOCS) -> list[Quote]:
    return [
        Quote(doc, m["kind"], tuple(m["args"].split()), m["weights"], m["text"])
        for doc in sorted(docs.glob("*.md"))
        for m in BLOCK.finditer(doc.read_text())
    ]


def signed(x: float, digits: int) -> str:
    return f"{x:+.{digits}f}"


def interval(iv: dict) -> str:
    return f"[{signed(iv['low'], 2)}, {signed(iv['high'], 2)}]"


def ablation_sentence(summary: dict) -> str:
    a = summary["ablation"]
    effect, iv, draw = a["effect"], a["interval"], a["control_draw"]
    heads = ", ".join(a["heads"] or summary["induction_circuit"])
    moved = ", ".join(f"{k} -> {v}" for k, v in draw["fallback_layers"].items())
    where = f"{draw['in_layer']} in-layer, {draw['fallback']} by the fallback" + (f" ({moved})" if moved else "")
    n_probe = summary["probe"]["n_sequences"]
    stop = (
        f"all {iv['n']} sequences, one 95% interval"
        if iv["looks"] == 1
        else f"stopped at look {iv['look']} of {iv['looks']}, {iv['n']} of {n_probe} sequences"
    )
    return (
        f"`{summary['model']}` at step {summary['step']}, `ablate.sequences={a['sequences']}`: "
        f"ablating {heads} raises the loss of B by {signed(effect['circuit_loss_increase'], 3)}; "
        f"the {len(a['controls'])} control set{'s' if len(a['controls']) != 1 else ''} ({where}) change it by "
        f"{signed(effect['controls_loss_increase_mean'], 3)}; {stop}: g = {signed(iv['criterion'], 3)}, "
        f"interval {interval(iv)}: {'causal' if effect['causal'] else 'not causal'}.\n"
    )


def head_sets_table(runs: list[dict], heads: list[str]) -> str:
    by = {(s["ablation"]["heads"][0], s["ablation"]["sequences"]): s for s in runs}
    lines = [
        "| `ablate.heads` | adaptive: sequences used | g's interval at the stop | `all`: rise vs controls "
        "| verdict (adaptive / `all`) |",
        "|---|---|---|---|---|",
    ]
    for head in heads:
        adaptive, full = by[head, "adaptive"]["ablation"], by[head, "all"]["ablation"]
        iv = adaptive["interval"]
        used = f"{iv['n']} ({iv['n'] / by[head, 'adaptive']['probe']['n_sequences']:.0%})"
        verdicts = " / ".join("causal" if a["effect"]["causal"] else "not causal" for a in (adaptive, full))
        lines.append(
            f"| {head} | {used} | {interval(iv)} (look {iv['look']} of {iv['looks']}) | "
            f"{signed(full['effect']['circuit_loss_increase'], 3)} vs "
            f"{signed(full['effect']['controls_loss_increase_mean'], 3)} | {verdicts} |"
        )
    return "\n".join(lines) + "\n"


def trajectory_table(revisions: list[dict], circuit_threshold: float) -> str:
    lines = [
        f"| rev | step | induction heads (>= {circuit_threshold:g}x) | BOS % | in-context score |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(revisions):
        lines.append(
            f"| r{i} | {r['revision']} | {r['n_induction']} | {100 * r['bos_fraction']:.0f} | "
            f"{r['run_values']['copy_loss_drop']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def render(quote: Quote, runner: Runner) -> tuple[str, str]:
    """(the block's text as the tool prints it now, the first 12 hex digits of the weights measured)."""
    opts = quote.options
    if quote.kind == "ablation":
        [summary] = runner.summaries("ablation", *quote.args)
        return ablation_sentence(summary), summary["weights_sha256"][:12]
    if quote.kind == "head-sets":
        heads = opts["heads"].split(",")
        runs = runner.summaries(
            "head-sets",
            f"model={opts['model']}",
            f"revision={opts['revision']}",
            f"ablate.heads={','.join(f'[{h}]' for h in heads)}",
            "ablate.sequences=adaptive,all",
            sweep=True,
        )
        return head_sets_table(runs, heads), runs[0]["weights_sha256"][:12]
    if quote.kind == "trajectory":
        findings = runner.findings(opts["model"])
        revisions = findings["models"][opts["model"]]["revisions"]
        return trajectory_table(revisions, findings["thresholds"]["circuit"]), revisions[-1]["weights_sha256"][:12]
    raise ValueError(
        f"{quote.doc.name}: unknown quoted block kind {quote.kind!r}: use ablation, head-sets or trajectory"
    )


@dataclass(frozen=True)
class Checked:
    quote: Quote
    text: str  # as the tool prints it now
    weights: str

    @property
    def comparable(self) -> bool:
        return self.weights == self.quote.weights

    @property
    def differs(self) -> bool:
        return self.comparable and self.text != self.quote.text


def check(runner: Runner, models: set[str] | None = None, docs: Path = DOCS) -> list[Checked]:
    """Every quoted block of ``models`` (all if None), measured again."""
    return [Checked(q, *render(q, runner)) for q in quotes(docs) if models is None or q.model in models]


def write(checked: list[Checked]) -> None:
    for doc in {c.quote.doc for c in checked}:
        text = doc.read_text()
        for c in (c for c in checked if c.quote.doc == doc):
            old = c.quote.marker(c.quote.weights) + c.quote.text
            text = text.replace(old, c.quote.marker(c.weights) + c.text, 1)
        tmp = doc.with_suffix(".md.tmp")
        tmp.write_text(text)
        tmp.replace(doc)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python docs/quote.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a block differs")
    p.add_argument("--model", action="append", help="only the blocks of this toy model (repeatable)")
    p.add_argument("--work", type=Path, help="scratch folder for the runs (default: a new temporary one)")
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="quote-"))
    try:
        checked = check(Runner(work), set(args.model) if args.model else None)
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    for c in checked:
        where = f"{c.quote.doc.name}: {c.quote.kind} {' '.join(c.quote.args)}"
        if not c.comparable:
            print(f"{where}: measured on weights {c.quote.weights}, this machine's are {c.weights}: not comparable")
        elif c.differs:
            print(f"{where}: the docs say\n{c.quote.text}the tool prints\n{c.text}")
    if args.check:
        sys.exit(1 if any(c.differs for c in checked) else 3 if not all(c.comparable for c in checked) else 0)
    write(checked)
    print(f"{len(checked)} quoted blocks written")


if __name__ == "__main__":
    main()
