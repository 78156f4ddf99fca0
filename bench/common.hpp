// SPDX-License-Identifier: Apache-2.0
// Shared by the benchmarks: the Llama-3.1-8B attention shapes (H=32, Hkv=8, D=128, B=1), the
// memory formats measured, one rank's buffers and plans, and the naming / counter conventions that
// bench/report reads.
//
// Naming: every benchmark is "<family>/<dtype>/S:<S>/P:<P>/<variant>". Its label is
// "baseline=<name of the benchmark it is measured against>" (and for a fused exchange also
// ";separate=<name of the same tensors in three exchanges>"); bench/report pairs them by name.
// Counters: bytes_per_second (SetBytesProcessed: bytes copied for pack/unpack/memcpy, bytes per
// rank for exchanges) and, for exchanges, algbw = bytes per rank / time and busbw = algbw*(P-1)/P
// (the nccl-tests convention; bytes per rank = the rank's share of q, k and v).
// The decode benchmarks (bench_decode, bench_mpi_decode) are "<family>/<variant>/P:<P>/B:<B>"
// (decode_name()), labelled the same way, with the counters bytes_received and collectives.
// Also shared: Lockstep (lockstep.hpp: P rank threads of a LocalGroup) and DecodeRank (one rank of a decode step).
#pragma once

#include <benchmark/benchmark.h>
#include <ulysses/ulysses.hpp>

#include "host_buffer.hpp"
#include "lockstep.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/mman.h>

namespace ub {

using namespace ulysses;

inline constexpr std::int64_t kH = 32, kHkv = 8, kD = 128, kB = 1;  // Llama-3.1-8B attention
inline const std::int64_t kSeqs[] = {4096, 16384};
inline const int kDegrees[] = {2, 4};
inline const int kElemBytes[] = {4, 2};

/// "fp32" / "bf16" (the 2-byte payload: moved as bytes, so any 2-byte type measures the same).
inline std::string dtype_name(int elem_bytes) { return elem_bytes == 4 ? "fp32" : "bf16"; }

/// How the local tensors sit in memory: a dense format, or q, k, v as views into one fused
/// projection output [B, S_r, H + 2*Hkv, D] (seq-sharded) and [B, S, H_r + 2*Hkv_r, D] (head-sharded).
enum class Mem { bshd, sbhd, bhsd, strided };
inline const Mem kMems[] = {Mem::bshd, Mem::sbhd, Mem::bhsd, Mem::strided};
inline const char* mem_name(Mem m) {
  switch (m) {
    case Mem::bshd: return "bshd";
    case Mem::sbhd: return "sbhd";
    case Mem::bhsd: return "bhsd";
    case Mem::strided: return "strided";
  }
  return "?";
}

/// Host buffer aligned to 2 MiB, written once at construction (so every page is mapped before
/// timing), advised to huge pages unless ULYSSES_BENCH_THP=0 (huge_page_alloc(), host_buffer.hpp).
class Buf {
 public:
  Buf() = default;
  explicit Buf(std::size_t bytes, unsigned char fill = 0x5a) : n_(bytes) {
    constexpr std::size_t kAlign = std::size_t{2} << 20;
    p_.reset(static_cast<std::byte*>(huge_page_alloc(bytes)));
    std::memset(p_.get(), fill, std::max<std::size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign));
  }
  std::byte* data() const { return p_.get(); }
  std::size_t size() const { return n_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> p_;
  std::size_t n_ = 0;
};

/// "<family>/<dtype>/S:<S>/P:<P>", with "/B:<B>" before "/P:" when B > 1.
inline std::string case_name(const std::string& family, int elem_bytes, std::int64_t S, int P, std::int64_t B = 1) {
  return family + "/" + dtype_name(elem_bytes) + "/S:" + std::to_string(S) + (B > 1 ? "/B:" + std::to_string(B) : std::string()) +
         "/P:" + std::to_string(P);
}

/// One rank's q, k, v in one memory arrangement: the fused plan (q, k, v in one exchange), the
/// three one-tensor plans (three exchanges), seq-sharded and head-sharded buffers (seq_to_head
/// reads the former and writes the latter; head_to_seq the reverse) and one workspace.
struct RankSetup {
  int P, rank, elem;
  std::int64_t S;
  Mem mem;
  std::int64_t B;
  std::vector<TensorSpec> specs;
  std::unique_ptr<Plan> fused;
  std::unique_ptr<Plan> fused_alltoallv;      // the same on Path::alltoallv: one all-to-all-v of the wire
  std::unique_ptr<Plan> fused_messages;       // the same on Path::messages: one message per piece
  std::vector<std::unique_ptr<Plan>> single;  // one plan per tensor
  Buf seq_buf, head_buf, ws;
  std::byte* seq_ptr[3] = {};
  std::byte* head_ptr[3] = {};

