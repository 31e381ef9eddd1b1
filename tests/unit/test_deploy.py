"""The manifests under deploy/ parse and agree with the code they deploy.

Checked against the code, not against copies of it: environment variables
against the settings classes, commands against the CLI, topics against
topics.yaml, dashboard queries against the registered Prometheus metrics.
Only turnstream containers (image name containing "turnstream") are held to
the settings; Kafka, SGLang, Prometheus and Grafana read their own variables.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.settings import REPO_ROOT, load_settings

DEPLOY = REPO_ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_DIR = DEPLOY / "compose"
DASHBOARD = DEPLOY / "grafana" / "turnstream.json"
CLUSTER = NAMESPACE = "turnstream"  # the `topics export` options given in deploy/README.md
PROFILE = "cluster"  # ... and its --profile, for the three brokers of k8s/kafka.yaml
OPTIONAL_MANIFESTS = {"monitoring.yaml"}  # needs the Prometheus Operator; applied on its own
CUSTOM_KINDS = {"Kafka", "KafkaNodePool", "KafkaTopic", "ScaledObject", "PodMonitor"}
PROMETHEUS_LABELS = {"job", "instance"}  # added by Prometheus to every scraped series


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@cache
def manifests() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml_docs(path)
    ]


def named(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r} in deploy/k8s, found {len(found)}"
    return found[0]


@cache
def services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())["services"]


def interpolate(value: Any) -> str:
    """A compose value with ${VAR:-default} and ${VAR:?message} replaced by a set value."""
    return re.sub(r"\$\{\w+(?::?-([^}]*)|:?\?[^}]*)?\}", lambda m: m[1] or "set", str(value))


# A deployed process, from compose or Kubernetes, in one shape.
@dataclass
class Container:
    where: str  # "compose proxy", "k8s Deployment scoring-worker/worker"
    image: str
    env: dict[str, str]
    argv: list[list[str]]  # one argv per program its command starts
    mounts: dict[str, str]  # mount path -> volume (named volume, claim or host path)
    files: dict[str, str]  # mounted config files: path -> text
    gpus: int
    pod_annotations: dict[str, str]
    pod_labels: dict[str, str]
    ports: dict[str, int]  # Kubernetes container ports: name -> number

    @property
    def deployment(self) -> str:
        return self.where.split()[0]


def programs(command: list[str]) -> list[list[str]]:
    """The argv of each program a command starts (``sh -c "a & exec b"`` starts two)."""
    if command[:2] != ["sh", "-c"]:
        return [command]
    lexer = shlex.shlex(command[2], posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&", "&&", ";", "|", "||"):
            out.append([])
        elif token != "exec" or out[-1]:
            out[-1].append(token)
    return [argv for argv in out if argv]


def compose_mounts(svc: dict[str, Any]) -> dict[str, str]:
    return {t: s for s, t, *_ in (interpolate(v).split(":") for v in svc.get("volumes", []))}


def compose_containers() -> Iterator[Container]:
    for name, svc in services().items():
        assert "env_file" not in svc, f"compose {name}: keep settings in `environment`"
        env = svc.get("environment", {})
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        mounts = compose_mounts(svc)
        files = {
            target: (COMPOSE_DIR / source).read_text()
            for target, source in mounts.items()
            if source.startswith("./") and (COMPOSE_DIR / source).is_file()
        }
        reservations = svc.get("deploy", {}).get("resources", {}).get("reservations", {})
        gpus = sum(len(d.get("device_ids", [])) for d in reservations.get("devices", []))
        command = svc.get("command", [])
        argv = programs([str(a) for a in (command if isinstance(command, list) else [command])])
        yield Container(
            f"compose {name}",
            svc["image"],
            {k: interpolate(v) for k, v in env.items()},
            argv,
            mounts,
            files,
            gpus,
            {},
            {},
            {},
        )


def pod_templates() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in manifests():
        spec = doc.get("spec", {})
        if doc["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if doc["kind"] in ("Deployment", "StatefulSet", "Job", "CronJob"):
            yield f"k8s {doc['kind']} {doc['metadata']['name']}", spec["template"]


def pod_mounts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claim = {n: v.get("persistentVolumeClaim", {}).get("claimName", n) for n, v in volumes.items()}
    return {m["mountPath"]: claim[m["name"]] for m in container.get("volumeMounts", [])}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert "prefix" not in source, source
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        doc = named(kind, (source.get("configMapRef") or source["secretRef"])["name"])
        env.update({**doc.get("data", {}), **doc.get("stringData", {})})
    for var in container.get("env", []):
        ref = var.get("valueFrom", {})
        key_ref = ref.get("configMapKeyRef") or ref.get("secretKeyRef")
        value = var.get("value", "")
        if key_ref:
            doc = named("ConfigMap" if "configMapKeyRef" in ref else "Secret", key_ref["name"])
            value = {**doc.get("data", {}), **doc.get("stringData", {})}[key_ref["key"]]
        env[var["name"]] = value
    return env


def k8s_containers() -> Iterator[Container]:
    for where, template in pod_templates():
        pod = template["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod.get("initContainers", []) + pod["containers"]:
            files = {}
            for m in c.get("volumeMounts", []):
                config_map = volumes[m["name"]].get("configMap")
                if config_map:
                    for key, text in named("ConfigMap", config_map["name"])["data"].items():
                        files[f"{m['mountPath']}/{key}"] = text
            yield Container(
                f"{where}/{c['name']}",
                c["image"],
                env_of(c),
                programs([str(a) for a in c.get("command", []) + c.get("args", [])]),
                pod_mounts(pod, c),
                files,
                int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)),
                template.get("metadata", {}).get("annotations", {}),
                labels(template),
                {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p},
            )


@cache
def turnstream_containers() -> list[Container]:
    found = [c for c in [*compose_containers(), *k8s_containers()] if "turnstream" in c.image]
    assert len(found) >= 9, [c.where for c in found]
    return found


# ------------------------------------------------------------------ parsing


def test_every_manifest_parses_and_kustomize_lists_each() -> None:
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and "local" not in p.parts]
    for path in files:
        if path.suffix in (".yaml", ".yml"):
            assert yaml_docs(path), f"{path}: empty"
        elif path.suffix == ".json":
            json.loads(path.read_text())
    for doc in manifests():
        assert {"apiVersion", "kind", "metadata"} <= set(doc) and doc["metadata"]["name"], doc
    listed = set(yaml_docs(K8S / "kustomization.yaml")[0]["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk - OPTIONAL_MANIFESTS


def test_builtin_kinds_match_the_kubernetes_schemas() -> None:
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate (dev extra) bundles the schemas"
    )
    unchecked = set()
    for doc in manifests():
        if doc["kind"] in CUSTOM_KINDS:
            unchecked.add(doc["kind"])  # CRDs: checked field by field below
            continue
        for version in ("1.29.0", kv.latest_version()):  # an older release and the newest
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{doc['kind']} {doc['metadata']['name']} {path}: {exc.message}")
    assert unchecked == CUSTOM_KINDS


# ------------------------------------------------------- Kafka, topics, KEDA


def test_kafka_topic_manifests_are_the_export_of_topics_yaml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline.topics.admin import export_strimzi

    for name in (
        "TURNSTREAM_TOPICS_FILE",
        "TURNSTREAM_TOPIC_PREFIX",
        "TURNSTREAM_TOPICS_PROFILE",
        "TURNSTREAM_CONFIG",
    ):
        monkeypatch.delenv(name, raising=False)
    pods = named("ConfigMap", "turnstream-settings")["data"].get("TURNSTREAM_TOPICS_PROFILE")
    assert pods == PROFILE, "the pods must read the profile the manifests are exported with"
    expected = export_strimzi(load_settings(topics_profile=PROFILE).topics, CLUSTER, NAMESPACE)
    assert (K8S / "kafka-topics.yaml").read_text() == expected, (
        "deploy/k8s/kafka-topics.yaml is stale: regenerate it as deploy/README.md says"
    )


def test_kafka_topics_fit_the_strimzi_brokers(monkeypatch: pytest.MonkeyPatch) -> None:
    """No topic asks for more replicas than there are brokers, and an acks=all write is
    acknowledged on two of them, so it survives one broker lost, and writes go on then."""
    from pipeline.topics import load_topics

    monkeypatch.delenv("TURNSTREAM_TOPICS_FILE", raising=False)
    profile = load_topics(load_settings().topics_file, profile=PROFILE)
    [pool] = [d for d in manifests() if d["kind"] == "KafkaNodePool"]
    brokers = pool["spec"]["replicas"]
    topics = [d for d in manifests() if d["kind"] == "KafkaTopic"]
    assert {d["spec"]["topicName"] for d in topics} == {s.name for s in profile}
    for doc in topics:
        where, spec = f"KafkaTopic {doc['metadata']['name']}", doc["spec"]
        min_insync = spec["config"]["min.insync.replicas"]
        assert min_insync == profile[spec["topicName"]].configs["min.insync.replicas"], where
        assert 2 <= int(min_insync) < spec["replicas"] <= brokers, where
    # The topics Kafka and Faust create themselves (offsets, transactions, changelogs).
    broker = named("Kafka", CLUSTER)["spec"]["kafka"]["config"]
    rf = broker["default.replication.factor"]
    assert rf == profile.chat_turns.replication_factor <= brokers
    assert broker["offsets.topic.replication.factor"] == rf
    assert broker["transaction.state.log.replication.factor"] == rf
    assert str(broker["min.insync.replicas"]) == profile.chat_turns.configs["min.insync.replicas"]
    assert broker["transaction.state.log.min.isr"] == broker["min.insync.replicas"]


def test_strimzi_cluster_has_what_the_topics_and_clients_need() -> None:
    kafka = named("Kafka", CLUSTER)
    assert kafka["metadata"]["namespace"] == NAMESPACE
    assert "topicOperator" in kafka["spec"]["entityOperator"], "KafkaTopics need it"
    plain = [x for x in kafka["spec"]["kafka"]["listeners"] if not x["tls"]]
    assert plain and {"name", "port", "type"} <= set(plain[0])
    bootstrap = f"{CLUSTER}-kafka-bootstrap:{plain[0]['port']}"
    assert named("ConfigMap", "turnstream-settings")["data"]["KAFKA_BOOTSTRAP_SERVERS"] == bootstrap
    pools = [d for d in manifests() if d["kind"] == "KafkaNodePool"]
    assert {r for p in pools for r in p["spec"]["roles"]} == {"controller", "broker"}
    for pool in pools:
        assert pool["metadata"]["labels"]["strimzi.io/cluster"] == CLUSTER
        assert pool["spec"]["replicas"] >= 1 and pool["spec"]["storage"]["type"]
    broker_max = kafka["spec"]["kafka"]["config"]["message.max.bytes"]
    assert broker_max >= max(t.max_message_bytes for t in load_settings().topics)


def test_keda_scales_the_workers_on_their_own_group_lag() -> None:
    settings = load_settings()
    scoring = {t.name: t for t in (settings.topics.chat_turns, settings.topics.turns_paired)}
    bootstrap = named("ConfigMap", "turnstream-settings")["data"]["KAFKA_BOOTSTRAP_SERVERS"]
    group = named("ConfigMap", "turnstream-scoring")["data"].get(
        "TURNSTREAM_SCORING_GROUP_ID", settings.scoring.group_id
    )
    scaled = named("ScaledObject", "scoring-worker")["spec"]
    named("Deployment", scaled["scaleTargetRef"]["name"])
    triggers = {t["metadata"]["topic"]: t for t in scaled["triggers"]}
    assert set(triggers) == set(scoring)
    for topic, trigger in triggers.items():
        meta = trigger["metadata"]
        assert trigger["type"] == "kafka" and int(meta["lagThreshold"]) > 0
        assert (meta["bootstrapServers"], meta["consumerGroup"]) == (bootstrap, group)
        assert 1 <= scaled["minReplicaCount"] <= scaled["maxReplicaCount"]
        assert scaled["maxReplicaCount"] <= scoring[topic].partitions, "idle workers"


def test_references_between_manifests_resolve() -> None:
    pods = list(pod_templates())
    for _, template in pods:
        pod = template["spec"]
        for volume in pod.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                named("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
            if "configMap" in volume:
                named("ConfigMap", volume["configMap"]["name"])
        if "serviceAccountName" in pod:
            named("ServiceAccount", pod["serviceAccountName"])
    for doc in manifests():
        if doc["kind"] == "Service":
            selected = [t for _, t in pods if doc["spec"]["selector"].items() <= labels(t).items()]
            assert selected, f"Service {doc['metadata']['name']} selects no pod"
            for port in doc["spec"]["ports"]:
                assert port["targetPort"] in port_names(selected[0]), port
        if doc["kind"] == "PodMonitor":
            wanted = {e["port"] for e in doc["spec"]["podMetricsEndpoints"]}
            selected = [t for _, t in pods if selects(doc["spec"]["selector"], labels(t))]
            assert selected and all(wanted & port_names(t) for t in selected), doc["metadata"]
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]


def labels(template: dict[str, Any]) -> dict[str, str]:
    return template.get("metadata", {}).get("labels", {})


def selects(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    ok = selector.get("matchLabels", {}).items() <= pod_labels.items()
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr
        ok = ok and pod_labels.get(expr["key"]) in expr["values"]
    return ok


def port_names(template: dict[str, Any]) -> set[Any]:
    spec = template["spec"]
    return {
        value
        for c in spec.get("initContainers", []) + spec["containers"]
        for p in c.get("ports", [])
        for value in (p.get("name"), p["containerPort"])
    }


# ------------------------------------------------------------------ settings


@cache
def setting_env_names() -> set[str]:
    """Every environment variable the settings classes read (derived, not listed)."""
    from pydantic_settings import BaseSettings

    import pipeline.settings as module

    names: set[str] = set()
    for cls in vars(module).values():
        if not (isinstance(cls, type) and issubclass(cls, BaseSettings)) or cls is BaseSettings:
            continue
        assert not cls.model_config.get("env_nested_delimiter"), "nested names: derive them too"
        prefix = cls.model_config.get("env_prefix", "")
        for name, info in cls.model_fields.items():
            kind = info.annotation
            if isinstance(kind, type) and issubclass(kind, BaseSettings):
                continue  # a nested settings object reads its own variables
            alias = info.validation_alias or info.alias
            names.add(alias.upper() if isinstance(alias, str) else f"{prefix}{name}".upper())
    # pipeline/settings.py, and settings_sources.py and settings_embedded.py that it imports
    source = "".join(path.read_text() for path in Path(module.__file__).parent.glob("settings*.py"))
    return names | set(re.findall(r"os\.environ(?:\.get\(|\[)\"(\w+)\"", source))


def test_setting_names_come_from_the_settings_classes() -> None:
    names = setting_env_names()
    assert {
        "KAFKA_BOOTSTRAP_SERVERS",
        "TURNSTREAM_SCORING_JUDGE_URLS",
        "TURNSTREAM_CONFIG",
    } <= names
    assert {"TURNSTREAM_PROXY_HOST", "TURNSTREAM_TOPICS_FILE"} <= names
    assert "TURNSTREAM_SCORING_JUDGE_URL" not in names and "TURNSTREAM_KAFKA" not in names


def test_every_env_var_of_a_turnstream_container_is_a_setting() -> None:
    names = setting_env_names()
    unknown = {c.where: sorted(set(c.env) - names) for c in turnstream_containers()}
    assert not {k: v for k, v in unknown.items() if v}, "not in pipeline/settings.py"


def use_env(monkeypatch: pytest.MonkeyPatch, c: Container) -> None:
    """Make the process environment exactly the container's settings."""
    for name in setting_env_names():
        monkeypatch.delenv(name, raising=False)
    for key, value in c.env.items():
        monkeypatch.setenv(key, value)


