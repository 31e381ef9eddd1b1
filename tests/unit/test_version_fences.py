"""Each repair of a library checks, itself, that the installed version is one it was tested
with: the installed versions pass, another is refused with a message that says what to do."""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest

from pipeline.broker import clients
from pipeline.errors import ConfigError, TurnstreamError
from pipeline.scoring.faust_fixes import drain


def test_the_installed_kafka_python_passes_the_login_repairs_check() -> None:
    found = clients.check_versions()
    assert found == {"kafka-python": importlib.metadata.version("kafka-python")}


def test_another_kafka_python_is_refused_naming_what_to_do() -> None:
    with pytest.raises(ConfigError) as refused:
        clients.check_versions({"kafka-python": "3.1.0"})
    assert str(refused.value) == (
        "kafka-python 3.1.0 is installed, but the SASL login repair of kafka-python's "
        "connection manager (pipeline/broker/clients.py) was tested with 3.0.x only: install "
        "a tested version (pip install -e .) or re-run the kafka tests of "
        "tests/kafka/test_security.py and extend TESTED"
    )
    assert isinstance(refused.value, TurnstreamError)


def test_the_first_kafka_python_client_built_checks_the_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(clients, "_checked", False)
    monkeypatch.setitem(clients.TESTED, "kafka-python", ("2.0.",))
    with pytest.raises(ConfigError, match=r"kafka-python 3\.0\.\d+ is installed.*2\.0\.x only"):
        clients._net_client()  # what every client we build calls for its network client
    assert clients._checked is False  # refused: the next client checks again


def test_the_installed_faust_and_mode_pass_the_drain_repairs_check() -> None:
    found = drain.check_versions()
    assert set(found) == {"faust-streaming", "mode-streaming"}
    assert found == drain.VERSIONS  # checked when the module was imported


def test_another_mode_is_refused_by_the_drain_repair_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match=r"mode-streaming 0\.8\.0 is installed, but the quick"):
        drain.check_versions({"mode-streaming": "0.8.0"})
    with pytest.raises(ConfigError, match=r"faust-streaming 0\.16\.1 .* 0\.15\.x only"):
        drain.check_versions({"faust-streaming": "0.16.1"})
    real = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "0.16.1" if name == "faust-streaming" else real(name),
    )
    try:  # importing drain alone checks (no other faust_fixes module needs to come first)
        with pytest.raises(ConfigError, match=r"faust-streaming 0\.16\.1 is installed"):
            importlib.reload(drain)
    finally:
        monkeypatch.undo()
        importlib.reload(drain)
