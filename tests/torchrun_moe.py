"""An expert-parallel mixture-of-experts training step across ranks, with the SwiGLU of each
expert's feed-forward layer backed by the operator (acl_swiglu.torch.swiglu).

Every rank holds one expert and a shard of the tokens. A replicated top-1 router picks each
token's expert and its routing weight; the tokens and weights go to the expert's rank with
all_to_all; each expert fills a fixed-capacity buffer (group_index: the token count from each
source rank, so the padding rows are never computed), runs w1 -> swiglu(weight=routing weight) -> w2,
and sends the results back with all_to_all. The backward runs through the operator and the
all_to_alls; the router's gradients are all_reduced. Each rank compares its results with
``single_process`` (the same model, every expert in one process) and rank 0 prints the verdict
(exit status 1 when any rank's results differ); with --out each rank also saves them, which
tests/test_torch_distributed.py compares again.

On this machine (CPU emulator, gloo, two emulated devices):

    ACL_EMU_DEVICES=2 torchrun --standalone --nproc-per-node=2 tests/torchrun_moe.py

On an Ascend 950 host with torch_npu (HCCL, one NPU per rank):

    torchrun --standalone --nproc-per-node=2 tests/torchrun_moe.py --device npu
"""

from __future__ import annotations

import argparse
import ctypes
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn

import acl_swiglu
import acl_swiglu.torch as acl_torch

MODEL, HIDDEN, TOKENS_PER_RANK, CLAMP, SEED = 16, 32, 24, 7.0, 1234


def parameters(experts: int):
    """The model, the same on every rank: router [MODEL, E], per expert w1 [MODEL, 2H], w2 [H, MODEL]."""
    generator = torch.Generator().manual_seed(SEED)
    router = torch.randn(MODEL, experts, generator=generator)
    w1 = torch.randn(experts, MODEL, 2 * HIDDEN, generator=generator) / MODEL**0.5
    w2 = torch.randn(experts, HIDDEN, MODEL, generator=generator) / HIDDEN**0.5
    return router, w1, w2


def tokens(ranks: int):
    """All ranks' tokens and regression targets, [ranks * TOKENS_PER_RANK, MODEL] each."""
    generator = torch.Generator().manual_seed(SEED + 1)
    count = ranks * TOKENS_PER_RANK
    return torch.randn(count, MODEL, generator=generator), torch.randn(count, MODEL, generator=generator)


def route(x, router):
    """Top-1 routing: each token's expert and routing weight (its softmax probability)."""
    probabilities = torch.softmax(x @ router, dim=-1)
    routing_weight, expert = probabilities.max(dim=-1)
    return expert, routing_weight


def expert_layer(buffer, routing_weights, counts, w1, w2):
    """One expert on its capacity buffer (valid rows first, counts per source): bf16 SwiGLU
    weighted by the routing weights, rows past sum(counts) left zero by the operator's truncation."""
    h = (buffer @ w1).to(torch.bfloat16)
    y = acl_torch.swiglu(h, routing_weights, clamp_limit=CLAMP, group_index=counts)
    return y.float() @ w2


def _padded(rows, capacity):
    return torch.cat([rows, rows.new_zeros((capacity - rows.shape[0], *rows.shape[1:]))])


def single_process(ranks: int) -> dict:
    """The whole model in one process: every expert sees the tokens the distributed run sends
    it, in the same order (by source rank, then by position)."""
    router, w1, w2 = (p.clone().requires_grad_() for p in parameters(ranks))
    x, target = tokens(ranks)
    expert, routing_weight = route(x, router)
    capacity = x.shape[0]
    out = torch.zeros_like(x)
    for e in range(ranks):
        chosen = (expert == e).nonzero().flatten()
        counts = torch.stack([((expert[r * TOKENS_PER_RANK:(r + 1) * TOKENS_PER_RANK]) == e).sum()
                              for r in range(ranks)])
        result = expert_layer(_padded(x[chosen], capacity), _padded(routing_weight[chosen], capacity), counts, w1[e], w2[e])
        out = out.index_put((chosen,), result[:chosen.numel()])
    loss = ((out - target) ** 2).sum()
    loss.backward()
    return {"loss": loss.detach(), "out": out.detach(), "router_grad": router.grad, "w1_grad": w1.grad,
            "w2_grad": w2.grad}


def _all_to_all(rows, send_counts, receive_counts):
    output = rows.new_empty((int(receive_counts.sum()), *rows.shape[1:]))
    return dist_nn.all_to_all_single(output, rows, receive_counts.tolist(), send_counts.tolist())


