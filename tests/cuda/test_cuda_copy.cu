// SPDX-License-Identifier: Apache-2.0
// cuda/executor.cuh and comm/local_device.cuh: the CUDA executor runs every block list of the shared
// cases (C1–C8, zigzag, the models) byte for byte like the host executor, at every alignment; the
// shared cases end to end on P virtual ranks on one GPU (DeviceLocalGroup); graph capture; errors.
// Without a CUDA device only the suite "host" runs (see support/device_main.cpp).
// The host emulation of the kernel checks that every vector access is aligned as the GPU needs.
#define ULYSSES_CHECK_VECTOR_ALIGNMENT 1
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <type_traits>

#include <ulysses/cuda/pipeline.cuh>

#include "device_harness.cuh"
#include "expect_error.hpp"

using namespace ulysses;

namespace {

/// A 3-byte element: rows of odd byte counts force the kernel's 1-byte copies.
struct e3_t {
  unsigned char b[3];
};

/// The plans (every rank) of one executor comparison and the misalignments to run them at.
struct ListCase {
  std::string name;
  std::vector<Plan> plans;
  std::vector<std::size_t> misaligns;
};

/// The cases with K pipeline stages (PlanOptions::stages): every stage's lists are run.
std::vector<ut::Case> staged(std::vector<ut::Case> cases, int K) {
  for (auto& c : cases) c.stages = K, c.name += " K=" + std::to_string(K);
  return cases;
}

template <class T>
void add_cases(std::vector<ListCase>& out, const std::vector<ut::Case>& cases, std::vector<std::size_t> misaligns = {0, 2, 8}) {
  for (const auto& c : cases) {
    ListCase l{c.name + " (" + std::to_string(sizeof(T)) + "-byte elements)", {}, misaligns};
    for (int r = 0; r < c.P; ++r) l.plans.push_back(ut::plan_of<T>(c, r));
    out.push_back(std::move(l));
  }
}

/// Every block list the executor comparisons run: the shared cases (C1–C8, zigzag) in several
/// element sizes, C7's view layout, 3-byte elements, rows longer than a tile with a ragged
/// tail, several outer dimensions with d outermost, and every model at P in {1, 2, 4, 8}.
std::vector<ListCase> executor_cases() {
  std::vector<ListCase> v;
  add_cases<float>(v, ut::c1_cases());
  for (int P : {2, 4, 8}) add_cases<float>(v, ut::c2_cases(P));
  add_cases<ut::bf16_t>(v, ut::c2_cases(4), {0, 1, 2, 4, 6, 8, 12});
  add_cases<double>(v, ut::c2_cases(2));
  add_cases<ut::fp8_t>(v, ut::c2_cases(2), {0, 1, 3});
  add_cases<float>(v, ut::c3_cases());
  add_cases<float>(v, ut::c4_cases(4));
  add_cases<float>(v, ut::c4_cases(8));
  add_cases<ut::bf16_t>(v, {ut::c5_case()});
  add_cases<float>(v, ut::c6_cases());
  add_cases<float>(v, ut::c8_cases());
  for (int P : {1, 2, 3, 4}) add_cases<float>(v, ut::zigzag_cases(P));
  add_cases<ut::bf16_t>(v, staged(ut::c2_cases(4), 3));
  // Sums of replicated kv heads in head→seq (the backward of seq→head): bfloat16 (float32
  // accumulation, one rounding), float64, and over K stages.
  add_cases<ut::bf16v>(v, ut::c2_cases(4), {0, 2, 6});
  add_cases<ut::bf16v>(v, staged({ut::c5_case()}, 3), {0, 2});
  add_cases<double>(v, {ut::c5_case()});
  add_cases<float>(v, ut::zigzag_cases(3));
  add_cases<float>(v, staged({ut::c5_case()}, 2));
  {  // C7: the seq-sharded layout is the view x[:, 4:12] of a [2, 16, 2, 4] buffer.
    const Layout view = Layout::strided({2, 8, 2, 4}, {16 * 2 * 4, 2 * 4, 4, 1});
    ListCase l{"C7 view", {}, {0, 4, 1}};
    for (int r = 0; r < 2; ++r)
      l.plans.push_back(Plan({2, r}, 2, SeqPartition::even(16, 2),
                             {TensorSpec::of<float>(HeadPartition::even(2, 2), 4).with_seq_layout(view)}));
    v.push_back(std::move(l));
  }
  {  // 3-byte elements with GQA q/k/v, sbhd.
    auto q = HeadPartition::balanced(6, 3);
    add_cases<e3_t>(v, {{"e3 qkv", 3, 2, SeqPartition::balanced(11, 3), {{q, 5}, {HeadPartition::gqa(q, 3), 5}, {HeadPartition::gqa(q, 3), 3}}, Format::sbhd}},
                    {0, 1});
  }
  for (int P : {1, 2}) {  // rows far longer than a tile with a ragged tail (P=1: one row of ~2 MB)
    auto h = HeadPartition::even(6, P);
    add_cases<ut::bf16_t>(v, {{"big P=" + std::to_string(P), P, 1, SeqPartition::balanced(4099, P), {{h, 40}, {HeadPartition::gqa(h, 2), 40}}, Format::bshd}},
                          {0, 2, 6});
  }
  {  // d outermost in memory: rows of one element, blocks with several outer dimensions.
    const std::int64_t B = 2, S = 6, H = 4, D = 3, L = S / 2;
    const Layout d_outer = Layout::strided({B, L, H, D}, {L * H * D, 1, L, L * H});
    ListCase l{"d outer", {}, {0, 4}};
    for (int r = 0; r < 2; ++r)
      l.plans.push_back(Plan({2, r}, B, SeqPartition::even(S, 2), {TensorSpec::of<float>(HeadPartition::even(H, 2), D).with_seq_layout(d_outer)}));
    v.push_back(std::move(l));
  }
  for (const auto& m : ulysses_models::kModels)
    for (int P : {1, 2, 4, 8}) add_cases<ut::bf16_t>(v, {ut::model_case(m, P, ut::expected_even_error(m, P) == Errc{})}, {0, 2});
  return v;
}

template <class T>
void check_local(const std::vector<ut::Case>& cases) {
  for (const auto& c : cases) {
    CAPTURE(c.name);
    CHECK(ut::run_local_device<T>(c) == "");
  }
}

#define UT_STR2(x) #x
#define UT_STR(x) UT_STR2(x)

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("the inner namespace is named after the architectures this TU is built for") {
    const std::string ns = UT_STR(ULYSSES_CUDA_ARCH_NAMESPACE);
    CHECK(ns.rfind("sm_", 0) == 0);
#if defined(__CUDA_ARCH_LIST__)
    std::string list = UT_STR(__CUDA_ARCH_LIST__);
    for (char& ch : list)
      if (ch == ',') ch = '_';
    CHECK(ns == "sm_" + list);
#endif
    // ulysses::CudaExecutor names the versioned, arch-keyed type.
    CHECK(std::is_same_v<ulysses::CudaExecutor, ulysses::v0::ULYSSES_CUDA_ARCH_NAMESPACE::CudaExecutor>);
  }

