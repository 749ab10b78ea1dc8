#!/usr/bin/python3
"""Renders every overlay of deploy/ and runs the structural checks of k8s_checks.py on it; then
breaks one thing at a time in the rendered objects and expects the check that must catch it."""

import copy
import os
import tempfile
import textwrap
import unittest

import design_contract
import k8s_checks
import kustomize_render

OVERLAYS = os.path.join(design_contract.REPO, "deploy", "overlays")


def render(name):
    return kustomize_render.render(os.path.join(OVERLAYS, name))


def find(objects, kind, name):
    [obj] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def fp4qd_container(objects):
    for o in objects:
        spec = o.get("spec", {}).get("template", {}).get("spec") or {}
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            if c["name"] == "fp4qd":
                return o, spec, c
    raise AssertionError("no fp4qd container")


class OverlaysTest(unittest.TestCase):
    def test_overlay_list_is_what_the_readme_describes(self):
        self.assertEqual(sorted(os.listdir(OVERLAYS)), ["cpu", "daemonset", "sidecar"])

    def test_every_overlay_passes_every_check(self):
        for name in ("daemonset", "sidecar", "cpu"):
            with self.subTest(overlay=name):
                objects = render(name)
                self.assertEqual(k8s_checks.check(objects), [])

    def test_rendered_contents(self):
        ds = render("daemonset")
        kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in ds)
        self.assertEqual(kinds, [
            "ConfigMap/fp4q-grafana-dashboard", "ConfigMap/fp4qd-settings", "DaemonSet/fp4qd",
            "Namespace/fp4q-system", "NetworkPolicy/fp4qd", "PodDisruptionBudget/fp4qd",
            "PodMonitor/fp4qd", "PrometheusRule/fp4qd", "Service/fp4qd", "ServiceAccount/fp4qd"])
        for o in ds:
            if o["kind"] != "Namespace":
                self.assertEqual(o["metadata"]["namespace"], "fp4q-system", o["kind"])
        svc = find(ds, "Service", "fp4qd")
        self.assertEqual(svc["spec"]["internalTrafficPolicy"], "Local")
        _, spec, c = fp4qd_container(ds)
        self.assertEqual(c["image"], "registry.example.com/fp4q/fp4qd:0.1.0-cuda13")
        self.assertTrue(spec["hostIPC"] and spec["hostPID"])

        cpu = render("cpu")
        _, spec, c = fp4qd_container(cpu)
        self.assertEqual(c["image"], "registry.example.com/fp4q/fp4qd:0.1.0-cpu")
        self.assertIn("--backend=cpu", c["args"])
        self.assertFalse(spec["hostIPC"] or spec["hostPID"])
        self.assertNotIn("runtimeClassName", spec)
        self.assertNotIn("tolerations", spec)

        sidecar = render("sidecar")
        job, spec, c = fp4qd_container(sidecar)
        self.assertEqual(job["kind"], "Job")
        self.assertEqual(c["restartPolicy"], "Always")
        self.assertTrue(spec["shareProcessNamespace"])
        self.assertNotIn("namespace", job["metadata"])

    def test_access_defaults(self):
        """Unix sockets by uid (a settings knob), the fast socket on, a token on every listener,
        and for the node server a NetworkPolicy."""
        for name in ("daemonset", "sidecar", "cpu"):
            with self.subTest(overlay=name):
                objects = render(name)
                _, spec, c = fp4qd_container(objects)
                for flag in ("--unix_socket=/run/fp4q/fp4qd.sock",
                             "--unix_socket_allowed_uids=$(FP4Q_TRAINER_UIDS)",
                             "--fast_socket=/run/fp4q/fast.sock",
                             "--auth_token_file=/etc/fp4q/auth/token"):
                    self.assertIn(flag, c["args"])
                env = {e["name"]: e for e in c["env"]}
                self.assertEqual(env["FP4Q_TRAINER_UIDS"]["valueFrom"]["configMapKeyRef"],
                                 {"name": "fp4qd-settings", "key": "trainer_uids"})
                self.assertEqual(find(objects, "ConfigMap", "fp4qd-settings")["data"],
                                 {"trainer_uids": "65532"})
                [auth] = [v for v in spec["volumes"] if v["name"] == "auth"]
                self.assertEqual(auth["secret"], {"secretName": "fp4qd-auth", "defaultMode": 0o440})
        policy = find(render("daemonset"), "NetworkPolicy", "fp4qd")
        self.assertEqual(policy["metadata"]["namespace"], "fp4q-system")
        self.assertEqual([r["ports"][0]["port"] for r in policy["spec"]["ingress"]],
                         ["grpc", "metrics"])
        job, spec, _ = fp4qd_container(render("sidecar"))
        trainer = spec["containers"][0]
        env = {e["name"]: e for e in trainer["env"]}
        self.assertEqual(env["FP4Q_TOKEN"]["valueFrom"]["secretKeyRef"],
                         {"name": "fp4qd-auth", "key": "token"})
        self.assertEqual(env["FP4Q_FAST_SOCKET"]["value"], "/run/fp4q/fast.sock")
        [tmp] = [v for v in spec["volumes"] if v["name"] == "trainer-tmp"]
        self.assertEqual(tmp["emptyDir"], {"sizeLimit": "20Gi"})

    def test_monitoring_objects_carry_the_release_label(self):
        for name in ("daemonset", "sidecar", "cpu"):
            objects = render(name)
            for kind in ("PodMonitor", "PrometheusRule"):
                self.assertEqual(find(objects, kind, "fp4qd")["metadata"]["labels"]["release"],
                                 "kube-prometheus-stack", (name, kind))


