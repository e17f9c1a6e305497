import numpy as np

from emergence.recipe.spectral import entropy_rank, participation_ratio
from tests.helpers.reference_impl import entropy_rank_svd, pr_centred_cov


def sums(x):
    return x.T @ x, x.sum(0), len(x)


def test_isotropic_gaussian_has_pr_near_d():
    x = np.random.default_rng(0).normal(size=(20000, 16))
    gram, total, n = sums(x)
    assert 15.5 < participation_ratio(gram, total, n) <= 16
    assert 15.5 < entropy_rank(gram) <= 16


def test_rank_one_has_pr_one():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 1)) * rng.normal(size=(1, 8))
    gram, total, n = sums(x)
    np.testing.assert_allclose(participation_ratio(gram, total, n), 1.0, rtol=1e-6)
    np.testing.assert_allclose(entropy_rank(gram), 1.0, rtol=1e-6)


def test_centring_matters_for_pr_not_for_entropy_rank():
    # A large constant offset makes the uncentred spectrum rank-one-like; the centred one is isotropic.
    x = np.random.default_rng(2).normal(size=(5000, 8)) + 100.0
    gram, total, n = sums(x)
    assert participation_ratio(gram, total, n) > 7.5
    assert entropy_rank(gram) < 1.1


def test_agree_with_direct_svd_and_covariance_batched():
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(3, 2, 64, 12)) @ rng.normal(size=(3, 2, 12, 12)) + rng.normal(size=(3, 2, 1, 12))
    gram = np.einsum("lhnd,lhne->lhde", xs, xs)
    pr = participation_ratio(gram, xs.sum(2), 64)
    er = entropy_rank(gram)
    for l in range(3):
        for h in range(2):
            np.testing.assert_allclose(pr[l, h], pr_centred_cov(xs[l, h]), rtol=1e-9)
            np.testing.assert_allclose(er[l, h], entropy_rank_svd(xs[l, h]), rtol=1e-9)


def test_constant_head_has_undefined_pr():
    x = np.ones((10, 4))
    gram, total, n = sums(x)
    assert np.isnan(participation_ratio(gram, total, n))
