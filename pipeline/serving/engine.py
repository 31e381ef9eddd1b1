"""The batching engine: one thread runs every forward pass; requests join between steps.

Each loop takes the requests that arrived (up to ``max_running`` sequences in
all), prefills them as one left-padded batch on the weights being served now,
samples their first token and joins them to the rows decoding on those weights;
then every group of rows takes one decode step. Copies of one prompt (SGLang's
``n`` parallel samples) are prefilled once and their cache rows duplicated, and a
long prefix the prompts of a prefill share (a judge's system prompt) is run once and
kept for the prefills after (:mod:`pipeline.serving.prefix`). A
request with a grammar decodes in the same batch as the others, its row masked
to what its grammar allows (:mod:`pipeline.serving.grammar`). A weight update only swaps
:attr:`Engine.weights`: rows already decoding finish on the weights they
started with (one group of rows per set of weights), new ones start on the new.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.serving import batch
from pipeline.serving.batch import Rows
from pipeline.serving.choose import choose, prompt_logprobs
from pipeline.serving.grammar import Grammars, constrain
from pipeline.serving.jobs import Event, Job, Request
from pipeline.serving.prefix import KEPT_TOKENS, Layers, PrefixCache, row_layers, run_prefix
from pipeline.serving.sampling import BadRequest
from pipeline.serving.text import TextTracker
from pipeline.serving.weights import Weights

log = logging.getLogger(__name__)

ADMIT_WAIT_S = 0.01  # see Engine._gather


@dataclass
class Group:
    """Rows decoding together on one set of weights."""

    weights: Weights
    jobs: list[Job]
    rows: Rows | None = None


class Engine:
    def __init__(
        self,
        weights: Weights,
        tokenizer: Any,
        context_length: int,
        max_running: int = 16,
        max_queued: int = 1024,
        original_logprobs: bool = False,
        admit_wait_s: float = ADMIT_WAIT_S,
        kept_tokens: int = KEPT_TOKENS,
    ) -> None:
        self.weights = weights
        self.admit_wait_s = admit_wait_s  # an idle engine waits this long for more requests
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.max_running = max_running
        self.max_queued = max_queued
        self.original_logprobs = original_logprobs
        self.vocab_size = int(weights.model.config.vocab_size)
        self.eos_ids = _eos_ids(tokenizer, weights.model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.grammars = Grammars(tokenizer, self.vocab_size, self.eos_ids)
        self._queue: collections.deque[Job] = collections.deque()
        self._groups: list[Group] = []
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="serve-engine", daemon=True)
        self.steps = 0
        self.widest = 0  # the most rows one decode step has run
        self.step_s = 0.0  # moving average of a loop's time (prefills and decode steps)
        self.prefill_tokens = 0  # prompt tokens run through the model (a shared prompt once)
        # keys and values of shared prompt prefixes and finished sequences, for the prompts
        # that start with them (kept_tokens 0: none kept)
        self.prefixes = PrefixCache(kept_tokens)

    # -- the request side (any thread) -----------------------------------------

    def check(self, request: Request) -> int:
        """The request's max new tokens, once it fits the model (BadRequest if it does not)."""
        prompt = len(request.prompt_ids)
        if prompt == 0:
            raise BadRequest("the input is empty: send text or at least one input id")
        bad = [i for i in request.prompt_ids if not 0 <= i < self.vocab_size]
        if bad:
            raise BadRequest(
                f"input id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})"
            )
        if request.logprob_start_len > prompt:
            raise BadRequest(
                f"logprob_start_len={request.logprob_start_len} is higher than the number of "
                f"input tokens {prompt}. Please use a smaller logprob_start_len."
            )
        wanted = request.sampling.max_new_tokens
        if prompt >= self.context_length:
            raise BadRequest(
                f"The input ({prompt} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
        if wanted is None:
            return self.context_length - prompt
        if prompt + wanted > self.context_length:
            raise BadRequest(
                "Requested token count exceeds the model's maximum context length of "
                f"{self.context_length} tokens. You requested a total of {prompt + wanted} "
                f"tokens: {prompt} tokens from the input messages and {wanted} tokens for the "
                "completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            )
        return wanted

    def submit(self, request: Request, emit: Any, compiled: Any = None) -> Job:
        """Queue a checked request; its events go to ``emit`` (called on the engine thread).

        ``compiled``: the request's grammar compiled already (off the event loop); when
        None, a request with a grammar compiles it here (BadRequest if it does not).
        """
        return self.submit_all([(request, emit, compiled)])[0]

    def submit_all(self, items: list[tuple[Request, Any, Any]]) -> list[Job]:
        """Queue (request, emit, compiled) items together, all or none: a batch is admitted
        in one step when there is room, so copies of one prompt share its prefill."""
        jobs = [self._job(*item) for item in items]
        with self._cv:
            if self._stopping:
                raise BadRequest("the server is shutting down", status=503)
            if len(self._queue) >= self.max_queued:
                raise BadRequest(
                    f"{len(self._queue)} requests are waiting already; try again shortly",
                    status=503,
                )
            self._queue.extend(jobs)
            self._cv.notify()
        return jobs

    def _job(self, request: Request, emit: Any, compiled: Any) -> Job:
        max_new = self.check(request)
        s = request.sampling
        tracker = TextTracker(
            lambda ids: self.tokenizer.decode(
                ids, skip_special_tokens=s.skip_special_tokens, clean_up_tokenization_spaces=False
            ),
            s.stop,
            s.no_stop_trim,
        )
        job = Job(request, emit, max_new, tracker)
        if s.seed is not None and not s.greedy:
            job.generator = torch.Generator().manual_seed(s.seed)
        if s.grammar is not None:
            if compiled is None:
                compiled = self.grammars.compile(*s.grammar)
            job.grammar = self.grammars.matcher(compiled)
        return job

    def swap(self, weights: Weights) -> None:
        """Serve ``weights`` to requests admitted from now on."""
        with self._cv:
            self.weights = weights

    def load(self) -> dict[str, float]:
        with self._cv:
            return {
                "queued": len(self._queue),
                "running": sum(j.finish is None for g in self._groups for j in g.jobs),
                "weight_sets": len({id(g.weights) for g in self._groups}),
                "widest_batch": self.widest,
                "step_ms": round(self.step_s * 1000, 1),
                "prefill_tokens": self.prefill_tokens,
                "prefix_hits": self.prefixes.hits,
                "prefix_tokens_saved": self.prefixes.saved_tokens,
                "prefix_tokens_kept": self.prefixes.held,
                "finished_kept": self.prefixes.finished_kept,
            }

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout=30)

    # -- the engine thread -----------------------------------------------------

    def _run(self) -> None:
        while True:
            new, weights = self._take()
            if new is None:
                return
            started = time.perf_counter()
            try:
                if new:
                    self._admit(new, weights)
                for group in self._groups:
                    if group.rows is not None:
                        self._step(group)
            except Exception as exc:  # a bug or an out-of-memory: fail what was running, go on
                log.exception("the engine step failed; failing the requests in it")
                self._fail_all(new, f"{type(exc).__name__}: {exc}")
            self._groups = [g for g in self._groups if g.jobs]
            self.steps += 1
            self.step_s = 0.9 * self.step_s + 0.1 * (time.perf_counter() - started)

    def _take(self) -> tuple[list[Job] | None, Weights]:
        with self._cv:
            while not self._queue and not self._groups and not self._stopping:
                self._cv.wait()
            if not self._groups:
                self._gather()
            if self._stopping:
                return None, self.weights
            room = self.max_running - sum(len(g.jobs) for g in self._groups)
            new: list[Job] = []
            while self._queue and len(new) < room:
                job = self._queue.popleft()
                if not job.cancelled:
                    new.append(job)
            return new, self.weights

    def _gather(self) -> None:
        """Idle, with a request come in: wait a moment (``admit_wait_s``, at most) for
        others sent with it, so they prefill and decode as one batch from their first step
        (clients sending a batch of requests at once reach the server one by one)."""
        deadline = time.monotonic() + self.admit_wait_s
        while len(self._queue) < self.max_running and not self._stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cv.wait(left)

    def _admit(self, jobs: list[Job], weights: Weights) -> None:
        for job in jobs:
            job.version = weights.version
        plain = [j for j in jobs if not j.request.wants_prompt_logprobs]
        batches = [plain] if plain else []
        batches += [[j] for j in jobs if j.request.wants_prompt_logprobs]
        for part in batches:
            self._prefill(part, weights)

    def _prefill(self, jobs: list[Job], weights: Weights) -> None:
        prompts = [j.request.prompt_ids for j in jobs]
        scored = len(jobs) == 1 and jobs[0].request.wants_prompt_logprobs
        keep_logits = len(prompts[0]) - jobs[0].request.logprob_start_len if scored else 1
        distinct, copy_of = distinct_prompts(prompts)
        kept = self._kept_starts(distinct, weights, keep_logits)
        rows, logits = batch.prefill(
            weights.model,
            [p[n:] for p, (n, _layers) in zip(distinct, kept, strict=True)],
            self.pad_id,
            keep_logits,
            [layers for _n, layers in kept],
        )
        self.prefill_tokens += sum(len(p) - n for p, (n, _) in zip(distinct, kept, strict=True))
        if scored:
            self._prompt_logprobs(jobs[0], logits[0])
        live = [i for i, j in enumerate(jobs) if j.max_new_tokens > 0]
        for job in jobs:
            if job.max_new_tokens == 0:
                self._finish(job, {"type": "length", "length": 0})
        if not live:
            return
        alive = batch.keep(rows, [copy_of[i] for i in live])  # a shared prompt's rows copied
        assert alive is not None
        jobs = [jobs[i] for i in live]
        staying = self._advance(jobs, alive, logits[[copy_of[i] for i in live], -1], weights)
        going_on = batch.keep(alive, staying)
        if going_on is not None:
            group = self._group_for(weights)
            group.jobs.extend(jobs[i] for i in staying)
            group.rows = batch.join(group.rows, going_on)

    def _kept_starts(
        self, prompts: list[list[int]], weights: Weights, keep_logits: int
    ) -> list[tuple[int, Layers | None]]:
        """Per prompt, how many of its first tokens have keys and values kept, and those
        (0, None: none): the longest kept start it has (:mod:`pipeline.serving.prefix`),
        else the start it shares with the others, computed and kept now. A start leaves
        the tokens whose logits are asked for."""
        cache = self.prefixes.for_weights(weights)
        if not cache.tokens:
            return [(0, None)] * len(prompts)
        most = [len(p) - keep_logits for p in prompts]
        found = [cache.match(p, m) for p, m in zip(prompts, most, strict=True)]
        missing = [i for i, f in enumerate(found) if f is None]
        common = cache.shared([prompts[i] for i in missing])
        fresh = (
            common is not None
            and len(common) <= cache.tokens
            and all(len(common) <= most[i] for i in missing)
        )
        if fresh:
            assert common is not None
            cache.put(common, run_prefix(weights.model, common))
            self.prefill_tokens += len(common)
            for i in missing:
                found[i] = (common, len(common))
        views: dict[tuple[tuple[int, ...], int], Layers] = {}  # one object per start
        starts: list[tuple[int, Layers | None]] = []
        computed = set(missing) if fresh else set()
        for i, f in enumerate(found):
            if f is None or f[0] not in cache:  # gone: the common one took its room
                starts.append((0, None))
                continue
            starts.append((f[1], views.setdefault(f, cache.layers(*f))))
            if i not in computed:
                cache.hits += 1
                cache.saved_tokens += f[1]
        return starts

    def _prompt_logprobs(self, job: Job, logits: torch.Tensor) -> None:
        """SGLang's input log-probs from logprob_start_len: the first entry is always None."""
        request = job.request
        start = request.logprob_start_len
        targets = torch.tensor(request.prompt_ids[start + 1 :], dtype=torch.long)
        values, tops = prompt_logprobs(logits[:-1], targets, request.top_logprobs_num)
        job.input_logprobs = [None, *values]
        if request.top_logprobs_num:
            job.input_top = [None, *tops]

    def _group_for(self, weights: Weights) -> Group:
        for group in self._groups:
            if group.weights is weights:
                return group
        group = Group(weights, [])
        self._groups.append(group)
        return group

    def _step(self, group: Group) -> None:
        assert group.rows is not None
        live = [i for i, j in enumerate(group.jobs) if not j.cancelled]
        if len(live) < len(group.jobs):
            group.rows = batch.keep(group.rows, live)
            group.jobs = [group.jobs[i] for i in live]
            if group.rows is None:
                return
        self.widest = max(self.widest, group.rows.size)
        logits = batch.decode(group.weights.model, group.rows)
        staying = self._advance(group.jobs, group.rows, logits, group.weights)
        group.rows = batch.keep(group.rows, staying)
        group.jobs = [group.jobs[i] for i in staying]

    def _advance(
        self, jobs: list[Job], rows: Rows, logits: torch.Tensor, weights: Weights
    ) -> list[int]:
        """Choose each row's next token; emit it; the indices of rows that go on (a row
        that ends has its sequence kept for the requests that start with it).

        A row with a grammar has its logits masked first, so its reported log-probs are
        those of the masked distribution, as SGLang reports them; other rows are untouched.
        """
        constrain(logits, [j.grammar for j in jobs])
        banned = [self._banned(j) for j in jobs]
        choices = choose(
            logits,
            [j.request.sampling for j in jobs],
            [j.generator for j in jobs],
            [j.request.top_logprobs_num if j.request.return_logprob else 0 for j in jobs],
            self.original_logprobs,
            banned,
        )
        staying: list[int] = []
        for i, (job, choice) in enumerate(zip(jobs, choices, strict=True)):
            if job.grammar is not None and not job.grammar.accept_token(choice.token):
                self._finish(job, {"type": "abort", "message": "the grammar allows no next token"})
                continue
            job.output_ids.append(choice.token)
            job.output_logprobs.append(choice.logprob)
            job.output_top.append(choice.top)
            matched_text = job.tracker.add(choice.token)
            finish = self._finish_reason(job, choice.token, matched_text)
            if finish is None:
                job.emit(
                    Event("token", job.tracker.delta(), choice.token, choice.logprob, choice.top)
                )
                rows.last[i] = choice.token
                staying.append(i)
            else:
                job.finish = finish
                job.emit(
                    Event(
                        "token",
                        job.tracker.delta(True, job.stop_tokens_trimmed),
                        choice.token,
                        choice.logprob,
                        choice.top,
                    )
                )
                self._keep_finished(job, rows, i, weights)
                self._finish(job, finish)
        return staying

    def _keep_finished(self, job: Job, rows: Rows, row: int, weights: Weights) -> None:
        """Keep the keys and values of a finished row: its prompt and what it generated,
        less the last token (chosen, never fed)."""
        tokens = (*job.request.prompt_ids, *job.output_ids[:-1])
        cached = int(rows.mask[row].sum())
        if cached != len(tokens):  # not the row it seems: keep nothing rather than garbage
            log.warning("row %d holds %d tokens, its request %d; not kept", row, cached,
                        len(tokens))  # fmt: skip
            return
        cache = self.prefixes
        if cache.tokens and len(tokens) >= cache.min_prefix and tokens not in cache:
            cache.keep_finished(weights, tokens, row_layers(rows.cache, rows.mask, row))

    def _banned(self, job: Job) -> set[int]:
        s = job.request.sampling
        if len(job.output_ids) >= s.min_new_tokens:
            return set()
        return set(s.stop_token_ids) | (set() if s.ignore_eos else set(self.eos_ids))

    def _finish_reason(self, job: Job, token: int, matched_text: bool) -> dict[str, Any] | None:
        s = job.request.sampling
        if matched_text:
            return {"type": "stop", "matched": job.tracker.matched}
        if token in s.stop_token_ids or (not s.ignore_eos and token in self.eos_ids):
            return {"type": "stop", "matched": token}
        if job.grammar is not None and job.grammar.is_terminated():
            return {"type": "stop", "matched": token}
        produced = len(job.output_ids)
        if (
            produced >= job.max_new_tokens
            or len(job.request.prompt_ids) + produced >= self.context_length
        ):
            return {"type": "length", "length": produced}
        return None

    def _finish(self, job: Job, finish: dict[str, Any]) -> None:
        job.finish = finish
        job.text = job.tracker.final(job.stop_tokens_trimmed)
        job.emit(Event("done"))

    def _fail_all(self, new: list[Job], error: str) -> None:
        failed = [*new, *(j for g in self._groups for j in g.jobs)]
        self._groups = []
        for job in failed:
            if job.finish is None:
                job.emit(Event("error", error=error))


def distinct_prompts(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """Each different prompt once, and for each prompt the index of its copy among them."""
    index: dict[tuple[int, ...], int] = {}
    copy_of = [index.setdefault(tuple(p), len(index)) for p in prompts]
    return [list(p) for p in index], copy_of


def _eos_ids(tokenizer: Any, model: Any) -> frozenset[int]:
    """End-of-sequence tokens: the tokenizer's and the generation config's."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(int(i) for i in configured)
    return frozenset(ids)