  RankSetup(int P_, int rank_, std::int64_t S_, int elem_, Mem mem_, std::int64_t B_ = kB)
      : P(P_), rank(rank_), elem(elem_), S(S_), mem(mem_), B(B_) {
    const auto q = HeadPartition::even(kH, P);
    const auto kv = HeadPartition::gqa(q, kHkv);
    const auto seq = SeqPartition::even(S, P);
    const std::int64_t Sr = seq.local_length(rank);
    const HeadPartition parts[3] = {q, kv, kv};
    const Format f = mem == Mem::sbhd ? Format::sbhd : mem == Mem::bhsd ? Format::bhsd : Format::bshd;
    // Fused views: head offsets of q, k, v inside [.., H+2Hkv, D] and [.., Hr+2Hkv_r, D].
    const std::int64_t Hs = kH + 2 * kHkv, Hh = q.count(rank) + 2 * kv.count(rank);
    const std::int64_t seq_h0[3] = {0, kH, kH + kHkv}, head_h0[3] = {0, q.count(rank), q.count(rank) + kv.count(rank)};
    std::size_t seq_off[3], head_off[3], seq_total = 0, head_total = 0;
    for (int t = 0; t < 3; ++t) {
      TensorSpec s{parts[t], kD, static_cast<std::size_t>(elem), std::nullopt, std::nullopt};
      s.with_type(elem == 4 ? ElementType::float32 : ElementType::bfloat16);  // (kv heads replicated at P > 8 are summed)
      const std::int64_t Ht = parts[t].num_heads(), Hrt = parts[t].count(rank);
      if (mem == Mem::strided) {
        s.with_seq_layout(Layout::strided({B, Sr, Ht, kD}, {Sr * Hs * kD, Hs * kD, kD, 1}));
        s.with_head_layout(Layout::strided({B, S, Hrt, kD}, {S * Hh * kD, Hh * kD, kD, 1}));
        seq_off[t] = static_cast<std::size_t>(seq_h0[t] * kD * elem);
        head_off[t] = static_cast<std::size_t>(head_h0[t] * kD * elem);
      } else {
        s.with_seq_layout(Layout::dense(f, B, Sr, Ht, kD));
        s.with_head_layout(Layout::dense(f, B, S, Hrt, kD));
        seq_off[t] = seq_total;
        head_off[t] = head_total;
        seq_total += static_cast<std::size_t>(B * Sr * Ht * kD * elem);
        head_total += static_cast<std::size_t>(B * S * Hrt * kD * elem);
      }
      specs.push_back(s);
    }
    if (mem == Mem::strided) {
      seq_total = static_cast<std::size_t>(B * Sr * Hs * kD * elem);
      head_total = static_cast<std::size_t>(B * S * Hh * kD * elem);
    }
    fused = std::make_unique<Plan>(Group{P, rank}, B, seq, specs);
    fused_alltoallv = std::make_unique<Plan>(Group{P, rank}, B, seq, specs, Format::bshd, PlanOptions{1, true, Path::alltoallv});
    fused_messages = std::make_unique<Plan>(Group{P, rank}, B, seq, specs, Format::bshd, PlanOptions{1, true, Path::messages});
    std::size_t ws_bytes = fused->workspace_bytes();
    for (int t = 0; t < 3; ++t) {
      single.push_back(std::make_unique<Plan>(Group{P, rank}, B, seq, std::vector<TensorSpec>{specs[t]}));
      ws_bytes = std::max(ws_bytes, single.back()->workspace_bytes());
    }
    seq_buf = Buf(seq_total, 0x11);
    head_buf = Buf(head_total, 0x22);
    ws = Buf(ws_bytes, 0x33);
    for (int t = 0; t < 3; ++t) seq_ptr[t] = seq_buf.data() + seq_off[t], head_ptr[t] = head_buf.data() + head_off[t];
  }

