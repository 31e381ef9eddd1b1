"""Repairs of faust-streaming (and its aiokafka consumer) that the scoring worker relies on.

Each module answers one upstream behaviour, names it, and says when it can go:

- ``acks``: an input is acknowledged only once its outputs are stored (Faust's
  ``send`` returns once buffered; a refused send is only logged);
- ``sessions``: a session's table state is written to its changelog only once
  the pairs it implies are stored (Faust writes the changelog at once);
- ``guard``: records a stream skipped at start-up or a rebalance are read back;
- ``handover``: positions handled on revoked partitions are committed before
  they move (Faust drops those acks first), and an idle worker commits past
  records the guard read back (Faust never delivered them, so never acks them);
- ``drain``: a fetched record reaches its stream without four tasks a record
  (Faust races each delivery against three events); it checks the versions it
  was tested with when imported;
- ``adapter``: the one module that touches Faust's private attributes; it
  checks the installed versions when imported. It also runs Faust's consumer
  on the app's event loop (Faust runs it in a thread of its own, so every fetch
  crosses threads and waits its turn at the GIL).
"""
