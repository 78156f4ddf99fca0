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
  bool in_place_messages = true;  ///< PlanOptions::in_place_messages (false: one all-to-all-v of the wire)
  ulysses::Replicas replicas = ulysses::Replicas::sum;  ///< every tensor's (opaque types always take Replicas::owner)
  bool padded = false;  ///< strided views: every rank's local tensors with padded rows and tokens (rank-dependent)
  ulysses::Path path = ulysses::Path::automatic;  ///< PlanOptions::path: the transport
  ulysses::NodeLayout nodes{};  ///< PlanOptions::nodes (the two-level exchange when it spans nodes)
  int lanes = 1;                ///< PlanOptions::lanes
};

/// A LocalGroup rank's communicator that does not say its ranks share one address space: the
/// peer copy then pulls seq→head (each rank reads its heads from every peer's input), as it does
/// across processes, where in-process it pushes. The tests run both forms of Path::direct.
struct PullingComm : ulysses::LocalGroup::Comm {
  static constexpr bool one_address_space = false;
  explicit PullingComm(const ulysses::LocalGroup::Comm& c) : ulysses::LocalGroup::Comm(c) {}
};

/// Runs f(comm) on rank `comm`'s communicator, or on a PullingComm of it when `pull`.
template <class F>
auto with_direct_form(ulysses::LocalGroup::Comm& comm, bool pull, F&& f) {
  if (!pull) return f(comm);
  PullingComm pc(comm);
  return f(pc);
}

/// The transports a communicator type can run with the host executor (the transport axis of the
/// shared cases: every case must give the same bytes on each).
template <class Comm>
std::vector<ulysses::Path> host_paths() {
  using S = ulysses::PathSupport<Comm, ulysses::HostExecutor>;
  std::vector<ulysses::Path> v{ulysses::Path::alltoallv};
  if (S::messages) v.push_back(ulysses::Path::messages);
  if (S::direct) v.push_back(ulysses::Path::direct);
  return v;
}

/// The spec of tensor `tc` of case c with element type T: summable types (float, double) sum
/// their replicated heads in head→seq as the case says (Replicas::sum, the default), opaque ones
/// take the owner's copy (Replicas::owner: they cannot be summed).
template <class T>
ulysses::TensorSpec spec_of(const Case& c, const TensorCase& tc) {
  auto s = ulysses::TensorSpec::of<T>(tc.heads, tc.D);
  s.with_replicas(ulysses::summable(s.type) ? c.replicas : ulysses::Replicas::owner);
  return s;
}

/// A strided view of extents [B, S, H, D]: rows of D elements padded to D + 1 + r % 2, tokens
/// padded by one row's worth more, batches by 3 elements; memory order b, s, h, d (r: the rank,
/// so that ranks hold different views of the same wire).
inline ulysses::Layout padded_view(std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D, int r) {
  const std::int64_t row = D + 1 + r % 2, tok = (H + 1) * row, bat = S * tok + 3;
  return ulysses::Layout::strided({B, S, H, D}, {bat, tok, row, 1});
}

/// The plan of case c on rank r with element type T.
template <class T>
ulysses::Plan plan_of(const Case& c, int r) {
  std::vector<ulysses::TensorSpec> specs;
  for (auto& t : c.tensors) {
    specs.push_back(spec_of<T>(c, t));
    if (c.padded) {
      specs.back().with_seq_layout(padded_view(c.B, c.seq.local_length(r), t.heads.num_heads(), t.D, r));
      specs.back().with_head_layout(padded_view(c.B, c.seq.seq_len(), t.heads.count(r), t.D, r + 1));
    }
  }
  return ulysses::Plan({c.P, r}, c.B, c.seq, specs, c.format, ulysses::PlanOptions{c.stages, c.in_place_messages, c.path, c.nodes, c.lanes});
}

/// What head→seq(seq→head(x)) gives element x of head h of tensor t: x itself, or, when the plan
/// sums the head's replicas, the sum of its copies over the holders in float arithmetic of T
/// (x + x + ... in order; exact for the integer codes the cases use while they fit).
template <class T>
T round_trip_value(const ulysses::Plan& plan, int t, std::int64_t h, T x) {
  if constexpr (std::is_arithmetic_v<T>) {
    if (!plan.sums_replicas(t)) return x;
    const auto [f, l] = plan.tensor(t).heads.holders(h);
    T acc = x;
    for (int j = f + 1; j < l; ++j) acc = static_cast<T>(acc + x);
    return acc;
  } else {
    (void)plan, (void)t, (void)h;
    return x;
  }
}

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

