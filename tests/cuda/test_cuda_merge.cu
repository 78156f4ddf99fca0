// SPDX-License-Identifier: Apache-2.0
// cuda/merge.cuh: the decode exchange's kernels. On the GPU: merge/lse.hpp's merge gives the
// host's bits (lse_step and merge_rows in a kernel, every type); CudaDecodeExecutor's pack, merge
// and gather == HostDecodeExecutor byte for byte on the same bytes; the whole decode exchange on P
// virtual ranks of one GPU (DeviceLocalGroup) == the host exchange on LocalGroup; the passes
// captured in a CUDA graph and replayed. Without a CUDA device only the suite "host" runs (see
// support/device_main.cpp): the executor's traits and path choice, and the merge compiled by nvcc's
// host compiler (the kernel bodies themselves are run lane by lane on the host in test_decode).
#include <doctest/doctest.h>

#include <ulysses/comm/local.hpp>
#include <ulysses/comm/local_device.cuh>
#include <ulysses/cuda/merge.cuh>

#include <cuda_runtime.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode_case.hpp"

using namespace ulysses;
using ud::DecodeCase;

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// Device memory of `bytes` bytes (plus 16), freed on destruction.
struct DevBuf {
  std::byte* p = nullptr;
  std::size_t n = 0;
  explicit DevBuf(std::size_t bytes) : n(bytes) { cuda_ok(cudaMalloc(reinterpret_cast<void**>(&p), bytes + 16), "cudaMalloc"); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  void up(const std::vector<std::byte>& h, cudaStream_t s) const { cuda_ok(cudaMemcpyAsync(p, h.data(), h.size(), cudaMemcpyHostToDevice, s), "upload"); }
  std::vector<std::byte> down(std::size_t bytes, cudaStream_t s) const {
    std::vector<std::byte> h(bytes);
    cuda_ok(cudaMemcpyAsync(h.data(), p, bytes, cudaMemcpyDeviceToHost, s), "download");
    cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return h;
  }
};

DecodeCase c16() {
  DecodeCase c;
  c.name = "C16";
  c.P = 4, c.T = 1, c.H = 8, c.Hkv = 2, c.B = 3, c.S = 16, c.D = 8, c.Dv = 8;
  c.empty = {{3, 1}};
  return c;
}

/// One rank's host buffers of case c, filled with the case's partials (outputs with a sentinel).
struct RankBufs {
  std::vector<std::byte> in, lse, out, olse, ws;
  RankBufs(const DecodeCase& c, const DecodePlan& plan, const ud::Partials& parts) {
    const ud::Layouts l = ud::layouts_of(c, plan.spec().heads, plan.rank());
    const auto e = static_cast<std::int64_t>(size_of(c.partial_type));
    in = ud::buffer(l.partial, static_cast<std::size_t>(e), 0x7f), lse = ud::buffer(l.lse, 4, 0x7f);
    out = ud::buffer(l.out, size_of(c.out_type), 0x5a), olse = ud::buffer(l.out_lse, 4, 0x5a), ws.assign(plan.workspace_bytes() + 16, std::byte{0x33});
    const auto r = static_cast<std::size_t>(plan.rank());
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t t = 0; t < c.T; ++t)
        for (std::int64_t h = 0; h < c.H; ++h) {
          const std::int64_t i = (b * c.T + t) * c.H + h;
          std::memcpy(in.data() + l.partial.offset(b, t, h, 0) * e, parts.o[r].data() + i * c.Dv * e, static_cast<std::size_t>(c.Dv * e));
          std::memcpy(lse.data() + l.lse.offset(b, t, h, 0) * 4, &parts.lse[r][static_cast<std::size_t>(i)], 4);
        }
  }
  DecodeBuffers buffers(std::byte* i, std::byte* l, std::byte* o, std::byte* ol, std::byte* w) const {
    return DecodeBuffers().partial({i, in.size()}).lse({l, lse.size()}).out({o, out.size()}).out_lse({ol, olse.size()}).workspace({w, ws.size()});
  }
};

