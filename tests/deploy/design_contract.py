"""What docs/DESIGN.md fixes, read from the document itself: server flags and metrics.

The deploy checks compare manifests, alerts and the dashboard against these tables, so a flag or
metric renamed in DESIGN.md (the contract) makes them fail until deploy/ follows.
"""

import os
import re

REPO = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
DESIGN_MD = os.path.join(REPO, "docs", "DESIGN.md")

# Labels Prometheus attaches at scrape time (PodMonitor) and `le` of histogram buckets.
TARGET_LABELS = {"namespace", "pod", "container", "instance", "job", "endpoint", "service"}


class ContractError(Exception):
    pass


def _section(text, heading):
    m = re.search(r"^## " + re.escape(heading) + r".*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        raise ContractError(f"{DESIGN_MD}: no section '## {heading}'")
    return m.group(1)


def _table_rows(section):
    rows = []
    for line in section.splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append(cells)
    return rows[1:]  # without the header


def _ticked(cell):
    return re.findall(r"`([^`]*)`", cell)


def server_flags(path=DESIGN_MD):
    """{'--listen': '127.0.0.1:50051', ...}: every flag of fp4qd and its default."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    flags = {}
    for cells in _table_rows(_section(text, "Server flags")):
        names = _ticked(cells[0])
        if not names or not names[0].startswith("--"):
            continue
        default = _ticked(cells[1])
        flags[names[0]] = default[0] if default else ""
    if "--listen" not in flags or "--metrics_listen" not in flags:
        raise ContractError(f"{path}: server flag table lacks --listen or --metrics_listen")
    return flags


def metrics(path=DESIGN_MD):
    """{'fp4q_requests_total': ('counter', {'rpc', 'code'}), ...}."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = {}
    for cells in _table_rows(_section(text, "Metrics")):
        names = _ticked(cells[0])
        if not names or not names[0].startswith("fp4q_"):
            continue
        kind = cells[1].strip()
        labels = set()
        if len(cells) > 2:
            # Label names are the ticked words before any parenthesis; values are in ( ).
            label_part = re.sub(r"\([^)]*\)", "", cells[2])
            labels = {t for t in _ticked(label_part) if re.fullmatch(r"[a-z_]+", t)}
        out[names[0]] = (kind, labels)
    if not out:
        raise ContractError(f"{path}: no metrics table")
    return out


def series_names(metric_table):
    """Every series name the metrics produce: histograms give _bucket, _sum and _count."""
    names = {}
    for name, (kind, labels) in metric_table.items():
        if kind == "histogram":
            names[name + "_bucket"] = (name, labels | {"le"})
            names[name + "_sum"] = (name, labels)
            names[name + "_count"] = (name, labels)
        else:
            names[name] = (name, labels)
    return names


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{([^{}]*)\}")
_IDENT = re.compile(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_RANGE = re.compile(r"\[[^\]]*\]")


def promql_usage(expr):
    """Returns (metric names, label names used in matchers and groupings) of a PromQL
    expression. A small scanner, enough for the expressions in deploy/: the metric names are
    the identifiers beginning with fp4q_ outside strings and label matchers."""
    body = _STRING.sub('""', expr)
    body = _RANGE.sub("", body)
    labels = set()
    for m in _MATCHERS.finditer(body):
        for part in m.group(1).split(","):
            part = part.strip()
            if part:
                labels.add(re.match(r"[a-zA-Z_][a-zA-Z0-9_]*", part).group(0))
    for m in _GROUPING.finditer(body):
        labels.update(t.strip() for t in m.group(2).split(",") if t.strip())
    no_matchers = _MATCHERS.sub("", body)
    no_grouping = _GROUPING.sub("", no_matchers)
    names = {m.group(1) for m in _IDENT.finditer(no_grouping) if m.group(1).startswith("fp4q_")}
    return names, labels


def check_promql(expr, where, series=None):
    """Errors (strings) for metric names DESIGN.md does not list and labels no metric in the
    expression carries."""
    series = series if series is not None else series_names(metrics())
    names, labels = promql_usage(expr)
    errors = []
    if not names:
        errors.append(f"{where}: no fp4q_ metric in {expr!r}")
    allowed = set(TARGET_LABELS)
    for name in sorted(names):
        if name not in series:
            errors.append(f"{where}: metric '{name}' is not in docs/DESIGN.md")
        else:
            allowed |= series[name][1]
    for label in sorted(labels - allowed):
        errors.append(f"{where}: label '{label}' is not a label of {sorted(names)}")
    # rate() and increase() only make sense on counters (and a histogram's series).
    kinds = metrics_kinds(series)
    for m in _RATE_ARG.finditer(_STRING.sub('""', expr)):
        name = m.group(2)
        if name in series and kinds.get(name) == "gauge":
            errors.append(f"{where}: {m.group(1)}() of gauge '{name}'")
    for m in _QUANTILE_ARG.finditer(expr):
        if not m.group(1).endswith("_bucket"):
            errors.append(f"{where}: histogram_quantile over '{m.group(1)}', not a _bucket "
                          "series")
    return errors


_RATE_ARG = re.compile(r"\b(rate|irate|increase|delta)\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")
_QUANTILE_ARG = re.compile(
    r"histogram_quantile\s*\([^,]*,.*?\b(fp4q_[a-zA-Z0-9_:]*)", re.S)


def metrics_kinds(series):
    """{series name: 'counter' | 'gauge' | 'histogram'} from series_names()."""
    table = metrics()
    return {name: table[base][0] for name, (base, _) in series.items() if base in table}
