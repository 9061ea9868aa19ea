"""Least squares for the scale bench's fits (benches/scale_fit.py, benches/scale_cpu.py), in
plain Python: a clean checkout's machine has no numpy, and the fits have a handful of columns.

- `lstsq`: ordinary least squares by QR (modified Gram-Schmidt on unit-norm columns), not by
  the normal equations, which square the design's condition number: the CPU fit's columns
  (transactions, changes, frames, deliveries per second) differ by orders of magnitude.
- `nnls`: non-negative least squares. A CPU cost per frame or per delivery cannot be negative;
  an unconstrained fit on noisy runs can make one so, and then sizes from a nonsense term.
  With k ≤ ~8 columns the exact answer is found by trying every subset of columns: the NNLS
  optimum is the unconstrained fit on its own support (every coefficient there ≥ 0), and
  every other subset whose fit is non-negative is feasible, so the feasible fit with the least
  squared residual is the optimum (2^k small fits, no iteration to converge or not).
- `vif`: variance inflation factors, how far each column is explained by the others (1: not at
  all; ≥ 10: the fit cannot tell that column's cost from the others'), printed beside a fit
  so that a design whose columns move together shows itself.

    python3 -m unittest benches/test_fit_lstsq.py
"""
import itertools
import math


class Singular(ValueError):
    """The design's columns are (nearly) linearly dependent: no unique fit."""


def lstsq(xs, ys, tol=1e-9):
    """The coefficients of the least-squares fit of ys on the rows xs (each a list of
    regressors; an intercept is a column of ones the caller includes). Raises Singular when a
    column is (within tol, relative) a combination of the ones before it."""
    m, k = len(xs), len(xs[0]) if xs else 0
    if m < k or k == 0:
        raise Singular(f"{m} points for {k} coefficients")
    cols = [[x[j] for x in xs] for j in range(k)]
    norms = [math.sqrt(sum(v * v for v in c)) for c in cols]
    if min(norms) == 0:
        raise Singular("a column is all zeros")
    q, r = [], [[0.0] * k for _ in range(k)]
    for j in range(k):
        v = [a / norms[j] for a in cols[j]]
        for i in range(j):
            r[i][j] = sum(a * b for a, b in zip(q[i], v))
            v = [a - r[i][j] * b for a, b in zip(v, q[i])]
        r[j][j] = math.sqrt(sum(a * a for a in v))
        if r[j][j] < tol:
            raise Singular(f"column {j} is a combination of the others")
        q.append([a / r[j][j] for a in v])
    qty = [sum(a * y for a, y in zip(q[i], ys)) for i in range(k)]
    z = [0.0] * k
    for i in reversed(range(k)):
        z[i] = (qty[i] - sum(r[i][j] * z[j] for j in range(i + 1, k))) / r[i][i]
    return [z[j] / norms[j] for j in range(k)]


def predict(coefs, x):
    return sum(c * v for c, v in zip(coefs, x))


def ssr(coefs, xs, ys):
    """The sum of squared residuals of coefs on (xs, ys)."""
    return sum((y - predict(coefs, x)) ** 2 for x, y in zip(xs, ys))


def nnls(xs, ys, keep=()):
    """Non-negative least squares of ys on xs, exactly (see the module's doc): the coefficients,
    each ≥ 0, zero where the optimum leaves a column out. Columns in `keep` (indices) are not
    constrained (an intercept may be negative). Raises Singular when no subset fits."""
    k = len(xs[0])
    free = [j for j in range(k) if j not in keep]
    best = None
    for size in range(len(free) + 1):
        for sub in itertools.combinations(free, size):
            cols = sorted(set(keep) | set(sub))
            if not cols:
                continue
            try:
                c = lstsq([[x[j] for j in cols] for x in xs], ys)
            except Singular:
                continue
            if any(v < 0 for j, v in zip(cols, c) if j not in keep):
                continue
            full = [0.0] * k
            for j, v in zip(cols, c):
                full[j] = v
            s = ssr(full, xs, ys)
            if best is None or s < best[0] - 1e-15:
                best = (s, full)
    if best is None:
        raise Singular("no subset of the columns can be fitted")
    return best[1]


def vif(xs, skip=(0,)):
    """The variance inflation factor of each column not in `skip` (by default the intercept,
    column 0, which the others are regressed with): 1 / (1 - R²) of that column on the rest.
    inf where a column is a combination of the others."""
    k = len(xs[0])
    out = {}
    for j in range(k):
        if j in skip:
            continue
        y = [x[j] for x in xs]
        rest = [[x[i] for i in range(k) if i != j] for x in xs]
        try:
            c = lstsq(rest, y)
        except Singular:
            out[j] = math.inf
            continue
        mean = sum(y) / len(y)
        tss = sum((v - mean) ** 2 for v in y)
        res = ssr(c, rest, y)
        out[j] = math.inf if res <= 1e-15 * max(tss, 1e-300) else tss / res
    return out
