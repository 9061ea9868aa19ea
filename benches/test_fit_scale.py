"""Tests of benches/scale_cpu.py, the scale bench's CPU fit, one per rule, on runs made up from
a known model (the service's real runs are benches/scale.sh's, too slow for a test):

    python3 -m unittest discover -s benches -p 'test_fit_*.py'
"""
import os
import random
import statistics
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fit_lstsq as fl  # noqa: E402
import scale_cpu  # noqa: E402

# cores idle; µs per transaction, change ingested, fan-out, frame, frame per 1,000 subscribers,
# change delivered
TRUTH = [0.01, 20.0, 1.5, 200.0, 6.0, 3.0, 0.04]


def run(rng, label, n, rate, k, batch=1.0, noise=0.05):
    """A load-generator JSON line as the model says, its CPU off by `noise` (relative, normal)."""
    frames, deliveries = n * rate / batch, n * rate * k
    x = [1.0, rate / 1e6, rate * k / 1e6, frames / n / 1e6 if n else 0.0, frames / 1e6, frames * n / 1e9,
         deliveries / 1e6]
    cores = fl.predict(TRUTH, x) * rng.gauss(1, noise)
    return {"service": label, "subs": n, "changesPerTxn": k, "upstreamTxnsPerS": rate,
            "framesPerS": frames, "deliveriesPerS": deliveries, "seconds": 4.0,
            "serviceCpuS": cores * 4.0}


def designed(rng, rounds=3):
    """benches/scale.sh's default fit-* runs (FIT_INGEST, FIT_NS × FIT_KS at FIT_RATE, FIT_WIDE)."""
    rows = []
    for _ in range(rounds):
        for rate, k in ((1, 1), (400, 1), (400, 64), (2000, 1)):
            rows.append(run(rng, f"fit-n0-r{rate}-k{k}", 0, rate, k))
        for n in (8, 64):
            for k in (1, 16, 64):
                rows.append(run(rng, f"fit-n{n}-r400-k{k}", n, 400, k))
        for n, rate, k in ((256, 100, 1), (256, 100, 16), (1024, 25, 1)):
            rows.append(run(rng, f"fit-n{n}-r{rate}-k{k}", n, rate, k))
    return rows


def rate_runs(rng, rounds=3):
    """Runs of the rate-N kind alone: 10-change transactions, a frame per transaction."""
    return [run(rng, f"rate-{n}", n, rate, 10)
            for _ in range(rounds) for n, rate in ((64, 2000), (256, 1750), (1024, 200))]


def quiet(fn, *args):
    """fn's result, its printing swallowed."""
    with open(os.devnull, "w") as devnull:
        out, sys.stdout = sys.stdout, devnull
        try:
            return fn(*args)
        finally:
            sys.stdout = out


class CpuFit(unittest.TestCase):
    def test_designed_runs_recover_each_cost_within_the_noise(self):
        # 5 % noise a run: each seed's fit within its spread (b, the smallest share of the CPU, the
        # widest), their median unbiased.
        fits = [quiet(scale_cpu.report, designed(random.Random(seed))) for seed in range(60)]
        for j, per_seed, over_seeds in ((3, 0.3, 0.1), (4, 0.2, 0.05), (5, 0.5, 0.1), (6, 0.7, 0.1)):
            ratios = [got["pooled"][j] / TRUTH[j] for got in fits]
            for seed, v in enumerate(ratios):
                self.assertAlmostEqual(v, 1, delta=per_seed, msg=f"seed {seed}: {scale_cpu.TERMS[j][0]} × {v}")
            self.assertAlmostEqual(statistics.median(ratios), 1, delta=over_seeds, msg=scale_cpu.TERMS[j][0])
        self.assertTrue(all(len(got["rounds"]) == 3 for got in fits))

    def test_designed_columns_are_separable(self):
        xs = [scale_cpu.x_of(r) for r in designed(random.Random(1))]
        self.assertLess(max(fl.vif(xs).values()), 10)

    def test_fit_never_reports_a_negative_cost(self):
        rng = random.Random(3)
        rows = designed(rng)
        for r in rows:  # far noisier than any run: unconstrained, some term goes negative
            r["serviceCpuS"] *= rng.uniform(0.3, 1.7)
        got = quiet(scale_cpu.report, rows)
        for coefs in [got["pooled"], *got["rounds"]]:
            self.assertTrue(all(v >= 0 for v in coefs), coefs)

    def test_held_out_runs_are_predicted_from_their_measured_rates(self):
        rows = designed(random.Random(4))
        got = quiet(scale_cpu.report, rows)
        hold = run(random.Random(5), "rate-1024", 1024, 200, 10, noise=0)
        pred = fl.predict(got["pooled"], scale_cpu.x_of(hold))
        self.assertAlmostEqual(pred / scale_cpu.cores_of(hold), 1, delta=0.1)
        size = scale_cpu.sizing_cores(got["pooled"], 1024, 200, 10)
        self.assertAlmostEqual(size, pred, delta=1e-9)

    def test_cores_come_from_schedstat_unless_a_thread_exited_in_the_window(self):
        r = {"seconds": 4.0, "serviceCpuS": 0.1, "serviceSched": {"runMsPerS": 24.3}}
        self.assertAlmostEqual(scale_cpu.cores_of(r), 0.0243)  # within a tick: the precise one
        r["serviceSched"]["runMsPerS"] = 12.0  # a thread's time gone from schedstat
        self.assertAlmostEqual(scale_cpu.cores_of(r), 0.025)
        del r["serviceSched"]
        self.assertAlmostEqual(scale_cpu.cores_of(r), 0.025)

    def test_no_fit_runs_no_fit(self):
        self.assertIsNone(quiet(scale_cpu.report, rate_runs(random.Random(6))))


if __name__ == "__main__":
    unittest.main()
