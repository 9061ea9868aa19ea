#!/usr/bin/env python3
"""The figures of benches/scale.sh from its results.jsonl (one load-generator JSON line per
run, `service` = the case: rate-N, sat-N, steady, churn): medians per case, least-squares fits
of how the service's CPU and memory grow with the subscriber count N, issue 31's goals met or
not, and a sizing table (Markdown) derived from the fits.

CPU fit, over every rate-N and sat-N run (each run one point):
    service cores = c0 + f * (frames/s) + b * (deliveries/s)
frames are the websocket frames the subscribers received (each one write, one ack, one wake-up
in the service, however many changes it batches), deliveries the changes: f is the µs of
service CPU per frame, b per delivery, c0 the rest (ingest, timers). A fit on deliveries alone
goes wrong: a saturated run batches many transactions a frame and costs less CPU for more
deliveries than a run at a fixed rate. Beside it, each N's own median µs per delivery (all its
CPU over its deliveries), and a line through the saturated ones over N. The sizing assumes one
frame per transaction per subscriber (what a held rate with low latency sends; more batching
costs less).
Memory fits, over N: the RssAnon of N idle subscribers (connected, caught up, no traffic; the
rate-N runs' `--idle-s` sample) and the RssAnon peak under load (the larger of each N's rate
and saturated medians), each = m0 + m1 * N: m1 in KiB per subscriber.

    python3 benches/scale_fit.py RESULTS.jsonl
"""
import json
import statistics
import sys


