"""Ring attention (legalpt.attention.ring) against naive float64 attention over the whole sequence: forward and
gradients, gathered from 1, 2 and 3 CPU processes (gloo), packed documents that span chunks and processes, GQA,
causal and not; the zigzag plan's balance; the errors it raises."""

import itertools
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from attention_helpers import assert_flash_attn_rule, naive_attention

from legalpt.attention import backends
from legalpt.attention.ring import RingPlan, ring_flash_attn_varlen_func, shard, unshard

HEADS, KV_HEADS, DIM = 4, 2, 16


def documents(rng: random.Random, total: int, chunk: int) -> list[int]:
    """cu_seqlens over `total` tokens: a document longer than two chunks, one ending on a chunk boundary, and short
    ones (length 1 included)."""
    cuts = {chunk, 3 * chunk + 1, 3 * chunk + 2} | {rng.randrange(1, total) for _ in range(total // 9)}
    return [0, *sorted(c for c in cuts if 0 < c < total), total]


def case(seed: int, world: int, chunk: int) -> dict:
    """The full sequence's inputs and output gradient, the same on every process."""
    generator = torch.Generator().manual_seed(seed)
    total = 2 * world * chunk
    q = torch.randn(total, HEADS, DIM, generator=generator)
    k, v = (torch.randn(total, KV_HEADS, DIM, generator=generator) for _ in range(2))
    dout = torch.randn(total, HEADS, DIM, generator=generator)
    return {"q": q, "k": k, "v": v, "dout": dout, "cu_seqlens": documents(random.Random(seed), total, chunk)}


def ring_result(inputs: dict, causal: bool, world: int, rank: int, backend: str = "reference") -> dict:
    """This process's out, lse and gradients of q, k, v (its shard of each)."""
    local = {name: shard(inputs[name], world, rank) for name in ("q", "k", "v", "dout")}
    q, k, v = (local[name].clone().requires_grad_() for name in ("q", "k", "v"))
    plan = RingPlan.build(inputs["cu_seqlens"], causal, world, rank, q.device)
    out, lse, _ = ring_flash_attn_varlen_func(q, k, v, plan, return_attn_probs=True, backend=backend)
    out.backward(local["dout"])
    return {"out": out.detach(), "lse": lse.T, "dq": q.grad, "dk": k.grad, "dv": v.grad}  # lse: (T, H) to unshard


def expected_result(inputs: dict, causal: bool, dtype: torch.dtype = torch.float64) -> dict:
    """Naive attention over the whole sequence in `dtype`, and its gradients."""
    q, k, v = (inputs[name].to(dtype).requires_grad_() for name in ("q", "k", "v"))
    cu = torch.tensor(inputs["cu_seqlens"], dtype=torch.int32, device=q.device)
    out, lse = naive_attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=causal, dtype=dtype)
    out.backward(inputs["dout"].to(dtype))
    return {"out": out.detach(), "lse": lse.detach().T, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _worker(rank: int, world: int, store: str, seed: int, chunk: int, causal: bool, results: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.save(ring_result(case(seed, world, chunk), causal, world, rank), f"{results}.{rank}")
    finally:
        dist.destroy_process_group()


def assert_matches(got: dict, expected: dict) -> None:
    for name, exact in expected.items():
        torch.testing.assert_close(got[name].double(), exact, rtol=1e-5, atol=2e-5, msg=name)


@pytest.mark.parametrize("causal", [True, False])
def test_one_process_equals_attention_over_the_sequence(causal):
    inputs = case(seed=random.randrange(2**31), world=1, chunk=23)
    assert_matches(ring_result(inputs, causal, world=1, rank=0), expected_result(inputs, causal))


@pytest.mark.slow
@pytest.mark.parametrize(("world", "causal"), [(2, True), (3, True), (2, False)])
def test_processes_together_equal_attention_over_the_sequence(tmp_path, world, causal):
    seed, chunk = random.randrange(2**31), 11
    print(f"seed={seed}")
    results = str(tmp_path / "result")
    mp.spawn(_worker, args=(world, str(tmp_path / "store"), seed, chunk, causal, results), nprocs=world)
    parts = [torch.load(f"{results}.{rank}") for rank in range(world)]
    got = {name: unshard([part[name] for part in parts]) for name in parts[0]}
    assert_matches(got, expected_result(case(seed, world, chunk), causal))


def visible_pairs(plan: RingPlan) -> int:
    """The query-key pairs a process's calls compute, from their documents."""
    total = 0
    for call in itertools.chain.from_iterable(plan.steps):
        lengths_q = torch.diff(call.cu_seqlens_q).tolist()
        lengths_k = torch.diff(call.cu_seqlens_k).tolist()
        for lq, lk in zip(lengths_q, lengths_k, strict=True):
            total += sum(min(lk, max(0, lk - lq + i + 1)) for i in range(lq)) if call.causal else lq * lk
    return total


def test_zigzag_gives_every_process_the_same_causal_work():
    world, chunk = 4, 16
    total = 2 * world * chunk
    work = [visible_pairs(RingPlan.build([0, total], True, world, r, torch.device("cpu"))) for r in range(world)]
    assert len(set(work)) == 1 and sum(work) == total * (total + 1) // 2


def test_pairs_without_a_shared_document_are_skipped():
    """Two documents, each inside the chunks of one process: the other process's keys are never attended."""
    plan = RingPlan.build([0, 8, 16], causal=False, world=2, rank=0, device=torch.device("cpu"))
    # rank 0 holds chunks 0 and 3 (tokens 0-3 and 12-15); at step 1 it holds rank 1's chunks 1 and 2 (4-11)
    assert [len(calls) for calls in plan.steps] == [2, 2]
    assert visible_pairs(plan) == 4 * 8 + 4 * 8  # each chunk sees its document's 8 keys, over both steps


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: RingPlan.build([0, 10], True, 2, 0, "cpu"),
            r"^cu_seqlens: expected a positive total length divisible by 2 x 2",
        ),
        (lambda: RingPlan.build([0, 8], True, 2, 2, "cpu"), r"^rank: expected a process in \[0, 2\)"),
        (lambda: RingPlan.build([0, 6, 4, 8], True, 2, 0, "cpu"), r"^cu_seqlens: expected non-decreasing"),
    ],
)
def test_bad_plans_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_bad_inputs_are_named_before_any_compute():
    plan = RingPlan.build([0, 8], True, 1, 0, torch.device("cpu"))
    q, k = torch.randn(8, HEADS, DIM), torch.randn(8, KV_HEADS, DIM)
    with pytest.raises(ValueError, match=r"^q: expected 8 local tokens \(two chunks of the plan\), got 6"):
        ring_flash_attn_varlen_func(q[:6], k, k, plan)
    with pytest.raises(ValueError, match=r"^backend: expected reference, fa2 or fa3 for ring attention, got sdpa"):
        ring_flash_attn_varlen_func(q, k, k, plan, backend="sdpa")


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_reaches_every_backward_call(deterministic, monkeypatch):
    reference = backends.get("reference")
    seen, backward = [], type(reference).backward

    def spy(self, batch, *args):
        seen.append(batch.deterministic)
        return backward(self, batch, *args)

    monkeypatch.setattr(type(reference), "backward", spy)
    plan = RingPlan.build([0, 3, 8], True, 1, 0, torch.device("cpu"))
    q, k, v = (torch.randn(8, heads, DIM, requires_grad=True) for heads in (HEADS, KV_HEADS, KV_HEADS))
    ring_flash_attn_varlen_func(q, k, v, plan, deterministic=deterministic).sum().backward()
    assert seen and set(seen) == {deterministic}
    with pytest.raises(TypeError, match=r"^deterministic: expected a bool, got int"):
        ring_flash_attn_varlen_func(q, k, v, plan, deterministic=1)


@pytest.mark.cuda
@pytest.mark.parametrize("head_dim", [64, 128])
def test_one_process_on_our_kernels_keeps_flash_attns_error_rule(head_dim):
    """bfloat16 on fa3/fa2: every chunk pair's forward and backward through the kernels, merged in float32."""
    generator = torch.Generator().manual_seed(random.randrange(2**31))
    total, cu_seqlens = 2 * 512, [0, 300, 301, 700, 1024]
    inputs = {"cu_seqlens": cu_seqlens}
    for name, heads in (("q", 8), ("k", 2), ("v", 2), ("dout", 8)):
        inputs[name] = torch.randn(total, heads, head_dim, generator=generator).cuda().bfloat16()
    got = ring_result(inputs, True, world=1, rank=0, backend="auto")
    exact = expected_result({**inputs, **{n: inputs[n].double() for n in ("q", "k", "v", "dout")}}, True)
    plain = expected_result(inputs, True, dtype=torch.bfloat16)
    for name in ("out", "dq", "dk", "dv"):
        assert_flash_attn_rule(name, got[name], exact[name], plain[name], ratio=2 if name == "out" else 3, atol=1e-4)
