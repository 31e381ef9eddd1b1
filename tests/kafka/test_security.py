"""Security: every client over SASL_SSL with SCRAM-SHA-512, wrong passwords, bearer auth, secrets.

One broker of this module's own has a single client listener, SASL_SSL with
SCRAM-SHA-512 (TLS certificates made here with openssl), so every success
below went through TLS and a SCRAM login. Every process runs with distinctive
secrets, and everything they write is scanned for them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from kafka.admin import NewTopic
from pydantic import SecretStr

from pipeline.broker.clients import admin_client
from pipeline.broker.local import LocalKafka, SaslSslListener, free_port_pair
from pipeline.events import Sample, Turn, decode_as, decode_input
from pipeline.settings import KafkaSettings, LocalKafkaSettings, Settings, load_settings
from tests.conftest import REPO
from tests.kafka.helpers import read_all, spawn, turnstream, wait_http
from tests.kafka.test_scoring_e2e import stop
from tests.kafka.test_trainer import write_config

pytestmark = pytest.mark.slow

EXAMPLES = REPO / "examples" / "sessions.jsonl"
USER = "alice"


@dataclass(frozen=True)
class SecureBroker:
    bootstrap: str
    cafile: Path
    password: str
    keystore_password: str
    server_log: Path

    def log_end(self) -> int:
        return self.server_log.stat().st_size

    def refused_logins_since(self, since: int, timeout_s: float = 60.0) -> list[str]:
        """The logins the broker refused after byte ``since`` of its log (it says so once per
        connection), up to an end marker: a TLS handshake this makes fail now, which the
        broker logs after every connection refused before it."""
        host, port = self.bootstrap.rsplit(":", 1)
        with (
            socket.create_connection((host, int(port)), timeout=10) as sock,
            contextlib.suppress(OSError),
        ):
            sock.sendall(b"not a TLS record\r\n" * 4)
            while sock.recv(4096):  # until the broker closes it
                pass
        deadline = time.monotonic() + timeout_s
        while True:
            with self.server_log.open("rb") as log:
                log.seek(since)
                lines = log.read().decode(errors="replace").splitlines()
            refused = [line for line in lines if "Failed authentication with" in line]
            for i, line in enumerate(refused):
                if "SSL handshake failed" in line:
                    return refused[:i]
            assert time.monotonic() < deadline, "the broker did not log the end marker"
            time.sleep(0.2)


def make_certificates(out: Path, keystore_password: str) -> tuple[Path, Path]:
    """A CA, and a broker certificate for 127.0.0.1 it signed, as a PKCS12 keystore."""

    def openssl(command: str) -> None:
        subprocess.run(["openssl", *command.split()], cwd=out, check=True, capture_output=True)

    openssl(
        "req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem"
    )
    openssl("req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout broker.key -out broker.csr")
    (out / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl(
        "x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
        "-extfile san.ext -out broker.pem"
    )
    openssl(
        "pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker "
        f"-out broker.p12 -passout pass:{keystore_password}"
    )
    return out / "broker.p12", out / "ca.pem"


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """A broker whose only client listener is SASL_SSL (SCRAM-SHA-512), for this module."""
    tls = tmp_path_factory.mktemp("tls")
    keystore_password = f"ks-{uuid.uuid4().hex}"
    password = f"pw-{uuid.uuid4().hex}"
    keystore, cafile = make_certificates(tls, keystore_password)
    local = LocalKafka(
        LocalKafkaSettings(
            port=free_port_pair(), data_dir=tmp_path_factory.mktemp("secure-kafka"), heap="512M"
        ),
        log=lambda _msg: None,
        sasl_ssl=SaslSslListener(keystore, keystore_password, cafile, USER, password),
    )
    local.start()
    try:
        yield SecureBroker(
            local.settings.bootstrap,
            cafile,
            password,
            keystore_password,
            local.logs / "server.log",
        )
    finally:
        local.stop()


def secure_env(broker: SecureBroker, topic_prefix: str, password: str | None = None) -> dict:
    """The environment of a `turnstream` process that reaches the broker over SASL_SSL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "TURNSTREAM_"))}
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap,
        KAFKA_SECURITY_PROTOCOL="SASL_SSL",
        KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
        KAFKA_SASL_USERNAME=USER,
        KAFKA_SASL_PASSWORD=password or broker.password,
        KAFKA_SSL_CAFILE=str(broker.cafile),
        TURNSTREAM_TOPIC_PREFIX=topic_prefix,
    )
    return env


