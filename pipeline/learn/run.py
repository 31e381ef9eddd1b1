"""`turnstream learn`, phase by phase: start the stack, evaluate, learn live, evaluate,
control, report. Everything it started is stopped on the way out, normally or on Ctrl-C."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from pipeline.broker.clients import producer
from pipeline.broker.cluster import local_broker
from pipeline.errors import TurnstreamError
from pipeline.learn import alignment, freshness, sentinels
from pipeline.learn.evaluate import EvalProgress, EvalResult, evaluate
from pipeline.learn.loop import Users, Watched, follow
from pipeline.learn.monitor import Monitor, ScoredTurn, intent_agreement
from pipeline.learn.options import LearnOptions
from pipeline.learn.prompts import default_prompts, load_prompts, split
from pipeline.learn.report import (
    LearnReport,
    per_version,
    run_verdict,
    write_chart,
    write_turns,
)
from pipeline.learn.stack import (
    Judge,
    Proc,
    TeacherServer,
    judge_backend,
    start_console,
    start_proxy,
    start_server,
    start_teacher,
    start_trainer,
    start_worker,
    trainer_files,
)
from pipeline.learn.steps import step_split
from pipeline.learn.users import Population, ServedTurn
from pipeline.models.fetch import JUDGE_NAME, resolve_model
from pipeline.policy_records import EVALUATION_KEY
from pipeline.processes import Children, tail
from pipeline.settings import Settings
from pipeline.topics import admin
from pipeline.training.config import TrainerConfig
from pipeline.training.weights import push_to_servers

# The embedded judge is the trained 135M judge on CPU: its votes are regex-constrained (a
# box within tens of tokens), and the budget only bounds a vote that would run on anyway.
EMBEDDED_JUDGE_MAX_TOKENS = 256
JUDGE_ROWS_PER_SAMPLE = 4  # the embedded judge decodes this many votes per sample at once
PUBLISH_TIMEOUT_S = 30.0  # an evaluation's record on policy.versions, acknowledged


def run_learn(settings: Settings, options: LearnOptions, console: Console) -> LearnReport:
    """The whole run; returns its report (also written to ``workdir``/learn.json and .png)."""
    with ExitStack() as cleanup:
        run = LearnRun(settings, options, console, cleanup)
        run.start()
        run.evaluate("before")
        run.start_training()
        turns = run.learn()
        run.evaluate("after")
        run.measure(turns)
        if options.control:
            run.control(options.control_sessions or len(turns))
    return run.finish()


class LearnRun:
    """One run's processes, monitor and report; each method is a phase."""

    def __init__(
        self, settings: Settings, options: LearnOptions, console: Console, cleanup: ExitStack
    ) -> None:
        self.started = time.monotonic()
        self.run_id = uuid.uuid4().hex[:8]
        prefix = f"{settings.topic_prefix}learn{self.run_id}."
        self.settings = settings.model_copy(update={"topic_prefix": prefix})
        self.options, self.console, self.cleanup = options, console, cleanup
        self.workdir = options.workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.report = LearnReport(options.to_json(), options.preference.describe())
        self.report.topic_prefix = prefix
        prompts = load_prompts(options.prompts or default_prompts())
        self.train = split(prompts, "train")
        self.heldout = split(prompts, "heldout")[: options.eval_prompts]
        self.model = resolve_model(options.model, settings.models, log=console.print)
        self.teacher_watch: dict[str, tuple[Proc, Path]] = {}  # the teacher's server, if any
        self._mark = time.monotonic()

    def _phase(self, name: str) -> None:
        """Record the time since the last phase ended as ``name``'s."""
        now = time.monotonic()
        self.report.phases_s[name] = now - self._mark
        self._mark = now

    def _keep(self, proc: Proc) -> Proc:
        return self.children.add(proc)

    def start(self) -> None:
        """Broker, topics, policy server, judge, proxy, worker; then the monitor (the trainer
        starts after the first evaluation: :meth:`start_training`)."""
        s, o, w = self.settings, self.options, self.workdir
        _broker(s, self.cleanup, self.console)
        self.children = Children()  # stopped together, before the broker
        self.cleanup.callback(self.children.stop)
        admin.apply(s)
        self.versions_out = producer(s, max_request_size=1 << 20)  # held-out evaluations
        self.cleanup.callback(self.versions_out.close, timeout=5)
        self._console()
        self.server = start_server(s, self.model, w, "policy", o.server_threads)
        self._keep(self.server.proc)
        judge = self._judge()
        self.judge_backend = judge_backend(judge)
        self.proxy = start_proxy(s, self.server.url, w)
        self._keep(self.proxy.proc)
        teacher = self._teacher()
        worker = self._keep(start_worker(s, w, judge, o.mode, teacher))
        files = trainer_files(w)
        self.monitor = Monitor(s, files.metrics, files.ledger)
        self.cleanup.callback(self.monitor.close)
        self.cleanup.callback(self.children.stop)  # on the way out, before the monitor closes
        self.watched = Watched(
            {
                "policy server": (self.server.proc, w / "policy.log"),
                "capture proxy": (self.proxy.proc, w / "proxy.log"),
                "scoring worker": (worker, w / "worker.log"),
                **self.teacher_watch,
            }
        )
        self.console.print(
            f"policy {self.model} served at {self.server.url}; capture proxy at "
            f"{self.proxy.url}; judge: {judge.url if judge else 'rules'}; mode {o.mode}"
            f"{self._teacher_words()}; topics "
            f"{s.topic_prefix}*; logs in {w}"
        )
        self._phase("start")

    def _console(self) -> None:
        """`turnstream console` on the run's topics, its URL printed and in learn.json; one
        that does not start is a warning and the run goes on without it."""
        o = self.options
        if not o.console:
            return
        tokenizer = self.model if o.mode != "rl" else None  # OPD tokens shown as text
        try:
            served = start_console(self.settings, self.workdir, o.console_port, tokenizer)
        except TurnstreamError as exc:
            self.console.print(
                f"[yellow]warning:[/] the console did not start, the run goes on without it: {exc}"
            )
            return
        self._keep(served.proc)
        self.report.console_url = served.url
        self.console.print(f"console: {served.url} (the run's samples and versions, live)")

    def start_training(self) -> None:
        """The trainer, once version 0 is evaluated: its start (torch, DeepSpeed, the model)
        would otherwise take the CPU from the evaluation and slow it down."""
        trainer, files = start_trainer(
            self.settings, self.model, self.server.url, self.workdir, self.options.trainer_options()
        )
        self.trainer, self.trainer_log = self._keep(trainer), files.log
        self._phase("start_trainer")

    def _teacher(self) -> TeacherServer | None:
        """opd and combine: the teacher (:func:`start_teacher`); its own server is watched
        beside the others."""
        o = self.options
        teacher, served = start_teacher(
            self.settings, self.model, self.workdir, self.server.url, o.mode, o.teacher,
            o.teacher_top_k, o.batch_size,
        )  # fmt: skip
        if served is not None:
            self._keep(served.proc)
            self.teacher_watch = {"teacher server": (served.proc, self.workdir / "teacher.log")}
        if teacher is not None and o.teacher_contrast:
            teacher = dataclasses.replace(teacher, contrast=True)
        return teacher

    def _teacher_words(self) -> str:
        if self.options.mode == "rl":
            return ""
        if self.options.teacher == "policy":
            contrast = ", less its neutral-line log-probs" if self.options.teacher_contrast else ""
            return f" (teacher: the served policy, hinted{contrast})"
        words = " (teacher: the initial weights, hinted, served on their own"
        return words + (
            ", less its neutral-line log-probs)" if self.options.teacher_contrast else ")"
        )

    def _judge(self) -> Judge | None:
        """None for the rules judge; else an LLM judge: ``embedded`` serves the default
        trained judge (smollm2-135m-judge, built once into the models cache), any other
        value is the base URL of an OpenAI-compatible judge (SGLang serves one)."""
        judge = self.options.judge
        if judge is None or judge == "rules":
            return None
        if judge != "embedded":
            return Judge(
                judge.rstrip("/").removesuffix("/v1"), max_new_tokens=self.options.judge_max_tokens
            )
        model = resolve_model(JUDGE_NAME, self.settings.models, log=self.console.print)
        # every vote of a batch at once: m=3 eval votes (and a hint vote) per sample
        rows = JUDGE_ROWS_PER_SAMPLE * self.options.batch_size
        served = start_server(self.settings, model, self.workdir, "judge", None, rows)
        self._keep(served.proc)
        return Judge(served.url, model, self.options.judge_max_tokens or EMBEDDED_JUDGE_MAX_TOKENS)

    def evaluate(self, label: str) -> EvalResult:
        """The held-out evaluation ``label`` (before, after, control), a phase of its own."""
        # the control's version 0 answered with learning off: no version of this run's
        result = self._evaluation(label, publish=label != "control")
        self.report.evaluation[label] = result.to_json()
        self._phase(f"eval_{label}")
        return result

    def _evaluate_pushed(self, version: int) -> None:
        """Every ``eval_every``-th version pushed before the last (that one is ``after``),
        while the users are held: eval.periodic, its time counted apart from learning's."""
        every, began = self.options.eval_every, time.monotonic()
        if not every or version % every or version >= self.options.steps:
            return
        result = self._evaluation(f"version {version}")
        self.report.evaluation.setdefault("periodic", {})[str(version)] = result.to_json()
        self._periodic_s += time.monotonic() - began

    def _evaluation(self, label: str, publish: bool = True) -> EvalResult:
        """One held-out evaluation, printed; ``publish``: also on policy.versions."""
        o = self.options
        result = evaluate(
            label, self.server.url, self.heldout, o.preference, o.sampling, o.eval_samples,
            progress=EvalProgress(label, self.console.print),
        )  # fmt: skip
        self.console.print(
            f"held-out ({label}): success {result.success:.3f}, accuracy "
            f"{result.accuracy:.3f}, degenerate {result.degenerate_share:.3f} of n={result.n}, "
            f"{result.mean_words:.1f} words on average, versions {result.versions}"
        )
        if publish:
            self._publish(result)
        return result

    def _publish(self, result: EvalResult) -> None:
        """The evaluation on policy.versions beside the trainer's pushes (the validation
        signal: the console and the proxy's gauges show it); a failure is a warning, as
        learn.json keeps the figures."""
        record = result.record(time.time())
        if record is None:
            self.console.print(
                f"[yellow]warning:[/] held-out ({result.label}) not published on "
                f"policy.versions: its answers came from versions {result.versions}, not one"
            )
            return
        topic = self.settings.topics.policy_versions.name
        try:
            sent = self.versions_out.send(topic, record.encode(), key=EVALUATION_KEY)
            sent.get(timeout=PUBLISH_TIMEOUT_S)
        except Exception as exc:  # the broker is away: the run goes on, learn.json has it
            self.console.print(
                f"[yellow]warning:[/] held-out ({result.label}) of version {record.version} "
                f"not published on {topic}: {exc!r}"
            )
        else:
            self.report.published_evaluations += 1

    def _population(self, run_id: str, seed: int) -> Population:
        o = self.options
        return Population(
            self.proxy.url,
            self.train,
            o.preference,
            o.sampling,
            o.users,
            run_id,
            seed,
            group_size=o.group_size,
        )

    def learn(self) -> list[ServedTurn]:
        """Users talk while the trainer learns; until its last step's weights are pushed."""
        population = self._population(self.run_id, self.options.seed)
        population.allowed = self.options.max_ahead  # None: no limit; else raised as it trains
        users = Users(population)
        self._periodic_s = 0.0
        try:
            self._follow("learning", users, self._trainer_done, self.options.max_ahead,
                         self._evaluate_pushed, by_pushes=True)  # fmt: skip
        finally:
            users.stop()
        self._phase("learn")
        if self._periodic_s:
            self.report.phases_s["learn"] -= self._periodic_s
            self.report.phases_s["eval_periodic"] = self._periodic_s
        write_turns(users.turns, self.workdir / "turns.jsonl")
        return users.turns

    def _trainer_done(self) -> bool:
        code = self.trainer.poll()
        if code is not None and code != 0:
            raise TurnstreamError(f"the trainer exited with {code}:\n{tail(self.trainer_log)}")
        return code == 0

    def _follow(
        self,
        phase: str,
        users: Users,
        done: Callable[[], bool],
        max_ahead: int | None,
        on_push: Callable[[int], None] | None = None,
        by_pushes: bool = False,
    ) -> None:
        """``by_pushes``: every sample the trainer takes is of these users, so its pushes
        pace them (see loop.settled)."""
        deadline = self.started + self.options.timeout_s
        batch_size = self.options.batch_size if by_pushes else None
        follow(phase, users, self.monitor, self.watched, done, self.console,
               self.started, self.options.steps, max_ahead, deadline, on_push,
               self.report.evaluation, batch_size)  # fmt: skip

    def measure(self, turns: list[ServedTurn]) -> None:
        """Alignment, per-version figures, freshness, pushes and training totals."""
        samples = alignment.read_samples(self.settings, 0, 8)
        self.report.alignment = alignment.measure(samples, self.model)
        self.monitor.poll()
        m, r = self.monitor, self.report
        ids = {freshness.sample_id(t) for t in turns}
        r.versions = per_version(turns, [s for s in m.scored.values() if s.sample_id in ids])
        r.freshness = freshness.measure(turns, m.trained, m.pushes).to_json()
        first = m.pushes[0].ts if m.pushes else 0.0
        r.pushes = [{"version": p.version, "step": p.step, "at_s": round(p.ts - first, 1)}
                    for p in m.pushes]  # fmt: skip
        r.training = _training(m.steps, len(m.trained))
        r.training["teacher"] = teacher_tally(
            [m.scored[i] for i in ids if i in m.scored], m.trained
        )
        r.judge = {**m.judge.to_json(), "backend": m.judge.backend or self.judge_backend}
        intents = {freshness.sample_id(t): t.met for t in turns}
        scores = {sid: s.score for sid, s in m.scored.items()}
        r.judge["intent_agreement"] = intent_agreement(intents, scores)
        r.users["learning"] = _users(turns, self.report.phases_s.get("learn", 0.0))
        self._phase("measure")

    def control(self, sessions: int) -> None:
        """The same loop with learning off: the initial weights served again, no trainer,
        ``sessions`` user sessions (their turns are captured and judged as before, and
        nothing trains on them); then the same evaluation."""
        retry_policy = TrainerConfig().weight_push_retry  # the trainer's, as its pushes had
        push_to_servers([self.server.url], self.model, retry_policy, weight_version="0")
        users = Users(self._population(f"{self.run_id}-control", self.options.seed + 1))
        try:
            self._follow("control (learning off)", users,
                         lambda: len(users.turns) >= sessions, None)  # fmt: skip
        finally:
            users.stop()
        self.report.users["control"] = _users(users.turns, time.monotonic() - self._mark)
        write_turns(users.turns, self.workdir / "control-turns.jsonl")
        self._phase("control_loop")
        self.evaluate("control")

    def finish(self) -> LearnReport:
        found = sentinels.measure(self.monitor.steps, self.report.evaluation)
        self.report.sentinels = found.to_json()
        self.report.verdict = run_verdict(self.report.evaluation, found.to_json()["divergence"])
        self.report.wall_time_s = time.monotonic() - self.started
        self.report.write(self.workdir / "learn.json")
        write_chart(self.report, self.workdir / "learn.png")
        return self.report


