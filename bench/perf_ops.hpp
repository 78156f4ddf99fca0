// SPDX-License-Identifier: Apache-2.0
// ulysses_perf's --op decode and --op ring (the user calls bench_decode*.cpp and bench_ring*.cpp
// used to time): one class per op, written against today's decode and ring API in small,
// isolated members (the library call is run() in each), so an API change touches one function.
// Each: input_bytes() (the bytes column), fill() (the oracle's inputs), run() (the library call),
// bare() (the bare transport of the same bytes on the same communicator), wrong() (-c 1).
#pragma once

#include <ulysses/ulysses.hpp>
#include <ulysses/tune/ring_cost.hpp>
#if ULYSSES_PERF_MPI
#include <ulysses/comm/mpi.hpp>
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "group.hpp"
#include "host_buffer.hpp"

namespace perf_ops {

using namespace ulysses;
using Bytes = std::vector<std::byte, ub::HugePageAllocator<std::byte>>;

/// A whole number in [-range, range] from a position (the oracle's values: exact in every type).
inline double small_value(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t range) {
  std::uint64_t x = ((a * 1000003u + b) * 4099u + c) * 0x9e3779b97f4a7c15ull;
  x ^= x >> 31;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<double>(static_cast<std::int64_t>(x % (2 * range + 1)) - static_cast<std::int64_t>(range));
}

/// Stores v as one element of `type` at p (v exact in the type).
inline void store(ElementType type, double v, std::byte* p) {
  detail::with_sum_arith(type, [&](auto a) {
    using A = decltype(a);
    A::store(p, static_cast<typename A::Acc>(v));
  });
}

/// --op decode: one decode step (T = 1) of B sequences: every rank holds the partial output O_r
/// [B, 1, H, Dv] and LSE_r [B, 1, H] over its KV shard; decode_exchange() leaves it the merged
/// output of its heads [B, 1, H_r, Dv]. Oracle: the library's merge (merge_rows_batch(), ranks in
/// ascending order) of the partials every rank's generator gives, compared bit for bit.
class DecodeOp {
 public:
  DecodeOp(int P, int r, std::int64_t B, std::int64_t H, std::int64_t Dv, ElementType type, HeadPolicy policy)
      : P_(P), r_(r), type_(type),
        plan_(DecodeSpec(B, 1, policy == HeadPolicy::even ? HeadPartition::even(H, P) : HeadPartition::balanced(H, P), Dv)
                  .with_types(type, type),
              r),
        o_(static_cast<std::size_t>(B * H * Dv) * size_of(type)), lse_(static_cast<std::size_t>(B * H) * sizeof(float)),
        out_(plan_.out_span_bytes()), ws_(plan_.workspace_bytes() + 16), bare_(P, o_.size() + lse_.size()) {}

  std::size_t input_bytes() const { return o_.size() + lse_.size(); }  ///< O_r and LSE_r
  /// Writes O_r and LSE_r from the generator (rank r's values).
  void fill() { generate(r_, o_.data(), reinterpret_cast<float*>(lse_.data()), 0, plan_.num_heads()); }
  /// The library call: one decode_exchange() on the default path.
  template <class Comm>
  void run(Comm& comm) {
    decode_exchange(plan_, comm, HostDecodeExecutor{}, DecodeBuffers().partial(o_).lse(lse_).out(out_).workspace(ws_));
  }
  /// The bare all-to-all-v of O_r's and LSE_r's bytes.
  template <class Comm>
  void bare(Comm& comm) { bare_.run(comm); }
  /// Elements of the merged output that differ from the oracle's.
  long long wrong() const;

 private:
  /// Rank p's O and LSE of heads [h0, h0 + n) into o ([B, n, Dv]) and lse ([B, n]).
  void generate(int p, std::byte* o, float* lse, std::int64_t h0, std::int64_t n) const {
    const std::int64_t B = plan_.batch(), Dv = plan_.head_dim_v(), e = static_cast<std::int64_t>(size_of(type_));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t h = h0 + j, row = b * n + j;
        lse[row] = static_cast<float>(small_value(static_cast<std::uint64_t>(p), static_cast<std::uint64_t>(b), static_cast<std::uint64_t>(h), 32) / 8);
        for (std::int64_t d = 0; d < Dv; ++d)
          store(type_, small_value(static_cast<std::uint64_t>(p + 1) << 20 | static_cast<std::uint64_t>(d), static_cast<std::uint64_t>(b),
                                   static_cast<std::uint64_t>(h), 64) / 64,
                o + (row * Dv + d) * e);
      }
  }
  int P_, r_;
  ElementType type_;
  DecodePlan plan_;
  Bytes o_, lse_, out_, ws_;
  ulysses_group::BareAlltoall<Bytes> bare_;
};