/// The global token of every local token of rank r (in the seq-sharded layout's order).
inline std::vector<std::int64_t> global_tokens(const SeqPartition& seq, int r) {
  std::vector<std::int64_t> g;
  for (const auto& c : seq.chunks_of(r))
    for (std::int64_t i = 0; i < c.length; ++i) g.push_back(c.offset + i);
  return g;
}

/// Runs `c` on rank `comm.rank()` with element type T: seq→head into fresh buffers, checked against
/// the global tensor, then head→seq of that output, checked against the original shard; also
/// checks that no byte outside an output's layout was written. Element values come from
/// gen(position code) (default: value<T>). The tensors are std::vector<T, Alloc> (e.g. an
/// allocator of registered memory), seq→head's outputs (head→seq's inputs) and head→seq's
/// outputs std::vector<T, OutAlloc>. Returns "" or what went wrong.
template <class T, class Comm, class Exec = ulysses::HostExecutor, class Alloc = std::allocator<T>, class OutAlloc = Alloc>
std::string run_case(Comm& comm, const Case& c, Exec exec = Exec{}, T (*gen)(std::uint64_t) = &value<T>) {
  using namespace ulysses;
  const int r = comm.rank();
  const std::int64_t S = c.seq.seq_len();
  const Plan plan = plan_of<T>(c, r);
  const int NT = plan.num_tensors();
  const std::vector<std::int64_t> tok = global_tokens(c.seq, r);
  std::vector<std::vector<T, Alloc>> in(NT);
  std::vector<std::vector<T, OutAlloc>> mid(NT), back(NT);
  for (int t = 0; t < NT; ++t) {
    const Layout& sl = plan.seq_layout(t);
    const std::int64_t H = c.tensors[t].heads.num_heads(), D = c.tensors[t].D;
    in[t].assign(static_cast<std::size_t>(sl.span_elems()), sentinel<T>());
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t ls = 0; ls < sl.extent[1]; ++ls)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d)
            in[t][static_cast<std::size_t>(sl.offset(b, ls, h, d))] =
                gen(position(t, b, tok[static_cast<std::size_t>(ls)], h, d, S, H, D, c.B));
    mid[t].assign(static_cast<std::size_t>(plan.head_layout(t).span_elems()), sentinel<T>());
    back[t].assign(in[t].size(), sentinel<T>());
  }
  std::vector<std::byte> ws(plan.workspace_bytes());
  TensorList<ConstByteSpan> ip, mp_c;
  TensorList<ByteSpan> mp, bp;
  for (int t = 0; t < NT; ++t) {
    ip.push_back(in[t]);
    mp.push_back(mid[t]);
    mp_c.push_back(mid[t]);
    bp.push_back(back[t]);
  }
  std::ostringstream err;
  auto fail = [&](const std::string& what) {
    if (err.tellp() == 0) err << c.name << " rank " << r << ": " << what;
  };
  HostPipeline pipe;
  Exec exec2 = exec;  // the pipeline's unpacker runs its own executor
  auto move = [&](Direction dir, const TensorList<ConstByteSpan>& src, const TensorList<ByteSpan>& dst) {
    if (c.pipelined)
      pipe.redistribute(plan, dir, comm, exec, exec2, src, dst, ws);
    else
      redistribute(plan, dir, comm, exec, src, dst, ws);
  };
  move(Direction::seq_to_head, ip, mp);
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
  move(Direction::head_to_seq, mp_c, bp);
  for (int t = 0; t < NT; ++t) {
    const Layout& sl = plan.seq_layout(t);
    std::vector<T, Alloc> want = in[t];  // the sentinel outside the layout, the input (or its replicas' sum) inside
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t ls = 0; ls < sl.extent[1]; ++ls)
        for (std::int64_t h = 0; h < sl.extent[2]; ++h)
          for (std::int64_t d = 0; d < sl.extent[3]; ++d) {
            const auto o = static_cast<std::size_t>(sl.offset(b, ls, h, d));
            want[o] = round_trip_value<T>(plan, t, h, in[t][o]);
          }
    if (!want.empty() && std::memcmp(want.data(), back[t].data(), want.size() * sizeof(T)) != 0)
      fail(std::string("head_to_seq(seq_to_head(x)) != ") + (plan.sums_replicas(t) ? "the sum of x's replicas" : "x") +
           " for tensor " + std::to_string(t));
  }
  return err.str();
}

