// SPDX-License-Identifier: Apache-2.0
// The peer copy between MPI processes of one node (MpiWindowComm, comm/mpi_window.hpp), one rank
// per process, against what it replaces. Llama-3.1-8B attention (H=32, Hkv=8, D=128, bshd):
// q, k, v seq→head in one exchange, and the attention output o head→seq; S in {4096, 16384},
// B in {1, 4}, fp32 and bf16. Variants of each (same bytes, same outputs):
//   MPI_Alltoall  a bare MPI_Alltoall of the rank's bytes (P equal chunks) between two contiguous
//                 buffers: the floor of any exchange that goes through MPI (target: window <= 1.0x)
//   window        redistribute() over MpiWindowComm, the inputs allocated from the window: every
//                 rank copies its share of its peers' inputs straight into its outputs (Path::direct)
//   window_outputs the same with the outputs allocated from the window too: seq→head then pushes
//                 (each rank reads its own rows in order and stores its peers' heads into their
//                 outputs, MpiWindowComm::outputs_in_window()); head→seq pulls as in `window`
//   window_staged the same with the inputs outside the window: their rows go straight into the
//                 peers' outputs with Cross Memory Attach (process_vm_readv by the reader, or
//                 process_vm_writev by the owner; 1 copy) where the window's probe allows it,
//                 else staged once into the window (2 copies) (target: <= 1.3x MPI_Alltoall).
//                 CMA_MIN_RANGE=<bytes> sets MpiWindowComm::set_cross_memory_min_range()
//   window_staged_outputs the inputs outside the window, the outputs in it: seq→head pushes from
//                 each rank's own inputs, where they are, into its peers' outputs (loads and stores,
//                 1 copy); head→seq as window_staged
//   window_staged_copy  the same as window_staged, staging forced (MpiWindowComm::set_cross_memory_attach(false)):
//                 2 copies, the way inputs outside the window went before Cross Memory Attach
//   messages      redistribute() over MpiComm (the default path between processes until now)
//   deepspeed     DeepSpeed-Ulysses' op sequence over the same MpiComm, per tensor: permute into a
//                 preallocated buffer, the all-to-all, and at B > 1 the second permute
//                 (common.hpp's deepspeed_op_sequence; target: window >= 1.5x faster)
// P is the size of MPI_COMM_WORLD (all on one node). Timing as bench_mpi.cpp: per iteration a
// barrier, MPI_Wtime around the operation, the maximum over ranks as the manual time; only rank 0
// reports. bench/run_window.sh runs it and prints the ratios.
//
// Run: mpiexec -n 4 bench_mpi_window [--benchmark_min_time=0.2] [--benchmark_out=window_p4.json]
#include "common.hpp"
#include "mpi_bench.hpp"

#include <ulysses/comm/mpi.hpp>

#include <climits>
#include <functional>
#include <iostream>
#include <tuple>

using namespace ub;

namespace {

int g_rank = 0, g_size = 1;

/// One rank's plan, window and buffers for one (S, elem, B, direction): the inputs registered in
/// the window and copied outside it too, the outputs, DeepSpeed's scratch and the workspace of
/// the message path.
struct WindowSetup {
  std::int64_t S, B;
  int elem;
  Direction dir;
  std::vector<TensorSpec> specs;  // q, k, v (seq→head) or o (head→seq)
  std::unique_ptr<Plan> plan, plan_messages;
  MpiComm comm{MPI_COMM_WORLD};
  std::unique_ptr<MpiWindow> win;
  std::unique_ptr<MpiWindowComm> wc;
  WindowSpan in_win, out_win;
  Buf in_host, out, ds_send, ds_recv, ws;
  std::size_t in_off[3] = {}, out_off[3] = {}, bytes = 0;

