#!/usr/bin/python3
"""The runtime image installs only `scripts/install-deps.sh --runtime` on debian:12-slim. This
checks, on this Debian 12 machine, that those packages (with their dependencies) and the base
image's required packages own every shared library that the built fp4qd and fp4q load.
libfp4q_cuda.so is not covered: its libraries come from NVIDIA's repository
(scripts/install-cuda.sh --runtime) and are checked by the Dockerfile's ldd step."""

import os
import re
import subprocess
import unittest

import design_contract

INSTALL_DEPS = os.path.join(design_contract.REPO, "scripts", "install-deps.sh")


def runtime_packages():
    with open(INSTALL_DEPS, encoding="utf-8") as f:
        m = re.search(r"^runtime_pkgs=\(([^)]*)\)", f.read(), re.M)
    if not m:
        raise AssertionError(f"{INSTALL_DEPS}: no runtime_pkgs=( ... )")
    return m.group(1).split()


def installed():
    """{package: (priority, [dependency clauses], [provided names])} of installed packages,
    from one dpkg-query call."""
    r = subprocess.run(["dpkg-query", "-W", "-f",
                        "${Package}\t${Priority}\t${db:Status-Abbrev}\t${Depends}, "
                        "${Pre-Depends}\t${Provides}\n"],
                       capture_output=True, text=True, timeout=120, check=True)
    out = {}
    for line in r.stdout.splitlines():
        name, priority, status, depends, provides = line.split("\t")
        if not status.startswith("ii"):
            continue
        clauses = [c.strip() for c in depends.split(",") if c.strip()]
        provided = [p.strip().split(" ")[0] for p in provides.split(",") if p.strip()]
        out[name] = (priority, clauses, provided)
    return out


def closure(pkgs, present):
    """pkgs and everything they depend on (Depends, Pre-Depends), among installed packages.
    Each alternative of 'a | b' is followed; virtual packages lead to their providers."""
    providers = {}
    for name, (_, _, provided) in present.items():
        for p in provided:
            providers.setdefault(p, set()).add(name)
    seen, todo = set(), list(pkgs)
    while todo:
        pkg = todo.pop().split(":")[0]
        if pkg in seen:
            continue
        seen.add(pkg)
        if pkg not in present:
            todo.extend(providers.get(pkg, ()))
            continue
        for clause in present[pkg][1]:
            for alt in clause.split("|"):
                name = alt.strip().split(" ")[0].split(":")[0]
                if name:
                    todo.append(name)
    return seen


def owners(binary):
    """{library path: Debian package} for every shared library `binary` loads."""
    r = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"ldd {binary}: {r.stderr}")
    paths = []
    for line in r.stdout.splitlines():
        if "not found" in line:
            raise AssertionError(f"{binary}: {line.strip()}")
        m = re.search(r"=>\s+(/\S+)", line) or re.match(r"\s*(/\S+)", line)
        if m:
            paths.append(m.group(1))  # linux-vdso has no file
    # Debian 12 merged /usr: a file may be registered under /lib or /usr/lib.
    candidates = {}
    for path in paths:
        for c in {path, os.path.realpath(path)}:
            for variant in (c, c[4:] if c.startswith("/usr/") else "/usr" + c):
                candidates.setdefault(variant, path)
    s = subprocess.run(["dpkg", "-S", *sorted(candidates)], capture_output=True, text=True,
                       timeout=120)
    out = {}
    for line in s.stdout.splitlines():
        pkgs, _, file = line.partition(": ")
        if file in candidates:
            out.setdefault(candidates[file], pkgs.split(",")[0].split(":")[0].strip())
    missing = [p for p in paths if p not in out]
    if missing:
        raise AssertionError(f"{binary}: no Debian package owns {missing}")
    return out


class RuntimeDepsTest(unittest.TestCase):
    def test_runtime_packages_cover_every_library(self):
        binaries = [os.environ["FP4Q_FP4QD"]]
        if os.environ.get("FP4Q_CLI"):
            binaries.append(os.environ["FP4Q_CLI"])
        present = installed()
        runtime = runtime_packages()
        for pkg in runtime:
            self.assertIn(pkg, present, f"runtime package {pkg} is not a Debian 12 package "
                                        "installed here")
        base = closure([p for p, (prio, _, _) in present.items() if prio == "required"],
                       present)
        covered = closure(runtime, present) | base
        needed = {}
        for binary in binaries:
            for path, pkg in owners(binary).items():
                needed.setdefault(pkg, set()).add(os.path.basename(path))
        print("libraries by package:", {k: sorted(v) for k, v in sorted(needed.items())})
        self.assertIn("libc6", needed)
        uncovered = {p: sorted(libs) for p, libs in needed.items() if p not in covered}
        self.assertEqual(uncovered, {}, "add these to runtime_pkgs in scripts/install-deps.sh")
        # The check can fail: without the runtime packages, gRPC's library is not covered.
        not_covered = [p for p in needed if p not in base]
        self.assertTrue(any(p.startswith("libgrpc++") for p in not_covered), not_covered)


if __name__ == "__main__":
    unittest.main()
