"""deploy/kubernetes: the manifests parse, and what they name exists — the CLI commands, the
probe paths (served for real), the settings, the labels their selectors pick. And a worker
started before the migration serves its probes, waits for the schema, then works."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from pydantic import BaseModel

from service.app import create_app
from service.cli import _parser
from service.db.migrate import upgrade_to_head
from service.health.probes import PROBE_PATHS
from service.settings import Settings
from tests.conftest import (
    AppClient,
    DatabaseFactory,
    make_settings,
    new_tenant,
    serve_app,
    until_finished,
)
from tests.test_cli import clean_env, free_port

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"


def documents() -> dict[str, list[dict[str, Any]]]:
    """Every YAML document under deploy/kubernetes, by file name."""
    return {
        path.name: [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        for path in sorted(KUBERNETES.glob("*.yaml"))
    }


def resources() -> list[dict[str, Any]]:
    return [d for name, docs in documents().items() if name != "kustomization.yaml" for d in docs]


def one(kind: str, name: str) -> dict[str, Any]:
    [found] = [r for r in resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    return found


def pod_spec(resource: dict[str, Any]) -> dict[str, Any]:
    return dict(resource["spec"]["template"]["spec"])


def containers() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every container of every Deployment and Job."""
    return [
        (r, c)
        for r in resources()
        if r["kind"] in ("Deployment", "Job")
        for c in pod_spec(r)["containers"]
    ]


def test_every_manifest_parses_and_the_kustomization_lists_them() -> None:
    docs = documents()
    kustomization = docs.pop("kustomization.yaml")[0]
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == sorted(docs)
    kinds = set()
    for name, found in docs.items():
        assert found, f"{name} holds no resource"
        for resource in found:
            assert {"apiVersion", "kind", "metadata"} <= resource.keys(), name
            assert resource["metadata"]["labels"]["app.kubernetes.io/name"] == "memoria", name
            kinds.add(resource["kind"])
    assert {
        "Deployment",
        "Job",
        "Service",
        "ConfigMap",
        "Secret",
        "HorizontalPodAutoscaler",
    } <= kinds


def test_commands_are_the_memoria_cli_and_the_image_is_the_kustomized_one() -> None:
    kustomization = documents()["kustomization.yaml"][0]
    images = {i["name"] for i in kustomization["images"]}
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["memoria"] == "service.cli:main"
    assert "pip install" in (ROOT / "deploy" / "Dockerfile").read_text()
    parsed = {}
    for workload, container in containers():
        assert container["image"].split(":")[0] in images
        command = container["command"]
        assert command[0] == "memoria"
        try:
            parsed[workload["metadata"]["name"]] = _parser().parse_args(command[1:])
        except SystemExit:
            pytest.fail(f"{workload['metadata']['name']}: memoria refuses {command[1:]}")
    api, worker, migrate = (
        parsed["memoria-api"],
        parsed["memoria-worker"],
        parsed["memoria-migrate"],
    )
    assert (api.command, api.host, api.no_worker, api.no_migrate) == (
        "serve",
        "0.0.0.0",
        True,
        True,
    )
    assert (worker.command, worker.health_host) == ("worker", "0.0.0.0")
    assert migrate.command == "migrate"
    assert one("Job", "memoria-migrate")["spec"]["template"]["spec"]["restartPolicy"] != "Always"


async def test_probes_hit_paths_the_processes_serve(client: AppClient) -> None:
    for name, port_flag, served in (
        ("memoria-api", "--port", None),
        ("memoria-worker", "--health-port", PROBE_PATHS),
    ):
        [container] = pod_spec(one("Deployment", name))["containers"]
        command = container["command"]
        port = int(command[command.index(port_flag) + 1])
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            get = container[probe]["httpGet"]
            assert ports[get["port"]] == port, f"{name} {probe} probes another port"
            expected = "/readyz" if probe == "readinessProbe" else "/healthz"
            assert get["path"] == expected, f"{name} {probe}"
            if served is None:
                answer = await client.get(get["path"])
                assert answer.status_code == 200, f"{name} {probe}: {answer.text}"
            else:
                assert get["path"] in served
        annotations = one("Deployment", name)["spec"]["template"]["metadata"]["annotations"]
        assert int(annotations["prometheus.io/port"]) == port
        assert (await client.get(annotations["prometheus.io/path"])).status_code == 200


def _setting_exists(name: str) -> bool:
    assert name.startswith("MEMORIA_"), name
    model: type[BaseModel] = Settings
    parts = name.removeprefix("MEMORIA_").lower().split("__")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        annotation = field.annotation
        if i < len(parts) - 1:
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                return False
            model = annotation
    return True