def secure_settings(broker: SecureBroker, topic_prefix: str) -> Settings:
    kafka = KafkaSettings(
        bootstrap_servers=broker.bootstrap,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username=USER,
        sasl_password=SecretStr(broker.password),
        ssl_cafile=broker.cafile,
    )
    return Settings(kafka=kafka, topic_prefix=topic_prefix, producer_linger_ms=0)


def assert_no_secret(texts: dict[str, str], *secrets: str) -> None:
    for name, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"a secret appears in {name}"


def main_turn_ids() -> set[str]:
    events = [decode_input(line) for line in EXAMPLES.read_bytes().splitlines()]
    return {e.sample_id for e in events if isinstance(e, Turn) and e.turn_type == "main"}


def test_producer_worker_trainer_and_replay_work_over_sasl_ssl(
    secure_broker: SecureBroker, topic_prefix: str, tmp_path: Path
) -> None:
    env = secure_env(secure_broker, topic_prefix)
    settings = secure_settings(secure_broker, topic_prefix)
    outputs: dict[str, str] = {}

    def run(name: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        done = turnstream(*args, env=env, timeout=timeout)
        outputs[name] = done.stdout + done.stderr
        assert done.returncode == 0, f"{name}: {outputs[name][-3000:]}"
        return done

    run("topics apply", "topics", "apply")
    assert "sent 310 event(s)" in run("produce", "produce", str(EXAMPLES)).stderr

    sim_port = free_port_pair()
    sim = spawn(["pipeline.testing.judge_sim", "--port", str(sim_port)], tmp_path / "sim.log")
    judge = f"http://127.0.0.1:{sim_port}"
    wait_http(judge + "/health", sim)
    worker = spawn(
        ["pipeline.cli", "worker", "--judge", "sglang", "--judge-url", judge, "--web-port", "0",
         "--data-dir", str(tmp_path / "worker"), "--loglevel", "debug"],
        tmp_path / "worker.log",
        env,
    )  # fmt: skip
    expected = main_turn_ids()
    try:
        deadline = time.monotonic() + 150
        scored: set[str] = set()
        while scored != expected:
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"{len(scored)} of {len(expected)} scored"
            time.sleep(2)
            records = read_all(settings, settings.topics.samples_scored.name)
            scored = {decode_as(Sample, r.value).sample_id for r in records}
    finally:
        stop([worker, sim])
    outputs["worker (debug)"] = (tmp_path / "worker.log").read_text(errors="replace")
    assert "Authenticated as alice via SASL / SCRAM-SHA-512" in outputs["worker (debug)"]

    ledger = tmp_path / "ledger.tsv"
    config = write_config(tmp_path, None)
    trained = run("train", "train", "--config", str(config), "--until-end", "--max-steps", "2",
                  "--ledger", str(ledger), timeout=300)  # fmt: skip
    assert "trained 2 step(s)" in trained.stdout
    ids = [line.split("\t")[1] for line in ledger.read_text().splitlines()]
    assert len(ids) == 8 and set(ids) <= expected  # rollout_batch_size 4, two steps

    target = settings.topic_prefix + "replayed"
    client = admin_client(settings)
    try:
        client.create_topics([NewTopic(target, 1, 1)])
    finally:
        client.close()
    partition = read_all(settings, settings.topics.chat_turns.name)[0].partition
    replayed = run("replay", "replay", "--from", "chat.turns", "--to", target, "--partitions",
                   str(partition), "--start-offsets", f"{partition}:0",
                   "--end-offsets", f"{partition}:5")  # fmt: skip
    assert "copied 5," in replayed.stdout
    assert len(read_all(settings, target)) == 5

    broker_logs = secure_broker.server_log.parent
    for path in broker_logs.iterdir():
        outputs[f"broker {path.name}"] = path.read_text(errors="replace")
    assert_no_secret(outputs, secure_broker.password, secure_broker.keystore_password)


@pytest.mark.parametrize(
    "command",
    [
        ["topics", "apply"],
        ["produce", str(EXAMPLES)],
        ["worker", "--web-port", "0", "--loglevel", "debug"],
        ["train", "--until-end"],
        ["replay", "--from", "chat.turns", "--to", "chat.turns.copy", "--start-offsets", "0:0"],
    ],
    ids=lambda command: command[0],
)
def test_a_wrong_password_fails_fast_with_a_clear_error(
    secure_broker: SecureBroker, topic_prefix: str, tmp_path: Path, command: list[str]
) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    env = secure_env(secure_broker, topic_prefix, password=wrong)
    env["TURNSTREAM_SCORING_DATA_DIR"] = str(tmp_path / "worker")
    if command[0] == "train":
        command = [*command, "--config", str(write_config(tmp_path, None))]
    since = secure_broker.log_end()
    started = time.monotonic()
    done = turnstream(*command, env=env, timeout=90)
    elapsed = time.monotonic() - started
    refused = len(secure_broker.refused_logins_since(since))
    print(f"wrong password, {command[0]}: exit {done.returncode} after {elapsed:.1f}s, "
          f"{refused} refused login(s) in the broker log")  # fmt: skip
    error = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert error.startswith("error: Kafka at " + secure_broker.bootstrap), done.stderr[-2000:]
    for words in ("refused the SASL login of user 'alice'", "authentication failed",
                  "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"):  # fmt: skip
        assert words in error
    assert "Traceback" not in done.stderr
    assert elapsed < 60
    assert 1 <= refused <= 3, "a wrong password must not be retried until a timeout"
    assert_no_secret({command[0]: done.stdout + done.stderr}, wrong, secure_broker.password)


def test_proxy_enforces_bearer_auth_and_keeps_keys_out_of_logs(
    secure_broker: SecureBroker, topic_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api_key = f"key-{uuid.uuid4().hex}"
    env = {**secure_env(secure_broker, topic_prefix), "TURNSTREAM_PROXY_API_KEY": api_key}
    settings = secure_settings(secure_broker, topic_prefix)
    assert turnstream("topics", "apply", env=env).returncode == 0
    sim_port, port = free_port_pair(), free_port_pair()
    sim = spawn(["pipeline.testing.policy_sim", "--port", str(sim_port)], tmp_path / "sim.log")
    wait_http(f"http://127.0.0.1:{sim_port}/health", sim)
    proxy = spawn(
        ["pipeline.cli", "proxy", "--upstream", f"http://127.0.0.1:{sim_port}", "--port",
         str(port), "--data-dir", str(tmp_path / "proxy"), "--loglevel", "debug"],
        tmp_path / "proxy.log",
        env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})

    def post(headers: dict[str, str]) -> int:
        request = urllib.request.Request(url, body, {"Content-Type": "application/json",
                                                     "X-Session-Id": "auth-1",
                                                     "X-Turn-Type": "main", **headers})  # fmt: skip
        try:
            return urllib.request.urlopen(request, timeout=30).status
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proxy)
        assert post({}) == 401
        assert post({"Authorization": "Bearer wrong-key"}) == 401
        assert post({"Authorization": api_key}) == 401  # not a bearer token
        assert post({"Authorization": f"Bearer {api_key}"}) == 200
        deadline = time.monotonic() + 30
        while not (turns := read_all(settings, settings.topics.chat_turns.name)):
            assert time.monotonic() < deadline, (tmp_path / "proxy.log").read_text()[-3000:]
            time.sleep(0.5)
    finally:
        stop([proxy, sim])
    assert [decode_input(r.value).session_id for r in turns] == ["auth-1"]  # only the allowed one
    log = (tmp_path / "proxy.log").read_text(errors="replace")
    assert "Authenticated as alice via SASL / SCRAM-SHA-512" in log

    for name, value in env.items():  # the settings such a process reads
        if name.startswith(("KAFKA_", "TURNSTREAM_")):
            monkeypatch.setenv(name, value)
    loaded = load_settings()
    startup = {"repr(settings)": repr(loaded), "str(settings)": str(loaded)}
    assert loaded.proxy.api_key is not None and loaded.kafka.sasl_password is not None
    assert_no_secret({"proxy (debug)": log, **startup}, api_key, secure_broker.password)
