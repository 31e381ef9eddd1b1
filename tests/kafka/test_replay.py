"""`turnstream replay` and `turnstream offsets` against the real broker."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from pipeline.broker.clients import admin_client
from pipeline.replay.copy import REPLAY_SOURCE
from pipeline.settings import Settings
from pipeline.topics import admin
from tests.kafka.helpers import make_topic, read_all, turnstream

# Record timestamps (ms), 100 s apart, an hour ago: recent enough that retention
# (which counts from record timestamps) keeps them for the test.
_BASE = (int(time.time()) - 3600) * 1000
ERAS = (_BASE, _BASE + 100_000, _BASE + 200_000)


def fill(settings: Settings) -> dict[int, list[tuple[str, int]]]:
    """Records on chat.turns in three eras; returns (key, timestamp) per era."""
    out = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    sent: dict[int, list[tuple[str, int]]] = {0: [], 1: [], 2: []}
    for era, base in enumerate(ERAS):
        for i in range(40):
            key, ts = f"s{i % 7}", base + i
            out.send(
                settings.topics.chat_turns.name,
                key=key.encode(),
                value=f'{{"era": {era}, "i": {i}}}'.encode(),
                headers=[("origin", b"test"), ("era", str(era).encode())],
                timestamp_ms=ts,
            )
            sent[era].append((key, ts))
    out.flush()
    out.close()
    return sent


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def test_replay_copies_exactly_a_time_range_once(
    settings: Settings, cli_env: dict[str, str]
) -> None:
    admin.apply(settings)
    sent = fill(settings)
    target = make_topic(settings, "replay.target", settings.topics.chat_turns.partitions)
    args = ["replay", "--from", "chat.turns", "--to", target]
    window = ["--since", iso(ERAS[1]), "--until", str(ERAS[2])]  # ISO and epoch ms
    first = turnstream(*args, *window, env=cli_env)
    assert first.returncode == 0, first.stderr
    assert "copied 40, already in" in first.stdout and f"{target} 0," in first.stdout
    copies = read_all(settings, target)
    assert sorted((r.key.decode(), r.timestamp) for r in copies) == sorted(sent[1])
    source = {
        (r.partition, r.offset): r for r in read_all(settings, settings.topics.chat_turns.name)
    }
    for copy in copies:
        headers = dict(copy.headers)
        topic, partition, offset = headers["turnstream-replay-source"].decode().rsplit("/", 2)
        original = source[(int(partition), int(offset))]
        assert topic == settings.topics.chat_turns.name
        assert (copy.key, copy.value, copy.timestamp) == (
            original.key,
            original.value,
            original.timestamp,
        )
        assert copy.partition == original.partition  # same partition count: same partition
        assert headers["origin"] == b"test" and headers["era"] == b"1"
    again = turnstream(*args, *window, env=cli_env)
    assert again.returncode == 0, again.stderr
    assert "copied 0, already in" in again.stdout and f"{target} 40," in again.stdout
    assert len(read_all(settings, target)) == 40


def test_replay_by_offsets_and_partitions_into_a_differently_sized_topic(
    settings: Settings, cli_env: dict[str, str]
) -> None:
    admin.apply(settings)
    fill(settings)
    target = make_topic(settings, "replay.small", 1)
    source = read_all(settings, settings.topics.chat_turns.name)
    counts = {p: sum(1 for r in source if r.partition == p) for p in {r.partition for r in source}}
    busy = max(counts, key=lambda p: counts[p])
    result = turnstream(
        "replay",
        "--from",
        "chat.turns",
        "--to",
        target,
        "--partitions",
        str(busy),
        "--start-offsets",
        f"{busy}:2",
        "--end-offsets",
        f"{busy}:7",
        env=cli_env,
    )
    assert result.returncode == 0, result.stderr
    copies = read_all(settings, target)
    assert sorted(dict(r.headers)["turnstream-replay-source"].decode() for r in copies) == [
        f"{settings.topics.chat_turns.name}/{busy}/{o}" for o in range(2, 7)
    ]
    bad = turnstream("replay", "--from", "chat.turns", "--to", target, "--since", "yesterday",
                     env=cli_env)  # fmt: skip
    assert bad.returncode == 1 and "expected ISO 8601" in bad.stderr
    missing = turnstream("replay", "--from", "chat.turns", "--to", "nope", env=cli_env)
    assert missing.returncode == 1 and "target topic nope does not exist" in missing.stderr


def test_replay_shared_between_two_processes_keeps_everything_and_runs_once(
    settings: Settings, cli_env: dict[str, str]
) -> None:
    admin.apply(settings)
    fill(settings)
    partitions = settings.topics.chat_turns.partitions
    source = {
        (r.partition, r.offset): r for r in read_all(settings, settings.topics.chat_turns.name)
    }
    assert len({p for p, _ in source}) >= 2  # something to share
    for name, count in (("replay.split", partitions), ("replay.split.keyed", 1)):
        target = make_topic(settings, name, count)
        args = ["replay", "--from", "chat.turns", "--to", target, "--processes", "2"]
        first = turnstream(*args, env=cli_env)
        assert first.returncode == 0, first.stderr
        assert "copied 120, already in" in first.stdout and f"{target} 0," in first.stdout
        copies = read_all(settings, target)
        assert len(copies) == 120
        seen = set()
        for copy in copies:
            headers = copy.headers
            topic, partition, offset = dict(headers)[REPLAY_SOURCE].decode().rsplit("/", 2)
            original = source[(int(partition), int(offset))]
            seen.add((original.partition, original.offset))
            assert topic == settings.topics.chat_turns.name
            assert (copy.key, copy.value, copy.timestamp) == (
                original.key,
                original.value,
                original.timestamp,
            )
            assert list(headers[:2]) == list(original.headers)  # in order, then ours
            assert copy.partition == (original.partition if count == partitions else 0)
        assert seen == set(source)  # each source record copied exactly once
        for processes in ("2", "1"):  # the same replay, shared or not: nothing more
            again = turnstream(*args[:-1], processes, env=cli_env)
            assert again.returncode == 0, again.stderr
            assert "copied 0, already in" in again.stdout and f"{target} 120," in again.stdout
        assert len(read_all(settings, target)) == 120


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("how", ["ctrl-c", "helper-killed"])
def test_a_shared_replay_cut_short_stops_its_helper_and_a_rerun_completes_it(
    settings: Settings, cli_env: dict[str, str], how: str
) -> None:
    """The helper is stopped (SIGSTOP) once forked, so the replay cannot finish; then either
    Ctrl-C reaches the replay, or the helper is killed. Either way the replay ends at once,
    no process of it is left, and the same replay run again copies each record once."""
    admin.apply(settings)
    fill(settings)
    source = read_all(settings, settings.topics.chat_turns.name)
    target = make_topic(settings, f"replay.cut.{how}", settings.topics.chat_turns.partitions)
    args = ["replay", "--from", "chat.turns", "--to", target, "--processes", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", *args],
        env={**cli_env, "PYTHONPATH": os.getcwd()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (helpers := _children(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(helpers) == 1, "the replay forked no helper"
        helper = helpers[0]
        os.kill(helper, signal.SIGSTOP)
        assert proc.stdout is not None
        assert "replaying 120 record(s)" in proc.stdout.readline()  # the range is resolved
        time.sleep(1.0)  # the main process copies its share meanwhile
        assert proc.poll() is None, "a replay finished without its helper's share"
        if how == "ctrl-c":
            os.kill(proc.pid, signal.SIGINT)
        else:
            os.kill(helper, signal.SIGKILL)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == (130 if how == "ctrl-c" else 1), err
    if how == "helper-killed":
        assert "the replay helper process exited before its share was copied" in err
        assert "run the same replay again" in err
    assert _gone(helper, 10), "the helper outlived the replay"
    again = turnstream(*args, env=cli_env)
    assert again.returncode == 0, again.stderr
    copies = read_all(settings, target)
    sources = sorted(dict(c.headers)[REPLAY_SOURCE] for c in copies)
    assert len(sources) == len(set(sources)) == len(source) == 120  # each once, none missing


def test_offsets_show_and_reset_refused_while_the_group_consumes(
    settings: Settings, cli_env: dict[str, str]
) -> None:
    admin.apply(settings)
    fill(settings)
    topic = settings.topics.chat_turns.name
    group = settings.topic_prefix + "readers"
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=settings.bootstrap_servers,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    seen = 0
    while seen < 120:
        seen += sum(len(v) for v in consumer.poll(timeout_ms=1000).values())
    consumer.commit()
    shown = turnstream("offsets", "show", "--group", group, env=cli_env)
    assert shown.returncode == 0, shown.stderr
    assert "1 member(s)" in shown.stdout
    refused = turnstream(
        "offsets", "reset", "--group", group, "--topic", "chat.turns", "--to-earliest", env=cli_env
    )
    assert refused.returncode == 1 and "active member" in refused.stderr
    consumer.close()  # leaves the group

    moved = turnstream(
        "offsets", "reset", "--group", group, "--topic", "chat.turns", "--to-time",
        str(ERAS[1]), env=cli_env,
    )  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    records = read_all(settings, topic)
    for tp_line in re.findall(r"\[(\d+)\] -> (\d+)", moved.stdout):
        partition, offset = int(tp_line[0]), int(tp_line[1])
        first_era1 = min(  # a partition without such a record moves to its end
            (r.offset for r in records if r.partition == partition and r.timestamp >= ERAS[1]),
            default=sum(1 for r in records if r.partition == partition),
        )
        assert offset == first_era1
    client = admin_client(settings)
    try:
        committed = client.list_group_offsets(group).get(group, {})
    finally:
        client.close()
    lag = sum(
        sum(1 for r in records if r.partition == tp.partition) - meta.offset
        for tp, meta in committed.items()
    )
    assert lag == 80  # eras 1 and 2 are to be read again
    shown = turnstream("offsets", "show", "--group", group, env=cli_env)
    assert "0 member(s)" in shown.stdout
    busy = max({r.partition for r in records}, key=lambda p: sum(r.partition == p for r in records))
    explicit = turnstream(
        "offsets", "reset", "--group", group, "--topic", "chat.turns", "--to-offset", f"{busy}:1",
        env=cli_env,
    )  # fmt: skip
    assert explicit.returncode == 0, explicit.stderr
    client = admin_client(settings)
    try:
        committed = client.list_group_offsets(group).get(group, {})
    finally:
        client.close()
    assert committed[TopicPartition(topic, busy)].offset == 1


def example_pairs() -> list:
    """The pairs the pairing stage makes of the shipped example sessions."""
    from pipeline.events import decode_input
    from pipeline.scoring.pairing import pair_step
    from tests.conftest import REPO

    states: dict = {}
    pairs = []
    for line in (REPO / "examples" / "sessions.jsonl").read_bytes().splitlines():
        event = decode_input(line)
        step = pair_step(states.get(event.session_id), event, 1.0, 1800.0)
        states[event.session_id] = step.state
        pairs += step.pairs
    return pairs


def test_rescore_a_range_with_another_judge_leaves_live_topics_alone(
    settings: Settings, cli_env: dict[str, str], tmp_path
) -> None:
    from pipeline.broker.local import free_port_pair
    from pipeline.events import Sample, decode_as, encode
    from tests.kafka.helpers import spawn, wait_http

    admin.apply(settings)
    pairs = example_pairs()
    out = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    for i, pair in enumerate(pairs):
        era = ERAS[0] if i < 60 else ERAS[1]
        out.send(
            settings.topics.turns_paired.name,
            key=pair.turn.session_id.encode(),
            value=encode(pair),
            timestamp_ms=era + i,
        )
    out.flush()
    out.close()
    port = free_port_pair()
    sim = spawn(
        ["pipeline.testing.judge_sim", "--port", str(port), "--seed", "3"], tmp_path / "sim.log"
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", sim)
        judge = tmp_path / "judge.yaml"
        judge.write_text(
            f"judge: sglang\njudge_urls: ['http://127.0.0.1:{port}']\nm: 5\nvote_mode: fixed\n"
        )
        args = ["rescore", "--judge-config", str(judge), "--until", str(ERAS[1])]
        first = turnstream(*args, env=cli_env)
        assert first.returncode == 0, first.stderr
        assert "rescored 60 sample(s)" in first.stdout
        output = settings.topic_prefix + "samples.scored.v2"
        samples = [decode_as(Sample, r.value) for r in read_all(settings, output)]
        assert sorted(s.sample_id for s in samples) == sorted(p.sample_id for p in pairs[:60])
        for s in samples:
            assert s.judge.backend == "sglang"
            assert len(s.votes) == (5 if s.next_state is not None else 0)
        assert read_all(settings, settings.topics.samples_scored.name) == []  # live: untouched
        again = turnstream(*args, env=cli_env)
        assert again.returncode == 0, again.stderr
        assert "rescored 0 sample(s)" in again.stdout and "60 done before" in again.stdout
        assert len(read_all(settings, output)) == 60
    finally:
        sim.terminate()
        sim.wait(timeout=10)
    dead = tmp_path / "dead.yaml"
    dead.write_text(
        f"judge: sglang\njudge_urls: ['http://127.0.0.1:{free_port_pair()}']\n"
        "judge_max_attempts: 1\njudge_timeout_s: 2\n"
    )
    stuck = turnstream("rescore", "--judge-config", str(dead), "--output-topic", "v3", env=cli_env)
    assert stuck.returncode == 1 and "could not be reached" in stuck.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("judge: sglang\nvotes: 3\n")
    refused = turnstream("rescore", "--judge-config", str(bad), env=cli_env)
    assert refused.returncode == 1 and "unknown option(s) ['votes']" in refused.stderr


def test_rescore_with_reward_processors_scores_groups_together(
    settings: Settings, cli_env: dict[str, str], tmp_path
) -> None:
    """`rewards:` in the judge YAML: the range is scored by the reward processors (a
    group's members together, other pairs by the weighted processors)."""
    from pipeline.events import Sample, decode_as, encode

    admin.apply(settings)
    pairs = []
    for i, pair in enumerate(example_pairs()[:12]):
        turn = pair.turn
        if i < 9:  # three groups of three, each member a different session
            turn = turn.model_copy(
                update={"group_id": f"g{i // 3}", "group_size": 3, "ground_truth": "zzz"}
            )
        pairs.append(pair.model_copy(update={"turn": turn}))
    out = KafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    for pair in pairs:
        out.send(settings.topics.turns_paired.name, key=pair.route_key, value=encode(pair))
    out.flush()
    out.close()
    rewards = tmp_path / "rewards.yaml"
    rewards.write_text(
        "processors:\n  - classpath: examples.rewards.refusal:SafetyProcessor\n    name: safety\n"
        "group:\n  classpath: examples.rewards.group:DemoGroupRewardProcessor\n"
        "  name: demo\n  timeout_s: 5\n"
    )
    judge = tmp_path / "judge.yaml"
    judge.write_text(f"judge: rules\nrewards: {rewards}\n")
    done = turnstream("rescore", "--judge-config", str(judge), env=cli_env)
    assert done.returncode == 0, done.stderr
    assert "rescored 12 sample(s)" in done.stdout
    output = settings.topic_prefix + "samples.scored.v2"
    samples = {
        s.sample_id: s for s in (decode_as(Sample, r.value) for r in read_all(settings, output))
    }
    assert set(samples) == {p.sample_id for p in pairs}
    for i, pair in enumerate(pairs):
        s = samples[pair.sample_id]
        if i < 9:  # no ground truth in any message: 0.5 each, all scored in one call
            assert s.group_id == f"g{i // 3}" and s.group_scores == [0.5, 0.5, 0.5]
            assert s.reward_metrics["demo/complete"] == 1.0
        else:
            assert s.group_scores is None
            assert s.next_state is None or "safety" in s.reward_metrics
