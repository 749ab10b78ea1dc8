"""Structural checks of rendered deploy/ overlays (what no cluster is here to refuse for us).

check(objects) returns a list of error strings, empty when every rule holds:
  - every object: known apiVersion/kind, a valid name and labels;
  - pods: non-root, read-only root filesystem, all capabilities dropped, seccomp RuntimeDefault,
    requests and memory limits, mounts of existing volumes, referenced ServiceAccount, PVC and
    ResourceClaimTemplate exist;
  - the fp4qd container: only flags DESIGN.md lists, ports named grpc/metrics equal to the
    ports of --listen/--metrics_listen, gRPC probes on "liveness" (startup, liveness) and
    "readiness", terminationGracePeriodSeconds above drain plus checkpoint time, --state_dir
    and the socket directory on volumes that outlive the container, and what CUDA IPC needs;
  - Services, PodMonitors, PDBs select pods that exist, by ports those pods declare;
  - alerts carry severity, summary and description; the dashboard ConfigMap holds JSON;
  - access: an fp4qd listening beyond loopback requires a bearer token (--auth_token_file on a
    Secret volume) and, as a node server, a NetworkPolicy admitting only chosen namespaces to
    its gRPC port; containers of its pod that call it get the token; the fast socket and the
    Unix socket live on volumes; $(VAR) references in args name env vars that exist (and the
    ConfigMap keys behind them);
  - the PodMonitor and PrometheusRule carry one `release` label (kube-prometheus-stack's
    default selectors match nothing else);
  - the trainer container of a sidecar pod has a /tmp of at least 8 GiB on disk.
"""

import json
import re

import design_contract

