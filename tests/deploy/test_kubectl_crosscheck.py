#!/usr/bin/python3
"""Cross-check of kustomize_render.py against real kustomize (`kubectl kustomize`), where a
kubectl is installed. kubectl is not a Debian package, so CI machines may lack it: then this
test exits 77, which ctest reports as skipped, saying why."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import yaml

import kustomize_render
import test_render

OVERLAYS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "deploy",
                        "overlays")
SKIP = 77


def kubectl_render(kubectl, directory):
    r = subprocess.run([kubectl, "kustomize", directory], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed: {r.stderr}")
    return list(yaml.safe_load_all(r.stdout))


def compare(kubectl, directory):
    ours = {kustomize_render.object_id(o): o for o in kustomize_render.render(directory)}
    theirs = {kustomize_render.object_id(o): o for o in kubectl_render(kubectl, directory)}
    errors = []
    if set(ours) != set(theirs):
        errors.append(f"{directory}: objects differ: only ours {sorted(set(ours) - set(theirs))}"
                      f", only kustomize {sorted(set(theirs) - set(ours))}")
    for oid in sorted(set(ours) & set(theirs)):
        if ours[oid] != theirs[oid]:
            errors.append(f"{directory}: {oid} differs:\n--- kustomize\n"
                          f"{yaml.safe_dump(theirs[oid])}\n--- ours\n{yaml.safe_dump(ours[oid])}")
    return errors, len(ours)


def main():
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("SKIPPED: kubectl is not installed (not a Debian package); the offline renderer "
              "was not cross-checked against kustomize on this machine")
        return SKIP
    version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True,
                             timeout=60).stdout.strip().replace("\n", "; ")
    print(f"kubectl: {version}")
    errors = []
    for name in sorted(os.listdir(OVERLAYS)):
        errs, count = compare(kubectl, os.path.join(OVERLAYS, name))
        print(f"overlay {name}: {count} objects, {'identical' if not errs else 'DIFFERENT'}")
        errors += errs
    # The renderer's own strategic-merge fixture, too (list order, nulls, atomic lists).
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in {
                "base/ds.yaml": test_render.DAEMONSET,
                "base/kustomization.yaml": test_render.KHEAD + "resources: [ds.yaml]\n",
                "o/patch.yaml": textwrap.dedent("""\
                    apiVersion: apps/v1
                    kind: DaemonSet
                    metadata: {name: app}
                    spec:
                      template:
                        spec:
                          hostIPC: null
                          tolerations: [{key: b, operator: Exists}]
                          containers:
                            - name: main
                              args: ["--c=3"]
                              env: [{name: CHANGE, value: new}, {name: ADDED, value: "2"}]
                              ports: [{containerPort: 9450, name: metrics}]
                    """),
                "o/kustomization.yaml": test_render.KHEAD + "resources: [../base]\n"
                                        "patches: [{path: patch.yaml}]\nnamespace: x\n"
                                        "images: [{name: fp4qd, newTag: '2'}]\n"}.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "w", encoding="utf-8") as f:
                f.write(text)
        errs, count = compare(kubectl, os.path.join(tmp, "o"))
        print(f"merge fixture: {count} objects, {'identical' if not errs else 'DIFFERENT'}")
        errors += errs
    for e in errors:
        print(e)
    print(f"{'FAILED' if errors else 'OK'}: renderer vs kubectl kustomize")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