class UserOverlayTest(unittest.TestCase):
    """The knobs README documents, set the documented way from a user's own overlay."""

    def test_release_label_and_trainer_uids_are_patched_from_an_overlay(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "kustomization.yaml"), "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(f"""\
                    apiVersion: kustomize.config.k8s.io/v1beta1
                    kind: Kustomization
                    resources:
                      - {os.path.join(OVERLAYS, "daemonset")}
                    patches:
                      - patch: |-
                          apiVersion: v1
                          kind: ConfigMap
                          metadata:
                            name: fp4qd-settings
                          data:
                            trainer_uids: "1000,1001"
                      - patch: |-
                          apiVersion: monitoring.coreos.com/v1
                          kind: PodMonitor
                          metadata:
                            name: fp4qd
                            labels:
                              release: prometheus
                      - patch: |-
                          apiVersion: monitoring.coreos.com/v1
                          kind: PrometheusRule
                          metadata:
                            name: fp4qd
                            labels:
                              release: prometheus
                    """))
            objects = kustomize_render.render(d)
        self.assertEqual(k8s_checks.check(objects), [])
        self.assertEqual(find(objects, "ConfigMap", "fp4qd-settings")["data"]["trainer_uids"],
                         "1000,1001")
        for kind in ("PodMonitor", "PrometheusRule"):
            self.assertEqual(find(objects, kind, "fp4qd")["metadata"]["labels"]["release"],
                             "prometheus")


class ChecksCatchBreakageTest(unittest.TestCase):
    """Each check must be able to fail: one deliberate defect per case."""

    def assertCaught(self, objects, substring):
        errors = k8s_checks.check(objects)
        self.assertTrue(any(substring in e for e in errors),
                        f"expected an error containing {substring!r}, got {errors}")

    def broken(self, overlay, mutate):
        objects = copy.deepcopy(render(overlay))
        mutate(objects)
        return objects

    def test_probe_service_names(self):
        def m(objs):
            fp4qd_container(objs)[2]["readinessProbe"]["grpc"]["service"] = "liveness"
        self.assertCaught(self.broken("daemonset", m),
                          "readinessProbe asks service 'liveness', expected 'readiness'")

        def m2(objs):
            fp4qd_container(objs)[2]["startupProbe"] = {"httpGet": {"port": 50051}}
        self.assertCaught(self.broken("sidecar", m2), "startupProbe must be a gRPC probe")

    def test_ports_follow_the_listen_flags(self):
        def m(objs):
            fp4qd_container(objs)[2]["ports"][0]["containerPort"] = 50052
        self.assertCaught(self.broken("daemonset", m), "port 'grpc' is 50052, --listen says 50051")

        def m2(objs):
            args = fp4qd_container(objs)[2]["args"]
            args[args.index("--metrics_listen=0.0.0.0:9450")] = "--metrics_listen=127.0.0.1:9450"
        self.assertCaught(self.broken("cpu", m2), "--metrics_listen on loopback")

    def test_unknown_flag(self):
        def m(objs):
            fp4qd_container(objs)[2]["args"].append("--drain_timeout=30")
        self.assertCaught(self.broken("daemonset", m),
                          "flag --drain_timeout is not a fp4qd flag in docs/DESIGN.md")

    def test_grace_period_covers_drain_and_checkpoint(self):
        def m(objs):
            fp4qd_container(objs)[1]["terminationGracePeriodSeconds"] = 60
        self.assertCaught(self.broken("daemonset", m),
                          "terminationGracePeriodSeconds 60 <= drain 30 s + checkpoint 43 s")

    def test_security_context(self):
        def m(objs):
            fp4qd_container(objs)[2]["securityContext"]["capabilities"]["drop"] = []
        self.assertCaught(self.broken("daemonset", m), "capabilities must drop ALL")

        def m2(objs):
            fp4qd_container(objs)[2]["securityContext"]["readOnlyRootFilesystem"] = False
        self.assertCaught(self.broken("sidecar", m2), "readOnlyRootFilesystem must be true")

        def m3(objs):
            init = fp4qd_container(objs)[1]["initContainers"][0]
            init["command"] = ["sh", "-c", "chown 65532 /var/lib/fp4q"]
        self.assertCaught(self.broken("daemonset", m3), "runs as root or adds capabilities")

    def test_cuda_ipc_requirements(self):
        def m(objs):
            fp4qd_container(objs)[1]["hostPID"] = False
        self.assertCaught(self.broken("daemonset", m), "needs hostIPC and hostPID")

        def m2(objs):
            fp4qd_container(objs)[1]["shareProcessNamespace"] = False
        self.assertCaught(self.broken("sidecar", m2), "needs shareProcessNamespace: true")

        def m3(objs):
            spec = fp4qd_container(objs)[1]
            del spec["containers"][0]["resources"]["claims"]
        self.assertCaught(self.broken("sidecar", m3), "no GPU claim shared with another container")

        def m4(objs):
            fp4qd_container(objs)[1]["hostIPC"] = True
        self.assertCaught(self.broken("cpu", m4), "hostIPC/hostPID without CUDA IPC")

    def test_state_dir_must_outlive_the_pod(self):
        def m(objs):
            spec = fp4qd_container(objs)[1]
            [vol] = [v for v in spec["volumes"] if v["name"] == "state"]
            vol.pop("persistentVolumeClaim")
            vol["emptyDir"] = {}
        self.assertCaught(self.broken("sidecar", m),
                          "--state_dir /var/lib/fp4q is not on a hostPath or PVC volume")

    def test_selectors_and_references(self):
        def m(objs):
            find(objs, "Service", "fp4qd")["spec"]["ports"][0]["targetPort"] = "grcp"
        self.assertCaught(self.broken("daemonset", m), "targetPort 'grcp' is not a port of its pods")

        def m2(objs):
            find(objs, "PodMonitor", "fp4qd")["spec"]["selector"]["matchLabels"] = {"a": "b"}
        self.assertCaught(self.broken("sidecar", m2), "PodMonitor fp4qd: selector matches no pod")

        def m3(objs):
            objs.remove(find(objs, "ResourceClaimTemplate", "fp4q-trainer-gpu"))
        self.assertCaught(self.broken("sidecar", m3), "uses missing template 'fp4q-trainer-gpu'")

        def m4(objs):
            find(objs, "PodDisruptionBudget", "fp4qd")["spec"] = {
                "maxUnavailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": "x"}}}
        errors = k8s_checks.check(self.broken("daemonset", m4))
        self.assertIn("PodDisruptionBudget fp4qd: selector matches no pod template", errors)
        self.assertIn("PodDisruptionBudget fp4qd: DaemonSet and Job pods allow only an integer "
                      "minAvailable", errors)

    def test_alerts_and_dashboard(self):
        def m(objs):
            rules = find(objs, "PrometheusRule", "fp4qd")["spec"]["groups"][0]["rules"]
            rules[:] = [r for r in rules if "NotServing" not in r["alert"]]
        self.assertCaught(self.broken("daemonset", m), "no alert for NotServing")

        def m2(objs):
            find(objs, "ConfigMap", "fp4q-grafana-dashboard")["data"]["fp4q.json"] = "{"
        self.assertCaught(self.broken("daemonset", m2), "fp4q.json is not JSON")

    def test_pod_network_needs_a_token_and_a_policy(self):
        def m(objs):
            args = fp4qd_container(objs)[2]["args"]
            args.remove("--auth_token_file=/etc/fp4q/auth/token")
        self.assertCaught(self.broken("daemonset", m), "--listen 0.0.0.0:50051 is on the pod "
                          "network without --auth_token_file: any pod could call DeleteWeight")
        self.assertCaught(self.broken("sidecar", m), "without --auth_token_file")

        def m2(objs):
            [vol] = [v for v in fp4qd_container(objs)[1]["volumes"] if v["name"] == "auth"]
            vol.pop("secret")
            vol["emptyDir"] = {}
        self.assertCaught(self.broken("cpu", m2),
                          "--auth_token_file /etc/fp4q/auth/token is not on a Secret volume")

        def m3(objs):
            objs.remove(find(objs, "NetworkPolicy", "fp4qd"))
        self.assertCaught(self.broken("daemonset", m3),
                          "no NetworkPolicy restricts who reaches the gRPC port 50051")

        def m4(objs):
            find(objs, "NetworkPolicy", "fp4qd")["spec"]["ingress"][0].pop("from")
        self.assertCaught(self.broken("daemonset", m4), "no NetworkPolicy restricts")

        def m5(objs):
            spec = fp4qd_container(objs)[1]
            spec["containers"][0]["env"] = [e for e in spec["containers"][0]["env"]
                                            if e["name"] != "FP4Q_TOKEN"]
        self.assertCaught(self.broken("sidecar", m5),
                          "container trainer: calls fp4qd (FP4Q_SERVER) but gets no FP4Q_TOKEN")

    def test_settings_references_and_sockets(self):
        def m(objs):
            c = fp4qd_container(objs)[2]
            c["env"] = [e for e in c["env"] if e["name"] != "FP4Q_TRAINER_UIDS"]
        self.assertCaught(self.broken("daemonset", m), "uses $(FP4Q_TRAINER_UIDS), which is not "
                          "an env var of the container")

        def m2(objs):
            find(objs, "ConfigMap", "fp4qd-settings")["data"] = {"uids": "1"}
        self.assertCaught(self.broken("sidecar", m2), "env FP4Q_TRAINER_UIDS reads key "
                          "'trainer_uids', which ConfigMap fp4qd-settings does not have")

        def m3(objs):
            args = fp4qd_container(objs)[2]["args"]
            args[args.index("--fast_socket=/run/fp4q/fast.sock")] = "--fast_socket=/srv/fast.sock"
        self.assertCaught(self.broken("daemonset", m3),
                          "--fast_socket /srv/fast.sock is not on a volume")

    def test_monitoring_release_label(self):
        def m(objs):
            del find(objs, "PodMonitor", "fp4qd")["metadata"]["labels"]["release"]
        self.assertCaught(self.broken("daemonset", m), "PodMonitor fp4qd: no 'release' label")

        def m2(objs):
            find(objs, "PrometheusRule", "fp4qd")["metadata"]["labels"]["release"] = "other"
        self.assertCaught(self.broken("sidecar", m2),
                          "PodMonitor and PrometheusRule carry different 'release' labels")

    def test_trainer_tmp_is_big_enough(self):
        def m(objs):
            [v] = [v for v in fp4qd_container(objs)[1]["volumes"] if v["name"] == "trainer-tmp"]
            v["emptyDir"] = {"medium": "Memory", "sizeLimit": "64Mi"}
        self.assertCaught(self.broken("sidecar", m), "container trainer: /tmp must be a disk "
                          "emptyDir of at least 8Gi")

        def m2(objs):
            [v] = [v for v in fp4qd_container(objs)[1]["volumes"] if v["name"] == "trainer-tmp"]
            v["emptyDir"] = {"sizeLimit": "2Gi"}
        self.assertCaught(self.broken("sidecar", m2), "/tmp must be a disk emptyDir")
        self.assertEqual(k8s_checks.quantity_bytes("20Gi"), 20 * 2**30)
        self.assertEqual(k8s_checks.quantity_bytes("1500M"), 1.5e9)
        self.assertIsNone(k8s_checks.quantity_bytes("lots"))

    def test_namespace_must_allow_host_namespaces(self):
        def m(objs):
            find(objs, "Namespace", "fp4q-system")["metadata"]["labels"][
                "pod-security.kubernetes.io/enforce"] = "baseline"
        self.assertCaught(self.broken("daemonset", m),
                          "hostIPC/hostPID need namespace 'fp4q-system' with Pod Security")


if __name__ == "__main__":
    unittest.main()
