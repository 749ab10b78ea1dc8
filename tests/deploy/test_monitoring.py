#!/usr/bin/python3
"""Alerts and dashboard: metric names and labels from docs/DESIGN.md, PromQL that promtool
parses, alerts that fire (and stay silent) as promtool's unit tests expect."""

import os
import shutil
import subprocess
import tempfile
import unittest

import yaml

import design_contract
import monitoring

HERE = os.path.dirname(os.path.realpath(__file__))


def promtool():
    path = shutil.which("promtool")
    if not path:
        raise AssertionError("promtool not found: run scripts/install-deps.sh (Debian package "
                             "prometheus)")
    return path


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


class MonitoringTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write_rules(self, groups, name="fp4qd-rules.yaml"):
        with open(os.path.join(self.dir, name), "w", encoding="utf-8") as f:
            yaml.safe_dump(groups, f)
        return name

    def test_every_query_uses_design_metrics_and_their_labels(self):
        exprs = monitoring.alert_exprs() + monitoring.dashboard_exprs()
        self.assertGreaterEqual(len(exprs), 30)
        errors = []
        for where, expr in exprs:
            errors += design_contract.check_promql(expr, where)
        self.assertEqual(errors, [])
        # The dashboard shows every metric DESIGN.md lists.
        used = {design_contract.series_names(design_contract.metrics())[n][0]
                for n in monitoring.all_metric_names()}
        self.assertEqual(sorted(set(design_contract.metrics()) - used), [])

    def test_contract_check_rejects_unknown_metrics_labels_and_misuse(self):
        self.assertEqual(design_contract.check_promql("rate(fp4q_request_total[5m])", "x"),
                         ["x: metric 'fp4q_request_total' is not in docs/DESIGN.md"])
        self.assertEqual(design_contract.check_promql("sum by (rpc) (fp4q_queue_depth)", "y"),
                         ["y: label 'rpc' is not a label of ['fp4q_queue_depth']"])
        self.assertEqual(design_contract.check_promql("rate(fp4q_sessions[5m])", "z"),
                         ["z: rate() of gauge 'fp4q_sessions'"])

    def test_promtool_checks_the_alert_rules(self):
        name = self.write_rules(monitoring.rule_groups())
        r = run([promtool(), "check", "rules", name], self.dir)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"SUCCESS: {len(monitoring.alert_exprs())} rules found", r.stdout)

    def test_promtool_rejects_a_broken_rule(self):
        groups = monitoring.rule_groups()
        groups["groups"][0]["rules"][0]["expr"] = "sum(rate(fp4q_requests_total[5m])"
        name = self.write_rules(groups)
        r = run([promtool(), "check", "rules", name], self.dir)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("unclosed left parenthesis", r.stdout + r.stderr)

    def test_alert_unit_tests(self):
        self.write_rules(monitoring.rule_groups())
        shutil.copy(os.path.join(HERE, "prometheus_rules_test.yaml"), self.dir)
        r = run([promtool(), "test", "rules", "prometheus_rules_test.yaml"], self.dir)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS", r.stdout)
        # Every alert is exercised by the unit tests.
        with open(os.path.join(HERE, "prometheus_rules_test.yaml"), encoding="utf-8") as f:
            tested = {t["alertname"] for case in yaml.safe_load(f)["tests"]
                      for t in case["alert_rule_test"]}
        self.assertEqual(sorted(tested), sorted(a for a, _ in monitoring.alert_exprs()))

    def test_dashboard_queries_parse(self):
        exprs = monitoring.dashboard_exprs()
        rules = [{"record": f"fp4q:dashboard_query:{i}", "expr": monitoring.plain_promql(e)}
                 for i, (_, e) in enumerate(exprs)]
        name = self.write_rules({"groups": [{"name": "dashboard", "rules": rules}]})
        r = run([promtool(), "check", "rules", name], self.dir)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"SUCCESS: {len(exprs)} rules found", r.stdout)

    def test_dashboard_structure(self):
        dash = monitoring.dashboard()
        self.assertEqual(dash["uid"], "fp4q-overview")
        ids = [p["id"] for p in dash["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids must be unique")
        variables = [v["name"] for v in dash["templating"]["list"]]
        self.assertEqual(variables, ["datasource", "namespace", "pod"])
        for p in dash["panels"]:
            grid = p["gridPos"]
            self.assertLessEqual(grid["x"] + grid["w"], 24, p["title"])
            if p["type"] == "row":
                continue
            self.assertEqual(p["datasource"]["uid"], "${datasource}", p["title"])
            refs = [t["refId"] for t in p["targets"]]
            self.assertTrue(refs and len(refs) == len(set(refs)), p["title"])
            for t in p["targets"]:
                self.assertIn('namespace=~"$namespace"', t["expr"], p["title"])
                self.assertIn('pod=~"$pod"', t["expr"], p["title"])


if __name__ == "__main__":
    unittest.main()
