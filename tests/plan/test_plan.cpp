// SPDX-License-Identifier: Apache-2.0
// plan.hpp: wire chunk sizes and offsets, workspace, GQA replication folded into the exchange,
// and every planning error with its code — the same verdict on every rank.
#include <doctest/doctest.h>
#include <ulysses/plan/plan.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "expect_error.hpp"

using namespace ulysses;

namespace {
using ut::code_of;
using Sizes = std::vector<std::size_t>;
}  // namespace

TEST_CASE("chunk sizes and offsets: P=4, B=1, S=8, H=4, D=2, float, rank 2") {
  // Every peer chunk: 2 tokens * 1 head * 2 * 4 bytes = 16; the own chunk is 0 (copied directly).
  Plan plan({4, 2}, 1, SeqPartition::even(8, 4), {TensorSpec::of<float>(HeadPartition::even(4, 4), 2)});
  for (Direction d : {Direction::seq_to_head, Direction::head_to_seq}) {
    const StageLists& s = plan.stage_lists(d);
    CHECK(s.send_bytes == Sizes{16, 16, 0, 16});
    CHECK(s.send_offsets == Sizes{0, 16, 32, 32});
    CHECK(s.recv_bytes == Sizes{16, 16, 0, 16});
    CHECK(s.recv_offsets == Sizes{0, 16, 32, 32});
    CHECK(s.send_total == 48);
    CHECK(plan.exchanged_bytes(d) == 48);
  }
  CHECK(plan.recv_region_offset() == 256);
  CHECK(plan.workspace_bytes() == 256 + 48);
  CHECK(plan.stage_lists(Direction::seq_to_head).pack.size() == 3);
  CHECK(plan.stage_lists(Direction::seq_to_head).unpack.size() == 4);  // 3 peers + own chunk
}

TEST_CASE("uneven split: S=7 over P=2, B=2, H=4, D=8 float") {
  Plan r0({2, 0}, 2, SeqPartition::balanced(7, 2), {TensorSpec::of<float>(HeadPartition::even(4, 2), 8)});
  Plan r1({2, 1}, 2, SeqPartition::balanced(7, 2), {TensorSpec::of<float>(HeadPartition::even(4, 2), 8)});
  // rank 0 (4 tokens) sends B*4*2*8*4 = 512 bytes; rank 1 (3 tokens) sends 384.
  CHECK(r0.stage_lists(Direction::seq_to_head).send_bytes == Sizes{0, 512});
  CHECK(r1.stage_lists(Direction::seq_to_head).recv_bytes == Sizes{512, 0});
  CHECK(r1.stage_lists(Direction::seq_to_head).send_bytes == Sizes{384, 0});
  CHECK(r0.stage_lists(Direction::head_to_seq).recv_bytes == Sizes{0, 512});
  CHECK(r0.head_layout(0).extent[1] == 7);
}

TEST_CASE("C5: q, k, v in one exchange; the kv head is sent to each rank that needs it, never materialised") {
  // H=16, Hkv=2, P=4, S=16, D=8 float. Per peer in seq→head: q 4 tok*4 heads*8*4 = 512,
  // k and v 4*1*8*4 = 128 each: 768. The workspace holds exactly the wire, nothing more.
  auto q = HeadPartition::even(16, 4);
  auto kv = HeadPartition::gqa(q, 2);
  for (int r = 0; r < 4; ++r) {
    Plan p({4, r}, 1, SeqPartition::even(16, 4),
           {TensorSpec::of<float>(q, 8), TensorSpec::of<float>(kv, 8), TensorSpec::of<float>(kv, 8)});
    Sizes want(4, 768);
    want[r] = 0;
    CHECK(p.stage_lists(Direction::seq_to_head).send_bytes == want);
    // head→seq summing the replicas (the default, the backward of seq→head): every holder sends
    // its copy of the kv head; ranks 1 and 3 hold theirs without owning it (256 bytes a peer).
    CHECK(p.stage_lists(Direction::head_to_seq).send_bytes == want);
    CHECK(p.replica_bytes(Direction::head_to_seq) == (r % 2 == 0 ? 0u : 3 * 256u));
    CHECK(p.replica_bytes(Direction::seq_to_head) == 0);
    CHECK(p.workspace_bytes() == 2304 + 2304);  // send region 2304 (a multiple of 256) + receive region
    // head→seq taking the owner's copy (the plain inverse): the kv head comes from its lowest
    // holder only (ranks 0 and 2).
    Plan inv({4, r}, 1, SeqPartition::even(16, 4),
             {TensorSpec::of<float>(q, 8), TensorSpec::of<float>(kv, 8).with_replicas(Replicas::owner),
              TensorSpec::of<float>(kv, 8).with_replicas(Replicas::owner)});
    Sizes back(4, r % 2 == 0 ? 768 : 512);
    back[r] = 0;
    CHECK(inv.stage_lists(Direction::head_to_seq).send_bytes == back);
    CHECK(inv.replica_bytes(Direction::head_to_seq) == 0);
    CHECK(inv.first_non_adjoint_tensor() == 1);
    CHECK(p.first_non_adjoint_tensor() == -1);
  }
}