def test_environment_names_are_settings_the_service_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = one("ConfigMap", "memoria-config")["data"]
    secret = one("Secret", "memoria-secrets")["stringData"]
    named: dict[str, str] = {**config, **secret}
    for _, container in containers():
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef") or source.get("secretRef")
            kind = "ConfigMap" if "configMapRef" in source else "Secret"
            one(kind, ref["name"])
        named.update({e["name"]: e["value"] for e in container.get("env", [])})
    # The commented-out ones are meant to be switched on as they stand.
    commented = {
        m
        for path in KUBERNETES.glob("*.yaml")
        for m in re.findall(r"#\s*(MEMORIA_[A-Z0-9_]+):", path.read_text())
    }
    assert commented
    unknown = sorted(n for n in {*named, *commented} if not _setting_exists(n))
    assert unknown == []
    # And their values are accepted.
    for name in [n for n in os.environ if n.startswith("MEMORIA_")]:
        monkeypatch.delenv(name)
    for name, value in named.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.auto_migrate is False and settings.run_worker is False
    assert settings.log_format == "json"
    assert settings.database_url == secret["MEMORIA_DATABASE_URL"]


def test_selectors_pick_the_labels_of_the_pods_they_mean() -> None:
    deployments = {r["metadata"]["name"]: r for r in resources() if r["kind"] == "Deployment"}
    labels = {}
    for name, deployment in deployments.items():
        selector = deployment["spec"]["selector"]["matchLabels"]
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items(), name
        labels[name] = pod_labels
    job = one("Job", "memoria-migrate")["spec"]["template"]["metadata"]["labels"]

    def picks(selector: dict[str, str]) -> set[str]:
        chosen = {n for n, pod in labels.items() if selector.items() <= pod.items()}
        assert not selector.items() <= job.items(), "a selector picks the migration's pod"
        return chosen

    service = one("Service", "memoria-api")
    assert picks(service["spec"]["selector"]) == {"memoria-api"}
    [api] = pod_spec(deployments["memoria-api"])["containers"]
    targets = {p["targetPort"] for p in service["spec"]["ports"]}
    assert targets <= {p["name"] for p in api["ports"]} | {p["containerPort"] for p in api["ports"]}
    budget = one("PodDisruptionBudget", "memoria-api")
    assert picks(budget["spec"]["selector"]["matchLabels"]) == {"memoria-api"}

    scaled = set()
    for hpa in [r for r in resources() if r["kind"] == "HorizontalPodAutoscaler"]:
        target = hpa["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and target["name"] in deployments
        scaled.add(target["name"])
        assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
        # A CPU utilization target is a share of the containers' CPU requests.
        for container in pod_spec(deployments[target["name"]])["containers"]:
            assert "cpu" in container["resources"]["requests"], target["name"]
    assert scaled == {"memoria-api", "memoria-worker"}


def test_grace_periods_cover_the_graceful_shutdown() -> None:
    shutdown = Settings().cognitive.queue.shutdown_seconds
    for name in ("memoria-api", "memoria-worker"):
        spec = pod_spec(one("Deployment", name))
        stop = spec["containers"][0].get("lifecycle", {}).get("preStop", {}).get("exec", {})
        pre_stop = int(stop["command"][1]) if stop else 0
        # The worker's jobs finish (shutdown_seconds); the API's requests get as long
        # (uvicorn: shutdown_seconds + 10); then closing the pool and the embedder.
        assert spec["terminationGracePeriodSeconds"] >= pre_stop + shutdown + 15, name


async def test_a_worker_started_before_the_migration_probes_waits_and_works(
    databases: DatabaseFactory, tmp_path: Path
) -> None:
    url = await databases.create_empty()
    port = free_port()
    log = tmp_path / "worker.log"
    with log.open("w") as output:
        worker = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "service", "worker", "--health-port", str(port)],
            env=clean_env(MEMORIA_DATABASE_URL=url),
            stdout=subprocess.DEVNULL,
            stderr=output,
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as probes:
            deadline = time.monotonic() + 90
            while True:
                assert worker.returncode is None, log.read_text()
                try:
                    health = await probes.get("/healthz")
                    break
                except httpx.ConnectError:
                    assert time.monotonic() < deadline, "the worker's probes never answered"
                    await asyncio.sleep(0.2)
            assert health.status_code == 200
            ready = await probes.get("/readyz")
            assert ready.status_code == 503 and "migrations" in ready.json()["detail"]
            assert (await probes.get("/nowhere")).status_code == 404
            await asyncio.sleep(2)  # several claim attempts on the missing schema
            assert worker.returncode is None, f"the worker gave up: {log.read_text()}"

            await asyncio.to_thread(upgrade_to_head, url, Settings())
            assert (await probes.get("/readyz")).status_code == 200
            app = create_app(make_settings(url), migrate=False, run_worker=False)
            async with serve_app(app) as client:
                tenant = await new_tenant(client)
                accepted = await client.post(
                    "/v1/end",
                    json={
                        "request_type": "private",
                        "user_id": "10001",
                        "sender_id": "10001",
                        "request_id": "turn-1",
                        "observations": ["我喜欢爬山"],
                    },
                    headers=tenant.headers,
                )
                assert accepted.status_code == 202, accepted.text
                job = await until_finished(client, tenant, accepted.json()["job_id"])
                assert job["status"] == "done", job["last_error"]
            metrics = await probes.get("/metrics")
            assert 'memoria_jobs_done_total{kind="historian.end"} 1.0' in metrics.text
    finally:
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.wait(), timeout=60) == 0, log.read_text()
