#!/usr/bin/python3
"""Checks the Dockerfile without a Docker engine (none runs here, and hadolint is not in Debian):
parses its instructions and checks stages, ARG scoping, the scripts it runs, the user of the
final image, the two variants (the CPU one must reach no CUDA step), ports, .dockerignore."""

import fnmatch
import json
import os
import re
import subprocess
import unittest

import design_contract

REPO = design_contract.REPO
DOCKERFILE = os.path.join(REPO, "Dockerfile")
VARIANTS = ("cuda", "cpu")


class DockerfileError(Exception):
    pass


def parse(text):
    """[(line number, INSTRUCTION, arguments)], continuation lines joined, comments dropped."""
    out = []
    pending, start = "", 0
    lines = text.split("\n")
    for number, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and (not stripped or stripped.startswith("#")):
            continue  # Docker drops empty and comment lines inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        pending += stripped
        m = re.match(r"([A-Za-z]+)\s+(.*)", pending, re.S)
        if not m:
            raise DockerfileError(f"line {start}: cannot parse {pending!r}")
        out.append((start, m.group(1).upper(), m.group(2).strip()))
        pending = ""
    if pending:
        raise DockerfileError("file ends inside a continued line")
    return out


class Stage:
    def __init__(self, line, base, name):
        self.line, self.base, self.name = line, base, name
        self.instructions = []
        self.args = set()

    def runs(self):
        return [a for _, i, a in self.instructions if i == "RUN"]


def stages(instructions):
    """(global ARG defaults, [Stage])."""
    global_args, out = {}, []
    for line, ins, args in instructions:
        if ins == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", args, re.I)
            if not m:
                raise DockerfileError(f"line {line}: FROM {args!r}")
            out.append(Stage(line, m.group(1), m.group(2)))
        elif ins == "ARG" and not out:
            name, _, default = args.partition("=")
            global_args[name] = default
        elif not out:
            raise DockerfileError(f"line {line}: {ins} before the first FROM")
        else:
            out[-1].instructions.append((line, ins, args))
            if ins == "ARG":
                out[-1].args.add(args.partition("=")[0])
    return global_args, out


def expand(text, values):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2),
                                                                m.group(0)), text)


def chain(all_stages, global_args, target, variant):
    """Stages the target needs for a variant: its FROM ancestry and COPY --from sources."""
    values = dict(global_args, FP4Q_VARIANT=variant)
    by_name = {s.name: s for s in all_stages if s.name}
    needed, todo = [], [target]
    while todo:
        name = todo.pop()
        stage = by_name[name]
        if stage in needed:
            continue
        needed.append(stage)
        base = expand(stage.base, values)
        if base in by_name:
            todo.append(base)
        for _, ins, args in stage.instructions:
            m = re.search(r"--from=(\S+)", args) if ins == "COPY" else None
            if m:
                todo.append(m.group(1))
    return needed


class DockerfileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(DOCKERFILE, encoding="utf-8") as f:
            cls.text = f.read()
        cls.instructions = parse(cls.text)
        cls.global_args, cls.stages = stages(cls.instructions)
        cls.by_name = {s.name: s for s in cls.stages if s.name}

    def test_parser_directive_and_global_args(self):
        self.assertTrue(self.text.startswith("# syntax=docker/dockerfile:1\n"))
        self.assertEqual(self.global_args, {"FP4Q_VARIANT": "cuda",
                                            "DEBIAN_IMAGE": "debian:12-slim",
                                            "CUDA_VERSION": "13.0"})

    def test_stages_are_named_uniquely_and_bases_resolve(self):
        names = [s.name for s in self.stages]
        self.assertEqual(names, ["toolchain-cpu", "toolchain-cuda", "build", "runtime-cpu",
                                 "runtime-cuda", "runtime"])
        for stage in self.stages:
            for variant in VARIANTS:
                base = expand(stage.base, dict(self.global_args, FP4Q_VARIANT=variant))
                self.assertNotIn("$", base, f"stage {stage.name}: unresolved {stage.base}")
                earlier = [s.name for s in self.stages[:self.stages.index(stage)]]
                self.assertTrue(base in earlier or base == "debian:12-slim",
                                f"stage {stage.name} ({variant}): base {base}")

    def test_args_used_in_a_stage_are_declared_in_it(self):
        for stage in self.stages:
            for line, ins, args in stage.instructions:
                if ins not in ("RUN", "ENV", "LABEL", "COPY", "WORKDIR"):
                    continue
                for m in re.finditer(r"\$\{(\w+)\}|\$(\w+)", args):
                    name = m.group(1) or m.group(2)
                    if name in self.global_args:
                        self.assertIn(name, stage.args,
                                      f"line {line}: global ARG {name} used in stage "
                                      f"{stage.name} without ARG {name} there")

    def test_copy_from_names_an_earlier_stage(self):
        for stage in self.stages:
            for line, ins, args in stage.instructions:
                m = re.search(r"--from=(\S+)", args) if ins == "COPY" else None
                if m:
                    earlier = [s.name for s in self.stages[:self.stages.index(stage)]]
                    self.assertIn(m.group(1), earlier, f"line {line}")

    def test_scripts_it_runs_exist_and_are_executable(self):
        used = set(re.findall(r"scripts/[\w.-]+\.sh", self.text))
        self.assertEqual(used, {"scripts/install-deps.sh", "scripts/install-cuda.sh",
                                "scripts/build.sh"})
        for rel in used:
            path = os.path.join(REPO, rel)
            self.assertTrue(os.path.isfile(path), rel)
            self.assertTrue(os.access(path, os.X_OK), f"{rel} is not executable")

    def shell_of(self, stage, variant):
        """The SHELL in force in a stage: its own, else its base stage's (Docker inherits it)."""
        while stage is not None:
            shell = [json.loads(a) for _, i, a in stage.instructions if i == "SHELL"]
            if shell:
                return shell[-1]
            base = expand(stage.base, dict(self.global_args, FP4Q_VARIANT=variant))
            stage = self.by_name.get(base)
        return ["/bin/sh", "-c"]

    def test_run_steps_are_valid_bash(self):
        for stage in self.stages:
            for variant in VARIANTS:
                self.assertEqual(self.shell_of(stage, variant),
                                 ["/bin/bash", "-o", "pipefail", "-c"], (stage.name, variant))
            for line, ins, args in stage.instructions:
                if ins != "RUN" or args.startswith("["):
                    continue
                r = subprocess.run(["bash", "-n", "-c", args], capture_output=True, text=True,
                                   timeout=30)
                self.assertEqual(r.returncode, 0, f"line {line}: {r.stderr}")

    def test_builds_with_the_ci_scripts(self):
        build = "\n".join(self.by_name["build"].runs())
        self.assertIn("scripts/build.sh --build-dir /build --no-deps", build)
        toolchain = "\n".join(self.by_name["toolchain-cpu"].runs())
        self.assertRegex(toolchain, r"scripts/install-deps\.sh &&")
        runtime = "\n".join(self.by_name["runtime-cpu"].runs())
        self.assertIn("/tmp/install-deps.sh --runtime", runtime)

    def test_variants_cpu_reaches_no_cuda_step(self):
        for variant in VARIANTS:
            needed = chain(self.stages, self.global_args, "runtime", variant)
            text = "\n".join(r for s in needed for r in s.runs())
            names = sorted(s.name for s in needed)
            if variant == "cpu":
                self.assertEqual(names, ["build", "runtime", "runtime-cpu", "toolchain-cpu"])
                self.assertNotIn("install-cuda", text)
            else:
                self.assertEqual(names, ["build", "runtime", "runtime-cpu", "runtime-cuda",
                                         "toolchain-cpu", "toolchain-cuda"])
                self.assertIn("install-cuda.sh --devel", text)
                self.assertIn("install-cuda.sh --runtime", text)

    def test_final_image_runs_fp4qd_as_non_root(self):
        final = self.stages[-1]
        self.assertEqual(final.name, "runtime")
        users = [a for _, i, a in final.instructions if i == "USER"]
        self.assertEqual(users, ["65532:65532"])
        self.assertIn("useradd --system --uid 65532 --gid 65532", "\n".join(final.runs()))
        user_line = [n for n, i, _ in final.instructions if i == "USER"][0]
        self.assertFalse([i for n, i, _ in final.instructions if n > user_line and i == "RUN"],
                         "RUN after USER would run as the service user at build time")
        entry = [a for _, i, a in final.instructions if i == "ENTRYPOINT"]
        self.assertEqual([json.loads(e) for e in entry], [["/opt/fp4q/bin/fp4qd"]])
        copies = [a for _, i, a in final.instructions if i == "COPY"]
        self.assertEqual(copies, ["--from=build /out/bin/ /opt/fp4q/bin/"])
        # The build stage installs exactly the server, the CLI and (CUDA) the module.
        build = "\n".join(self.by_name["build"].runs())
        self.assertIn("install -m 0755 /build/bin/fp4qd /build/bin/fp4q /out/bin/", build)
        self.assertIn("install -m 0644 /build/bin/libfp4q_cuda.so /out/bin/", build)

    def test_ports_match_design_defaults(self):
        flags = design_contract.server_flags()
        grpc_port = int(flags["--listen"].rsplit(":", 1)[1])
        metrics_port = int(flags["--metrics_listen"].rsplit(":", 1)[1])
        final = self.stages[-1]
        [expose] = [a for _, i, a in final.instructions if i == "EXPOSE"]
        self.assertEqual(expose.split(), [str(grpc_port), str(metrics_port)])
        [cmd] = [json.loads(a) for _, i, a in final.instructions if i == "CMD"]
        self.assertEqual(cmd, [f"--listen=0.0.0.0:{grpc_port}",
                               f"--metrics_listen=0.0.0.0:{metrics_port}"])

    def test_dockerignore_keeps_sources_and_drops_build_trees(self):
        with open(os.path.join(REPO, ".dockerignore"), encoding="utf-8") as f:
            patterns = [p.strip().lstrip("/") for p in f if p.strip() and
                        not p.startswith("#")]

        def ignored(rel):
            return any(fnmatch.fnmatch(rel, p) or rel.startswith(p.rstrip("/") + "/")
                       for p in patterns)
        for rel in ("build-deploy", "build", ".git"):
            self.assertTrue(ignored(rel), rel)
        for rel in ("CMakeLists.txt", "scripts/build.sh", "scripts/install-deps.sh",
                    "scripts/install-cuda.sh", "common", "kernels", "proto", "server", "client",
                    "tests", "docs"):
            self.assertFalse(ignored(rel), rel)

    def test_parser_rejects_garbage(self):
        with self.assertRaises(DockerfileError):
            parse("FROM debian:12 AS a\nRUN echo \\")
        with self.assertRaises(DockerfileError):
            stages(parse("RUN true\nFROM debian:12\n"))
        g, s = stages(parse("ARG X=1\nFROM debian:12 AS a\n# c\nRUN a \\\n  # inner\n  b\n"))
        self.assertEqual(g, {"X": "1"})
        self.assertEqual(s[0].instructions, [(4, "RUN", "a b")])


if __name__ == "__main__":
    unittest.main()