  TEST_CASE("the kernel's division by a row's vector count (a multiply-high) is exact at every quotient boundary") {
    int wrong = 0;
    for (int d = 1; d <= 1 << 16; ++d) {
      const std::uint64_t r = detail::reciprocal(d);
      for (int q = 0; q * d <= (1 << 16); ++q)
        for (int k : {q * d - 1, q * d, q * d + 1, q * d + d / 2})
          if (k >= 0 && k < (1 << 16) && detail::quotient(k, r) != k / d) ++wrong;
    }
    CHECK(wrong == 0);
  }

  TEST_CASE("DeviceLocalGroup with the CUDA executor takes the direct path by default, and can take the message path") {
    CHECK(PathSupport<DeviceLocalGroup::Comm, CudaExecutor>::direct);
    CHECK(PathSupport<DeviceLocalGroup::Comm, CudaExecutor>::messages);
    CHECK(!PathSupport<DeviceLocalGroup::Comm, HostExecutor>::messages);
    CHECK(!PathSupport<DeviceLocalGroup::Comm, HostExecutor>::direct);
    CHECK(!PathSupport<LocalGroup::Comm, CudaExecutor>::messages);  // host communicator, device executor: no
    CHECK(!PathSupport<LocalGroup::Comm, CudaExecutor>::direct);
    const Plan plan({2, 0}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(HeadPartition::even(2, 2), 4)});
    CHECK(choose_path<DeviceLocalGroup::Comm, CudaExecutor>(plan) == Path::direct);
  }

  TEST_CASE("the copy kernel emulated on the host runs the direct path's lists (peers' inputs, sums across peers) like HostExecutor") {
    // Every rank of each case: its direct list read from the peers' inputs through BufferTable::peers.
    for (const ut::Case& base : {ut::c5_case(), ut::c6_cases()[2], ut::zigzag_cases(3)[0], ut::c2_cases(4)[1]}) {
      ut::Case c = base;
      c.B = 2;
      for (Direction dir : {Direction::seq_to_head, Direction::head_to_seq}) {
        std::vector<Plan> plans;
        std::vector<LayoutRecord> layouts;
        for (int r = 0; r < c.P; ++r) plans.push_back(ut::plan_of<float>(c, r)), layouts.push_back(plans.back().layout_record());
        std::vector<std::vector<std::byte>> inputs;  // rank r's tensor t at r * kMaxTensors + t
        std::vector<std::byte*> peers(static_cast<std::size_t>(c.P) * kMaxTensors, nullptr);
        for (int r = 0; r < c.P; ++r)
          for (int t = 0; t < plans[0].num_tensors(); ++t) {
            inputs.emplace_back(plans[static_cast<std::size_t>(r)].input_bytes(dir, t));
            ut::fill_random(inputs.back(), static_cast<std::uint64_t>(100 * r + t + 1));
            peers[static_cast<std::size_t>(r * kMaxTensors + t)] = inputs.back().data();
          }
        for (int r = 0; r < c.P; ++r) {
          const Plan& p = plans[static_cast<std::size_t>(r)];
          const PeerCopyLists lists = peer_copy_lists(p, layouts.data());
          std::vector<std::vector<std::byte>> host_out, emu_out;
          BufferTable ht, et;
          for (int t = 0; t < p.num_tensors(); ++t) {
            host_out.emplace_back(p.output_bytes(dir, t), std::byte{0x5a});
            emu_out.emplace_back(p.output_bytes(dir, t), std::byte{0x5a});
          }
          for (int t = 0; t < p.num_tensors(); ++t)
            ht.base[BufferIndex::output(t)] = host_out[static_cast<std::size_t>(t)].data(), et.base[BufferIndex::output(t)] = emu_out[static_cast<std::size_t>(t)].data();
          ht.peers = et.peers = peers.data();
          const std::vector<BlockCopy>& l = lists.list[static_cast<int>(dir)];
          HostExecutor{}.run(l.data(), l.size(), ht);
          ut::emulate_kernel(l.data(), l.size(), et);
          CAPTURE(c.name);
          CAPTURE(r);
          CHECK(emu_out == host_out);
        }
      }
    }
  }

  TEST_CASE("CudaPipeline caps the copy kernel's grid with executors that can (CudaExecutor)") {
    CHECK(detail::caps_grid<CudaExecutor>::value);
    CHECK(!detail::caps_grid<HostExecutor>::value);
    CHECK(CudaPipeline::kReservedSms == 32);
  }

  TEST_CASE("units cover every byte of a block exactly once, at most kTileBytes each") {
    const std::int64_t tile = detail::kTileBytes;
    for (std::int64_t row : std::vector<std::int64_t>{2, 128, 240, tile - 2, tile, tile + 2, 5 * tile + 6})
      for (std::int64_t rows : {1, 3, 1000}) {
        BlockCopy c{};
        for (int i = 0; i < 4; ++i) c.extent[i] = 1;
        c.extent[3] = rows;
        c.row_bytes = row;
        const auto g = detail::unit_geometry(c);
        CHECK(g.segs * tile >= row);
        CHECK((g.segs - 1) * tile < row);
        CHECK(g.rows_per_unit * std::min(row, tile) <= tile);
        CHECK(g.units == g.segs * ((rows + g.rows_per_unit - 1) / g.rows_per_unit));
      }
  }

  TEST_CASE("the copy kernel emulated on the host == HostExecutor byte for byte, every list, every alignment") {
    int with_sums = 0;  // plans whose head→seq sums replicated heads (bf16, fp32, fp64)
    for (const ListCase& l : executor_cases())
      for (const Plan& p : l.plans) {
        for (const BlockCopy& c : p.stage_lists(Direction::head_to_seq).unpack) with_sums += c.op == BlockOp::sum;
        for (std::size_t m : l.misaligns) {
          CAPTURE(l.name);
          CAPTURE(m);
          CHECK(ut::compare_emulated(p, l.name, m) == "");
        }
      }
    CHECK(with_sums > 50);
  }
}