namespace {
std::size_t piece_bytes(const std::vector<Piece>& l) {
  std::size_t n = 0;
  for (const Piece& p : l) n += p.bytes;
  return n;
}
std::size_t block_bytes(const std::vector<BlockCopy>& l) {
  std::size_t n = 0;
  for (const BlockCopy& c : l) n += static_cast<std::size_t>(c.bytes());
  return n;
}
}  // namespace

TEST_CASE("in-place pieces: bshd B=1 receives seq→head and sends head→seq in place, one message per (peer, tensor)") {
  // C5 shapes, rank 1: q 4 tok*4 heads*8*4 B = 512 bytes a peer, k and v 128 each.
  auto q = HeadPartition::even(16, 4);
  auto kv = HeadPartition::gqa(q, 2);
  Plan p({4, 1}, 1, SeqPartition::even(16, 4),
         {TensorSpec::of<float>(q, 8), TensorSpec::of<float>(kv, 8).with_replicas(Replicas::owner),
          TensorSpec::of<float>(kv, 8).with_replicas(Replicas::owner)});
  const StageLists& s2h = p.stage_lists(Direction::seq_to_head);
  REQUIRE(s2h.recv_pieces.size() == 9);  // peers 0, 2, 3 x q, k, v
  const std::size_t want_bytes[3] = {512, 128, 128};
  for (std::size_t i = 0; i < 9; ++i) {
    const Piece& pc = s2h.recv_pieces[i];
    const int peer = i < 3 ? 0 : i < 6 ? 2 : 3, t = static_cast<int>(i % 3);
    CHECK(pc.peer == peer);
    CHECK(pc.tensor == t);
    CHECK(pc.bytes == want_bytes[t]);
    // Output [S=16, H_r, D=8]: peer's 4 tokens start at token 4*peer, one contiguous range.
    CHECK(pc.in_place());
    CHECK(pc.buffer == BufferIndex::output(t));
    CHECK(pc.offset == static_cast<std::int64_t>(4 * peer * want_bytes[t] / 4));
    // Sending: my 4 tokens of the peer's heads are strided in [4, 16, 8]: staged in the send region.
    const Piece& sp = s2h.send_pieces[i];
    CHECK(!sp.in_place());
    CHECK(sp.buffer == BufferIndex::send);
    CHECK(sp.offset == static_cast<std::int64_t>(s2h.send_offsets[peer] + (t == 0 ? 0 : t == 1 ? 512 : 640)));
  }
  CHECK(s2h.pack_staged.size() == s2h.pack.size());
  CHECK(block_bytes(s2h.unpack_staged) == 768);  // only the own chunk is left to unpack
  CHECK(piece_bytes(s2h.recv_pieces) == s2h.recv_total);
  CHECK(piece_bytes(s2h.send_pieces) == s2h.send_total);
  // head→seq: the reverse. Rank 1 holds no kv head it owns (rank 0 owns kv head 0): q only.
  const StageLists& h2s = p.stage_lists(Direction::head_to_seq);
  REQUIRE(h2s.send_pieces.size() == 3);
  for (const Piece& pc : h2s.send_pieces) {
    CHECK(pc.in_place());
    CHECK(pc.buffer == BufferIndex::input(0));
    CHECK(pc.offset == 4 * pc.peer * 4 * 8 * 4);  // token 4*peer of [16, 4, 8] floats
  }
  CHECK(h2s.pack_staged.empty());
  CHECK(h2s.recv_pieces.size() == 3 * 3 - 2);  // from rank 0: q, k, v; from ranks 2, 3: q, k, v minus the non-owner 3
  CHECK(piece_bytes(h2s.recv_pieces) == h2s.recv_total);
  for (const Piece& pc : h2s.recv_pieces) CHECK(!pc.in_place());
  CHECK(block_bytes(h2s.unpack_staged) == h2s.recv_total + 512);  // plus the own chunk (q)

  // Summing the replicas (the default): rank 1 sends its copy of kv head 0 too, in place (its
  // [16, 1, 8] k and v hold each peer's 4 tokens contiguously). What it receives is staged: q as
  // before, k and v because they are terms of sums (kv head 0 from ranks 0 and 1, kv head 1 from
  // ranks 2 and 3, for each of k and v: 4 sums of 2 terms).
  Plan sum({4, 1}, 1, SeqPartition::even(16, 4),
           {TensorSpec::of<float>(q, 8), TensorSpec::of<float>(kv, 8), TensorSpec::of<float>(kv, 8)});
  const StageLists& b = sum.stage_lists(Direction::head_to_seq);
  REQUIRE(b.send_pieces.size() == 9);
  for (const Piece& pc : b.send_pieces) CHECK(pc.in_place());
  REQUIRE(b.recv_pieces.size() == 9);
  for (const Piece& pc : b.recv_pieces) CHECK(!pc.in_place());
  std::size_t sums = 0;
  for (const BlockCopy& c : b.unpack)
    if (c.op == BlockOp::sum) {
      ++sums;
      CHECK(c.sources == 2);
      CHECK(c.type == ElementType::float32);
    }
  CHECK(sums == 4);
}

