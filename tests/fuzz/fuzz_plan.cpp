// SPDX-License-Identifier: Apache-2.0
// libFuzzer target over planning. The input bytes choose a group, a shape, splits, element sizes
// and (possibly bad) layouts; then either planning throws ulysses::Error — with the same code on
// every rank when the cause is global — or the P plans must be consistent:
//   * what rank i sends to rank j is what rank j expects from rank i (bytes), in both directions;
//   * every chunk lies inside its region, both regions inside the workspace;
//   * every block copy lies inside the buffers it reads and writes;
//   * pack fills the send region exactly and unpack reads the receive region exactly;
//   * the message-level pieces match pairwise (count and bytes), lie inside their buffers and
//     cover the chunks;
// and, simulating the exchange in this one thread (one all-to-all-v of the wire, one message per
// piece straight from / into the tensors where the plan says so, or the direct transport: every
// rank reads its peers' inputs), seq→head gives each rank exactly its slice of the global tensors,
// and head→seq gives each rank the owner's copy of every head, or the sum of its holders' copies.
#include <ulysses/ulysses.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

namespace {

using namespace ulysses;

struct Reader {
  const std::uint8_t* p;
  std::size_t n;
  unsigned next(unsigned mod) {  // 0..mod-1 (0 when the input is exhausted)
    if (!n) return 0;
    --n;
    return *p++ % mod;
  }
};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fuzz_plan: invariant broken: %s\n", what);
  std::abort();
}
#define EXPECT(c) \
  if (!(c)) die(#c)

bool global_code(Errc c) { return c != Errc::layout_mismatch && c != Errc::layout_aliasing && c != Errc::size_overflow; }

std::uint8_t byte_of(int t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, std::int64_t k) {
  std::uint64_t x = ((((static_cast<std::uint64_t>(t) * 131 + b) * 977 + s) * 613 + h) * 397 + d) * 31 + k;
  x ^= x >> 29, x *= 0xBF58476D1CE4E5B9ull, x ^= x >> 32;
  return static_cast<std::uint8_t>(x);
}

/// Layout for extents e with padding (possibly aliasing when `bad`), in memory order `order`.
Layout make_layout(Reader& in, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D) {
  const unsigned kind = in.next(8);
  if (kind < 5) return Layout::dense(static_cast<Format>(kind % 3), B, S, H, D);
  const std::int64_t ext[4] = {B, S, H, D};
  static const int orders[4][4] = {{0, 1, 2, 3}, {1, 0, 2, 3}, {0, 2, 1, 3}, {3, 2, 1, 0}};
  const int* ord = orders[in.next(4)];
  std::int64_t st[4], stride = 1;
  for (int k = 3; k >= 0; --k) {
    const int dim = ord[k];
    st[dim] = stride;
    stride = stride * ext[dim] + (kind == 7 ? -static_cast<std::int64_t>(in.next(3)) : in.next(3));
    if (stride < 0) stride = 0;
  }
  return Layout::strided({B, S, H, D}, {st[0], st[1], st[2], st[3]});
}

void check_blocks(const std::vector<BlockCopy>& list, const std::int64_t* size) {
  for (const BlockCopy& c : list) {
    EXPECT(c.row_bytes >= 1 && c.row_bytes % c.elem_bytes == 0);
    EXPECT(c.src_offset >= 0 && c.dst_offset >= 0);
    std::int64_t src_end = c.src_offset + c.row_bytes, dst_end = c.dst_offset + c.row_bytes;
    for (int i = 0; i < 4; ++i) {
      EXPECT(c.extent[i] >= 1 && c.src_stride[i] >= 0 && c.dst_stride[i] >= 0);
      src_end += (c.extent[i] - 1) * c.src_stride[i];
      dst_end += (c.extent[i] - 1) * c.dst_stride[i];
    }
    EXPECT(src_end <= size[c.src_buffer]);
    EXPECT(dst_end <= size[c.dst_buffer]);
  }
}

std::int64_t sum_bytes(const std::vector<BlockCopy>& l, int buffer, bool as_src) {
  std::int64_t n = 0;
  for (const BlockCopy& c : l)
    if ((as_src ? c.src_buffer : c.dst_buffer) == buffer) n += c.bytes();
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader in{data, size};
  const int P = 1 + static_cast<int>(in.next(6));
  const std::int64_t B = 1 + in.next(3), S = in.next(24);  // S = 0 must be rejected
  const unsigned split = in.next(4);
  const Format fmt = static_cast<Format>(in.next(3));
  const int T = 1 + static_cast<int>(in.next(3));
  const unsigned kb = in.next(8);
  const int K = 1 + static_cast<int>(kb % 4);  // pipeline stages
  const bool messages = kb >= 4;               // simulate the message-level exchange (direct pieces)
  std::vector<std::int64_t> lens(static_cast<std::size_t>(P));
  for (auto& l : lens) l = in.next(7);

  struct TDef {
    std::int64_t H, Hkv, D;
    std::size_t e;
    unsigned heads;
  };
  std::vector<TDef> defs;
  for (int t = 0; t < T; ++t)
    defs.push_back({static_cast<std::int64_t>(in.next(10)), 1 + in.next(6), 1 + in.next(5),
                    std::size_t{1} << in.next(4), in.next(4)});

  // Options from the last input byte (so that the corpus keeps its meaning above): bit 0 gives
  // tensors of 2, 4 or 8 bytes a summable element type; bit 1 gives every rank its own format and
  // layouts (they must not change the wire); bit 2 makes head→seq take the owner's copy of a
  // replicated head instead of summing the copies (the default).
  const unsigned opts = size ? data[size - 1] : 0;
  const bool typed = opts & 1, per_rank = opts & 2, direct = opts & 8;  // bit 3: the direct transport
  const Replicas replicas = opts & 4 ? Replicas::owner : Replicas::sum;

  // Build every rank's plan; collect verdicts.
  std::vector<std::optional<Plan>> plans(static_cast<std::size_t>(P));
  std::vector<Errc> codes(static_cast<std::size_t>(P), Errc{});
  const std::size_t layout_seed = in.n;
  for (int r = 0; r < P; ++r) {
    const std::size_t shift = per_rank && layout_seed ? static_cast<std::size_t>(r) % layout_seed : 0;
    Reader lin{in.p + shift, layout_seed - shift};  // the same layout bytes for every rank, unless per_rank
    try {
      SeqPartition seq = split == 0   ? SeqPartition::even(S, P)
                         : split == 1 ? SeqPartition::balanced(S, P)
                         : split == 2 ? SeqPartition::zigzag(S, P)
                                      : SeqPartition::lengths(S, P, lens);
      std::vector<TensorSpec> specs;
      std::optional<HeadPartition> q;
      for (const TDef& d : defs) {
        HeadPartition hp = d.heads == 0 ? HeadPartition::even(d.H, P)
                           : d.heads == 1 || !q ? HeadPartition::balanced(d.H, P)
                                                : HeadPartition::gqa(*q, d.Hkv);
        if (!q) q = hp;
        TensorSpec s{hp, d.D, d.e, std::nullopt, std::nullopt};
        if (typed && (d.e == 2 || d.e == 4 || d.e == 8))
          s.type = d.e == 4 ? ElementType::float32 : d.e == 8 ? ElementType::float64 : specs.size() % 2 ? ElementType::float16 : ElementType::bfloat16;
        s.replicas = replicas;
        if (lin.next(2)) s.seq_layout = make_layout(lin, B, seq.local_length(r), hp.num_heads(), d.D);
        if (lin.next(2)) s.head_layout = make_layout(lin, B, S, hp.count(r), d.D);
        specs.push_back(s);
      }
      const Format f = per_rank ? static_cast<Format>((static_cast<int>(fmt) + r) % 3) : fmt;
      plans[static_cast<std::size_t>(r)].emplace(Group{P, r}, B, seq, specs, f, PlanOptions{K});
    } catch (const Error& e) {
      codes[static_cast<std::size_t>(r)] = e.code();
    }
  }
  for (int r = 0; r < P; ++r)  // a global cause is seen by every rank
    if (codes[r] != Errc{} && global_code(codes[r]))
      for (int k = 0; k < P; ++k) EXPECT(codes[k] == codes[r]);
  for (int r = 0; r < P; ++r)
    if (!plans[r]) return 0;

  for (int r = 0; r < P; ++r) EXPECT(plans[r]->fingerprint() == plans[0]->fingerprint());

  // Buffers of every rank: inputs, outputs, workspace for both directions.
  std::vector<std::vector<std::vector<std::uint8_t>>> seqbuf(P), headbuf(P), back(P);
  std::vector<std::vector<std::uint8_t>> ws(P);
  for (int r = 0; r < P; ++r) {
    const Plan& p = *plans[r];
    ws[r].assign(p.workspace_bytes(), 0);
    for (int t = 0; t < T; ++t) {
      seqbuf[r].emplace_back(p.seq_bytes(t), 0xEE);
      headbuf[r].emplace_back(p.head_bytes(t), 0xEE);
      back[r].emplace_back(p.seq_bytes(t), 0xEE);
    }
  }
  // Fill the seq-sharded inputs from the global tensors.
  for (int r = 0; r < P; ++r) {
    const Plan& p = *plans[r];
    for (int t = 0; t < T; ++t) {
      const Layout& l = p.seq_layout(t);
      const std::size_t e = p.tensor(t).elem_bytes;
      for (const SeqChunk& c : p.seq().chunks_of(r))
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t s = 0; s < c.length; ++s)
            for (std::int64_t h = 0; h < l.extent[2]; ++h)
              for (std::int64_t d = 0; d < l.extent[3]; ++d)
                for (std::size_t k = 0; k < e; ++k)
                  seqbuf[r][t][l.offset(b, c.local_offset + s, h, d) * e + k] = byte_of(t, b, c.offset + s, h, d, k);
    }
  }

  for (Direction dir : {Direction::seq_to_head, Direction::head_to_seq}) {
    const bool s2h = dir == Direction::seq_to_head;
    std::vector<BufferTable> tabs(P);
    for (int r = 0; r < P; ++r) {
      const Plan& p = *plans[r];
      TensorList<ConstByteSpan> ip;
      TensorList<ByteSpan> op;
      for (int t = 0; t < T; ++t) {
        ip.push_back(s2h ? seqbuf[r][t] : headbuf[r][t]);
        op.push_back(s2h ? headbuf[r][t] : back[r][t]);
      }
      tabs[r] = bind_buffers(p, dir, ip, op, ws[r]);
    }
    if (direct) {  // every rank reads its peers' inputs into its outputs (one list, all stages)
      std::vector<LayoutRecord> layouts;
      for (int r = 0; r < P; ++r) layouts.push_back(plans[r]->layout_record());
      std::vector<std::byte*> peers(static_cast<std::size_t>(P) * kMaxTensors, nullptr);
      for (int r = 0; r < P; ++r)
        for (int t = 0; t < T; ++t) peers[static_cast<std::size_t>(r * kMaxTensors + t)] = tabs[r].base[BufferIndex::input(t)];
      for (int r = 0; r < P; ++r) {
        const Plan& p = *plans[r];
        const PeerCopyLists lists = peer_copy_lists(p, layouts.data());
        const std::vector<BlockCopy>& direct_list = lists.list[static_cast<int>(dir)];
        for (const BlockCopy& c : direct_list) {  // sources in the peers' inputs, destinations in my outputs
          EXPECT(c.src_buffer >= BufferIndex::count && c.dst_buffer < BufferIndex::count);
          const int q = (c.src_buffer - BufferIndex::count) / kMaxTensors, t = (c.src_buffer - BufferIndex::count) % kMaxTensors;
          EXPECT(q >= 0 && q < P && t < T);
          std::int64_t src_end = c.src_offset + c.row_bytes, dst_end = c.dst_offset + c.row_bytes;
          for (int i = 0; i < 4; ++i) src_end += (c.extent[i] - 1) * c.src_stride[i], dst_end += (c.extent[i] - 1) * c.dst_stride[i];
          EXPECT(src_end <= static_cast<std::int64_t>(plans[q]->input_bytes(dir, t)));
          EXPECT(dst_end <= static_cast<std::int64_t>(p.output_bytes(dir, c.dst_buffer - kMaxTensors)));
        }
        BufferTable t = tabs[r];
        t.peers = peers.data();
        HostExecutor ex;
        ex.run(direct_list.data(), direct_list.size(), t);
      }
    }
    for (int k = 0; k < (direct ? 0 : K); ++k) {
      for (int r = 0; r < P; ++r) {
        const Plan& p = *plans[r];
        const StageLists& sc = p.stage_lists(dir, k);
        const std::size_t send_region = p.recv_region_offset(), recv_region = p.workspace_bytes() - p.recv_region_offset();
        // Chunk consistency against every peer, inside the regions.
        for (int j = 0; j < P; ++j) {
          EXPECT(sc.send_bytes[j] == plans[j]->stage_lists(dir, k).recv_bytes[r]);
          EXPECT(sc.send_offsets[j] + sc.send_bytes[j] <= send_region);
          EXPECT(sc.recv_offsets[j] + sc.recv_bytes[j] <= recv_region);
        }
        EXPECT(sc.send_bytes[r] == 0 && sc.recv_bytes[r] == 0);
        std::int64_t sizes[BufferIndex::count] = {};
        for (int t = 0; t < T; ++t) {
          sizes[BufferIndex::input(t)] = static_cast<std::int64_t>(p.input_bytes(dir, t));
          sizes[BufferIndex::output(t)] = static_cast<std::int64_t>(p.output_bytes(dir, t));
        }
        sizes[BufferIndex::send] = static_cast<std::int64_t>(send_region);
        sizes[BufferIndex::recv] = static_cast<std::int64_t>(recv_region);
        check_blocks(sc.pack, sizes);
        check_blocks(sc.unpack, sizes);
        EXPECT(sum_bytes(sc.pack, BufferIndex::send, false) == static_cast<std::int64_t>(sc.send_total));
        EXPECT(sum_bytes(sc.unpack, BufferIndex::recv, true) == static_cast<std::int64_t>(sc.recv_total));
        for (std::size_t i = 0; i < sc.unpack.size(); ++i) {  // a sum's terms follow it, same geometry
          const BlockCopy& c = sc.unpack[i];
          if (c.op != BlockOp::sum) {
            EXPECT(c.op == BlockOp::copy);
            continue;
          }
          EXPECT(!s2h && c.sources >= 2 && i + static_cast<std::size_t>(c.sources) <= sc.unpack.size() && summable(c.type));
          for (int j = 1; j < c.sources; ++j) {
            const BlockCopy& x = sc.unpack[i + static_cast<std::size_t>(j)];
            EXPECT(x.op == BlockOp::sum_term && x.dst_offset == c.dst_offset && x.row_bytes == c.row_bytes);
            for (int d = 0; d < 4; ++d) EXPECT(x.extent[d] == c.extent[d] && x.dst_stride[d] == c.dst_stride[d]);
          }
          i += static_cast<std::size_t>(c.sources) - 1;
        }
        check_blocks(sc.pack_staged, sizes);
        check_blocks(sc.unpack_staged, sizes);
        std::size_t sent = 0, received = 0;
        for (const Piece& pc : sc.send_pieces) {
          EXPECT(pc.peer != r && pc.bytes > 0 && pc.offset >= 0 && pc.offset + static_cast<std::int64_t>(pc.bytes) <= sizes[pc.buffer]);
          sent += pc.bytes;
        }
        for (const Piece& pc : sc.recv_pieces) {
          EXPECT(pc.peer != r && pc.bytes > 0 && pc.offset >= 0 && pc.offset + static_cast<std::int64_t>(pc.bytes) <= sizes[pc.buffer]);
          received += pc.bytes;
        }
        EXPECT(sent == sc.send_total && received == sc.recv_total);
        HostExecutor ex;
        if (messages)
          ex.run(sc.pack_staged.data(), sc.pack_staged.size(), tabs[r]);
        else
          pack(p, dir, ex, tabs[r], k);
      }
      for (int r = 0; r < P; ++r) {  // the exchange, by hand
        const StageLists& sc = plans[r]->stage_lists(dir, k);
        if (messages) {  // r's k-th piece from j is j's k-th piece to r
          std::vector<std::size_t> next(static_cast<std::size_t>(P), 0);
          for (const Piece& rp : sc.recv_pieces) {
            const std::vector<Piece>& from = plans[rp.peer]->stage_lists(dir, k).send_pieces;
            std::size_t& i = next[static_cast<std::size_t>(rp.peer)];
            while (i < from.size() && from[i].peer != r) ++i;
            EXPECT(i < from.size() && from[i].bytes == rp.bytes && from[i].tensor == rp.tensor);
            std::memcpy(tabs[r].base[rp.buffer] + rp.offset, tabs[rp.peer].base[from[i].buffer] + from[i].offset, rp.bytes);
            ++i;
          }
          for (int j = 0; j < P; ++j) {
            const std::vector<Piece>& from = plans[j]->stage_lists(dir, k).send_pieces;
            for (std::size_t i = next[static_cast<std::size_t>(j)]; i < from.size(); ++i) EXPECT(from[i].peer != r);
          }
          continue;
        }
        for (int j = 0; j < P; ++j)
          if (sc.recv_bytes[j])
            std::memcpy(tabs[r].base[BufferIndex::recv] + sc.recv_offsets[j],
                        tabs[j].base[BufferIndex::send] + plans[j]->stage_lists(dir, k).send_offsets[r], sc.recv_bytes[j]);
      }
      for (int r = 0; r < P; ++r) {
        HostExecutor ex;
        const StageLists& sc = plans[r]->stage_lists(dir, k);
        if (messages)
          ex.run(sc.unpack_staged.data(), sc.unpack_staged.size(), tabs[r]);
        else
          unpack(*plans[r], dir, ex, tabs[r], k);
      }
    }
    if (s2h) {  // every rank holds exactly its heads of the global tensors, for all S tokens; then
                // each rank's head-sharded values become its own, so that head→seq shows whose
                // copy (or which sum of copies) arrives where
      for (int r = 0; r < P; ++r)
        for (int t = 0; t < T; ++t) {
          const Layout& l = plans[r]->head_layout(t);
          const std::size_t e = plans[r]->tensor(t).elem_bytes;
          const std::int64_t h0 = plans[r]->tensor(t).heads.begin(r);
          for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t s = 0; s < S; ++s)
              for (std::int64_t h = 0; h < l.extent[2]; ++h)
                for (std::int64_t d = 0; d < l.extent[3]; ++d)
                  for (std::size_t k = 0; k < e; ++k) {
                    EXPECT(headbuf[r][t][l.offset(b, s, h, d) * e + k] == byte_of(t, b, s, h0 + h, d, k));
                    headbuf[r][t][l.offset(b, s, h, d) * e + k] = byte_of(t + 7 * (r + 1), b, s, h0 + h, d, k);
                  }
        }
    }
  }
  // head→seq: element (b, s, h, d) of rank r's output is the owner's copy of head h, or, when the
  // plan sums the tensor's replicas, the sum over the holders in ascending rank order.
  for (int r = 0; r < P; ++r) {
    const Plan& p = *plans[r];
    for (int t = 0; t < T; ++t) {
      const Layout& l = p.seq_layout(t);
      const TensorSpec& x = p.tensor(t);
      const std::size_t e = x.elem_bytes;
      std::vector<std::uint8_t> want(p.seq_bytes(t), 0xEE), term(e * static_cast<std::size_t>(P));
      for (const SeqChunk& c : p.seq().chunks_of(r))
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t s = 0; s < c.length; ++s)
            for (std::int64_t h = 0; h < l.extent[2]; ++h)
              for (std::int64_t d = 0; d < l.extent[3]; ++d) {
                std::uint8_t* w = &want[static_cast<std::size_t>(l.offset(b, c.local_offset + s, h, d)) * e];
                const auto [f, last] = x.heads.holders(h);
                const int n = p.sums_replicas(t) ? last - f : 1;
                std::vector<const std::byte*> terms;
                for (int j = 0; j < n; ++j) {
                  for (std::size_t k = 0; k < e; ++k) term[j * e + k] = byte_of(t + 7 * (f + j + 1), b, c.offset + s, h, d, k);
                  terms.push_back(reinterpret_cast<const std::byte*>(&term[j * e]));
                }
                if (n == 1) std::memcpy(w, terms[0], e);
                else detail::sum_element(x.type, terms.data(), n, reinterpret_cast<std::byte*>(w));
              }
      EXPECT(back[r][t] == want);
    }
  }
  return 0;
}
