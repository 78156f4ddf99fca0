// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The route of the two-level exchange (Path::two_level), built from a NodeLayout
///        (topology/nodes.hpp: which node each rank of a sequence-parallel group runs on).
///
/// Three rounds of point-to-point messages: gather to a node's forwarder for each other node,
/// one message per node pair (spread over PlanOptions::lanes), delivery by the receiver; the
/// sizes follow from the plan's global picture, so none are exchanged. The rounds, the lanes and
/// the copies: docs/multinode.md, "The two-level exchange"; docs/headers.md, "topology/route.hpp".
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../layout/blocks.hpp"
#include "../error.hpp"
#include "nodes.hpp"

ULYSSES_NAMESPACE_BEGIN

/// One point-to-point transfer of the two-level exchange, seen from one of its two ranks: `bytes`
/// contiguous bytes at `offset` of buffer `buffer` (BufferIndex::send or BufferIndex::recv: regions of the
/// workspace) go to (or come from) rank `peer`.
struct Hop {
  int peer = 0;
  std::int32_t buffer = 0;
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

namespace detail {

/// The two-level route of one exchange stage (see docs/headers.md, "topology/route.hpp"). `chunk[i * P + j]` is the
/// bytes rank i sends rank j in the stage (the diagonal is not used); send_base / recv_base give
/// each rank's stage offsets in its send and receive regions; `lanes` is PlanOptions::lanes.
/// What node A sends node B travels in Λ = lanes (at most B's rank count; 0: all of them) groups:
/// lane λ holds the chunks for B's ranks of local index ≡ λ (mod Λ), gathered by A's forwarder
/// for (B, λ) and received by one of those ranks. Everything a rank computes here depends on
/// shared inputs only, so the two ends of every transfer list it identically.
class TwoLevelRoute {
 public:
  /// One transfer from its sender's side and its receiver's side.
  struct Transfer {
    int from, to;
    std::int32_t src_buffer, dst_buffer;
    std::size_t src, dst, bytes;
  };
  /// Where rank x keeps its chunks: send_off[p] where its chunk for p lies (the send region or
  /// its gathered area of p's group), recv_off[p] where the chunk from p lands; the gathered
  /// (out_*, per destination group) and received (in_*, per source group) areas, indexed by
  /// group(node, lane); the bytes of its send and receive regions in this stage.
  struct Regions {
    std::vector<std::size_t> send_off, recv_off, out_base, in_base, out_bytes, in_bytes;
    /// Per area, the offset of each chunk l → j: [local index of l][index of j in its lane].
    std::vector<std::vector<std::size_t>> out_slot, in_slot;
    std::size_t send_span = 0, recv_span = 0;
  };
  static constexpr std::size_t npos = ~std::size_t{0};

  TwoLevelRoute(const NodeLayout& nodes, std::vector<std::size_t> chunk, std::vector<std::size_t> send_base,
                std::vector<std::size_t> recv_base, int lanes = 1)
      : n_(&nodes), P_(nodes.degree()), lanes_(lanes), c_(std::move(chunk)), sbase_(std::move(send_base)), rbase_(std::move(recv_base)),
        cache_(static_cast<std::size_t>(P_)) {
    for (int b = 0; b < n_->num_nodes(); ++b) lmax_ = std::max(lmax_, static_cast<int>(n_->members(b).size()));
  }

  int degree() const { return P_; }
  std::size_t chunk(int i, int j) const { return c_[static_cast<std::size_t>(i) * static_cast<std::size_t>(P_) + static_cast<std::size_t>(j)]; }
  /// Lanes of the messages into node B (Λ).
  int lanes(int B) const {
    const int L = static_cast<int>(n_->members(B).size());
    return lanes_ <= 0 ? L : std::min(lanes_, L);
  }
  /// The lane of rank j's chunks (into j's node).
  int lane(int j) const { return n_->local_index(j) % lanes(n_->node(j)); }
  /// How many ranks of node B are in lane λ (local index ≡ λ mod Λ).
  int lane_size(int B, int lam) const {
    const int L = static_cast<int>(n_->members(B).size()), La = lanes(B);
    return (L - lam + La - 1) / La;
  }
  /// The i-th rank of node B in lane λ (ascending).
  int lane_member(int B, int lam, int i) const {
    return n_->members(B)[static_cast<std::size_t>(lam + i * lanes(B))];
  }
  /// Node A's rank that gathers and sends what A has for lane λ of node B (A != B).
  int forwarder(int A, int B, int lam) const {
    const auto& m = n_->members(A);
    return m[(static_cast<std::size_t>(B) * static_cast<std::size_t>(lanes(B)) + static_cast<std::size_t>(lam)) % m.size()];
  }
  /// Node B's rank that receives lane λ of what node A sends it and delivers it (A != B): one of
  /// the lane's ranks, so that its own chunks need no delivery.
  int receiver(int A, int B, int lam) const { return lane_member(B, lam, A % lane_size(B, lam)); }