/// Every rank's merged output and LSE bytes of case c on the host (LocalGroup, HostDecodeExecutor).
std::vector<std::pair<std::vector<std::byte>, std::vector<std::byte>>> host_results(const DecodeCase& c) {
  const ud::Problem pb(c);
  const ud::Partials parts = ud::partials_of(c, pb);
  std::vector<std::pair<std::vector<std::byte>, std::vector<std::byte>>> res(static_cast<std::size_t>(c.P));
  LocalGroup g(c.P, std::chrono::seconds(60));
  g.spawn([&](LocalGroup::Comm& comm) {
    const DecodePlan plan(ud::spec_of(c, comm.rank()), comm.rank());
    RankBufs h(c, plan, parts);
    decode_exchange(plan, comm, HostDecodeExecutor{}, h.buffers(h.in.data(), h.lse.data(), h.out.data(), h.olse.data(), h.ws.data()));
    res[static_cast<std::size_t>(comm.rank())] = {h.out, h.olse};
  });
  return res;
}

/// Kernel: merge_rows of n rows per case, on the device (rows packed [cases][n][dv], fp32 LSEs).
__global__ void merge_rows_kernel(const std::byte* rows, ElementType in, const float* lses, int n, std::int64_t dv, int cases, std::byte* out,
                                  ElementType out_t, LseBase base, float* out_lse) {
  const int k = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (k >= cases) return;
  const std::int64_t ein = detail::merge_elem_bytes(in), eout = detail::merge_elem_bytes(out_t);
  const std::byte* mine = rows + static_cast<std::int64_t>(k) * n * dv * ein;
  out_lse[k] = merge_rows_with(
      n, [=](int i) { return mine + i * dv * ein; }, [=](int i) { return lses[k * n + i]; }, in, dv, out + k * dv * eout, out_t, base);
}

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("CudaDecodeExecutor: device memory; the decode exchange takes messages only with a device communicator") {
    static_assert(CudaDecodeExecutor::device_memory, "device executor");
    CHECK(serves_decode<DeviceLocalGroup::Comm, CudaDecodeExecutor>(Path::messages));
    CHECK(!serves_decode<LocalGroup::Comm, CudaDecodeExecutor>(Path::messages));
    CHECK(!serves_decode<DeviceLocalGroup::Comm, HostDecodeExecutor>(Path::messages));
    CHECK(serves_decode<LocalGroup::Comm, HostDecodeExecutor>(Path::messages));
    CHECK(choose_path<DeviceLocalGroup::Comm, CudaDecodeExecutor>(DecodePlan(DecodeSpec(1, 1, HeadPartition::even(4, 2), 8), 0)) == Path::messages);
    CHECK(choose_path<LocalGroup::Comm, CudaDecodeExecutor>(DecodePlan(DecodeSpec(1, 1, HeadPartition::even(4, 2), 8), 0)) == Path::alltoallv);
  }
  TEST_CASE("the merge compiled by nvcc's host compiler: exact values (ties, -inf, all -inf) and the streaming == n-way bits") {
    const float rows[2][3] = {{1.0f, -2.0f, 3.5f}, {3.0f, 2.0f, 0.5f}};
    const void* ptrs[2] = {rows[0], rows[1]};
    const float lses[2] = {0.25f, 0.25f};
    float out[3];
    const float l = merge_rows(ptrs, ElementType::float32, lses, 2, 3, out, ElementType::float32);
    CHECK(out[0] == 2.0f);
    CHECK(out[1] == 0.0f);
    CHECK(out[2] == 2.0f);
    CHECK(l == doctest::Approx(0.25 + 0.6931471805599453).epsilon(1e-7));
    const float none[2] = {-INFINITY, -INFINITY};
    CHECK(merge_rows(ptrs, ElementType::float32, none, 2, 3, out, ElementType::float32) == -INFINITY);
    CHECK(out[0] == 0.0f);
    float st[3] = {0, 0, 0}, sl = -INFINITY;
    merge(st, sl, rows[0], 0.25f, 3);
    merge(st, sl, rows[1], 0.25f, 3);
    merge_rows(ptrs, ElementType::float32, lses, 2, 3, out, ElementType::float32);
    CHECK(std::memcmp(st, out, sizeof st) == 0);
    CHECK(sl == l);
  }
}