TEST_CASE("pieces per (tensor, batch, sequence chunk): bshd receives seq→head and sends head→seq in place at B=2 and with zigzag") {
  const auto heads = HeadPartition::even(4, 2);
  // B=2, rank 0: 4 tokens a rank, 2 heads a rank, D=2: a piece per batch index, 4*2*2*4 = 64 bytes.
  Plan b2({2, 0}, 2, SeqPartition::even(8, 2), {TensorSpec::of<float>(heads, 2)});
  const StageLists& s = b2.stage_lists(Direction::seq_to_head);
  REQUIRE(s.recv_pieces.size() == 2);
  for (int b = 0; b < 2; ++b) {
    const Piece& pc = s.recv_pieces[static_cast<std::size_t>(b)];
    CHECK(pc.bytes == 64);
    CHECK(pc.in_place());  // peer 1's tokens 4..7 of batch b: one contiguous range of my [2, 8, 2, 2] output
    CHECK(pc.buffer == BufferIndex::output(0));
    CHECK(pc.offset == (b * 8 + 4) * 2 * 2 * 4);
    CHECK(pc.wire_offset == s.recv_offsets[1] + static_cast<std::size_t>(b) * 64);
    CHECK(!s.send_pieces[static_cast<std::size_t>(b)].in_place());  // my tokens of the peer's heads: strided
  }
  CHECK(block_bytes(s.unpack_staged) == block_bytes(s.unpack) - 128);  // only the own chunk is unpacked
  const StageLists& h = b2.stage_lists(Direction::head_to_seq);
  REQUIRE(h.send_pieces.size() == 2);
  for (const Piece& pc : h.send_pieces) CHECK(pc.in_place());
  for (const Piece& pc : h.recv_pieces) CHECK(!pc.in_place());
  CHECK(h.pack_staged.empty());
  // Zigzag: rank 1 holds chunks 1 and 2 (of 4 chunks of 2 tokens); rank 0 receives one piece per
  // chunk of rank 1, each in place (tokens 2..3 and 4..5 of its output).
  Plan zz({2, 0}, 1, SeqPartition::zigzag(8, 2), {TensorSpec::of<float>(heads, 2)});
  const StageLists& z = zz.stage_lists(Direction::seq_to_head);
  REQUIRE(z.recv_pieces.size() == 2);
  CHECK(z.recv_pieces[0].in_place());
  CHECK(z.recv_pieces[1].in_place());
  CHECK(z.recv_pieces[0].offset == 2 * 2 * 2 * 4);
  CHECK(z.recv_pieces[1].offset == 4 * 2 * 2 * 4);
  // bhsd, two heads a rank: the peer's heads are contiguous in [B, H, S_r, D] but head-major,
  // while the wire is token-major [B, S_r, H_p, D]: staged.
  Plan bh2({2, 1}, 1, SeqPartition::even(8, 2), {TensorSpec::of<float>(heads, 2)}, Format::bhsd);
  CHECK(!bh2.stage_lists(Direction::seq_to_head).send_pieces.at(0).in_place());
  // bhsd, one head a rank: [S_r, D] of head 0 is the wire itself: sent in place.
  Plan bh({2, 1}, 1, SeqPartition::even(8, 2), {TensorSpec::of<float>(HeadPartition::even(2, 2), 2)}, Format::bhsd);
  const StageLists& one = bh.stage_lists(Direction::seq_to_head);
  REQUIRE(one.send_pieces.size() == 1);
  CHECK(one.send_pieces[0].in_place());
  CHECK(one.send_pieces[0].buffer == BufferIndex::input(0));
  CHECK(one.send_pieces[0].offset == 0);  // peer 0's head 0 comes first
  CHECK(one.send_pieces[0].bytes == 4 * 2 * 4);
  CHECK(one.pack_staged.empty());
  // Received into [B, 1, S, D]: peer 0's tokens 0..3 of my one head, contiguous too.
  CHECK(one.recv_pieces[0].in_place());
  CHECK(one.recv_pieces[0].offset == 0);
  CHECK(block_bytes(one.unpack_staged) == 4 * 2 * 4);  // only the own chunk
}

