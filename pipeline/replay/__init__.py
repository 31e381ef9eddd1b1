"""Replay: copy topic ranges, re-score past pairs, move consumer groups."""