TEST_CASE("the merge on the GPU gives the host's bits (lse_step, exp2, log1p and merge_rows in a kernel; every type in and out; base e and 2; LSEs -inf, +inf and NaN empty)") {
  std::mt19937 g(5);
  std::uniform_real_distribution<float> u(-3.f, 3.f), l(-30.f, 30.f);
  const ElementType types[] = {ElementType::float32, ElementType::float16, ElementType::bfloat16};
  const int cases = 4096, n = 7;
  const std::int64_t dv = 21;
  cudaStream_t s = nullptr;
  for (ElementType in : types)
    for (ElementType ot : types)
      for (LseBase base : {LseBase::natural, LseBase::two}) {
        const auto ein = static_cast<std::int64_t>(size_of(in)), eout = static_cast<std::int64_t>(size_of(ot));
        std::vector<std::byte> rows(static_cast<std::size_t>(cases * n * dv * ein));
        std::vector<float> lses(static_cast<std::size_t>(cases * n));
        for (std::size_t i = 0; i < rows.size(); i += static_cast<std::size_t>(ein)) ud::store(rows.data() + i, in, u(g));
        for (float& x : lses) {  // empty partials: -inf, and +inf / NaN (C18: the same as -inf)
          const unsigned k = static_cast<unsigned>(g() % 8);
          x = k == 0 ? -INFINITY : k == 1 ? INFINITY : k == 2 ? NAN : l(g);
        }
        std::vector<std::byte> want(static_cast<std::size_t>(cases * dv * eout));
        std::vector<float> want_lse(static_cast<std::size_t>(cases));
        for (int k = 0; k < cases; ++k) {
          std::vector<const void*> p;
          for (int i = 0; i < n; ++i) p.push_back(rows.data() + (static_cast<std::int64_t>(k) * n + i) * dv * ein);
          want_lse[static_cast<std::size_t>(k)] = merge_rows(p.data(), in, lses.data() + k * n, n, dv, want.data() + k * dv * eout, ot, base);
        }
        DevBuf drows(rows.size()), dl(lses.size() * 4), dout(want.size()), dol(want_lse.size() * 4);
        drows.up(rows, s);
        std::vector<std::byte> lb(lses.size() * 4);
        std::memcpy(lb.data(), lses.data(), lb.size());
        dl.up(lb, s);
        merge_rows_kernel<<<(cases + 127) / 128, 128, 0, s>>>(drows.p, in, reinterpret_cast<const float*>(dl.p), n, dv, cases, dout.p, ot, base,
                                                            reinterpret_cast<float*>(dol.p));
        cuda_ok(cudaGetLastError(), "merge_rows_kernel");
        CHECK(dout.down(want.size(), s) == want);
        const std::vector<std::byte> got_lse = dol.down(want_lse.size() * 4, s);
        CHECK(std::memcmp(got_lse.data(), want_lse.data(), got_lse.size()) == 0);
      }
}

