"""Fit the rational erf approximation used by the FFN op's GELU (paca_mm/ops/csrc/conv_ffn.cpp).

    erf(x) ~= x P(x^2) / Q(x^2) on [0, 3.9],  P, Q of degree 5, Q(0) = 1 (odd in x)

by iteratively reweighted linear least squares in float64: each round solves
x P(t) - erf(x) Q(t) = 0 weighted by 1 / Q_prev (Loeb's linearisation), then scales the
weights by sqrt(|error| / max error) (Lawson's step towards the minimax fit), keeping the best
round. Prints the coefficients (as in the C++ source) and the maximum error.

    python tools/fit_gelu_erf.py
"""
import argparse
import math

import numpy as np


def fit(dp: int = 5, dq: int = 5, rounds: int = 100, x_max: float = 4.0):
    # Chebyshev-distributed plus uniform points; the fit range extends past the op's clamp
    # at 3.9 so that the error does not grow at its end
    xs = x_max / 2 * (1 + np.cos(np.linspace(0, np.pi, 40001)))
    xs = np.unique(np.concatenate([xs, np.linspace(0, x_max, 20001)]))
    f = np.array([math.erf(v) for v in xs])
    t = xs * xs
    w, q = np.ones_like(xs), np.ones_like(xs)
    best = None
    for _ in range(rounds):
        a = np.concatenate([np.stack([xs * t ** i for i in range(dp + 1)], 1),
                            np.stack([-f * t ** j for j in range(1, dq + 1)], 1)], 1)
        weight = w / q
        sol = np.linalg.lstsq(a * weight[:, None], f * weight, rcond=None)[0]
        p_c, q_c = sol[:dp + 1], np.concatenate([[1.0], sol[dp + 1:]])
        p = sum(c * t ** i for i, c in enumerate(p_c))
        q = sum(c * t ** j for j, c in enumerate(q_c))
        err = np.abs(xs * p / q - f)
        if best is None or err.max() < best[0]:
            best = (err.max(), p_c, q_c)
        w = w * np.sqrt(err / err.max()) + 1e-3
        w /= w.max()
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--degrees', type=int, nargs=2, default=(5, 5), metavar=('P', 'Q'))
    args = parser.parse_args()
    err, p_c, q_c = fit(*args.degrees)
    print(f'max |erf error| on [0, 4]: {err:.3g}')
    print('P (t^0 ... t^5):', ', '.join(f'{c:.9e}' for c in p_c))
    print('Q (t^0 ... t^5):', ', '.join(f'{c:.9e}' for c in q_c))


if __name__ == '__main__':
    main()