def lstsq(xs, ys):
    """Least squares of ys on the rows xs (each a list of regressors, an intercept column
    included by the caller), by the normal equations; the coefficients."""
    k = len(xs[0])
    ata = [[sum(x[i] * x[j] for x in xs) for j in range(k)] for i in range(k)]
    aty = [sum(x[i] * y for x, y in zip(xs, ys)) for i in range(k)]
    # Gauss-Jordan with partial pivoting.
    m = [row[:] + [v] for row, v in zip(ata, aty)]
    for c in range(k):
        p = max(range(c, k), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12:
            raise ValueError("singular: too few distinct points for the fit")
        m[c], m[p] = m[p], m[c]
        for r in range(k):
            if r != c:
                f = m[r][c] / m[c][c]
                m[r] = [a - f * b for a, b in zip(m[r], m[c])]
    return [m[i][k] / m[i][i] for i in range(k)]


def line(ns, ys):
    """(intercept, slope) of ys on ns."""
    return tuple(lstsq([[1.0, n] for n in ns], ys))


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
        return (kind not in ("rate", "sat"), int(n) if n.isdigit() else 0, kind)

    print("\nmedians per case (runs):")
    for c in sorted(cases, key=order):
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
              + f"; p50 {lat('p50'):.2f} p99 {lat('p99'):.2f} p99.9 {lat('p999'):.2f} ms, "
              f"longest gap {med(rs, lambda r: r['longestCommitGapMs']):.1f} ms; "
              f"errors {sum(r['errors'] for r in rs)}; runs p99 {[r['latencyMs']['p99'] for r in rs]}"
              + (f"; waiting runnable: service {med(rs, lambda r: r['serviceSched']['waitMsPerS']):.0f} ms/s"
                 f" (runs {med(rs, lambda r: r['serviceSched']['runMsPerS']):.0f}), loadgen"
                 f" {med(rs, lambda r: r['loadgenSched']['waitMsPerS']):.0f} ms/s"
                 f" (runs {med(rs, lambda r: r['loadgenSched']['runMsPerS']):.0f})" if "serviceSched" in rs[0] else ""))

    scale = [r for c, rs in cases.items() if c.split("-")[0] in ("rate", "sat") for r in rs]
    fit = {}
    try:
        c0, f, b = lstsq([[1.0, r["framesPerS"], r["deliveriesPerS"]] for r in scale],
                         [r["serviceCores"] for r in scale])
        fit.update(c0=c0, f_us=f * 1e6, b_us=b * 1e6)
        print(f"\nCPU fit over {len(scale)} runs: service cores = {c0:.3f} + {f * 1e6:.3f} µs × frames/s"
              f" + {b * 1e6:.4f} µs × deliveries/s" + ("  (a negative term: too few or too noisy runs)" if min(f, b) < 0 else ""))
    except (ValueError, IndexError) as e:
        print(f"\nCPU fit: not possible ({e})")
    per_n = {}
    for r in scale:
        per_n.setdefault(r["subs"], []).append(r)
    ns = sorted(per_n)
    print("µs of service CPU per delivery by N (median of rate / saturated runs): "
          + ", ".join(f"{n}: {med([r for r in per_n[n] if r['mode'] == 'rate'], lambda r: r['serviceCpuUsPerDelivery']):.3f}"
                      f" / {med([r for r in per_n[n] if r['mode'] == 'saturate'], lambda r: r['serviceCpuUsPerDelivery']):.3f}"
                      for n in ns))
    sat_ns = [n for n in ns if any(r["mode"] == "saturate" for r in per_n[n])]
    if len(sat_ns) >= 2:
        i, s = line(sat_ns, [med([r for r in per_n[n] if r["mode"] == "saturate"],
                                 lambda r: r["serviceCpuUsPerDelivery"]) for n in sat_ns])
        print(f"  saturated µs per delivery = {i:.4f} + {s * 1000:.4f} per 1,000 subscribers")
    idle_after = {n: med(per_n[n], lambda r: (r.get("idle") or {}).get("afterKiB")) for n in ns}
    idle_ns = [n for n in ns if idle_after[n] == idle_after[n]]  # not NaN: measured
    if len(idle_ns) >= 2:
        m0, m1 = line(idle_ns, [idle_after[n] for n in idle_ns])
        fit.update(idle_m0=m0, idle_m1=m1)
        print(f"memory fit, idle subscribers: RssAnon = {m0 / 1024:.1f} MiB + {m1:.1f} KiB × N")
    if len(ns) >= 2:
        peaks = [max(med([r for r in per_n[n] if r["mode"] == m], lambda r: r["serviceRssAnonPeakMiB"])
                     for m in ("rate", "saturate") if any(r["mode"] == m for r in per_n[n])) for n in ns]
        p0, p1 = line(ns, [p * 1024 for p in peaks])
        fit.update(peak_m0=p0, peak_m1=p1)
        print(f"memory fit, peak under load: RssAnon = {p0 / 1024:.1f} MiB + {p1:.1f} KiB × N "
              f"(peaks {dict(zip(ns, [round(p, 1) for p in peaks]))} MiB)")

    print("\ngoals (issue 31; held = ≥ 97 % of the target rate upstream):")

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
        print(text + (": met" if ok else ": MISSED"))

    goal("rate-256", 10)

    def memory(rs):
        peak = med(rs, lambda r: r["serviceRssAnonPeakMiB"])
        idle = med(rs, lambda r: (r.get("idle") or {}).get("kibPerSub"))
        slope = fit.get("idle_m1", float("nan"))
        return (f", RssAnon peak {peak:.1f} MiB (≤ 256), idle {idle:.1f} KiB per subscriber in the run,"
                f" {slope:.1f} by the fit (≤ 64)", peak <= 256 and idle <= 64 and not slope > 64)

    goal("rate-1024", 20, memory)
    if "steady" in cases and "churn" in cases:
        st, ch = cases["steady"], cases["churn"]
        p_st, p_ch = med(st, lambda r: r["latencyMs"]["p99"]), med(ch, lambda r: r["latencyMs"]["p99"])
        joins = sum((r.get("churn") or {}).get("joinsTotal", 0) for r in ch)
        errors = sum(r["errors"] for r in ch)
        empty = sum((r.get("churn") or {}).get("leftEmptyTotal", 0) for r in ch)
        change = p_ch / p_st - 1
        pairs = [f"{c['latencyMs']['p99'] / s['latencyMs']['p99'] - 1:+.0%}" for s, c in zip(st, ch)]
        print(f"  churn: {ch[0]['churn']['subs']} joining and leaving at {ch[0]['churn']['rate']:.0f}/s beside"
              f" {ch[0]['subs']} steady at {ch[0]['targetTxnsPerS']:.0f} txns/s: steady p99 {p_st:.2f} → {p_ch:.2f} ms,"
              f" {change:+.1%} (≤ +10 %; per round {pairs}); {joins} joins, {errors} errors (gaps),"
              f" {empty} left with no transaction; {med(ch, lambda r: r['upstreamTxnsPerS']):.0f} txns/s upstream"
              + (": met" if change <= 0.10 and errors == 0 and joins > 0 else ": MISSED"))

    if {"c0", "f_us", "b_us", "peak_m0", "peak_m1"} <= fit.keys():
        changes = (scale[0]["changesPerTxn"] if scale else 10)
        print(f"\nsizing (from the fits; {changes}-insert transactions, batched frames; cores = the CPU fit,"
              f" memory = the peak-under-load fit; 'measured' = what the run at that N and rate did):\n")
        print("| subscribers | txns/s | deliveries/s (frames/s) | service CPU, cores (a frame per txn: at most) | service RssAnon | measured |")
        print("|---|---|---|---|---|---|")
        for n in (64, 256, 1024, 4096):
            for rate in (200, 2000):
                cores = fit["c0"] + (fit["f_us"] * n * rate + fit["b_us"] * n * rate * changes) / 1e6
                mem = (fit["peak_m0"] + fit["peak_m1"] * n) / 1024
                past = " (extrapolated)" if ns and n > max(ns) else ""
                rs = [r for r in cases.get(f"rate-{n}", []) if r["targetTxnsPerS"] == rate]
                seen = (f"{med(rs, lambda r: r['upstreamTxnsPerS']):.0f} txns/s held, p99 "
                        f"{med(rs, lambda r: r['latencyMs']['p99']):.1f} ms") if rs else "not run"
                print(f"| {n:,} | {rate:,} | {n * rate * changes / 1e6:.2f} M ({n * rate / 1e6:.2f} M) | {cores:.2f}{past} |"
                      f" {mem:.0f} MiB{past} | {seen} |")


if __name__ == "__main__":
    main(sys.argv[1])