/// Arithmetic adapter of an element type for the adjoint checks: float and double are
/// themselves; bf16v is a bfloat16 stored as bits (ElementType::bfloat16, declared below).
struct bf16v {
  std::uint16_t bits;
};
}  // namespace ut
template <>
struct ulysses::element_type_of<ut::bf16v> {
  static constexpr ulysses::ElementType value = ulysses::ElementType::bfloat16;
};
namespace ut {
template <class T>
float to_float(T x) {
  if constexpr (std::is_same_v<T, bf16v>) return ulysses::detail::bfloat16_to_float(x.bits);
  else return static_cast<float>(x);
}
template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, bf16v>) return bf16v{ulysses::detail::float_to_bfloat16(x)};
  else return static_cast<T>(x);
}

/// A small integer in [-8, 8] for element (t, b, s, h, d) of the seq-sharded x (`rank` = -1) or
/// of rank `rank`'s head-sharded y: exact in every summable type, and so are sums of up to 32 of
/// them and the products of the inner products (in int64).
inline int small_value(int rank, int t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  std::uint64_t x = ((((static_cast<std::uint64_t>(rank + 1) * 131 + t) * 977 + b) * 613 + s) * 397 + h) * 31 + d;
  x ^= x >> 29, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 32;
  return static_cast<int>(x % 17) - 8;
}

/// One rank's share of an adjointness check: "" or what went wrong, and this rank's terms of the
/// inner products <seq_to_head(x), y> (over its head-sharded outputs) and <x, seq_to_head_backward(y)>
/// (over its seq-sharded outputs). Summed over the ranks they must be equal.
struct AdjointShare {
  std::string error;
  std::int64_t forward = 0, backward = 0;
};

