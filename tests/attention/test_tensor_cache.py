"""TensorCache: one computation per tensors' identity and version, none kept for inference tensors."""

import torch

from legalpt.attention.tensor_cache import TensorCache


def test_values_are_kept_until_the_tensor_changes():
    cache, calls = TensorCache(2), []
    t = torch.arange(4)

    def make():
        calls.append(t.sum().item())
        return calls[-1]

    assert [cache.get([t], ("a",), make) for _ in range(3)] == [6, 6, 6] and len(calls) == 1
    t.add_(1)  # an edit in place advances the version
    assert cache.get([t], ("a",), make) == 10 and len(calls) == 2
    assert cache.get([t], ("b",), make) == 10 and len(calls) == 3  # another extra key
    assert cache.get([t.clone()], ("a",), make) == 10 and len(calls) == 4  # another tensor, equal values


def test_inference_tensors_and_evicted_entries_are_computed_again():
    cache, calls = TensorCache(1), []
    with torch.inference_mode():
        t = torch.arange(3)
    for _ in range(2):
        cache.get([t], (), lambda: calls.append(1))
    assert len(calls) == 2
    u, v = torch.ones(2), torch.zeros(2)
    for x in (u, v, u):  # room for one: v evicts u
        cache.get([x], (), lambda: calls.append(1))
    assert len(calls) == 5


def test_a_compiled_function_computes_without_breaking_the_graph():
    cache, calls = TensorCache(2), []
    t = torch.arange(4.0)

    def make():
        calls.append(1)
        return t * 2

    compiled = torch.compile(lambda x: cache.get([x], (), make) + 1, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(t), t * 2 + 1)  # fullgraph: a graph break would raise
    assert calls and not cache._entries  # nothing kept from the tracer's tensors
