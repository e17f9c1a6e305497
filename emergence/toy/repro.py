"""What determines a toy training's bits, and whether a training reproduces a documented panel.

A toy checkpoint's bits depend on the recipe and on the numerical environment of the training:
the torch build, the SIMD level ATen dispatches its kernels to (``ATEN_CPU_CAPABILITY``), the
code branch oneMKL runs its matrix products on (which it picks per CPU, also by vendor, unless
``MKL_CBWR`` fixes it) and the number of threads. ``environment()`` records them in the manifest;
``compare_to_documented`` checks a manifest against the panels documented in
``documented_panels.json`` (sha256 of every checkpoint) and says how it differs.

``numerics: portable`` (the recipe's option) trains in a fresh process with every one of these
pinned (``PORTABLE_ENV`` and the recipe's ``threads``): ATen's AVX2 kernels (any x86 CPU since
about 2015), oneMKL's COMPATIBLE branch (SSE2 without the rcpps/rsqrtps instructions, whose
results differ between CPU vendors; STRICT: the same result for any thread count and data
alignment), and the thread count, which still moves ATen's reductions. ``numerics: native``
trains in the calling process with what it has.
docs/toy-reproducibility.md has the measurements.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
from functools import lru_cache
from pathlib import Path

import torch

PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE,STRICT"}
PORTABLE = {"cpu_capability": "AVX2", "mkl_cbwr": "COMPATIBLE,STRICT"}  # and the recipe's threads
DOCUMENTED = Path(__file__).with_name("documented_panels.json")
LOSSES = "losses.tsv"  # beside the manifest: step, training loss of that step's batch (before its update)
# What decides the bits, in the order a difference is reported; "cpu" matters only through the others.
BITS_FIELDS = ("torch", "cpu_capability", "mkl_cbwr", "threads")

# oneMKL's named constants for conditional numerical reproducibility (mkl_cbwr.h).
MKL_CBWR_ALL, MKL_CBWR_STRICT = -1, 0x10000
MKL_BRANCHES = {
    0: "OFF",
    1: "OFF",
    2: "AUTO",
    3: "COMPATIBLE",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4_1",
    8: "SSE4_2",
    9: "AVX",
    10: "AVX2",
    11: "AVX512_MIC",
    12: "AVX512",
    13: "AVX512_MIC_E1",
    14: "AVX512_E1",
    16: "AVX512_E2",
    17: "AVX512_E3",
    18: "AVX512_E4",
    19: "AVX2_E1",
    20: "AVX512_E5",
}


@lru_cache(maxsize=1)
def _mkl():
    """torch's statically linked oneMKL, or None (a build without it)."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        lib.mkl_serv_cbwr_get.argtypes = [ctypes.c_int]
        lib.mkl_serv_cbwr_get.restype = ctypes.c_int
        lib.mkl_serv_cbwr_get_auto_branch.restype = ctypes.c_int
        return lib
    except (OSError, AttributeError):
        return None


def mkl_branch() -> str | None:
    """The oneMKL code branch this process's matrix products run on: a fixed CNR branch (``COMPATIBLE``,
    ``AVX2``, ..., with ``,STRICT`` in strict mode), ``AUTO`` (CNR with oneMKL's own pick), or
    ``off (<branch>)`` without CNR, the branch oneMKL names for this CPU (``off (AUTO)`` where it names
    none, as on non-Intel CPUs); None without oneMKL."""
    lib = _mkl()
    if lib is None or not torch.backends.mkl.is_available():
        return None
    mode = lib.mkl_serv_cbwr_get(MKL_CBWR_ALL)
    branch = mode & 0xFFFF
    if branch in (0, 1):  # CNR off: oneMKL dispatches on the CPU it finds
        auto = lib.mkl_serv_cbwr_get_auto_branch()
        return f"off ({MKL_BRANCHES.get(auto, str(auto))})"
    return MKL_BRANCHES.get(branch, str(branch)) + (",STRICT" if mode & MKL_CBWR_STRICT else "")


