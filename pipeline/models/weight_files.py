"""The files of a weight push on disk, as the trainer writes them and the server reads them.

A whole push is a HF checkpoint directory; beside it, ``turnstream-version.json``
may name its version and ``turnstream-base.json`` the id that later deltas on
these weights name. A delta directory holds ``delta.safetensors`` (the tensors
that train, by their ``state_dict`` names) and ``turnstream-delta.json``
(``{"base": ..., "version": N, "tensors": n, "bytes": b}``).
"""

from __future__ import annotations

VERSION_FILE = "turnstream-version.json"
BASE_FILE = "turnstream-base.json"
DELTA_FILE = "turnstream-delta.json"
DELTA_TENSORS = "delta.safetensors"