def test_the_settings_of_every_turnstream_process_load(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.cli.proxy import settings_with_proxy
    from pipeline.cli.worker import settings_with_scoring

    for c in turnstream_containers():
        commands = [args[0] for args in map(cli_args, c.argv) if args]
        use_env(monkeypatch, c)
        assert not load_settings().uses_local_broker, f"{c.where}: no KAFKA_BOOTSTRAP_SERVERS"
        if "worker" in commands:
            settings_with_scoring({})  # a judge URL for sglang, m=3 for early_stop
        if "proxy" in commands:
            proxy = settings_with_proxy({}).proxy
            assert proxy.upstream and proxy.host == "0.0.0.0", f"{c.where}: {proxy}"


# ------------------------------------------------------------------ commands


def cli_args(argv: list[str]) -> list[str]:
    """The `turnstream` arguments of a program."""
    if argv[0] == "turnstream":
        return argv[1:]
    assert argv[0] == "deepspeed", f"a turnstream image runs turnstream or deepspeed: {argv}"
    at = argv.index("--module")
    assert argv[at + 1] == "pipeline.cli", argv
    return argv[at + 2 :]


class CliUsageError(ValueError):
    """`turnstream` would refuse these arguments."""


def parse_cli(args: list[str]) -> tuple[str, dict[str, Any]]:
    """Parse as `turnstream ARGS` would, without running anything: (command, options)."""
    import typer

    from pipeline.cli import app

    command: Any = typer.main.get_command(app)
    path = ["turnstream"]
    while hasattr(command, "list_commands"):  # a group: the next word picks its command
        name, *args = args
        sub = command.get_command(typer.Context(command), name)
        if sub is None:
            raise CliUsageError(f"no command {name!r} in {' '.join(path)}")
        command, path = sub, [*path, name]
    try:
        ctx = command.make_context(" ".join(path), list(args))
    except Exception as exc:  # click's (or typer's vendored click's) usage errors
        if not any(k.__name__ == "UsageError" for k in type(exc).__mro__):
            raise
        raise CliUsageError(f"{' '.join(path)} {args}: {exc}") from exc
    return " ".join(path[1:]), ctx.params


def test_the_cli_parser_refuses_what_turnstream_refuses() -> None:
    assert parse_cli(["retry", "--max-attempts", "5"]) == ("retry", {"max_attempts": 5})
    with pytest.raises(CliUsageError, match="judge-urls"):
        parse_cli(["worker", "--judge-urls", "http://judge"])
    with pytest.raises(CliUsageError, match="max-attempts"):
        parse_cli(["retry", "--max-attempts", "five"])
    with pytest.raises(CliUsageError, match="sync"):
        parse_cli(["topics", "sync"])


def test_every_command_is_a_real_turnstream_command() -> None:
    run = set()
    for c in turnstream_containers():
        for args in map(cli_args, c.argv):
            run.add(f"{c.deployment} {parse_cli(args)[0]}")
    for deployment in ("compose", "k8s"):
        assert {f"{deployment} {cmd}" for cmd in ("worker", "proxy", "train", "retry")} <= run


def trainer_config(c: Container, args: list[str], tmp_path: Path) -> Any:
    from pipeline.training.config import load_trainer_config

    path = str(parse_cli(args)[1]["config"])
    assert path in c.files, f"{c.where}: no config file mounted at {path}"
    copy = tmp_path / "trainer.yaml"
    copy.write_text(c.files[path])
    return load_trainer_config(copy)


def metrics_address(
    c: Container, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, int] | None:
    """Where a worker or a trainer serves /metrics: (host, port), from its settings."""
    for args in map(cli_args, c.argv):
        command = parse_cli(args)[0]
        if command == "worker":
            use_env(monkeypatch, c)
            scoring = load_settings().scoring
            return scoring.web_host, scoring.web_port
        if command == "train":
            config = trainer_config(c, args, tmp_path)
            return config.metrics_host, config.metrics_port
    return None


def pod_monitor_ports(pod_labels: dict[str, str]) -> set[str]:
    """The container ports the PodMonitors that select a pod scrape."""
    return {
        endpoint["port"]
        for d in manifests()
        if d["kind"] == "PodMonitor" and selects(d["spec"]["selector"], pod_labels)
        for endpoint in d["spec"]["podMetricsEndpoints"]
    }


def test_prometheus_scrapes_the_port_each_worker_and_trainer_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = {}
    for c in turnstream_containers():
        address = metrics_address(c, tmp_path, monkeypatch)
        if address is None:
            continue
        host, port = address
        assert host == "0.0.0.0" and port, f"{c.where}: /metrics on {host}:{port}"
        served[c.where] = port
        if c.deployment == "k8s":
            assert int(c.pod_annotations["prometheus.io/port"]) == port, c.where
            monitored = pod_monitor_ports(c.pod_labels)
            assert monitored and {c.ports.get(name) for name in monitored} == {port}, c.where
    assert len(served) == 4, served  # workers and trainers, compose and k8s
    scrape = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())["scrape_configs"]
    targets = {t for job in scrape for s in job.get("static_configs", []) for t in s["targets"]}
    targets |= {f"{n}:{d['port']}" for j in scrape for d in j.get("dns_sd_configs", [])
                for n in d["names"]}  # fmt: skip
    proxy = services()["proxy"]["environment"]["TURNSTREAM_PROXY_PORT"]
    compose = {
        f"{where.split()[1]}:{port}"
        for where, port in served.items()
        if where.startswith("compose")
    }
    assert targets == compose | {f"proxy:{proxy}"}


