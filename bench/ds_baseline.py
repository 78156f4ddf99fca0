#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""DeepSpeed-Ulysses' seq->head op sequence written plainly with PyTorch, on P virtual ranks of one GPU.

The peer ulysses replaces, measured on the same GPU and shapes as bench_cuda (bf16, B=1, S=32768,
H=32, Hkv=8, D=128, P in {2, 4, 8}; and B=4 at S=8192, where DeepSpeed makes its second copy). Per
rank and per tensor (q, k and v each take their own all-to-all, as in DeepSpeed):
  1. permute + contiguous: [B, S/P, H, D] -> [P, S/P, B, H/P, D]            (copy 1)
  2. all_to_all_single; on virtual ranks of one GPU the same data movement is a copy of every
     chunk from rank p's send buffer to rank r's receive buffer            (the transport)
  3. permute + reshape to [B, S, H/P, D]: a view at B=1, a copy at B > 1     (copy 2)
(deepspeed/sequence/layer.py, single_all_to_all with scatter_idx=2, gather_idx=1). Timed with CUDA
events over all ranks' work on one stream, after warm-up, and next to a contiguous device-to-device
copy of the same bytes (torch's copy_, i.e. cudaMemcpyAsync): the ratios are what to compare with
bench_cuda's seq_to_head (which counts the same bytes).

Usage: python3 bench/ds_baseline.py [--out FILE.json] [--iters N]. Needs PyTorch with CUDA; without
a device it prints "no CUDA device" and exits 3.
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("ds_baseline: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("ds_baseline: no CUDA device")
        return 3
    dev = torch.device("cuda")
    H, Hkv = 32, 8
    results = []

    def timed(fn, iters):
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / iters * 1e3  # microseconds

    for (B, S, D) in [(1, 32768, 128), (1, 32768, 64), (4, 8192, 128)]:
        for P in (2, 4, 8):
            s = S // P
            # Seq-sharded q, k, v of every rank.
            xs = {name: [torch.randn(B, s, h, D, device=dev, dtype=torch.bfloat16) for _ in range(P)]
                  for name, h in (("q", H), ("k", Hkv), ("v", Hkv))}
            sends = {n: [None] * P for n in xs}
            recvs = {n: [torch.empty(P, s, B, h // P, D, device=dev, dtype=torch.bfloat16) for _ in range(P)]
                     for n, h in (("q", H), ("k", Hkv), ("v", Hkv))}
            outs = {n: [None] * P for n in xs}

            def copy1():
                for n, h in (("q", H), ("k", Hkv), ("v", Hkv)):
                    for r in range(P):
                        sends[n][r] = xs[n][r].reshape(B, s, P, h // P, D).permute(2, 1, 0, 3, 4).contiguous()

            def transport():
                for n in xs:
                    for r in range(P):
                        for p in range(P):
                            recvs[n][r][p].copy_(sends[n][p][r])

            def copy2():
                for n, h in (("q", H), ("k", Hkv), ("v", Hkv)):
                    for r in range(P):
                        outs[n][r] = recvs[n][r].permute(2, 0, 1, 3, 4).reshape(B, P * s, h // P, D)

            def whole():
                copy1()
                transport()
                copy2()

            copy1()
            t_whole = timed(whole, a.iters)
            t_copy1 = timed(copy1, a.iters)
            t_transport = timed(transport, a.iters)
            t_copy2 = timed(copy2, a.iters)
            nbytes = sum(x.numel() * x.element_size() for n in xs for x in xs[n])  # all ranks' q, k, v
            src = torch.empty(nbytes // 2, device=dev, dtype=torch.bfloat16)
            dst = torch.empty_like(src)
            t_memcpy = timed(lambda: dst.copy_(src), a.iters)
            row = {"B": B, "S": S, "D": D, "P": P, "bytes_all_ranks": nbytes, "deepspeed_us": t_whole,
                   "copy1_us": t_copy1, "transport_us": t_transport, "copy2_us": t_copy2, "memcpy_us": t_memcpy,
                   "deepspeed_over_memcpy": t_whole / t_memcpy, "copies_per_element": 1 + (1 if B > 1 else 0)}
            results.append(row)
            print(f"ds_baseline B={B} S={S} D={D} P={P}: DeepSpeed seq->head q,k,v {t_whole:.1f} us "
                  f"(copy1 {t_copy1:.1f}, transport {t_transport:.1f}, copy2 {t_copy2:.1f}) vs memcpy of the same "
                  f"{nbytes / 2**20:.1f} MiB {t_memcpy:.1f} us: {t_whole / t_memcpy:.2f}x")
            del xs, sends, recvs, outs, src, dst
            torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
