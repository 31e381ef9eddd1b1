"""Policy-server simulator: a test double for SGLang's weight-update endpoint.

It accepts ``POST /update_weights_from_disk`` (recording each path, optionally
failing the first N calls) and reports what it received at ``GET /sim/updates``.
It is no model.

    python -m pipeline.testing.policy_sim --port 30020 [--fail-first 2]
"""

from __future__ import annotations

import argparse
from typing import Any

from aiohttp import web


class PolicySimulator:
    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.calls = 0
        self.loaded: list[str] = []

    async def update_weights(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        self.calls += 1
        if self.calls <= self.fail_first:
            return web.json_response({"success": False, "message": "simulated failure"}, status=503)
        self.loaded.append(str(body.get("model_path")))
        return web.json_response({"success": True, "message": "loaded (simulator)"})

    async def updates(self, _request: web.Request) -> web.Response:
        return web.json_response({"calls": self.calls, "loaded": self.loaded})

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "simulator": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/update_weights_from_disk", self.update_weights)
        app.router.add_get("/sim/updates", self.updates)
        app.router.add_get("/health", self.health)
        return app


def main() -> None:
    parser = argparse.ArgumentParser(description="Policy-server simulator (a test double).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30020)
    parser.add_argument("--fail-first", type=int, default=0)
    args = parser.parse_args()
    web.run_app(PolicySimulator(args.fail_first).app(), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