/// Checks on rank comm.rank() that the backward of seq→head is its adjoint for case c with element
/// type T (float, double or bf16v; the plan sums replicated heads): seq→head of x equals the
/// global slice exactly; seq_to_head_backward of the rank-dependent y equals, element by element,
/// the sum over the head's holders in ascending rank order; and the rank's inner-product terms.
template <class T, class Comm>
AdjointShare run_adjoint_case(Comm& comm, const Case& c) {
  using namespace ulysses;
  const int r = comm.rank();
  std::vector<TensorSpec> specs;
  const Plan base = plan_of<float>(c, r);  // layouts and partitions; then the element type T
  for (int t = 0; t < base.num_tensors(); ++t) {
    TensorSpec x = base.tensor(t);
    x.elem_bytes = sizeof(T);
    x.type = element_type_of_v<T>;
    x.replicas = Replicas::sum;
    specs.push_back(x);
  }
  const Plan plan({c.P, r}, c.B, c.seq, specs, c.format, PlanOptions{c.stages, c.in_place_messages, c.path, c.nodes, c.lanes});
  const int NT = plan.num_tensors();
  const std::int64_t S = c.seq.seq_len();
  const std::vector<std::int64_t> tok = global_tokens(c.seq, r);
  AdjointShare out;
  auto fail = [&](const std::string& what) {
    if (out.error.empty()) out.error = c.name + " rank " + std::to_string(r) + ": " + what;
  };
  std::vector<std::vector<T>> x(NT), z(NT), y(NT), w(NT);
  TensorList<ConstByteSpan> xs, ys;
  TensorList<ByteSpan> zs, ws_;
  for (int t = 0; t < NT; ++t) {
    const Layout &sl = plan.seq_layout(t), &hl = plan.head_layout(t);
    const std::int64_t h0 = plan.tensor(t).heads.begin(r);
    x[t].assign(static_cast<std::size_t>(sl.span_elems()), from_float<T>(99));
    w[t] = x[t];
    y[t].assign(static_cast<std::size_t>(hl.span_elems()), from_float<T>(99));
    z[t] = y[t];
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t ls = 0; ls < sl.extent[1]; ++ls)
        for (std::int64_t h = 0; h < sl.extent[2]; ++h)
          for (std::int64_t d = 0; d < sl.extent[3]; ++d)
            x[t][static_cast<std::size_t>(sl.offset(b, ls, h, d))] =
                from_float<T>(static_cast<float>(small_value(-1, t, b, tok[static_cast<std::size_t>(ls)], h, d)));
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < hl.extent[2]; ++h)
          for (std::int64_t d = 0; d < hl.extent[3]; ++d)
            y[t][static_cast<std::size_t>(hl.offset(b, s, h, d))] = from_float<T>(static_cast<float>(small_value(r, t, b, s, h0 + h, d)));
    xs.push_back(x[t]), zs.push_back(z[t]), ys.push_back(y[t]), ws_.push_back(w[t]);
  }
  std::vector<std::byte> ws(plan.workspace_bytes());
  HostExecutor ex;
  seq_to_head(plan, comm, ex, xs, zs, ws);
  seq_to_head_backward(plan, comm, ex, ys, ws_, ws);
  for (int t = 0; t < NT; ++t) {
    const Layout &sl = plan.seq_layout(t), &hl = plan.head_layout(t);
    const HeadPartition& hp = plan.tensor(t).heads;
    const std::int64_t h0 = hp.begin(r);
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < hl.extent[2]; ++h)
          for (std::int64_t d = 0; d < hl.extent[3]; ++d) {
            const auto o = static_cast<std::size_t>(hl.offset(b, s, h, d));
            const float got = to_float(z[t][o]);
            if (got != static_cast<float>(small_value(-1, t, b, s, h0 + h, d))) fail("seq_to_head wrong, tensor " + std::to_string(t));
            out.forward += static_cast<std::int64_t>(got) * static_cast<std::int64_t>(to_float(y[t][o]));
          }
    std::vector<std::pair<int, int>> holders;  // of every head
    for (std::int64_t h = 0; h < sl.extent[2]; ++h) holders.push_back(hp.holders(h));
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t ls = 0; ls < sl.extent[1]; ++ls)
        for (std::int64_t h = 0; h < sl.extent[2]; ++h)
          for (std::int64_t d = 0; d < sl.extent[3]; ++d) {
            const std::int64_t s = tok[static_cast<std::size_t>(ls)];
            const auto [f, l] = holders[static_cast<std::size_t>(h)];
            float want = 0;
            for (int q = f; q < l; ++q) want = q == f ? static_cast<float>(small_value(q, t, b, s, h, d)) : want + static_cast<float>(small_value(q, t, b, s, h, d));
            const auto o = static_cast<std::size_t>(sl.offset(b, ls, h, d));
            const float got = to_float(w[t][o]);
            if (got != want)
              fail("seq_to_head_backward tensor " + std::to_string(t) + " at (b=" + std::to_string(b) + ",s=" + std::to_string(s) +
                   ",h=" + std::to_string(h) + ",d=" + std::to_string(d) + "): " + std::to_string(got) + ", want the sum over ranks [" +
                   std::to_string(f) + "," + std::to_string(l) + ") = " + std::to_string(want));
            out.backward += static_cast<std::int64_t>(to_float(x[t][o])) * static_cast<std::int64_t>(got);
          }
    // Nothing outside the layouts was written (the views' gaps keep their 99s).
    std::vector<char> inside(w[t].size(), 0), inside_z(z[t].size(), 0);
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t ls = 0; ls < sl.extent[1]; ++ls)
        for (std::int64_t h = 0; h < sl.extent[2]; ++h)
          for (std::int64_t d = 0; d < sl.extent[3]; ++d) inside[static_cast<std::size_t>(sl.offset(b, ls, h, d))] = 1;
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < hl.extent[2]; ++h)
          for (std::int64_t d = 0; d < hl.extent[3]; ++d) inside_z[static_cast<std::size_t>(hl.offset(b, s, h, d))] = 1;
    for (std::size_t i = 0; i < w[t].size(); ++i)
      if (!inside[i] && to_float(w[t][i]) != 99.f) fail("seq_to_head_backward wrote outside the layout");
    for (std::size_t i = 0; i < z[t].size(); ++i)
      if (!inside_z[i] && to_float(z[t][i]) != 99.f) fail("seq_to_head wrote outside the layout");
  }
  return out;
}

/// The adjointness sweep's sequence partitions of S tokens over P ranks: even (S % P == 0 is
/// arranged by the caller), balanced, zigzag, and explicit chunks (2P+1 chunks of uneven lengths,
/// dealt to ranks out of order, some ranks holding several).
inline std::vector<std::pair<std::string, SeqPartition>> sweep_partitions(int P) {
  std::vector<std::pair<std::string, SeqPartition>> v;
  v.emplace_back("even", SeqPartition::even(P, P));
  v.emplace_back("balanced", SeqPartition::balanced(P + P / 2 + 1, P));
  v.emplace_back("zigzag", SeqPartition::zigzag(2 * P + 1, P));
  std::vector<ulysses::SeqChunk> chunks;
  std::int64_t off = 0;
  for (int i = 0; i < P + 1; ++i) {
    const std::int64_t len = (i * 5) % 3;  // 0, 2, 1, 0, 2, 1, ...: empty chunks too
    chunks.push_back({(i * 7 + 3) % P, off, len, 0});
    off += len;
  }
  v.emplace_back("chunks", SeqPartition::chunks(off, P, chunks));
  return v;
}

}  // namespace ut