def cpu_name() -> str:
    """The CPU's vendor and model name (Linux: /proc/cpuinfo), else the platform's processor string."""
    try:
        info: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, sep, value = line.partition(":")
            if sep:
                info.setdefault(key.strip(), value.strip())
        return f"{info.get('vendor_id', '')} {info.get('model name', '')}".strip()
    except OSError:
        import platform

        return platform.processor()


def environment(numerics: str = "native") -> dict:
    """What determines the bits of a training run in this process (and how it was asked to run)."""
    return {
        "numerics": numerics,
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl_cbwr": mkl_branch(),
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
    }


def is_portable(env: dict, threads: int) -> bool:
    """The process already runs with the pinned numerics on ``threads`` threads (so a portable training
    needs no new process)."""
    return env.get("threads") == threads and all(env.get(k) == v for k, v in PORTABLE.items())


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def documented_panels(path: Path | None = None) -> list[dict]:
    """The documented toy panels (``documented_panels.json``): model, recipe (what determines the
    weights), environment, and per checkpoint its sha256 and training loss."""
    path = Path(path or DOCUMENTED)
    return json.loads(path.read_text())["panels"] if path.exists() else []


def document(manifest: dict, weights: dict, path: Path | None = None) -> Path:
    """Add a trained panel to the documented ones (replacing the entry of the same model, recipe and
    environment): what ``python -m emergence.toy ... --document`` does."""
    path = Path(path or DOCUMENTED)
    entry = documented_entry(manifest, weights)

    def key(p: dict) -> tuple:
        return (
            p["model"],
            json.dumps(p["recipe"], sort_keys=True),
            tuple(p["environment"].get(k) for k in (*BITS_FIELDS, "cpu")),
        )

    panels = [p for p in documented_panels(path) if key(p) != key(entry)] + [entry]
    panels.sort(key=lambda p: (p["model"], p["recipe"].get("seed", 0), p["environment"].get("numerics", "")))
    path.write_text(json.dumps({"panels": panels}, indent=1) + "\n")
    return path


def documented_entry(manifest: dict, weights: dict) -> dict:
    """A trained panel's manifest as an entry of documented_panels.json (``weights``: its weights recipe)."""
    return {
        "model": manifest["model"],
        "recipe": weights,
        "environment": manifest["environment"],
        "checkpoints": {
            c["revision"]: {"sha256": c["sha256"], "train_loss": c["train_loss"]} for c in manifest["checkpoints"]
        },
    }


def _describe(env: dict) -> str:
    threads = env.get("threads")
    return (
        f"torch {env.get('torch')}, {env.get('cpu_capability')}, MKL {env.get('mkl_cbwr')}, "
        f"{threads} thread{'s' if threads != 1 else ''}, {env.get('cpu') or 'unknown CPU'}"
    )


