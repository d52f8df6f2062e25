"""Write relayer-rules.yaml, the PrometheusRule of the groups in rules.yml (the one source).

Run from anywhere: ``python3 deploy/prometheus/sync_rule.py``. The groups are copied as text,
indented under ``spec:``, so their comments and block scalars stay as written;
tests/deploy/test_manifests.py checks the two files hold the same groups.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "rules.yml"
TARGET = HERE / "relayer-rules.yaml"

HEADER = """\
# GENERATED from rules.yml by sync_rule.py: edit rules.yml, then run
#   python3 deploy/prometheus/sync_rule.py
# The Prometheus Operator loads these rules; the Prometheus that does must select this
# object's labels (ruleSelector; kube-prometheus-stack: the label release=<its release>, set
# in the overlay).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: relayer
  labels:
    app.kubernetes.io/name: relayer
    app.kubernetes.io/part-of: relayer
spec:
"""


def render(source: str) -> str:
    """The PrometheusRule text for the rules file ``source``: its lines from ``groups:`` on
    (the leading comment block stays behind), indented two spaces under ``spec:``."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = "".join(f"  {line}\n" if line.strip() else "\n" for line in lines[start:])
    return HEADER + body


def main() -> None:
    TARGET.write_text(render(SOURCE.read_text()))
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