API_VERSIONS = {
    "Namespace": "v1", "ServiceAccount": "v1", "ConfigMap": "v1", "Service": "v1",
    "PersistentVolumeClaim": "v1", "DaemonSet": "apps/v1", "Job": "batch/v1",
    "PodDisruptionBudget": "policy/v1", "ResourceClaimTemplate": "resource.k8s.io/v1",
    "PodMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]"
                        r"{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
# Rough worst case for writing a checkpoint: a network volume at 100 MB/s.
CHECKPOINT_BYTES_PER_S = 100e6
GRACE_MARGIN_S = 10
REQUIRED_ALERT_WORDS = ("ErrorRatio", "LatencyP99", "QueueSaturated", "StateBudgetNearlyFull",
                        "NotServing")
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
# A PyTorch job's /tmp (compile and kernel caches): at least this much.
TRAINER_TMP_BYTES = 8 * 2**30
QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
QUANTITY_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
                  "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}


def quantity_bytes(text):
    """A Kubernetes quantity ("64Mi", "20Gi", "1000") in bytes, or None when malformed."""
    m = QUANTITY.match(str(text))
    return float(m.group(1)) * QUANTITY_UNITS[m.group(2)] if m else None


def _name(obj):
    return f"{obj['kind']} {obj['metadata']['name']}"


def _pod_spec(obj):
    if obj["kind"] in ("DaemonSet", "Job"):
        return obj.get("spec", {}).get("template", {}).get("spec")
    return None


def _pod_labels(obj):
    return obj.get("spec", {}).get("template", {}).get("metadata", {}).get("labels") or {}


def _containers(spec):
    return [("container", c) for c in spec.get("containers") or []] + [
        ("initContainer", c) for c in spec.get("initContainers") or []]


def _selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def parse_args(args, where, errors):
    """'--flag=value' list -> dict; flags DESIGN.md lacks are errors."""
    known = design_contract.server_flags()
    out = {}
    for arg in args or []:
        m = re.fullmatch(r"(--[a-z_]+)=(.*)", str(arg))
        if not m:
            errors.append(f"{where}: argument {arg!r} is not --flag=value")
            continue
        if m.group(1) not in known:
            errors.append(f"{where}: flag {m.group(1)} is not a fp4qd flag in docs/DESIGN.md")
        if m.group(1) in out:
            errors.append(f"{where}: flag {m.group(1)} given twice")
        out[m.group(1)] = m.group(2)
    return out


def _port_of(address):
    m = re.fullmatch(r"(.*):(\d+)", address or "")
    return (m.group(1), int(m.group(2))) if m else (None, None)


def _check_metadata(obj, errors):
    kind = obj["kind"]
    if kind not in API_VERSIONS:
        errors.append(f"{_name(obj)}: kind not expected in deploy/")
    elif obj["apiVersion"] != API_VERSIONS[kind]:
        errors.append(f"{_name(obj)}: apiVersion {obj['apiVersion']}, expected "
                      f"{API_VERSIONS[kind]}")
    name = obj["metadata"]["name"]
    pattern = DNS_LABEL if kind in ("Namespace", "Service") else DNS_SUBDOMAIN
    if not pattern.match(name):
        errors.append(f"{_name(obj)}: name {name!r} is not a valid {kind} name")
    labels = dict(obj["metadata"].get("labels") or {})
    labels.update(_pod_labels(obj))
    for key, value in labels.items():
        if not LABEL_NAME.match(str(key)) or not isinstance(value, str) or not LABEL_VALUE.match(
                value):
            errors.append(f"{_name(obj)}: label {key}={value!r} is not valid")


def _check_security(obj, spec, errors):
    where = _name(obj)
    psc = spec.get("securityContext") or {}
    if psc.get("runAsNonRoot") is not True or not psc.get("runAsUser"):
        errors.append(f"{where}: pod securityContext needs runAsNonRoot: true and a non-zero "
                      "runAsUser")
    if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
        errors.append(f"{where}: pod seccompProfile must be RuntimeDefault")
    for kind, c in _containers(spec):
        cw = f"{where} {kind} {c.get('name')}"
        sc = c.get("securityContext") or {}
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            errors.append(f"{cw}: capabilities must drop ALL")
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{cw}: allowPrivilegeEscalation must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            errors.append(f"{cw}: readOnlyRootFilesystem must be true")
        if sc.get("privileged"):
            errors.append(f"{cw}: privileged")
        added = caps.get("add") or []
        root = sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is False
        # One exception: a one-shot init container that only chowns hostPath directories.
        chown_only = (kind == "initContainer" and c.get("restartPolicy") != "Always"
                      and (c.get("command") or [""])[0] == "chown" and added == ["CHOWN"])
        if (root or added) and not chown_only:
            errors.append(f"{cw}: runs as root or adds capabilities {added}")
        if not root and sc.get("runAsNonRoot") is not True and psc.get("runAsNonRoot") is not True:
            errors.append(f"{cw}: runAsNonRoot must be true")
        res = c.get("resources") or {}
        if not (res.get("requests") or {}).get("cpu") or not (res.get("requests") or {}).get(
                "memory"):
            errors.append(f"{cw}: needs cpu and memory requests")
        if not (res.get("limits") or {}).get("memory"):
            errors.append(f"{cw}: needs a memory limit")
        image = c.get("image") or ""
        if ":" not in image.rsplit("/", 1)[-1] and "@" not in image:
            errors.append(f"{cw}: image {image!r} has no tag or digest")
        elif image.endswith(":latest"):
            errors.append(f"{cw}: image {image!r} uses :latest")


def _check_volumes(obj, spec, by_kind, errors):
    where = _name(obj)
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for kind, c in _containers(spec):
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                errors.append(f"{where} {kind} {c.get('name')}: mount of unknown volume "
                              f"{m.get('name')!r}")
    for v in volumes.values():
        claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and claim not in by_kind.get("PersistentVolumeClaim", {}):
            errors.append(f"{where}: volume {v['name']} uses missing PVC {claim!r}")
    sa = spec.get("serviceAccountName")
    if sa and sa not in by_kind.get("ServiceAccount", {}):
        errors.append(f"{where}: ServiceAccount {sa!r} is not defined")
    if spec.get("automountServiceAccountToken") is not False:
        errors.append(f"{where}: automountServiceAccountToken must be false (fp4qd uses no "
                      "Kubernetes API)")
    claims = {rc["name"]: rc for rc in spec.get("resourceClaims") or []}
    for rc in claims.values():
        tmpl = rc.get("resourceClaimTemplateName")
        if tmpl and tmpl not in by_kind.get("ResourceClaimTemplate", {}):
            errors.append(f"{where}: resourceClaim {rc['name']} uses missing template {tmpl!r}")
    for kind, c in _containers(spec):
        for cl in (c.get("resources") or {}).get("claims") or []:
            if cl.get("name") not in claims:
                errors.append(f"{where} {kind} {c.get('name')}: claim {cl.get('name')!r} is not "
                              "in spec.resourceClaims")
    return volumes


def _mount_volume(container, volumes, path):
    """The volume mounted at the longest mountPath that contains `path`."""
    best = None
    for m in container.get("volumeMounts") or []:
        mp = m["mountPath"].rstrip("/")
        if (path == mp or path.startswith(mp + "/")) and (best is None or len(mp) > len(
                best["mountPath"])):
            best = m
    return volumes.get(best["name"]) if best else None


def _check_probe(c, probe_name, service, grpc_port, where, errors):
    probe = c.get(probe_name)
    if not probe:
        errors.append(f"{where}: no {probe_name}")
        return
    g = probe.get("grpc")
    if not g:
        errors.append(f"{where}: {probe_name} must be a gRPC probe")
        return
    if g.get("service") != service:
        errors.append(f"{where}: {probe_name} asks service {g.get('service')!r}, expected "
                      f"{service!r}")
    if g.get("port") != grpc_port:
        errors.append(f"{where}: {probe_name} port {g.get('port')!r} is not the gRPC port "
                      f"{grpc_port}")


def _check_fp4qd(obj, spec, kind, c, volumes, by_kind, errors):
    where = f"{_name(obj)} {kind} {c.get('name')}"
    flags = parse_args(c.get("args"), where, errors)
    defaults = design_contract.server_flags()
    host, grpc_port = _port_of(flags.get("--listen", defaults["--listen"]))
    mhost, metrics_port = _port_of(flags.get("--metrics_listen", defaults["--metrics_listen"]))
    if host in ("127.0.0.1", "localhost", "[::1]"):
        errors.append(f"{where}: --listen on loopback; the kubelet's probes dial the pod IP")
    if mhost in ("127.0.0.1", "localhost", "[::1]"):
        errors.append(f"{where}: --metrics_listen on loopback; Prometheus cannot scrape it")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    if ports.get("grpc") != grpc_port:
        errors.append(f"{where}: port 'grpc' is {ports.get('grpc')}, --listen says {grpc_port}")
    if ports.get("metrics") != metrics_port:
        errors.append(f"{where}: port 'metrics' is {ports.get('metrics')}, --metrics_listen "
                      f"says {metrics_port}")
    _check_probe(c, "startupProbe", "liveness", grpc_port, where, errors)
    _check_probe(c, "livenessProbe", "liveness", grpc_port, where, errors)
    _check_probe(c, "readinessProbe", "readiness", grpc_port, where, errors)

    drain = int(flags.get("--drain_timeout_s", defaults["--drain_timeout_s"]))
    budget = int(flags.get("--state_budget_bytes", defaults["--state_budget_bytes"]))
    need = drain + budget / CHECKPOINT_BYTES_PER_S + GRACE_MARGIN_S
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace <= need:
        errors.append(f"{where}: terminationGracePeriodSeconds {grace} <= drain {drain} s + "
                      f"checkpoint {budget / CHECKPOINT_BYTES_PER_S:.0f} s + {GRACE_MARGIN_S} s")

    state_dir = flags.get("--state_dir", "")
    if not state_dir:
        errors.append(f"{where}: no --state_dir: state would not survive a restart")
    else:
        vol = _mount_volume(c, volumes, state_dir)
        if not vol or not (vol.get("hostPath") or vol.get("persistentVolumeClaim")):
            errors.append(f"{where}: --state_dir {state_dir} is not on a hostPath or PVC volume")
    for flag in ("--unix_socket", "--fast_socket"):
        sock = flags.get(flag, "")
        if sock and not _mount_volume(c, volumes, sock.rsplit("/", 1)[0]):
            errors.append(f"{where}: {flag} {sock} is not on a volume (read-only root)")
    _check_env_references(c, by_kind, where, errors)
    token = flags.get("--auth_token_file", "")
    if host not in LOOPBACK:
        if not token:
            errors.append(f"{where}: --listen {host}:{grpc_port} is on the pod network without "
                          "--auth_token_file: any pod could call DeleteWeight")
        else:
            vol = _mount_volume(c, volumes, token.rsplit("/", 1)[0])
            if not vol or not vol.get("secret"):
                errors.append(f"{where}: --auth_token_file {token} is not on a Secret volume")
        if token and obj["kind"] == "DaemonSet" and not _network_policy_for(
                obj, grpc_port, c, by_kind):
            errors.append(f"{where}: no NetworkPolicy restricts who reaches the gRPC port "
                          f"{grpc_port} of its pods")
    if token:
        for k2, other in _containers(spec):
            env = {e.get("name"): e for e in other.get("env") or []}
            if other is c or "FP4Q_SERVER" not in env:
                continue
            ref = ((env.get("FP4Q_TOKEN") or {}).get("valueFrom") or {}).get("secretKeyRef")
            if not ref:
                errors.append(f"{_name(obj)} {k2} {other.get('name')}: calls fp4qd "
                              "(FP4Q_SERVER) but gets no FP4Q_TOKEN from a Secret")

    backend = flags.get("--backend", defaults["--backend"])
    ipc = flags.get("--allow_cuda_ipc", defaults["--allow_cuda_ipc"]) == "true"
    if backend == "cpu":
        if ipc:
            errors.append(f"{where}: --allow_cuda_ipc with --backend=cpu")
        if spec.get("hostIPC") or spec.get("hostPID"):
            errors.append(f"{where}: hostIPC/hostPID without CUDA IPC")
    if ipc:
        _check_cuda_ipc(obj, spec, kind, c, by_kind, where, errors)
    return grpc_port, metrics_port


def _check_env_references(c, by_kind, where, errors):
    """$(VAR) in args must name an env var of the container (Kubernetes leaves unknown ones as
    the literal text); a configMapKeyRef must name a ConfigMap and key that exist."""
    env = {e.get("name"): e for e in c.get("env") or []}
    for arg in c.get("args") or []:
        for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(arg)):
            if var not in env:
                errors.append(f"{where}: argument {arg!r} uses $({var}), which is not an env "
                              "var of the container")
    for name, e in env.items():
        ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
        if not ref:
            continue
        cm = by_kind.get("ConfigMap", {}).get(ref.get("name"))
        if cm is None:
            errors.append(f"{where}: env {name} reads missing ConfigMap {ref.get('name')!r}")
        elif ref.get("key") not in (cm.get("data") or {}):
            errors.append(f"{where}: env {name} reads key {ref.get('key')!r}, which ConfigMap "
                          f"{ref.get('name')} does not have")


