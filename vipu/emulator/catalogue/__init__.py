"""The workload catalogue: each model derived from its published architecture, layer by layer.

One module per family states its entries and builds their graphs (``vipu.emulator.graph``'s layers
and operations): ``nlp`` (BERT), ``vision`` (ResNet, ResNeXt, EfficientNet), ``series`` (LSTM, GRU),
``recommendation`` (an autoencoder) and ``probabilistic`` (HMC). Parameter counts and FLOPs come out of
the architecture, not out of a table: ``tests/emulator`` checks them against the papers' own totals.
Adding a model is one entry in its family's ``WORKLOADS`` (docs/architecture.md, "Adding a workload").
"""

from __future__ import annotations

from vipu.emulator.catalogue import nlp, probabilistic, recommendation, series, vision
from vipu.emulator.catalogue.workload import Workload

# Catalogue order: what `ipucloud catalogue` and GET /api/v1/catalogue list.
_CATALOGUE: dict[str, Workload] = {
    w.name: w for family in (nlp, vision, series, recommendation, probabilistic) for w in family.WORKLOADS
}
WORKLOAD_NAMES: tuple[str, ...] = tuple(_CATALOGUE)


def catalogue() -> list[Workload]:
    """Every workload, in catalogue order."""
    return list(_CATALOGUE.values())


def get_workload(name: str) -> Workload:
    """The named workload; ``KeyError`` if there is none (``WorkloadSpec`` turns that into a clear error)."""
    return _CATALOGUE[name]


__all__ = ["WORKLOAD_NAMES", "Workload", "catalogue", "get_workload"]