TEST_CASE("CudaExecutor == HostExecutor byte for byte: every list of every case, every alignment") {
  ut::Stream s;
  for (const ListCase& l : executor_cases())
    for (const Plan& p : l.plans)
      for (std::size_t m : l.misaligns) {
        CAPTURE(l.name);
        CAPTURE(m);
        CHECK(ut::compare_executors(p, l.name, m, s.get()) == "");
      }
}

TEST_CASE("DeviceLocalGroup end to end: C1, C2 (P in 2,4,8; float, bf16, fp8), C3, C4, C5, C6, C8, zigzag") {
  check_local<float>(ut::c1_cases());
  for (int P : {2, 4, 8}) check_local<float>(ut::c2_cases(P));
  check_local<ut::bf16_t>(ut::c2_cases(4));
  check_local<ut::fp8_t>(ut::c2_cases(2));
  check_local<double>(ut::c2_cases(2));
  check_local<float>(ut::c3_cases());
  check_local<float>(ut::c4_cases(4));
  check_local<float>(ut::c4_cases(8));
  check_local<float>({ut::c5_case()});
  check_local<ut::bf16_t>({ut::c5_case()});
  check_local<float>(ut::c6_cases());
  check_local<float>(ut::c8_cases());
  for (int P : {1, 2, 3, 4}) check_local<float>(ut::zigzag_cases(P));
}