TEST_CASE("in_place_messages is part of the fingerprint") {
  const auto heads = HeadPartition::even(4, 2);
  Plan a({2, 0}, 1, SeqPartition::even(8, 2), {TensorSpec::of<float>(heads, 2)}, Format::bshd, PlanOptions{1, true});
  Plan b({2, 0}, 1, SeqPartition::even(8, 2), {TensorSpec::of<float>(heads, 2)}, Format::bshd, PlanOptions{1, false});
  CHECK(a.fingerprint() != b.fingerprint());
}

TEST_CASE("planning errors have their codes, and every rank reaches the same verdict") {
  auto hp = HeadPartition::even(4, 2);
  auto spec = TensorSpec::of<float>(hp, 8);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(code_of([&] { Plan({2, r}, 0, SeqPartition::even(4, 2), {spec}); }) == Errc::invalid_shape);
    CHECK(code_of([&] { Plan({2, r}, 1, SeqPartition::even(4, 2), {}); }) == Errc::invalid_shape);
    CHECK(code_of([&] { Plan({2, r}, 1, SeqPartition::even(4, 2), std::vector<TensorSpec>(17, spec)); }) == Errc::invalid_shape);
    CHECK(code_of([&] { Plan({2, r}, 1, SeqPartition::even(6, 3), {spec}); }) == Errc::invalid_group);
    CHECK(code_of([&] { Plan({2, r}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(HeadPartition::even(3, 3), 8)}); }) ==
          Errc::invalid_group);
    CHECK(code_of([&] { Plan({2, r}, 1, SeqPartition::even(4, 2), {TensorSpec::of<float>(hp, 0)}); }) == Errc::invalid_shape);
    CHECK(code_of([&] {
            Plan({2, r}, std::int64_t(1) << 40, SeqPartition::even(std::int64_t(1) << 30, 2), {spec});
          }) == Errc::size_overflow);
  }
  CHECK(code_of([&] { Plan({2, 2}, 1, SeqPartition::even(4, 2), {spec}); }) == Errc::invalid_group);
  CHECK(code_of([&] { Plan({0, 0}, 1, SeqPartition::even(4, 2), {spec}); }) == Errc::invalid_group);
}

TEST_CASE("layout errors: wrong extents, aliasing strides") {
  auto hp = HeadPartition::even(4, 2);
  // rank 0 holds [B=1, S_r=2, H=4, D=8]
  auto bad_extent = TensorSpec::of<float>(hp, 8).with_seq_layout(Layout::bshd(1, 4, 4, 8));
  CHECK(code_of([&] { Plan({2, 0}, 1, SeqPartition::even(4, 2), {bad_extent}); }) == Errc::layout_mismatch);
  auto alias = TensorSpec::of<float>(hp, 8).with_seq_layout(Layout::strided({1, 2, 4, 8}, {64, 8, 4, 1}));
  CHECK(code_of([&] { Plan({2, 0}, 1, SeqPartition::even(4, 2), {alias}); }) == Errc::layout_aliasing);
  auto bad_head = TensorSpec::of<float>(hp, 8).with_head_layout(Layout::bshd(1, 4, 4, 8));
  CHECK(code_of([&] { Plan({2, 0}, 1, SeqPartition::even(4, 2), {bad_head}); }) == Errc::layout_mismatch);
  auto ok = TensorSpec::of<float>(hp, 8).with_seq_layout(Layout::strided({1, 2, 4, 8}, {1000, 100, 10, 1}));
  Plan p({2, 0}, 1, SeqPartition::even(4, 2), {ok});
  CHECK(p.seq_bytes(0) == (100 + 30 + 8) * sizeof(float));
}

