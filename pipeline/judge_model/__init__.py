"""A small judge (PRM) trained from labelled next states, served like any SGLang judge.

``examples`` turns a gold file into prompts (the project's own eval and hint
prompts) and the answers the worker parses; ``stack`` runs the frozen and the
trained layers with the prompts' shared system prefix computed once; ``tune``
is ``turnstream judge train``; ``build`` makes the default judge into the
models cache.
"""
