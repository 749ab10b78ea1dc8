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


def dpkg_query(fmt, *pkgs):
    r = subprocess.run(["dpkg-query", "-W", "-f", fmt, *pkgs], capture_output=True, text=True,
                       timeout=60)
    return r.stdout


def installed():
    out = {}
    for line in dpkg_query("${Package}\t${Priority}\t${db:Status-Abbrev}\n").splitlines():
        name, priority, status = line.split("\t")
        if status.startswith("ii"):
            out[name] = priority
    return out


def closure(pkgs, present):
    """pkgs and everything they depend on (Depends, Pre-Depends), among installed packages.
    An alternative 'a | b' is satisfied by the installed ones; virtual packages by providers."""
    providers = {}
    for line in dpkg_query("${Package}\t${Provides}\n").splitlines():
        name, provides = line.split("\t")
        for p in filter(None, (x.strip().split(" ")[0] for x in provides.split(","))):
            providers.setdefault(p, set()).add(name)
    seen, todo = set(), list(pkgs)
    while todo:
        pkg = todo.pop().split(":")[0]
        if pkg in seen:
            continue
        if pkg not in present:
            for provider in providers.get(pkg, ()):
                todo.append(provider)
            seen.add(pkg)
            continue
        seen.add(pkg)
        deps = dpkg_query("${Depends}, ${Pre-Depends}", pkg)
        for clause in filter(None, (c.strip() for c in deps.split(","))):
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
    out = {}
    for line in r.stdout.splitlines():
        if "not found" in line:
            raise AssertionError(f"{binary}: {line.strip()}")
        m = re.search(r"=>\s+(/\S+)", line) or re.match(r"\s*(/\S+)", line)
        if not m:
            continue  # linux-vdso
        path = m.group(1)
        candidates = {path, os.path.realpath(path)}
        candidates |= {p[4:] if p.startswith("/usr/") else "/usr" + p for p in list(candidates)}
        owner = None
        for candidate in sorted(candidates):
            s = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True,
                               timeout=60)
            if s.returncode == 0:
                owner = s.stdout.split(":")[0].split(",")[0].strip()
                break
        if owner is None:
            raise AssertionError(f"{binary}: no Debian package owns {path}")
        out[path] = owner
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
        base = closure([p for p, prio in present.items() if prio == "required"], present)
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