def _training(steps: list[dict[str, object]], trained: int) -> dict[str, object]:
    first = steps[0] if steps else {}
    return {
        "steps": len(steps),
        # steps whose scores were all alike (every answer rejected): no weight moved
        "steps_without_update": sum(1 for row in steps if row.get("updated") is False),
        "samples_trained": trained,
        "first_step_rollout_logprob_abs_diff": first.get("train_rollout_logprob_abs_diff"),
        "reward_mean_per_step": [row.get("reward_mean") for row in steps],
        "loss_per_step": [row.get("loss") for row in steps],
        "step_time": step_split(steps),
    }


def teacher_tally(scored: list[ScoredTurn], trained: dict[str, int]) -> dict[str, int]:
    """The learning phase's teacher signal: the samples that carried teacher log-probs, how
    many of them trained, how many trained without one (combine: the reward alone), and how
    many were dropped for lack of a hint (opd: ``no_hint``) or because every hint had a
    flaw (``hint_rejected``: too long, repeating itself, echoing the response)."""
    taught = {s.sample_id for s in scored if s.teacher}
    return {
        "samples_with_teacher": len(taught),
        "trained_with_teacher": sum(1 for sid in trained if sid in taught),
        "trained_without_teacher": sum(1 for sid in trained if sid not in taught),
        "excluded_no_hint": sum(1 for s in scored if s.exclude_reason == "no_hint"),
        "excluded_hint_rejected": sum(1 for s in scored if s.exclude_reason == "hint_rejected"),
    }


def _users(turns: list[ServedTurn], seconds: float) -> dict[str, object]:
    return {
        "sessions": len(turns),
        "met_rate": round(sum(t.met for t in turns) / len(turns), 4) if turns else None,
        "turns_per_s": round(len(turns) / seconds, 3) if seconds else None,
    }


def _broker(settings: Settings, cleanup: ExitStack, console: Console) -> None:
    """The local broker, started (and stopped afterwards) if it is not running."""
    if not settings.uses_local_broker:
        console.print(f"using the cluster at {settings.bootstrap_servers}")
        return
    local = local_broker(settings.local_kafka, log=console.print)
    if local.running:
        console.print(f"using the running local broker at {settings.bootstrap_servers}")
        return
    local.start()
    cleanup.callback(local.stop)
