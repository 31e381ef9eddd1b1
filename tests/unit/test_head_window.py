"""The output head runs only from a micro-batch's first response position: the log-probs,
the loss and the update are those of the whole head, and the head sees fewer positions."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pipeline.training.batch import MicroBatch, TokenizedSample, collate, micro_batches
from pipeline.training.config import TrainerConfig
from pipeline.training.engine import PolicyEngine, build_model, token_logprobs
from pipeline.training.losses import next_token_logprobs
from tests.tiny_policy import TINY, VOCAB


def sample(i: int, prompt_len: int, response_len: int, reward: float = 1.0) -> TokenizedSample:
    prompt = [(i * 7 + j) % VOCAB for j in range(prompt_len)]
    response = [(i * 5 + j + 1) % VOCAB for j in range(response_len)]
    return TokenizedSample(f"s:{i}", prompt, response, reward, None, None, 0)


def test_the_window_starts_at_the_earliest_response_token_of_any_row() -> None:
    mb = collate([sample(0, 9, 3), sample(1, 5, 6), sample(2, 7, 2)], pad_id=0)
    assert mb.response_from == 4  # the second row's prompt of 5: its first log-prob position
    assert bool(mb.response_mask[:, : mb.response_from].eq(0).all())
    empty = collate([sample(0, 4, 0)], pad_id=0)
    assert empty.response_from == 0


class HeadWidths:
    """Records how many positions each call of the output head saw."""

    def __init__(self, model: Any) -> None:
        self.widths: list[int] = []
        model.get_output_embeddings().register_forward_hook(self.record)

    def record(self, _module: Any, inputs: tuple[torch.Tensor, ...], _out: Any) -> None:
        self.widths.append(inputs[0].shape[1])


class WithoutLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward takes no ``logits_to_keep``."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


def test_log_probs_are_the_whole_heads_at_the_response_and_zero_before() -> None:
    model = build_model(TrainerConfig(tiny_model=TINY), VOCAB).eval()
    heads = HeadWidths(model)
    mb = collate([sample(0, 12, 3), sample(1, 9, 5)], pad_id=0)
    with torch.no_grad():
        whole = next_token_logprobs(
            model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1],
            mb.input_ids,
        )
        got, logits = token_logprobs(model, mb)
        plain, _ = token_logprobs(WithoutLogitsToKeep(model), mb)
    width = mb.input_ids.shape[1]
    assert heads.widths == [width, width - mb.response_from, width]
    assert logits.shape[:2] == (2, width - 1 - mb.response_from)
    response = mb.response_mask.bool()
    assert torch.allclose(got[response], whole[response], atol=1e-6)
    assert bool(got[:, : mb.response_from].eq(0).all())
    assert torch.allclose(plain, got, atol=1e-6)


def engine_step(
    monkeypatch: pytest.MonkeyPatch, whole_head: bool, top: int | None
) -> tuple[Any, list[torch.Tensor], list[int]]:
    """One step (entropy bonus and KL penalty on, so each has a gradient) on micro-batches
    whose prompts differ in length; ``whole_head`` runs the head over every position."""
    if whole_head:
        monkeypatch.setattr(MicroBatch, "response_from", property(lambda _self: 0))
    config = TrainerConfig(
        lr=1e-2, micro_batch_size=2, tiny_model=TINY, train_top_layers=top,
        entropy_coef=0.01, kl_coef=0.1, seed=7,
    )  # fmt: skip
    engine = PolicyEngine(config, vocab_size=VOCAB)
    heads = HeadWidths(engine.engine.module)
    lengths = [(14, 3), (10, 4), (16, 2), (12, 5)]
    samples = [sample(i, p, r, (-1.0) ** i) for i, (p, r) in enumerate(lengths)]
    mbs = micro_batches(samples, 2, pad_id=0)
    engine.train_step(mbs)
    metrics = engine.train_step(mbs)  # the second: the policy has moved from its reference
    monkeypatch.undo()
    return metrics, engine.parameters_snapshot(), heads.widths


@pytest.mark.parametrize("top", [None, 1])
def test_a_step_is_the_same_as_with_the_whole_head(
    monkeypatch: pytest.MonkeyPatch, top: int | None
) -> None:
    window, window_params, window_widths = engine_step(monkeypatch, False, top)
    whole, whole_params, whole_widths = engine_step(monkeypatch, True, top)
    for name in ("loss", "pg_loss", "entropy", "kl", "ppo_kl"):
        assert getattr(window, name) == pytest.approx(getattr(whole, name), abs=1e-5), name
    assert window.kl > 0 and window.entropy > 0
    for a, b in zip(window_params, whole_params, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert sum(window_widths) < 0.6 * sum(whole_widths)
