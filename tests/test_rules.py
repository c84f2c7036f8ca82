"""The Prometheus rules shipped in deploy/prometheus, through Prometheus's
own rule checker: `promtool check rules` (syntax, templates) and `promtool
test rules` (tests/rules/: scripted series in, the alerts that fire out,
healthy controls included). That every metric the rules read is one memtrace
pushes is checked here against the catalog (memtrace/export/catalog.py),
which docs/metrics.md is generated from, and against a real backend in
tests/test_host_signals.py."""

from __future__ import annotations

import re
import subprocess

from backends import promtool
from conftest import REPO

RULES = REPO / "deploy" / "prometheus" / "memtrace-rules.yaml"
TESTS = REPO / "tests" / "rules" / "memtrace-rules.test.yaml"


def _exprs() -> str:
    text = RULES.read_text()
    exprs = " ".join(re.findall(r"expr: >?\n?((?:.*\n)*?)\s+(?:for|labels|- record|- alert):", text))
    return exprs + " ".join(re.findall(r"expr: (.+)", text))


def rule_labels() -> set[str]:
    """The labels the rules group, join or match on (`by (...)`, `on (...)`, `{name!=""}`)."""
    exprs = _exprs()
    lists = re.findall(r"\b(?:by|on|ignoring)\s*\(([^)]*)\)", exprs)
    names = {n.strip() for group in lists for n in group.split(",") if n.strip()}
    return names | set(re.findall(r"[{,]\s*([a-z_][a-z0-9_]*)\s*(?:=|!=|=~|!~)", exprs))


def rule_metrics() -> set[str]:
    """The metric names the rules read (recording rules' own names and labels left out)."""
    return set(re.findall(r"\b((?:memtrace|hw)_[a-z0-9_]+)\b", _exprs())) - rule_labels()


def test_rules_pass_promtools_checker() -> None:
    p = subprocess.run([str(promtool()), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS: 15 rules found" in p.stdout


def test_rules_fire_on_the_faults_and_stay_silent_on_healthy_peers() -> None:
    p = subprocess.run([str(promtool()), "test", "rules", TESTS.name], capture_output=True, text=True, cwd=TESTS.parent)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_rules_read_the_metrics_memtrace_pushes() -> None:
    """Every series a rule reads is one the catalog (memtrace/export/catalog.py)
    says memtrace pushes, by the name a Prometheus-compatible backend gives it."""
    from memtrace.export.catalog import METRICS, prometheus_series

    names = rule_metrics()
    assert {"memtrace_step_duration_seconds_sum", "memtrace_gpu_pcie_link_width", "memtrace_finding_ratio"} <= names
    pushed = {n for m in METRICS for n in prometheus_series(m)}
    assert names <= pushed, names - pushed


def test_the_rules_group_by_labels_memtrace_sends_and_never_by_executable() -> None:
    """Peers are the ranks of one job (memtrace.job.id, read from the
    launcher), never the processes of one executable (every PyTorch rank is
    `python`); every label a rule groups or matches on is an attribute the
    catalog says memtrace sends, by a Prometheus backend's name for it."""
    from memtrace.export.catalog import METRICS, PROCESS_RESOURCE

    labels = rule_labels()
    peers = re.findall(r"\b(?:quantile by|count by|on)\s*\(([^)]*)\)", _exprs())
    assert peers and all("memtrace_job_id" in p and "process_executable_name" not in p for p in peers), peers
    sent = {a.name for a in PROCESS_RESOURCE} | {a.name for m in METRICS for a in m.attributes}
    sent_as = {re.sub(r"[^a-zA-Z0-9_]", "_", n) for n in sent}
    assert labels - {"__name__"} <= sent_as, labels - sent_as


def test_the_metric_reference_is_the_one_the_catalog_makes() -> None:
    """docs/metrics.md is generated (python -m memtrace.export.catalog --write
    docs/metrics.md): a catalog change without it, or a hand edit, fails here."""
    from memtrace.export.catalog import reference

    committed = (REPO / "docs" / "metrics.md").read_text()
    assert committed == reference(), (
        "docs/metrics.md is stale: python -m memtrace.export.catalog --write docs/metrics.md"
    )