TEST_CASE("DeviceLocalGroup end to end: K-stage plans (stages one after another on the stream)") {
  check_local<float>(staged(ut::c2_cases(4), 3));
  check_local<float>(staged(ut::c6_cases(), 2));
  check_local<ut::bf16_t>(staged({ut::c5_case()}, 4));
}

TEST_CASE("DeviceLocalGroup end to end: C7 non-contiguous input view") {
  CHECK(ut::on_device_group(2, [](DeviceLocalGroup::Comm& comm) { return ut::run_view_case_device<float>(comm, 2, comm.stream()); }) ==
        "");
}

TEST_CASE("DeviceLocalGroup end to end: every model and P in {1,2,4,8,16,32}, q/k/v round trip (bf16)") {
  for (const auto& m : ulysses_models::kModels)
    for (int P : {1, 2, 4, 8, 16, 32}) {
      const std::string name = m.name;
      CAPTURE(name);
      CAPTURE(P);
      const bool even = ut::expected_even_error(m, P) == Errc{};
      CHECK(ut::run_local_device<ut::bf16_t>(ut::model_case(m, P, even)) == "");
    }
}

TEST_CASE("pack and unpack capture into a CUDA graph and replay like the host executor") {
  const ut::Case c = ut::c2_cases(2)[1];  // q/k/v, P=2, B=1, bshd
  const Plan plan = ut::plan_of<float>(c, 1);
  ut::Stream s;
  // Device copies of random inputs and receive region; host reference from the same bytes.
  const StageLists& sc = plan.stage_lists(Direction::seq_to_head);
  std::vector<std::vector<std::byte>> host;
  std::vector<ut::DeviceBuffer> dev;
  BufferTable ht, dt;
  auto add = [&](int index, std::size_t bytes, bool random) {
    host.emplace_back(bytes, std::byte{0x5a});
    if (random) ut::fill_random(host.back(), static_cast<std::uint64_t>(index) + 3);
    dev.emplace_back(bytes);
    dev.back().upload(host.back().data(), s.get());
  };
  for (int t = 0; t < plan.num_tensors(); ++t) {
    add(BufferIndex::input(t), plan.seq_bytes(t), true);
    add(BufferIndex::output(t), plan.head_bytes(t), false);
  }
  add(BufferIndex::send, sc.send_total, false);
  add(BufferIndex::recv, sc.recv_total, true);
  UT_CUDA(cudaStreamSynchronize(s.get()));
  const int index[] = {BufferIndex::input(0), BufferIndex::output(0), BufferIndex::input(1), BufferIndex::output(1), BufferIndex::input(2),
                       BufferIndex::output(2), BufferIndex::send, BufferIndex::recv};
  for (std::size_t i = 0; i < host.size(); ++i) ht.base[index[i]] = host[i].data(), dt.base[index[i]] = dev[i].get();
  CudaExecutor ex(plan, s.get());
  UT_CUDA(cudaStreamSynchronize(s.get()));  // the upload of the lists is not part of the graph

  cudaGraph_t graph = nullptr;
  UT_CUDA(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
  ex.run(sc.pack.data(), sc.pack.size(), dt);  // would fail under capture if it allocated or synchronised
  ex.run(sc.unpack.data(), sc.unpack.size(), dt);
  UT_CUDA(cudaStreamEndCapture(s.get(), &graph));
  std::size_t nodes = 0;
  UT_CUDA(cudaGraphGetNodes(graph, nullptr, &nodes));
  CHECK(nodes == 2);  // one kernel per list
  cudaGraphExec_t exec = nullptr;
  UT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  UT_CUDA(cudaGraphLaunch(exec, s.get()));
  UT_CUDA(cudaGraphLaunch(exec, s.get()));
  HostExecutor{}.run(sc.pack.data(), sc.pack.size(), ht);
  HostExecutor{}.run(sc.unpack.data(), sc.unpack.size(), ht);
  for (std::size_t i = 0; i < host.size(); ++i) {
    std::vector<std::byte> got(host[i].size());
    dev[i].download(got.data(), s.get());
    CAPTURE(index[i]);
    CHECK(got == host[i]);
  }
  UT_CUDA(cudaGraphExecDestroy(exec));
  UT_CUDA(cudaGraphDestroy(graph));
}

TEST_CASE("CudaExecutor rejects block lists of another plan; empty lists launch nothing") {
  ut::Stream s;
  const Plan a = ut::plan_of<float>(ut::c1_cases()[0], 0);
  const Plan b = a;  // same content, other lists
  CudaExecutor ex(a, s.get());
  BufferTable t;
  const StageLists& sb = b.stage_lists(Direction::seq_to_head);
  try {
    ex.run(sb.pack.data(), sb.pack.size(), t);
    FAIL("expected plan_mismatch");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::plan_mismatch);
  }
  const StageLists& sa = a.stage_lists(Direction::seq_to_head);
  CHECK(ex.units(sa.pack.data(), sa.pack.size()) > 0);
  CHECK(ex.units(sb.pack.data(), sb.pack.size()) == -1);
  CHECK(ex.max_grid() >= 1);
  ex.run(nullptr, 0, t);  // nothing to do, nothing launched
  CudaExecutor moved(std::move(ex));
  CHECK(moved.units(sa.pack.data(), sa.pack.size()) > 0);
  UT_CUDA(cudaStreamSynchronize(s.get()));
}

