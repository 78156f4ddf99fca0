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
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
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

/// The transports --op ring sets a rotation against (RingOp::baseline()), each moving the same
/// blocks along the same ring (to ring rank r + 1, from r − 1) on the same communicator (under
/// MpiWindowComm: on the MpiComm it wraps), R − 1 steps, each step complete before the next.
enum class RingBaseline : int {
  sendrecv = 0,   ///< one message each way a step: MPI_Sendrecv under MPI, exchange_messages() of one message in process
  split = 1,      ///< plain MPI's k-message pattern a step: MPI_Irecv ×k, then MPI_Isend ×k, then MPI_Waitall (the
                  ///< block cut as the rotation cuts it, ring_piece_begin()); in process exchange_messages() of k pieces
  rfa = 2,        ///< ring-flash-attention's RingComm.send_recv_kv (github zhuzilin/ring-flash-attention): k and v two
                  ///< tensors, each isend to r + 1 and irecv from r − 1 (batch_isend_irecv: isend k, irecv k, isend v,
                  ///< irecv v), then wait; two pairs of k, v receive buffers alternate (in process: exchange_messages() of
                  ///< the two)
  rfa_fresh = 3,  ///< the same "as written" (torch.empty_like every step): fresh receive buffers, malloc'd and
                  ///< untouched, every step, each freed after the step that sends it on
  sendrecv_own = 4,  ///< sendrecv between the rotation's own two buffers (for --backend window: the window's
                     ///< memory, as the rotation reads it; the op's buffers are huge-page private memory)
  sendrecv_small = 5,  ///< sendrecv between two private buffers of small pages (std::vector, no madvise): what
                       ///< the page size costs this MPI's single copy
};

/// The k of RingBaseline::split that --op ring times (it reports the fastest).
inline constexpr int kRingSplits[] = {1, 2, 4, 8};

#if ULYSSES_PERF_MPI
/// The MPI communicator a ring communicator's baselines run on (MpiWindowComm: the wrapped MpiComm's).
inline MPI_Comm mpi_handle(MpiComm& c) { return c.get(); }
inline MPI_Comm mpi_handle(MpiWindowComm& c) { return c.mpi().get(); }  ///< @copydoc mpi_handle(MpiComm&)
/// Whether Comm's baselines are plain MPI calls (else exchange_messages()).
template <class Comm>
inline constexpr bool over_mpi_v = std::is_same_v<Comm, MpiComm> || std::is_same_v<Comm, MpiWindowComm>;
#else
template <class Comm>
inline constexpr bool over_mpi_v = false;
#endif