  /// Tensor t's seq-sharded (resp. head-sharded) buffer: from its base to the end of the arrangement.
  ByteSpan seq_span(int t) const { return {seq_ptr[t], static_cast<std::size_t>(seq_buf.data() + seq_buf.size() - seq_ptr[t])}; }
  ByteSpan head_span(int t) const { return {head_ptr[t], static_cast<std::size_t>(head_buf.data() + head_buf.size() - head_ptr[t])}; }
  /// Inputs of direction d for tensors [t0, t0+n).
  TensorList<ConstByteSpan> inputs(Direction d, int t0 = 0, int n = 3) const {
    TensorList<ConstByteSpan> l;
    for (int t = t0; t < t0 + n; ++t) l.push_back(d == Direction::seq_to_head ? seq_span(t) : head_span(t));
    return l;
  }
  /// Outputs of direction d for tensors [t0, t0+n).
  TensorList<ByteSpan> outputs(Direction d, int t0 = 0, int n = 3) const {
    TensorList<ByteSpan> l;
    for (int t = t0; t < t0 + n; ++t) l.push_back(d == Direction::seq_to_head ? head_span(t) : seq_span(t));
    return l;
  }
  Workspace workspace() const { return {ws.data(), ws.size()}; }
  /// The fused plan's buffer table for direction d (bind_buffers(): q, k, v interleaved in one
  /// fused buffer, Mem::strided, pass its exact overlap test).
  BufferTable table(Direction d) const { return bind_buffers(*fused, d, inputs(d), outputs(d), workspace()); }
  /// The rank's share of q, k and v in bytes (the nccl-tests "size" of the all-to-all).
  std::size_t bytes_per_rank() const {
    std::size_t n = 0;
    for (int t = 0; t < 3; ++t)
      n += static_cast<std::size_t>(B * fused->seq().local_length(rank) * specs[t].heads.num_heads() * kD * elem);
    return n;
  }
};

/// DeepSpeed-Ulysses' op sequence for one tensor (deepspeed/sequence/layer.py, single_all_to_all
/// with scatter_idx=2 and gather_idx=1 for seq→head; the reverse for head→seq), written plainly on
/// the same communicator: a permute copy into a contiguous send buffer, the all-to-all of P equal
/// chunks (all_to_all_single: the own chunk included), and a permute copy out of the receive
/// buffer unless the received layout already is the output's (a view in PyTorch). All tensors bshd.
///   seq→head: x [B, S_r, H, D] → send [P, S_r, B, h, D] (copy) → all-to-all → recv [P, S_r, B, h, D]
///             = [B, S, h, D] at B = 1 (view), else → [B, S, h, D] (copy)            (h = H / P)
///   head→seq: y [B, S, h, D] = [P, S_r, B, h, D] at B = 1 (view), else → send (copy) → all-to-all
///             → recv [P, S_r, B, h, D] → [B, S_r, H, D] (copy)
/// Copies per element per direction: 1 at B = 1, 2 at B > 1 (the DeepSpeed count), plus
/// the transport. `send` and `recv` are scratch of B*S_r*H*D elements each (only used as needed).
/// @pre S % P == 0, H % P == 0, rows of D elements of e bytes.
template <class Comm>
void deepspeed_op_sequence(Comm& comm, Direction d, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, std::int64_t e,
                           const std::byte* in, std::byte* out, std::byte* send, std::byte* recv) {
  const int P = comm.size();
  const std::int64_t Sr = S / P, h = H / P, row = h * D * e;  // one (b, s) row of one rank's heads
  const std::size_t chunk = static_cast<std::size_t>(Sr * B * row);
  std::vector<std::size_t> bytes(static_cast<std::size_t>(P), chunk), offs(static_cast<std::size_t>(P));
  for (int p = 0; p < P; ++p) offs[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p) * chunk;
  if (d == Direction::seq_to_head) {
    for (int p = 0; p < P; ++p)  // send[p][s][b] = x[b][s][p*h .. p*h+h)
      for (std::int64_t s = 0; s < Sr; ++s)
        for (std::int64_t b = 0; b < B; ++b)
          std::memcpy(send + ((p * Sr + s) * B + b) * row, in + ((b * Sr + s) * H + p * h) * D * e, static_cast<std::size_t>(row));
    std::byte* land = B == 1 ? out : recv;
    comm.alltoallv(send, bytes.data(), offs.data(), land, bytes.data(), offs.data());
    if (B > 1)  // out[b][p*Sr + s] = recv[p][s][b]
      for (int p = 0; p < P; ++p)
        for (std::int64_t s = 0; s < Sr; ++s)
          for (std::int64_t b = 0; b < B; ++b)
            std::memcpy(out + (b * S + p * Sr + s) * row, recv + ((p * Sr + s) * B + b) * row, static_cast<std::size_t>(row));
    return;
  }
  const std::byte* src = in;
  if (B > 1) {  // send[p][s][b] = y[b][p*Sr + s]
    for (int p = 0; p < P; ++p)
      for (std::int64_t s = 0; s < Sr; ++s)
        for (std::int64_t b = 0; b < B; ++b)
          std::memcpy(send + ((p * Sr + s) * B + b) * row, in + (b * S + p * Sr + s) * row, static_cast<std::size_t>(row));
    src = send;
  }
  comm.alltoallv(src, bytes.data(), offs.data(), recv, bytes.data(), offs.data());
  for (int p = 0; p < P; ++p)  // out[b][s][p*h ..) = recv[p][s][b]
    for (std::int64_t s = 0; s < Sr; ++s)
      for (std::int64_t b = 0; b < B; ++b)
        std::memcpy(out + ((b * Sr + s) * H + p * h) * D * e, recv + ((p * Sr + s) * B + b) * row, static_cast<std::size_t>(row));
}

/// Bytes a block list copies.
inline std::size_t list_bytes(const std::vector<BlockCopy>& l) {
  std::size_t n = 0;
  for (const BlockCopy& c : l) n += static_cast<std::size_t>(c.bytes());
  return n;
}

/// Sets bytes_per_second (SetBytesProcessed) and, for exchanges (P > 0), algbw and busbw, all
/// rates over the benchmark's own time (manual or real).
inline void set_counters(benchmark::State& st, std::size_t bytes, int P = 0) {
  st.SetBytesProcessed(static_cast<std::int64_t>(bytes) * static_cast<std::int64_t>(st.iterations()));
  if (P > 0) {
    const double total = static_cast<double>(bytes) * static_cast<double>(st.iterations());
    st.counters["algbw"] = benchmark::Counter(total, benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
    st.counters["busbw"] = benchmark::Counter(total * (P - 1) / P, benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
  }
}

/// Label naming the baseline (and optionally the three-exchange variant) of a benchmark.
inline std::string label(const std::string& baseline, const std::string& separate = "") {
  return "baseline=" + baseline + (separate.empty() ? "" : ";separate=" + separate);
}



// ---- the decode exchange against the all-gather baseline (bench_decode, bench_mpi_decode) -------

inline constexpr std::int64_t kDecodeDv = 128, kDecodeT = 1;  // Llama-3.1-8B: H = kH = 32 query heads, Dv = 128; T = 1
inline const std::int64_t kDecodeBatches[] = {1, 4, 16, 64, 256, 1024};

/// "<family>/<variant>/P:<P>/B:<B>" (family decode or mpi_decode; variant exchange, direct or ag).
inline std::string decode_name(const std::string& family, const std::string& variant, int P, std::int64_t B) {
  return family + "/" + variant + "/P:" + std::to_string(P) + "/B:" + std::to_string(B);
}

/// One rank of a decode step: its partial output O_r [B, 1, H, Dv] (bf16, random) and LSE_r
/// [B, 1, H] (fp32, random in [-4, 4]), its plans (even head split, bf16 out; the default path,
/// and Path::direct), the merged output of its heads [B, 1, H/P, Dv] from decode_exchange()
/// (`out`) and from the baseline (`out_base`), and the baseline's gathered partials.
struct DecodeRank {
  DecodePlan plan, direct_plan;
  Buf o, lse, out, out_base, ws, ag_o, ag_lse;

  DecodeRank(int P, int r, std::int64_t B)
      : plan(DecodeSpec(B, kDecodeT, HeadPartition::even(kH, P), kDecodeDv).with_types(ElementType::bfloat16, ElementType::bfloat16), r),
        direct_plan(DecodeSpec(plan.spec()).with_path(Path::direct), r) {
    const std::int64_t rows = B * kDecodeT * kH;
    o = Buf(static_cast<std::size_t>(rows * kDecodeDv * 2));
    lse = Buf(static_cast<std::size_t>(rows * 4));
    std::mt19937 g(static_cast<std::uint32_t>(r * 7919 + B));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (std::int64_t i = 0; i < rows * kDecodeDv; ++i) {
      const std::uint16_t b = detail::float_to_bfloat16(u(g));
      std::memcpy(o.data() + 2 * i, &b, 2);
    }
    for (std::int64_t i = 0; i < rows; ++i) {
      const float l = 4 * u(g);
      std::memcpy(lse.data() + 4 * i, &l, 4);
    }
    out = Buf(plan.out_span_bytes(), 0);
    out_base = Buf(plan.out_span_bytes(), 0);
    ws = Buf(plan.workspace_bytes() + 16, 0);
    ag_o = Buf(o.size() * static_cast<std::size_t>(P), 0);
    ag_lse = Buf(lse.size() * static_cast<std::size_t>(P), 0);
  }
  DecodeBuffers buffers() const {
    return DecodeBuffers().partial(o).lse(lse).out({out.data(), out.size()}).workspace({ws.data(), ws.size()});
  }
  /// The two-collective baseline engines run today (vLLM's all-gather path): an all-gather of O
  /// and one of LSE — `allgather(send, bytes, recv)`, every rank's block at recv + p·bytes, the
  /// own one included, as all_gather_into_tensor writes it — then the local merge of this rank's
  /// heads from the gathered partials: the library's own merge (merge_rows_batch(), what
  /// HostDecodeExecutor runs), contributions in rank order, so the same bits as decode_exchange().
  template <class Allgather>
  void baseline(int P, Allgather&& allgather) {
    allgather(o.data(), o.size(), ag_o.data());
    allgather(lse.data(), lse.size(), ag_lse.data());
    const std::int64_t B = plan.batch(), Hr = plan.local_heads(), h0 = plan.head_begin(), rows = B * kDecodeT * Hr;
    const std::size_t per_rank_rows = static_cast<std::size_t>(B * kDecodeT * kH);
    constexpr int kMaxP = 64;
    const void* src[kMergeBatchRows * kMaxP];
    float lses[kMergeBatchRows * kMaxP];
    void* dst[kMergeBatchRows];
    for (std::int64_t r0 = 0; r0 < rows; r0 += kMergeBatchRows) {
      const int g = rows - r0 < kMergeBatchRows ? static_cast<int>(rows - r0) : kMergeBatchRows;
      for (int k = 0; k < g; ++k) {
        const std::int64_t r = r0 + k, bt = r / Hr, j = r - bt * Hr;
        const std::size_t row = static_cast<std::size_t>(bt * kH + h0 + j);
        for (int p = 0; p < P; ++p) {
          const std::size_t at = static_cast<std::size_t>(p) * per_rank_rows + row;
          src[k * P + p] = ag_o.data() + at * kDecodeDv * 2;
          std::memcpy(&lses[k * P + p], ag_lse.data() + at * 4, 4);
        }
        dst[k] = out_base.data() + static_cast<std::size_t>(r * kDecodeDv * 2);
      }
      merge_rows_batch(g, P, src, lses, ElementType::bfloat16, kDecodeDv, dst, ElementType::bfloat16, nullptr);
    }
  }
  /// Bytes the baseline receives from other ranks per step.
  std::size_t baseline_received(int P) const { return (o.size() + lse.size()) * static_cast<std::size_t>(P - 1); }
  /// Whether both variants' outputs are the same bits (compare after running both once).
  bool agree() const { return std::memcmp(out.data(), out_base.data(), out.size()) == 0; }
};

/// Sets the decode benchmarks' counters and label: bytes received per rank per step, collectives,
/// and for the library's variants the label naming the baseline.
inline void decode_counters(benchmark::State& st, std::size_t received, int collectives, const std::string& baseline) {
  st.counters["bytes_received"] = static_cast<double>(received);
  st.counters["collectives"] = collectives;
  st.SetBytesProcessed(static_cast<std::int64_t>(received) * static_cast<std::int64_t>(st.iterations()));
  if (!baseline.empty()) st.SetLabel(label(baseline));
}

}  // namespace ub