TEST_SUITE("host") {
  TEST_CASE("DeviceLocalGroup's direct path over several devices: peer access to each other device once, or path_unsupported naming the pair") {
    std::vector<std::pair<int, int>> asked;
    auto can = [&](bool yes) {
      return [&asked, yes](int d, int peer) { return asked.emplace_back(d, peer), yes; };
    };
    std::string err;
    CHECK(detail::peer_devices_to_enable(1, {0, 1, 0, 2, 1}, can(true), err) == std::vector<int>{0, 2});
    CHECK(err == "");
    CHECK(asked == std::vector<std::pair<int, int>>{{1, 0}, {1, 2}});
    CHECK(detail::peer_devices_to_enable(0, {0, 0, 0, 0}, can(false), err).empty());  // one GPU: nothing to enable
    CHECK(err == "");
    CHECK(detail::peer_devices_to_enable(0, {0, 3}, can(false), err).empty());
    CHECK(err.find("reads rank 1's memory on device 3 from device 0, which has no peer access to it") != std::string::npos);
    CHECK(err.find("Path::messages") != std::string::npos);
  }

  TEST_CASE("the CUDA verdict: insufficient driver with a driver is a build mismatch, without one no GPU; the report says which") {
    using detail::CudaVerdict;
    CHECK(detail::cuda_verdict(13000, 13000, cudaSuccess, 1) == CudaVerdict::ok);
    CHECK(detail::cuda_verdict(0, 13000, cudaErrorInsufficientDriver, 0) == CudaVerdict::no_driver);  // this machine: no libcuda
    CHECK(detail::cuda_verdict(12040, 13000, cudaErrorInsufficientDriver, 0) == CudaVerdict::build_mismatch);
    CHECK(detail::cuda_verdict(13000, 13000, cudaErrorNoDevice, 0) == CudaVerdict::no_device);
    CHECK(detail::cuda_verdict(13000, 13000, cudaSuccess, 0) == CudaVerdict::no_device);
    CHECK(detail::cuda_version_string(13000) == "13.0");
    CHECK(detail::cuda_version_string(12040) == "12.4");
    CHECK(detail::cuda_version_string(0) == "none");
    CHECK(detail::cuda_report(12040, 13000, cudaErrorInsufficientDriver, 0) ==
          "CUDA runtime 13.0 (this build's), driver 12.4: build mismatch: the driver runs CUDA <= 12.4, older than this build's runtime 13.0 "
          "(cudaErrorInsufficientDriver): rebuild with a CUDA toolkit <= 12.4 (not a missing device)");
    CHECK(detail::cuda_report(0, 13000, cudaErrorInsufficientDriver, 0) == "CUDA runtime 13.0 (this build's), driver none: no CUDA driver: no GPU here");
    CHECK(detail::cuda_report(13000, 13000, cudaSuccess, 2) == "CUDA runtime 13.0 (this build's), driver 13.0: ok: 2 device(s)");
  }

  TEST_CASE("a CUDA error pending before a launch is named as an earlier call's, not the launch's") {
    detail::check_pending(cudaSuccess, "block_copy_kernel");  // nothing pending: no throw
    const auto [code, message] = ut::error_of([] { detail::check_pending(cudaErrorMemoryAllocation, "block_copy_kernel"); });
    CHECK(code == Errc::backend);
    CHECK(message == std::string("ulysses: backend: block_copy_kernel not launched: a CUDA error from an earlier call is pending on this thread (cudaErrorMemoryAllocation: ") +
                         cudaGetErrorString(cudaErrorMemoryAllocation) + "; not this launch's: read and clear it with cudaGetLastError where it was made)");
  }
}

