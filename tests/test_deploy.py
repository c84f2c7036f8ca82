"""deploy/: the collector configs load in the real collector, the Kubernetes
manifests pass schema validation, and the pieces refer to each other."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from backends import otelcol
from conftest import REPO

DEPLOY = REPO / "deploy"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
COLLECTOR_CONFIGS = [p for p in sorted((DEPLOY / "otelcol").glob("*.yaml")) if p.name != "builder.yaml"]


@pytest.mark.parametrize("config", COLLECTOR_CONFIGS, ids=lambda p: p.name)
def test_collector_config_validates_in_the_real_collector(config: Path) -> None:
    env = dict(
        os.environ,
        MEMTRACE_EXPORT_ENDPOINT="http://backend:8428/opentelemetry",
        BACKEND_OTLP_ENDPOINT="http://backend:8428/opentelemetry",
    )
    # With the flags the manifests give the collector (the profiles pipeline is behind a feature gate).
    (args,) = [
        c["args"]
        for m in MANIFESTS
        if m.name != "kustomization.yaml"
        for d in docs(m)
        if d["kind"] in ("DaemonSet", "Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
        if c.get("args") and f"/etc/otelcol/{config.name}" in c["args"]
    ]
    p = subprocess.run(
        [str(otelcol()), "validate", "--config", str(config), *args[2:]],
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "--feature-gates=service.profilesSupport" in args


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("manifest", [m for m in MANIFESTS if m.name != "kustomization.yaml"], ids=lambda p: p.name)
def test_kubernetes_manifests_pass_schema_validation(manifest: Path) -> None:
    for d in docs(manifest):
        kubernetes_validate.validate(d, "1.30", strict=True)


def test_daemonset_asks_for_least_privilege_and_has_what_the_agent_needs() -> None:
    ds = next(d for d in docs(DEPLOY / "kubernetes" / "memtrace-daemonset.yaml") if d["kind"] == "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    agent = spec["containers"][0]
    sc = agent["securityContext"]
    assert sc["privileged"] is False  # the toggle is the privileged/ overlay
    assert set(sc["capabilities"]["add"]) == {"BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH", "KILL"}
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    assert mounts["/sys/kernel/btf"]["readOnly"]
    # hostPID makes the container's /proc the node's: memtrace reads /proc, so
    # a host /proc mount would be unused surface.
    assert not any("proc" in m for m in mounts), mounts
    assert not any(v.get("hostPath", {}).get("path") == "/proc" for v in spec["volumes"])
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert agent["resources"]["requests"] and agent["resources"]["limits"]
    # No port is opened on the node: the sidecar collector listens on localhost.
    assert not any(c.get("ports") for c in spec["containers"])
    # Every capability the DaemonSet adds is explained where it is added.
    text = (DEPLOY / "kubernetes" / "memtrace-daemonset.yaml").read_text()
    for cap in sc["capabilities"]["add"]:
        assert f"#   {cap}" in text or f", {cap}" in text.split("hostPID")[0], cap


def test_privileged_overlay_patches_the_agent_container() -> None:
    k = yaml.safe_load((DEPLOY / "kubernetes" / "privileged" / "kustomization.yaml").read_text())
    patch = yaml.safe_load(k["patches"][0]["patch"])
    assert patch == [
        {"op": "replace", "path": "/spec/template/spec/containers/0/securityContext/privileged", "value": True}
    ]


def test_kustomization_ships_the_tested_collector_configs() -> None:
    k = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    files = {f for g in k["configMapGenerator"] for f in g["files"]}
    assert files == {"agent.yaml=../otelcol/agent.yaml", "gateway.yaml=../otelcol/gateway.yaml"}
    for r in k["resources"]:
        assert (DEPLOY / "kubernetes" / r).exists()


def test_dashboard_has_the_classic_panels_and_only_exported_metrics() -> None:
    d = json.loads((DEPLOY / "grafana" / "memtrace.json").read_text())
    titles = [p["title"] for p in d["panels"]]
    for want in ("bandwidth by direction", "p50 / p95 / p99", "heatmap", "summary", "host memory", "Findings"):
        assert any(want in t for t in titles), want
    from memtrace.export.catalog import METRICS, PROCESS_RESOURCE, prometheus_series

    exported = {n for m in METRICS for n in prometheus_series(m)}  # what memtrace pushes, by its backend name
    import re

    # Resource attributes are labels, not metrics (memtrace.job.id is memtrace_job_id).
    labels = {re.sub(r"\W", "_", a.name) for a in PROCESS_RESOURCE}

    # Rows by failure mode, each holding its panels.
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == [
        "Health",
        "Throughput and utilisation",
        "Bottlenecks",
        "Stragglers",
        "GPU pillars: compute, interconnect, memory health",
    ]
    for p in d["panels"]:
        if p["type"] == "row":
            continue
        assert p["targets"]
        for t in p["targets"]:
            names = (
                set(
                    re.findall(
                        r"\b(gpu_\w+_(?:total|bytes|bucket|seconds|ratio)|memtrace_\w+|hw_(?!id\b)\w+|system_network_\w+)",
                        t["expr"],
                    )
                )
                - labels
            )
            assert names and names <= exported, t["expr"]


def test_image_installs_the_locked_dependencies_with_hashes() -> None:
    lock = DEPLOY / "requirements.lock"
    pins = [l for l in lock.read_text().splitlines() if l and not l.startswith((" ", "#"))]
    assert pins and all("==" in l for l in pins), pins
    assert all("--hash=sha256:" in block for block in lock.read_text().split("==")[1:])
    # Every runtime dependency in pyproject.toml is pinned.
    block = (DEPLOY.parent / "pyproject.toml").read_text().split("\ndependencies = [", 1)[1].split("]", 1)[0]
    lines = [d.strip() for d in block.splitlines()]
    deps = [d.strip('",') for d in lines if d and not d.startswith("#")]  # no tomllib on 3.10
    names = {l.split("==")[0].lower().replace("_", "-") for l in pins}
    for d in deps:
        assert d.split(">")[0].split("=")[0].strip().lower().replace("_", "-") in names, d
    docker = (DEPLOY / "kubernetes" / "Dockerfile").read_text()
    assert "COPY deploy/requirements.lock" in docker
    assert "--require-hashes -r" in docker and "--no-deps" in docker


def _labels_read(expr: str) -> set[str]:
    """The label names a PromQL expression (or an alert's template) reads."""
    import re

    grouped = re.findall(r"\b(?:by|on|ignoring|without|group_left|group_right)\s*\(([^)]*)\)", expr)
    names = {n.strip() for g in grouped for n in g.split(",") if n.strip()}
    for selector in re.findall(r"\{([^{}]*)\}", expr):
        names.update(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
    names.update(re.findall(r"\$labels\.(\w+)", expr))
    names.update(re.findall(r"label_values\(\s*\w+\s*,\s*(\w+)\s*\)", expr))
    return names


def test_the_dashboard_and_the_rules_read_only_labels_that_are_there() -> None:
    """Every label a dashboard query or a rule reads is one memtrace puts on
    its series (export/catalog.py: the metrics' attributes and the
    resources'), one the gateway collector adds (its k8sattributes
    extraction) or one the backend makes (a histogram's vmrange and le): not
    a finding's summary or fix, which are events (a label with live figures
    makes a new series at every change)."""
    from memtrace.export.catalog import AGENT_RESOURCE, METRICS, PROCESS_RESOURCE

    def prom(name: str) -> str:
        return name.replace(".", "_")

    there = {prom(a.name) for m in METRICS for a in m.attributes}
    there |= {prom(a.name) for a in (*PROCESS_RESOURCE, *AGENT_RESOURCE)}
    (proc,) = [v for k, v in yaml.safe_load((DEPLOY / "otelcol" / "gateway.yaml").read_text())["processors"].items()
               if k.startswith("k8sattributes")]  # fmt: skip
    there |= {prom(n) for n in proc["extract"]["metadata"]} | {lb["tag_name"] for lb in proc["extract"]["labels"]}
    there |= {
        "vmrange",
        "le",
        "__name__",
        "deployment_environment",
    }  # the backend's; an OTEL_RESOURCE_ATTRIBUTES example
    assert "summary" not in there and "fix" not in there

    d = json.loads((DEPLOY / "grafana" / "memtrace.json").read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in d["templating"]["list"] if "definition" in v]
    rules = yaml.safe_load((DEPLOY / "prometheus" / "memtrace-rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            exprs.append(rule["expr"])
            exprs += list(rule.get("annotations", {}).values())
    for expr in exprs:
        assert _labels_read(expr) <= there, (expr, _labels_read(expr) - there)
    assert {"finding", "k8s_pod_name", "network_io_direction", "gpu_index"} <= set().union(*map(_labels_read, exprs))