def is_worker(c: Container) -> bool:
    return any(args and args[0] == "worker" for args in map(cli_args, c.argv))


def policy_mounts(deployment: str, weights_dir: str, urls: list[str]) -> set[str]:
    """The volume each policy server of policy_urls has at the trainer's weights_dir."""
    assert urls, "policy_urls is empty: new weights would reach no server"
    volumes = set()
    for url in urls:
        host = re.fullmatch(r"http://([\w-]+):\d+", url)
        assert host, url
        if deployment == "compose":
            mounts = compose_mounts(services()[host[1]])
        else:
            selector = named("Service", host[1])["spec"]["selector"]
            pod = next(t for _, t in pod_templates() if selector.items() <= labels(t).items())
            spec = pod["spec"]
            mounts = {k: v for c in spec["containers"] for k, v in pod_mounts(spec, c).items()}
        volumes.add(mounts.get(weights_dir, f"nothing at {weights_dir}"))
    return volumes


def test_trainers_match_their_gpus_workers_and_policy_servers(tmp_path: Path) -> None:
    trainers = 0
    for c in turnstream_containers():
        for argv in c.argv:
            if argv[0] != "deepspeed":
                continue
            trainers += 1
            config = trainer_config(c, cli_args(argv), tmp_path)
            assert int(argv[argv.index("--num_gpus") + 1]) == c.gpus >= 1, c.where
            assert config.model_path and any(config.model_path.startswith(p) for p in c.mounts)
            workers = [w for w in turnstream_containers() if is_worker(w)]
            modes = {
                w.env["TURNSTREAM_SCORING_MODE"] for w in workers if w.deployment == c.deployment
            }
            assert modes == {config.mode}, f"{c.where}: trainer {config.mode}, workers {modes}"
            volume = c.mounts.get(config.weights_dir)
            assert volume, f"{c.where}: weights_dir {config.weights_dir} is no volume mount"
            assert policy_mounts(c.deployment, config.weights_dir, config.policy_urls) == {volume}
    assert trainers == 2


