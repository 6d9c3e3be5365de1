#!/usr/bin/env python3
"""Renders every panel of the Grafana dashboard (conf/grafana/minibatchd.json) from a Prometheus
into PNG images, without Grafana: one image per panel, with the panel's title, its unit on the
value axis and a legend per series (the query's legendFormat, labels filled in).

    scripts/ops/render_dashboard.py --prometheus http://127.0.0.1:9090 [--out DIR] [--minutes 30]
                                [--start UNIX --end UNIX] [--dashboard FILE] [--instance RE] [--dataset RE]

Queries are the dashboard's, with $instance and $dataset as regular expressions (default: all)
and $__rate_interval as 4 steps (at least 10 s). A time series panel draws every target; a stat
panel draws its series and prints the last value in the title; a table panel prints its rows. A
query that returns nothing is said so on the image. Needs matplotlib (in .venv from
scripts/setup.sh); tests/prometheus.rs runs it against the Prometheus of its test.
"""

import argparse
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
UNITS = {"percentunit": "fraction (0-1)", "bytes": "bytes", "Bps": "bytes/s", "s": "seconds", "short": "", None: ""}


def query_range(base: str, expr: str, start: float, end: float, step: float):
    q = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{q}", timeout=60) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(fmt: str, metric: dict) -> str:
    if not fmt:
        return ",".join(f"{k}={v}" for k, v in sorted(metric.items()) if k != "__name__") or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)


def slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prometheus", required=True, help="base URL, e.g. http://127.0.0.1:9090")
    ap.add_argument("--out", default=str(ROOT / "target" / "dashboard"))
    ap.add_argument("--dashboard", default=str(ROOT / "conf" / "grafana" / "minibatchd.json"))
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--start", type=float)
    ap.add_argument("--end", type=float)
    ap.add_argument("--instance", default=".*")
    ap.add_argument("--dataset", default=".*")
    a = ap.parse_args()
    end = a.end or time.time()
    start = a.start or end - a.minutes * 60
    step = max(1.0, (end - start) / 300)
    rate = f"{max(10, int(4 * step))}s"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dash = json.loads(Path(a.dashboard).read_text())
    base = a.prometheus.rstrip("/")
    drawn = 0
    for panel in dash["panels"]:
        if panel.get("type") == "row":
            continue
        title = panel.get("title", "?")
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        unit = defaults.get("unit")
        overrides, labels_of = {}, {}
        for o in panel.get("fieldConfig", {}).get("overrides", []):
            if o.get("matcher", {}).get("id") == "byFrameRefID":
                for p in o.get("properties", []):
                    if p.get("id") == "unit":
                        overrides[o["matcher"]["options"]] = p["value"]
                    if p.get("id") == "custom.axisLabel":
                        labels_of[o["matcher"]["options"]] = p["value"]
        fig, ax = plt.subplots(figsize=(10, 4.5), dpi=90)
        right = None
        empty = []
        last = None
        for t in panel.get("targets", []):
            expr = t["expr"].replace("$instance", a.instance).replace("$dataset", a.dataset).replace("$__rate_interval", rate)
            t_unit = overrides.get(t.get("refId"), unit)
            axis = ax
            if t_unit != unit:
                right = right or ax.twinx()
                unit_text = UNITS.get(t_unit, t_unit)
                name = labels_of.get(t.get("refId"), "")
                right.set_ylabel(f"{name} ({unit_text})" if name and unit_text else name or unit_text)
                axis = right
            try:
                result = query_range(base, expr, start, end, step)
            except Exception as e:  # a broken query is drawn as such, and fails the run below
                print(f"{title}: {e}", file=sys.stderr)
                empty.append(f"{t.get('legendFormat') or t.get('refId')}: query failed")
                continue
            if not result:
                empty.append(f"{t.get('legendFormat') or t.get('refId')}: no data")
            for series in result:
                xs = [float(p[0]) - start for p in series["values"]]
                ys = [float(p[1]) for p in series["values"]]
                ys = [y if math.isfinite(y) else float("nan") for y in ys]
                axis.plot(xs, ys, label=legend(t.get("legendFormat", ""), series["metric"]), linestyle="--" if axis is not ax else "-")
                if ys:
                    last = ys[-1]
        ax.set_xlabel(f"seconds since {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(start))} UTC")
        ax.set_ylabel(UNITS.get(unit, unit or ""))
        shown = title + (f" (last: {last:.4g})" if panel.get("type") in ("stat", "table") and last is not None else "")
        ax.set_title(shown)
        handles, labels = ax.get_legend_handles_labels()
        if right is not None:
            h2, l2 = right.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        if handles:
            ax.legend(handles, labels, fontsize=7, loc="upper left", ncol=2)
        if empty:
            ax.text(0.5, 0.5, "\n".join(empty), transform=ax.transAxes, ha="center", va="center", fontsize=9, color="gray")
        fig.tight_layout()
        path = out / f"{panel.get('id', drawn):02d}-{slug(title)}.png"
        fig.savefig(path)
        plt.close(fig)
        drawn += 1
        print(path)
    print(f"{drawn} panels drawn into {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
