// SPDX-License-Identifier: Apache-2.0
// Test harness shared by the in-process and MPI tests: builds the global tensors of a case, shards
// them as the partitions say, runs seq→head and head→seq on one rank of any communicator, and
// compares every element bit for bit with the slice of the global tensor that rank must hold.
// The expected values come from the partitions alone (never from the plan's block lists).
#pragma once

#include <ulysses/ulysses.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace ut {

using ulysses::Format;
using ulysses::HeadPartition;
using ulysses::Layout;
using ulysses::SeqPartition;

/// Element types standing for what engines move: 2-byte (bf16) and 1-byte (fp8) payloads.
struct bf16_t {
  std::uint16_t bits;
};
struct fp8_t {
  std::uint8_t bits;
};

/// One tensor of a case: its head partition and head dim.
struct TensorCase {
  HeadPartition heads;
  std::int64_t D;
};

/// A redistribution case: group size, batch, sequence partition, tensors, memory order.
struct Case {
  std::string name;
  int P;
  std::int64_t B;
  SeqPartition seq;
  std::vector<TensorCase> tensors;
  Format format = Format::bshd;
  int stages = 1;          ///< PlanOptions::stages
  bool pipelined = false;  ///< run through HostPipeline (else redistribute())
  bool direct_pieces = true;  ///< PlanOptions::direct_pieces (false: one all-to-all-v of the wire)
};

/// Position code of global element (t, b, s, h, d) of a tensor [B, S, H, D].
inline std::uint64_t position(int t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, std::int64_t S,
                              std::int64_t H, std::int64_t D, std::int64_t B) {
  return static_cast<std::uint64_t>(((b * S + s) * H + h) * D + d) + static_cast<std::uint64_t>(t) * static_cast<std::uint64_t>(B * S * H * D);
}

/// The value of a global element: its position code, as T when T is arithmetic (exact while the
/// code fits the mantissa), otherwise a hash of the code spread over T's bytes.
template <class T>
T value(std::uint64_t code) {
  T v;
  if constexpr (std::is_arithmetic_v<T>) {
    v = static_cast<T>(code);
  } else {
    std::uint64_t x = code * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    unsigned char bytes[sizeof(T)];
    for (std::size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<unsigned char>(x >> (8 * (i % 8)));
    std::memcpy(&v, bytes, sizeof(T));
  }
  return v;
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

/// Byte pattern the outputs are filled with first: elements outside the output's layout must keep it.
template <class T>
T sentinel() {
  T v;
  std::memset(&v, 0x5a, sizeof(T));
  return v;
}

/// Global token of local token `ls` of rank r in the seq-sharded layout.
inline std::int64_t global_token(const SeqPartition& seq, int r, std::int64_t ls) {
  for (const auto& c : seq.chunks_of(r))
    if (ls < c.local_offset + c.length) return c.offset + (ls - c.local_offset);
  return -1;
}

/// Runs `c` on rank `comm.rank()` with element type T: seq→head into fresh buffers, checked against
/// the global tensor, then head→seq of that output, checked against the original shard; also
/// checks that no byte outside an output's layout was written. Element values come from
/// gen(position code) (default: value<T>). Returns "" or what went wrong.
template <class T, class Comm, class Exec = ulysses::HostExecutor>
std::string run_case(Comm& comm, const Case& c, Exec exec = Exec{}, T (*gen)(std::uint64_t) = &value<T>) {
  using namespace ulysses;
  const int r = comm.rank();
  const std::int64_t S = c.seq.seq_len();
  std::vector<TensorSpec> specs;
  for (auto& t : c.tensors) specs.push_back(TensorSpec::of<T>(t.heads, t.D));
  Plan plan({c.P, r}, c.B, c.seq, specs, c.format, PlanOptions{c.stages, c.direct_pieces});
  const int NT = plan.num_tensors();
  std::vector<std::vector<T>> in(NT), mid(NT), back(NT);
  for (int t = 0; t < NT; ++t) {
    const Layout& sl = plan.seq_layout(t);
    const std::int64_t H = c.tensors[t].heads.num_heads(), D = c.tensors[t].D;
    in[t].assign(static_cast<std::size_t>(sl.span_elems()), sentinel<T>());
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t ls = 0; ls < sl.extent[1]; ++ls)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d)
            in[t][static_cast<std::size_t>(sl.offset(b, ls, h, d))] =
                gen(position(t, b, global_token(c.seq, r, ls), h, d, S, H, D, c.B));
    mid[t].assign(static_cast<std::size_t>(plan.head_layout(t).span_elems()), sentinel<T>());
    back[t].assign(in[t].size(), sentinel<T>());
  }
  std::vector<std::byte> ws(plan.workspace_bytes());
  std::vector<const void*> ip, mp_c;
  std::vector<void*> mp, bp;
  for (int t = 0; t < NT; ++t) {
    ip.push_back(in[t].data());
    mp.push_back(mid[t].data());
    mp_c.push_back(mid[t].data());
    bp.push_back(back[t].data());
  }
  std::ostringstream err;
  auto fail = [&](const std::string& what) {
    if (err.tellp() == 0) err << c.name << " rank " << r << ": " << what;
  };
  HostPipeline pipe;
  Exec exec2 = exec;  // the pipeline's unpacker runs its own executor
  auto move = [&](Direction dir, TensorList<const void*> src, TensorList<void*> dst) {
    if (c.pipelined)
      pipe.run(plan, dir, comm, exec, exec2, src, dst, Workspace{ws.data(), ws.size()});
    else
      redistribute(plan, dir, comm, exec, src, dst, Workspace{ws.data(), ws.size()});
  };
  move(Direction::seq_to_head, {ip.data(), ip.size()}, {mp.data(), mp.size()});
  for (int t = 0; t < NT; ++t) {
    const Layout& hl = plan.head_layout(t);
    const std::int64_t H = c.tensors[t].heads.num_heads(), D = c.tensors[t].D, h0 = c.tensors[t].heads.begin(r);
    std::vector<char> touched(mid[t].size(), 0);
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < hl.extent[2]; ++h)
          for (std::int64_t d = 0; d < D; ++d) {
            const auto o = static_cast<std::size_t>(hl.offset(b, s, h, d));
            touched[o] = 1;
            if (!same_bits(mid[t][o], gen(position(t, b, s, h0 + h, d, S, H, D, c.B)))) {
              std::ostringstream m;
              m << "seq_to_head tensor " << t << " wrong at (b=" << b << ",s=" << s << ",h=" << h << ",d=" << d << ")";
              fail(m.str());
            }
          }
    for (std::size_t o = 0; o < mid[t].size(); ++o)
      if (!touched[o] && !same_bits(mid[t][o], sentinel<T>())) fail("seq_to_head wrote outside the output layout");
  }
  move(Direction::head_to_seq, {mp_c.data(), mp_c.size()}, {bp.data(), bp.size()});
  for (int t = 0; t < NT; ++t)
    if (!in[t].empty() && std::memcmp(in[t].data(), back[t].data(), in[t].size() * sizeof(T)) != 0)
      fail("head_to_seq(seq_to_head(x)) != x for tensor " + std::to_string(t));
  return err.str();
}

}  // namespace ut