def distributed_step(rank: int, ranks: int, device: torch.device) -> dict:
    router, w1, w2 = parameters(ranks)
    router = router.to(device).requires_grad_()
    w1 = w1[rank].to(device).requires_grad_()   # this rank's expert only
    w2 = w2[rank].to(device).requires_grad_()
    x_all, target_all = tokens(ranks)
    mine = slice(rank * TOKENS_PER_RANK, (rank + 1) * TOKENS_PER_RANK)
    x, target = x_all[mine].to(device), target_all[mine].to(device)

    expert, routing_weight = route(x, router)
    order = torch.argsort(expert, stable=True)   # grouped by destination, positions kept
    send_counts = torch.bincount(expert, minlength=ranks)
    receive_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(receive_counts, send_counts)

    received = _all_to_all(x[order], send_counts, receive_counts)
    received_weights = _all_to_all(routing_weight[order], send_counts, receive_counts)
    capacity = ranks * TOKENS_PER_RANK
    result = expert_layer(_padded(received, capacity), _padded(received_weights, capacity), receive_counts, w1, w2)
    returned = _all_to_all(result[:received.shape[0]], receive_counts, send_counts)
    out = torch.empty_like(returned).index_put((order,), returned)

    loss = ((out - target) ** 2).sum()
    loss.backward()
    dist.all_reduce(router.grad)
    total = loss.detach().clone()
    dist.all_reduce(total)
    return {"loss": total.cpu(), "out": out.detach().cpu(), "router_grad": router.grad.cpu(),
            "w1_grad": w1.grad.cpu(), "w2_grad": w2.grad.cpu(), "acl_device": current_acl_device(device)}


def current_acl_device(device: torch.device):
    """The device ACL calls on this thread go to: aclrtGetDevice (the emulator's or CANN's)."""
    if device.type == "npu":
        import torch_npu
        return torch_npu.npu.current_device()
    runtime = ctypes.CDLL(acl_swiglu.backend_info().runtime)
    if not hasattr(runtime, "aclrtGetDevice"):
        return f"the runtime library {acl_swiglu.backend_info().runtime} has no aclrtGetDevice"
    value = ctypes.c_int32(-1)
    status = runtime.aclrtGetDevice(ctypes.byref(value))
    return value.value if status == 0 else f"aclrtGetDevice failed with {status}"


# How close each rank's results must be to the single process's: on the CPU the same operations
# in the same order up to the collectives' summation order; on an NPU the matmuls round
# differently from the CPU's, which the bf16 activations can carry to a bf16 unit.
TOLERANCES = {"cpu": dict(rtol=1.3e-6, atol=1e-5), "npu": dict(rtol=1e-2, atol=1e-2)}


def compare(rank: int, ranks: int, got: dict, expected: dict, device_type: str) -> list:
    """The differences of this rank's results from the single process's, as 'name: text' lines."""
    rows = slice(rank * TOKENS_PER_RANK, (rank + 1) * TOKENS_PER_RANK)
    pairs = {"out": (got["out"], expected["out"][rows]), "loss": (got["loss"], expected["loss"]),
             "router_grad": (got["router_grad"], expected["router_grad"]),
             "w1_grad": (got["w1_grad"], expected["w1_grad"][rank]),
             "w2_grad": (got["w2_grad"], expected["w2_grad"][rank])}
    problems = []
    for name, (actual, wanted) in pairs.items():
        try:
            torch.testing.assert_close(actual, wanted, **TOLERANCES[device_type])
        except AssertionError as error:
            problems.append(f"{name}: {str(error).splitlines()[0]}")
    if device_type == "cpu" and got["acl_device"] != rank:
        problems.append(f"acl_device: rank {rank}'s ACL work ran on device {got['acl_device']!r}")
    return problems


def verdict(rank: int, ranks: int, got: dict, device: torch.device) -> bool:
    """Every rank checks its part; rank 0 prints the verdict for all of them."""
    expected = single_process(ranks)
    problems = compare(rank, ranks, got, expected, device.type)
    mine = got["out"] - expected["out"][rank * TOKENS_PER_RANK:(rank + 1) * TOKENS_PER_RANK]
    failures = torch.tensor([float(len(problems))], dtype=torch.float64, device=device)
    largest = torch.tensor([float(mine.abs().max())], dtype=torch.float64, device=device)
    dist.all_reduce(failures)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    for line in problems:
        print(f"rank {rank}: {line}", flush=True)
    passed = int(failures.item()) == 0
    if rank == 0:
        print(f"loss {float(got['loss']):.6g} (one process: {float(expected['loss']):.6g}); each rank's outputs, "
              f"the router's gradient and its expert's gradients against one process: largest output difference "
              f"{largest.item():.3g}", flush=True)
        print(f"verdict: {'PASS' if passed else 'FAIL'}", flush=True)
    return passed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also save each rank's results in this directory (rank<N>.pt)")
    parser.add_argument("--device", choices=("cpu", "npu"), default="cpu",
                        help="cpu: tensors on the host, gloo, one emulated device per rank; npu: torch_npu, HCCL")
    args = parser.parse_args(argv)
    rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "npu":
        import torch_npu
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch_npu.npu.set_device(local)
        device, backend = torch.device("npu", local), "hccl"
    else:
        acl_swiglu.set_device(rank)   # emulated device <rank>: needs ACL_EMU_DEVICES >= ranks
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, rank=rank, world_size=ranks)
    try:
        results = distributed_step(rank, ranks, device)
        results["rank"] = rank
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            torch.save(results, args.out / f"rank{rank}.pt")
        passed = verdict(rank, ranks, results, device)
    finally:
        dist.destroy_process_group()
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
