#!/usr/bin/python3
"""Unit tests of kustomize_render.py: the subset it renders, and refusal of everything else."""

import os
import tempfile
import textwrap
import unittest

import kustomize_render as kr

KHEAD = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"

DAEMONSET = """\
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: app
spec:
  template:
    spec:
      hostIPC: true
      tolerations:
        - key: a
          operator: Exists
      containers:
        - name: main
          image: fp4qd
          args: ["--a=1", "--b=2"]
          env:
            - name: KEEP
              value: "1"
            - name: CHANGE
              value: old
          ports:
            - containerPort: 50051
              name: grpc
        - name: other
          image: fp4qd-tools:1
"""


class RenderTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(text))
        return path

    def render_error(self, directory):
        with self.assertRaises(kr.RenderError) as ctx:
            kr.render(directory)
        return str(ctx.exception)

    def test_strategic_merge_patch_merges_by_key_replaces_atomic_lists_and_deletes_nulls(self):
        self.write("base/ds.yaml", DAEMONSET)
        self.write("base/kustomization.yaml", KHEAD + "resources: [ds.yaml]\n")
        self.write("o/patch.yaml", """\
            apiVersion: apps/v1
            kind: DaemonSet
            metadata:
              name: app
            spec:
              template:
                spec:
                  hostIPC: null
                  tolerations:
                    - key: b
                      operator: Exists
                  containers:
                    - name: main
                      args: ["--c=3"]
                      env:
                        - name: CHANGE
                          value: new
                        - name: ADDED
                          value: "2"
                      ports:
                        - containerPort: 9450
                          name: metrics
            """)
        self.write("o/kustomization.yaml", KHEAD + "resources: [../base]\n"
                   "patches:\n  - path: patch.yaml\n")
        [ds] = kr.render(os.path.join(self.root, "o"))
        spec = ds["spec"]["template"]["spec"]
        self.assertNotIn("hostIPC", spec)
        self.assertEqual(spec["tolerations"], [{"key": "b", "operator": "Exists"}])
        main, other = spec["containers"]
        self.assertEqual(main["args"], ["--c=3"])
        # kustomize's order: the patch's items, then the original items it did not name.
        self.assertEqual(main["env"], [{"name": "CHANGE", "value": "new"},
                                       {"name": "ADDED", "value": "2"},
                                       {"name": "KEEP", "value": "1"}])
        self.assertEqual([p["containerPort"] for p in main["ports"]], [9450, 50051])
        self.assertEqual(other, {"name": "other", "image": "fp4qd-tools:1"})

    def test_namespace_labels_images_and_generator(self):
        self.write("ds.yaml", DAEMONSET)
        self.write("ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n")
        self.write("d/f.json", '{"a": 1}\n')
        self.write("kustomization.yaml", KHEAD + textwrap.dedent("""\
            namespace: x
            resources: [ds.yaml, ns.yaml]
            labels:
              - pairs: {team: fp4q}
            images:
              - name: fp4qd
                newName: reg.example/fp4qd
                newTag: "1.2"
            configMapGenerator:
              - name: dash
                files: [d/f.json, renamed.json=d/f.json]
                literals: [k=v=w]
                options:
                  disableNameSuffixHash: true
                  labels: {grafana_dashboard: "1"}
            """))
        ds, ns, cm = kr.render(self.root)
        self.assertEqual(ds["metadata"]["namespace"], "x")
        self.assertNotIn("namespace", ns["metadata"])
        self.assertEqual(ds["metadata"]["labels"], {"team": "fp4q"})
        self.assertNotIn("metadata", ds["spec"]["template"])  # includeTemplates not set
        images = [c["image"] for c in ds["spec"]["template"]["spec"]["containers"]]
        self.assertEqual(images, ["reg.example/fp4qd:1.2", "fp4qd-tools:1"])
        self.assertEqual(cm["metadata"], {"name": "dash", "namespace": "x",
                                          "labels": {"grafana_dashboard": "1", "team": "fp4q"}})
        self.assertEqual(cm["data"], {"f.json": '{"a": 1}\n', "renamed.json": '{"a": 1}\n',
                                      "k": "v=w"})

    def test_unknown_kustomization_field_is_refused(self):
        self.write("ds.yaml", DAEMONSET)
        self.write("kustomization.yaml", KHEAD + "resources: [ds.yaml]\ncommonLabels: {a: b}\n")
        self.assertIn("unsupported field(s) ['commonLabels']", self.render_error(self.root))

    def test_patch_that_matches_nothing_is_refused(self):
        self.write("ds.yaml", DAEMONSET)
        self.write("p.yaml", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: nope\n")
        self.write("kustomization.yaml", KHEAD + "resources: [ds.yaml]\npatches:\n"
                   "  - path: p.yaml\n")
        self.assertIn("patch for DaemonSet.apps nope matches 0 resources",
                      self.render_error(self.root))

    def test_patch_directives_and_targets_are_refused(self):
        self.write("ds.yaml", DAEMONSET)
        self.write("p.yaml", DAEMONSET.replace("hostIPC: true", "$patch: replace"))
        self.write("kustomization.yaml", KHEAD + "resources: [ds.yaml]\npatches:\n"
                   "  - path: p.yaml\n")
        self.assertIn("patch directive '$patch'", self.render_error(self.root))
        self.write("kustomization.yaml", KHEAD + "resources: [ds.yaml]\npatches:\n"
                   "  - path: p.yaml\n    target: {kind: DaemonSet}\n")
        self.assertIn("patch field(s) ['target'] are not supported", self.render_error(self.root))

    def test_generator_with_name_hash_is_refused(self):
        self.write("f.txt", "x")
        self.write("kustomization.yaml", KHEAD + "configMapGenerator:\n  - name: c\n"
                   "    files: [f.txt]\n")
        self.assertIn("needs options.disableNameSuffixHash: true", self.render_error(self.root))

    def test_files_outside_the_tree_and_remote_resources_are_refused(self):
        outside = self.write("elsewhere/ds.yaml", DAEMONSET)
        self.write("k/kustomization.yaml", KHEAD + "resources: [../elsewhere/ds.yaml]\n")
        self.assertIn("is outside", self.render_error(os.path.join(self.root, "k")))
        self.assertTrue(os.path.isfile(outside))
        self.write("k/kustomization.yaml", KHEAD +
                   "resources: [https://github.com/x/y//deploy]\n")
        self.assertIn("is not a local path", self.render_error(os.path.join(self.root, "k")))

    def test_duplicates_missing_names_and_missing_files_are_refused(self):
        self.write("ds.yaml", DAEMONSET + "---\n" + DAEMONSET)
        self.write("kustomization.yaml", KHEAD + "resources: [ds.yaml]\n")
        self.assertIn("DaemonSet.apps app is defined twice", self.render_error(self.root))
        self.write("ds.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n")
        self.assertIn("ConfigMap without metadata.name", self.render_error(self.root))
        self.write("kustomization.yaml", KHEAD + "resources: [nope.yaml]\n")
        self.assertIn("resource 'nope.yaml' does not exist", self.render_error(self.root))

    def test_selector_labels_are_refused(self):
        self.write("ds.yaml", DAEMONSET)
        self.write("kustomization.yaml", KHEAD + "resources: [ds.yaml]\nlabels:\n"
                   "  - pairs: {a: b}\n    includeSelectors: true\n")
        self.assertIn("includeSelectors: true is not supported", self.render_error(self.root))


if __name__ == "__main__":
    unittest.main()