TEST_CASE("CudaExecutor: a stale error of an earlier call is reported as such, left pending for its owner, and nothing is launched") {
  ut::Stream s;
  const Plan a = ut::plan_of<float>(ut::c1_cases()[0], 0);
  CudaExecutor ex(a, s.get());
  const StageLists& sa = a.stage_lists(Direction::seq_to_head);
  BufferTable t;
  void* p = nullptr;
  CHECK(cudaMalloc(&p, std::size_t{1} << 62) == cudaErrorMemoryAllocation);  // someone else's failed call: a non-sticky pending error
  const auto [code, message] = ut::error_of([&] { ex.run(sa.pack.data(), sa.pack.size(), t); });
  CHECK(code == Errc::backend);
  CHECK(message.find("not launched: a CUDA error from an earlier call is pending") != std::string::npos);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);  // still there for its owner; now cleared
  CHECK(cudaGetLastError() == cudaSuccess);
  UT_CUDA(cudaStreamSynchronize(s.get()));
}

TEST_CASE("CudaExecutor: a foreign list with a peer table is refused before the table is uploaded (nothing enqueued, even inside a capture)") {
  ut::Stream s;
  const Plan a = ut::plan_of<float>(ut::c1_cases()[0], 0);
  const Plan b = a;  // same content, other lists: foreign to the executor
  CudaExecutor ex(a, s.get());
  BlockCopy one{};
  one.extent[0] = one.extent[1] = one.extent[2] = one.extent[3] = 1;
  one.row_bytes = 16;
  one.elem_bytes = 1;
  ex.prepare_direct(BlockList{&one, 1}, BlockList{&one, 1}, 1);
  UT_CUDA(cudaStreamSynchronize(s.get()));
  const StageLists& sb = b.stage_lists(Direction::seq_to_head);
  std::vector<std::byte*> tables(static_cast<std::size_t>(CudaExecutor::kPeerTables + 1) * kMaxTensors);
  for (std::size_t i = 0; i < tables.size(); ++i) tables[i] = reinterpret_cast<std::byte*>(std::uintptr_t{4096} * (i + 1));  // never read
  cudaGraph_t graph = nullptr;
  UT_CUDA(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
  int refused = 0;
  for (int k = 0; k <= CudaExecutor::kPeerTables; ++k) {  // 17 distinct tables: the 17th would synchronise the device
    BufferTable t;
    t.peers = tables.data() + static_cast<std::size_t>(k) * kMaxTensors;
    refused += ut::code_of([&] { ex.run(sb.pack.data(), sb.pack.size(), t); }) == Errc::plan_mismatch;
  }
  UT_CUDA(cudaStreamEndCapture(s.get(), &graph));
  std::size_t nodes = 99;
  UT_CUDA(cudaGraphGetNodes(graph, nullptr, &nodes));
  UT_CUDA(cudaGraphDestroy(graph));
  CHECK(refused == CudaExecutor::kPeerTables + 1);
  CHECK(nodes == 0);  // no peer-table upload was captured
}

TEST_CASE("DeviceLocalGroup: mismatched byte counts are reported and abort the group, no hang") {
  const std::string err = ut::on_device_group(2, [](DeviceLocalGroup::Comm& c) -> std::string {
    ut::DeviceBuffer buf(16);
    std::vector<std::size_t> sb{0, 8}, so{0, 0}, rb{0, 0}, ro{0, 0};
    if (c.rank() == 1) sb = {4, 0}, rb = {8, 0};
    c.alltoallv(buf.get(), sb.data(), so.data(), buf.get() + 8, rb.data(), ro.data());
    UT_CUDA(cudaStreamSynchronize(c.stream()));
    return "";
  });
  CHECK(err.find("plan_mismatch") != std::string::npos);
}

TEST_CASE("DeviceLocalGroup: check_agreement (host all-gather) catches plans made from different inputs, on every rank") {
  const std::string err = ut::on_device_group(2, [](DeviceLocalGroup::Comm& c) -> std::string {
    const Plan plan({2, c.rank()}, 1, SeqPartition::even(4, 2),
                    {TensorSpec::of<float>(HeadPartition::even(c.rank() == 0 ? 2 : 4, 2), 4)});
    try {
      check_agreement(plan, c);
      return "rank " + std::to_string(c.rank()) + ": no error";
    } catch (const Error& e) {
      return e.code() == Errc::plan_mismatch ? "" : e.what();
    }
  });
  CHECK(err == "");
}

// ---- CudaPipeline (cuda/pipeline.cuh): K-stage plans with pack / exchange / unpack overlapped ----

namespace {

/// run_case_device with the stages overlapped by a CudaPipeline on stream s (what the host
/// executor produces is the expectation; sentinel outside the layout included). The same pipeline
/// runs both directions (its events are reused). Returns "" or what went wrong.
template <class T, class Comm>
std::string run_case_pipeline(Comm& comm, const ut::Case& c, cudaStream_t s) {
  CudaPipeline pipe(s);
  return ut::run_case_device_with<T>(comm, c, s,
                                     [&](const Plan& plan, Direction d, CudaExecutor& ex, const TensorList<ConstByteSpan>& in,
                                         const TensorList<ByteSpan>& out, Workspace w) { pipe.redistribute(plan, d, comm, ex, in, out, w); });
}

template <class T>
void check_pipeline(const std::vector<ut::Case>& cases) {
  for (const auto& c : cases)
    for (int K : {1, 2, 3, 4})
      for (Path path : ut::device_paths<DeviceLocalGroup::Comm>()) {
        ut::Case k = c;
        k.stages = K;
        k.path = path;
        const std::string via = to_string(path);
        CAPTURE(c.name);
        CAPTURE(K);
        CAPTURE(via);
        CHECK(ut::on_device_group(k.P, [&](DeviceLocalGroup::Comm& comm) { return run_case_pipeline<T>(comm, k, comm.stream()); }) ==
              "");
      }
}

/// A one-rank communicator exchanging on a given stream: a P=1 plan moves no bytes, so alltoallv
/// has nothing to do (it checks that). Lets the pipeline be captured in a graph.
struct SoloComm {
  cudaStream_t s;
  int size() const { return 1; }
  int rank() const { return 0; }
  cudaStream_t stream() const { return s; }
  void alltoallv(const std::byte*, const std::size_t* sb, const std::size_t*, std::byte*, const std::size_t* rb, const std::size_t*) {
    if (sb[0] || rb[0]) throw std::logic_error("SoloComm: a one-rank plan exchanged bytes");
  }
  void allgather(const void* send, std::size_t bytes, void* recv) { std::memcpy(recv, send, bytes); }
};

}  // namespace

TEST_SUITE("host") {
  TEST_CASE("CudaPipeline sees the stream of the shipped stream-ordered communicators") {
    CHECK(detail::has_stream<DeviceLocalGroup::Comm>::value);
    CHECK(detail::has_stream<SoloComm>::value);
    CHECK(!detail::has_stream<LocalGroup::Comm>::value);
    CHECK(CudaPipeline::kMaxStages == 64);
  }
}

TEST_CASE("CudaPipeline on DeviceLocalGroup, K in {1,2,3,4}, P in {2,4}: bit-exact like the host executor") {
  check_pipeline<float>(ut::c1_cases());
  for (int P : {2, 4}) check_pipeline<float>(ut::c2_cases(P));
  check_pipeline<ut::bf16_t>(ut::c2_cases(4));
  check_pipeline<float>(ut::c3_cases());
  check_pipeline<float>(ut::c4_cases(4));
  check_pipeline<ut::bf16_t>({ut::c5_case()});
  check_pipeline<float>(ut::c6_cases());
  check_pipeline<float>(ut::c8_cases());
  for (int P : {2, 4}) check_pipeline<float>(ut::zigzag_cases(P));
}

TEST_CASE("CudaPipeline captures into a CUDA graph (copy stream forked and joined) and replays") {
  ut::Stream s;
  const std::int64_t B = 2, S = 8, H = 4, D = 8;
  const Plan plan({1, 0}, B, SeqPartition::even(S, 1), {TensorSpec::of<float>(HeadPartition::even(H, 1), D)}, Format::bshd,
                  PlanOptions{3});
  std::vector<float> x(static_cast<std::size_t>(B * S * H * D));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) + 0.5f;
  const std::vector<float> sent(x.size(), -1.0f);
  ut::DeviceBuffer din(x.size() * sizeof(float)), dout(x.size() * sizeof(float)), ws(plan.workspace_bytes() ? plan.workspace_bytes() : 16);
  din.upload(x.data(), s.get());
  dout.upload(sent.data(), s.get());
  CudaExecutor ex(plan, s.get());
  CudaPipeline pipe(s.get());
  SoloComm comm{s.get()};
  check_agreement(plan, comm);  // not capturable in general: before the capture
  UT_CUDA(cudaStreamSynchronize(s.get()));
  cudaGraph_t graph = nullptr;
  UT_CUDA(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeThreadLocal));
  pipe.seq_to_head(plan, comm, ex, {{din.get(), din.bytes()}}, {{dout.get(), dout.bytes()}}, {ws.get(), ws.bytes()});
  UT_CUDA(cudaStreamEndCapture(s.get(), &graph));  // fails (unjoined) if the copy stream was left forked
  std::size_t nodes = 0;
  UT_CUDA(cudaGraphGetNodes(graph, nullptr, &nodes));
  CHECK(nodes >= 3);  // one unpack kernel per stage (the packs of one rank are empty)
  cudaGraphExec_t exec = nullptr;
  UT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  UT_CUDA(cudaGraphLaunch(exec, s.get()));
  std::vector<float> got(x.size());
  dout.download(got.data(), s.get());
  CHECK(got == x);  // P=1, same layout: seq→head is the identity
  UT_CUDA(cudaGraphExecDestroy(exec));
  UT_CUDA(cudaGraphDestroy(graph));
}