def _network_policy_for(obj, grpc_port, c, by_kind):
    """A NetworkPolicy selecting obj's pods, for Ingress, whose every rule names its sources and
    whose rules reaching the gRPC port admit only selected namespaces or pods."""
    labels = _pod_labels(obj)
    names = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    for np_ in by_kind.get("NetworkPolicy", {}).values():
        spec = np_.get("spec") or {}
        if np_["metadata"].get("namespace") != obj["metadata"].get("namespace"):
            continue
        if not _selects((spec.get("podSelector") or {}).get("matchLabels"), labels):
            continue
        if "Ingress" not in (spec.get("policyTypes") or []):
            continue
        rules = spec.get("ingress") or []
        if any(not r.get("from") for r in rules):
            continue  # a rule without sources admits every pod
        reaching = [r for r in rules if any(
            names.get(p.get("port"), p.get("port")) == grpc_port for p in r.get("ports") or [])]
        if reaching and all(src.get("namespaceSelector") or src.get("podSelector")
                            for r in reaching for src in r["from"]):
            return np_
    return None


def _check_cuda_ipc(obj, spec, kind, c, by_kind, where, errors):
    if obj["kind"] == "DaemonSet":
        if not spec.get("hostIPC") or not spec.get("hostPID"):
            errors.append(f"{where}: CUDA IPC with pods on the node needs hostIPC and hostPID")
        env = {e["name"]: e.get("value") for e in c.get("env") or []}
        if env.get("NVIDIA_VISIBLE_DEVICES") != "all":
            errors.append(f"{where}: a node server must see every GPU (NVIDIA_VISIBLE_DEVICES)")
        terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
        exprs = [e for t in terms or [] for e in t.get("matchExpressions") or []]
        if not any(e.get("key") == "nvidia.com/mig.strategy" and e.get("operator") == "NotIn"
                   for e in exprs):
            errors.append(f"{where}: MIG nodes are not excluded")
        ns = obj["metadata"].get("namespace")
        nsobj = by_kind.get("Namespace", {}).get(ns)
        if not nsobj or (nsobj["metadata"].get("labels") or {}).get(
                "pod-security.kubernetes.io/enforce") != "privileged":
            errors.append(f"{where}: hostIPC/hostPID need namespace {ns!r} with Pod Security "
                          "enforce=privileged")
    else:
        if spec.get("shareProcessNamespace") is not True:
            errors.append(f"{where}: a sidecar needs shareProcessNamespace: true (distinct PIDs)")
        if kind != "initContainer" or c.get("restartPolicy") != "Always":
            errors.append(f"{where}: the sidecar must be a native sidecar (initContainer with "
                          "restartPolicy: Always) so it stops after the trainer")
        mine = {cl["name"] for cl in (c.get("resources") or {}).get("claims") or []}
        others = [o for k, o in _containers(spec) if o is not c]
        shared = [o.get("name") for o in others if mine & {
            cl["name"] for cl in (o.get("resources") or {}).get("claims") or []}]
        if not mine or not shared:
            errors.append(f"{where}: no GPU claim shared with another container (same "
                          "physical GPU)")


