#!/usr/bin/env python3
"""Records and reports scripts/matrix results (standard library only).

  matrix_report.py record --work DIR --pair P --suite S --flavor F --root R
      --source PATH --kernel REL --exit-code N --wall-ms MS --timeout S
  matrix_report.py report --work DIR --out DIR --expect FILE --jobs N [--fresh]

`record` turns one pair's BuildResult (DIR/<pair>.result.json, if the
installer wrote one) and the builder root's .gpu-driver-root.json into
DIR/<pair>.record.json. `report` merges the records into OUT/matrix.json
(keeping earlier rows of pairs not run, unless --fresh), writes OUT/matrix.md,
and exits 1 if a pair run now does not match its expectation.
"""

import argparse
import datetime
import glob
import json
import os
import re
import sys

SUITES = ["bookworm", "trixie"]
FLAVORS = ["open", "proprietary"]
SOURCE_PACKAGE = {"open": "nvidia-open-kernel-source", "proprietary": "nvidia-kernel-source"}


def now():
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def upstream(version):
    """535.261.03-1 -> 535.261.03 (Debian revision and epoch dropped)."""
    return version.split(":")[-1].rsplit("-", 1)[0] if version else None


def log_tail(path, lines=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).strip()
    except OSError:
        return ""


def record(a):
    with open(os.path.join(a.root, ".gpu-driver-root.json")) as f:
        root = json.load(f)
    doc = None
    result_path = os.path.join(a.work, f"{a.pair}.result.json")
    if os.path.exists(result_path):
        try:
            with open(result_path) as f:
                doc = json.load(f)
        except ValueError:
            doc = None
    spec = (doc or {}).get("spec") or {}
    status = (doc or {}).get("status") or {}
    pkg = SOURCE_PACKAGE[a.flavor]
    pkg_version = root["packages"].get(pkg)
    headers = f"linux-headers-{a.kernel}"
    rec = {
        "pair": f"{a.suite}/{a.flavor}",
        "suite": a.suite,
        "flavor": a.flavor,
        "phase": status.get("phase"),
        "reason": status.get("reason"),
        "message": status.get("message", ""),
        "exitCode": a.exit_code,
        "wallSeconds": round(a.wall_ms / 1000, 1),
        "driverVersion": status.get("driverVersion") or spec.get("driverVersion") or upstream(pkg_version),
        "kernel": spec.get("kernelRelease") or spec.get("kernel") or a.kernel,
        "gcc": ((status.get("compiler") or {}).get("version")) or root.get("gcc"),
        "source": a.source,
        "sourcePackage": f"{pkg} {pkg_version}",
        "headersPackage": f"{headers} {root['packages'].get(headers, '?')}",
        "modules": [m.get("name") for m in status.get("modules") or [] if isinstance(m, dict)],
        "artifact": status.get("artifact"),
        "timings": status.get("timings") or {},
        "logExcerpt": (status.get("logExcerpt") or "")[-2000:],
        "builderRoot": {"suite": root["suite"], "key": root["key"], "created": root["created"]},
        "measured": now(),
    }
    if doc is None or not rec["phase"]:
        timed_out = a.exit_code == 124
        rec["phase"] = "NoResult"
        rec["reason"] = "Timeout" if timed_out else "NoResult"
        what = f"killed after {a.timeout} s" if timed_out else f"exit {a.exit_code}"
        rec["message"] = f"no BuildResult document ({what})"
        rec["logExcerpt"] = log_tail(os.path.join(a.work, f"{a.pair}.log"))
    with open(os.path.join(a.work, f"{a.pair}.record.json"), "w") as f:
        json.dump(rec, f, indent=2)
    print(f"{rec['pair']}: {rec['phase']} {rec['reason']} in {rec['wallSeconds']} s "
          f"(exit {a.exit_code}) {((rec['message'] or '').splitlines() or [''])[0][:200]}", file=sys.stderr)


def load_expect(path):
    with open(path) as f:
        doc = json.load(f)
    pairs = {}
    for pair, want in doc.get("pairs", {}).items():
        if isinstance(want, str):
            want = {"reason": want}
        pairs[pair] = want
    return pairs


def verdict(rec, expect):
    """pass / FAIL / reported, and why."""
    if rec["phase"] == "NoResult":
        return "FAIL", "the installer gave no result document"
    ok_exit = (rec["phase"] == "Succeeded") == (rec["exitCode"] == 0)
    if not ok_exit:
        return "FAIL", f"exit code {rec['exitCode']} disagrees with phase {rec['phase']}"
    want = expect.get(rec["pair"])
    if want is None:
        return "reported", "no expectation listed"
    if rec["reason"] != want.get("reason"):
        return "FAIL", f"expected {want.get('reason')}, got {rec['reason']}"
    return "pass", ""


def order(rec):
    s = SUITES.index(rec["suite"]) if rec["suite"] in SUITES else 99
    f = FLAVORS.index(rec["flavor"]) if rec["flavor"] in FLAVORS else 99
    return (s, rec["suite"], f, rec["flavor"])


def short_gcc(text):
    m = re.search(r"\) (\d+\.\d+(\.\d+)?)", text or "")
    return m.group(1) if m else (text or "?")


