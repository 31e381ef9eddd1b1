"""Disk retention: the trainer keeps its newest checkpoints and weight versions only.

Every optimizer step writes a DeepSpeed checkpoint (``checkpoint_dir/stepNNNNNNNN``)
and every push a HF copy of the policy (``weights_dir/vNNNNNN``). Without pruning
both grow by a full model per step or push.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Collection
from pathlib import Path

log = logging.getLogger(__name__)

CHECKPOINT = re.compile(r"step(\d+)")
WEIGHT_VERSION = re.compile(r"v(\d+)")


def prune(
    parent: Path, pattern: re.Pattern[str], keep: int, protect: Collection[str] = ()
) -> list[Path]:
    """Delete the directories of ``parent`` whose names match ``pattern`` beyond the
    ``keep`` highest-numbered, except those named in ``protect``; return the removed ones.

    A missing ``parent`` or a directory that vanished meanwhile is not an error; a
    directory that cannot be deleted is logged and left for the next call.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    try:
        entries = list(parent.iterdir())
    except FileNotFoundError:
        return []
    numbered = []
    for path in entries:
        match = pattern.fullmatch(path.name)
        if match and path.is_dir() and not path.is_symlink():
            numbered.append((int(match[1]), path))
    numbered.sort(reverse=True)
    removed = []
    for _, path in reversed(numbered[keep:]):  # oldest first
        if path.name in protect:
            continue
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("could not delete %s (tried again at the next prune): %s", path, exc)
            continue
        removed.append(path)
    return removed


def prune_checkpoints(checkpoint_dir: Path, keep: int) -> list[Path]:
    """Keep the ``keep`` newest ``step*`` checkpoints and the one ``latest`` names
    (what a restart resumes from)."""
    removed = prune(checkpoint_dir, CHECKPOINT, keep, protect=_latest_tag(checkpoint_dir))
    if removed:
        log.info("deleted old checkpoints: %s", ", ".join(p.name for p in removed))
    return removed


def prune_weight_versions(weights_dir: Path, keep: int, loaded: Path) -> list[Path]:
    """Keep the ``keep`` newest weight versions and ``loaded``, the one the policy
    servers serve now."""
    removed = prune(weights_dir, WEIGHT_VERSION, keep, protect={loaded.name})
    if removed:
        log.info("deleted old weight versions: %s", ", ".join(p.name for p in removed))
    return removed


def _latest_tag(checkpoint_dir: Path) -> set[str]:
    """The tag DeepSpeed's ``latest`` file points at, if any."""
    try:
        return {(checkpoint_dir / "latest").read_text().strip()}
    except OSError:
        return set()