def _check_workload(obj, by_kind, errors):
    spec = _pod_spec(obj)
    if not spec:
        errors.append(f"{_name(obj)}: no pod template")
        return None
    labels = _pod_labels(obj)
    if obj["kind"] == "DaemonSet":
        sel = (obj["spec"].get("selector") or {}).get("matchLabels")
        if not _selects(sel, labels):
            errors.append(f"{_name(obj)}: selector {sel} does not match template labels")
    _check_security(obj, spec, errors)
    volumes = _check_volumes(obj, spec, by_kind, errors)
    servers = [(k, c) for k, c in _containers(spec) if c.get("image", "").split("/")[-1]
               .startswith("fp4qd") and c.get("args")]
    ports = {}
    for k, c in _containers(spec):
        for p in c.get("ports") or []:
            ports[p.get("name")] = p.get("containerPort")
            ports[p.get("containerPort")] = p.get("containerPort")
    for k, c in servers:
        _check_fp4qd(obj, spec, k, c, volumes, by_kind, errors)
    if obj["kind"] == "Job" and servers:
        for k, c in _containers(spec):
            if (k, c) in servers or k != "container":
                continue
            vol = _mount_volume(c, volumes, "/tmp")
            empty = (vol or {}).get("emptyDir")
            size = quantity_bytes(empty.get("sizeLimit")) if empty and empty.get(
                "sizeLimit") else None
            if empty is None or empty.get("medium") == "Memory" or (
                    empty.get("sizeLimit") and (size is None or size < TRAINER_TMP_BYTES)):
                errors.append(f"{_name(obj)} container {c.get('name')}: /tmp must be a disk "
                              f"emptyDir of at least {TRAINER_TMP_BYTES // 2**30}Gi (a PyTorch "
                              "job's caches), got " + (str(empty) if vol else "no volume"))
    return {"labels": labels, "ports": ports, "servers": len(servers)}