TEST_CASE("CudaPipeline rejects a communicator on another stream and bad arguments before enqueueing") {
  ut::Stream s, other;
  const Plan plan({1, 0}, 1, SeqPartition::even(4, 1), {TensorSpec::of<float>(HeadPartition::even(2, 1), 4)}, Format::bshd,
                  PlanOptions{2});
  ut::DeviceBuffer din(plan.seq_bytes(0)), dout(plan.head_bytes(0)), ws(plan.workspace_bytes() ? plan.workspace_bytes() : 16);
  CudaExecutor ex(plan, s.get());
  CudaPipeline pipe(s.get());
  CHECK(pipe.stream() == s.get());
  CHECK(pipe.copy_stream() != nullptr);
  SoloComm wrong{other.get()}, right{s.get()};
  const TensorList<ConstByteSpan> in{{din.get(), din.bytes()}};
  const TensorList<ByteSpan> out{{dout.get(), dout.bytes()}};
  try {
    pipe.seq_to_head(plan, wrong, ex, in, out, {ws.get(), ws.bytes()});
    FAIL("expected comm_mismatch");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::comm_mismatch);
  }
  try {
    pipe.seq_to_head(plan, right, ex, in, TensorList<ByteSpan>{}, {ws.get(), ws.bytes()});
    FAIL("expected wrong_tensor_count");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::wrong_tensor_count);
  }
  pipe.seq_to_head(plan, right, ex, in, out, {ws.get(), ws.bytes()});  // still usable
  UT_CUDA(cudaStreamSynchronize(s.get()));
}