def markdown(results, jobs, expect_path):
    lines = [
        "# Build matrix",
        "",
        "Generated by `scripts/matrix` (do not edit by hand). Debian's packaged",
        "NVIDIA kernel-module sources (`/usr/src/nvidia-open-kernel.tar.xz`,",
        "`nvidia-kernel.tar.xz`) compiled by `gpu-driver-installer build` inside",
        "debootstrap builder roots (`scripts/builder-root`), for the root's own",
        f"cloud kernel headers, with `--jobs {jobs}`. Expectations:",
        f"`{expect_path}`; **pass** = outcome as expected, **FAIL** = not,",
        "*reported* = no expectation listed. Pairs that fail with",
        "`KernelApiMismatch` seed the catalog's exclusions",
        "(`scripts/matrix-exclusions`, see [compatibility.md](compatibility.md)).",
        "",
        "| root | gcc | driver | flavor | kernel | result | reason | expected | verdict | wall | measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        result = r["phase"]
        if r["modules"]:
            n = len(r["modules"])
            result += f" ({n} module{'s' if n != 1 else ''})"
        lines.append(
            f"| {r['suite']} | {short_gcc(r['gcc'])} | {r['driverVersion']} | {r['flavor']} "
            f"| {r['kernel']} | {result} | `{r['reason']}` | {r.get('expected') or '–'} "
            f"| **{r['verdict']}** | {r['wallSeconds']:.0f} s | {r['measured'][:10]} |"
        )
    notes = [r for r in results if r["phase"] != "Succeeded" or r["verdict"] == "FAIL"]
    if notes:
        lines += ["", "## Failures", ""]
        for r in notes:
            lines.append(f"**{r['pair']}** — `{r['reason']}`"
                         + (f" ({r['verdictNote']})" if r.get("verdictNote") else "") + ":")
            lines += ["", "```", (r["message"] or "").strip()[:1500], "```", ""]
            if r["phase"] == "NoResult" and r.get("logExcerpt"):
                lines += ["Installer log (tail):", "", "```", r["logExcerpt"][-1500:], "```", ""]
    lines += ["## Packages" if lines[-1] == "" else "\n## Packages", "", "| root | source package | headers package | root made |", "|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['suite']}/{r['flavor']} | {r['sourcePackage']} | {r['headersPackage']} "
                     f"| {r['builderRoot']['created'][:10]} (key {r['builderRoot']['key']}) |")
    return "\n".join(lines).rstrip() + "\n"


def report(a):
    expect = load_expect(a.expect)
    previous = {}
    path_json = os.path.join(a.out, "matrix.json")
    if not a.fresh and os.path.exists(path_json):
        with open(path_json) as f:
            previous = {r["pair"]: r for r in json.load(f).get("results", [])}
    new = {}
    for p in sorted(glob.glob(os.path.join(a.work, "*.record.json"))):
        with open(p) as f:
            rec = json.load(f)
        new[rec["pair"]] = rec
    merged = dict(previous)
    merged.update(new)
    results = sorted(merged.values(), key=order)
    failed = []
    for r in results:
        r["expected"] = (expect.get(r["pair"]) or {}).get("reason")
        r["verdict"], r["verdictNote"] = verdict(r, expect)
        if r["verdict"] == "FAIL" and r["pair"] in new:
            failed.append(r)
    doc = {
        "generated": now(),
        "generator": "scripts/matrix",
        "jobs": a.jobs,
        "expectations": a.expect,
        "results": results,
    }
    tmp = path_json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path_json)
    path_md = os.path.join(a.out, "matrix.md")
    with open(path_md + ".tmp", "w") as f:
        f.write(markdown(results, a.jobs, a.expect))
    os.replace(path_md + ".tmp", path_md)
    for r in results:
        mark = "*" if r["pair"] in new else " "
        print(f"{mark} {r['pair']:<22} {r['reason'] or '-':<18} expected {r['expected'] or '-':<18} "
              f"{r['verdict']:<8} {r['wallSeconds']:>6.0f} s  {r['verdictNote']}", file=sys.stderr)
    if failed:
        print(f"matrix: {len(failed)} pair(s) differ from {a.expect}: "
              + ", ".join(r["pair"] for r in failed), file=sys.stderr)
        return 1
    print(f"matrix: {len(new)} pair(s) run, all as expected or reported", file=sys.stderr)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--work", required=True)
    r.add_argument("--pair", required=True)
    r.add_argument("--suite", required=True)
    r.add_argument("--flavor", required=True, choices=FLAVORS)
    r.add_argument("--root", required=True)
    r.add_argument("--source", required=True)
    r.add_argument("--kernel", required=True)
    r.add_argument("--exit-code", type=int, required=True)
    r.add_argument("--wall-ms", type=int, required=True)
    r.add_argument("--timeout", type=int, required=True)
    p = sub.add_parser("report")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--expect", required=True)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--fresh", action="store_true")
    a = ap.parse_args()
    if a.cmd == "record":
        record(a)
        return 0
    return report(a)


if __name__ == "__main__":
    sys.exit(main())
