"""The scoring stage: pair each main turn with its next state, judge it, mask it."""
