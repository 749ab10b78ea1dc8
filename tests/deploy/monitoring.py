"""The PromQL in deploy/: alert rules (PrometheusRule) and dashboard queries (Grafana JSON)."""

import json
import os
import re

import yaml

import design_contract

BASE = os.path.join(design_contract.REPO, "deploy", "base", "monitoring")
RULES = os.path.join(BASE, "prometheusrule.yaml")
DASHBOARD = os.path.join(BASE, "dashboards", "fp4q.json")

# Grafana variables replaced by plain PromQL so the queries can be parsed by promtool.
GRAFANA_VARS = (("$__rate_interval", "5m"), ("$__interval", "1m"), ("$__range", "1h"),
                ("${datasource}", ""), ("$namespace", ".*"), ("$pod", ".*"))


def rule_groups():
    with open(RULES, encoding="utf-8") as f:
        return yaml.safe_load(f)["spec"]


def alert_exprs():
    """[(alert name, expr)]."""
    return [(r["alert"], r["expr"]) for g in rule_groups()["groups"] for r in g["rules"]
            if "alert" in r]


def dashboard():
    with open(DASHBOARD, encoding="utf-8") as f:
        return json.load(f)


def dashboard_exprs():
    """[(where, expr)] for every panel target and every label_values() variable query."""
    out = []
    dash = dashboard()
    for panel in dash["panels"]:
        for target in panel.get("targets") or []:
            out.append((f"panel {panel['id']} '{panel['title']}' {target['refId']}",
                        target["expr"]))
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_]+)\)", query.strip())
        if not m:
            raise ValueError(f"variable {var['name']}: unsupported query {query!r}")
        out.append((f"variable {var['name']}", m.group(1)))
    return out


def plain_promql(expr):
    for var, value in GRAFANA_VARS:
        expr = expr.replace(var, value)
    return expr


def all_metric_names():
    """Every fp4q_ series name used by the alerts and the dashboard."""
    names = set()
    for _, expr in alert_exprs() + dashboard_exprs():
        names |= design_contract.promql_usage(expr)[0]
    return names
