"""The copy loop of `turnstream replay`, and a forked process that runs it on a share.

A replay of many records is CPU-bound in Python (unpacking fetched records,
building batches). :class:`Helper` is a process forked before any client
exists. Once the replay's own clients are in (so a refused login is tried
once, not once a process), it starts a consumer and a producer of its own
while the replay resolves its range, then copies the partitions it is given.
A partition is copied whole by one process, so records keep their order
within it.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from multiprocessing.connection import Connection

from aiokafka import AIOKafkaConsumer

from pipeline.broker.bulk import BatchSender, Header, batch_sender, range_consumer
from pipeline.broker.reading import TopicRange, read_range
from pipeline.errors import BrokerError, TurnstreamError
from pipeline.settings import Settings

REPLAY_ID = "turnstream-replay-id"
REPLAY_SOURCE = "turnstream-replay-source"
_OURS = {REPLAY_ID, REPLAY_SOURCE}
Counted = Callable[[int, int], None]  # (copied, already there) since the last call
CLOSE_S = 10.0


@asynccontextmanager
async def replay_clients(
    settings: Settings, target: str
) -> AsyncIterator[tuple[AIOKafkaConsumer, BatchSender]]:
    """The consumer and the producer that one process of a replay copies with."""
    largest = max(spec.max_message_bytes for spec in settings.topics)
    async with (
        range_consumer(settings, raw=True) as consumer,
        batch_sender(settings, f"replayed records to {target}", largest) as out,
    ):
        yield consumer, out


async def copy_span(
    consumer: AIOKafkaConsumer,
    out: BatchSender,
    span: TopicRange,
    target: str,
    same_layout: bool,
    done: set[str],
    replay_id: str,
    counted: Counted,
) -> None:
    """Copy ``span``, but the sources in ``done``, into ``target`` (the same partition when
    ``same_layout``, else the one the key picks); ``counted`` after each fetch."""
    rid = (REPLAY_ID, replay_id.encode())
    async for fetched in read_range(consumer, span):
        copied = already = 0
        for tp, records in fetched.items():
            prefix = f"{tp.topic}/{tp.partition}/"
            fresh = [r for r in records if prefix + str(r.offset) not in done] if done else records
            already += len(records) - len(fresh)
            source = prefix.encode()
            copies = (
                (r.key, r.value, r.timestamp, _headers(r.headers, rid, source, r.offset))
                for r in fresh
            )
            if same_layout:
                await out.add(target, tp.partition, copies)
            else:
                for key, value, timestamp_ms, headers in copies:
                    await out.add_keyed(target, key, value, timestamp_ms, headers)
            copied += len(fresh)
        counted(copied, already)


def _headers(headers: list[Header], replay_id: Header, source: bytes, offset: int) -> list[Header]:
    """The source's headers (but an earlier replay's) and this copy's replay id and source;
    ``headers``, the fetched record's own list, is extended in place."""
    for name, _ in headers:
        if name in _OURS:
            headers = [h for h in headers if h[0] not in _OURS]
            break
    headers += (replay_id, (REPLAY_SOURCE, b"%s%d" % (source, offset)))
    return headers


class Helper:
    """A forked process that copies the share of a replay it is given (or nothing)."""

    def __init__(self, settings: Settings, target: str) -> None:
        fork = multiprocessing.get_context("fork")
        self._conn, theirs = fork.Pipe()
        self._process = fork.Process(
            target=_helper_main, args=(settings, target, theirs), name="replay-helper", daemon=True
        )
        self._process.start()
        theirs.close()
        self._given = False

    def start(self) -> None:
        """Let the helper start its clients (the replay's own have started)."""
        with contextlib.suppress(OSError):
            self._conn.send("start")

    def give(self, share: TopicRange, done: set[str], same_layout: bool, replay_id: str) -> bool:
        """Hand ``share`` over; False when the helper is gone (it could not start its clients)."""
        mine = {f"{share.topic}/{p}/" for p in share.spans}
        done = {d for d in done if d[: d.rindex("/") + 1] in mine}
        try:
            self._conn.send((share, done, same_layout, replay_id))
        except OSError:
            return False
        self._given = True
        return True

    async def copied(self, counted: Counted) -> None:
        """Wait until the share is copied and acknowledged, passing its counts on."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def read() -> None:
            try:
                while not finished.done() and self._conn.poll():
                    kind, *rest = self._conn.recv()
                    if kind == "counted":
                        counted(*rest)
                    elif kind == "done":
                        finished.set_result(None)
                    else:
                        finished.set_exception(BrokerError(f"replay helper process: {rest[0]}"))
            except (EOFError, OSError):
                finished.set_exception(
                    BrokerError(
                        "the replay helper process exited before its share was copied; "
                        "run the same replay again: what was copied is skipped"
                    )
                )

        loop.add_reader(self._conn.fileno(), read)
        try:
            await finished
        finally:
            loop.remove_reader(self._conn.fileno())

    def close(self, finished: bool) -> None:
        """Wait for a helper that ``finished`` its share to exit (bounded). Stop one at once
        that was given nothing (it holds nothing of the replay's: a small range, or a replay
        that failed to start), or whose replay failed or was interrupted (what it copied is
        skipped by the next run); kill it if it does not stop."""
        if self._given and finished:
            self._process.join(CLOSE_S)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(CLOSE_S / 2)
        if self._process.is_alive():  # stopped, or deaf to SIGTERM
            self._process.kill()
            self._process.join(CLOSE_S)
        self._conn.close()


def _helper_main(settings: Settings, target: str, conn: Connection) -> None:
    try:
        asyncio.run(_help(settings, target, conn))
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        message = str(exc) if isinstance(exc, TurnstreamError) else repr(exc)
        with contextlib.suppress(OSError):
            conn.send(("failed", message))
    finally:
        conn.close()


async def _help(settings: Settings, target: str, conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    if await loop.run_in_executor(None, conn.recv) is None:  # the replay could not start
        return
    async with replay_clients(settings, target) as (consumer, out):
        job = await loop.run_in_executor(None, conn.recv)
        if job is None:
            return
        share, done, same_layout, replay_id = job
        await copy_span(
            consumer,
            out,
            share,
            target,
            same_layout,
            done,
            replay_id,
            lambda copied, already: conn.send(("counted", copied, already)),
        )
        await out.flush()
    conn.send(("done",))
