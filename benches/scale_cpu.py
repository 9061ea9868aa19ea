"""The CPU fit of benches/scale.sh (issue 31 item 1): how the service's CPU grows with its
subscribers, from the script's `fit-*` runs, checked on the runs it did not see.

The model, each term one kind of work the service does:

    service cores = c0 + t·txns/s + u·changes/s + w·fan-outs/s + (f + g·N/1000)·frames/s
                    + b·deliveries/s

  c0  idle: timers, the upstream's keep-alive (cores)
  t   per transaction ingested from the upstream: its commit, the change log's append, the ack
  u   per change ingested (each insert parsed and stored)
  w   per fan-out, however many subscribers it reaches (fan-outs/s = frames/s ÷ N: a
      transaction, or a batch of them, sent to every subscriber; 0 with none): the streamer's
      and the workers' wake-ups for it. Without it the first runs fitted ~26 µs a frame at 16
      subscribers and ~10 at 64 (load 6-7): the step from none to some subscribers is not per
      subscriber
  f   per websocket frame a subscriber receives, whatever it batches: its header, one write,
      one ack read, the wake-ups around them
  g   what a frame costs more per 1,000 subscribers: the second invocation with 1,024
      subscribers fitted without it under-predicted the 1,024-subscriber runs by 43-48 %, its
      own fit-n1024 run by 0.05 cores, and the 256 ones by 16 % (the sessions' state past the
      caches, or work per ack that scans the subscribers: not found yet)
  b   per change delivered: its bytes copied to the socket

t, u, w, f, g, b in µs of service CPU each (cores = µs × events/s / 10^6). What one more
subscriber costs at R transactions/s of K changes, a frame each, beside N others:
R·(f + 2·g·N/1000 + K·b) µs per second (its frames, and the g its presence adds to the others').

Why a designed set of runs: the script's first fit took the rate-N and saturated runs and
regressed on frames and deliveries alone. There frames and deliveries grow together (a frame
per transaction of 10 changes, or a few transactions a frame saturated), the service's own
ingest cost rides on the same runs, and each run is noisy: its per-delivery term came out
negative on the quiet run. Here each column moves on its own (the script prints each column's
variance inflation over these runs, and over the rate-N and sat-N runs, to show it):

  - no subscriber (`fit-n0-*`): t and u, at two rates and two transaction sizes, and c0 at 1
    txn/s;
  - N subscribers at one rate (`fit-nN-*`), the transaction's size K varied: frames stay, the
    deliveries grow K-fold (b); N varied at one K: frames and deliveries grow together (f), and
    the step from no subscriber to some is w;
  - many subscribers at a low rate (FIT_WIDE: 256 at 100 txns/s, 1,024 at 25): as many frames
    a second as 64 at 400 in a quarter or a sixteenth of the fan-outs (w against f), and up to
    the N the sizing is for, so that a cost per frame that grows with N shows in the residuals.

The headline fit is on each case's medians (a run that other work on the machine disturbed
moves a median less than a least-squares fit over every run); every run pooled is beside it.

The fit is non-negative least squares (benches/fit_lstsq.py): a negative cost cannot be, and a
fit that wants one is told by the unconstrained fit printed beside it. "Reliable" is shown, not
claimed: the columns' variance inflation, the fit of each round alone (median and range of each
coefficient over the rounds), each case's residual, and the prediction of every run the fit did
not see (the rate-N, sat-N, steady and `hold-*` runs), from its measured rates, with its error.
"""
import statistics

import fit_lstsq as fl

TERMS = [
    ("c0", "cores idle"),
    ("t", "µs per transaction ingested"),
    ("u", "µs per change ingested"),
    ("w", "µs per fan-out"),
    ("f", "µs per frame delivered"),
    ("g", "µs more per frame per 1,000 subscribers"),
    ("b", "µs per change delivered"),
]


def x_of(r):
    """The run's regressors: 1 and its txns/s, changes/s ingested, fan-outs/s (frames/s per
    subscriber), frames/s, frames/s × N/1000 and deliveries/s, each in millions a second (so
    the coefficients are µs per event)."""
    up, n = r["upstreamTxnsPerS"], r["subs"]
    return [1.0, up / 1e6, up * r["changesPerTxn"] / 1e6, r["framesPerS"] / n / 1e6 if n else 0.0,
            r["framesPerS"] / 1e6, r["framesPerS"] * n / 1e9, r["deliveriesPerS"] / 1e6]