inline long long DecodeOp::wrong() const {
  const std::int64_t B = plan_.batch(), Dv = plan_.head_dim_v(), Hr = plan_.local_heads(), rows = B * Hr;
  const std::size_t e = size_of(type_), row_bytes = static_cast<std::size_t>(Dv) * e;
  std::vector<std::byte> o(static_cast<std::size_t>(P_ * rows) * row_bytes), want(static_cast<std::size_t>(rows) * row_bytes);
  std::vector<float> lse(static_cast<std::size_t>(P_ * rows));
  for (int p = 0; p < P_; ++p)
    generate(p, o.data() + static_cast<std::size_t>(p * rows) * row_bytes, lse.data() + p * rows, plan_.head_begin(), Hr);
  std::vector<const void*> src(static_cast<std::size_t>(P_));
  std::vector<float> l(static_cast<std::size_t>(P_));
  for (std::int64_t k = 0; k < rows; ++k) {  // row by row: contributions in ascending rank order
    for (int p = 0; p < P_; ++p) {
      src[static_cast<std::size_t>(p)] = o.data() + static_cast<std::size_t>(p * rows + k) * row_bytes;
      l[static_cast<std::size_t>(p)] = lse[static_cast<std::size_t>(p * rows + k)];
    }
    void* dst = want.data() + static_cast<std::size_t>(k) * row_bytes;
    merge_rows_batch(1, P_, src.data(), l.data(), type_, Dv, &dst, type_, nullptr);
  }
  long long wrong = 0;
  for (std::size_t i = 0; i < want.size(); i += e) wrong += std::memcmp(want.data() + i, out_.data() + i, e) != 0;
  return wrong;
}

/// --op ring: one RingRotation rotation of the k|v blocks (R = the group's size, each rank's block
/// as the ring cost model counts it: ring_block_bytes() of the zigzag partition of S over U × R,
/// U = --ring-u), R − 1 transfers of one message each way. Oracle: after step s the buffer of
/// step s + 1 holds ring rank source(s + 1)'s block, byte for byte (#wrong counts bytes).
template <class Comm>
class RingOp {
 public:
  RingOp(Comm& comm, std::int64_t S, int U, const AttentionShape& shape, ElementType type, std::int64_t batch) : comm_(comm) {
    const RingPartition part(S, U, comm.size(), RingLayout::zigzag);
    for (int j = 0; j < comm.size(); ++j) blocks_.push_back(static_cast<std::size_t>(ring_block_bytes(part, j, shape, type, batch)));
    std::size_t largest = 0;
    for (std::size_t b : blocks_) largest = std::max(largest, b);
    b0_.assign(largest, std::byte{0x11});
    b1_.assign(largest, std::byte{0x22});
    rot_ = std::make_unique<RingRotation<Comm>>(comm, blocks_, RingBuffers().kv(b0_.data(), largest, b1_.data(), largest));
  }
  /// Bytes a rank sends in a rotation (R − 1 blocks).
  std::size_t input_bytes() const {
    std::size_t n = 0;
    for (int s = 0; s + 1 < rot_->steps(); ++s) n += rot_->block_bytes(s);
    return n;
  }
  /// Writes this rank's own block into buffer 0 (where start(0) expects it).
  void fill() {
    for (std::size_t i = 0; i < blocks_[static_cast<std::size_t>(comm_.rank())]; ++i) b0_[i] = pattern(comm_.rank(), i);
  }
  /// The library call: one whole rotation (R steps of start() and finish()).
  void run(Comm&) {
    for (int s = 0; s < rot_->steps(); ++s) rot_->start(s), rot_->finish(s);
  }
  /// The bare transport of the same bytes: R − 1 times one message to r + 1 and one from r − 1.
  void bare(Comm& comm) {
    const int R = rot_->steps(), r = comm.rank();
    for (int s = 0; s + 1 < R; ++s) {
      const Message send{(r + 1) % R, (s % 2 ? b1_ : b0_).data(), rot_->block_bytes(s)};
      const Message recv{(r + R - 1) % R, (s % 2 ? b0_ : b1_).data(), rot_->block_bytes(s + 1)};
      bare_step(comm, send, recv);
    }
  }
  /// Bytes of the rotation's blocks that differ from their owners' (one checked rotation after fill()).
  long long wrong() {
    long long wrong = 0;
    for (int s = 0; s < rot_->steps(); ++s) {
      rot_->start(s);
      rot_->finish(s);
      if (s + 1 == rot_->steps()) break;
      const std::byte* got = rot_->block(s + 1);
      for (std::size_t i = 0; i < rot_->block_bytes(s + 1); ++i) wrong += got[i] != pattern(rot_->source(s + 1), i);
    }
    return wrong;
  }

 private:
  static std::byte pattern(int owner, std::size_t i) { return static_cast<std::byte>((static_cast<unsigned>(owner) * 131u + i * 7u + (i >> 8)) & 0xffu); }
  template <class C>
  static void bare_step(C& comm, const Message& send, const Message& recv) { comm.exchange_messages(&send, 1, &recv, 1); }
#if ULYSSES_PERF_MPI
  static void bare_step(MpiComm& comm, const Message& send, const Message& recv) {  // as bench_ring_mpi: MPI_Sendrecv
    MPI_Sendrecv(send.data, static_cast<int>(send.bytes), MPI_BYTE, send.peer, 0, recv.data, static_cast<int>(recv.bytes), MPI_BYTE,
                 recv.peer, 0, comm.get(), MPI_STATUS_IGNORE);
  }
#endif
  Comm& comm_;
  std::vector<std::size_t> blocks_;
  Bytes b0_, b1_;
  std::unique_ptr<RingRotation<Comm>> rot_;
};

}  // namespace perf_ops