TEST_CASE("default layouts follow the plan's format") {
  Plan p({2, 1}, 3, SeqPartition::even(10, 2), {TensorSpec::of<double>(HeadPartition::even(4, 2), 8)}, Format::sbhd);
  CHECK(p.seq_layout(0) == Layout::sbhd(3, 5, 4, 8));
  CHECK(p.head_layout(0) == Layout::sbhd(3, 10, 2, 8));
  CHECK(p.seq_bytes(0) == 3 * 5 * 4 * 8 * sizeof(double));
}

TEST_CASE("C10: a kv split that does not follow its query split is gqa_invalid, naming the rank and the kv heads it needs") {
  // H=4, Hkv=2, P=4: q split evenly (one head a rank), k and v split by balanced(2, 4) = [1,1,0,0]:
  // ranks 2 and 3 hold query heads 2 and 3, which use kv head 1, but would receive no kv head.
  auto q = HeadPartition::even(4, 4);
  auto bad = HeadPartition::balanced(2, 4);
  for (int r = 0; r < 4; ++r) {  // the same verdict on every rank
    for (int serves : {TensorSpec::kAuto, 0}) {  // inferred from the head counts, or declared
      CAPTURE(r);
      CAPTURE(serves);
      auto [code, msg] = ut::error_of([&] {
        Plan({4, r}, 1, SeqPartition::even(8, 4),
             {TensorSpec::of<float>(q, 8), TensorSpec::of<float>(bad, 8).serving(serves), TensorSpec::of<float>(bad, 8).serving(serves)});
      });
      CHECK(code == Errc::gqa_invalid);
      CHECK(msg.find("rank 2 holds query heads [2, 3)") != std::string::npos);
      CHECK(msg.find("use kv heads [1, 2)") != std::string::npos);
      CHECK(msg.find("but gets kv heads [2, 2)") != std::string::npos);
      CHECK(msg.find("rank 3 holds query heads [3, 4)") != std::string::npos);
      CHECK(msg.find("rank 1 holds query heads [1, 2)") != std::string::npos);  // kv head 0 needed, 1 given
      CHECK(msg.find("does not give 3 rank(s)") != std::string::npos);
    }
  }
  // H=12, Hkv=4, P=5: balanced q [3,3,2,2,2]; kv balanced(4,5) gives rank 3 [3,4) but it needs [2,4).
  auto q5 = HeadPartition::balanced(12, 5);
  auto [code, msg] = ut::error_of([&] {
    Plan({5, 0}, 1, SeqPartition::even(10, 5), {TensorSpec::of<float>(q5, 8), TensorSpec::of<float>(HeadPartition::balanced(4, 5), 8)});
  });
  CHECK(code == Errc::gqa_invalid);
  CHECK(msg.find("rank 3 holds query heads [8, 10)") != std::string::npos);
  CHECK(msg.find("use kv heads [2, 4)") != std::string::npos);
  // The right split (HeadPartition::gqa) plans; so does an explicit opt-out of the check.
  CHECK(ut::code_of([&] {
          Plan({5, 0}, 1, SeqPartition::even(10, 5), {TensorSpec::of<float>(q5, 8), TensorSpec::of<float>(HeadPartition::gqa(q5, 4), 8)});
        }) == Errc{});
  CHECK(ut::code_of([&] {
          Plan({4, 0}, 1, SeqPartition::even(8, 4), {TensorSpec::of<float>(q, 8), TensorSpec::of<float>(bad, 8).serving(TensorSpec::kNone)});
        }) == Errc{});
  // A declared pairing that cannot hold: Hkv does not divide H, or the query tensor is itself a kv.
  CHECK(ut::code_of([&] {
          Plan({4, 0}, 1, SeqPartition::even(8, 4), {TensorSpec::of<float>(q, 8), TensorSpec::of<float>(HeadPartition::even(4, 4), 8).serving(0),
                                                      TensorSpec::of<float>(HeadPartition::balanced(3, 4), 8).serving(0)});
        }) == Errc::gqa_invalid);
  CHECK(ut::code_of([&] {
          Plan({4, 0}, 1, SeqPartition::even(8, 4), {TensorSpec::of<float>(q, 8).serving(1), TensorSpec::of<float>(q, 8).serving(0)});
        }) == Errc::gqa_invalid);
}