def check(objects):
    errors = []
    by_kind = {}
    for obj in objects:
        _check_metadata(obj, errors)
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj
    pods = {}
    for obj in objects:
        if obj["kind"] in ("DaemonSet", "Job"):
            info = _check_workload(obj, by_kind, errors)
            if info:
                pods[_name(obj)] = info
    if not any(p["servers"] for p in pods.values()):
        errors.append("no workload runs fp4qd")

    def matching(selector):
        return [p for p in pods.values() if _selects(selector, p["labels"])]

    for svc in by_kind.get("Service", {}).values():
        targets = matching(svc["spec"].get("selector"))
        if not targets:
            errors.append(f"{_name(svc)}: selector matches no pod template")
        for port in svc["spec"].get("ports") or []:
            tp = port.get("targetPort", port.get("port"))
            if targets and not all(tp in p["ports"] for p in targets):
                errors.append(f"{_name(svc)}: targetPort {tp!r} is not a port of its pods")
    for pm in by_kind.get("PodMonitor", {}).values():
        targets = matching((pm["spec"].get("selector") or {}).get("matchLabels"))
        if not targets:
            errors.append(f"{_name(pm)}: selector matches no pod template")
        for ep in pm["spec"].get("podMetricsEndpoints") or []:
            if ep.get("port") != "metrics" or not all("metrics" in p["ports"] for p in targets):
                errors.append(f"{_name(pm)}: endpoint port {ep.get('port')!r} is not the pods' "
                              "'metrics' port")
    releases = {}
    for kind in ("PodMonitor", "PrometheusRule"):
        for o in by_kind.get(kind, {}).values():
            release = (o["metadata"].get("labels") or {}).get("release")
            if not release:
                errors.append(f"{_name(o)}: no 'release' label: kube-prometheus-stack's default "
                              "podMonitorSelector/ruleSelector would ignore it")
            releases[_name(o)] = release
    if len(set(releases.values())) > 1:
        errors.append(f"PodMonitor and PrometheusRule carry different 'release' labels: {releases}")
    for pdb in by_kind.get("PodDisruptionBudget", {}).values():
        if not matching((pdb["spec"].get("selector") or {}).get("matchLabels")):
            errors.append(f"{_name(pdb)}: selector matches no pod template")
        if not isinstance(pdb["spec"].get("minAvailable"), int) or "maxUnavailable" in pdb[
                "spec"]:
            errors.append(f"{_name(pdb)}: DaemonSet and Job pods allow only an integer "
                          "minAvailable")
    for rule in by_kind.get("PrometheusRule", {}).values():
        alerts = [r for g in rule["spec"].get("groups") or [] for r in g.get("rules") or []
                  if "alert" in r]
        for r in alerts:
            ann = r.get("annotations") or {}
            if not (r.get("labels") or {}).get("severity") or not ann.get(
                    "summary") or not ann.get("description"):
                errors.append(f"{_name(rule)}: alert {r['alert']} needs labels.severity, "
                              "annotations.summary and annotations.description")
        for word in REQUIRED_ALERT_WORDS:
            if not any(word in r["alert"] for r in alerts):
                errors.append(f"{_name(rule)}: no alert for {word}")
    for cm in by_kind.get("ConfigMap", {}).values():
        for key, value in (cm.get("data") or {}).items():
            if key.endswith(".json"):
                try:
                    json.loads(value)
                except ValueError as e:
                    errors.append(f"{_name(cm)}: {key} is not JSON: {e}")
    return errors