def cores_of(r):
    """The service's CPU in the measured window, in cores: its threads' run time from
    schedstat (ns; `serviceSched`), unless that differs from utime + stime (`serviceCpuS`,
    10 ms ticks, exited threads included) by more than the ticks' resolution and 5 %: a
    thread that exited in the window drops out of the first. At 4 s, a tick is 0.0025 cores,
    10 % of a run at 0.025."""
    if not r.get("seconds"):
        return float("nan")
    ticks = r["serviceCpuS"] / r["seconds"]
    run = (r.get("serviceSched") or {}).get("runMsPerS")
    if run is None:
        return ticks
    run /= 1000
    return run if abs(run - ticks) <= 0.01 / r["seconds"] + 0.05 * ticks else ticks


def sizing_cores(coefs, n, rate, changes, fanouts=None):
    """Cores for n subscribers at `rate` txns/s of `changes` inserts, sent in `fanouts` frames
    a second to each subscriber: by default a frame per transaction (what a held rate at low
    latency sends, the most; a service short of CPU batches, and sends fewer). The model with
    frames = n·fanouts and deliveries = n·rate·changes."""
    c0, t, u, w, f, g, b = coefs
    fanouts = rate if fanouts is None else min(rate, fanouts)
    return (c0 + rate * (t + changes * u) / 1e6
            + (fanouts * (w + n * (f + g * n / 1000)) if n > 0 else 0.0) / 1e6
            + n * rate * changes * b / 1e6)


def by_round(rows):
    """{label: [runs in the order they ran]}: the i-th run of a label is round i's."""
    out = {}
    for r in rows:
        out.setdefault(r["service"], []).append(r)
    return out


def usable(r):
    return r.get("seconds") and r.get("serviceCpuS") is not None and r.get("framesPerS") is not None


def fmt(v, unit):
    return f"{v:.3f}" if unit == "cores idle" else f"{v:.4f}" if v < 1 else f"{v:.3f}"


def case_median(rs):
    """A run of the medians of a case's runs: its rates and its CPU (a run that other work on
    the machine disturbed moves a median less than a mean)."""
    m = lambda f: statistics.median(f(r) for r in rs)
    return {"service": rs[0]["service"], "subs": rs[0]["subs"], "changesPerTxn": rs[0]["changesPerTxn"],
            "upstreamTxnsPerS": m(lambda r: r["upstreamTxnsPerS"]), "framesPerS": m(lambda r: r["framesPerS"]),
            "deliveriesPerS": m(lambda r: r["deliveriesPerS"]), "seconds": 1.0, "serviceCpuS": m(cores_of)}