TEST_CASE("break33: a Format or PlanOptions::path value cast into the enum (none of its names) is invalid_shape, as a Wire value is") {
  const std::vector<TensorSpec> specs = {TensorSpec::of<float>(HeadPartition::even(4, 2), 4)};
  auto [code, msg] = ut::error_of([&] { Plan({2, 0}, 1, SeqPartition::even(8, 2), specs, static_cast<Format>(9)); });
  CHECK(code == Errc::invalid_shape);
  CHECK(msg.find("Format value 9") != std::string::npos);
  PlanOptions o;
  o.path = static_cast<Path>(9);
  std::tie(code, msg) = ut::error_of([&] { Plan({2, 0}, 1, SeqPartition::even(8, 2), specs, Format::bshd, o); });
  CHECK(code == Errc::invalid_shape);
  CHECK(msg.find("PlanOptions::path value 9") != std::string::npos);
  for (Format f : {Format::bshd, Format::sbhd, Format::bhsd})
    for (Path p : {Path::automatic, Path::alltoallv, Path::messages, Path::direct, Path::two_level}) {
      o.path = p;
      CHECK(ut::code_of([&] { Plan({2, 0}, 1, SeqPartition::even(8, 2), specs, f, o); }) == Errc{});
    }
}

TEST_CASE("summing replicated heads needs an element type with addition: not_summable at plan time, on every rank") {
  auto q = HeadPartition::even(8, 4);
  auto kv = HeadPartition::gqa(q, 2);  // each kv head on 2 ranks
  for (int r = 0; r < 4; ++r) {
    auto [code, msg] = ut::error_of([&] {
      Plan({4, r}, 1, SeqPartition::even(8, 4), {TensorSpec::of<std::uint16_t>(q, 8), TensorSpec::of<std::uint16_t>(kv, 8)});
    });
    CHECK(code == Errc::not_summable);
    CHECK(msg.find("tensor 1") != std::string::npos);
    CHECK(msg.find("head 0 on ranks [0, 2)") != std::string::npos);
    // Declared as bfloat16, or asking for the owner's copy: plans.
    CHECK(ut::code_of([&] {
            Plan({4, r}, 1, SeqPartition::even(8, 4),
                 {TensorSpec::of<std::uint16_t>(q, 8), TensorSpec::of<std::uint16_t>(kv, 8, ElementType::bfloat16)});
          }) == Errc{});
    CHECK(ut::code_of([&] {
            Plan({4, r}, 1, SeqPartition::even(8, 4),
                 {TensorSpec::of<std::uint16_t>(q, 8), TensorSpec::of<std::uint16_t>(kv, 8).with_replicas(Replicas::owner)});
          }) == Errc{});
  }
  // Without replication an opaque type sums nothing and plans; a type of the wrong size does not.
  CHECK(ut::code_of([&] { Plan({4, 0}, 1, SeqPartition::even(8, 4), {TensorSpec::of<std::uint16_t>(q, 8)}); }) == Errc{});
  CHECK(ut::code_of([&] { Plan({4, 0}, 1, SeqPartition::even(8, 4), {TensorSpec::of<float>(q, 8, ElementType::bfloat16)}); }) ==
        Errc::invalid_shape);
}

TEST_CASE("the agreement record holds what determines the wire and nothing local") {
  auto q = HeadPartition::even(8, 2);
  const Plan a({2, 0}, 2, SeqPartition::even(8, 2), {TensorSpec::of<float>(q, 4)}, Format::bshd);
  const Plan b({2, 1}, 2, SeqPartition::even(8, 2), {TensorSpec::of<float>(q, 4)}, Format::bhsd);  // other rank, other format
  const Plan c({2, 0}, 2, SeqPartition::even(8, 2),
               {TensorSpec::of<float>(q, 4).with_seq_layout(Layout::strided({2, 4, 8, 4}, {200, 40, 5, 1}))});  // a padded view
  CHECK(a.agreement_record() == b.agreement_record());
  CHECK(a.agreement_record() == c.agreement_record());
  CHECK(a.fingerprint() == b.fingerprint());
  const Plan d({2, 0}, 2, SeqPartition::even(8, 2), {TensorSpec::of<float>(HeadPartition::ranges(8, {{0, 5}, {5, 8}}), 4)});
  CHECK(a.agreement_record()[8] != d.agreement_record()[8]);
  CHECK(Plan::agreement_field(8) == "the head partition of tensor 0");
  CHECK(Plan::agreement_field(1) == "the group size P");
}
