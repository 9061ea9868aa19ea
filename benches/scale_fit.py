#!/usr/bin/env python3
"""The figures of benches/scale.sh from its results.jsonl (one load-generator JSON line per
run, `service` = the case: rate-N, sat-N, steady, churn, fit-*, hold-*, mem-N): medians per
case, the fit of the service's CPU (benches/scale_cpu.py: its design, spread over rounds,
residuals and held-out errors), the fits of its memory over N, issue 31's goals met or not, and
a sizing table (Markdown) derived from the fits.

Memory fits, over N: the RssAnon of N idle subscribers (connected, caught up, no traffic; the
`--idle-s` sample of every run that took one: rate-N, fit-nN-*, mem-N) and the RssAnon peak
under load (the larger of each N's rate and saturated medians), each = m0 + m1 * N: m1 in KiB
per subscriber. The sizing table takes cores from the CPU fit, a frame per transaction per
subscriber (at most: batching sends fewer), with the range over the rounds' own fits.

    python3 benches/scale_fit.py RESULTS.jsonl
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fit_lstsq  # noqa: E402
import scale_cpu  # noqa: E402


def line(ns, ys):
    """(intercept, slope) of ys on ns."""
    return tuple(fit_lstsq.lstsq([[1.0, n] for n in ns], ys))


def med(rs, f):
    vals = [f(r) for r in rs]
    vals = [v for v in vals if v is not None and v == v]
    return statistics.median(vals) if vals else float("nan")


def main(path):
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    cases = {}
    for r in rows:
        cases.setdefault(r["service"], []).append(r)

    def order(c):
        kind, _, n = c.partition("-")
        return (kind not in ("rate", "sat"), kind in ("steady", "steady2x", "churn"), kind, int(n) if n.isdigit() else 0, n)

    print("\nmedians per case (runs; the fit-* runs are in the CPU fit's design below):")
    for c in sorted((c for c in cases if not c.startswith("fit-")), key=order):
        rs = cases[c]
        lat = lambda k: med(rs, lambda r: r["latencyMs"][k])
        idle = med(rs, lambda r: (r.get("idle") or {}).get("kibPerSub"))
        print(f"  {c:10} {rs[0]['subs']:5} subs, {rs[0]['targetTxnsPerS'] or 'sat':>5} txns/s: "
              f"{med(rs, lambda r: r['upstreamTxnsPerS']):7.0f} txns/s upstream, "
              f"{med(rs, lambda r: r['deliveriesPerS']):9.0f} deliveries/s, "
              f"{med(rs, lambda r: r['serviceCpuUsPerDelivery']):.3f} µs service CPU/delivery "
              f"({med(rs, lambda r: r['serviceCores']):.2f} cores; loadgen "
              f"{med(rs, lambda r: r['loadgenCpuUsPerDelivery']):.2f} µs, "
              f"{med(rs, lambda r: r.get('loadgenRssAnonMiB')):.0f} MiB), "
              f"RssAnon peak {med(rs, lambda r: r['serviceRssAnonPeakMiB']):.1f} MiB"
              + (f", idle {idle:.1f} KiB/sub" if idle == idle else "")
              + f"; p50 {lat('p50'):.2f} p99 {lat('p99'):.2f} p99.9 {lat('p999'):.2f} ms"
              + (f" (over {rs[0]['checkedSubs']} checked)" if rs[0].get("checkedSubs", rs[0]["subs"]) < rs[0]["subs"] else "")
              + ", "
              f"longest gap {med(rs, lambda r: r['longestCommitGapMs']):.1f} ms; "
              f"errors {sum(r['errors'] for r in rs)}; runs p99 {[r['latencyMs']['p99'] for r in rs]}"
              + (f"; waiting runnable: service {med(rs, lambda r: r['serviceSched']['waitMsPerS']):.0f} ms/s"
                 f" (runs {med(rs, lambda r: r['serviceSched']['runMsPerS']):.0f}), loadgen"
                 f" {med(rs, lambda r: r['loadgenSched']['waitMsPerS']):.0f} ms/s"
                 f" (runs {med(rs, lambda r: r['loadgenSched']['runMsPerS']):.0f})" if "serviceSched" in rs[0] else ""))

    scale = [r for c, rs in cases.items() if c.split("-")[0] in ("rate", "sat") for r in rs]
    fit = {}
    cpu = scale_cpu.report(rows)
    if cpu:
        fit["cpu"] = cpu
    per_n = {}
    for r in scale:
        per_n.setdefault(r["subs"], []).append(r)
    ns = sorted(per_n)
    if ns:
        print("\nµs of service CPU per delivery by N (median of rate / saturated runs): "
          + ", ".join(f"{n}: {med([r for r in per_n[n] if r['mode'] == 'rate'], lambda r: r['serviceCpuUsPerDelivery']):.3f}"
                      f" / {med([r for r in per_n[n] if r['mode'] == 'saturate'], lambda r: r['serviceCpuUsPerDelivery']):.3f}"
                      for n in ns))
    sat_ns = [n for n in ns if any(r["mode"] == "saturate" for r in per_n[n])]
    if len(sat_ns) >= 2:
        i, s = line(sat_ns, [med([r for r in per_n[n] if r["mode"] == "saturate"],
                                 lambda r: r["serviceCpuUsPerDelivery"]) for n in sat_ns])
        print(f"  saturated µs per delivery = {i:.4f} + {s * 1000:.4f} per 1,000 subscribers")
    idle_runs = {}
    for r in rows:
        if (r.get("idle") or {}).get("afterKiB") and r["subs"] > 0:
            idle_runs.setdefault(r["subs"], []).append(r)
    idle_after = {n: med(rs, lambda r: r["idle"]["afterKiB"]) for n, rs in idle_runs.items()}
    idle_ns = sorted(idle_after)
    if len(idle_ns) >= 2:
        m0, m1 = line(idle_ns, [idle_after[n] for n in idle_ns])
        fit.update(idle_m0=m0, idle_m1=m1)
        res = [idle_after[n] - (m0 + m1 * n) for n in idle_ns]
        print(f"\nmemory fit, idle subscribers (medians at N = {', '.join(map(str, idle_ns))}): RssAnon ="
              f" {m0 / 1024:.1f} MiB + {m1:.1f} KiB × N; residuals {', '.join(f'{v:+.0f}' for v in res)} KiB;"
              f" per subscriber in each run, median by N: "
              + ", ".join(f"{n}: {med(idle_runs[n], lambda r: r['idle']['kibPerSub']):.1f}" for n in idle_ns))
    if len(ns) >= 2:
        peaks = [max(med([r for r in per_n[n] if r["mode"] == m], lambda r: r["serviceRssAnonPeakMiB"])
                     for m in ("rate", "saturate") if any(r["mode"] == m for r in per_n[n])) for n in ns]
        p0, p1 = line(ns, [p * 1024 for p in peaks])
        fit.update(peak_m0=p0, peak_m1=p1)
        print(f"memory fit, peak under load: RssAnon = {p0 / 1024:.1f} MiB + {p1:.1f} KiB × N "
              f"(peaks {dict(zip(ns, [round(p, 1) for p in peaks]))} MiB)")

    print("\ngoals (issue 31; held = ≥ 97 % of the target rate upstream):")
    met = []

    def goal(case, p99_max, extra=None):
        rs = cases.get(case)
        if not rs:
            print(f"  {case}: not run")
            return
        target = rs[0]["targetTxnsPerS"]
        up, p99 = med(rs, lambda r: r["upstreamTxnsPerS"]), med(rs, lambda r: r["latencyMs"]["p99"])
        ok = up >= 0.97 * target and p99 <= p99_max and sum(r["errors"] for r in rs) == 0
        text = f"  {rs[0]['subs']} subscribers × {target:.0f} txns/s: {up:.0f} txns/s, p99 {p99:.2f} ms (≤ {p99_max})"
        if extra:
            more, ok_more = extra(rs)
            text, ok = text + more, ok and ok_more
        met.append((case, ok))
        print(text + (": met" if ok else ": MISSED"))

    goal("rate-256", 10)

    def memory(rs):
        peak = med(rs, lambda r: r["serviceRssAnonPeakMiB"])
        idle = med(rs, lambda r: (r.get("idle") or {}).get("kibPerSub"))
        slope = fit.get("idle_m1", float("nan"))
        return (f", RssAnon peak {peak:.1f} MiB (≤ 256), idle {idle:.1f} KiB per subscriber in the run,"
                f" {slope:.1f} by the fit (≤ 64)", peak <= 256 and idle <= 64 and not slope > 64)

    goal("rate-1024", 20, memory)
    if "sat-64" in cases:
        us = med(cases["sat-64"], lambda r: r["serviceCpuUsPerDelivery"])
        met.append(("sat-64", us <= 0.10))
        print(f"  64 saturated: {us:.3f} µs of service CPU per delivery (≤ 0.10; runs"
              f" {[r['serviceCpuUsPerDelivery'] for r in cases['sat-64']]})" + (": met" if us <= 0.10 else ": MISSED"))
    else:
        print("  sat-64: not run")
    if "steady" in cases and "churn" in cases:
        st, ch = cases["steady"], cases["churn"]
        p_st, p_ch = med(st, lambda r: r["latencyMs"]["p99"]), med(ch, lambda r: r["latencyMs"]["p99"])
        joins = sum((r.get("churn") or {}).get("joinsTotal", 0) for r in ch)
        errors = sum(r["errors"] for r in ch)
        empty = sum((r.get("churn") or {}).get("leftEmptyTotal", 0) for r in ch)
        change = p_ch / p_st - 1
        pairs = [f"{c['latencyMs']['p99'] / s['latencyMs']['p99'] - 1:+.0%}" for s, c in zip(st, ch)]
        ok = change <= 0.10 and errors == 0 and joins > 0
        met.append(("churn", ok))
        print(f"  churn: {ch[0]['churn']['subs']} joining and leaving at {ch[0]['churn']['rate']:.0f}/s beside"
              f" {ch[0]['subs']} steady at {ch[0]['targetTxnsPerS']:.0f} txns/s: steady p99 {p_st:.2f} → {p_ch:.2f} ms,"
              f" {change:+.1%} (≤ +10 %; per round {pairs}); {joins} joins, {errors} errors (gaps),"
              f" {empty} left with no transaction; {med(ch, lambda r: r['upstreamTxnsPerS']):.0f} txns/s upstream"
              + (": met" if ok else ": MISSED"))
        if "steady2x" in cases:
            both = cases["steady2x"]
            p_both = med(both, lambda r: r["latencyMs"]["p99"])
            print(f"    the churn alone: {both[0]['subs']} steady subscribers (as many connected as in the churn run, none"
                  f" joining) p99 {p_both:.2f} ms; with churn {p_ch:.2f} ms: {p_ch / p_both - 1:+.1%}"
                  f" (the rest of the change above is the extra subscribers' load, not their joining and leaving)")
    else:
        print("  churn: not run")
    if met:
        print(f"  met: {', '.join(c for c, ok in met if ok) or 'none'}; missed: {', '.join(c for c, ok in met if not ok) or 'none'}")

    if "cpu" in fit:
        sizing(fit, cases, ns)


def sizing(fit, cases, ns, changes=10, batched_hz=100):
    """The sizing table (Markdown): cores from the CPU fit (the range of the rounds' own fits
    beside), for a frame per transaction per subscriber (the most: what a service with CPU to
    spare sends) and for frames batched to `batched_hz` a second (a frame every 10 ms: what a
    service short of CPU does by itself, at that much more latency); memory from the
    peak-under-load fit (else the idle one)."""
    coefs, rounds = fit["cpu"]["coefs"], fit["cpu"]["rounds"]
    fitted = [r for c, rs in cases.items() if c.startswith("fit-") for r in rs]
    max_frames = max(r["framesPerS"] for r in fitted)
    max_deliveries = max(r["deliveriesPerS"] for r in fitted)
    c0, t, u, w, f, g, b = coefs
    mem_fit = ("peak_m0", "peak_m1", "peak under load") if "peak_m1" in fit else (
        ("idle_m0", "idle_m1", "idle") if "idle_m1" in fit else None)
    print(f"\nsizing (from the fits): {changes}-insert transactions (K), batched frames; cores = c0 + R·(t + K·u)"
          f" + F·(w + N·(f + g·N/1000)) + N·R·K·b = {c0:.3f} + R·{t + changes * u:.2f} µs"
          f" + F·({w:.1f} + N·({f:.3f} + {g:.3f}·N/1000)) µs"
          f" + N·R·{changes * b:.3f} µs, F = frames a second to each subscriber: R (a frame per transaction) or"
          f" at most {batched_hz} (a frame every {1000 / batched_hz:.0f} ms); [the range of the rounds' own fits, which the medians' fit may fall outside];"
          + (f" memory = the {mem_fit[2]} fit" if mem_fit else " no memory fit") +
          "; 'measured' = the run at that N and rate (its frames per transaction per subscriber);"
          f" † = past the fitted runs' frames/s or deliveries/s ({max_frames:,.0f}, {max_deliveries:,.0f}):\n")
    print(f"| subscribers | txns/s | deliveries/s | service cores, a frame per txn | service cores, ≤ {batched_hz}"
          " frames/s per subscriber | service RssAnon | measured |")
    print("|---|---|---|---|---|---|---|")

    def cell(n, rate, hz):
        cores = scale_cpu.sizing_cores(coefs, n, rate, changes, hz)
        each = [scale_cpu.sizing_cores(c, n, rate, changes, hz) for c in rounds]
        spread = f" [{min(each):.2f}–{max(each):.2f}]" if each else ""
        frames = n * (rate if hz is None else min(rate, hz))
        past = "†" if frames > max_frames or n * rate * changes > max_deliveries else ""
        return f"{cores:.2f}{spread}{past}"

    for n in (64, 256, 1024, 4096):
        for rate in (200, 2000):
            mem = (f"{(fit[mem_fit[0]] + fit[mem_fit[1]] * n) / 1024:.0f} MiB"
                   + (" (extrapolated)" if ns and n > max(ns) else "")) if mem_fit else "—"
            rs = [r for r in cases.get(f"rate-{n}", []) if r["targetTxnsPerS"] == rate]
            seen = (f"{med(rs, lambda r: r['upstreamTxnsPerS']):.0f} txns/s held, "
                    f"{med(rs, scale_cpu.cores_of):.2f} cores ({med(rs, lambda r: r['framesPerS'] / max(1.0, r['subs'] * r['upstreamTxnsPerS'])):.2f}), p99 "
                    f"{med(rs, lambda r: r['latencyMs']['p99']):.1f} ms") if rs else "not run"
            print(f"| {n:,} | {rate:,} | {n * rate * changes / 1e6:.2f} M | {cell(n, rate, None)} |"
                  f" {cell(n, rate, batched_hz)} | {mem} | {seen} |")


if __name__ == "__main__":
    main(sys.argv[1])
