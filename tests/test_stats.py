"""The tests' own chi-square p-value against hand-computed numbers."""
import math

import pytest

from tests.stats import chisquare_pvalue


def test_two_degrees_of_freedom_is_an_exponential_tail():
    # counts 10, 20, 30 against 20 each: X^2 = (100 + 0 + 100) / 20 = 10; chi2_2's tail is exp(-x / 2)
    assert chisquare_pvalue([10, 20, 30]) == pytest.approx(math.exp(-5.0), rel=1e-12)


def test_one_degree_of_freedom_at_its_five_percent_point():
    # chi2_1's 95% quantile is 3.841458820694124; counts 50 + d, 50 - d against 50: X^2 = d^2 / 25
    d = math.sqrt(3.841458820694124 * 25)
    assert chisquare_pvalue([50 + d, 50 - d]) == pytest.approx(0.05, rel=1e-9)


def test_expected_counts_and_a_perfect_fit():
    assert chisquare_pvalue([1, 2, 3], [1, 2, 3]) == 1.0
    # X^2 = (2 - 1)^2 / 1 + (2 - 3)^2 / 3 = 4 / 3 on one degree of freedom: erfc(sqrt(2 / 3))
    assert chisquare_pvalue([2, 2], [1, 3]) == pytest.approx(math.erfc(math.sqrt(2 / 3)), rel=1e-12)


def test_mismatched_cells_raise():
    with pytest.raises(ValueError):
        chisquare_pvalue([1, 2], [1, 2, 3])
