"""The capture proxy: an OpenAI-compatible front for the policy server that streams turns."""