def report(rows):
    """Prints the fit, its spread, residuals and held-out errors; returns {"coefs": the fit on
    the cases' medians, "pooled": on every run, "rounds": [each round's]} or None when there
    are no fit runs."""
    cases = by_round([r for r in rows if usable(r)])
    fit_cases = {c: rs for c, rs in cases.items() if c.startswith("fit-")}
    if not fit_cases:
        print("\nCPU fit: no fit-* runs (FIT=0)")
        return None
    runs = [r for rs in fit_cases.values() for r in rs]
    xs, ys = [x_of(r) for r in runs], [cores_of(r) for r in runs]

    print(f"\nCPU fit: service cores = c0 + t·txns/s + u·changes/s + w·fan-outs/s + (f + g·N/1000)·frames/s + b·deliveries/s,"
          f" non-negative least squares over {len(runs)} fit-* runs ({len(fit_cases)} cases)")
    print("  the design (medians per case): txns/s, changes/s ingested, frames/s, deliveries/s →"
          " service cores; its threads' run-queue wait")
    for c in sorted(fit_cases, key=lambda c: [int(p[1:]) for p in c.split("-")[1:]]):
        rs = fit_cases[c]
        m = lambda f: statistics.median(f(r) for r in rs)
        wait = m(lambda r: (r.get("serviceSched") or {}).get("waitMsPerS", float("nan")))
        print(f"    {c:20} {m(lambda r: r['upstreamTxnsPerS']):7.0f} {m(lambda r: r['upstreamTxnsPerS'] * r['changesPerTxn']):8.0f}"
              f" {m(lambda r: r['framesPerS']):8.0f} {m(lambda r: r['deliveriesPerS']):9.0f} → {m(cores_of):.3f}"
              f" (runs {', '.join(f'{cores_of(r):.3f}' for r in rs)}); waited {wait:.0f} ms/s")
    inflation = fl.vif(xs)
    print("  variance inflation of each column over these runs (1: independent of the others; ≥ 10:"
          " not separable): " + ", ".join(f"{TERMS[j][0]} {v:.1f}" for j, v in inflation.items()))
    old = [r for c, rs in cases.items() if c.split("-")[0] in ("rate", "sat") for r in rs]
    if len(old) >= 3:
        try:
            vo = fl.vif([[1.0, x[4], x[6]] for x in map(x_of, old)])
            print(f"  (the rate-N and sat-N runs, frames and deliveries alone, as the first fit took them:"
                  f" f {vo[1]:.1f}, b {vo[2]:.1f})")
        except fl.Singular:
            pass

    meds = [case_median(rs) for rs in fit_cases.values()]
    mx, my = [x_of(r) for r in meds], [cores_of(r) for r in meds]
    try:
        coefs = fl.nnls(mx, my)
        pooled = fl.nnls(xs, ys)
    except fl.Singular as e:
        print(f"  not possible: {e}")
        return None
    try:
        free = fl.lstsq(xs, ys)
    except fl.Singular:
        free = [float("nan")] * len(TERMS)
    rounds = []
    for i in range(max(len(rs) for rs in fit_cases.values())):
        rr = [rs[i] for rs in fit_cases.values() if len(rs) > i]
        try:
            rounds.append(fl.nnls([x_of(r) for r in rr], [cores_of(r) for r in rr]))
        except fl.Singular:
            pass
    print(f"  coefficients: the fit (on each case's medians; used below) | each round alone ({len(rounds)}"
          " rounds): median [min – max] | every run pooled | pooled without the ≥ 0 constraint")
    for j, (name, unit) in enumerate(TERMS):
        per = [c[j] for c in rounds]
        spread = (f"{fmt(statistics.median(per), unit)} [{fmt(min(per), unit)} – {fmt(max(per), unit)}]"
                  if per else "—")
        print(f"    {name:2} {fmt(coefs[j], unit):>8} {unit:30} | {spread:28} | {fmt(pooled[j], unit):>8} |"
              f" {fmt(free[j], unit)}")
    tss = sum((y - statistics.mean(my)) ** 2 for y in my)
    res = fl.ssr(coefs, mx, my)
    print(f"  residuals of the fit (measured − fitted, on the medians; R² {1 - res / tss:.3f},"
          f" rms {(res / len(my)) ** 0.5:.3f} cores):")
    print("    " + "; ".join(f"{r['service']} {cores_of(r) - fl.predict(coefs, x_of(r)):+.3f}"
                             for r in sorted(meds, key=lambda r: r["service"])))

    held = {c: rs for c, rs in cases.items()
            if c.split("-")[0] in ("rate", "sat", "hold", "steady")}
    if held:
        print("  held out (runs the fit did not see), medians: measured cores | predicted from the run's"
              " measured rates (error) | the sizing formula, a frame per transaction (error);"
              " frames per transaction per subscriber; the service's run-queue wait")
        errors = []
        for c, rs in sorted(held.items()):
            meas = statistics.median(cores_of(r) for r in rs)
            pred = statistics.median(fl.predict(coefs, x_of(r)) for r in rs)
            size = statistics.median(
                sizing_cores(coefs, r["subs"], r["upstreamTxnsPerS"], r["changesPerTxn"]) for r in rs)
            fpt = statistics.median(r["framesPerS"] / max(1.0, r["upstreamTxnsPerS"] * r["subs"]) for r in rs)
            wait = statistics.median((r.get("serviceSched") or {}).get("waitMsPerS", float("nan")) for r in rs)
            print(f"    {c:20} {rs[0]['subs']:5} subs × {statistics.median(r['upstreamTxnsPerS'] for r in rs):6.0f}"
                  f" txns/s × {rs[0]['changesPerTxn']}: {meas:.3f} | {pred:.3f} ({pred / meas - 1:+.0%}) |"
                  f" {size:.3f} ({size / meas - 1:+.0%}); {fpt:.2f} frames/txn; waited {wait:.0f} ms/s")
            errors.append(pred / meas - 1)
        print(f"  held-out prediction errors: median {statistics.median(errors):+.0%}, from {min(errors):+.0%}"
              f" to {max(errors):+.0%} over {len(errors)} cases")
    f, g, b = coefs[4], coefs[5], coefs[6]
    one = lambda n, k: f + 2 * g * n / 1000 + k * b
    print(f"  one more subscriber, a frame per transaction: f + 2·g·N/1000 + K·b µs per transaction ="
          f" {one(64, 1):.3f} (K = 1) / {one(64, 10):.3f} (K = 10) beside 64, {one(1024, 10):.3f} (K = 10) beside 1,024:"
          f" at 200 txns/s of 10 {200 * one(64, 10) / 1e3:.2f} / {200 * one(1024, 10) / 1e3:.2f} millicores,"
          f" at 2,000 {2000 * one(64, 10) / 1e3:.2f} / {2000 * one(1024, 10) / 1e3:.2f}")
    return {"coefs": coefs, "pooled": pooled, "rounds": rounds}