/// --op ring: one RingRotation rotation of the k|v blocks (R = the group's size, each rank's block
/// as the ring cost model counts it: ring_block_bytes() of the zigzag partition of S over U × R,
/// U = --ring-u), R − 1 transfers, each block cut into `messages` pieces on a message transport
/// (--ring-messages); and the baselines (RingBaseline) of the same blocks. k is the first
/// D / (D + Dv) of a block, v the rest (halves when D = Dv). Oracle: after step s the buffer of
/// step s + 1 holds ring rank source(s + 1)'s block, byte for byte (#wrong counts bytes); the
/// baselines are checked alike (baselines_wrong()).
template <class Comm>
class RingOp {
 public:
  /// Ring rank j's block at index j (R = `R`): ring_block_bytes() of the zigzag partition.
  static std::vector<std::size_t> blocks(int R, std::int64_t S, int U, const AttentionShape& shape, ElementType type, std::int64_t batch) {
    const RingPartition part(S, U, R, RingLayout::zigzag);
    std::vector<std::size_t> b;
    for (int j = 0; j < R; ++j) b.push_back(static_cast<std::size_t>(ring_block_bytes(part, j, shape, type, batch)));
    return b;
  }
  /// The largest of blocks().
  static std::size_t largest(const std::vector<std::size_t>& blocks) {
    std::size_t n = 0;
    for (std::size_t b : blocks) n = std::max(n, b);
    return n;
  }
  /// @param comm         the ring communicator (R = comm.size())
  /// @param messages     the rotation's pieces a block (RingRotation's `messages`, 1 .. kMaxRingMessages)
  /// @param rot0, rot1   the rotation's two buffers (at least largest(blocks()) bytes each, e.g. from an
  ///                     MpiWindow, so that a rotation over MpiWindowComm reads in place), or both null:
  ///                     the op's own (those the sendrecv and split baselines use). The baselines always
  ///                     run on the op's own buffers.
  /// @param access       the rotation's RingAccess; zero_copy reads each step's block in its owner's
  ///                     buffer 0 (rot0, or the op's own in process), so that no block moves
  RingOp(Comm& comm, std::int64_t S, int U, const AttentionShape& shape, ElementType type, std::int64_t batch, int messages = 1,
         std::byte* rot0 = nullptr, std::byte* rot1 = nullptr, RingAccess access = RingAccess::copy)
      : comm_(comm), blocks_(blocks(comm.size(), S, U, shape, type, batch)), R_(comm.size()), r_(comm.rank()) {
    const std::size_t D = static_cast<std::size_t>(shape.head_dim), Dv = static_cast<std::size_t>(shape.v_head_dim ? shape.v_head_dim : shape.head_dim);
    std::size_t big = largest(blocks_), big_k = 0;
    for (std::size_t b : blocks_) k_.push_back(b / (D + Dv) * D), big_k = std::max(big_k, k_.back());  // (b is a multiple of D + Dv)
    b0_.assign(big, std::byte{0x11});
    b1_.assign(big, std::byte{0x22});
    for (auto& pair : kv_) pair[0].assign(big_k, std::byte{0x33}), pair[1].assign(big - big_k, std::byte{0x44});  // (the largest v: big − big_k)
    rot_[0] = rot0 ? rot0 : b0_.data();
    rot_[1] = rot1 ? rot1 : b1_.data();
    if (rot0) std::memset(rot0, 0x55, big), std::memset(rot1, 0x66, big);  // every page mapped before timing
    rot_obj_ = std::make_unique<RingRotation<Comm>>(comm, blocks_, RingBuffers().kv(rot_[0], big, rot_[1], big), RingProgress::automatic, messages,
                                                      access);
  }
  /// Bytes a rank sends in a rotation (R − 1 blocks).
  std::size_t input_bytes() const {
    std::size_t n = 0;
    for (int s = 0; s + 1 < R_; ++s) n += bytes(s);
    return n;
  }
  /// Writes this rank's own block where the rotation's start(0) expects it (its buffer 0) and
  /// where each baseline starts (the op's buffer 0; k and v into the first pair).
  void fill() {
    const std::size_t n = blocks_[static_cast<std::size_t>(r_)], k = k_[static_cast<std::size_t>(r_)];
    for (std::size_t i = 0; i < n; ++i) rot_[0][i] = b0_[i] = pattern(r_, i);
    for (std::size_t i = 0; i < k; ++i) kv_[0][0][i] = pattern(r_, i);
    for (std::size_t i = k; i < n; ++i) kv_[0][1][i - k] = pattern(r_, i);
  }
  /// The library call: one whole rotation (R steps of start() and finish()).
  void run() {
    for (int s = 0; s < R_; ++s) rot_obj_->start(s), rot_obj_->finish(s);
  }
  /// One rotation of baseline `b` (k: the split's pieces); with `wrong`, adds to it the bytes of
  /// each step's received block that differ from its owner's (after fill()).
  void baseline(RingBaseline b, int k = 1, long long* wrong = nullptr) {
    if (b == RingBaseline::rfa || b == RingBaseline::rfa_fresh) return rfa(b == RingBaseline::rfa_fresh, wrong);
    const bool own = b == RingBaseline::sendrecv_own, small = b == RingBaseline::sendrecv_small;
    if (small && small_[1].empty()) small_[0] = b0_small(), small_[1] = std::vector<std::byte>(b0_.size(), std::byte{0x77});
    for (int s = 0; s + 1 < R_; ++s) {
      std::byte* send = own ? rot_[s % 2] : small ? small_[s % 2].data() : (s % 2 ? b1_ : b0_).data();
      std::byte* recv = own ? rot_[(s + 1) % 2] : small ? small_[(s + 1) % 2].data() : (s % 2 ? b0_ : b1_).data();
      if (b == RingBaseline::sendrecv || own || small) sendrecv(send, bytes(s), recv, bytes(s + 1));
      else split(send, bytes(s), recv, bytes(s + 1), k);
      if (wrong) *wrong += differ(recv, bytes(s + 1), source(s + 1), 0);
    }
  }
  /// Bytes of the rotation's blocks that differ from their owners' (one checked rotation after fill()).
  long long wrong() {
    long long wrong = 0;
    for (int s = 0; s < R_; ++s) {
      rot_obj_->start(s);
      rot_obj_->finish(s);
      if (s + 1 == R_) break;
      wrong += differ(rot_obj_->block(s + 1), rot_obj_->block_bytes(s + 1), rot_obj_->source(s + 1), 0);
    }
    return wrong;
  }
  /// Bytes every baseline (sendrecv, split of each kRingSplits, rfa, rfa_fresh) received wrong:
  /// each one checked rotation after its own fill(). Collective.
  long long baselines_wrong() {
    long long wrong = 0;
    fill(), baseline(RingBaseline::sendrecv, 1, &wrong);
    for (int k : kRingSplits) fill(), baseline(RingBaseline::split, k, &wrong);
    fill(), baseline(RingBaseline::rfa, 1, &wrong);
    fill(), baseline(RingBaseline::rfa_fresh, 1, &wrong);
    fill(), baseline(RingBaseline::sendrecv_own, 1, &wrong);
    fill(), small_[1].clear(), baseline(RingBaseline::sendrecv_small, 1, &wrong);  // (remade from this rank's block)
    return wrong;
  }