  /// Bytes of rank x's send and receive regions in this stage (computed, not kept, unless x's
  /// regions are).
  std::pair<std::size_t, std::size_t> spans(int x) const {
    const Regions& c = cache_[static_cast<std::size_t>(x)];
    if (!c.send_off.empty()) return {c.send_span, c.recv_span};
    const Regions r = compute(x);
    return {r.send_span, r.recv_span};
  }

  /// Rank x's regions (computed once, then kept).
  const Regions& regions(int x) const {
    Regions& g = cache_[static_cast<std::size_t>(x)];
    if (g.send_off.empty() && P_ > 0) g = compute(x);
    return g;
  }

  /// Rank x's regions.
  Regions compute(int x) const {
    Regions g;
    const int A = n_->node(x), N = n_->num_nodes();
    const auto P = static_cast<std::size_t>(P_), G = static_cast<std::size_t>(N * lmax_);
    g.send_off.assign(P, npos);
    g.recv_off.assign(P, npos);
    g.out_base.assign(G, npos);
    g.in_base.assign(G, npos);
    g.out_bytes.assign(G, 0);
    g.in_bytes.assign(G, 0);
    g.out_slot.assign(G, {});
    g.in_slot.assign(G, {});
    std::size_t so = sbase_[static_cast<std::size_t>(x)], ro = rbase_[static_cast<std::size_t>(x)];
    const int my_lane = lane(x);
    for (int p = 0; p < P_; ++p) {
      if (p == x) continue;
      const int B = n_->node(p);
      if (B == A || forwarder(A, B, lane(p)) != x) {
        g.send_off[static_cast<std::size_t>(p)] = so;
        so += chunk(x, p);
      }
      if (B == A || receiver(B, A, my_lane) != x) {
        g.recv_off[static_cast<std::size_t>(p)] = ro;
        ro += chunk(p, x);
      }
    }
    for (int B = 0; B < N; ++B) {
      if (B == A) continue;
      for (int lam = 0; lam < lanes(B); ++lam)
        if (forwarder(A, B, lam) == x) area(g, x, A, B, lam, true, so);
      for (int lam = 0; lam < lanes(A); ++lam)  // B is the source node here
        if (receiver(B, A, lam) == x) area(g, x, B, A, lam, false, ro);
    }
    g.send_span = so - sbase_[static_cast<std::size_t>(x)];
    g.recv_span = ro - rbase_[static_cast<std::size_t>(x)];
    return g;
  }

  /// The transfers rank `from` starts in round `round` (0: intra-node gather, 1: inter-node, 2:
  /// intra-node delivery), in the order both ends list them; consecutive transfers between the same
  /// pair that are contiguous at both ends are merged into one.
  std::vector<Transfer> sends(int from, int round) const {
    std::vector<Transfer> out;
    std::vector<std::size_t> last(static_cast<std::size_t>(P_), npos);  // last transfer to each peer
    auto add = [&](Transfer t) {
      if (t.bytes == 0) return;
      std::size_t& l = last[static_cast<std::size_t>(t.to)];
      if (l != npos) {
        Transfer& p = out[l];
        if (p.src_buffer == t.src_buffer && p.dst_buffer == t.dst_buffer && p.src + p.bytes == t.src && p.dst + p.bytes == t.dst) {
          p.bytes += t.bytes;
          return;
        }
      }
      l = out.size();
      out.push_back(t);
    };
    const int A = n_->node(from), N = n_->num_nodes();
    const Regions& me = regions(from);
    const std::int32_t S = BufferIndex::send, R = BufferIndex::recv;
    if (round == 0) {
      for (int p = 0; p < P_; ++p) {
        if (p == from) continue;
        const int B = n_->node(p);
        if (B == A) {
          add({from, p, S, R, me.send_off[static_cast<std::size_t>(p)], regions(p).recv_off[static_cast<std::size_t>(from)], chunk(from, p)});
          continue;
        }
        const int f = forwarder(A, B, lane(p));
        if (f != from) add({from, f, S, S, me.send_off[static_cast<std::size_t>(p)], slot(f, A, B, lane(p), from, p, true), chunk(from, p)});
      }
    } else if (round == 1) {
      for (int B = 0; B < N; ++B)
        for (int lam = 0; B != A && lam < lanes(B); ++lam) {
          if (forwarder(A, B, lam) != from) continue;
          const int g = receiver(A, B, lam);
          const std::size_t k = group(B, lam);
          add({from, g, S, R, me.out_base[k], regions(g).in_base[group(A, lam)], me.out_bytes[k]});
        }
    } else {
      for (int Src = 0; Src < N; ++Src)
        for (int lam = 0; Src != A && lam < lanes(A); ++lam) {
          if (receiver(Src, A, lam) != from) continue;
          for (int i = 0; i < lane_size(A, lam); ++i) {
            const int j = lane_member(A, lam, i);
            if (j == from) continue;
            for (int l : n_->members(Src))
              add({from, j, R, R, slot(from, Src, A, lam, l, j, false), regions(j).recv_off[static_cast<std::size_t>(l)], chunk(l, j)});
          }
        }
    }
    return out;
  }

