"""The local learning coefficient (LLC) of a checkpoint, and the refined LLC of its heads (docs/llc.md).

Singular learning theory's LLC (Lau et al. 2023) is estimated by sampling the tempered local posterior
around the checkpoint's weights w* with stochastic-gradient Langevin dynamics (SGLD):
``n*beta * (E_w[L_n(w)] - L_n(w*))``, the expectation over the chains' draws after burn-in. devinterp
(Timaeus) samples: ``devinterp.slt.sampling.sample``; this module chooses its data and settings,
restricts it to a head's weights (the weight-refined LLC of Wang et al. 2024: only the head's W_Q, W_K,
W_V rows and W_O columns move, ``recipe.head_weights``), reduces the draws without the burn-in, and
diagnoses the chains (``diagnose``): a failed estimate is reported as failed with its reason, never
as a number.

devinterp is an optional extra (``pip install -e ".[llc]"``, Python >= 3.11): ``chosen`` refuses the
measure in one line where it is missing. It is a guest in the run: the global random generators,
the model's train/eval modes and its device stay as they were, its progress bars are off (the run
shows one), and its samples go to a scratch folder inside the run directory that is removed after
each estimate.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from emergence.core.errors import UsageError
from emergence.measures.plugin import Column, ColumnTrajectory, Measure, MeasureInput, MeasureResult, RunSeries
from emergence.recipe import head_weights
from emergence.recipe.screen import head_name, head_of, parse_head_name

SAMPLERS = {"rmsprop_sgld": "rmsprop_sgld", "sgld": "sgmcmc_sgld"}  # our name -> devinterp's


@dataclass(frozen=True)
class Settings:
    """The sampler's settings; docs/llc.md says why each default."""

    sampler: str = "rmsprop_sgld"  # rmsprop_sgld (Hitchcock & Hoogland 2025) | sgld
    lr: float = 1e-3  # the step size epsilon (python -m emergence.llc_calibrate picks it)
    nbeta: float | None = None  # n*beta, the inverse temperature; None: batch / log(batch) (devinterp's default)
    localization: float = 100.0  # gamma: the pull back to w*
    chains: int = 4
    draws: int = 100  # steps drawn per chain, after the burn-in
    burn_in: int = 50  # steps per chain before the draws: left out of the estimate
    batch: int = 16  # sequences per SGLD step
    sequences: int = 256  # the data the steps draw from
    data: str = "auto"  # auto (the training corpus where known, else the probe) | probe | a .npy of token ids
    heads: list[str] = field(default_factory=list)  # [] none; [all]; or head names such as [L1H1, L1H3]
    seed: int = 100
    max_spread: float = 0.5  # chains whose std over |mean| exceeds this disagree: the estimate fails
    max_drift: float = 0.5  # a chain whose last quarter of draws is this much (of the estimate) above its first fails

    def __post_init__(self):
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler={self.sampler}: use one of {', '.join(SAMPLERS)}")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr}: the step size must be > 0")
        if self.nbeta is not None and not self.nbeta > 0:
            raise ValueError(f"nbeta={self.nbeta}: must be > 0 (or null: batch / log(batch))")
        for name in ("chains", "draws", "batch", "sequences"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.batch < 2 and self.nbeta is None:
            raise ValueError("batch=1 leaves n*beta undefined (batch / log(batch)): give nbeta or batch >= 2")
        if self.burn_in < 0 or self.localization < 0:
            raise ValueError("burn_in and localization must be >= 0")
        if self.batch > self.sequences:
            raise ValueError(f"batch={self.batch} is more than sequences={self.sequences}")
        for name in self.heads:
            if name != "all" and parse_head_name(name) is None:
                raise ValueError(f"heads: {name!r} is not a head name; use L<layer>H<head> (L1H3) or all")
        if self.data not in ("auto", "probe"):
            token_file(self.data, self.sequences)  # before any weights load: the file is there and holds ids

    @property
    def inverse_temperature(self) -> float:
        return self.nbeta if self.nbeta is not None else self.batch / math.log(self.batch)

    @property
    def cost(self) -> int:
        """Sequences through forward and backward per estimate (the model's, or one head's)."""
        return self.chains * (self.burn_in + self.draws) * self.batch


@dataclass(frozen=True)
class Estimate:
    """One LLC estimate (the model's, or one head's), as summary.json holds it."""

    llc: float | None  # the mean over chains; None where the estimate failed
    std: float | None  # over chains
    chains: list[float | None]  # each chain's (None: the chain diverged)
    init_loss: float  # L_n(w*), the loss at the checkpoint on the SGLD data
    loss_trace: list[list[float | None]]  # each chain's mean loss at every step (burn-in first)
    failed: str | None  # why the estimate is not reported; None: it is


def reduce_chains(loss_trace: np.ndarray, init_loss: float, nbeta: float, burn_in: int) -> np.ndarray:
    """[chains, steps] mean loss per step -> [chains] n*beta (mean over the steps after burn-in - init)."""
    return nbeta * (loss_trace[:, burn_in:].mean(axis=1) - init_loss)


def diagnose(loss_trace: np.ndarray, per_chain: np.ndarray, settings: Settings) -> str | None:
    """Why the chains do not give an estimate, or None: a chain with a non-finite loss (diverged; devinterp
    stops it and leaves NaN), a chain whose loss keeps rising after burn-in, a negative estimate, or
    chains that disagree beyond ``max_spread``."""
    for chain, trace in enumerate(loss_trace):
        bad = np.flatnonzero(~np.isfinite(trace))
        if len(bad):
            return f"chain {chain} diverged at step {bad[0]} (loss NaN or inf): lower lr (or raise localization)"
    draws = loss_trace[:, settings.burn_in :]
    quarter = max(1, draws.shape[1] // 4)
    rise = settings.inverse_temperature * (draws[:, -quarter:].mean(1) - draws[:, :quarter].mean(1))
    for chain, (up, estimate) in enumerate(zip(rise, per_chain)):
        if up > settings.max_drift * max(abs(estimate), 1e-12):
            return f"chain {chain}'s loss keeps rising after burn-in (+{up:.3g} in n*beta units): lower lr"
    mean = float(per_chain.mean())
    if mean < 0:
        return f"negative estimate ({mean:.3g}): the chains fell below the checkpoint's loss (not a local minimum)"
    spread = float(per_chain.std()) / max(abs(mean), 1e-12)
    if spread > settings.max_spread:
        return f"chains disagree: std / mean = {spread:.2f} > max_spread={settings.max_spread}"
    return None


@contextlib.contextmanager
def guest(model: torch.nn.Module) -> Iterator[None]:
    """While devinterp runs: afterwards, the global random generators, every module's train/eval mode, the
    parameters' gradients and the model's device are as they were, and devinterp's progress bars stay off.
    The gradients are set aside while it runs: its chains copy the model, and a training's gradients in
    the middle of an accumulation would join their first step."""
    from devinterp.slt import sampler

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    modes = [(m, m.training) for m in model.modules()]
    grads = [(p, p.grad) for p in model.parameters()]
    for p, _ in grads:
        p.grad = None
    device = next(model.parameters()).device
    trange = sampler.trange
    sampler.trange = lambda *args, **kwargs: tqdm(range(*args), **{**kwargs, "disable": True})
    chatter = logging.getLogger("devinterp")  # its INFO lines (zarr stores, thread pools) are not the run's
    level = chatter.level
    chatter.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Chain failed")  # ``diagnose`` says why, in the record
            yield
    finally:
        sampler.trange = trange
        chatter.setLevel(level)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        for module, training in modes:
            module.train(training)
        model.to(device)
        for p, grad in grads:
            p.grad = grad


def eval_mode_loss(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """devinterp's per-token loss with dropout off: the sampled model is the checkpoint as it infers
    (devinterp switches its copy to train mode)."""
    from devinterp.slt.lm_loss import compute_per_token_loss

    model.eval()
    return compute_per_token_loss(model, input_ids)


def head_masks(model: torch.nn.Module, layer: int, head: int) -> dict[str, torch.Tensor]:
    """The weight coordinates of head ``L<layer>H<head>``: its W_Q, W_K, W_V rows and its W_O columns as the
    tool cuts them (``head_weights.layer_slices``: fused qkv, grouped-query attention), a boolean mask per
    parameter (devinterp's ``param_masks``); no biases (docs/llc.md says why)."""
    parameters = dict(model.named_parameters())
    masks: dict[str, torch.Tensor] = {}
    for block in head_weights.layer_slices(model)[layer].of_head(head):
        mask = masks.setdefault(block.name, torch.zeros_like(parameters[block.name], dtype=torch.bool))
        mask.narrow(block.dim, block.start, block.stop - block.start).fill_(True)
    return masks


def sampling_data(inputs: MeasureInput, settings: Settings) -> tuple[str, torch.Tensor]:
    """(what the data are, [sequences, T] token ids) for the chains."""
    n = settings.sequences
    if settings.data == "auto" and inputs.training_data is not None:
        return inputs.training_data.name, inputs.training_data.sample(n, settings.seed)
    if settings.data in ("auto", "probe"):
        tokens = inputs.batch.tokens
        if len(tokens) < n:
            raise UsageError(
                f"measures.llc.sequences={n}: the probe holds {len(tokens)} sequences; "
                f"lower it or raise probe.n_sequences"
            )
        return f"the probe batch (probe.kind={inputs.probe_kind})", tokens[:n]
    try:
        ids = token_file(settings.data, n)
    except ValueError as err:
        raise UsageError(f"measures.llc.{err}") from None
    vocab = inputs.model.get_input_embeddings().num_embeddings
    if ids.min() < 0 or ids.max() >= vocab:  # read whole only now: the header was checked with the settings
        raise UsageError(
            f"measures.llc.data={settings.data}: token ids run from {ids.min()} to {ids.max()}; this model's "
            f"vocabulary is 0..{vocab - 1}"
        )
    return f"{Path(settings.data).expanduser()} (token ids)", torch.from_numpy(ids[:n].astype(np.int64))


def token_file(data: str, sequences: int) -> np.ndarray:
    """A user's ``.npy`` of token ids, memory-mapped: [sequences, T] integers, at least ``sequences`` rows
    (a ValueError naming ``data=`` otherwise; only the file's header is read to tell)."""
    try:
        ids = np.load(Path(data).expanduser(), mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"data={data}: not a readable .npy of token ids ({err})") from None
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer) or len(ids) < sequences:
        raise ValueError(
            f"data={data}: need [sequences, T] integer token ids with at least {sequences} sequences; it holds "
            f"{ids.dtype} {list(ids.shape)}"
        )
    return ids


def estimate(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    settings: Settings,
    device: torch.device,
    masks: dict[str, torch.Tensor] | None = None,
    scratch: Path | None = None,
) -> Estimate:
    """One LLC estimate with devinterp (``masks``: a head's coordinates; None: every weight); its samples
    are written under ``scratch`` (None: the system's temporary folder) and removed."""
    from datasets import Dataset
    from devinterp.slt.sampling import sample

    dataset = Dataset.from_dict({"input_ids": tokens.tolist()}).with_format("torch")
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
    # gradients on, whatever the caller runs under (``track`` analyses under torch.no_grad)
    with (
        tempfile.TemporaryDirectory(prefix="llc-", dir=scratch) as samples_dir,
        guest(model),
        torch.inference_mode(False),
        torch.enable_grad(),
    ):
        samples = sample(
            model,
            dataset,
            {},
            lr=settings.lr,
            n_beta=settings.inverse_temperature,
            param_masks=masks,
            num_chains=settings.chains,
            num_draws=settings.draws,
            batch_size=settings.batch,
            num_burnin_steps=settings.burn_in,
            num_init_loss_batches=max(1, settings.sequences // settings.batch),
            init_seed=settings.seed,
            localization=settings.localization,
            sampling_method=SAMPLERS[settings.sampler],
            device=str(device),
            output_path=Path(samples_dir) / "samples.zarr",
            loss_fn=eval_mode_loss,
        )
        data = samples.dataset
        loss_trace = data.sampling_loss_micro.mean(dim=["batch_sampling", "token_pos"]).values.astype(np.float64)
        init_loss = float(data.init_loss.values.mean())
        samples.close()
    per_chain = reduce_chains(loss_trace, init_loss, settings.inverse_temperature, settings.burn_in)
    failed = diagnose(loss_trace, per_chain, settings)

    def finite(x) -> float | None:
        return float(x) if np.isfinite(x) else None

    return Estimate(
        llc=None if failed else float(per_chain.mean()),
        std=None if failed else float(per_chain.std()),
        chains=[finite(x) for x in per_chain],
        init_loss=init_loss,
        loss_trace=[[finite(x) for x in trace] for trace in loss_trace],
        failed=failed,
    )


def asked_heads(settings: Settings, layers: int, heads: int) -> list[tuple[int, int]]:
    if "all" in settings.heads:
        return [(layer, head) for layer in range(layers) for head in range(heads)]
    asked = []
    for name in settings.heads:
        layer, head = head_of(name)  # a head name: Settings checked it
        if layer >= layers or head >= heads:
            raise UsageError(
                f"measures.llc.heads: {name} is not a head of this model ({layers} layers x {heads} heads)"
            )
        asked.append((layer, head))
    return asked


def compute(inputs: MeasureInput) -> MeasureResult:
    settings: Settings = inputs.settings
    model = inputs.model
    heads = asked_heads(settings, inputs.layers, inputs.heads)
    data, tokens = sampling_data(inputs, settings)
    per_head = np.full((inputs.layers, inputs.heads), np.nan)
    head_estimates: dict[str, Any] = {}
    with tqdm(total=1 + len(heads), desc="llc", unit="estimate", leave=False) as bar:  # the model's, then each head's
        whole = estimate(model, tokens, settings, inputs.device, scratch=inputs.scratch)
        bar.update()
        for layer, head in heads:
            found = estimate(model, tokens, settings, inputs.device, head_masks(model, layer, head), inputs.scratch)
            head_estimates[head_name(layer, head)] = asdict(found)
            per_head[layer, head] = np.nan if found.llc is None else found.llc
            bar.update()
    return MeasureResult(
        {"llc_refined": per_head},
        {
            **asdict(whole),
            "data": data,
            "settings": {**asdict(settings), "nbeta": settings.inverse_temperature},
            "cost_sequences": settings.cost * (1 + len(heads)),
            "heads": head_estimates,
        },
    )


# the model's ``Estimate``, then what it was estimated on and with, and the heads' estimates by name
RUN_FIELDS = (*(f.name for f in fields(Estimate)), "data", "settings", "cost_sequences", "heads")

MEASURE = Measure(
    name="llc",
    version=1,
    needs=frozenset({"weights", "gradients", "data"}),
    columns=(
        Column(
            "llc_refined",
            "the head's weight-refined local learning coefficient (SGLD over its W_Q, W_K, W_V rows and W_O "
            "columns alone); NaN where not asked (measures.llc.heads) or failed",
        ),
    ),
    run_fields=RUN_FIELDS,
    trajectories=(ColumnTrajectory("llc_refined", "max", "top refined LLC"),),
    # the model's LLC at each checkpoint, for the report's F7 (stage boundaries)
    series=RunSeries(field="llc", label="LLC", spread="std", failed="failed"),
    compute=compute,
    settings=Settings,
    requires=("devinterp", "xarray", "zarr"),
    extra="llc",
)
