"""`turnstream console`: a read-mostly web page over the live topics.

:mod:`~pipeline.console.index` holds a bounded, in-memory index of scored samples per
policy version (pure, no I/O); :mod:`~pipeline.console.reader` fills it from
samples.scored, policy.versions and reviews on a thread of its own;
:mod:`~pipeline.console.figures`, :mod:`~pipeline.console.svg` and
:mod:`~pipeline.console.views` turn a snapshot of it into HTML and SVG (pure functions);
:mod:`~pipeline.console.server` serves them with aiohttp and writes human verdicts to
``reviews``, which :mod:`~pipeline.console.reviews` turns into a judge's gold set.
"""