 private:
  static std::byte pattern(int owner, std::size_t i) { return static_cast<std::byte>((static_cast<unsigned>(owner) * 131u + i * 7u + (i >> 8)) & 0xffu); }
  /// Bytes of p[0, n) that differ from ring rank owner's block at [offset, offset + n).
  static long long differ(const std::byte* p, std::size_t n, int owner, std::size_t offset) {
    long long w = 0;
    for (std::size_t i = 0; i < n; ++i) w += p[i] != pattern(owner, offset + i);
    return w;
  }
  int source(int s) const { return ((r_ - s) % R_ + R_) % R_; }            ///< whose block step s holds
  std::size_t bytes(int s) const { return blocks_[static_cast<std::size_t>(source(s))]; }  ///< step s's block
  int next() const { return (r_ + 1) % R_; }
  int prev() const { return (r_ + R_ - 1) % R_; }

  /// One message each way.
  void sendrecv(std::byte* send, std::size_t sb, std::byte* recv, std::size_t rb) {
#if ULYSSES_PERF_MPI
    if constexpr (over_mpi_v<Comm>) {  // as bench_ring_mpi: MPI_Sendrecv
      MPI_Sendrecv(send, static_cast<int>(sb), MPI_BYTE, next(), 0, recv, static_cast<int>(rb), MPI_BYTE, prev(), 0, mpi_handle(comm_),
                   MPI_STATUS_IGNORE);
      return;
    }
#endif
    const Message s{next(), send, sb}, r{prev(), recv, rb};
    comm_.exchange_messages(&s, 1, &r, 1);
  }
  /// k pieces each way (ring_piece_begin()'s cut): MPI_Irecv ×k, MPI_Isend ×k, MPI_Waitall.
  void split(std::byte* send, std::size_t sb, std::byte* recv, std::size_t rb, int k) {
    Message s[8], r[8];
    for (int i = 0; i < k; ++i) {
      const std::size_t a = ring_piece_begin(sb, k, i), b = ring_piece_begin(sb, k, i + 1);
      const std::size_t c = ring_piece_begin(rb, k, i), d = ring_piece_begin(rb, k, i + 1);
      s[i] = Message{next(), send + a, b - a};
      r[i] = Message{prev(), recv + c, d - c};
    }
#if ULYSSES_PERF_MPI
    if constexpr (over_mpi_v<Comm>) {
      MPI_Request q[16];
      for (int i = 0; i < k; ++i) MPI_Irecv(r[i].data, static_cast<int>(r[i].bytes), MPI_BYTE, r[i].peer, i, mpi_handle(comm_), &q[i]);
      for (int i = 0; i < k; ++i) MPI_Isend(s[i].data, static_cast<int>(s[i].bytes), MPI_BYTE, s[i].peer, i, mpi_handle(comm_), &q[k + i]);
      MPI_Waitall(2 * k, q, MPI_STATUSES_IGNORE);
      return;
    }
#endif
    comm_.exchange_messages(s, static_cast<std::size_t>(k), r, static_cast<std::size_t>(k));
  }
  /// One step of RingComm.send_recv_kv: k and v to r + 1, nk and nv from r − 1 (isend k, irecv k,
  /// isend v, irecv v, then wait for all four; tag 0 as torch.distributed's, MPI's order matching k to k).
  void kv_step(std::byte* k, std::size_t kb, std::byte* v, std::size_t vb, std::byte* nk, std::size_t nkb, std::byte* nv, std::size_t nvb) {
#if ULYSSES_PERF_MPI
    if constexpr (over_mpi_v<Comm>) {
      MPI_Request q[4];
      MPI_Isend(k, static_cast<int>(kb), MPI_BYTE, next(), 0, mpi_handle(comm_), &q[0]);
      MPI_Irecv(nk, static_cast<int>(nkb), MPI_BYTE, prev(), 0, mpi_handle(comm_), &q[1]);
      MPI_Isend(v, static_cast<int>(vb), MPI_BYTE, next(), 0, mpi_handle(comm_), &q[2]);
      MPI_Irecv(nv, static_cast<int>(nvb), MPI_BYTE, prev(), 0, mpi_handle(comm_), &q[3]);
      MPI_Waitall(4, q, MPI_STATUSES_IGNORE);
      return;
    }
#endif
    const Message s[2] = {{next(), k, kb}, {next(), v, vb}}, r[2] = {{prev(), nk, nkb}, {prev(), nv, nvb}};
    comm_.exchange_messages(s, 2, r, 2);
  }
  /// RingBaseline::rfa (fresh = false) or rfa_fresh: R − 1 kv_step()s from the first pair.
  void rfa(bool fresh, long long* wrong) {
    struct Fresh {  // the malloc'd k and v a step received (freed after the next step sent them)
      std::byte* p[2] = {nullptr, nullptr};
      void reset(std::byte* k = nullptr, std::byte* v = nullptr) {
        std::free(p[0]), std::free(p[1]);
        p[0] = k, p[1] = v;
      }
      ~Fresh() { reset(); }
    } held;
    std::byte* k = kv_[0][0].data();
    std::byte* v = kv_[0][1].data();
    for (int s = 0; s + 1 < R_; ++s) {
      const std::size_t j = static_cast<std::size_t>(source(s)), i = static_cast<std::size_t>(source(s + 1));
      const std::size_t nkb = k_[i], nvb = blocks_[i] - k_[i];
      std::byte* nk = kv_[(s + 1) % 2][0].data();
      std::byte* nv = kv_[(s + 1) % 2][1].data();
      Fresh got;
      if (fresh) {
        got.p[0] = nk = static_cast<std::byte*>(std::malloc(std::max<std::size_t>(nkb, 1)));  // (not written: the receive maps its pages)
        got.p[1] = nv = static_cast<std::byte*>(std::malloc(std::max<std::size_t>(nvb, 1)));
        if (!nk || !nv) throw std::bad_alloc();
      }
      kv_step(k, k_[j], v, blocks_[j] - k_[j], nk, nkb, nv, nvb);
      if (wrong) *wrong += differ(nk, nkb, source(s + 1), 0) + differ(nv, nvb, source(s + 1), nkb);
      if (fresh) held.reset(got.p[0], got.p[1]), got.p[0] = got.p[1] = nullptr;  // the step's sent k, v freed
      k = nk, v = nv;
    }
  }

  Comm& comm_;
  std::vector<std::size_t> blocks_, k_;  // by ring rank: the block, its k part
  int R_, r_;
  /// The small-page buffer 0: a copy of b0_ (this rank's block after fill()).
  std::vector<std::byte> b0_small() const { return std::vector<std::byte>(b0_.begin(), b0_.end()); }
  Bytes b0_, b1_;
  std::vector<std::byte> small_[2];      // RingBaseline::sendrecv_small's buffers (made at its first use)                        // the baselines' (and by default the rotation's) double buffer
  Bytes kv_[2][2];                       // rfa's two pairs of k, v buffers
  std::byte* rot_[2];                    // the rotation's double buffer
  std::unique_ptr<RingRotation<Comm>> rot_obj_;
};

}  // namespace perf_ops