def compare_to_documented(manifest: dict, weights: dict, panels: list[dict]) -> dict:
    """Does the trained panel (its manifest and weights recipe) reproduce a documented one?

    Returns ``status`` (``reproduces`` | ``differs`` | ``undocumented``), ``message`` (one line),
    and for a comparison the ``reference`` environment, the ``differing`` revisions (ordered by
    step), the first of them, and the environment fields that differ."""
    mine = {c["revision"]: c for c in manifest["checkpoints"]}
    candidates = [p for p in panels if p["model"] == manifest["model"] and p["recipe"] == weights]
    if not candidates:
        return {
            "status": "undocumented",
            "message": f"{manifest['model']} seed {weights.get('seed')}: no documented "
            f"panel for this recipe ({_describe(manifest['environment'])})",
        }
    env = manifest["environment"]

    def compared(panel):
        shared = [r for r in panel["checkpoints"] if r in mine]
        differing = [r for r in shared if mine[r]["sha256"] != panel["checkpoints"][r]["sha256"]]
        fields = [k for k in BITS_FIELDS if panel["environment"].get(k) != env.get(k)]
        return shared, differing, fields

    # The documented panel it reproduces, else the closest: fewest differing checkpoints, then fields.
    best = min(candidates, key=lambda p: (len(compared(p)[1]) > 0, len(compared(p)[2]), len(compared(p)[1])))
    shared, differing, fields = compared(best)
    ref = best["environment"]
    out = {
        "reference": ref,
        "compared": shared,
        "differing": sorted(differing, key=lambda r: mine[r]["step"]),
        "environment_differs": fields,
    }
    if not shared:
        return {
            **out,
            "status": "undocumented",
            "message": f"{manifest['model']}: none of the documented panel's checkpoints were saved",
        }
    if not differing:
        return {
            **out,
            "status": "reproduces",
            "message": f"{manifest['model']} seed {weights.get('seed')}: reproduces "
            f"the documented panel bit for bit ({len(shared)} checkpoints; {_describe(ref)})",
        }
    first, last = out["differing"][0], out["differing"][-1]
    losses = (
        f"training loss at {last}: {mine[last]['train_loss']:.4f}, documented "
        f"{best['checkpoints'][last]['train_loss']:.4f}"
        if mine[last]["train_loss"] is not None
        else ""
    )
    if fields:
        why = "; ".join(f"{k} {env.get(k)} (documented {ref.get(k)})" for k in fields)
    else:  # the same torch, kernels, MKL branch and threads: something else (another CPU, another library)
        why = (
            f"torch, CPU capability, MKL branch and threads are the documented ones; the CPU is {env.get('cpu')!r} "
            f"(documented {ref.get('cpu')!r})"
        )
    return {
        **out,
        "status": "differs",
        "message": f"{manifest['model']} seed {weights.get('seed')}: differs from the "
        f"documented panel from {first} on ({len(differing)} of {len(shared)} checkpoints; {losses}): {why}",
    }


def read_losses(root: Path) -> list[float]:
    """The per-step training losses a training wrote (``losses.tsv``: step, loss)."""
    rows = [line.split("\t") for line in (Path(root) / LOSSES).read_text().splitlines()[1:]]
    return [float(loss) for _, loss in rows]


def first_divergence(a: list[float], b: list[float], tolerance: float = 0.0) -> int | None:
    """The first step at which two trainings' losses differ by more than ``tolerance`` (None: never, over the
    steps both have)."""
    return next((step for step, (x, y) in enumerate(zip(a, b)) if abs(x - y) > tolerance), None)


def compare_trainings(root_a: Path, root_b: Path) -> str:
    """Where two trained panels part: environment, per-step losses, checkpoints
    (``python -m emergence.toy --compare``)."""
    manifests = [json.loads((Path(r) / "manifest.json").read_text()) for r in (root_a, root_b)]
    lines = []
    for k in ("numerics", *BITS_FIELDS, "cpu"):
        a, b = (m.get("environment", {}).get(k) for m in manifests)
        lines.append(f"{k}: {a}" if a == b else f"{k}: {a} | {b}")
    la, lb = read_losses(root_a), read_losses(root_b)
    for tol in (0.0, 1e-6, 1e-4, 1e-2):
        step = first_divergence(la, lb, tol)
        lines.append(
            f"first step with |loss difference| > {tol:g}: {step if step is not None else 'none'}"
            + (f" (of {min(len(la), len(lb))})" if step is None else "")
        )
    ca, cb = ({c["revision"]: c for c in m["checkpoints"]} for m in manifests)
    for rev in (r for r in ca if r in cb):
        same = ca[rev].get("sha256") == cb[rev].get("sha256")
        loss = (
            ""
            if ca[rev]["train_loss"] is None
            else f", training loss {ca[rev]['train_loss']:.6f} | {cb[rev]['train_loss']:.6f}"
        )
        lines.append(f"{rev}: {'identical' if same else 'differs'}{loss}")
    return "\n".join(lines)
