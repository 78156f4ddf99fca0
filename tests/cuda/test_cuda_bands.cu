// SPDX-License-Identifier: Apache-2.0
// bands.hpp and split_phase.hpp on device memory: banded_attention() and its backward on P
// virtual ranks of one GPU (DeviceLocalGroup, the CUDA executor, the engine's stand-in a kernel on
// the communicator's stream) give the bits of the unbanded layer for every band count (GQA, MQA
// with replicated kv heads). Without a device only the host suite runs (support/device_main.cpp).
#include <doctest/doctest.h>
#include <ulysses/bands.hpp>
#include <ulysses/comm/local_device.cuh>
#include <ulysses/cuda/executor.cuh>

#include <cstdint>
#include <string>
#include <vector>

#include "band_case.hpp"
#include "device_harness.cuh"

using namespace ulysses;

namespace {

/// The stand-in attention of local query heads [lo, hi): o = q + v of the kv head each uses
/// (k2v[j]: the local kv head of local query head j). [B, S, n, D] bshd, float.
__global__ void band_forward(const float* q, const float* v, float* o, const int* k2v, long long B, long long S, long long Hr,
                             long long Kr, long long D, long long lo, long long hi) {
  const long long n = B * S * (hi - lo) * D;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long d = i % D, j = lo + (i / D) % (hi - lo), bs = i / D / (hi - lo);
    o[(bs * Hr + j) * D + d] = q[(bs * Hr + j) * D + d] + v[(bs * Kr + k2v[j]) * D + d];
  }
}

/// Its backward's stand-in: dq = 2 do; dk += do / 2 and dv += do over the band's query heads in
/// ascending order (one thread per (b, s, kv head, d): the same sums in every band count).
__global__ void band_backward(const float* dout, float* dq, float* dk, float* dv, const int* k2v, long long B, long long S, long long Hr,
                              long long Kr, long long D, long long lo, long long hi) {
  const long long n = B * S * Kr * D;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long d = i % D, kv = (i / D) % Kr, bs = i / D / Kr;
    for (long long j = lo; j < hi; ++j) {
      if (k2v[j] != kv) continue;
      const float g = dout[(bs * Hr + j) * D + d];
      dq[(bs * Hr + j) * D + d] = 2 * g;  // (once: query head j has one kv head)
      dk[(bs * Kr + kv) * D + d] += g / 2;
      dv[(bs * Kr + kv) * D + d] += g;
    }
  }
}

/// Device copies of host vectors, and back.
ut::DeviceBuffer upload(const std::vector<float>& h, cudaStream_t s) {
  ut::DeviceBuffer d(h.size() * sizeof(float));
  d.upload(h.data(), s);
  return d;
}
std::vector<float> download(const ut::DeviceBuffer& d, std::size_t n, cudaStream_t s) {
  std::vector<float> h(n);
  d.download(h.data(), s);
  return h;
}

