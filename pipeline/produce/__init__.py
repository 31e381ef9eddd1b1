"""Getting input events into ``chat.turns``."""

from pipeline.produce.jsonl import LineError, ProduceReport, produce_file, validate_file
from pipeline.produce.producer import TurnProducer

__all__ = ["LineError", "ProduceReport", "TurnProducer", "produce_file", "validate_file"]