TEST_CASE("DeviceLocalGroup + CudaDecodeExecutor: the decode exchange == the host exchange on LocalGroup, byte for byte (C16, C18, bf16, all heads, both collectives)") {
  std::vector<DecodeCase> cases;
  for (Path path : {Path::alltoallv, Path::messages})
    for (DecodeOutput o : {DecodeOutput::heads, DecodeOutput::all_heads})
      for (int lay : {0, 2}) {
        DecodeCase c = c16();
        c.path = path, c.output = o, c.layouts = lay, c.T = 4, c.H = 7, c.Hkv = 1, c.Dv = 24, c.partial_type = ElementType::bfloat16;
        cases.push_back(c);
      }
  cases.push_back(ud::c18({INFINITY, NAN, -INFINITY}));  // C18: empty rows with LSE +inf / NaN, on one rank and on every rank
  for (const DecodeCase& c : cases) {
    const auto want = host_results(c);
    const ud::Problem pb(c);
    const ud::Partials parts = ud::partials_of(c, pb);
    std::vector<cudaStream_t> streams(static_cast<std::size_t>(c.P));
    for (auto& st : streams) cuda_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    std::vector<std::pair<std::vector<std::byte>, std::vector<std::byte>>> got(static_cast<std::size_t>(c.P));
    DeviceLocalGroup g(c.P, std::chrono::seconds(60));
    g.spawn(streams.data(), [&](DeviceLocalGroup::Comm& comm) {
      const int r = comm.rank();
      const DecodePlan plan(ud::spec_of(c, r), r);
      RankBufs h(c, plan, parts);
      DevBuf in(h.in.size()), lse(h.lse.size()), out(h.out.size()), olse(h.olse.size()), ws(h.ws.size());
      in.up(h.in, comm.stream()), lse.up(h.lse, comm.stream()), out.up(h.out, comm.stream()), olse.up(h.olse, comm.stream());
      const CudaDecodeExecutor ex(plan, comm.stream());
      for (int k = 0; k < 2; ++k) decode_exchange(plan, comm, ex, h.buffers(in.p, lse.p, out.p, olse.p, ws.p));
      got[static_cast<std::size_t>(r)] = {out.down(h.out.size(), comm.stream()), olse.down(h.olse.size(), comm.stream())};
    });
    for (auto& st : streams) cudaStreamDestroy(st);
    CAPTURE(to_string(c.path));
    CAPTURE(to_string(c.output));
    CAPTURE(c.layouts);
    for (int r = 0; r < c.P; ++r) {
      CHECK(got[static_cast<std::size_t>(r)].first == want[static_cast<std::size_t>(r)].first);
      CHECK(got[static_cast<std::size_t>(r)].second == want[static_cast<std::size_t>(r)].second);
    }
  }
}

TEST_CASE("the passes captured in a CUDA graph and replayed == the host executor's (pack, merge, gather of one rank)") {
  DecodeCase c = c16();
  c.P = 5, c.H = 12, c.Hkv = 4, c.T = 3, c.Dv = 40, c.partial_type = ElementType::bfloat16, c.out_type = ElementType::bfloat16;
  c.output = DecodeOutput::all_heads;
  const ud::Problem pb(c);
  const ud::Partials parts = ud::partials_of(c, pb);
  const int r = 2;
  const DecodePlan plan(ud::spec_of(c, r), r);
  RankBufs h(c, plan, parts);
  std::mt19937 g(9);
  for (auto& b : h.ws) b = static_cast<std::byte>(g() & 0x7f);  // a receive region as peers might have left it (finite values)
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  DevBuf in(h.in.size()), lse(h.lse.size()), out(h.out.size()), olse(h.olse.size()), ws(h.ws.size());
  in.up(h.in, s), lse.up(h.lse, s), out.up(h.out, s), olse.up(h.olse, s), ws.up(h.ws, s);
  const CudaDecodeExecutor ex(plan, s);
  const DecodeArgs da = plan.args(h.buffers(in.p, lse.p, out.p, olse.p, ws.p), ex.peer_table(plan));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda_ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  ex.pack(da), ex.merge(da), ex.unpack_gathered(da);
  cuda_ok(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  for (int k = 0; k < 3; ++k) cuda_ok(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
  const HostDecodeExecutor hx;
  const DecodeArgs ha = plan.args(h.buffers(h.in.data(), h.lse.data(), h.out.data(), h.olse.data(), h.ws.data()), hx.peer_table(plan));
  for (int k = 0; k < 3; ++k) hx.pack(ha), hx.merge(ha), hx.unpack_gathered(ha);
  CHECK(out.down(h.out.size(), s) == h.out);
  CHECK(olse.down(h.olse.size(), s) == h.olse);
  CHECK(ws.down(h.ws.size(), s) == h.ws);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}
