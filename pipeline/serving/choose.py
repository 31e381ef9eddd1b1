"""The next token of each row of a batch, with its log-prob and the top alternatives."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.serving.sampling import Sampling


@dataclass
class Choice:
    token: int
    logprob: float
    top: list[tuple[float, int]]  # the top-N (log-prob, token id), best first


def _filtered(probs: torch.Tensor, s: Sampling) -> torch.Tensor:
    """softmax(logits / T) with top-k, top-p and min-p applied, renormalised."""
    if s.top_k > 0 and s.top_k < probs.shape[-1]:
        kth = torch.topk(probs, s.top_k).values[-1]
        probs = torch.where(probs < kth, torch.zeros_like(probs), probs)
    if s.top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        before = torch.cumsum(ordered, dim=-1) - ordered  # mass of the better tokens
        ordered = torch.where(before > s.top_p, torch.zeros_like(ordered), ordered)
        probs = torch.zeros_like(probs).scatter(-1, order, ordered)
    if s.min_p > 0.0:
        probs = torch.where(probs < s.min_p * probs.max(), torch.zeros_like(probs), probs)
    return probs / probs.sum()


def choose(
    logits: torch.Tensor,
    samplings: list[Sampling],
    generators: list[torch.Generator | None],
    top_n: list[int],
    original: bool = False,
    banned: list[set[int]] | None = None,
) -> list[Choice]:
    """One token per row of ``logits`` [rows, vocab] (fp32), each row with its own params.

    ``banned``: per row, tokens that may not be chosen yet (stop tokens before
    min_new_tokens); they keep their log-prob. A row whose grammar allows nothing
    else (its other logits are -inf) may choose them all the same.
    """
    logits = logits.float()
    scale = torch.tensor(
        [[1.0 if s.greedy or original else s.temperature] for s in samplings], dtype=torch.float32
    )
    all_logprobs = torch.log_softmax(logits / scale, dim=-1)  # one pass for every row
    out: list[Choice] = []
    for row, s in enumerate(samplings):
        raw = logits[row]
        logprobs = all_logprobs[row]
        pick_from = raw
        if banned and banned[row]:
            pick_from = raw.clone()
            pick_from[list(banned[row])] = float("-inf")
            if bool(torch.isneginf(pick_from).all()):  # its grammar allows only stop tokens
                pick_from = raw
        if s.greedy:
            token = int(torch.argmax(pick_from))
        else:
            tempered = pick_from is raw and not original
            probs = logprobs.exp() if tempered else torch.softmax(pick_from / s.temperature, -1)
            token = int(torch.multinomial(_filtered(probs, s), 1, generator=generators[row]))
        top: list[tuple[float, int]] = []
        if top_n[row] > 0:
            values, ids = torch.topk(logprobs, min(top_n[row], logprobs.shape[-1]))
            top = [(float(v), int(i)) for v, i in zip(values, ids, strict=True)]
        out.append(Choice(token, float(logprobs[token]), top))
    return out


def prompt_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, top_n: int
) -> tuple[list[float], list[list[tuple[float, int]]]]:
    """Log-prob of ``targets[i]`` under ``logits[i]`` (raw log-softmax), and each row's top-N."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(-1, targets[:, None])[:, 0].tolist()
    tops: list[list[tuple[float, int]]] = []
    if top_n > 0:
        values, ids = torch.topk(logprobs, min(top_n, logprobs.shape[-1]), dim=-1)
        tops = [
            [(float(v), int(i)) for v, i in zip(vr, ir, strict=True)]
            for vr, ir in zip(values.tolist(), ids.tolist(), strict=True)
        ]
    return chosen, tops