# ----------------------------------------------------------------- dashboard


@cache
def exported_metrics() -> dict[str, frozenset[str]]:
    """Every series name the code registers (with _total, _bucket, ... suffixes): its labels."""
    from prometheus_client import REGISTRY

    pattern = re.compile(
        r"from prometheus_client import [^\n]*\b(Counter|Gauge|Histogram|Summary)\b"
    )
    for path in sorted((REPO_ROOT / "pipeline").rglob("*.py")):
        if pattern.search(path.read_text()):
            module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
            __import__(module)
    out = {}
    # The registry's map from series names to collectors is the exported set itself.
    for name, collector in REGISTRY._names_to_collectors.items():
        extra = {"le"} if name.endswith("_bucket") else set()
        out[name] = frozenset(getattr(collector, "_labelnames", ())) | extra
    return out


PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset"}
PROMQL_KEYWORDS |= {"bool", "and", "or", "unless", "inf", "nan"}
GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"


def promql_selectors(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """The metrics an expression selects (with the labels it matches), and its grouping labels."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # string literals
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery durations
    grouping = {g.strip() for group in re.findall(GROUPING, text) for g in group.split(",")}
    text = re.sub(GROUPING, " ", text)
    selectors = []
    for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][\w:]*)\s*(\{[^}]*\})?(\s*\()?", text):
        name, matchers, call = m.groups()
        if (call and not matchers) or name.lower() in PROMQL_KEYWORDS:
            continue  # a function or an operator
        selectors.append((name, set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers or ""))))
    return selectors, grouping - {""}


def test_promql_selectors_are_found() -> None:
    selectors, grouping = promql_selectors(
        'sum by (value) (rate(turnstream_judge_votes_total{value="failed"}[5m])) '
        "/ ignoring(x) histogram_quantile(0.9, sum by (le) (rate(a_bucket[$__rate_interval]))) "
        "* 1e3 > bool deriv(turnstream_trainer_step[5m])"
    )
    assert selectors == [
        ("turnstream_judge_votes_total", {"value"}),
        ("a_bucket", set()),
        ("turnstream_trainer_step", set()),
    ]
    assert grouping == {"value", "x", "le"}


def dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert all(p.get("targets") for p in panels), "a panel without a query"
    return [(p["title"], t["expr"]) for p in panels for t in p["targets"]]


def test_every_dashboard_query_uses_exported_metrics() -> None:
    exported = exported_metrics()
    for title, expr in dashboard_exprs():
        selectors, grouping = promql_selectors(expr)
        assert selectors, f"{title}: no metric found in {expr!r}"
        known_labels = set(PROMETHEUS_LABELS)
        for name, matched in selectors:
            assert name in exported, f"{title}: {name} is not exported by pipeline/ ({expr})"
            assert matched <= exported[name] | PROMETHEUS_LABELS, f"{title}: {name} {matched}"
            known_labels |= exported[name]
        assert grouping <= known_labels, f"{title}: grouped by {grouping - known_labels}"


def test_the_dashboard_shows_what_operators_watch() -> None:
    queried = {name for _, expr in dashboard_exprs() for name, _ in promql_selectors(expr)[0]}
    watched = {
        "turnstream_proxy_turns_total",  # throughput per stage
        "turnstream_pairing_events_total",
        "turnstream_turns_paired_total",
        "turnstream_samples_scored_total",
        "turnstream_trainer_step",
        "turnstream_judge_votes_total",  # votes by value
        "turnstream_judge_calls_per_turn_sum",  # judge calls per turn
        "turnstream_judge_calls_per_turn_count",
        "turnstream_judge_latency_seconds_bucket",
        "turnstream_consumer_lag",
        "turnstream_samples_retry_total",
        "turnstream_judge_request_retries_total",
        "turnstream_dead_letters_total",
        "turnstream_trainer_loss",
        "turnstream_trainer_reward_mean",
        "turnstream_trainer_kl",
    }
    assert watched <= queried, sorted(watched - queried)


def test_compose_grafana_provisions_the_dashboard_from_prometheus() -> None:
    grafana = compose_mounts(services()["grafana"])
    provisioning = COMPOSE_DIR / grafana["/etc/grafana/provisioning"]
    (provider,) = yaml_docs(provisioning / "dashboards" / "turnstream.yml")[0]["providers"]
    assert (COMPOSE_DIR / grafana[provider["options"]["path"]]).resolve() == DASHBOARD.parent
    (source,) = yaml_docs(provisioning / "datasources" / "prometheus.yml")[0]["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "9090:9090" in services()["prometheus"]["ports"]
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        for target in [panel, *panel.get("targets", [])]:
            assert target.get("datasource", {"uid": "${datasource}"})["uid"] == "${datasource}"
