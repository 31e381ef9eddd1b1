"""Rollout processors: an agent run on one task, through the policy and its tools.

A task is a ``RolloutInput``; a processor's ``process`` (sync or async)
returns a ``RolloutOutput`` with the trajectory's messages and a task status.
``trace_client`` gives the processor an OpenAI client on the task's policy and
``trace_tool`` wraps its tools; both record each call on ``input.trace``.
``run_rollout`` runs one task as a stage does: within its timeout, and a
FAILED output for whatever goes wrong in ``process``.
"""

from pipeline.rollouts.client import TracedAsyncOpenAI, TracedOpenAI, trace_client
from pipeline.rollouts.protocols import (
    AbstractRolloutProcessor,
    RolloutProcessor,
    run_rollout_processor,
)
from pipeline.rollouts.run import on_model, rollout_input, run_rollout
from pipeline.rollouts.trace import ModelCall, RolloutTrace, ToolCall, trace_tool
from pipeline.rollouts.types import ModelResource, RolloutInput, RolloutOutput, SamplingParams

__all__ = [
    "AbstractRolloutProcessor",
    "ModelCall",
    "ModelResource",
    "RolloutInput",
    "RolloutOutput",
    "RolloutProcessor",
    "RolloutTrace",
    "SamplingParams",
    "ToolCall",
    "TracedAsyncOpenAI",
    "TracedOpenAI",
    "on_model",
    "rollout_input",
    "run_rollout",
    "run_rollout_processor",
    "trace_client",
    "trace_tool",
]
