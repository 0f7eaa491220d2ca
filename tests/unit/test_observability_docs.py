"""docs/observability.md's Prometheus configuration and alert rules are valid, and every metric an
alert uses is one that the engine (`pgflow-gen metrics`) or a worker exports. promtool checks
both files where it is installed (CI installs Debian's prometheus for it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pgflow_gen.dashboard import metrics as engine_metrics
from pgflow_gen.runtime.worker import metrics as worker_metrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


def block(name: str) -> str:
    """The ```yaml block of the doc whose first line is `# <name>`."""
    for found in re.finditer(r"```yaml\n(.*?)```", DOC.read_text(), re.S):
        if found[1].startswith(f"# {name}\n"):
            return found[1]
    raise AssertionError(f"no ```yaml block starting with '# {name}' in {DOC.name}")


def exported() -> set[str]:
    """Every series name the engine's and the workers' metrics expose."""
    snapshot = engine_metrics.Snapshot(routes=[], runs=[], stalled=[], workers=[])
    families = list(engine_metrics.families(snapshot))
    for name in dir(worker_metrics):
        metric = getattr(worker_metrics, name)
        if hasattr(metric, "describe") and name.isupper():
            families += metric.describe()
    names: set[str] = set()
    for family in families:
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
    return names


def test_the_scrape_config_names_the_rule_file_and_both_jobs() -> None:
    config = yaml.safe_load(block("prometheus.yml"))
    assert config["rule_files"] == ["pgflow-alerts.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"pgflow-engine", "pgflow-workers"}
    assert jobs["pgflow-engine"]["authorization"]["type"] == "Bearer"
    for job in jobs.values():
        assert all(":" in target for c in job["static_configs"] for target in c["targets"])


def test_every_alert_is_complete_and_uses_only_exported_metrics() -> None:
    rules = yaml.safe_load(block("pgflow-alerts.yml"))
    [group] = rules["groups"]
    alerts = {rule["alert"]: rule for rule in group["rules"]}
    assert set(alerts) == {
        "PgflowRouteUncovered", "PgflowOldestMessageTooOld", "PgflowStepFailing",
        "PgflowTasksParked",
    }  # fmt: skip
    assert alerts["PgflowRouteUncovered"]["for"] == "5m"  # the "uncovered for 5 minutes"
    known = exported()
    for name, rule in alerts.items():
        assert {"summary", "description"} <= set(rule["annotations"]), name
        assert rule["labels"]["severity"] in ("page", "warn"), name
        used = set(re.findall(r"\bpgflow_[a-z_]+", rule["expr"]))
        assert used, name
        assert used <= known, f"{name} uses {sorted(used - known)}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_config_and_the_rules(tmp_path: Path) -> None:
    (tmp_path / "pgflow-alerts.yml").write_text(block("pgflow-alerts.yml"))
    config = yaml.safe_load(block("prometheus.yml"))
    token = tmp_path / "pgflow-dashboard-token"
    token.write_text("a token\n")
    config["scrape_configs"][0]["authorization"]["credentials_file"] = str(token)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    for command in (["check", "rules", "pgflow-alerts.yml"], ["check", "config", "prometheus.yml"]):
        checked = subprocess.run(
            ["promtool", *command], cwd=tmp_path, capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
