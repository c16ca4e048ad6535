"""Statistics the tests use, computed here rather than taken from a further dependency."""
from __future__ import annotations

import torch


def chisquare_pvalue(observed, expected=None) -> float:
    """Pearson's chi-square goodness-of-fit test: the p-value of counts `observed` [k] against
    `expected` [k] (default: every cell equally likely), as `scipy.stats.chisquare` gives it.

    X^2 = sum_i (o_i - e_i)^2 / e_i with k - 1 degrees of freedom, and
    p = P(chi2_{k-1} >= X^2) = Q((k - 1) / 2, X^2 / 2), Q the regularized upper incomplete gamma
    function (Pearson 1900).
    """
    o = torch.as_tensor(observed, dtype=torch.float64).flatten()
    e = o.mean().expand_as(o) if expected is None else torch.as_tensor(expected, dtype=torch.float64).flatten()
    if o.numel() < 2 or o.shape != e.shape:
        raise ValueError(f"need k >= 2 cells of observed and expected counts, got {o.numel()} and {e.numel()}")
    statistic = ((o - e) ** 2 / e).sum()
    return float(torch.special.gammaincc(torch.tensor((o.numel() - 1) / 2, dtype=torch.float64), statistic / 2))