  WindowSetup(std::int64_t S_, int elem_, std::int64_t B_, Direction d) : S(S_), B(B_), elem(elem_), dir(d) {
    const auto q = HeadPartition::even(kH, g_size);
    const auto kv = HeadPartition::gqa(q, kHkv);
    const auto seq = SeqPartition::even(S, g_size);
    const std::int64_t Sr = seq.local_length(g_rank);
    const bool s2h = d == Direction::seq_to_head;
    const std::vector<HeadPartition> parts = s2h ? std::vector<HeadPartition>{q, kv, kv} : std::vector<HeadPartition>{q};
    std::size_t in_total = 0, out_total = 0;
    for (std::size_t t = 0; t < parts.size(); ++t) {
      TensorSpec s{parts[t], kD, static_cast<std::size_t>(elem), std::nullopt, std::nullopt};
      s.with_type(elem == 4 ? ElementType::float32 : ElementType::bfloat16);
      specs.push_back(s);
      const auto seq_b = static_cast<std::size_t>(B * Sr * parts[t].num_heads() * kD * elem);
      const auto head_b = static_cast<std::size_t>(B * S * parts[t].count(g_rank) * kD * elem);
      in_off[t] = in_total, out_off[t] = out_total;
      in_total += s2h ? seq_b : head_b;
      out_total += s2h ? head_b : seq_b;
    }
    plan = std::make_unique<Plan>(Group{g_size, g_rank}, B, seq, specs);
    plan_messages = std::make_unique<Plan>(Group{g_size, g_rank}, B, seq, specs, Format::bshd, PlanOptions{1, true, Path::messages});
    win = std::make_unique<MpiWindow>(comm, 2 * in_total + out_total + 4 * MpiWindow::kAlignment);  // room to stage window_staged's inputs
    in_win = win->allocate(in_total);
    out_win = win->allocate(out_total);
    std::memset(in_win.data(), 0x11, in_total);
    std::memset(out_win.data(), 0x22, out_total);
    wc = std::make_unique<MpiWindowComm>(comm, *win);
    if (const char* m = std::getenv("CMA_MIN_RANGE")) wc->set_cross_memory_min_range(std::strtoull(m, nullptr, 10));
    in_host = Buf(in_total, 0x11);
    out = Buf(out_total, 0x22);
    const auto q_bytes = static_cast<std::size_t>(B * Sr * kH * kD * elem);  // DeepSpeed's largest tensor
    ds_send = Buf(q_bytes, 0x44);
    ds_recv = Buf(q_bytes, 0x55);
    ws = Buf(plan_messages->workspace_bytes(), 0x33);
    bytes = in_total;
  }
  TensorList<ConstByteSpan> inputs(std::byte* base) const {
    TensorList<ConstByteSpan> l;
    for (std::size_t t = 0; t < specs.size(); ++t) l.push_back(ConstByteSpan{base + in_off[t], bytes - in_off[t]});
    return l;
  }
  TensorList<ByteSpan> outputs(std::byte* base = nullptr) const {
    if (!base) base = out.data();
    TensorList<ByteSpan> l;
    for (std::size_t t = 0; t < specs.size(); ++t) l.push_back(ByteSpan{base + out_off[t], out.size() - out_off[t]});
    return l;
  }
};

std::unique_ptr<WindowSetup> cache;  // the current setup (reset before MPI_Finalize: its window is freed collectively)

WindowSetup& setup(std::int64_t S, int elem, std::int64_t B, Direction d) {
  static std::tuple<std::int64_t, int, std::int64_t, Direction> key{};
  if (!cache || key != std::make_tuple(S, elem, B, d)) {
    cache.reset();  // every rank frees the previous window (collective) before the next one
    cache = std::make_unique<WindowSetup>(S, elem, B, d);
    key = {S, elem, B, d};
  }
  return *cache;
}

enum class What { alltoall, window, window_outputs, window_staged, window_staged_outputs, window_staged_copy, messages, deepspeed };

void bm(benchmark::State& st, What what, std::int64_t S, int elem, std::int64_t B, Direction d) {
  WindowSetup& r = setup(S, elem, B, d);
  HostExecutor ex;
  const std::size_t chunk = r.bytes / static_cast<std::size_t>(g_size);
  if (chunk > static_cast<std::size_t>(INT_MAX)) {
    st.SkipWithError("chunk over INT_MAX bytes");
    return;
  }
  std::function<void()> op;
  switch (what) {
    case What::alltoall:
      op = [&] {
        MPI_Alltoall(r.in_win.data(), static_cast<int>(chunk), MPI_BYTE, r.out.data(), static_cast<int>(chunk), MPI_BYTE, MPI_COMM_WORLD);
      };
      break;
    case What::window: op = [&] { redistribute(*r.plan, d, *r.wc, ex, r.inputs(r.in_win.data()), r.outputs(), {}); }; break;
    case What::window_outputs:
      op = [&] { redistribute(*r.plan, d, *r.wc, ex, r.inputs(r.in_win.data()), r.outputs(r.out_win.data()), {}); };
      break;
    case What::window_staged:
    case What::window_staged_copy: op = [&] { redistribute(*r.plan, d, *r.wc, ex, r.inputs(r.in_host.data()), r.outputs(), {}); }; break;
    case What::window_staged_outputs:
      op = [&] { redistribute(*r.plan, d, *r.wc, ex, r.inputs(r.in_host.data()), r.outputs(r.out_win.data()), {}); };
      break;
    case What::messages:
      op = [&] { redistribute(*r.plan_messages, d, r.comm, ex, r.inputs(r.in_host.data()), r.outputs(), {r.ws.data(), r.ws.size()}); };
      break;
    case What::deepspeed:
      op = [&] {
        for (std::size_t t = 0; t < r.specs.size(); ++t)
          deepspeed_op_sequence(r.comm, d, B, S, r.specs[t].heads.num_heads(), kD, elem, r.in_host.data() + r.in_off[t],
                                r.out.data() + r.out_off[t], r.ds_send.data(), r.ds_recv.data());
      };
      break;
  }
  r.wc->set_cross_memory_attach(what != What::window_staged_copy);
  mpi_timed_loop(st, op);
  r.wc->set_cross_memory_attach(true);
  set_counters(st, r.bytes, g_size);
  if (what == What::window_staged || what == What::window_staged_outputs || what == What::window_staged_copy) {
    st.counters["staged"] = static_cast<double>(r.wc->staged_bytes());
    st.counters["remote"] = static_cast<double>(r.wc->remote_bytes());
    st.counters["copies"] = r.wc->staged_bytes() ? 2 : 1;
    st.counters["pushed"] = d == Direction::seq_to_head && r.wc->outputs_in_window() ? 1 : 0;  // (head→seq always pulls)
  }
  if (what == What::window || what == What::window_outputs) {
    st.counters["copies"] = r.plan->copies(d, choose_path<MpiWindowComm, HostExecutor>(*r.plan)).executor;
    st.counters["staged"] = static_cast<double>(r.wc->staged_bytes());
    st.counters["pushed"] = d == Direction::seq_to_head && r.wc->outputs_in_window() ? 1 : 0;  // (head→seq always pulls)
  }
  if (what == What::deepspeed) st.counters["copies"] = B > 1 ? 2 : 1;
}

void register_all() {
  const std::pair<What, const char*> variants[] = {{What::alltoall, "MPI_Alltoall"}, {What::window, "window"},
                                                   {What::window_outputs, "window_outputs"}, {What::window_staged, "window_staged"},
                                                   {What::window_staged_outputs, "window_staged_outputs"},
                                                   {What::window_staged_copy, "window_staged_copy"}, {What::messages, "messages"},
                                                   {What::deepspeed, "deepspeed"}};
  for (int elem : kElemBytes)
    for (std::int64_t S : kSeqs)
      for (std::int64_t B : {1, 4})
        for (Direction d : {Direction::seq_to_head, Direction::head_to_seq}) {
          const std::string fam = case_name(d == Direction::seq_to_head ? "window_qkv_seq_to_head" : "window_o_head_to_seq", elem, S, g_size, B);
          for (const auto& [w, name] : variants) {
            const What what = w;
            benchmark::RegisterBenchmark((fam + "/" + name).c_str(), [=](benchmark::State& st) {
              bm(st, what, S, elem, B, d);
              st.SetLabel(label(fam + "/MPI_Alltoall") + ";deepspeed=" + fam + "/deepspeed");
            })->UseManualTime();
          }
        }
}

}  // namespace

int main(int argc, char** argv) { return mpi_benchmark_main(argc, argv, "mpi_window", g_rank, g_size, register_all, [] { cache.reset(); }); }
