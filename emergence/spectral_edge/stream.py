"""A checkpoint series read into the exact band Gram matrices of its updates (``exact.stream_gram``).

Two ways, chosen by where the checkpoints are:

* **On disk** (a local series, or Hub revisions already in the cache), each in safetensors whose tensors
  are the model's parameters under their own or transformers' legacy names: one pass over every block of
  every parameter, each file read once in all.
* **Otherwise** (revisions to download; pickles, GGUF, or tensors stored under other names, such as
  transformers 5's fused MoE experts): a band. Checkpoint i is made readable (downloaded as a sweep
  downloads, ``hub.prefetch`` ahead; or loaded whole once and kept as a scratch safetensors file), the
  products of its update with the W - 1 before it are streamed from the W + 1 checkpoints they need, and
  checkpoint i - W, which no later update needs, is let go (removed from the cache under
  ``model.cleanup=true``; a scratch file always). At most W + 1 such checkpoints (plus the prefetched)
  are on disk, each read at most W + 1 times.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from emergence.core.config import Config, PanelEntry
from emergence.hub.checkpoints import (
    Source,
    checkpoint_files,
    load_config,
    load_model,
    panel_revision,
    pick_dtype,
    remove_from_cache,
    source,
)
from emergence.run import prefetch
from emergence.spectral_edge.exact import BandGram, Checkpoint, stream_gram
from emergence.spectral_edge.scopes import Layout
from emergence.spectral_edge.tensor_files import read_header

log = logging.getLogger(__name__)
SCRATCH = ".edge-scratch"  # in the output directory: whole-read checkpoints as safetensors, while a window needs them


def legacy_renamer(skeleton: torch.nn.Module) -> Callable[[str], str]:
    """A stored tensor's name -> the parameter's, by transformers' own renamings for the architecture
    (GPT-NeoX's ``embed_out`` is ``lm_head``); identity where transformers has none."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:  # a transformers without conversion mappings stores the parameters' own names
        return lambda key: key
    renamings = [t for t in get_model_conversion_mapping(skeleton) if isinstance(t, WeightRenaming)]  # type: ignore[arg-type]

    def rename(key: str) -> str:
        for r in renamings:
            key, _ = r.rename_source_key(key)
        return key

    return rename


def stored_parameters(directory: Path, shards: Sequence[str], layout: Layout, rename) -> Checkpoint | None:
    """Each parameter of ``layout`` as stored in the safetensors ``shards``; None where one is missing or
    stored in another shape (it is then read whole)."""
    found: Checkpoint = {}
    for shard in shards:
        for key, tensor in read_header(directory / shard).items():
            found[rename(key)] = tensor
    for name, (rows, cols) in layout.matrices.items():
        if name not in found or found[name].numel != rows * cols:
            return None
    return {name: found[name] for name in layout.matrices}


class SeriesFiles:
    """Each checkpoint of a series as readable safetensors tensors: where it lies, downloads ahead, the
    whole-read conversions, and letting each go."""

    def __init__(self, cfg: Config, entries: Sequence[PanelEntry], layout: Layout, skeleton, scratch: Path):
        self.cfg, self.layout, self.scratch = cfg, layout, scratch
        self.rename = legacy_renamer(skeleton)
        self.sources = [source(cfg.model, panel_revision(e, cfg.model.tokens_per_step)) for e in entries]
        self.remote = [s for s in self.sources if not s.local_only]
        self.downloader = prefetch.Downloader() if self.remote and cfg.hub.prefetch > 0 else None
        self.converted: dict[int, Path] = {}

    def stored(self, i: int) -> Checkpoint | None:
        """Checkpoint i's parameters in its own files, None where they must be read whole (the files are
        downloaded first where they are not on disk)."""
        src = self.sources[i]
        if src.gguf_file:
            return None
        directory, files = checkpoint_files(self.cfg.model, src)
        if files.format != "safetensors":
            return None
        return stored_parameters(directory, files.shards, self.layout, self.rename)

    def on_disk(self) -> list[Checkpoint] | None:
        """Every checkpoint's tensors where all are on disk in safetensors (read once each), else None."""
        if self.remote:
            return None
        found = [self.stored(i) for i in range(len(self.sources))]
        return None if any(c is None for c in found) else [c for c in found if c is not None]

    def fetch(self, i: int) -> None:
        """Checkpoint i's files on disk: downloaded in the background, ``hub.prefetch`` ahead (without the
        downloader, the loader downloads them itself)."""
        src = self.sources[i]
        if self.downloader is not None and not src.local_only:
            at = self.remote.index(src)
            for later in self.remote[at : at + 1 + self.cfg.hub.prefetch]:
                self.downloader.ask((later.path, later.revision, later.weights_format))
            self.downloader.wait((src.path, src.revision, src.weights_format))

    def ready(self, i: int) -> Checkpoint:
        """Checkpoint i readable block by block: on disk, or converted."""
        self.fetch(i)
        stored = self.stored(i)
        return stored if stored is not None else self.convert(i)

    def load(self, i: int) -> torch.nn.Module:
        """Checkpoint i's model, whole, as the analysis loads it (on the CPU, in ``model.dtype``)."""
        self.fetch(i)
        src = self.sources[i]
        device, dtype = torch.device("cpu"), pick_dtype(self.cfg.model.dtype)
        return load_model(self.cfg.model, src, load_config(self.cfg.model, src), device, dtype, "eager")

    def convert(self, i: int) -> Checkpoint:
        """Checkpoint i loaded whole and written as a scratch safetensors file."""
        from safetensors.torch import save_file

        model = self.load(i)
        self.scratch.mkdir(parents=True, exist_ok=True)
        path = self.scratch / f"{i}.safetensors"
        params = dict(model.named_parameters())
        save_file({n: params[n].detach().contiguous() for n in self.layout.matrices}, str(path))
        del model, params
        self.converted[i] = path
        stored = stored_parameters(self.scratch, [path.name], self.layout, lambda key: key)
        assert stored is not None  # written from the layout's own parameters
        return stored

    def done(self, i: int) -> None:
        """No window needs checkpoint i any more: its scratch file goes; a download it made goes under
        ``model.cleanup``."""
        if i in self.converted:
            self.converted.pop(i).unlink()
        src = self.sources[i]
        if self.cfg.model.cleanup and not src.local_only:
            if self.downloader is None:
                remove(src)
            else:
                self.downloader.later(lambda: remove(src))

    def finish(self) -> None:
        if self.downloader is not None:
            self.downloader.finish()
        shutil.rmtree(self.scratch, ignore_errors=True)


def remove(src: Source) -> None:
    """A revision this command downloaded, out of the Hugging Face cache."""
    freed = remove_from_cache(src)
    log.info(f"cleanup: removed {src.path}@{src.revision} from the Hugging Face cache ({freed / 2**20:.1f} MiB)")


def whole_read_cost(layout: Layout, cfg: Config) -> str:
    """What reading a checkpoint whole costs, said before it starts."""
    numel = sum(rows * cols for rows, cols in layout.matrices.values())
    size = numel * torch.empty((), dtype=pick_dtype(cfg.model.dtype)).element_size()
    return f"{size / 2**30:.2f} GiB in memory and as a scratch file each"


def series_gram(cfg: Config, entries: Sequence[PanelEntry], layout: Layout, skeleton, out_dir: Path) -> BandGram:
    """The band Gram matrices of the updates between consecutive ``entries`` (width: the largest W)."""
    width = max(cfg.edge.windows)
    memory = cfg.edge.memory_mib * 2**20
    files = SeriesFiles(cfg, entries, layout, skeleton, out_dir / SCRATCH)
    try:
        resident = files.on_disk()
        if resident is not None:
            total = sum(t.numel * t.itemsize for c in resident for t in c.values())
            log.info(f"edge: {len(resident)} checkpoints on disk, each file read once ({total / 2**30:.2f} GiB)")
            with tqdm(total=total // len(resident), desc="edge", unit="B", unit_scale=True) as bar:
                return stream_gram(resident, layout, width, memory, progress=bar.update)
        log.info(
            f"edge: {len(entries)} checkpoints read as a band of {width + 1} (downloaded, or read whole where "
            f"not in safetensors under the model's names: {whole_read_cost(layout, cfg)})"
        )
        values = np.zeros((len(layout.scopes), len(entries) - 1, width))
        band: dict[int, Checkpoint] = {}
        for i in tqdm(range(len(entries)), desc="edge", unit="checkpoint"):
            band[i] = files.ready(i)
            if i >= 1:
                segment = [band[k] for k in range(max(0, i - width), i + 1)]
                values[:, i - 1] = stream_gram(segment, layout, width, memory, last_only=True).values[:, -1]
            if i - width in band:
                del band[i - width]
                files.done(i - width)
        for i in sorted(band):
            files.done(i)
        return BandGram(list(layout.scopes), values)
    finally:
        files.finish()