/// One rank's layer on device memory: unbanded with `bands` 0, else over that many bands.
bt::BandResult run_device_layer(const bt::BandCase& c, DeviceLocalGroup::Comm& comm, int bands) {
  const cudaStream_t s = comm.stream();
  const int r = comm.rank();
  const bt::LayerPlans lp(c, r, bands);
  const AttentionSpecs& specs = lp.specs;
  const SeqPartition& seq = lp.seq;
  const HeadBands& hb = lp.bands;
  const Plan& qkv = lp.qkv();
  const Plan& out = lp.out();
  std::vector<BlockList> lists = block_lists(qkv);
  for (const BlockList& l : block_lists(out)) lists.push_back(l);
  CudaExecutor exec(lists.data(), lists.size(), s);
  const long long Hr = specs.query_heads.count(r), Kr = specs.kv_heads.count(r);
  std::vector<int> k2v_h(static_cast<std::size_t>(Hr));
  for (long long j = 0; j < Hr; ++j) k2v_h[static_cast<std::size_t>(j)] = static_cast<int>(specs.local_kv_head(r, j));
  ut::DeviceBuffer k2v(k2v_h.size() * sizeof(int) + sizeof(int));
  UT_CUDA(cudaMemcpyAsync(k2v.get(), k2v_h.data(), k2v_h.size() * sizeof(int), cudaMemcpyHostToDevice, s));
  const std::vector<float> qh = bt::seq_part(c, seq, r, 0, c.H), kh = bt::seq_part(c, seq, r, 1, c.Hkv), vh = bt::seq_part(c, seq, r, 2, c.Hkv),
                           doh = bt::seq_part(c, seq, r, 3, c.H);
  const ut::DeviceBuffer q = upload(qh, s), k = upload(kh, s), v = upload(vh, s), dout = upload(doh, s);
  auto zeros = [&](long long n) { return upload(std::vector<float>(static_cast<std::size_t>(c.B * c.S * n * c.D)), s); };
  ut::DeviceBuffer q2 = zeros(Hr), k2 = zeros(Kr), v2 = zeros(Kr), o2 = zeros(Hr), do2 = zeros(Hr), dq2 = zeros(Hr), dk2 = zeros(Kr),
                   dv2 = zeros(Kr);
  ut::DeviceBuffer o = upload(std::vector<float>(qh.size()), s), dq = upload(std::vector<float>(qh.size()), s),
                   dk = upload(std::vector<float>(kh.size()), s), dv = upload(std::vector<float>(vh.size()), s);
  ut::DeviceBuffer w1(qkv.workspace_bytes() + 1), w2(out.workspace_bytes() + 1);
  auto span = [](ut::DeviceBuffer& b) { return ByteSpan(b.get(), b.bytes()); };
  auto cspan = [](const ut::DeviceBuffer& b) { return ConstByteSpan(b.get(), b.bytes()); };
  const auto f = [](const ut::DeviceBuffer& b) { return reinterpret_cast<float*>(b.get()); };
  const TensorList<ConstByteSpan> in{cspan(q), cspan(k), cspan(v)};
  const TensorList<ByteSpan> head{span(q2), span(k2), span(v2)};
  auto forward = [&](HeadRun h) {
    if (h.size()) band_forward<<<64, 256, 0, s>>>(f(q2), f(v2), f(o2), reinterpret_cast<const int*>(k2v.get()), c.B, c.S, Hr, Kr, c.D, h.lo, h.hi);
  };
  auto backward = [&](HeadRun h) {
    if (h.size())
      band_backward<<<64, 256, 0, s>>>(f(do2), f(dq2), f(dk2), f(dv2), reinterpret_cast<const int*>(k2v.get()), c.B, c.S, Hr, Kr, c.D, h.lo, h.hi);
  };
  if (!bands) {
    seq_to_head(qkv, comm, exec, in, head, span(w1));
    forward({0, Hr});
    head_to_seq(out, comm, exec, cspan(o2), span(o), span(w2));
    head_to_seq_backward(out, comm, exec, cspan(dout), span(do2), span(w2));
    backward({0, Hr});
    seq_to_head_backward(qkv, comm, exec, TensorList<ConstByteSpan>{cspan(dq2), cspan(dk2), cspan(dv2)},
                         TensorList<ByteSpan>{span(dq), span(dk), span(dv)}, span(w1));
  } else {
    banded_attention(hb, comm, exec, in, head, span(w1), cspan(o2), span(o), span(w2), [&](const Band& b) { forward(b.query); });
    banded_attention_backward(hb, comm, exec, cspan(dout), span(do2), span(w2), TensorList<ConstByteSpan>{cspan(dq2), cspan(dk2), cspan(dv2)},
                              TensorList<ByteSpan>{span(dq), span(dk), span(dv)}, span(w1), [&](const Band& b) { backward(b.query); });
  }
  UT_CUDA(cudaGetLastError());
  bt::BandResult res;
  res.o = download(o, qh.size(), s);
  res.dq = download(dq, qh.size(), s);
  res.dk = download(dk, kh.size(), s);
  res.dv = download(dv, vh.size(), s);
  return res;
}

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("HeadBands plans upload to one CUDA executor's lists: the q, k, v plan's and the o plan's") {
    const bt::BandCase c{2, 1, 8, 4, 2, 4};
    HeadBands hb({2, 0}, 1, SeqPartition::balanced(8, 2), c.specs(), 2);
    CHECK(block_lists(hb.qkv()).size() == 4u * 2u * 2u);  // 4 lists x 2 directions x 2 stages
    CHECK(block_lists(hb.out()).size() == 4u * 2u * 2u);
  }
}

TEST_CASE("banded_attention on DeviceLocalGroup: the bits of the unbanded layer for every band count") {
  for (int P : {2, 4})
    for (const bt::BandCase& c : bt::band_cases(P)) {
      CAPTURE(c.name());
      std::vector<bt::BandResult> ref(static_cast<std::size_t>(P)), got(static_cast<std::size_t>(P));
      CHECK(ut::on_device_group(P, [&](DeviceLocalGroup::Comm& comm) {
              ref[static_cast<std::size_t>(comm.rank())] = run_device_layer(c, comm, 0);
              return std::string();
            }) == "");
      for (int G = 1; G <= bt::max_bands(c); ++G) {
        CAPTURE(G);
        CHECK(ut::on_device_group(P, [&](DeviceLocalGroup::Comm& comm) {
                got[static_cast<std::size_t>(comm.rank())] = run_device_layer(c, comm, G);
                return std::string();
              }) == "");
        for (int r = 0; r < P; ++r) CHECK(got[static_cast<std::size_t>(r)] == ref[static_cast<std::size_t>(r)]);
      }
    }
}