  /// The transfers rank x takes part in during `round`: what it sends, and what it receives (from
  /// every possible sender, in the sender's order).
  void hops(int x, int round, std::vector<Hop>& send, std::vector<Hop>& recv) const {
    send.clear();
    recv.clear();
    for (const Transfer& t : sends(x, round)) send.push_back({t.to, t.src_buffer, t.src, t.bytes});
    const int A = n_->node(x), N = n_->num_nodes();
    std::vector<int> from;  // the ranks that may send x something this round, each once
    if (round == 1) {
      for (int Src = 0; Src < N; ++Src)
        for (int lam = 0; Src != A && lam < lanes(A); ++lam)
          if (receiver(Src, A, lam) == x) from.push_back(forwarder(Src, A, lam));
      std::sort(from.begin(), from.end());
      from.erase(std::unique(from.begin(), from.end()), from.end());
    } else {
      for (int s : n_->members(A))
        if (s != x) from.push_back(s);
    }
    for (int s : from)
      for (const Transfer& t : sends(s, round))
        if (t.to == x) recv.push_back({s, t.dst_buffer, t.dst, t.bytes});
  }

 private:
  std::size_t group(int node, int lam) const { return static_cast<std::size_t>(node * lmax_ + lam); }
  /// Lays out rank x's area of lane λ from node Src to node Dst at `cursor`: [l of Src][j of the
  /// lane] back to back; x's own chunks in it (x = l when gathering, x = j when receiving) are
  /// placed there.
  void area(Regions& g, int x, int Src, int Dst, int lam, bool out, std::size_t& cursor) const {
    const std::size_t k = group(out ? Dst : Src, lam);
    std::vector<std::size_t>& base = out ? g.out_base : g.in_base;
    std::vector<std::size_t>& slots = (out ? g.out_slot : g.in_slot)[k];
    base[k] = cursor;
    const int n = lane_size(Dst, lam);
    for (int l : n_->members(Src))
      for (int i = 0; i < n; ++i) {
        const int j = lane_member(Dst, lam, i);
        if (out && l == x) g.send_off[static_cast<std::size_t>(j)] = cursor;
        if (!out && j == x) g.recv_off[static_cast<std::size_t>(l)] = cursor;
        slots.push_back(cursor);
        cursor += chunk(l, j);
      }
    (out ? g.out_bytes : g.in_bytes)[k] = cursor - base[k];
  }
  /// Offset of the chunk l → j in rank x's gathered (out: x forwards lane λ of A → B) or received
  /// (x receives it) area: [l of A][j of the lane] back to back.
  std::size_t slot(int x, int A, int B, int lam, int l, int j, bool out) const {
    const Regions& g = regions(x);
    const std::vector<std::size_t>& slots = out ? g.out_slot[group(B, lam)] : g.in_slot[group(A, lam)];
    const auto i = static_cast<std::size_t>(n_->local_index(l) * lane_size(B, lam) + n_->local_index(j) / lanes(B));
    return slots[i];
  }
  const NodeLayout* n_;
  int P_, lanes_, lmax_ = 1;
  std::vector<std::size_t> c_, sbase_, rbase_;
  mutable std::vector<Regions> cache_;
};

}  // namespace detail

ULYSSES_NAMESPACE_END
