"""`turnstream learn`: the learning loop closed on one machine.

A simulated user population talks to the real policy through the capture
proxy; their replies are the next states the scoring worker judges; the
trainer learns from the samples and pushes its weights back to the server the
users talk to. The run measures what the product exists for: the policy gets
better at what its users prefer, against a control run with learning off.
"""
