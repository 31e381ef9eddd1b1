"""The embedded Kafka broker (KRaft), run from Maven Central jars.

``deploy/local/kafka/pom.xml`` names the broker and its log4j2 binding; Maven
copies them into a cache directory and the machine's Java runs
``kafka.tools.StorageTool format`` once, then ``kafka.Kafka``. Nothing of Kafka
is vendored into the repository. By default the client listener is PLAINTEXT;
tests of security give it a ``SaslSslListener``.

One ``LocalKafka`` is one node (broker and controller in one process). Alone it
is a standalone quorum in the data dir itself; as node N of a cluster
(:mod:`pipeline.broker.cluster`) it lives in ``node-N/`` with its ports
``2 * (N - 1)`` above the first node's, and the quorum is every node.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import BrokerError
from pipeline.settings import LocalKafkaSettings

LOG4J2_PROPERTIES = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


@dataclass(frozen=True)
class SaslSslListener:
    """A client listener with TLS and SCRAM-SHA-512 in place of PLAINTEXT.

    The one SCRAM user is created when the storage is formatted; the broker also
    authenticates to itself with it (inter-broker traffic uses the same listener),
    so no plaintext listener is left for clients. The controller listener stays
    PLAINTEXT on loopback.
    """

    keystore: Path  # PKCS12 with the broker's key and certificate (SAN covering the host)
    keystore_password: str
    cafile: Path  # PEM of the CA that signed it: the broker and its clients trust it
    username: str
    password: str

    def client_config(self) -> dict[str, Any]:
        """kafka-python options for a client of this listener."""
        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": self.username,
            "sasl_plain_password": self.password,
            "ssl_cafile": str(self.cafile),
        }


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap: str
    data_dir: Path


class LocalKafka:
    """Start, stop and inspect one local broker (alone, or node ``node`` of ``nodes``)."""

    def __init__(
        self,
        settings: LocalKafkaSettings,
        log: Callable[[str], None] = print,
        sasl_ssl: SaslSslListener | None = None,
        node: int = 1,
        nodes: int = 1,
        cluster_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.log = log
        self.sasl_ssl = sasl_ssl
        self.node, self.nodes, self.cluster_id = node, nodes, cluster_id
        self.port = settings.port + 2 * (node - 1)
        self.controller = settings.controller + 2 * (node - 1)
        root = settings.data_dir.resolve()
        self.data_dir = root if nodes == 1 else root / f"node-{node}"
        self.storage = self.data_dir / "data"
        self.logs = self.data_dir / "logs"
        self.pid_file = self.data_dir / "broker.pid"
        self.properties = self.data_dir / "server.properties"
        self.log4j = self.data_dir / "log4j2.properties"
        self.jars = settings.jars_dir.resolve()

    def resolve_jars(self) -> Path:
        """Copy the broker's jars from Maven Central into the cache (once)."""
        marker = self.jars / ".resolved"
        pom = self.settings.pom.resolve()
        if marker.exists() and marker.read_text() == pom.read_text():
            return self.jars
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError(
                "Maven (mvn) is not on PATH; it resolves the Kafka jars. Install Maven."
            )
        if shutil.which("java") is None:
            raise BrokerError("Java is not on PATH; the local Kafka broker needs Java 17+.")
        self.log(f"resolving Kafka jars from Maven Central into {self.jars} ...")
        shutil.rmtree(self.jars, ignore_errors=True)
        self.jars.mkdir(parents=True, exist_ok=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={self.jars}",
            "-DincludeScope=runtime",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise BrokerError(f"Maven could not resolve the Kafka jars from {pom}:\n{tail}")
        marker.write_text(pom.read_text())
        return self.jars

    @property
    def bootstrap(self) -> str:
        """This node's client address."""
        return f"{self.settings.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.pid() is not None

    def _listener_lines(self) -> list[str]:
        host = self.settings.host
        client = "SASL_SSL" if self.sasl_ssl else "PLAINTEXT"
        lines = [
            f"listeners={client}://{host}:{self.port},CONTROLLER://{host}:{self.controller}",
            f"advertised.listeners={client}://{self.bootstrap}",
            "controller.listener.names=CONTROLLER",
            f"inter.broker.listener.name={client}",
            f"listener.security.protocol.map=CONTROLLER:PLAINTEXT,{client}:{client}",
        ]
        if self.sasl_ssl:
            t = self.sasl_ssl
            lines += [
                "sasl.enabled.mechanisms=SCRAM-SHA-512",
                "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{t.username}" password="{t.password}";',
                "ssl.keystore.type=PKCS12",
                f"ssl.keystore.location={t.keystore.resolve()}",
                f"ssl.keystore.password={t.keystore_password}",
                "ssl.truststore.type=PEM",  # the broker is its own inter-broker client
                f"ssl.truststore.location={t.cafile.resolve()}",
                "ssl.client.auth=none",
            ]
        return lines

    def _quorum_line(self) -> str:
        host = self.settings.host
        if self.nodes == 1:
            return f"controller.quorum.bootstrap.servers={host}:{self.controller}"
        first = self.controller - 2 * (self.node - 1)
        voters = (f"{n}@{host}:{first + 2 * (n - 1)}" for n in range(1, self.nodes + 1))
        return "controller.quorum.voters=" + ",".join(voters)

    def write_configs(self) -> None:
        """server.properties and log4j2.properties of this node, in its directory."""
        # internal topics as the cluster profile of topics.yaml: 3 copies, 2 in sync
        rf, isr = min(self.nodes, 3), min(self.nodes, 2)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.properties.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    f"node.id={self.node}",
                    self._quorum_line(),
                    *self._listener_lines(),
                    f"log.dirs={self.storage}",
                    "num.partitions=1",
                    "auto.create.topics.enable=false",
                    f"offsets.topic.replication.factor={rf}",
                    f"transaction.state.log.replication.factor={rf}",
                    f"transaction.state.log.min.isr={isr}",
                    f"share.coordinator.state.topic.replication.factor={rf}",
                    f"share.coordinator.state.topic.min.isr={isr}",
                    "group.initial.rebalance.delay.ms=0",
                    "message.max.bytes=16777216",
                    "",
                ]
            )
        )
        self.log4j.write_text(LOG4J2_PROPERTIES.format(log=self.logs / "server.log"))

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            "java",
            f"-Xmx{self.settings.heap}",
            f"-Xms{self.settings.heap}",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j}",
            f"-Dkafka.logs.dir={self.logs}",
            "-cp",
            f"{self.jars}/*",
            main,
            *args,
        ]

    def _format_storage(self) -> None:
        if (self.storage / "meta.properties").exists():
            return
        cluster_id = self.cluster_id or new_cluster_id()
        cmd = self._java(
            "kafka.tools.StorageTool",
            "format",
            # one argument: a random id may start with '-', which argparse takes for an option
            f"--cluster-id={cluster_id}",
            "-c",
            str(self.properties),
            # alone: a quorum of one; in a cluster the voters are in the properties
            *(["--standalone"] if self.nodes == 1 else []),
            *(
                ["--add-scram", f"SCRAM-SHA-512=[name={t.username},password={t.password}]"]
                if (t := self.sasl_ssl)
                else []
            ),
        )
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
            raise BrokerError(f"formatting Kafka storage in {self.storage} failed:\n{tail}")

    def pid(self) -> int | None:
        """The pid of the broker this data dir started, if it is still that process."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            return None
        return pid if "kafka.Kafka" in cmdline and str(self.properties) in cmdline else None

    def status(self) -> BrokerStatus:
        pid = self.pid()
        return BrokerStatus(pid is not None, pid, self.bootstrap, self.data_dir)

    def start(self) -> BrokerStatus:
        """Start the broker unless it runs already; return once it answers metadata."""
        if self.pid() is not None:
            self.log(f"Kafka already running at {self.bootstrap} (pid {self.pid()})")
            return self.status()
        self.resolve_jars()
        started = time.monotonic()
        proc = self.launch()
        self.wait_ready(proc)
        self.log(
            f"Kafka ready at {self.bootstrap} (pid {proc.pid}) in {time.monotonic() - started:.1f}s"
        )
        return self.status()

    def launch(self) -> subprocess.Popen[bytes]:
        """Write the configs, format the storage once and start the process (no waiting:
        a node of a cluster answers only once a majority of the quorum is up)."""
        self.check_ports()
        self.write_configs()
        self._format_storage()
        out = open(self.logs / "broker.out", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(
            self._java("kafka.Kafka", str(self.properties)),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        self.pid_file.write_text(str(proc.pid))
        return proc

    def check_ports(self) -> None:
        """Refuse, before anything starts, ports another process holds."""
        for port in (self.port, self.controller):
            if _port_in_use(self.settings.host, port):
                raise BrokerError(
                    f"port {self.settings.host}:{port} is already in use by another process; "
                    "stop it or choose other ports with TURNSTREAM_KAFKA_PORT / "
                    "TURNSTREAM_KAFKA_CONTROLLER_PORT"
                )

    def wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise BrokerError(
                    f"Kafka exited with code {proc.returncode} while starting.\n{self.log_tail()}"
                )
            secure = self.sasl_ssl.client_config() if self.sasl_ssl else {}
            if _port_in_use(self.settings.host, self.port) and _answers_metadata(
                self.bootstrap, secure
            ):
                return
            time.sleep(0.5)
        self.stop()
        raise BrokerError(
            f"Kafka did not answer a metadata request within "
            f"{self.settings.start_timeout_s:.0f}s; stopped it.\n{self.log_tail()}"
        )

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the broker this data dir started (and nothing else). True if one was stopped."""
        return self.terminate() and self.wait_stopped(timeout_s)

    def terminate(self) -> bool:
        """SIGTERM to the broker (a controlled shutdown); False when none runs."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        os.kill(pid, signal.SIGTERM)
        return True

    def kill(self) -> int:
        """SIGKILL to the broker, reaped; its pid. For fault tests: nothing is flushed."""
        pid = self.pid()
        if pid is None:
            raise BrokerError(f"no broker runs from {self.data_dir}")
        _kill_reaped(pid)
        self.pid_file.unlink(missing_ok=True)
        return pid

    def wait_stopped(self, timeout_s: float = 30.0) -> bool:
        """Wait for a terminated broker to exit, SIGKILL it past ``timeout_s``."""
        pid = self.pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        if _alive(pid):
            self.log(f"Kafka (pid {pid}) did not stop within {timeout_s:.0f}s; killing it")
            _kill_reaped(pid)
        self.pid_file.unlink(missing_ok=True)
        return True

    def log_tail(self, lines: int = 30) -> str:
        chunks = []
        for name in ("broker.out", "server.log"):
            path = self.logs / name
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                chunks.append(f"--- last lines of {path} ---\n" + "\n".join(text))
        return "\n".join(chunks) or f"(no broker log under {self.logs})"


def new_cluster_id() -> str:
    """A random KRaft cluster id (what ``kafka-storage random-uuid`` prints)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _kill_reaped(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    while _alive(pid):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        # A zombie child of ours still "exists"; reap it if it is one.
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


def free_port_pair() -> int:
    """A port p with p and p + 1 both free on 127.0.0.1."""
    return free_ports(2)


def free_ports(count: int) -> int:
    """A port p with p .. p + count - 1 all free on 127.0.0.1 (a cluster's nodes)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + count - 1 > 65535:
            continue
        if all(_bindable(port + i) for i in range(1, count)):
            return port
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def admin_for(bootstrap: str, client_config: dict[str, Any] | None = None) -> Any:
    """A kafka-python admin client of one local node, quick to give up (3 s)."""
    from kafka import KafkaAdminClient

    return KafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=3000,
        bootstrap_timeout_ms=3000,
        **(client_config or {}),
    )


def _answers_metadata(bootstrap: str, client_config: dict[str, Any]) -> bool:
    from kafka.errors import KafkaError

    try:
        admin = admin_for(bootstrap, client_config)
    except (KafkaError, OSError, ValueError):
        return False
    try:
        admin.list_topics()
        return True
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()
