#!/usr/bin/env bash
# POST a rollout task to `turnstream rollout serve` and print the RolloutOutput it answers.
#   turnstream rollout serve --processor functions.rollout.rollout_only.DemoRolloutProcessor \
#       --model-url http://127.0.0.1:30001/v1      # (from examples/sdk)
#   examples/rollouts/query.sh [PORT] [TASK.json]
# PORT: the first argument, else $ROLLOUT_PORT, else 30030; TASK.json: the second argument,
# else the SDK guide's examples/sdk/resources/rollout_input.json. Exits non-zero unless the
# server answers 200 (a FAILED rollout is a 200 too: read "status" in the output).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
port="${1:-${ROLLOUT_PORT:-30030}}"
task="${2:-$here/../sdk/resources/rollout_input.json}"
host="${ROLLOUT_HOST:-127.0.0.1}"

curl --silent --show-error --fail-with-body \
    --max-time "${ROLLOUT_QUERY_TIMEOUT:-120}" \
    -H 'Content-Type: application/json' \
    --data-binary "@$task" \
    "http://$host:$port/rollout"
echo
