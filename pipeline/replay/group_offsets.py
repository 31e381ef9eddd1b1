"""Consumer-group offsets: show where a group is, move it (only while nobody consumes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafka import OffsetAndMetadata, TopicPartition

from pipeline.broker.clients import admin_client
from pipeline.broker.following import log_ends
from pipeline.broker.reading import TopicRange
from pipeline.errors import BrokerError, ConfigError
from pipeline.replay.ranges import parse_time, resolve
from pipeline.settings import Settings


@dataclass(frozen=True)
class PartitionPosition:
    topic: str
    partition: int
    committed: int | None
    end: int

    @property
    def lag(self) -> int | None:
        return None if self.committed is None else max(0, self.end - self.committed)


@dataclass(frozen=True)
class GroupView:
    group: str
    state: str
    members: list[str]
    positions: list[PartitionPosition]


def describe(settings: Settings, group: str, topics: list[str] | None = None) -> GroupView:
    admin = admin_client(settings)
    try:
        info = admin.describe_groups([group]).get(group, {})
        committed = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    names = sorted(set(topics or []) | {tp.topic for tp in committed})
    positions = [
        PartitionPosition(
            topic,
            partition,
            committed[tp].offset if (tp := TopicPartition(topic, partition)) in committed else None,
            end,
        )
        for (topic, partition), end in sorted(log_ends(settings, names).items())
    ]
    return GroupView(group, _state(info), _members(info), positions)


def _state(info: Any) -> str:
    state = info.get("group_state") or info.get("state") or "Unknown"
    return str(getattr(state, "name", state))


def _members(info: Any) -> list[str]:
    out = []
    for member in info.get("members") or []:
        ident = member.get("member_id", "?")
        host = member.get("client_host", "")
        out.append(f"{ident} {host}".strip())
    return out


def reset(
    settings: Settings,
    group: str,
    topic: str,
    to_time: str | None = None,
    to_offsets: str | None = None,
    to_earliest: bool = False,
    to_latest: bool = False,
    partitions: str | None = None,
) -> dict[int, int]:
    """Move ``group``'s committed offsets on ``topic``; refused while the group has members."""
    chosen = (
        sum(x is not None and x is not False for x in (to_time, to_offsets))
        + int(to_earliest)
        + int(to_latest)
    )
    if chosen != 1:
        raise ConfigError("give exactly one of --to-time, --to-offset, --to-earliest, --to-latest")
    view = describe(settings, group, [topic])
    if view.members:
        raise BrokerError(
            f"group {group} has {len(view.members)} active member(s) ({view.state}): "
            + "; ".join(view.members)
            + ". Stop its consumers first; offsets of a running group cannot be moved."
        )
    if to_time is not None:
        parse_time(to_time, "--to-time")  # a clear error before any lookup
        span = resolve(settings, topic, since=to_time, partitions=partitions)
        target = {p: start for p, (start, _end) in span.spans.items()}
    elif to_offsets is not None:
        span = resolve(settings, topic, start_offsets=to_offsets, partitions=partitions)
        target = _explicit(span, to_offsets)
    else:
        span = resolve(settings, topic, partitions=partitions)
        target = {p: (start if to_earliest else end) for p, (start, end) in span.spans.items()}
    admin = admin_client(settings)
    try:
        result = admin.alter_group_offsets(
            group,
            {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in target.items()},
        )
    finally:
        admin.close()
    failed = {tp.partition: err for tp, err in result.items() if err.__name__ != "NoError"}
    if failed:
        raise BrokerError(f"resetting {group} on {topic} failed for partitions {failed}")
    return target


def _explicit(span: TopicRange, to_offsets: str) -> dict[int, int]:
    """The named partitions' offsets, kept within [log start, log end]."""
    named = {int(part.split(":")[0]) for part in to_offsets.split(",")}
    return {p: min(start, end) for p, (start, end) in span.spans.items() if p in named}
