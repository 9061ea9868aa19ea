"""Tests of benches/fit_lstsq.py, the scale bench's least squares, one per rule:

    python3 -m unittest discover -s benches -p 'test_fit_*.py'
"""
import math
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fit_lstsq as fl  # noqa: E402


def design(rng, n=30):
    """Rows [1, a, b] with columns of very different scales, as the CPU fit's are."""
    return [[1.0, rng.uniform(0, 2000), rng.uniform(0, 2e6)] for _ in range(n)]



def nudged(c, xs, ys, by):
    """(the residual with one coefficient scaled by 1 ± `by`, the fit's own residual), for each
    coefficient and both directions: a minimum has no nudge that lowers it."""
    best = fl.ssr(c, xs, ys)
    for j in range(len(c)):
        for d in (1 + by, 1 - by):
            moved = c[:]
            moved[j] *= d
            yield fl.ssr(moved, xs, ys), best

class LeastSquares(unittest.TestCase):
    def test_least_squares_recovers_exact_coefficients_across_scales(self):
        rng = random.Random(1)
        xs = design(rng)
        truth = [0.02, 3e-6, 7e-8]
        ys = [fl.predict(truth, x) for x in xs]
        for got, want in zip(fl.lstsq(xs, ys), truth):
            self.assertAlmostEqual(got / want, 1.0, places=6)

    def test_least_squares_minimises_the_squared_residual(self):
        rng = random.Random(2)
        xs = design(rng)
        ys = [fl.predict([1.0, 2e-3, 1e-6], x) + rng.gauss(0, 0.1) for x in xs]
        c = fl.lstsq(xs, ys)
        for moved_ssr, best in nudged(c, xs, ys, 0.001):
            self.assertGreater(moved_ssr, best)

    def test_collinear_columns_are_refused(self):
        xs = [[1.0, v, 10 * v] for v in (1.0, 2.0, 3.0, 4.0)]
        with self.assertRaises(fl.Singular):
            fl.lstsq(xs, [1.0, 2.0, 3.0, 4.0])


class NonNegative(unittest.TestCase):
    def test_nnls_equals_least_squares_when_that_is_non_negative(self):
        rng = random.Random(3)
        xs = design(rng)
        ys = [fl.predict([0.5, 1e-3, 2e-7], x) + rng.gauss(0, 0.01) for x in xs]
        for a, b in zip(fl.nnls(xs, ys), fl.lstsq(xs, ys)):
            self.assertAlmostEqual(a, b, delta=1e-9 * max(1.0, abs(b)))

    def test_nnls_never_returns_a_negative_coefficient(self):
        rng = random.Random(4)
        xs = design(rng)
        # The truth has a negative slope on column 2: unconstrained least squares finds it.
        ys = [fl.predict([1.0, 1e-3, -1e-7], x) + rng.gauss(0, 0.01) for x in xs]
        self.assertLess(fl.lstsq(xs, ys)[2], 0)
        c = fl.nnls(xs, ys)
        self.assertTrue(all(v >= 0 for v in c))
        self.assertEqual(c[2], 0.0)
        # And it is the best non-negative fit: no feasible nudge lowers the residual.
        for moved_ssr, best in nudged(c, xs, ys, 0.01):
            self.assertGreaterEqual(moved_ssr, best)

    def test_nnls_leaves_kept_columns_unconstrained(self):
        xs = [[1.0, v] for v in (1.0, 2.0, 3.0, 4.0)]
        ys = [-5.0 + 2.0 * v for v in (1.0, 2.0, 3.0, 4.0)]
        c = fl.nnls(xs, ys, keep=(0,))
        self.assertAlmostEqual(c[0], -5.0)
        self.assertAlmostEqual(c[1], 2.0)


class Inflation(unittest.TestCase):
    def test_vif_is_one_for_orthogonal_columns_and_large_for_near_collinear_ones(self):
        grid = [[1.0, a, b] for a in (-1.0, 1.0) for b in (-1.0, 1.0)]
        for v in fl.vif(grid).values():
            self.assertAlmostEqual(v, 1.0)
        rng = random.Random(5)
        near = [[1.0, a, a * 10 + rng.gauss(0, 0.01)] for a in (rng.uniform(0, 1) for _ in range(20))]
        self.assertTrue(all(v > 100 for v in fl.vif(near).values()))
        exact = [[1.0, a, 2 * a] for a in (1.0, 2.0, 3.0)]
        self.assertTrue(all(math.isinf(v) for v in fl.vif(exact).values()))


if __name__ == "__main__":
    unittest.main()
