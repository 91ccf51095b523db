"""The ELBO log-likelihood estimate (evaluation/elbo.py): exact expectation by enumeration, convergence, its relation
to the training loss, determinism and the is_greedy rule, on tiny models."""

import itertools

import numpy as np
import pytest
import torch

from diffusiongemma.evaluation.elbo import (continuation_labels, continuation_loglikelihood, noise_scores,
                                            request_seed)
from diffusiongemma.training import CanvasNoise, block_diffusion_loss
from diffusiongemma.training.canvases import clean_response
from diffusiongemma.training.loss import T_MIN
from conftest import tiny_config, tiny_model

V, L = 6, 2  # 2 canvases of 2 tokens over 6 tokens: 6^4 = 1296 corruptions, one forward


@pytest.fixture(scope="module")
def small():
    return tiny_model(tiny_config(vocab_size=V, canvas_length=L, num_hidden_layers=2,
                                  layer_types=["sliding_attention", "full_attention"]), seed=3)


def canvas_weight(z: np.ndarray, x: np.ndarray) -> float:
    """P(z | x) averaged over t ~ U(T_MIN, 1): the product over positions is a polynomial of degree L in t, so
    Gauss-Legendre with L + 1 nodes integrates it exactly."""
    nodes, weights = np.polynomial.legendre.leggauss(L + 1)
    t = (1 - T_MIN) / 2 * nodes + (1 + T_MIN) / 2  # nodes moved onto [T_MIN, 1]
    per_t = np.prod([(1 - t) * (zi == xi) + t / V for zi, xi in zip(z, x)], axis=0)
    return float((weights * per_t).sum() / 2)  # the mean over [T_MIN, 1]: (b - a)/2 * sum / (b - a)


def exact_value(model, context: list[int], continuation: list[int]) -> float:
    """E_t,z[f(z)] over every corruption of both canvases, each weighted by its probability."""
    labels = continuation_labels(continuation, L)  # [R]
    clean = clean_response(model, labels[None])[0].numpy()  # [R]
    R, K = labels.shape[0], labels.shape[0] // L
    every = torch.tensor(list(itertools.product(range(V), repeat=R)))  # [V^R, R]
    noise = CanvasNoise(every, torch.zeros(len(every), K), torch.zeros(len(every), K, dtype=torch.bool))
    with torch.no_grad():
        f = noise_scores(model, torch.tensor(context), labels, noise).double().numpy()  # [V^R]
    w = np.array([np.prod([canvas_weight(z[k * L:(k + 1) * L], clean[k * L:(k + 1) * L]) for k in range(K)])
                  for z in every.numpy()])
    assert abs(w.sum() - 1) < 1e-9  # the enumeration covers every corruption
    return float((w * f).sum())


def test_estimate_converges_to_the_enumerated_value_within_3_se(small):
    context, continuation = [2, 4, 5], [3, 5, 4]  # 3 tokens: canvas 1 whole, canvas 2 one token then unscored
    exact = exact_value(small, context, continuation)
    errors, ses = [], []
    for samples in (16, 128, 1024):
        est = continuation_loglikelihood(small, context, continuation, samples=samples, seed=7)
        print(f"S={samples}: {est.loglikelihood:.4f} +- {est.standard_error:.4f} (exact {exact:.4f})")
        assert abs(est.loglikelihood - exact) <= 3 * est.standard_error
        errors.append(abs(est.loglikelihood - exact))
        ses.append(est.standard_error)
    # the standard error shrinks as 1/sqrt(S): x64 samples -> about /8
    assert ses[2] < ses[0] / 4 and ses[1] < ses[0]
    assert errors[2] < 3 * ses[2] < 3 * ses[0]


def test_one_canvas_sample_is_minus_n_times_the_training_loss(small):
    """Same generator draws: t, the replacement mask, the random tokens (no self-conditioning coin is drawn)."""
    context, continuation = [2, 4, 5, 3], [5, 4]
    est = continuation_loglikelihood(small, context, continuation, samples=1, seed=11)
    g = torch.Generator().manual_seed(request_seed(11, context))
    out = block_diffusion_loss(small, torch.tensor([context]), torch.tensor([continuation]),
                               self_conditioning_mask=torch.tensor([False]), generator=g, ar_weight=0.0)
    assert est.loglikelihood == pytest.approx(-len(continuation) * float(out.diffusion_loss), rel=1e-5)
    assert est.standard_error == 0.0


def test_deterministic_given_the_seed_and_independent_of_batch_size(small):
    a = continuation_loglikelihood(small, [2, 4], [3, 5, 4], samples=12, seed=1)
    b = continuation_loglikelihood(small, [2, 4], [3, 5, 4], samples=12, seed=1, batch_size=5)
    c = continuation_loglikelihood(small, [2, 4], [3, 5, 4], samples=12, seed=2)
    assert a.loglikelihood == pytest.approx(b.loglikelihood, abs=1e-4)
    assert a.standard_error == pytest.approx(b.standard_error, abs=1e-4)
    assert a.loglikelihood != c.loglikelihood
    assert a.tokens == 3 and a.samples == 12


def test_is_greedy_is_the_argmax_fixed_point(small):
    """Over every one-canvas continuation: is_greedy says whether the clean canvas's argmax gives it back."""
    from diffusiongemma.training import multi_canvas_loss

    context = [2, 4, 5]
    every = torch.tensor(list(itertools.product(range(V), repeat=L)))  # [36, L]
    noise = CanvasNoise(every, torch.zeros(len(every), 1), torch.zeros(len(every), 1, dtype=torch.bool))
    with torch.no_grad():
        logits = multi_canvas_loss(small, torch.tensor([context] * len(every)), every, ar_weight=0.0,
                                   noise=noise).logits  # [36, L, V]
    fixed = (logits.argmax(-1) == every).all(-1).tolist()
    assert any(fixed) and not all(fixed)  # the check below sees both answers
    for x, expected in zip(every.tolist(), fixed):
        assert continuation_loglikelihood(small, context, x, samples=1).is_greedy == expected


@pytest.mark.parametrize("kwargs, match", [
    (dict(context_ids=[], continuation_ids=[3]), "context_ids"),
    (dict(context_ids=[2], continuation_ids=[]), "continuation_ids"),
    (dict(context_ids=[2], continuation_ids=[3], samples=0), "samples"),
])
def test_bad_arguments_name_themselves(small, kwargs, match):
    with pytest.raises(ValueError, match=match):
        continuation_loglikelihood(small, **kwargs)
