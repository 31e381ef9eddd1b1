"""The trainer: samples.scored into policy updates (losses, engine, consumer)."""
