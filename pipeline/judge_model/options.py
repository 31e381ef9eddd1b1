"""How a judge is trained (no heavy imports: the CLI reads its defaults for --help)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TuneOptions:
    """How a judge is trained; every field has the default the shipped judge is built with."""

    top_layers: int = field(default=4, metadata={"help": "decoder layers trained (from the top)"})
    epochs: int = field(default=3, metadata={"help": "passes over the training examples"})
    batch_size: int = field(default=8, metadata={"help": "examples per optimizer step"})
    lr: float = field(default=5e-4, metadata={"help": "AdamW learning rate"})
    seed: int = field(default=0, metadata={"help": "shuffling and initialisation"})


DEFAULTS = TuneOptions()
