"""A plain Faust member of a consumer group, for the rebalance test of the Faust repairs.

    python -m tests.kafka.faust_member BOOTSTRAP GROUP TOPIC DATADIR

Joins ``GROUP`` on ``TOPIC`` (so the other member's partitions are revoked) and
reads without acknowledging until it is stopped.
"""

from __future__ import annotations

import sys

import faust

bootstrap, group, topic, datadir = sys.argv[1:5]
app = faust.App(
    group, broker=f"kafka://{bootstrap}", store="memory://", web_enabled=False, datadir=datadir,
    consumer_auto_offset_reset="earliest", broker_session_timeout=10,
)  # fmt: skip
records = app.topic(topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                    value_serializer="raw")  # fmt: skip


@app.agent(records)
async def read(stream):  # type: ignore[no-untyped-def]
    async for _event in stream.noack().events():
        pass


if __name__ == "__main__":
    from faust.worker import Worker

    Worker(app, loglevel="warning", quiet=True).execute_from_commandline()
